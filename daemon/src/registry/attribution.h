// Likely cause of a straggler, from its GPU telemetry against the other
// ranks'. Attached to the detection event's evidence and its log line.
//
//   Attribution a = AttributeLikelyCause(&gpu_of_rank3, {&gpu_of_rank0, &gpu_of_rank1});
//   // a.cause == LikelyCause::kThermalThrottle,
//   // a.detail == "thermal slowdown (reasons 0x20), 91 C; SM clock 1.10 GHz, 62% of ..."
//
// The rule, first match wins (thresholds below, pinned by tests/daemon/attribution_test.cc):
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
// kTelemetryStaleAfter). Pure function; thread-compatible.
#pragma once

#include <chrono>
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

enum class LikelyCause {
  kUnspecified,
  kNoneVisible,
  kThermalThrottle,
  kPowerThrottle,
  kHwSlowdown,
  kClockDrop,
  kLowUtilization,
};
std::string_view LikelyCauseName(LikelyCause c);  // "thermal_throttle", ...

struct Attribution {
  LikelyCause cause = LikelyCause::kUnspecified;
  std::string detail;  // "" for unspecified
};

// `rank`: the straggler's latest fresh sample, or null. `others`: the other
// ranks' fresh samples (never null entries).
Attribution AttributeLikelyCause(const v1::GpuTelemetry* rank,
                                 const std::vector<const v1::GpuTelemetry*>& others);

}  // namespace straggler::daemon
