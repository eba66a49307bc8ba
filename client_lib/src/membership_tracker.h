// The client's view of the job's membership: every version received (the
// history and the switch rule, membership_history.h), how far the daemon has
// processed each served rank's reports, MembershipFor's wait for certainty,
// and the OnMembershipChange callbacks. Fed by the stream's reader thread
// (Apply, then RunCallbacks); asked by the trainer's threads.
//
// Thread safety: every method may be called from any thread; Apply and
// RunCallbacks from one reader thread at a time. The history and progress
// are guarded by an internal absl::Mutex (annotated: clang's -Wthread-safety
// checks it, ctest layout:thread_safety); Current() and Newest() read an
// atomic pointer (snapshots live as long as the tracker). Callbacks run on
// the thread that calls RunCallbacks, without the tracker's locks held.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "membership_history.h"
#include "straggler/client.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::stream {
class StreamSession;
}  // namespace straggler::stream

namespace straggler::detail {

using stream::StreamSession;

class MembershipTracker {
 public:
  // Version 0 (nobody excluded) of a job of `world_size` ranks, for the
  // ranks `served` (any order, no duplicates).
  MembershipTracker(uint32_t world_size, std::vector<uint32_t> served);

  // The served ranks, ascending.
  const std::vector<uint32_t>& Served() const { return served_; }
  // Index of `rank` among the served ranks, -1 when not served. The array is
  // fixed after construction: a binary search over a few entries, no locks.
  int SlotOf(uint32_t rank) const {
    auto it = std::lower_bound(served_.begin(), served_.end(), rank);
    if (it == served_.end() || *it != rank) return -1;
    return static_cast<int>(it - served_.begin());
  }

  // The newest version received. Lock-free.
  const MembershipView& Current() const { return *current_.load(std::memory_order_acquire); }

  // Client::MembershipFor for a served `rank` (else: best known, ok =
  // false), waiting on `session` for the acknowledgement that makes it
  // certain (the session is woken so the report that does goes now).
  MembershipView For(uint64_t iteration, std::chrono::milliseconds timeout, uint32_t rank,
                     StreamSession& session) ABSL_LOCKS_EXCLUDED(state_mu_);
  // Client::ReadmissionAfter.
  std::optional<MembershipView> ReadmissionAfter(uint64_t iteration, uint32_t rank)
      ABSL_LOCKS_EXCLUDED(state_mu_);
  // Client::OnMembershipChange (an empty callback is ignored).
  void OnChange(Client::MembershipCallback callback) ABSL_LOCKS_EXCLUDED(callbacks_mu_);

  // Reader thread: takes a directive's memberships (a daemon's
  // world_size 0 means `world_size`) and its progress of served ranks, then
  // wakes For(). Returns the versions newer than any before, for RunCallbacks.
  std::vector<const MembershipView*> Apply(const ::straggler::v1::Directive& d)
      ABSL_LOCKS_EXCLUDED(state_mu_);
  // Reader thread: each callback for each version, in order; a callback
  // that throws is logged and the rest still run.
  void RunCallbacks(const std::vector<const MembershipView*>& announced)
      ABSL_LOCKS_EXCLUDED(callbacks_mu_);

  // The hello's known_* fields: the newest version held (if above 0), so a
  // restarted daemon publishes versions above it and republishes its
  // excluded ranks.
  void FillKnown(::straggler::v1::StreamHello* hello) const;

  // Wakes every For() waiter (the client is going away).
  void WakeAll() { state_cv_.SignalAll(); }

 private:
  const uint32_t world_size_;
  std::vector<uint32_t> served_;  // sorted; fixed after construction

  absl::Mutex state_mu_;
  absl::CondVar state_cv_;  // with state_mu_: history or progress grew, or WakeAll
  MembershipHistory history_ ABSL_GUARDED_BY(state_mu_);
  // By slot of served_.
  std::vector<std::optional<uint64_t>> progress_ ABSL_GUARDED_BY(state_mu_);
  // The count of StreamSession::Connections() at which a For() wait last
  // timed out while no daemon could answer.
  std::optional<uint64_t> gave_up_on_connection_ ABSL_GUARDED_BY(state_mu_);
  // history_.Newest(), readable without the lock.
  std::atomic<const MembershipView*> current_{nullptr};

  absl::Mutex callbacks_mu_;
  std::vector<std::shared_ptr<Client::MembershipCallback>> callbacks_
      ABSL_GUARDED_BY(callbacks_mu_);
};

}  // namespace straggler::detail
