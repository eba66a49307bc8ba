// Snapshots and plan inputs shared by the exclusion planner's tests
// (exclusion_planner_test.cc, replica_planner_test.cc).
#pragma once

#include <vector>

#include "exclusion_planner.h"
#include "straggler/engine/job_engine.h"

namespace straggler::engine::internal::testing {

inline RankSnapshot Healthy(double ewma = 1.0) {
  RankSnapshot r;
  r.state = WorkerState::kHealthy;
  r.ewma = ewma;
  return r;
}

inline RankSnapshot Straggler(double ewma, uint32_t counter = 5) {
  RankSnapshot r = Healthy(ewma);
  r.state = WorkerState::kStraggler;
  r.counter = counter;
  return r;
}

inline RankSnapshot Unresponsive() {
  RankSnapshot r = Healthy();
  r.state = WorkerState::kUnresponsive;
  return r;
}

// `current` is viewed, not copied: pass a vector that outlives the plan.
inline PlanInput Input(std::vector<RankSnapshot> ranks, const std::vector<ExcludedRank>& current = {}) {
  PlanInput in;
  in.ranks = std::move(ranks);
  in.current = current;
  in.iteration = 100;
  in.baseline = 1.0;
  in.limit = 5;
  return in;
}

inline std::vector<uint32_t> Ranks(const std::vector<ExcludedRank>& v) {
  std::vector<uint32_t> out;
  for (const auto& e : v) out.push_back(e.rank);
  return out;
}

}  // namespace straggler::engine::internal::testing
