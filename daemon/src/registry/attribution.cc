#include "registry/attribution.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace straggler::daemon {
namespace {

constexpr uint64_t kThermal = 0x20 | 0x40;  // SW / HW thermal slowdown
constexpr uint64_t kPower = 0x4 | 0x80;     // SW power cap / HW power brake
constexpr uint64_t kHwSlowdown = 0x8;

template <class Get>
std::optional<double> MedianOf(const std::vector<const v1::GpuTelemetry*>& samples, Get get) {
  std::vector<double> v;
  for (const v1::GpuTelemetry* s : samples) {
    if (std::optional<double> x = get(*s)) v.push_back(*x);
  }
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::optional<double> SmClock(const v1::GpuTelemetry& t) {
  return t.has_sm_clock_hertz() ? std::optional(t.sm_clock_hertz()) : std::nullopt;
}
std::optional<double> Utilization(const v1::GpuTelemetry& t) {
  return t.has_gpu_utilization() ? std::optional(t.gpu_utilization()) : std::nullopt;
}

std::string Ghz(double hz) { return absl::StrFormat("%.2f GHz", hz / 1e9); }
std::string Percent(double ratio) { return absl::StrFormat("%.0f%%", ratio * 100); }

// "SM clock 1.10 GHz, 62% of the other ranks' median 1.77 GHz" (or of its
// own max); "" when the clock is unknown.
std::string ClockText(const v1::GpuTelemetry& t, std::optional<double> median) {
  if (!t.has_sm_clock_hertz()) return "";
  std::string s = absl::StrCat("SM clock ", Ghz(t.sm_clock_hertz()));
  if (median && *median > 0) {
    absl::StrAppend(&s, ", ", Percent(t.sm_clock_hertz() / *median),
                    " of the other ranks' median ", Ghz(*median));
  } else if (t.has_max_sm_clock_hertz() && t.max_sm_clock_hertz() > 0) {
    absl::StrAppend(&s, ", ", Percent(t.sm_clock_hertz() / t.max_sm_clock_hertz()),
                    " of its max ", Ghz(t.max_sm_clock_hertz()));
  }
  return s;
}

std::string Join(std::string a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return absl::StrCat(a, "; ", b);
}

}  // namespace

std::string_view LikelyCauseName(LikelyCause c) {
  switch (c) {
    case LikelyCause::kUnspecified: return "unspecified";
    case LikelyCause::kNoneVisible: return "none_visible";
    case LikelyCause::kThermalThrottle: return "thermal_throttle";
    case LikelyCause::kPowerThrottle: return "power_throttle";
    case LikelyCause::kHwSlowdown: return "hw_slowdown";
    case LikelyCause::kClockDrop: return "clock_drop";
    case LikelyCause::kLowUtilization: return "low_utilization";
  }
  return "unspecified";
}

Attribution AttributeLikelyCause(const v1::GpuTelemetry* rank,
                                 const std::vector<const v1::GpuTelemetry*>& others) {
  if (rank == nullptr) return {};
  const v1::GpuTelemetry& t = *rank;
  const std::optional<double> median_clock = MedianOf(others, SmClock);
  const std::string clock = ClockText(t, median_clock);
  const uint64_t reasons = t.has_clock_event_reasons() ? t.clock_event_reasons() : 0;

  if (reasons & kThermal) {
    std::string d = absl::StrFormat("thermal slowdown (reasons 0x%x)", reasons);
    if (t.has_temperature_celsius()) absl::StrAppendFormat(&d, ", %.0f C", t.temperature_celsius());
    return {LikelyCause::kThermalThrottle, Join(d, clock)};
  }
  if (reasons & kPower) {
    size_t sharing = 0;
    for (const v1::GpuTelemetry* o : others) {
      if (o->has_clock_event_reasons() && (o->clock_event_reasons() & kPower)) ++sharing;
    }
    if (sharing * 2 <= others.size()) {
      std::string d = absl::StrFormat("power capping (reasons 0x%x)", reasons);
      if (t.has_power_watts()) {
        absl::StrAppendFormat(&d, ", %.0f W", t.power_watts());
        if (t.has_power_limit_watts()) absl::StrAppendFormat(&d, " of %.0f W limit", t.power_limit_watts());
      }
      return {LikelyCause::kPowerThrottle, Join(d, clock)};
    }
  }
  if (reasons & kHwSlowdown) {
    return {LikelyCause::kHwSlowdown,
            Join(absl::StrFormat("hardware slowdown (reasons 0x%x)", reasons), clock)};
  }
  if (t.has_sm_clock_hertz()) {
    if (median_clock && *median_clock > 0) {
      if (t.sm_clock_hertz() < kClockDropRatio * *median_clock) {
        return {LikelyCause::kClockDrop, clock};
      }
    } else if (t.has_max_sm_clock_hertz() &&
               t.sm_clock_hertz() < kClockDropRatio * t.max_sm_clock_hertz()) {
      return {LikelyCause::kClockDrop, clock};
    }
  }
  const std::optional<double> median_util = MedianOf(others, Utilization);
  if (t.has_gpu_utilization() && median_util && *median_util >= kBusyUtilization &&
      t.gpu_utilization() < kLowUtilizationRatio * *median_util) {
    return {LikelyCause::kLowUtilization,
            absl::StrCat("GPU busy ", Percent(t.gpu_utilization()), " vs the other ranks' median ",
                         Percent(*median_util),
                         ": the time goes outside the GPU (input pipeline, host CPU)")};
  }
  std::string d = "no throttle reason";
  if (t.has_temperature_celsius()) absl::StrAppendFormat(&d, ", %.0f C", t.temperature_celsius());
  if (t.has_gpu_utilization()) absl::StrAppend(&d, ", GPU busy ", Percent(t.gpu_utilization()));
  return {LikelyCause::kNoneVisible, Join(d, clock)};
}

}  // namespace straggler::daemon
