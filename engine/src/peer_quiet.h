// PeerReference::Quiet (docs/detection.md, "peer"): the verdict most ranks
// get most rows - healthy, nothing counted, windows surely below both
// thresholds - decided inline where a step is judged, before the call into
// Judge, which would change nothing for them (same verdicts: Judge's rule
// with every branch these conditions rule out taken away). Needs
// EngineImpl's definition, so apart from reference_peer.h. One thread at a
// time (the engine's).
#pragma once

#include "engine_impl.h"
#include "reference_peer.h"

namespace straggler::engine::internal {

inline bool PeerReference::Quiet(uint32_t rank, const PeerRank& pr, const GroupState& gs) const {
  const RankState& r = e_.ranks[rank];
  return r.state == WorkerState::kHealthy && r.counter == 0 && !pr.was_straggler &&
         pr.above_rows == 0 && pr.below_rows == 0 && pr.gray_rows == 0 &&
         pr.steps.NoneSevere() && e_.policy.peer_enter_rows > 0 &&
         !(pr.steps.HaveWindow(logs_p_) && pr.steps.TrimmedMayReach(gs.threshold)) &&
         !pr.steps.LongMayReach(gs.threshold_long);
}

}  // namespace straggler::engine::internal
