// The likely-cause rule (daemon/src/registry/attribution.h) case by case: each
// threshold on both sides of its boundary.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "registry/attribution.h"
#include "straggler/v1/enum_names.h"
#include "wire/convert.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;

namespace {

v1::GpuTelemetry Gpu(double sm_ghz, uint64_t reasons = 0, double util = 0.97) {
  v1::GpuTelemetry t;
  t.set_sm_clock_hertz(sm_ghz * 1e9);
  t.set_max_sm_clock_hertz(1.98e9);
  t.set_temperature_celsius(65);
  t.set_power_watts(250);
  t.set_power_limit_watts(300);
  t.set_gpu_utilization(util);
  t.set_clock_event_reasons(reasons);
  return t;
}

std::vector<const v1::GpuTelemetry*> Ptrs(const std::vector<v1::GpuTelemetry>& v) {
  std::vector<const v1::GpuTelemetry*> out;
  for (const auto& t : v) out.push_back(&t);
  return out;
}

const std::vector<v1::GpuTelemetry> kHealthyOthers = {Gpu(1.77), Gpu(1.77), Gpu(1.76)};

}  // namespace

TEST_CASE("no telemetry for the rank: unspecified, no detail", "[attribution]") {
  const auto a = sd::AttributeGpu(nullptr, Ptrs(kHealthyOthers));
  CHECK(a.cause == sd::LikelyCause::kUnspecified);
  CHECK(a.detail.empty());
}

TEST_CASE("a thermal reason wins, with the temperature and the clock against the median",
          "[attribution]") {
  for (uint64_t bit : {0x20ull, 0x40ull}) {
    v1::GpuTelemetry t = Gpu(1.10, bit | 0x4);  // thermal and power: thermal first
    t.set_temperature_celsius(91);
    const auto a = sd::AttributeGpu(&t, Ptrs(kHealthyOthers));
    CHECK(a.cause == sd::LikelyCause::kThermalThrottle);
    CHECK_THAT(a.detail, Catch::Contains("91 C") &&
                             Catch::Contains("SM clock 1.10 GHz, 62% of the other ranks' median 1.77 GHz"));
  }
}

TEST_CASE("a power reason counts only when most other ranks do not share it", "[attribution]") {
  v1::GpuTelemetry t = Gpu(1.60, 0x4);
  CHECK(sd::AttributeGpu(&t, Ptrs(kHealthyOthers)).cause == sd::LikelyCause::kPowerThrottle);
  // One of three others capped too (at most half): still this rank's cause.
  std::vector<v1::GpuTelemetry> one_capped = {Gpu(1.77, 0x4), Gpu(1.77), Gpu(1.77)};
  CHECK(sd::AttributeGpu(&t, Ptrs(one_capped)).cause == sd::LikelyCause::kPowerThrottle);
  // Two of three capped: the job's normal state; the clock decides (1.60 of
  // 1.77 = 90% >= 85%): nothing visible.
  std::vector<v1::GpuTelemetry> most_capped = {Gpu(1.77, 0x4), Gpu(1.77, 0x80), Gpu(1.77)};
  CHECK(sd::AttributeGpu(&t, Ptrs(most_capped)).cause == sd::LikelyCause::kNoneVisible);
  v1::GpuTelemetry brake = Gpu(1.0, 0x80);
  CHECK(sd::AttributeGpu(&brake, Ptrs(kHealthyOthers)).cause ==
        sd::LikelyCause::kPowerThrottle);
}

TEST_CASE("HW slowdown alone is its own cause", "[attribution]") {
  v1::GpuTelemetry t = Gpu(0.9, 0x8);
  const auto a = sd::AttributeGpu(&t, Ptrs(kHealthyOthers));
  CHECK(a.cause == sd::LikelyCause::kHwSlowdown);
  CHECK_THAT(a.detail, Catch::Contains("0x8"));
}

TEST_CASE("clock drop: below 85% of the other ranks' median SM clock", "[attribution]") {
  const double median = 1.77;
  v1::GpuTelemetry below = Gpu(median * 0.84);
  v1::GpuTelemetry at = Gpu(median * 0.86);
  CHECK(sd::AttributeGpu(&below, Ptrs(kHealthyOthers)).cause == sd::LikelyCause::kClockDrop);
  CHECK(sd::AttributeGpu(&at, Ptrs(kHealthyOthers)).cause == sd::LikelyCause::kNoneVisible);
  // Idle-clock bits (GPU idle 0x1) are not a throttle: the clock decides.
  v1::GpuTelemetry idle_bit = Gpu(1.0, 0x1);
  CHECK(sd::AttributeGpu(&idle_bit, Ptrs(kHealthyOthers)).cause ==
        sd::LikelyCause::kClockDrop);
}

TEST_CASE("clock drop without other ranks: against the GPU's own max", "[attribution]") {
  v1::GpuTelemetry low = Gpu(1.98 * 0.80);
  v1::GpuTelemetry high = Gpu(1.98 * 0.90);
  const auto a = sd::AttributeGpu(&low, {});
  CHECK(a.cause == sd::LikelyCause::kClockDrop);
  CHECK_THAT(a.detail, Catch::Contains("of its max 1.98 GHz"));
  CHECK(sd::AttributeGpu(&high, {}).cause == sd::LikelyCause::kNoneVisible);
}

TEST_CASE("low utilisation: busy under 60% of the busy others' median", "[attribution]") {
  v1::GpuTelemetry starved = Gpu(1.77, 0, 0.50);  // 0.50 < 0.6 x 0.97
  v1::GpuTelemetry fine = Gpu(1.77, 0, 0.60);     // 0.60 >= 0.582
  const auto a = sd::AttributeGpu(&starved, Ptrs(kHealthyOthers));
  CHECK(a.cause == sd::LikelyCause::kLowUtilization);
  CHECK_THAT(a.detail, Catch::Contains("GPU busy 50%") && Catch::Contains("median 97%"));
  CHECK(sd::AttributeGpu(&fine, Ptrs(kHealthyOthers)).cause == sd::LikelyCause::kNoneVisible);
  // Others mostly idle themselves (median < 50%): not a signal.
  std::vector<v1::GpuTelemetry> idle = {Gpu(1.77, 0, 0.3), Gpu(1.77, 0, 0.4)};
  v1::GpuTelemetry lower = Gpu(1.77, 0, 0.1);
  CHECK(sd::AttributeGpu(&lower, Ptrs(idle)).cause == sd::LikelyCause::kNoneVisible);
}

TEST_CASE("none visible says what was looked at, missing fields are not zeros", "[attribution]") {
  v1::GpuTelemetry t = Gpu(1.75);
  auto a = sd::AttributeGpu(&t, Ptrs(kHealthyOthers));
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);
  CHECK_THAT(a.detail, Catch::Contains("no throttle reason") && Catch::Contains("65 C") &&
                           Catch::Contains("SM clock 1.75 GHz"));
  // A GPU that measures nothing beyond its identity: nothing to blame.
  v1::GpuTelemetry bare;
  a = sd::AttributeGpu(&bare, Ptrs(kHealthyOthers));
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);
  CHECK(a.detail == "no throttle reason");
  CHECK(sd::LikelyCauseName(sd::LikelyCause::kThermalThrottle) == "thermal_throttle");
}

// The whole rule (AttributeLikelyCause): phases, host and GPU evidence of a
// rank against three others, each precedence and threshold on both sides.
namespace {

sd::RankPhases Phases(float input, float compute, float optimizer) {
  return {input, compute, optimizer, 10};
}

v1::ProcessTelemetry Process(uint32_t pid, double run_delay, double switches) {
  v1::ProcessTelemetry p;
  p.set_pid(pid);
  p.set_reading(v1::HOST_READING_AVAILABLE);
  p.set_period_seconds(1);
  p.set_run_delay_seconds_per_second(run_delay);
  p.set_involuntary_switches_per_second(switches);
  return p;
}

v1::HostTelemetry Node(double cpu_pressure, std::optional<double> steal = std::nullopt) {
  v1::HostTelemetry h;
  h.set_period_seconds(1);
  h.mutable_cpu_pressure()->set_reading(v1::HOST_READING_AVAILABLE);
  h.mutable_cpu_pressure()->set_some_share(cpu_pressure);
  h.mutable_memory_pressure()->set_reading(v1::HOST_READING_AVAILABLE);
  h.mutable_memory_pressure()->set_some_share(0);
  h.mutable_io_pressure()->set_reading(v1::HOST_READING_AVAILABLE);
  h.mutable_io_pressure()->set_some_share(0);
  if (steal) {
    h.set_steal_reading(v1::HOST_READING_AVAILABLE);
    h.set_cpu_steal_share(*steal);
  } else {
    h.set_steal_reading(v1::HOST_READING_NOT_AVAILABLE);
  }
  return h;
}

// Three healthy ranks: 10 ms input wait, 100 ms compute, 20 ms optimizer,
// busy GPUs, processes barely waiting for a CPU, calm nodes.
struct Job {
  sd::RankPhases phases = Phases(0.010f, 0.100f, 0.020f);
  std::vector<v1::GpuTelemetry> gpus = kHealthyOthers;
  std::vector<v1::ProcessTelemetry> processes = {Process(1, 0.01, 10), Process(2, 0.01, 12),
                                                 Process(3, 0.02, 8)};
  v1::HostTelemetry calm = Node(0.02, 0.0);
  std::vector<std::string> nodes = {"node-b", "node-c", "node-d"};

  std::vector<sd::RankEvidence> Others(bool with_phases = true, bool with_host = true) const {
    std::vector<sd::RankEvidence> out;
    for (size_t i = 0; i < 3; ++i) {
      out.push_back({&gpus[i], with_phases ? &phases : nullptr,
                     with_host ? &processes[i] : nullptr, with_host ? &calm : nullptr, nodes[i]});
    }
    return out;
  }
};

}  // namespace

TEST_CASE("cause: nothing known of the rank is unspecified", "[attribution]") {
  const Job job;
  const auto a = sd::AttributeLikelyCause({.node = "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kUnspecified);
  CHECK(a.detail.empty());
}

TEST_CASE("cause: input pipeline when input wait holds the excess and compute did not grow",
          "[attribution]") {
  const Job job;
  const sd::RankPhases slow_input = Phases(0.400f, 0.105f, 0.020f);
  const v1::GpuTelemetry starved = Gpu(1.77, 0, 0.30);  // low utilisation on its own
  const v1::ProcessTelemetry calm = Process(4, 0.01, 11);
  auto a = sd::AttributeLikelyCause({&starved, &slow_input, &calm, &job.calm, "node-a"},
                                    job.Others());
  CHECK(a.cause == sd::LikelyCause::kInputPipeline);  // wins over low utilisation
  CHECK(a.detail ==
        "input wait 0.400 s vs the other ranks' median 0.010 s, compute 0.105 s vs 0.100 s, "
        "optimizer 0.020 s vs 0.020 s: input wait holds 99% of its 0.395 s excess");

  // Compute grew too (>= 1.15 x the others'): not the input pipeline; the
  // GPU's low utilisation is what is left.
  const sd::RankPhases both = Phases(0.400f, 0.120f, 0.020f);
  a = sd::AttributeLikelyCause({&starved, &both, &calm, &job.calm, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kLowUtilization);
  CHECK_THAT(a.detail, Catch::Contains("GPU busy 30%") && Catch::Contains("input wait 0.400 s"));

  // Input wait below 60% of the excess (here half, the optimizer the rest).
  const sd::RankPhases split = Phases(0.050f, 0.100f, 0.060f);
  a = sd::AttributeLikelyCause({nullptr, &split, nullptr, nullptr, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);
  CHECK_THAT(a.detail, Catch::StartsWith("input wait 0.050 s vs the other ranks' median 0.010 s"));

  // An excess under 10% of the others' own time (0.013 s here) shows nothing.
  const sd::RankPhases noise = Phases(0.020f, 0.100f, 0.020f);
  a = sd::AttributeLikelyCause({nullptr, &noise, nullptr, nullptr, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);

  // No other rank reports phases: nothing to compare with, said so.
  a = sd::AttributeLikelyCause({nullptr, &slow_input, nullptr, nullptr, "node-a"},
                               job.Others(/*with_phases=*/false, /*with_host=*/false));
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);
  CHECK(a.detail ==
        "input wait 0.400 s, compute 0.105 s, optimizer 0.020 s (no other rank reports phases)");
  // With its GPU sample: what it says, then the phases.
  a = sd::AttributeLikelyCause({&job.gpus[0], &slow_input, nullptr, nullptr, "node-a"},
                               job.Others(/*with_phases=*/false, /*with_host=*/false));
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);
  CHECK(a.detail ==
        "no throttle reason, 65 C, GPU busy 97%; SM clock 1.77 GHz, 100% of the other ranks' "
        "median 1.77 GHz; input wait 0.400 s, compute 0.105 s, optimizer 0.020 s (no other rank "
        "reports phases)");
}

TEST_CASE("cause: compute when compute holds the excess, with or without a GPU reason",
          "[attribution]") {
  const Job job;
  const sd::RankPhases slow_compute = Phases(0.010f, 0.300f, 0.020f);
  const v1::GpuTelemetry healthy = Gpu(1.77);
  auto a = sd::AttributeLikelyCause({&healthy, &slow_compute, nullptr, nullptr, "node-a"},
                                    job.Others());
  CHECK(a.cause == sd::LikelyCause::kCompute);
  CHECK_THAT(a.detail, Catch::StartsWith("input wait 0.010 s vs the other ranks' median 0.010 s, "
                                         "compute 0.300 s vs 0.100 s") &&
                           Catch::Contains("compute and optimizer hold 100% of its 0.200 s excess") &&
                           Catch::Contains("no GPU reason visible (no throttle reason"));
  a = sd::AttributeLikelyCause({nullptr, &slow_compute, nullptr, nullptr, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kCompute);
  CHECK_THAT(a.detail, Catch::EndsWith("; no GPU telemetry"));

  // A GPU reason names the compute's cause, the phases come with it.
  const v1::GpuTelemetry hot = Gpu(1.20, 0x20);
  a = sd::AttributeLikelyCause({&hot, &slow_compute, nullptr, nullptr, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kThermalThrottle);
  CHECK_THAT(a.detail, Catch::StartsWith("thermal slowdown (reasons 0x20)") &&
                           Catch::Contains("compute 0.300 s vs 0.100 s"));
  // An idle GPU while compute grew: the time goes outside it.
  const v1::GpuTelemetry idle = Gpu(1.77, 0, 0.40);
  a = sd::AttributeLikelyCause({&idle, &slow_compute, nullptr, nullptr, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kLowUtilization);
}

TEST_CASE("cause: host when the rank's process waits for a CPU", "[attribution]") {
  const Job job;
  const v1::GpuTelemetry starved = Gpu(1.77, 0, 0.30);
  const v1::ProcessTelemetry hogged = Process(4242, 0.48, 310);
  auto a = sd::AttributeLikelyCause({&starved, nullptr, &hogged, &job.calm, "node-a"},
                                    job.Others());
  CHECK(a.cause == sd::LikelyCause::kHost);  // wins over low utilisation
  CHECK(a.detail ==
        "process 4242: run delay 0.48 s/s vs the other ranks' median 0.01 s/s, 310 involuntary "
        "switches/s vs 10/s");

  // With an input pipeline that grew: the CPU it waits for is the cause.
  const sd::RankPhases slow_input = Phases(0.400f, 0.100f, 0.020f);
  a = sd::AttributeLikelyCause({&starved, &slow_input, &hogged, &job.calm, "node-a"},
                               job.Others());
  CHECK(a.cause == sd::LikelyCause::kHost);
  CHECK_THAT(a.detail, Catch::StartsWith("process 4242: run delay 0.48 s/s") &&
                           Catch::Contains("input wait holds"));

  // A GPU reason still wins: it slows the compute directly.
  const v1::GpuTelemetry hot = Gpu(1.20, 0x40);
  a = sd::AttributeLikelyCause({&hot, nullptr, &hogged, &job.calm, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kThermalThrottle);

  // Under the 0.05 s/s floor, or under 2 x the others' median: not host.
  const v1::ProcessTelemetry light = Process(4242, 0.04, 50);
  a = sd::AttributeLikelyCause({nullptr, nullptr, &light, nullptr, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);  // with the numbers looked at
  CHECK(a.detail ==
        "process 4242: run delay 0.04 s/s vs the other ranks' median 0.01 s/s, 50 involuntary "
        "switches/s vs 10/s");
  std::vector<v1::ProcessTelemetry> busy = {Process(1, 0.06, 10), Process(2, 0.06, 10),
                                            Process(3, 0.06, 10)};
  std::vector<sd::RankEvidence> others = job.Others();
  for (size_t i = 0; i < 3; ++i) others[i].process = &busy[i];
  const v1::ProcessTelemetry a_bit_more = Process(4242, 0.10, 50);  // < 0.12
  CHECK(sd::AttributeLikelyCause({nullptr, nullptr, &a_bit_more, nullptr, "node-a"}, others).cause ==
        sd::LikelyCause::kNoneVisible);
  // A process the agent could not read is no evidence.
  v1::ProcessTelemetry unread = hogged;
  unread.set_reading(v1::HOST_READING_ERROR);
  CHECK(sd::AttributeLikelyCause({nullptr, nullptr, &unread, nullptr, "node-a"}, job.Others())
            .cause == sd::LikelyCause::kNoneVisible);
}

TEST_CASE("cause: host when the rank's node is under pressure the other nodes are not",
          "[attribution]") {
  Job job;
  const v1::HostTelemetry pressed = Node(0.35, 0.12);
  auto a = sd::AttributeLikelyCause({nullptr, nullptr, nullptr, &pressed, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kHost);
  CHECK(a.detail ==
        "node node-a: CPU pressure 35% vs 2% on the other nodes (median), CPU steal 12% vs 0% "
        "on the other nodes (median)");

  // Every rank on that node: the node's numbers tell no rank apart.
  std::vector<sd::RankEvidence> same_node = job.Others();
  for (sd::RankEvidence& e : same_node) {
    e.host = &pressed;
    e.node = "node-a";
  }
  a = sd::AttributeLikelyCause({nullptr, nullptr, nullptr, &pressed, "node-a"}, same_node);
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);
  CHECK(a.detail == "nothing in its host telemetry stands out");

  // A kernel without PSI: steal alone; under its 5% floor nothing.
  v1::HostTelemetry no_psi;
  no_psi.mutable_cpu_pressure()->set_reading(v1::HOST_READING_NOT_AVAILABLE);
  no_psi.set_steal_reading(v1::HOST_READING_AVAILABLE);
  no_psi.set_cpu_steal_share(0.04);
  a = sd::AttributeLikelyCause({nullptr, nullptr, nullptr, &no_psi, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);
  no_psi.set_cpu_steal_share(0.08);
  a = sd::AttributeLikelyCause({nullptr, nullptr, nullptr, &no_psi, "node-a"}, job.Others());
  CHECK(a.cause == sd::LikelyCause::kHost);
  CHECK(a.detail == "node node-a: CPU steal 8% vs 0% on the other nodes (median)");
}

TEST_CASE("cause: phase levels follow a rank's reports", "[attribution]") {
  sd::RankPhases p;
  p.Add(-1, 0.1, -1);  // the first report sets the levels; a phase not reported counts as 0
  CHECK(p.input_wait == 0.0f);
  CHECK(p.compute == Approx(0.1f));
  CHECK(p.reports == 1);
  for (int i = 0; i < 10; ++i) p.Add(0.5, 0.1, 0.02);
  // 1 - 0.7^10 of the way to 0.5 after ten reports.
  CHECK(p.input_wait == Approx(0.5 * (1 - std::pow(0.7, 10))).epsilon(1e-4));
  CHECK(p.optimizer == Approx(0.02 * (1 - std::pow(0.7, 10))).epsilon(1e-4));
  CHECK(sizeof(sd::RankPhases) == 16);
}

TEST_CASE("cause names are distinct and the wire's order", "[attribution]") {
  std::set<std::string_view> names;
  for (size_t i = 0; i < sd::kLikelyCauses; ++i)
    names.insert(sd::LikelyCauseName(static_cast<sd::LikelyCause>(i)));
  CHECK(names.size() == sd::kLikelyCauses);
  CHECK(sd::LikelyCauseName(sd::LikelyCause::kInputPipeline) == "input_pipeline");
  CHECK(sd::LikelyCauseName(sd::LikelyCause::kData) == "data");
  CHECK(static_cast<int>(sd::LikelyCause::kHost) == v1::LIKELY_CAUSE_HOST);
  CHECK(static_cast<int>(sd::LikelyCause::kData) == v1::LIKELY_CAUSE_DATA);
  // Every cause, not two: the v1 value of the same number and short name
  // (the database stores the number, metrics and logs the name), and no v1
  // value the daemon lacks.
  const auto* wire = v1::LikelyCause_descriptor();
  CHECK(static_cast<size_t>(wire->value_count()) == sd::kLikelyCauses);
  for (size_t i = 1; i < sd::kLikelyCauses; ++i) {
    const auto c = static_cast<sd::LikelyCause>(i);
    INFO("cause " << i << " " << sd::LikelyCauseName(c));
    CHECK(sd::ToProto(c) == static_cast<int>(i));
    CHECK(v1::EnumShortName(wire, static_cast<int>(i)) == sd::LikelyCauseName(c));
  }
  CHECK(sd::ToProto(sd::LikelyCause::kUnspecified) == v1::LIKELY_CAUSE_UNSPECIFIED);
}
