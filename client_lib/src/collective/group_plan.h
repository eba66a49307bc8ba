// The plan of one data-parallel group at one iteration, derived from the
// job's plan (JobSwitch, straggler/collective.h; the argument is in
// docs/hybrid.md). Pure: no sockets, clocks or threads, so every backend's
// group mode (Gloo, NCCL) decides alike and the rule is unit-tested alone.
//
//   detail::GroupHistory h{agreement.begun(), agreement.previously_participating(),
//                          agreement.previous_active()};
//   StepPlan plan = detail::GroupStepPlan(sw.Begin(it), group, sw, rank, h);
//
// A backend's BeginIteration calls GroupPlanFor with its GroupActiveCache, so
// the group's active set is derived once per applied job membership, not at
// every step. Not thread-safe (a cache belongs to one reducer's thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agreement.h"
#include "straggler/collective.h"

namespace straggler::detail {

// What both backends' group factories check before building anything: a
// switch is given, its job's world size is `world_size`, the group is valid
// for `rank` (DataParallelGroup::Validate), and every member is the replica
// the switch's map names for it (or the map makes it a replica of its own).
// "" when fine, else what is wrong, naming the group and the value.
std::string ValidateGroupFor(const DataParallelGroup& group, const JobSwitch* sw, uint32_t rank,
                             uint32_t world_size);

// The start of both backends' factories: `options` valid (Options::Validate)
// and, for a group, ValidateGroupFor. "" when fine, else what is wrong.
template <class Options>
std::string ValidateFactoryInput(const Options& options, const JobSwitch* sw,
                                 const std::optional<DataParallelGroup>& group) {
  std::string why = options.Validate();
  if (why.empty() && group) why = ValidateGroupFor(*group, sw, options.rank, options.world_size);
  return why;
}

// A factory's refusal: *error (when given) = `why`, and no reducer.
template <class Reducer>
std::unique_ptr<Reducer> Refuse(std::string* error, std::string why) {
  if (error) *error = std::move(why);
  return nullptr;
}

// The group's active members when the job's active set is `job_active`
// (ascending): the members whose replica (sw.ReplicaOf) has no rank outside
// it, ascending. O(world size + group size x log excluded replicas).
std::vector<uint32_t> GroupActiveRanks(const std::vector<uint32_t>& job_active,
                                       const DataParallelGroup& group, const JobSwitch& sw);

// The group's root among `active` (ascending): the member of the lowest
// replica by the group's own numbers (0 when `active` holds no member).
uint32_t GroupRoot(const DataParallelGroup& group, const std::vector<uint32_t>& active);

// A group's active members at one job plan, and their root.
struct GroupActive {
  std::vector<uint32_t> ranks;  // GroupActiveRanks
  uint32_t root = 0;            // GroupRoot
};

// GroupActive for the job plans a group applies step after step, derived
// again only when the plan's version or active set differs from the last
// call's (the set is compared too - a memcmp - because a restarted daemon
// may publish a version number again with another set).
class GroupActiveCache {
 public:
  const GroupActive& Get(const StepPlan& job, const DataParallelGroup& group, const JobSwitch& sw);

 private:
  bool valid_ = false;
  uint64_t version_ = 0;
  std::vector<uint32_t> job_active_;
  GroupActive value_;
};

// This rank's group state at its previous iteration.
struct GroupHistory {
  bool begun = false;
  bool previously_participating = false;
  // Ascending; a view of the Agreement's (no copy per step on the training
  // thread), valid for the call it is passed to.
  std::span<const uint32_t> previous_active;
};

// The group's plan: the job's iteration, version, certainty and deferral;
// the group's active members: those whose replica has no rank
// outside the job's active set, ascending; participating when this rank is one;
// root = the active member of the lowest replica; sync_parameters when the
// group's active set gained a member since this rank's previous iteration
// (or this rank was not taking part, or it is the first iteration) - every
// active member computes the same answer, as they all applied the same job
// membership at their previous iteration. rejoin_iteration is the job's.
StepPlan GroupStepPlan(const StepPlan& job, const DataParallelGroup& group, const JobSwitch& sw,
                       uint32_t rank, const GroupHistory& history);
// The same with the group's active members and root already derived
// (`active`: of job.active_ranks).
StepPlan GroupStepPlan(const StepPlan& job, const GroupActive& active, uint32_t rank, const GroupHistory& history);

// What every backend's BeginIteration calls for its plan: a group's
// (`sw` and `group` given) through GroupPlanFor, the flat backend's through
// its own agreement (Agreement::Decide with `options`' timeouts and
// interval, over `transport`).
StepPlan PlanOf(uint64_t iteration, Agreement& agreement, Client& client, const CollectiveOptions& options,
                AgreementTransport& transport, JobSwitch* sw, const std::optional<DataParallelGroup>& group,
                GroupActiveCache& cache);

// What a backend's group mode calls in BeginIteration: checks that
// `iteration` is above the last one `history` committed, asks the switch for
// the job's plan (the agreement, once per iteration for every group) and
// derives the group's, its active members through `cache`.
StepPlan GroupPlanFor(uint64_t iteration, const Agreement& history, JobSwitch& sw, const DataParallelGroup& group,
                      uint32_t rank, GroupActiveCache& cache);

}  // namespace straggler::detail
