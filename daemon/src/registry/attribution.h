// Likely cause of a slow rank, from what the daemon knows of it against the
// other ranks: its recent phases (IterationReport.input_wait_seconds,
// compute_seconds, optimizer_seconds), its process's and node's host
// telemetry and its GPU telemetry. Attached to the detection event's
// evidence, the Worker and the event's log line, with the numbers behind it.
//
//   RankEvidence rank3{.gpu = &gpu3, .phases = &phases3, .process = &proc3};
//   Attribution a = AttributeLikelyCause(rank3, {rank0, rank1, rank2});
//   // a.cause == LikelyCause::kInputPipeline,
//   // a.detail == "input wait 0.400 s vs the other ranks' median 0.010 s, ..."
//
// The rule, first match wins (docs/detection.md, "Likely cause"; thresholds
// below, pinned by tests/daemon/attribution_test.cc). "Stands out" always
// means against the other ranks, never against the rank's own past: the
// straggler was judged against its peers, and the cause explains that
// difference (an input stall of every rank is nobody's cause).
//  1. nothing known of the rank (no GPU sample, no phases, no host sample)
//                                                      -> unspecified
//  2. its input wait holds most of its excess time over the other ranks and
//     its compute did not grow:                         -> host when its
//     process's run delay or its node's pressure/steal stands out (they slow
//     the loader), else input_pipeline
//  3. a GPU reason (rules 2-5 of the GPU rule below)   -> that reason
//  4. its process's run delay stands out               -> host
//  5. its node's CPU/memory/IO pressure or CPU steal stands out against the
//     other nodes' (a slow node, not a rank)            -> host
//  6. its compute holds most of its excess time        -> low_utilization when
//     the GPU rule's rule 6 holds, else compute ("no GPU reason visible")
//  7. the GPU rule's low_utilization                   -> low_utilization
//  8. otherwise                                         -> none_visible
// `data` (slow on time, not per unit of work) is never chosen here. It is
// reserved: nothing in the daemon or the engine sets it yet (issue 31 wants
// it shown where the judging per unit of work decided so).
//
// The GPU rule alone (AttributeGpu), first match wins:
//  1. no telemetry for the rank                       -> unspecified
//  2. a thermal reason bit (0x20 SW, 0x40 HW)         -> thermal_throttle
//  3. a power reason bit (0x4 SW cap, 0x80 HW brake) that at most half of the
//     other ranks share (a cap every GPU hits is the job's normal state) -> power_throttle
//  4. HW slowdown (0x8) alone                         -> hw_slowdown
//  5. SM clock < kClockDropRatio x the median of the other ranks' SM clocks
//     (without other ranks: x its own max SM clock)   -> clock_drop
//  6. GPU utilisation < kLowUtilizationRatio x the other ranks' median, that
//     median at least kBusyUtilization                -> low_utilization
//  7. otherwise                                       -> none_visible
// Callers pass only fresh samples (the daemon drops those older than
// kTelemetryStaleAfter). Pure functions; thread-compatible. A library of
// its own (straggler::attribution): straggler-replay applies the same rule
// to a trace's phases (tools/straggler-replay/replay.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "straggler/v1/straggler.pb.h"

namespace straggler::daemon {

// A rank's telemetry counts for metrics and attribution this long after the
// daemon received it (the agent samples every second and sends each new
// sample; 30 missed samples mean the agent or its NVML is gone).
inline constexpr std::chrono::seconds kTelemetryStaleAfter{30};

inline constexpr double kClockDropRatio = 0.85;
inline constexpr double kLowUtilizationRatio = 0.6;
inline constexpr double kBusyUtilization = 0.5;

// Phases. A phase's excess is its level above the other ranks' median; a
// phase "holds most" of the rank's excess time at kPhaseShare of the sum of
// the three phases' excesses, and only when that sum is at least
// kPhaseExcessFloor of the other ranks' median own time (below it the phases
// do not show the rank slow). Compute "did not grow" below kComputeGrowRatio
// x the other ranks' median compute.
inline constexpr double kPhaseShare = 0.6;
inline constexpr double kPhaseExcessFloor = 0.1;
inline constexpr double kComputeGrowRatio = 1.15;
// Each report moves a rank's phase levels this far toward its values: the
// levels follow a change within the few iterations a detection takes.
inline constexpr float kPhaseEwmaAlpha = 0.3f;

// Host. A process's run delay (s runnable but not running, per s) stands out
// at kRunDelayFloor and kHostRatio x the other ranks' median; a node's
// pressure (share of time some task stalled) or steal share at
// kNodePressureFloor / kStealFloor and kHostRatio x the median of the ranks
// on other nodes.
inline constexpr double kRunDelayFloor = 0.05;
inline constexpr double kNodePressureFloor = 0.10;
inline constexpr double kStealFloor = 0.05;
inline constexpr double kHostRatio = 2.0;

// Values are the wire's order (proto LikelyCause): new causes are appended.
enum class LikelyCause {
  kUnspecified,
  kNoneVisible,
  kThermalThrottle,
  kPowerThrottle,
  kHwSlowdown,
  kClockDrop,
  kLowUtilization,
  kInputPipeline,  // input wait grew, compute did not
  kCompute,        // compute grew, no GPU reason visible
  kHost,           // its process waits for a CPU, or its node is under pressure
  kData,           // slow on time, not per unit of work: not a straggler (AttributeData)
};
inline constexpr size_t kLikelyCauses = static_cast<size_t>(LikelyCause::kData) + 1;
std::string_view LikelyCauseName(LikelyCause c);  // "thermal_throttle", "input_pipeline", ...

struct Attribution {
  LikelyCause cause = LikelyCause::kUnspecified;
  std::string detail;  // "" for unspecified
};

// A rank's recent phase levels, exponentially weighted (kPhaseEwmaAlpha):
// the per-rank column JobState keeps for jobs that report phases (16 bytes a
// rank). `reports` counts the reports folded in since the job's column
// exists; a phase a report lacks counts as 0, as judging counts it.
struct RankPhases {
  float input_wait = 0;
  float compute = 0;
  float optimizer = 0;
  uint32_t reports = 0;
  // One accepted report; input/optimizer < 0 = not reported.
  void Add(double input, double compute_seconds, double optimizer_seconds);
};

// A job's phase column: empty until its first report with a phase (a job
// that reports none pays nothing), then one RankPhases per rank of `ranks`,
// each folding in every accepted report of its rank from then on (a phase
// the report lacks counts as 0). `rank` < ranks.
// Inline: it runs for every accepted report, and most jobs report no phases
// (then it returns at once, no call).
inline void NotePhases(std::vector<RankPhases>& column, size_t ranks, uint32_t rank,
                       std::optional<double> input_wait, double compute,
                       std::optional<double> optimizer) {
  if (column.empty()) {
    if (!input_wait && !optimizer) return;
    column.resize(ranks);
  }
  column[rank].Add(input_wait.value_or(0), compute, optimizer.value_or(0));
}

// What the daemon knows of one rank; null = not known (or stale). `node`
// names the rank's node: host samples of ranks on the same node are one
// node's, and a node is compared with the other nodes only.
struct RankEvidence {
  const v1::GpuTelemetry* gpu = nullptr;
  const RankPhases* phases = nullptr;               // null or reports == 0: none
  const v1::ProcessTelemetry* process = nullptr;
  const v1::HostTelemetry* host = nullptr;
  std::string_view node;
};

Attribution AttributeLikelyCause(const RankEvidence& rank, const std::vector<RankEvidence>& others);

// `data` for a healthy rank the peer policy judges per unit of work but
// finds slow on time alone (engine::DataNote, whose ratios these are): its
// steps drew more work than its group's. Not a straggler: shown on the
// rank while it holds, never counted as a detection.
Attribution AttributeData(double time_ratio, double threshold_ratio, double per_work_ratio,
                          double work_ratio);

// The GPU rule alone. `rank`: the straggler's latest fresh sample, or null.
// `others`: the other ranks' fresh samples (never null entries).
Attribution AttributeGpu(const v1::GpuTelemetry* rank,
                         const std::vector<const v1::GpuTelemetry*>& others);

}  // namespace straggler::daemon
