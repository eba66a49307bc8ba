// Exclusion planning: which ranks the job should leave out, given a snapshot
// of its ranks and the policy - the guards of docs/detection.md
// ("Exclusion"): overrides, capacity (max_excluded_fraction,
// min_active_ranks) and the predicted throughput gain. A pure function: no
// engine, no events, no clock; the engine turns the plan into guard events
// and, through the membership gate, into a version (engine_exclusion.cc).
// Thread safety: stateless; safe to call from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"

namespace straggler::engine::internal {

// What the planner needs to know of one rank.
struct RankSnapshot {
  WorkerState state = WorkerState::kPending;
  RankOverride override = RankOverride::kNone;
  bool on_probation = false;     // re-included for probation: not a candidate
  bool probation_failed = false;  // still slow when its probation ended
  double ewma = 0.0;
  uint32_t counter = 0;
};

struct PlanInput {
  std::vector<RankSnapshot> ranks;    // one per rank, index = rank
  // The newest version's excluded set, ascending; a view (it must outlive
  // the PlanExclusion call).
  std::span<const ExcludedRank> current;
  uint64_t iteration = 0;             // "since" of a newly excluded rank
  double baseline = 0.0;              // for the straggler detail; 0 = none yet
  uint32_t limit = 0;                 // the counter limit in force
};

// How many ranks may be out at once (docs/detection.md, "Exclusion").
struct Capacity {
  uint32_t world_size = 0;
  uint32_t max_excluded = 0;  // floor(max_excluded_fraction x world_size)
  uint32_t min_active = 0;

  Capacity(const PolicyConfig& policy, uint32_t world_size);
  // Whether one more rank may be excluded when `excluded` already are.
  bool Room(uint32_t excluded) const;
  // Why not, for a guard event ("" when there is room).
  std::string Why(uint32_t excluded) const;
};

struct ExclusionPlan {
  std::vector<ExcludedRank> excluded;  // the wanted set, ascending by rank
  // Candidates a guard keeps in, ascending by rank, and why (one reason for
  // the whole plan: the capacity left once every admitted rank is out, else
  // the throughput guard).
  std::vector<uint32_t> blocked;
  std::string blocked_why;
};

// Forced-out ranks are always out, forced-in ones never; with exclusion
// disabled only forced ones are. Otherwise unresponsive and straggler ranks
// are candidates; an excluded candidate stays out (keeping its entry). New
// unresponsive candidates go first while capacity allows, then the largest
// slowest-first set of straggler candidates that fits and is predicted to
// raise throughput by min_throughput_gain.
ExclusionPlan PlanExclusion(const PolicyConfig& policy, const PlanInput& in);

}  // namespace straggler::engine::internal
