// straggler-replay's core: runs a Trace through engine::JobEngine offline and
// deterministically, or through a reference rule, and keeps per (rank,
// iteration) whether the rank was flagged (engine: its WorkerState is
// straggler - classification, not exclusion).
//
// Time is synthetic: row r of the trace is fed at T0 + (r + 1) x
// base_seconds, every reporting rank in ascending rank order, then Tick().
// All ranks are announced at T0 (as the client's hello does), a rank that
// joins late (Trace::join_row) just before its first report, each with the
// topology the trace declares (JobEngine::SetTopology), and the epoch length
// is announced when the trace knows it. A trace with phases (input wait,
// optimizer) keeps each rank's phase levels as the daemon does, and each
// detection gets the daemon's likely cause from them (no telemetry: the
// trace has none).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"
#include "straggler/quality/scoring.h"
#include "straggler/quality/trace.h"

namespace straggler::replay {

struct PolicyRun {
  std::string policy;
  quality::RankMatrix flagged;
  // Absolute iterations, per rank.
  std::vector<std::vector<uint64_t>> detected_at, recovered_at, unresponsive_at;
  // Per rank, each detection's likely cause ("input_pipeline"), parallel to
  // detected_at: the daemon's rule (daemon/src/registry/attribution.h) over
  // the phases the trace reports. Empty for a trace without phases (the
  // daemon says "unspecified" there) and for a reference rule.
  std::vector<std::vector<std::string>> detected_cause;
  uint64_t reports = 0;
  uint64_t rejected = 0;
  std::string first_rejection;  // message of the first rejected report
  // Engine runs: each rank's topology as the engine holds it at the end
  // (JobEngine::Topology); empty for a reference rule.
  std::vector<engine::RankTopology> topology;
};

PolicyRun ReplayEngine(const quality::Trace& t, const engine::PolicyConfig& policy,
                       std::string name);
// A reference rule's flags, with detections / recoveries at their rises and falls.
PolicyRun FromFlags(const quality::Trace& t, quality::RankMatrix flags, std::string name);

}  // namespace straggler::replay
