// Guards that apply to every policy: maximum excluded fraction, minimum active
// ranks, cool-down, the throughput guard, exclusion off, and operator
// overrides.
#include <catch2/catch.hpp>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace testutil;  // engine_test_util.h

std::vector<double> Slow(uint32_t world, std::vector<std::pair<uint32_t, double>> slow) {
  auto row = Uniform(world, 1.0);
  for (auto [r, t] : slow) row.at(r) = t;
  return row;
}

TEST_CASE("guards: max_excluded_fraction 0.25 of 8 ranks excludes at most 2, slowest first",
          "[engine][guards]") {
  Harness h(8);  // default max_excluded_fraction 0.25 -> floor(2)
  h.Rows(0, 10, 0, Uniform(8, 1.0));
  // The third straggler is mild (2.5 s), so excluding the two slowest pays
  // whether or not the throughput guard counts it among S.
  const auto row = Slow(8, {{1, 6.0}, {2, 5.0}, {3, 2.5}});
  h.Rows(10, 5, 0, row);
  CHECK(h.State(1) == WorkerState::kStraggler);
  CHECK(h.State(2) == WorkerState::kStraggler);
  CHECK(h.State(3) == WorkerState::kStraggler);
  CHECK(ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{1, 2});
  CHECK_FALSE(h.engine().Worker(3).excluded);
  CHECK(h.Count(EventKind::kGuardBlocked, 3) == 1);
  CHECK(h.engine().View().excluded_ranks == 2);
  CHECK(h.engine().View().straggler_ranks == 3);
  CHECK(h.engine().View().guard_blocks_total >= 1);
  const uint64_t version = h.engine().membership().version;

  // One event per rank until the outcome changes, not one per row.
  h.Rows(15, 10, 0, row);
  CHECK(h.Count(EventKind::kGuardBlocked, 3) == 1);
  CHECK(h.Count(EventKind::kGuardBlocked, 1) == 0);
  CHECK(h.Count(EventKind::kGuardBlocked, 2) == 0);
  CHECK(h.engine().membership().version == version);
  CHECK_FALSE(h.Excluded(3));
}

TEST_CASE("guards: excluding only some of several equal stragglers is withheld",
          "[engine][guards][throughput]") {
  // Three new candidates (4.0, 3.5, 3.0 s) but the fraction guard admits only
  // two: without ranks 1 and 2 the job still waits for rank 3, so
  // (6/T3) / (8/T1) - 1 < 0.05 and nothing is excluded; each gets one
  // guard event.
  Harness h(8);
  h.Rows(0, 10, 0, Uniform(8, 1.0));
  h.Rows(10, 5, 0, Slow(8, {{1, 4.0}, {2, 3.5}, {3, 3.0}}));
  CHECK(h.State(3) == WorkerState::kStraggler);
  CHECK(ExcludedRanks(h.engine().membership()).empty());
  CHECK(h.Count(EventKind::kGuardBlocked, 1) == 1);
  CHECK(h.Count(EventKind::kGuardBlocked, 2) == 1);
  CHECK(h.Count(EventKind::kGuardBlocked, 3) == 1);
}

TEST_CASE("guards: min_active_ranks bounds the excluded set", "[engine][guards]") {
  PolicyConfig p = DynamicPolicy();
  p.max_excluded_fraction = 0.5;
  p.min_active_ranks = 7;
  Harness h(8, p);
  h.Rows(0, 10, 0, Uniform(8, 1.0));
  h.Rows(10, 8, 0, Slow(8, {{1, 4.0}, {2, 3.0}}));
  CHECK(h.State(1) == WorkerState::kStraggler);
  CHECK(h.State(2) == WorkerState::kStraggler);
  CHECK(ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{1});
  CHECK(h.Count(EventKind::kGuardBlocked, 2) == 1);
  CHECK(h.engine().View().active_ranks == 7);
}

TEST_CASE("guards: a rank flips at most once per cooldown_iterations of its own iterations",
          "[engine][guards]") {
  for (uint32_t cooldown : {0u, 10u}) {
    PolicyConfig p = CounterOnlyPolicy();
    p.limit = 2;
    p.rejoin_mark = 1;
    p.cooldown_iterations = cooldown;
    Harness h(4, p);
    h.Rows(0, 20, 0, Uniform(4, 1.0));
    h.Rows(20, 2, 0, With(Uniform(4, 1.0), 1, 3.0));
    REQUIRE(h.State(1) == WorkerState::kStraggler);  // flipped at iteration 21
    h.Row(22, 0, Uniform(4, 1.0));                    // counter 1 = rejoin_mark: due
    INFO("cooldown_iterations=" << cooldown);
    CHECK(h.Counter(1) == 1);
    if (cooldown == 0) {
      CHECK(h.State(1) == WorkerState::kHealthy);
    } else {
      CHECK(h.State(1) == WorkerState::kStraggler);
      h.Rows(23, 7, 0, Uniform(4, 1.0));  // through iteration 29: still within 10
      CHECK(h.Counter(1) == 0);
      CHECK(h.State(1) == WorkerState::kStraggler);
      h.Rows(30, 3, 0, Uniform(4, 1.0));  // through 32: the blocked flip happens
      CHECK(h.State(1) == WorkerState::kHealthy);
      CHECK(h.Flips(1) == 2);
    }
  }
}

TEST_CASE("guards: two stragglers at once are excluded together by the throughput guard",
          "[engine][guards][throughput]") {
  // Excluding either alone would leave the other as the slowest active rank
  // (no gain); excluding both at once raises (6/1.0)/(8/T) well above 5 %.
  Harness h(8);
  h.Rows(0, 10, 0, Uniform(8, 1.0));
  h.Rows(10, 5, 0, Slow(8, {{1, 3.0}, {2, 3.0}}));
  CHECK(h.State(1) == WorkerState::kStraggler);
  CHECK(h.State(2) == WorkerState::kStraggler);
  CHECK(ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{1, 2});
  CHECK(h.engine().membership().version == 1);
  CHECK(h.Count(EventKind::kGuardBlocked) == 0);
}

TEST_CASE("guards: the throughput guard withholds an exclusion that gains too little",
          "[engine][guards][throughput]") {
  // static 1.02 s, rank 3 at 1.04 s: a straggler, but (3/1.0)/(4/1.04) - 1 < 0.
  PolicyConfig p = DynamicPolicy();
  p.kind = PolicyKind::kStatic;
  p.static_threshold_seconds = 1.02;
  p.cooldown_iterations = 0;
  Harness h(4, p);
  h.Row(0, 0, Uniform(4, 1.0));
  h.Rows(1, 5, 0, With(Uniform(4, 1.0), 3, 1.04));
  CHECK(h.State(3) == WorkerState::kStraggler);
  CHECK_FALSE(h.Excluded(3));
  CHECK(h.engine().membership().version == 0);
  CHECK(h.Count(EventKind::kGuardBlocked, 3) == 1);
  CHECK(h.engine().View().guard_blocks_total >= 1);
  h.Rows(6, 10, 0, With(Uniform(4, 1.0), 3, 1.04));
  CHECK(h.Count(EventKind::kGuardBlocked, 3) == 1);
  CHECK_FALSE(h.Excluded(3));
}

TEST_CASE("guards: half the job 1.3x slower (ewma, ratio 1.2) is classified, nobody excluded",
          "[engine][guards][throughput]") {
  PolicyConfig p = DynamicPolicy();
  p.kind = PolicyKind::kEwma;
  p.ewma_ratio = 1.2;
  p.cooldown_iterations = 0;
  Harness h(8, p);
  h.Rows(0, 30, 0, {1.0, 1.0, 1.0, 1.0, 1.3, 1.3, 1.3, 1.3});
  for (uint32_t r = 4; r < 8; ++r) {
    INFO("rank " << r);
    CHECK(h.State(r) == WorkerState::kStraggler);
    CHECK(h.Count(EventKind::kGuardBlocked, r) == 1);
  }
  CHECK(h.engine().membership().excluded.empty());
  CHECK(h.engine().membership().version == 0);
  CHECK(h.engine().View().straggler_ranks == 4);
  CHECK(h.engine().View().guard_blocks_total >= 4);
}

TEST_CASE("guards: exclusion_enabled=false classifies but never excludes", "[engine][guards]") {
  PolicyConfig p = DynamicPolicy();
  p.exclusion_enabled = false;
  Harness h(4, p);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  h.Rows(10, 10, 0, With(Uniform(4, 1.0), 3, 3.0));
  CHECK(h.State(3) == WorkerState::kStraggler);
  CHECK(h.engine().View().detections_total == 1);
  CHECK_FALSE(h.engine().Worker(3).excluded);
  CHECK(h.engine().membership().version == 0);
  CHECK(h.Count(EventKind::kMembership) == 0);

  SECTION("forced-out ranks are still excluded") {
    REQUIRE(h.engine().SetOverride(1, RankOverride::kForceExclude, "drain", h.now()).ok());
    CHECK(ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{1});
    CHECK(ReasonOf(h.engine().membership(), 1) == ExclusionReason::kForced);
  }
}

TEST_CASE("overrides: force exclude, force include, none, bad rank", "[engine][guards][override]") {
  Harness h(4);
  h.Rows(0, 10, 0, Uniform(4, 1.0));

  REQUIRE(h.engine().SetOverride(2, RankOverride::kForceExclude, "maintenance", h.now()).ok());
  CHECK(h.engine().membership().version == 1);
  CHECK(ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{2});
  CHECK(ReasonOf(h.engine().membership(), 2) == ExclusionReason::kForced);
  CHECK(h.engine().Worker(2).override == RankOverride::kForceExclude);
  CHECK(h.engine().Worker(2).excluded);
  CHECK(h.engine().Worker(2).exclusion_reason == ExclusionReason::kForced);

  // Forced-out ranks are always excluded, past the fraction guard (1 of 4).
  REQUIRE(h.engine().SetOverride(0, RankOverride::kForceExclude, "maintenance", h.now()).ok());
  CHECK(ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{0, 2});
  CHECK(h.engine().membership().version == 2);

  REQUIRE(h.engine().SetOverride(0, RankOverride::kNone, "", h.now()).ok());
  REQUIRE(h.engine().SetOverride(2, RankOverride::kNone, "", h.now()).ok());
  CHECK(h.engine().membership().excluded.empty());
  CHECK(h.engine().membership().version == 4);
  CHECK(h.engine().Worker(2).override == RankOverride::kNone);

  const absl::Status bad = h.engine().SetOverride(4, RankOverride::kForceExclude, "x", h.now());
  CHECK_FALSE(bad.ok());
  CHECK(h.engine().membership().version == 4);

  // A forced-in straggler is classified but never excluded.
  REQUIRE(h.engine().SetOverride(3, RankOverride::kForceInclude, "keep", h.now()).ok());
  h.Rows(10, 10, 0, With(Uniform(4, 1.0), 3, 3.0));
  CHECK(h.State(3) == WorkerState::kStraggler);
  CHECK_FALSE(h.Excluded(3));
  CHECK(h.engine().Worker(3).override == RankOverride::kForceInclude);
  CHECK(h.engine().membership().version == 4);

  // Lifting the override lets the guards decide: rank 3 is a straggler and
  // excluding it pays (ewma about 3 s vs 1 s).
  REQUIRE(h.engine().SetOverride(3, RankOverride::kNone, "", h.now()).ok());
  h.Row(20, 0, With(Uniform(4, 1.0), 3, 3.0));
  CHECK(h.Excluded(3));
  CHECK(ReasonOf(h.engine().membership(), 3) == ExclusionReason::kStraggler);
}

}  // namespace
}  // namespace straggler::engine
