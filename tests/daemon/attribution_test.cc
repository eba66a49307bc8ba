// The likely-cause rule (daemon/src/registry/attribution.h) case by case: each
// threshold on both sides of its boundary.
#include <catch2/catch.hpp>

#include "registry/attribution.h"

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
  const auto a = sd::AttributeLikelyCause(nullptr, Ptrs(kHealthyOthers));
  CHECK(a.cause == sd::LikelyCause::kUnspecified);
  CHECK(a.detail.empty());
}

TEST_CASE("a thermal reason wins, with the temperature and the clock against the median",
          "[attribution]") {
  for (uint64_t bit : {0x20ull, 0x40ull}) {
    v1::GpuTelemetry t = Gpu(1.10, bit | 0x4);  // thermal and power: thermal first
    t.set_temperature_celsius(91);
    const auto a = sd::AttributeLikelyCause(&t, Ptrs(kHealthyOthers));
    CHECK(a.cause == sd::LikelyCause::kThermalThrottle);
    CHECK_THAT(a.detail, Catch::Contains("91 C") &&
                             Catch::Contains("SM clock 1.10 GHz, 62% of the other ranks' median 1.77 GHz"));
  }
}

TEST_CASE("a power reason counts only when most other ranks do not share it", "[attribution]") {
  v1::GpuTelemetry t = Gpu(1.60, 0x4);
  CHECK(sd::AttributeLikelyCause(&t, Ptrs(kHealthyOthers)).cause == sd::LikelyCause::kPowerThrottle);
  // One of three others capped too (at most half): still this rank's cause.
  std::vector<v1::GpuTelemetry> one_capped = {Gpu(1.77, 0x4), Gpu(1.77), Gpu(1.77)};
  CHECK(sd::AttributeLikelyCause(&t, Ptrs(one_capped)).cause == sd::LikelyCause::kPowerThrottle);
  // Two of three capped: the job's normal state; the clock decides (1.60 of
  // 1.77 = 90% >= 85%): nothing visible.
  std::vector<v1::GpuTelemetry> most_capped = {Gpu(1.77, 0x4), Gpu(1.77, 0x80), Gpu(1.77)};
  CHECK(sd::AttributeLikelyCause(&t, Ptrs(most_capped)).cause == sd::LikelyCause::kNoneVisible);
  v1::GpuTelemetry brake = Gpu(1.0, 0x80);
  CHECK(sd::AttributeLikelyCause(&brake, Ptrs(kHealthyOthers)).cause ==
        sd::LikelyCause::kPowerThrottle);
}

TEST_CASE("HW slowdown alone is its own cause", "[attribution]") {
  v1::GpuTelemetry t = Gpu(0.9, 0x8);
  const auto a = sd::AttributeLikelyCause(&t, Ptrs(kHealthyOthers));
  CHECK(a.cause == sd::LikelyCause::kHwSlowdown);
  CHECK_THAT(a.detail, Catch::Contains("0x8"));
}

TEST_CASE("clock drop: below 85% of the other ranks' median SM clock", "[attribution]") {
  const double median = 1.77;
  v1::GpuTelemetry below = Gpu(median * 0.84);
  v1::GpuTelemetry at = Gpu(median * 0.86);
  CHECK(sd::AttributeLikelyCause(&below, Ptrs(kHealthyOthers)).cause == sd::LikelyCause::kClockDrop);
  CHECK(sd::AttributeLikelyCause(&at, Ptrs(kHealthyOthers)).cause == sd::LikelyCause::kNoneVisible);
  // Idle-clock bits (GPU idle 0x1) are not a throttle: the clock decides.
  v1::GpuTelemetry idle_bit = Gpu(1.0, 0x1);
  CHECK(sd::AttributeLikelyCause(&idle_bit, Ptrs(kHealthyOthers)).cause ==
        sd::LikelyCause::kClockDrop);
}

TEST_CASE("clock drop without other ranks: against the GPU's own max", "[attribution]") {
  v1::GpuTelemetry low = Gpu(1.98 * 0.80);
  v1::GpuTelemetry high = Gpu(1.98 * 0.90);
  const auto a = sd::AttributeLikelyCause(&low, {});
  CHECK(a.cause == sd::LikelyCause::kClockDrop);
  CHECK_THAT(a.detail, Catch::Contains("of its max 1.98 GHz"));
  CHECK(sd::AttributeLikelyCause(&high, {}).cause == sd::LikelyCause::kNoneVisible);
}

TEST_CASE("low utilisation: busy under 60% of the busy others' median", "[attribution]") {
  v1::GpuTelemetry starved = Gpu(1.77, 0, 0.50);  // 0.50 < 0.6 x 0.97
  v1::GpuTelemetry fine = Gpu(1.77, 0, 0.60);     // 0.60 >= 0.582
  const auto a = sd::AttributeLikelyCause(&starved, Ptrs(kHealthyOthers));
  CHECK(a.cause == sd::LikelyCause::kLowUtilization);
  CHECK_THAT(a.detail, Catch::Contains("GPU busy 50%") && Catch::Contains("median 97%"));
  CHECK(sd::AttributeLikelyCause(&fine, Ptrs(kHealthyOthers)).cause == sd::LikelyCause::kNoneVisible);
  // Others mostly idle themselves (median < 50%): not a signal.
  std::vector<v1::GpuTelemetry> idle = {Gpu(1.77, 0, 0.3), Gpu(1.77, 0, 0.4)};
  v1::GpuTelemetry lower = Gpu(1.77, 0, 0.1);
  CHECK(sd::AttributeLikelyCause(&lower, Ptrs(idle)).cause == sd::LikelyCause::kNoneVisible);
}

TEST_CASE("none visible says what was looked at, missing fields are not zeros", "[attribution]") {
  v1::GpuTelemetry t = Gpu(1.75);
  auto a = sd::AttributeLikelyCause(&t, Ptrs(kHealthyOthers));
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);
  CHECK_THAT(a.detail, Catch::Contains("no throttle reason") && Catch::Contains("65 C") &&
                           Catch::Contains("SM clock 1.75 GHz"));
  // A GPU that measures nothing beyond its identity: nothing to blame.
  v1::GpuTelemetry bare;
  a = sd::AttributeLikelyCause(&bare, Ptrs(kHealthyOthers));
  CHECK(a.cause == sd::LikelyCause::kNoneVisible);
  CHECK(a.detail == "no throttle reason");
  CHECK(sd::LikelyCauseName(sd::LikelyCause::kThermalThrottle) == "thermal_throttle");
}
