// BoundedQueue (client_lib/src/report_queue.h): the lock-free MPMC ring that
// Client::Report() pushes into.
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "report_queue.h"

using straggler::detail::BoundedQueue;

namespace {

struct Item {
  uint32_t producer;
  uint64_t index;
};

}  // namespace

TEST_CASE("capacity rounds up to a power of two and bad capacities throw", "[queue]") {
  CHECK(BoundedQueue<int>(1).capacity() == 1);
  CHECK(BoundedQueue<int>(5).capacity() == 8);
  CHECK(BoundedQueue<int>(4096).capacity() == 4096);
  CHECK_THROWS_AS(BoundedQueue<int>(0), std::invalid_argument);
  CHECK_THROWS_AS(BoundedQueue<int>(BoundedQueue<int>::kMaxCapacity + 1), std::invalid_argument);
}

TEST_CASE("single producer: FIFO, empty pop fails and leaves the output alone", "[queue]") {
  BoundedQueue<int> q(8);
  int out = -7;
  CHECK_FALSE(q.TryPop(out));
  CHECK(out == -7);
  for (int i = 0; i < 5; ++i) REQUIRE(q.TryPush(i));
  CHECK(q.SizeApprox() == 5);
  for (int i = 0; i < 5; ++i) {
    REQUIRE(q.TryPop(out));
    CHECK(out == i);
  }
  CHECK_FALSE(q.TryPop(out));
  CHECK(q.SizeApprox() == 0);
}

TEST_CASE("ForEachQueued visits what is queued, oldest first, across the ring's wrap", "[queue]") {
  BoundedQueue<int> q(4);
  std::vector<int> seen;
  auto visit = [&] {
    seen.clear();
    q.ForEachQueued([&](int v) { seen.push_back(v); });
    return seen;
  };
  CHECK(visit().empty());
  for (int i = 0; i < 4; ++i) REQUIRE(q.TryPush(i));
  CHECK(visit() == std::vector<int>{0, 1, 2, 3});  // full
  int out = 0;
  REQUIRE(q.TryPop(out));
  REQUIRE(q.TryPop(out));
  REQUIRE(q.TryPush(4));  // into the cells just freed: the ring wraps
  CHECK(visit() == std::vector<int>{2, 3, 4});
  // Visiting takes nothing out.
  for (int want : {2, 3, 4}) {
    REQUIRE(q.TryPop(out));
    CHECK(out == want);
  }
  CHECK(visit().empty());
}

TEST_CASE("full queue refuses exactly the overflow", "[queue]") {
  BoundedQueue<int> q(16);
  int accepted = 0;
  int refused = 0;
  for (int i = 0; i < 100; ++i) (q.TryPush(i) ? accepted : refused)++;
  CHECK(accepted == 16);
  CHECK(refused == 84);
  // The first 16 are kept, in order; the refused ones never appear.
  int out = 0;
  for (int i = 0; i < 16; ++i) {
    REQUIRE(q.TryPop(out));
    CHECK(out == i);
  }
  CHECK_FALSE(q.TryPop(out));
  // Room again after draining.
  CHECK(q.TryPush(1000));
}

TEST_CASE("wraparound: many laps through a small ring keep order", "[queue]") {
  BoundedQueue<uint64_t> q(4);
  uint64_t next_in = 0;
  uint64_t next_out = 0;
  // Alternate fill levels so the positions wrap the ring at every offset.
  for (int lap = 0; lap < 1000; ++lap) {
    const int n = 1 + lap % 4;
    for (int i = 0; i < n; ++i) REQUIRE(q.TryPush(next_in++));
    if (n == 4) CHECK_FALSE(q.TryPush(999999));
    for (int i = 0; i < n; ++i) {
      uint64_t out = 0;
      REQUIRE(q.TryPop(out));
      REQUIRE(out == next_out++);
    }
  }
  CHECK(next_out == next_in);
}

TEST_CASE("multi-producer multi-consumer: every item exactly once, per-producer order",
          "[queue]") {
  constexpr uint32_t kProducers = 4;
  constexpr uint32_t kConsumers = 2;
  constexpr uint64_t kPerProducer = 100000;
  BoundedQueue<Item> q(256);  // small, so producers often find it full
  std::atomic<bool> producers_done{false};
  std::vector<std::vector<uint64_t>> seen_count(kProducers, std::vector<uint64_t>(kPerProducer, 0));
  std::vector<std::vector<Item>> consumed(kConsumers);
  std::atomic<uint64_t> full_retries{0};

  std::vector<std::thread> producers;
  for (uint32_t p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (uint64_t i = 0; i < kPerProducer; ++i) {
        while (!q.TryPush(Item{p, i})) {
          full_retries.fetch_add(1, std::memory_order_relaxed);
          std::this_thread::yield();
        }
      }
    });
  }
  std::vector<std::thread> consumers;
  for (uint32_t c = 0; c < kConsumers; ++c) {
    consumers.emplace_back([&, c] {
      Item it{};
      for (;;) {
        if (q.TryPop(it)) {
          consumed[c].push_back(it);
        } else if (producers_done.load()) {
          if (!q.TryPop(it)) break;
          consumed[c].push_back(it);
        } else {
          std::this_thread::yield();
        }
      }
    });
  }
  for (auto& t : producers) t.join();
  producers_done.store(true);
  for (auto& t : consumers) t.join();

  uint64_t total = 0;
  for (uint32_t c = 0; c < kConsumers; ++c) {
    // Each consumer sees each producer's items in increasing order (FIFO per
    // producer holds for any single consumer's subsequence).
    std::vector<int64_t> last(kProducers, -1);
    for (const Item& it : consumed[c]) {
      REQUIRE(it.producer < kProducers);
      REQUIRE(it.index < kPerProducer);
      REQUIRE(static_cast<int64_t>(it.index) > last[it.producer]);
      last[it.producer] = static_cast<int64_t>(it.index);
      ++seen_count[it.producer][it.index];
      ++total;
    }
  }
  CHECK(total == kProducers * kPerProducer);
  for (uint32_t p = 0; p < kProducers; ++p)
    for (uint64_t i = 0; i < kPerProducer; ++i) REQUIRE(seen_count[p][i] == 1);
}

TEST_CASE("concurrent producers on a full queue: accepted + refused == attempted", "[queue]") {
  constexpr int kProducers = 4;
  constexpr int kAttempts = 10000;
  BoundedQueue<int> q(1024);
  std::atomic<int> accepted{0};
  std::atomic<int> refused{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&] {
      for (int i = 0; i < kAttempts; ++i) (q.TryPush(i) ? accepted : refused).fetch_add(1);
    });
  }
  for (auto& t : producers) t.join();
  // No consumer: exactly the capacity fits, the rest is refused.
  CHECK(accepted.load() == 1024);
  CHECK(refused.load() == kProducers * kAttempts - 1024);
  int out = 0;
  int drained = 0;
  while (q.TryPop(out)) ++drained;
  CHECK(drained == 1024);
}
