// The ewma policy (EWMA of each rank vs the lower median across ranks) and the
// static policy (DPAR's fixed threshold), against hand-computed values.
#include <catch2/catch.hpp>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace testutil;  // engine_test_util.h

PolicyConfig Ewma(PolicyConfig p = CounterOnlyPolicy()) {
  p.kind = PolicyKind::kEwma;
  return p;
}

TEST_CASE("ewma: hand-computed averages (first sample sets it)", "[engine][ewma]") {
  SECTION("alpha 0.5") {
    PolicyConfig p = Ewma();
    p.ewma_alpha = 0.5;
    Harness h(2, p);
    const std::vector<std::pair<double, double>> seq = {
        {1.0, 1.0},  // first sample
        {3.0, 2.0},  // 0.5*3 + 0.5*1
        {3.0, 2.5},  // 0.5*3 + 0.5*2
        {0.5, 1.5},  // 0.5*0.5 + 0.5*2.5
    };
    uint64_t it = 0;
    for (const auto& [t, expect] : seq) {
      h.Row(it++, 0, {t, 1.0});
      INFO("sample " << t);
      CHECK(h.engine().Worker(0).ewma_compute_seconds == Approx(expect));
      CHECK(h.engine().Worker(1).ewma_compute_seconds == Approx(1.0));
    }
    CHECK(h.engine().Worker(0).last_compute_seconds == Approx(0.5));
  }
  SECTION("default alpha 0.3") {
    Harness h(2, Ewma());
    h.Row(0, 0, {1.0, 1.0});
    h.Row(1, 0, {2.0, 1.0});
    CHECK(h.engine().Worker(0).ewma_compute_seconds == Approx(1.3));  // 0.3*2 + 0.7*1
    h.Row(2, 0, {2.0, 1.0});
    CHECK(h.engine().Worker(0).ewma_compute_seconds == Approx(1.51));  // 0.3*2 + 0.7*1.3
  }
}

TEST_CASE("ewma: a rank above ratio x median is flagged after limit rows, 1.3x never",
          "[engine][ewma]") {
  // ratio 1.5 (default), min_samples 5 (default), limit 5.
  Harness h(5, Ewma());
  const std::vector<double> row = {1.0, 1.0, 1.0, 2.0, 1.3};  // median 1.0
  h.Rows(0, 4, 0, row);
  // Fewer than ewma_min_samples samples: nothing judged.
  CHECK(h.Counter(3) == 0);
  h.Row(4, 0, row);  // 5th sample: judged
  CHECK(h.Counter(3) == 1);
  h.Rows(5, 3, 0, row);
  CHECK(h.Counter(3) == 4);
  CHECK(h.State(3) == WorkerState::kHealthy);
  h.Row(8, 0, row);
  CHECK(h.Counter(3) == 5);
  CHECK(h.State(3) == WorkerState::kStraggler);

  h.Rows(9, 40, 0, row);
  CHECK(h.Counter(4) == 0);
  CHECK(h.Transitions(4, WorkerState::kStraggler) == 0);
  for (uint32_t r = 0; r < 3; ++r) CHECK(h.Counter(r) == 0);
  CHECK(h.engine().View().straggler_ranks == 1);
}

TEST_CASE("ewma: ewma_min_samples is respected", "[engine][ewma]") {
  PolicyConfig p = Ewma();
  p.ewma_min_samples = 8;
  Harness h(5, p);
  const auto row = With(Uniform(5, 1.0), 2, 3.0);
  h.Rows(0, 7, 0, row);
  CHECK(h.Counter(2) == 0);
  h.Row(7, 0, row);
  CHECK(h.Counter(2) == 1);
}

TEST_CASE("ewma: catches a rank slow 4 of every 5 steps", "[engine][ewma]") {
  Harness h(5, Ewma());
  for (uint64_t i = 0; i < 50; ++i) {
    const bool slow = (i % 5) != 4;
    h.Row(i, 0, With(Uniform(5, 1.0), 4, slow ? 3.0 : 1.0));
  }
  // The average stays far above 1.5 x median even on the fast steps, so the
  // counter only rises: straggler after the 5 judged rows 4..8, and it stays.
  CHECK(h.State(4) == WorkerState::kStraggler);
  CHECK(h.Counter(4) == 5);
  CHECK(h.Flips(4) == 1);
}

TEST_CASE("ewma: the reference is the lower median", "[engine][ewma]") {
  // Half the ranks at 1.3x, ratio 1.2: lower median 1.0 -> the slow half is
  // slow (the upper median, 1.3, would flag nobody).
  PolicyConfig p = Ewma();
  p.ewma_ratio = 1.2;
  Harness h(4, p);
  h.Rows(0, 9, 0, {1.0, 1.0, 1.3, 1.3});
  CHECK(h.State(2) == WorkerState::kStraggler);
  CHECK(h.State(3) == WorkerState::kStraggler);
  CHECK(h.State(0) != WorkerState::kStraggler);
}

TEST_CASE("static: slow when compute > static_threshold_seconds, same counter",
          "[engine][static]") {
  PolicyConfig p = CounterOnlyPolicy();
  p.kind = PolicyKind::kStatic;
  p.static_threshold_seconds = 1.5;
  Harness h(4, p);
  h.Row(0, 0, Uniform(4, 1.0));
  CHECK(h.Counter(1) == 0);
  struct Step {
    double t;
    uint32_t counter;
  };
  const std::vector<Step> steps = {
      {2.0, 1}, {1.5, 1},  // equal: unchanged
      {1.0, 0}, {1.0, 0}, {1.6, 1}, {1.6, 2}, {1.6, 3}, {1.6, 4},
  };
  uint64_t it = 1;
  for (const auto& s : steps) {
    h.Row(it++, 0, With(Uniform(4, 1.0), 1, s.t));
    INFO("rank 1 at " << s.t);
    CHECK(h.Counter(1) == s.counter);
    CHECK(h.State(1) != WorkerState::kStraggler);
  }
  h.Row(it++, 0, With(Uniform(4, 1.0), 1, 1.6));
  CHECK(h.Counter(1) == 5);
  CHECK(h.State(1) == WorkerState::kStraggler);
  // A job-wide slowdown above the fixed threshold is slow for everyone:
  // static has no global-shift rule (it is the baseline the dynamic rule beats).
  h.Row(it++, 0, Uniform(4, 1.6));
  CHECK(h.Counter(0) == 1);
}

TEST_CASE("static: Validate rejects a zero threshold", "[engine][static][input]") {
  PolicyConfig p = DynamicPolicy();
  p.kind = PolicyKind::kStatic;
  p.static_threshold_seconds = 0.0;
  const absl::Status s = p.Validate();
  CHECK(absl::IsInvalidArgument(s));
  CHECK_THAT(std::string(s.message()), Catch::Contains("static_threshold_seconds"));
  p.static_threshold_seconds = 1.5;
  CHECK(p.Validate().ok());
}

}  // namespace
}  // namespace straggler::engine
