// The batches a stream client has written and the daemon (or agent) has not
// acknowledged yet, oldest first, with the sequence numbers they went out
// under. A new connection resends them with those numbers (the daemon
// deduplicates by rank and iteration); an acknowledgement of sequence S
// completes every batch up to S. Bounded: HasRoom() says whether one more
// batch of max_batch reports fits.
//
// Thread safety: one sender thread calls NextSequence, Add and ForEach; one
// reader thread at a time calls Ack; HasRoom and WaitCompleted may be called
// from any thread. The batches themselves are guarded by an internal mutex.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "queued_report.h"

namespace straggler::detail {

class UnackedBatches {
 public:
  struct Batch {
    uint64_t sequence;
    std::vector<QueuedReport> reports;
  };
  // At most max_reports reports unacknowledged, but always room for one batch.
  UnackedBatches(size_t max_reports, size_t max_batch)
      : max_reports_(std::max(max_reports, max_batch)), max_batch_(max_batch) {}

  bool HasRoom() const {
    absl::MutexLock lock(&mu_);
    return reports_ + max_batch_ <= max_reports_ || batches_.empty();
  }

  // Sender thread: the sequence for the next message (1, 2, ...; 0 means
  // "nothing acknowledged").
  uint64_t NextSequence() { return next_sequence_++; }

  // Sender thread: `b` was (or is about to be) written.
  void Add(Batch b) {
    absl::MutexLock lock(&mu_);
    reports_ += b.reports.size();
    batches_.push_back(std::move(b));
  }

  // Sender thread: fn(const Batch&) for each unacknowledged batch, oldest
  // first, under the lock (fn must not call back into this object).
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    absl::MutexLock lock(&mu_);
    for (const Batch& b : batches_) fn(b);
  }

  // Reader thread: whether an acknowledgement of `sequence` is above every
  // earlier one (what Ack would count as newer).
  bool IsNewer(uint64_t sequence) const { return sequence > last_acked_; }

  // Reader thread: the peer acknowledged every message up to `sequence`.
  // When that is above every earlier acknowledgement (IsNewer; the caller
  // counts the acknowledgement before calling this), the batches it covers
  // complete. Wakes WaitCompleted when batches completed. Returns whether
  // any did (there may be room now).
  bool Ack(uint64_t sequence) {
    bool freed = false;
    if (sequence <= last_acked_) return freed;
    last_acked_ = sequence;
    {
      absl::MutexLock lock(&mu_);
      while (!batches_.empty() && batches_.front().sequence <= sequence) {
        completed_ += batches_.front().reports.size();
        reports_ -= batches_.front().reports.size();
        batches_.pop_front();
        freed = true;
      }
    }
    if (freed) completed_cv_.SignalAll();
    return freed;
  }

  // Blocks until `target` reports have been completed by acknowledgements
  // (counting from the first), or `timeout`; returns whether they were.
  bool WaitCompleted(uint64_t target, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    absl::MutexLock lock(&mu_);
    while (completed_ < target) {
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= left.zero() || completed_cv_.WaitWithTimeout(&mu_, absl::FromChrono(left)))
        return completed_ >= target;  // timed out
    }
    return true;
  }

 private:
  const size_t max_reports_;
  const size_t max_batch_;
  mutable absl::Mutex mu_;
  absl::CondVar completed_cv_;  // completed_ grew
  std::deque<Batch> batches_ ABSL_GUARDED_BY(mu_);
  size_t reports_ ABSL_GUARDED_BY(mu_) = 0;     // in batches_
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;  // reports in acknowledged batches
  uint64_t next_sequence_ = 1;  // sender thread only
  uint64_t last_acked_ = 0;     // reader thread only (one reader at a time)
};

}  // namespace straggler::detail
