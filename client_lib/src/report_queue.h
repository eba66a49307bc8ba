// A bounded multi-producer multi-consumer queue (Dmitry Vyukov's design): a
// ring of cells, each with its own sequence number, so producers and consumers
// claim slots with one compare-and-swap on a shared position and then touch
// only their own cell. TryPush/TryPop never block, never allocate and make no
// system calls, which is what Client::Report() needs on the training thread.
//
//   straggler::detail::BoundedQueue<Item> q(1000);   // capacity becomes 1024
//   if (!q.TryPush(item)) ++dropped;                 // full: the caller decides
//   Item out;
//   while (q.TryPop(out)) Send(out);
//
// Cell sequence protocol, for a cell at index i of capacity C:
//   sequence == pos          free, a producer at position pos may fill it;
//   sequence == pos + 1      full, a consumer at position pos may take it;
//   sequence == pos + C      emptied, free again for the producer one lap on.
// Positions are 64-bit and never wrap in practice (2^64 operations).
//
// Thread safety: TryPush, TryPop, SizeApprox and capacity may be called from
// any number of threads concurrently; ForEachQueued by a single consumer
// only (see there). FIFO holds per producer; items of
// different producers interleave in claim order. T must be trivially copyable
// (copied in and out of the cell with no constructor that could throw or
// allocate).
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <type_traits>

namespace straggler::detail {

// Keeps the producers' and consumers' shared positions on separate cache
// lines so the two sides do not invalidate each other on every operation.
inline constexpr size_t kCacheLine = 64;

template <typename T>
class BoundedQueue {
  static_assert(std::is_trivially_copyable_v<T>, "cells copy T with no constructor");

 public:
  // Largest accepted capacity: cells are allocated up front, and a ring this
  // large would hold minutes of reports from any realistic trainer.
  static constexpr size_t kMaxCapacity = size_t{1} << 24;

  // `capacity` is rounded up to a power of two (index = position & mask).
  // Throws std::invalid_argument for 0 or more than kMaxCapacity.
  explicit BoundedQueue(size_t capacity) {
    if (capacity == 0 || capacity > kMaxCapacity)
      throw std::invalid_argument("queue capacity must be in [1, 2^24]");
    capacity_ = std::bit_ceil(capacity);
    mask_ = capacity_ - 1;
    cells_ = std::make_unique<Cell[]>(capacity_);
    for (size_t i = 0; i < capacity_; ++i) cells_[i].sequence.store(i, std::memory_order_relaxed);
    enqueue_pos_.store(0, std::memory_order_relaxed);
    dequeue_pos_.store(0, std::memory_order_relaxed);
  }

  BoundedQueue(const BoundedQueue&) = delete;
  BoundedQueue& operator=(const BoundedQueue&) = delete;

  // False when the queue is full; `item` is then not stored. On success
  // `*position` (if given) is the item's position: the number of items pushed
  // before it, counting every producer.
  bool TryPush(const T& item, uint64_t* position = nullptr) noexcept {
    uint64_t pos = enqueue_pos_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[pos & mask_];
      const uint64_t seq = cell.sequence.load(std::memory_order_acquire);
      const int64_t diff = static_cast<int64_t>(seq - pos);
      if (diff == 0) {
        // The cell is free for this lap: claim the position. On failure `pos`
        // is reloaded with the current value and we retry.
        if (enqueue_pos_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          cell.value = item;
          cell.sequence.store(pos + 1, std::memory_order_release);
          if (position != nullptr) *position = pos;
          return true;
        }
      } else if (diff < 0) {
        // The cell still holds the item from one lap ago: full.
        return false;
      } else {
        // Another producer claimed this position first.
        pos = enqueue_pos_.load(std::memory_order_relaxed);
      }
    }
  }

  // False when the queue is empty; `out` is then untouched.
  bool TryPop(T& out) noexcept {
    uint64_t pos = dequeue_pos_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[pos & mask_];
      const uint64_t seq = cell.sequence.load(std::memory_order_acquire);
      const int64_t diff = static_cast<int64_t>(seq - (pos + 1));
      if (diff == 0) {
        if (dequeue_pos_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          out = cell.value;
          // Free the cell for the producer one lap ahead.
          cell.sequence.store(pos + capacity_, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        // Not yet filled (or a producer claimed it but is still writing).
        return false;
      } else {
        pos = dequeue_pos_.load(std::memory_order_relaxed);
      }
    }
  }

  // Calls fn(item) for the items queued now, oldest first, stopping at the
  // first position a producer has claimed but not yet filled. Consumer side:
  // only while no TryPop runs concurrently (a queue with a single consumer,
  // called from that consumer), since popped cells are refilled by producers.
  // Producers may push meanwhile; their items may or may not be visited.
  template <typename Fn>
  void ForEachQueued(Fn&& fn) const {
    uint64_t pos = dequeue_pos_.load(std::memory_order_relaxed);
    for (size_t n = 0; n < capacity_; ++n, ++pos) {
      const Cell& cell = cells_[pos & mask_];
      if (cell.sequence.load(std::memory_order_acquire) != pos + 1) return;
      fn(cell.value);
    }
  }

  // Items pushed so far (every successful TryPush). Monotonic.
  uint64_t PushedCount() const noexcept { return enqueue_pos_.load(std::memory_order_acquire); }

  // A snapshot that may be stale by the time it is read; for idle checks and
  // statistics, never for correctness.
  size_t SizeApprox() const noexcept {
    const uint64_t enq = enqueue_pos_.load(std::memory_order_acquire);
    const uint64_t deq = dequeue_pos_.load(std::memory_order_acquire);
    return enq > deq ? static_cast<size_t>(enq - deq) : 0;
  }

  size_t capacity() const noexcept { return capacity_; }

 private:
  struct alignas(kCacheLine) Cell {
    std::atomic<uint64_t> sequence{0};
    T value{};
  };

  size_t capacity_ = 0;
  uint64_t mask_ = 0;
  std::unique_ptr<Cell[]> cells_;
  alignas(kCacheLine) std::atomic<uint64_t> enqueue_pos_{0};
  alignas(kCacheLine) std::atomic<uint64_t> dequeue_pos_{0};
};

}  // namespace straggler::detail
