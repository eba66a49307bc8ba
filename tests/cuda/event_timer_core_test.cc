// The CUDA-free core of CudaComputeTimer, driven through a fake EventBackend
// whose events complete when the test says so: ordering, pool reuse, the
// bounded pending ring (drop, never block), errors, misuse and the shutdown
// drain. Runs on every machine.
#include <catch2/catch.hpp>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "event_timer_core.h"
#include "fake_client.h"

using straggler::detail::EventBackend;
using straggler::detail::EventTimerCore;
using straggler::detail::EventTimerCoreOptions;
using straggler::testing::FakeClient;
using straggler::testing::WaitUntil;

namespace {

// Slot i's end event "completes" once the test calls Complete(i, seconds).
// Recording into a slot resets it, as cudaEventRecord re-captures an event.
class FakeBackend final : public EventBackend {
 public:
  struct State {
    std::mutex mu;
    std::vector<bool> done;
    std::vector<double> seconds;
    std::vector<size_t> record_order;  // slots, in RecordStart order
    std::vector<void*> streams;        // stream of every record call
    bool fail_record = false;
    std::string fail_elapsed_for;      // non-empty: Elapsed errors once with this text
  };

  FakeBackend(size_t slots, std::shared_ptr<State> state) : slots_(slots), s_(std::move(state)) {
    s_->done.assign(slots, false);
    s_->seconds.assign(slots, 0);
  }
  size_t Slots() const override { return slots_; }
  Result RecordStart(size_t slot, void* stream, std::string* error) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->fail_record) {
      *error = "cudaEventRecord: invalid resource handle";
      return Result::kError;
    }
    REQUIRE(slot < slots_);
    s_->done[slot] = false;
    s_->record_order.push_back(slot);
    s_->streams.push_back(stream);
    return Result::kOk;
  }
  Result RecordEnd(size_t slot, void* stream, std::string*) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->done[slot] = false;
    s_->streams.push_back(stream);
    return Result::kOk;
  }
  Result Elapsed(size_t slot, double* seconds, std::string* error) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (!s_->done[slot]) return Result::kNotReady;
    if (!s_->fail_elapsed_for.empty()) {
      *error = s_->fail_elapsed_for;
      s_->fail_elapsed_for.clear();
      return Result::kError;
    }
    *seconds = s_->seconds[slot];
    return Result::kOk;
  }

 private:
  size_t slots_;
  std::shared_ptr<State> s_;
};

struct Fixture {
  explicit Fixture(size_t slots, std::chrono::milliseconds drain = std::chrono::seconds(5)) {
    state = std::make_shared<FakeBackend::State>();
    EventTimerCoreOptions o;
    o.rank = 7;
    o.poll_interval = std::chrono::microseconds(100);
    o.drain_timeout = drain;
    core = std::make_unique<EventTimerCore>(client, std::make_unique<FakeBackend>(slots, state), o);
  }
  // Completes the `n`-th recorded iteration (0-based, in Begin order).
  void Complete(size_t n, double seconds) {
    std::lock_guard<std::mutex> lock(state->mu);
    const size_t slot = state->record_order.at(n);
    state->seconds[slot] = seconds;
    state->done[slot] = true;
  }
  FakeClient client;
  std::shared_ptr<FakeBackend::State> state;
  std::unique_ptr<EventTimerCore> core;
};

void* Stream(uintptr_t v) { return reinterpret_cast<void*>(v); }

}  // namespace

TEST_CASE("each ended iteration is reported once its end event completes, with its own time") {
  Fixture f(4);
  REQUIRE(f.core->Begin(Stream(0x10), 1, 100));
  REQUIRE(f.core->End(Stream(0x10)));
  REQUIRE(f.core->Begin(Stream(0x10), 1, 101));
  REQUIRE(f.core->End(Stream(0x10)));
  f.Complete(0, 0.25);
  f.Complete(1, 0.5);
  REQUIRE(WaitUntil([&] { return f.client.Reports().size() == 2; }));
  const auto r = f.client.Reports();
  CHECK(r[0].rank == 7);
  CHECK(r[0].epoch == 1);
  CHECK(r[0].iteration == 100);
  CHECK(r[0].seconds == 0.25);
  CHECK(r[1].iteration == 101);
  CHECK(r[1].seconds == 0.5);
  // Both events went to the trainer's stream.
  {
    std::lock_guard<std::mutex> lock(f.state->mu);
    CHECK(f.state->streams == std::vector<void*>(4, Stream(0x10)));
  }
  const auto s = f.core->Stats();
  CHECK(s.begun == 2);
  CHECK(s.reported == 2);
  CHECK(s.dropped_full == 0);
  CHECK(s.errors == 0);
}

TEST_CASE("a pending iteration holds back later ones: reports stay in iteration order") {
  Fixture f(4);
  for (uint64_t it = 0; it < 3; ++it) {
    REQUIRE(f.core->Begin(nullptr, 0, it));
    REQUIRE(f.core->End(nullptr));
  }
  f.Complete(1, 0.1);
  f.Complete(2, 0.2);
  // Iteration 0 has not completed, so nothing may be reported yet, however
  // long we look; then it completes and all three arrive in order.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(f.client.Reports().empty());
  f.Complete(0, 0.3);
  REQUIRE(WaitUntil([&] { return f.client.Reports().size() == 3; }));
  const auto r = f.client.Reports();
  CHECK(r[0].iteration == 0);
  CHECK(r[1].iteration == 1);
  CHECK(r[2].iteration == 2);
}

TEST_CASE("a full pool drops the iteration instead of blocking, and its slots are reused") {
  Fixture f(2);
  // Two in flight fill the pool; the GPU "never" finishes them for now.
  for (uint64_t it = 0; it < 2; ++it) {
    REQUIRE(f.core->Begin(nullptr, 0, it));
    REQUIRE(f.core->End(nullptr));
  }
  // These return at once (the test would hang here otherwise) and are counted.
  for (uint64_t it = 2; it < 5; ++it) {
    CHECK_FALSE(f.core->Begin(nullptr, 0, it));
    CHECK_FALSE(f.core->End(nullptr));  // the matching End of a dropped Begin: not a misuse
  }
  auto s = f.core->Stats();
  CHECK(s.dropped_full == 3);
  CHECK(s.unmatched == 0);
  CHECK(s.begun == 2);

  f.Complete(0, 0.01);
  f.Complete(1, 0.02);
  REQUIRE(WaitUntil([&] { return f.core->Stats().reported == 2; }));
  // Room again: the next iterations reuse slots 0 and 1 of the pool (no new
  // events), in ring order.
  for (uint64_t it = 5; it < 9; ++it) {
    REQUIRE(f.core->Begin(nullptr, 0, it));
    REQUIRE(f.core->End(nullptr));
    f.Complete(it - 3, 0.03);
    REQUIRE(WaitUntil([&] { return f.core->Stats().reported == it - 2; }));
  }
  std::lock_guard<std::mutex> lock(f.state->mu);
  CHECK(f.state->record_order == std::vector<size_t>{0, 1, 0, 1, 0, 1});
}

TEST_CASE("a failed event record is counted with the CUDA error, and nothing is reported") {
  Fixture f(4);
  {
    std::lock_guard<std::mutex> lock(f.state->mu);
    f.state->fail_record = true;
  }
  CHECK_FALSE(f.core->Begin(nullptr, 0, 0));
  CHECK_FALSE(f.core->End(nullptr));
  auto s = f.core->Stats();
  CHECK(s.errors == 1);
  CHECK(s.last_error == "cudaEventRecord: invalid resource handle");
  CHECK(s.begun == 0);
  {
    std::lock_guard<std::mutex> lock(f.state->mu);
    f.state->fail_record = false;
  }
  REQUIRE(f.core->Begin(nullptr, 0, 1));
  REQUIRE(f.core->End(nullptr));
  f.Complete(0, 0.5);
  REQUIRE(WaitUntil([&] { return f.client.Reports().size() == 1; }));
  CHECK(f.client.Reports()[0].iteration == 1);
}

TEST_CASE("a failed resolution is counted and skipped, the next iterations still report") {
  Fixture f(4);
  {
    std::lock_guard<std::mutex> lock(f.state->mu);
    f.state->fail_elapsed_for = "cudaEventQuery: an illegal memory access was encountered";
  }
  for (uint64_t it = 0; it < 2; ++it) {
    REQUIRE(f.core->Begin(nullptr, 0, it));
    REQUIRE(f.core->End(nullptr));
    f.Complete(it, 0.1);
  }
  REQUIRE(WaitUntil([&] { return f.core->Stats().reported == 1; }));
  const auto s = f.core->Stats();
  CHECK(s.errors == 1);
  CHECK(s.last_error == "cudaEventQuery: an illegal memory access was encountered");
  CHECK(f.client.Reports()[0].iteration == 1);
}

TEST_CASE("End without Begin and Begin twice are counted as unmatched") {
  Fixture f(4);
  CHECK_FALSE(f.core->End(nullptr));
  REQUIRE(f.core->Begin(nullptr, 0, 10));
  REQUIRE(f.core->Begin(nullptr, 0, 11));  // replaces 10, which had no End
  REQUIRE(f.core->End(nullptr));
  CHECK(f.core->Stats().unmatched == 2);
  f.Complete(1, 0.2);  // second record went into the same slot
  REQUIRE(WaitUntil([&] { return f.client.Reports().size() == 1; }));
  CHECK(f.client.Reports()[0].iteration == 11);
}

TEST_CASE("a report the client refuses is counted as report_dropped") {
  Fixture f(4);
  f.client.SetRefuse(true);
  REQUIRE(f.core->Begin(nullptr, 0, 0));
  REQUIRE(f.core->End(nullptr));
  f.Complete(0, 0.1);
  REQUIRE(WaitUntil([&] { return f.core->Stats().report_dropped == 1; }));
  CHECK(f.core->Stats().reported == 0);
}

TEST_CASE("shutdown reports what completes within the drain timeout and abandons the rest") {
  Fixture f(8, std::chrono::milliseconds(50));
  for (uint64_t it = 0; it < 3; ++it) {
    REQUIRE(f.core->Begin(nullptr, 0, it));
    REQUIRE(f.core->End(nullptr));
  }
  f.Complete(0, 0.1);
  // Iterations 1 and 2 never complete (a hung stream): shutdown must still
  // return, having reported 0 and abandoned 1 and 2.
  f.core->Shutdown();
  const auto s = f.core->Stats();
  CHECK(s.reported == 1);
  CHECK(s.abandoned == 2);
  f.core->Shutdown();  // idempotent
}

TEST_CASE("shutdown waits for in-flight iterations that complete during the drain") {
  Fixture f(8, std::chrono::seconds(20));
  REQUIRE(f.core->Begin(nullptr, 0, 0));
  REQUIRE(f.core->End(nullptr));
  std::thread gpu([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    f.Complete(0, 0.4);
  });
  f.core->Shutdown();
  gpu.join();
  CHECK(f.core->Stats().reported == 1);
  CHECK(f.core->Stats().abandoned == 0);
}

TEST_CASE("a producer thread racing the resolver: every timed iteration reported once, in order") {
  Fixture f(16);
  std::atomic<bool> stop{false};
  size_t completed = 0;  // owned by `gpu` until it is joined
  // The "GPU" completes recorded iterations concurrently with Begin/End. It
  // stays one behind the newest record: a later RecordStart proves the
  // earlier iteration's End was published.
  std::thread gpu([&] {
    while (!stop.load()) {
      size_t recorded;
      {
        std::lock_guard<std::mutex> lock(f.state->mu);
        recorded = f.state->record_order.size();
      }
      while (completed + 1 < recorded) f.Complete(completed++, 0.001);
      std::this_thread::yield();
    }
  });
  uint64_t timed = 0;
  for (uint64_t it = 0; it < 2000; ++it) {
    if (f.core->Begin(nullptr, 0, it) && f.core->End(nullptr)) ++timed;
  }
  stop = true;
  gpu.join();
  // The producer is done, so everything recorded is published: finish it.
  size_t recorded;
  {
    std::lock_guard<std::mutex> lock(f.state->mu);
    recorded = f.state->record_order.size();
  }
  while (completed < recorded) f.Complete(completed++, 0.001);
  CHECK(timed + f.core->Stats().dropped_full == 2000);
  REQUIRE(WaitUntil([&] { return f.core->Stats().reported == timed; }));
  // Strictly increasing iterations: no slot read twice, none torn or skipped.
  const auto r = f.client.Reports();
  REQUIRE(r.size() == timed);
  for (size_t i = 1; i < r.size(); ++i) REQUIRE(r[i].iteration > r[i - 1].iteration);
}
