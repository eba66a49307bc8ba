// The agent's report buffer: bound with drop-oldest (counted), trim on
// acknowledgement, replay order after a lost upstream stream.
#include <catch2/catch.hpp>

#include <vector>

#include "report_buffer.h"

namespace v1 = straggler::v1;
using straggler::agent::ReportBuffer;

namespace {

v1::IterationReport Report(uint32_t rank, uint64_t iteration) {
  v1::IterationReport r;
  r.set_rank(rank);
  r.set_iteration(iteration);
  r.set_compute_seconds(0.1);
  return r;
}

std::vector<uint64_t> Iterations(const v1::ReportBatch& b) {
  std::vector<uint64_t> out;
  for (const auto& r : b.reports()) out.push_back(r.iteration());
  return out;
}

const auto kNow = ReportBuffer::Clock::time_point{};

}  // namespace

TEST_CASE("the buffer holds at most its capacity and drops the oldest, counted") {
  ReportBuffer buf(3);
  for (uint64_t i = 0; i < 3; ++i) CHECK(buf.Push(Report(0, i), kNow) == 0);
  CHECK(buf.Push(Report(0, 3), kNow) == 1);
  CHECK(buf.Push(Report(0, 4), kNow) == 1);
  CHECK(buf.size() == 3);
  CHECK(buf.dropped_total() == 2);
  v1::ReportBatch b;
  CHECK(buf.TakeUnsent(10, 1, &b) == 3);
  CHECK(Iterations(b) == std::vector<uint64_t>{2, 3, 4});

  SECTION("shrinking the capacity drops the oldest at once") {
    CHECK(buf.SetCapacity(1) == 2);
    CHECK(buf.size() == 1);
    CHECK(buf.dropped_total() == 4);
  }
}

TEST_CASE("an acknowledgement trims exactly the batches up to its sequence") {
  ReportBuffer buf(100);
  for (uint64_t i = 0; i < 5; ++i) buf.Push(Report(1, i), kNow);
  v1::ReportBatch b1, b2;
  CHECK(buf.TakeUnsent(2, 7, &b1) == 2);
  CHECK(buf.TakeUnsent(2, 8, &b2) == 2);
  CHECK(buf.unsent() == 1);

  std::vector<uint64_t> acked;
  CHECK(buf.Ack(7, [&](const v1::IterationReport& r) { acked.push_back(r.iteration()); }) == 2);
  CHECK(acked == std::vector<uint64_t>{0, 1});
  CHECK(buf.size() == 3);
  // An old or repeated acknowledgement changes nothing.
  CHECK(buf.Ack(7, nullptr) == 0);
  CHECK(buf.Ack(8, [&](const v1::IterationReport& r) { acked.push_back(r.iteration()); }) == 2);
  CHECK(acked == std::vector<uint64_t>{0, 1, 2, 3});
  // Unsent reports are never trimmed, whatever the sequence.
  CHECK(buf.Ack(1000, nullptr) == 0);
  CHECK(buf.size() == 1);
}

TEST_CASE("after a lost stream the unacknowledged reports are replayed in arrival order") {
  ReportBuffer buf(100);
  for (uint64_t i = 0; i < 6; ++i) buf.Push(Report(static_cast<uint32_t>(i % 2), i), kNow);
  v1::ReportBatch b1, b2;
  buf.TakeUnsent(2, 1, &b1);
  buf.TakeUnsent(2, 2, &b2);
  buf.Ack(1, nullptr);  // batch 2 was sent but its acknowledgement was lost
  buf.Rewind();
  CHECK(buf.unsent() == 4);
  // The old stream's acknowledgement of batch 2 can no longer trim anything.
  CHECK(buf.Ack(2, nullptr) == 0);
  v1::ReportBatch replay;
  CHECK(buf.TakeUnsent(100, 3, &replay) == 4);
  CHECK(Iterations(replay) == std::vector<uint64_t>{2, 3, 4, 5});
  CHECK(buf.Ack(3, nullptr) == 4);
  CHECK(buf.size() == 0);
}

TEST_CASE("dropping the oldest while batches are in flight keeps the acknowledgement exact") {
  ReportBuffer buf(3);
  for (uint64_t i = 0; i < 3; ++i) buf.Push(Report(0, i), kNow);
  v1::ReportBatch b;
  buf.TakeUnsent(2, 5, &b);  // 0 and 1 in flight
  buf.Push(Report(0, 3), kNow);  // drops 0 (in flight)
  CHECK(buf.unsent() == 2);      // 2 and 3
  std::vector<uint64_t> acked;
  CHECK(buf.Ack(5, [&](const v1::IterationReport& r) { acked.push_back(r.iteration()); }) == 1);
  CHECK(acked == std::vector<uint64_t>{1});
  v1::ReportBatch rest;
  CHECK(buf.TakeUnsent(10, 6, &rest) == 2);
  CHECK(Iterations(rest) == std::vector<uint64_t>{2, 3});
}

TEST_CASE("the batching deadline runs from the oldest unsent report") {
  ReportBuffer buf(10);
  CHECK_FALSE(buf.oldest_unsent_time().has_value());
  const auto t1 = kNow + std::chrono::milliseconds(1);
  const auto t2 = kNow + std::chrono::milliseconds(2);
  buf.Push(Report(0, 0), t1);
  buf.Push(Report(0, 1), t2);
  CHECK(buf.oldest_unsent_time() == t1);
  v1::ReportBatch b;
  buf.TakeUnsent(1, 1, &b);
  CHECK(buf.oldest_unsent_time() == t2);
}

namespace {

v1::StreamHello HelloOf(uint32_t rank, uint64_t incarnation) {
  v1::StreamHello h;
  h.add_ranks(rank);
  v1::RankDevice* d = h.add_devices();
  d->set_rank(rank);
  d->set_incarnation(incarnation);
  return h;
}

}  // namespace

TEST_CASE("a hello marker starts a batch: the reports before it go in the batch before") {
  ReportBuffer buf(100);
  buf.PushHello(HelloOf(0, 1), kNow);
  buf.Push(Report(0, 10), kNow);
  buf.Push(Report(0, 11), kNow);
  buf.PushHello(HelloOf(0, 2), kNow);  // a restarted trainer, from a checkpoint
  buf.Push(Report(0, 5), kNow);

  v1::ReportBatch b1, b2;
  CHECK(buf.TakeUnsent(100, 1, &b1) == 3);
  CHECK(b1.hello().devices(0).incarnation() == 1);
  CHECK(Iterations(b1) == std::vector<uint64_t>{10, 11});
  CHECK(buf.TakeUnsent(100, 2, &b2) == 2);
  CHECK(b2.hello().devices(0).incarnation() == 2);
  CHECK(Iterations(b2) == std::vector<uint64_t>{5});
  CHECK(buf.reports() == 3);
  CHECK(buf.size() == 5);

  SECTION("a new stream starts with the hello in force at the oldest entry held") {
    CHECK(buf.base_hello().ranks_size() == 0);  // none left the buffer yet
    CHECK(buf.Ack(1, nullptr) == 2);
    CHECK(buf.base_hello().devices(0).incarnation() == 1);
    buf.Rewind();
    v1::ReportBatch replay;
    CHECK(buf.TakeUnsent(100, 3, &replay) == 2);
    CHECK(replay.hello().devices(0).incarnation() == 2);
    CHECK(Iterations(replay) == std::vector<uint64_t>{5});
    CHECK(buf.Ack(3, nullptr) == 1);
    CHECK(buf.base_hello().devices(0).incarnation() == 2);
    CHECK(buf.size() == 0);
  }
}

TEST_CASE("a finished marker rides with the reports before it, and survives a replay") {
  ReportBuffer buf(100);
  buf.Push(Report(0, 1), kNow);
  buf.Push(Report(1, 1), kNow);
  buf.PushFinished(0, kNow);
  buf.PushFinished(1, kNow);
  buf.Push(Report(0, 0), kNow);  // a new trainer of rank 0: never before the finish

  v1::ReportBatch b;
  CHECK(buf.TakeUnsent(100, 1, &b) == 4);
  CHECK(Iterations(b) == std::vector<uint64_t>{1, 1});
  CHECK(std::vector<uint32_t>(b.finished_ranks().begin(), b.finished_ranks().end()) ==
        std::vector<uint32_t>{0, 1});
  CHECK(buf.unsent() == 1);

  buf.Rewind();  // the stream was lost before the acknowledgement
  v1::ReportBatch again;
  CHECK(buf.TakeUnsent(100, 2, &again) == 4);
  CHECK(again.finished_ranks_size() == 2);
  CHECK(buf.Ack(2, nullptr) == 2);
  CHECK(buf.size() == 1);
}

TEST_CASE("markers do not count against the capacity") {
  ReportBuffer buf(2);
  buf.PushHello(HelloOf(0, 1), kNow);
  buf.Push(Report(0, 1), kNow);
  buf.Push(Report(0, 2), kNow);
  CHECK(buf.size() == 3);
  CHECK(buf.Push(Report(0, 3), kNow) == 1);  // drops report 1 and the hello before it
  CHECK(buf.dropped_total() == 1);
  CHECK(buf.base_hello().devices(0).incarnation() == 1);
  CHECK(buf.reports() == 2);
}
