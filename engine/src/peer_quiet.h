// PeerReference::Judge and Quiet (docs/detection.md, "peer"): the verdict
// most ranks get most rows - healthy, nothing counted, windows surely below
// both thresholds - decided inline where a step is judged, without the call
// into JudgeRule, which would change nothing for them (same verdicts:
// JudgeRule with every branch these conditions rule out taken away). Needs
// EngineImpl's definition, so apart from reference_peer.h. One thread at a
// time (the engine's).
#pragma once

#include "engine_impl.h"
#include "reference_peer.h"

namespace straggler::engine::internal {

inline bool PeerReference::Quiet(uint32_t rank, const GroupState& gs) const {
  const RankState& r = e_.ranks[rank];
  const PeerRank& pr = ranks_[rank];
  return r.state == WorkerState::kHealthy && r.counter == 0 && !pr.was_straggler &&
         pr.above_rows == 0 && pr.below_rows == 0 && pr.gray_rows == 0 &&
         pr.steps.NoneSevere() && e_.policy.peer_enter_rows > 0 &&
         !(pr.steps.HaveWindow(logs_p_) && pr.steps.TrimmedMayReach(gs.threshold)) &&
         !pr.steps.LongMayReach(gs.threshold_long);
}

inline void PeerReference::Judge(uint32_t rank, double compute, uint64_t iteration, Time now,
                                 const GroupState& gs, bool alone,
                                 absl::FunctionRef<std::string(bool, double)> why) {
  if (!Quiet(rank, gs)) JudgeRule(rank, compute, iteration, now, gs, alone, why);
}

}  // namespace straggler::engine::internal
