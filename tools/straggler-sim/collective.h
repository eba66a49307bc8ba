// The simulated collective of straggler-sim: an in-process barrier per
// iteration among the ranks a membership names as active — what a partial
// all-reduce is to the job's speed. It also checks the property a real
// partial all-reduce depends on: every rank that takes part in iteration i
// used the same membership version for it. A disagreement is recorded as an
// agreement violation (in a real job it would be a hang or wrong gradients).
//
//   Collective c(/*iterations=*/400, std::chrono::seconds(30));
//   // in rank r's thread, after computing iteration i under membership m:
//   if (c.Arrive(i, r, m.version, active_ranks) != Collective::Outcome::kCompleted) stop();
//
// Thread-safe: every method may be called from any rank thread concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace straggler_sim {

class Collective {
 public:
  enum class Outcome { kCompleted, kAborted };

  // `iterations`: steps of the job; `step_timeout`: how long a rank waits in
  // one step before the run is declared hung and aborted.
  Collective(uint64_t iterations, std::chrono::milliseconds step_timeout);

  // Rank `rank` arrives at step `iteration` having used membership `version`,
  // whose active ranks are `members` (ascending), after a compute phase that
  // was meant to take `planned_seconds`. Blocks until every member has
  // arrived, the run is aborted, or the step times out (which aborts).
  Outcome Arrive(uint64_t iteration, uint32_t rank, uint64_t version,
                 const std::vector<uint32_t>& members, double planned_seconds);

  // Called once per completed step with its iteration and members, under
  // the collective's lock (keep it short); set before any Arrive.
  using CompletedHook = std::function<void(uint64_t, const std::vector<uint32_t>&)>;
  void OnCompleted(CompletedHook hook) { on_completed_ = std::move(hook); }

  // Blocks until at least `steps` steps have completed; false on abort.
  bool WaitCompleted(uint64_t steps);
  // The same, giving up after `timeout`; true when `steps` steps completed.
  bool WaitCompletedFor(uint64_t steps, std::chrono::milliseconds timeout);

  // Steps completed so far. Steps complete in order, so this is also the
  // iteration the active group is working on.
  uint64_t Completed() const { return completed_.load(std::memory_order_acquire); }
  bool Finished() const { return Completed() >= iterations_; }

  void Abort(const std::string& why);
  bool aborted() const { return aborted_.load(); }
  std::string abort_reason() const;

  // Ranks that arrived at one step with different active sets: a real
  // partial all-reduce would fail there (or mix gradients).
  uint64_t agreement_violations() const { return violations_.load(); }
  // Ranks that arrived at one step with the same active set under different
  // membership versions: harmless to the collective (the same members reuse
  // their communicator), and what a rank that was still disconnected after a
  // daemon restart does while the connected ones take up the new daemon's
  // first version (same excluded set, docs/membership.md#the-switch-rule).
  uint64_t version_splits() const { return version_splits_.load(); }
  uint64_t timeouts() const { return timeouts_.load(); }
  // Sum over completed steps of the slowest member's planned compute time:
  // the job time a synchronous job would take if nothing but compute cost
  // anything. Unlike wall time it does not depend on how busy the machine
  // is, so it is what a test can compare between runs.
  double critical_path_seconds() const;
  // When the last step completed (valid once Finished()).
  std::chrono::steady_clock::time_point finished_at() const;

 private:
  struct Step {
    uint64_t version = 0;
    std::vector<uint32_t> members;
    std::vector<uint32_t> arrived;
    uint32_t first_rank = 0;
    double slowest_planned = 0;
  };
  bool Complete(const Step& step) const;

  const uint64_t iterations_;
  const std::chrono::milliseconds step_timeout_;
  // Waiters Await conditions on completed_ and aborted_, which change only
  // under mu_, so releasing mu_ wakes them.
  mutable absl::Mutex mu_;
  std::map<uint64_t, Step> steps_ ABSL_GUARDED_BY(mu_);  // only steps not yet long complete
  std::atomic<uint64_t> completed_{0};
  std::atomic<bool> aborted_{false};
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> violations_{0};
  std::atomic<uint64_t> version_splits_{0};
  std::atomic<uint64_t> timeouts_{0};
  std::chrono::steady_clock::time_point finished_at_ ABSL_GUARDED_BY(mu_);
  double critical_path_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  CompletedHook on_completed_;
};

}  // namespace straggler_sim
