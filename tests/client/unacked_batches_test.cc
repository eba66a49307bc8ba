// UnackedBatches (client_lib/src/unacked_batches.h): the batches a stream
// client keeps until the daemon acknowledges them.
#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "unacked_batches.h"

using straggler::detail::QueuedReport;
using straggler::detail::UnackedBatches;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();  // absent

UnackedBatches::Batch MakeBatch(UnackedBatches& u, uint64_t first_iteration, size_t n) {
  UnackedBatches::Batch b;
  b.sequence = u.NextSequence();
  for (size_t i = 0; i < n; ++i)
    b.reports.push_back(QueuedReport{0, 0, first_iteration + i, 0.1, 0.0, 0.0, 0, kNaN, kNaN, kNaN});
  return b;
}

std::vector<uint64_t> Sequences(const UnackedBatches& u) {
  std::vector<uint64_t> s;
  u.ForEach([&s](const UnackedBatches::Batch& b) { s.push_back(b.sequence); });
  return s;
}

}  // namespace

TEST_CASE("sequences start at 1 and an ack completes every batch up to it", "[unacked]") {
  UnackedBatches u(/*max_reports=*/100, /*max_batch=*/10);
  u.Add(MakeBatch(u, 0, 3));
  u.Add(MakeBatch(u, 3, 4));
  u.Add(MakeBatch(u, 7, 5));
  CHECK(Sequences(u) == std::vector<uint64_t>{1, 2, 3});

  CHECK(u.IsNewer(2));
  CHECK(u.Ack(2));  // completed batches
  CHECK_FALSE(u.IsNewer(2));
  CHECK(Sequences(u) == std::vector<uint64_t>{3});
  // 3 + 4 reports completed; the third batch is still out.
  CHECK(u.WaitCompleted(7, std::chrono::milliseconds(0)));
  CHECK_FALSE(u.WaitCompleted(8, std::chrono::milliseconds(0)));

  // An older or repeated acknowledgement (an agent relaying rejections under
  // a sequence already seen) changes nothing and does not count again.
  CHECK_FALSE(u.IsNewer(2));
  CHECK_FALSE(u.Ack(2));
  CHECK(Sequences(u) == std::vector<uint64_t>{3});

  // A newer sequence that covers no batch (the hello alone) is newer, frees nothing.
  UnackedBatches v(100, 10);
  const uint64_t hello = v.NextSequence();
  CHECK(v.IsNewer(hello));
  CHECK_FALSE(v.Ack(hello));
  CHECK_FALSE(v.IsNewer(hello));
}

TEST_CASE("room for one more batch is bounded by max_reports, but one batch always fits",
          "[unacked]") {
  UnackedBatches u(/*max_reports=*/20, /*max_batch=*/10);
  CHECK(u.HasRoom());
  u.Add(MakeBatch(u, 0, 10));
  CHECK(u.HasRoom());  // 10 + 10 <= 20
  u.Add(MakeBatch(u, 10, 10));
  CHECK_FALSE(u.HasRoom());
  u.Ack(1);
  CHECK(u.HasRoom());

  // max_reports below max_batch: still one batch at a time.
  UnackedBatches small(/*max_reports=*/4, /*max_batch=*/10);
  CHECK(small.HasRoom());
  small.Add(MakeBatch(small, 0, 10));
  CHECK_FALSE(small.HasRoom());
}

TEST_CASE("WaitCompleted wakes when an acknowledgement from another thread completes the target",
          "[unacked]") {
  UnackedBatches u(100, 10);
  u.Add(MakeBatch(u, 0, 5));
  std::thread reader([&u] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    u.Ack(1);
  });
  // Bounded by an hour only so that a broken wake-up fails instead of hanging.
  CHECK(u.WaitCompleted(5, std::chrono::hours(1)));
  reader.join();
  CHECK(Sequences(u).empty());
}
