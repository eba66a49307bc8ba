// The agreement rule of PartialAllReduce (collective.h, README "Collective
// layer"), shared by every backend so that Gloo and NCCL ranks can never
// decide differently:
//
//   * the membership of an iteration is Client::MembershipFor(iteration); a
//     certain answer is applied as it is;
//   * an uncertain one (timeout, daemon unreachable) never is: the rank keeps
//     the membership it applied last, which every rank that was in step at
//     the previous iteration holds too;
//   * parameters are synchronised when the active set gains a rank that was
//     not active at this rank's previous iteration (or this rank itself was
//     not taking part) - every active rank computes the same answer.
//
//   Agreement a(rank, /*previous_active=*/{}, /*previously_participating=*/false);
//   StepPlan plan = a.Decide(it, client, timeout);   // may throw CollectiveError
//   ... set up the communicator of plan.active_ranks, using a.previous_active() ...
//   a.Commit(std::move(plan));                        // now it is "applied"
//
// If the backend throws between Decide and Commit, nothing is applied: the
// next Decide starts again from the last committed iteration's state.
// Not thread-safe: used by the one thread that drives a PartialAllReduce.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "straggler/client.h"
#include "straggler/collective.h"

namespace straggler::detail {

class Agreement {
 public:
  // `previous_active` / `previously_participating`: the state a backend
  // treats as "before the first iteration" (Gloo: nothing; NCCL: the full
  // communicator, so that a first set without some rank is a shrink of it).
  // The first iteration always synchronises parameters.
  Agreement(uint32_t rank, std::vector<uint32_t> previous_active, bool previously_participating);

  // The plan of `iteration` by the rule above. Throws CollectiveError when
  // `iteration` is not above the last committed one.
  StepPlan Decide(uint64_t iteration, Client& client, std::chrono::milliseconds timeout);

  // Records `plan` (the one Decide just returned) as applied: the backend
  // has its communicator. Until then previous_*(), plan() and begun()
  // describe the last committed iteration.
  void Commit(StepPlan plan);

  const std::vector<uint32_t>& previous_active() const { return previous_active_; }
  bool previously_participating() const { return previously_participating_; }
  // The membership behind the last decided plan.
  const MembershipView& membership() const { return decided_; }
  // The last committed plan (default-constructed before the first Commit).
  const StepPlan& plan() const { return plan_; }
  bool begun() const { return begun_; }

  // Throws CollectiveError("<what> before the first BeginIteration").
  void RequireBegun(const char* what) const;
  // "iteration 12: <backend> <op> among ranks {0,1,3} (membership version 4,
  // certain) failed within 20000 ms; a peer is gone or applied another
  // membership": the common part of every failed-collective error.
  std::string FailureText(std::string_view backend, std::string_view op,
                          std::chrono::milliseconds timeout) const;

 private:
  const uint32_t rank_;
  std::optional<MembershipView> applied_;
  MembershipView decided_;
  std::vector<uint32_t> previous_active_;
  bool previously_participating_;
  bool begun_ = false;
  StepPlan plan_;
};

// The checks every backend's options share (GlooOptions, NcclOptions):
// empty when fine, else what is wrong, naming the value.
std::string ValidateCommonOptions(const std::string& job_id, uint32_t rank, uint32_t world_size,
                                  const std::string& rendezvous_endpoint,
                                  std::chrono::milliseconds collective_timeout,
                                  std::chrono::milliseconds membership_timeout);

}  // namespace straggler::detail
