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

// The median of `v`, the mean of the two middle values for an even count (as
// the engine's Median, engine/src/peer_steps.h). O(n): a decision at a
// million ranks takes several medians of a million values each.
std::optional<double> Median(std::vector<double> v) {
  if (v.empty()) return std::nullopt;
  const size_t n = v.size();
  const auto mid = v.begin() + n / 2;
  std::nth_element(v.begin(), mid, v.end());
  if (n % 2 == 1) return *mid;
  return (*std::max_element(v.begin(), mid) + *mid) / 2;
}

template <class Get>
std::optional<double> MedianOf(const std::vector<const v1::GpuTelemetry*>& samples, Get get) {
  std::vector<double> v;
  for (const v1::GpuTelemetry* s : samples) {
    if (std::optional<double> x = get(*s)) v.push_back(*x);
  }
  return Median(std::move(v));
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

bool HasPhases(const RankEvidence& e) { return e.phases != nullptr && e.phases->reports > 0; }

// Rule 2 and 6's question: which phase holds most of the rank's excess time
// over the other ranks, with the numbers.
struct PhaseVerdict {
  enum { kNone, kInput, kCompute } kind = kNone;
  std::string detail;  // "" when the rank or no other rank reports phases
};

PhaseVerdict JudgePhases(const RankEvidence& rank, const std::vector<RankEvidence>& others) {
  if (!HasPhases(rank)) return {};
  std::vector<double> in, c, o;
  for (const RankEvidence& e : others) {
    if (!HasPhases(e)) continue;
    in.push_back(e.phases->input_wait);
    c.push_back(e.phases->compute);
    o.push_back(e.phases->optimizer);
  }
  const RankPhases& p = *rank.phases;
  if (in.empty()) {
    return {PhaseVerdict::kNone,
            absl::StrFormat("input wait %.3f s, compute %.3f s, optimizer %.3f s (no other rank "
                            "reports phases)",
                            p.input_wait, p.compute, p.optimizer)};
  }
  const double m_in = *Median(in), m_c = *Median(c), m_o = *Median(o);
  const double x_in = std::max(0.0, p.input_wait - m_in);
  const double x_c = std::max(0.0, p.compute - m_c);
  const double x_o = std::max(0.0, p.optimizer - m_o);
  const double excess = x_in + x_c + x_o;
  PhaseVerdict v;
  v.detail = absl::StrFormat(
      "input wait %.3f s vs the other ranks' median %.3f s, compute %.3f s vs %.3f s, "
      "optimizer %.3f s vs %.3f s",
      p.input_wait, m_in, p.compute, m_c, p.optimizer, m_o);
  if (excess <= 0 || excess < kPhaseExcessFloor * (m_in + m_c + m_o)) return v;
  if (x_in >= kPhaseShare * excess && p.compute < kComputeGrowRatio * m_c) {
    v.kind = PhaseVerdict::kInput;
    absl::StrAppendFormat(&v.detail, ": input wait holds %s of its %.3f s excess",
                          Percent(x_in / excess), excess);
  } else if (x_c + x_o >= kPhaseShare * excess) {
    v.kind = PhaseVerdict::kCompute;
    absl::StrAppendFormat(&v.detail, ": compute and optimizer hold %s of its %.3f s excess",
                          Percent((x_c + x_o) / excess), excess);
  }
  return v;
}

bool HasRunDelay(const v1::ProcessTelemetry* p) {
  return p != nullptr && p->reading() == v1::HOST_READING_AVAILABLE &&
         p->has_run_delay_seconds_per_second();
}

// Rule 4's numbers: "process 4242: run delay 0.48 s/s vs the other ranks'
// median 0.01 s/s, 310 involuntary switches/s vs 10/s" ("" when the rank's
// run delay is not known), and whether it stands out (never when no other
// rank's process is known).
struct ProcessFinding {
  bool stands_out = false;
  std::string detail;
};

ProcessFinding JudgeProcess(const RankEvidence& rank, const std::vector<RankEvidence>& others) {
  if (!HasRunDelay(rank.process)) return {};
  std::vector<double> delays, switches;
  for (const RankEvidence& e : others) {
    if (!HasRunDelay(e.process)) continue;
    delays.push_back(e.process->run_delay_seconds_per_second());
    if (e.process->has_involuntary_switches_per_second())
      switches.push_back(e.process->involuntary_switches_per_second());
  }
  const std::optional<double> median = Median(delays);
  const double delay = rank.process->run_delay_seconds_per_second();
  ProcessFinding f;
  f.stands_out = median && delay >= kRunDelayFloor && delay >= kHostRatio * *median;
  f.detail = absl::StrFormat("process %u: run delay %.2f s/s", rank.process->pid(), delay);
  if (median) absl::StrAppendFormat(&f.detail, " vs the other ranks' median %.2f s/s", *median);
  if (rank.process->has_involuntary_switches_per_second()) {
    absl::StrAppendFormat(&f.detail, ", %.0f involuntary switches/s",
                          rank.process->involuntary_switches_per_second());
    if (std::optional<double> m = Median(switches)) absl::StrAppendFormat(&f.detail, " vs %.0f/s", *m);
  }
  return f;
}

// A node's share for one resource: the period's some_share, else avg10.
std::optional<double> PressureShare(const v1::HostPressure& p) {
  if (p.reading() != v1::HOST_READING_AVAILABLE) return std::nullopt;
  if (p.has_some_share()) return p.some_share();
  if (p.has_some_avg10()) return p.some_avg10();
  return std::nullopt;
}

// Rule 5: "node gpu-3: CPU pressure 35% vs 2% on the other nodes (median),
// CPU steal 12% vs 0%", or "" when nothing of it stands out against the
// ranks on other nodes (or none is known).
std::string NodeStandsOut(const RankEvidence& rank, const std::vector<RankEvidence>& others) {
  if (rank.host == nullptr) return "";
  struct Resource {
    const char* name;
    double floor;
    std::optional<double> (*get)(const v1::HostTelemetry&);
  };
  static constexpr Resource kResources[] = {
      {"CPU pressure", kNodePressureFloor,
       [](const v1::HostTelemetry& h) { return PressureShare(h.cpu_pressure()); }},
      {"memory pressure", kNodePressureFloor,
       [](const v1::HostTelemetry& h) { return PressureShare(h.memory_pressure()); }},
      {"IO pressure", kNodePressureFloor,
       [](const v1::HostTelemetry& h) { return PressureShare(h.io_pressure()); }},
      {"CPU steal", kStealFloor,
       [](const v1::HostTelemetry& h) {
         return h.steal_reading() == v1::HOST_READING_AVAILABLE && h.has_cpu_steal_share()
                    ? std::optional<double>(h.cpu_steal_share())
                    : std::nullopt;
       }},
  };
  std::string d;
  for (const Resource& r : kResources) {
    const std::optional<double> mine = r.get(*rank.host);
    if (!mine || *mine < r.floor) continue;
    std::vector<double> theirs;
    for (const RankEvidence& e : others) {
      if (e.host == nullptr || e.node == rank.node) continue;
      if (std::optional<double> v = r.get(*e.host)) theirs.push_back(*v);
    }
    const std::optional<double> median = Median(theirs);
    if (!median || *mine < kHostRatio * *median) continue;
    if (d.empty()) d = absl::StrCat("node ", std::string(rank.node), ": ");
    else d += ", ";
    absl::StrAppend(&d, r.name, " ", Percent(*mine), " vs ", Percent(*median),
                    " on the other nodes (median)");
  }
  return d;
}

}  // namespace

void RankPhases::Add(double input, double compute_seconds, double optimizer_seconds) {
  const float a = reports == 0 ? 1.0f : kPhaseEwmaAlpha;
  auto move = [a](float& level, double v) {
    level += a * (static_cast<float>(std::max(v, 0.0)) - level);
  };
  move(input_wait, input);
  move(compute, compute_seconds);
  move(optimizer, optimizer_seconds);
  ++reports;
}

std::string_view LikelyCauseName(LikelyCause c) {
  switch (c) {
    case LikelyCause::kUnspecified: return "unspecified";
    case LikelyCause::kNoneVisible: return "none_visible";
    case LikelyCause::kThermalThrottle: return "thermal_throttle";
    case LikelyCause::kPowerThrottle: return "power_throttle";
    case LikelyCause::kHwSlowdown: return "hw_slowdown";
    case LikelyCause::kClockDrop: return "clock_drop";
    case LikelyCause::kLowUtilization: return "low_utilization";
    case LikelyCause::kInputPipeline: return "input_pipeline";
    case LikelyCause::kCompute: return "compute";
    case LikelyCause::kHost: return "host";
    case LikelyCause::kData: return "data";
  }
  return "unspecified";
}

Attribution AttributeGpu(const v1::GpuTelemetry* rank,
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

Attribution AttributeLikelyCause(const RankEvidence& rank, const std::vector<RankEvidence>& others) {
  if (rank.gpu == nullptr && !HasPhases(rank) && rank.process == nullptr && rank.host == nullptr)
    return {};
  std::vector<const v1::GpuTelemetry*> gpus;
  for (const RankEvidence& e : others)
    if (e.gpu != nullptr) gpus.push_back(e.gpu);
  const PhaseVerdict phases = JudgePhases(rank, others);
  const ProcessFinding process = JudgeProcess(rank, others);
  const std::string node = NodeStandsOut(rank, others);
  const std::string host = Join(process.stands_out ? process.detail : "", node);

  if (phases.kind == PhaseVerdict::kInput) {
    if (!host.empty()) return {LikelyCause::kHost, Join(host, phases.detail)};
    return {LikelyCause::kInputPipeline, phases.detail};
  }
  Attribution gpu = AttributeGpu(rank.gpu, gpus);
  switch (gpu.cause) {
    case LikelyCause::kThermalThrottle:
    case LikelyCause::kPowerThrottle:
    case LikelyCause::kHwSlowdown:
    case LikelyCause::kClockDrop:
      return {gpu.cause, Join(gpu.detail, phases.detail)};
    default:
      break;
  }
  if (!host.empty()) return {LikelyCause::kHost, Join(host, phases.detail)};
  if (phases.kind == PhaseVerdict::kCompute) {
    if (gpu.cause == LikelyCause::kLowUtilization)
      return {gpu.cause, Join(gpu.detail, phases.detail)};
    return {LikelyCause::kCompute,
            Join(phases.detail, rank.gpu == nullptr
                                    ? "no GPU telemetry"
                                    : absl::StrCat("no GPU reason visible (", gpu.detail, ")"))};
  }
  if (gpu.cause == LikelyCause::kLowUtilization) return {gpu.cause, Join(gpu.detail, phases.detail)};
  // Something is known and nothing in it stands out: what was looked at.
  std::string d = Join(Join(rank.gpu != nullptr ? gpu.detail : "", phases.detail), process.detail);
  if (d.empty()) d = "nothing in its host telemetry stands out";
  return {LikelyCause::kNoneVisible, d};
}

Attribution AttributeData(double time_ratio, double threshold_ratio, double per_work_ratio,
                          double work_ratio) {
  return {LikelyCause::kData,
          absl::StrFormat("slow on time alone: %.3g× its group's median over its recent steps "
                          "(threshold %.3g×), but %.3g× per unit of work: its steps drew %.3g× "
                          "its group's work (the data's doing, not the rank's; not a straggler)",
                          time_ratio, threshold_ratio, per_work_ratio, work_ratio)};
}

}  // namespace straggler::daemon
