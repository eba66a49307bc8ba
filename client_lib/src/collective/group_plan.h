// The plan of one data-parallel group at one iteration, derived from the
// job's plan (JobSwitch, straggler/collective.h; the argument is in
// docs/hybrid.md). Pure: no sockets, clocks or threads, so every backend's
// group mode (Gloo, NCCL) decides alike and the rule is unit-tested alone.
//
//   detail::GroupHistory h{agreement.begun(), agreement.previously_participating(),
//                          agreement.previous_active()};
//   StepPlan plan = detail::GroupStepPlan(sw.Begin(it), group, sw, rank, h);
#pragma once

#include <cstdint>
#include <vector>

#include "agreement.h"
#include "straggler/collective.h"

namespace straggler::detail {

// This rank's group state at its previous iteration.
struct GroupHistory {
  bool begun = false;
  bool previously_participating = false;
  std::vector<uint32_t> previous_active;  // ascending
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

// What a backend's group mode calls in BeginIteration: checks that
// `iteration` is above the last one `history` committed, asks the switch for
// the job's plan (the agreement, once per iteration for every group) and
// derives the group's.
StepPlan GroupPlanFor(uint64_t iteration, const Agreement& history, JobSwitch& sw, const DataParallelGroup& group,
                      uint32_t rank);

}  // namespace straggler::detail
