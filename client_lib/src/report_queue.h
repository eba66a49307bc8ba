// A bounded multi-producer single-consumer queue built so that a producer's
// TryPush makes no system call, never blocks, never allocates and - the point
// of its shape - never *loads* a cache line the consumer writes on every
// operation. Client::Report() pushes on the training thread while the client's
// sender thread pops; in Dmitry Vyukov's MPMC ring (this file's previous
// design) every push loaded its cell's sequence number, which the consumer had
// just read or written, so each push waited for a cross-core cache transfer
// (~100 ns here). Stores to such a line do not stall the core (they wait in the
// store buffer); loads do. So here:
//
//   * producers claim positions with a CAS on `tail_`, a line only producers
//     write (and Flush/Stats read, off the hot path);
//   * "is the cell free?" is answered from `limit_`, a producer-side cache of
//     the consumer's progress (released + capacity); only when a push reaches
//     that limit does a producer load `released_` from the consumer's line -
//     about once per lap, or on every push of a full queue;
//   * the consumer learns a cell is filled from the cell's sequence number
//     (the producer's release store) and tells producers it is done with it
//     through `released_`, a line only the consumer writes.
//
//   straggler::detail::MpscQueue<Item> q(1000);   // capacity becomes 1024
//   if (!q.TryPush(item)) ++dropped;              // full: the caller decides
//   Item out;                                     // on the one consumer thread:
//   while (q.TryPop(out)) Send(out);
//
// Cell protocol, for position p (cell p & mask): a producer that claimed p
// writes the value, then stores sequence = p + 1 (release). The consumer at
// position p takes the cell when it loads sequence == p + 1 (acquire); any
// other value is an older lap's, so the cell is not filled yet. Positions are
// 64-bit and never wrap in practice (2^64 operations).
//
// Thread safety: TryPush, PushedCount and capacity may be called from any
// number of threads concurrently. TryPop and HasItems must be called from one
// thread at a time (the consumer; a hand-over between threads needs a
// happens-before between them, e.g. a mutex or a thread join). FIFO holds per
// producer; items of different producers come out in claim order (a producer
// that claimed a position and has not written it yet holds back later ones).
// T must be trivially copyable (copied in and out with no constructor that
// could throw or allocate).
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

// Lines that different threads write are kept apart so that they do not
// invalidate each other (false sharing).
inline constexpr size_t kCacheLine = 64;

template <typename T>
class MpscQueue {
  static_assert(std::is_trivially_copyable_v<T>, "cells copy T with no constructor");

 public:
  // Largest accepted capacity: cells are allocated up front, and a ring this
  // large would hold minutes of reports from any realistic trainer.
  static constexpr size_t kMaxCapacity = size_t{1} << 24;

  // `capacity` is rounded up to a power of two (index = position & mask).
  // Throws std::invalid_argument for 0 or more than kMaxCapacity.
  explicit MpscQueue(size_t capacity) {
    if (capacity == 0 || capacity > kMaxCapacity)
      throw std::invalid_argument("queue capacity must be in [1, 2^24]");
    capacity_ = std::bit_ceil(capacity);
    mask_ = capacity_ - 1;
    // Sequence 0 never means "filled": the first fill of any cell stores
    // p + 1 >= 1.
    cells_ = std::make_unique<Cell[]>(capacity_);
    limit_.store(capacity_, std::memory_order_relaxed);
  }

  MpscQueue(const MpscQueue&) = delete;
  MpscQueue& operator=(const MpscQueue&) = delete;

  // False when the queue is full (capacity items pushed and not yet popped);
  // `item` is then not stored. On success `*position` (if given) is the
  // item's position: the number of items pushed before it, by any producer.
  bool TryPush(const T& item, uint64_t* position = nullptr) noexcept {
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      // Acquire: the limit may have been raised by another producer that
      // loaded `released_`; its acquire of the consumer's release, and its
      // release of the limit, order the consumer's last read of the cell
      // before our write to it.
      if (pos >= limit_.load(std::memory_order_acquire) && pos >= RaiseLimit()) return false;
      // On failure `pos` is reloaded with the current tail and we retry.
      if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed,
                                      std::memory_order_relaxed))
        break;
    }
    Cell& cell = cells_[pos & mask_];
    cell.value = item;
    cell.sequence.store(pos + 1, std::memory_order_release);
    if (position != nullptr) *position = pos;
    return true;
  }

  // Consumer only. False when the next item has not been pushed (or its
  // producer is still writing it); `out` is then untouched.
  bool TryPop(T& out) noexcept {
    Cell& cell = cells_[head_ & mask_];
    if (cell.sequence.load(std::memory_order_acquire) != head_ + 1) return false;
    out = cell.value;
    ++head_;
    // Release: our read of the cell happens before a producer reuses it.
    released_.store(head_, std::memory_order_release);
    return true;
  }

  // Consumer only: whether TryPop would return an item now. Reads the next
  // cell only (a line the producers store to without loading it), never the
  // producers' tail.
  bool HasItems() const noexcept {
    return cells_[head_ & mask_].sequence.load(std::memory_order_acquire) == head_ + 1;
  }

  // Items pushed so far (every successful TryPush). Monotonic. Loads the
  // producers' line: for statistics and Flush, not for a hot loop.
  uint64_t PushedCount() const noexcept { return tail_.load(std::memory_order_acquire); }

  size_t capacity() const noexcept { return capacity_; }

 private:
  struct alignas(kCacheLine) Cell {
    std::atomic<uint64_t> sequence{0};
    T value{};
  };

  // Reloads the consumer's progress and raises the shared limit to it;
  // returns the (possibly raised) limit.
  uint64_t RaiseLimit() noexcept {
    const uint64_t fresh = released_.load(std::memory_order_acquire) + capacity_;
    uint64_t current = limit_.load(std::memory_order_relaxed);
    while (current < fresh &&
           !limit_.compare_exchange_weak(current, fresh, std::memory_order_release,
                                         std::memory_order_relaxed)) {
    }
    return current < fresh ? fresh : current;
  }

  // Read-only after construction: its own line, so that neither side's
  // writes invalidate it.
  alignas(kCacheLine) size_t capacity_ = 0;
  uint64_t mask_ = 0;
  std::unique_ptr<Cell[]> cells_;
  // Written by producers only.
  alignas(kCacheLine) std::atomic<uint64_t> tail_{0};
  std::atomic<uint64_t> limit_{0};  // positions below it are free cells
  // Written by the consumer only.
  alignas(kCacheLine) uint64_t head_ = 0;  // the consumer's next position
  std::atomic<uint64_t> released_{0};      // cells below it are consumed
};

}  // namespace straggler::detail
