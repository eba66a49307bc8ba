// The exclusion planner on its own (engine/src/exclusion_planner.h): a pure
// function of a snapshot of rank states and the policy, so each guard is
// pinned here without driving an engine through rows.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "exclusion_planner.h"
#include "planner_fixtures.h"
#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"

namespace straggler::engine::internal {
namespace {

using namespace testing;  // NOLINT: the shared snapshots and Input()

TEST_CASE("planner: capacity admits at most floor(max_excluded_fraction x world), slowest first",
          "[engine][planner]") {
  PolicyConfig p;  // max_excluded_fraction 0.25: 2 of 8
  std::vector<RankSnapshot> ranks(8, Healthy());
  ranks[1] = Straggler(3.0);
  ranks[4] = Straggler(5.0);
  ranks[6] = Straggler(4.0);
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{4, 6});
  CHECK(plan.excluded[0].reason == ExclusionReason::kStraggler);
  CHECK(plan.excluded[0].since_iteration == 100);
  CHECK(plan.excluded[0].detail == "ewma 5s = 5.00x baseline 1s; counter 5/5");
  CHECK(plan.blocked == std::vector<uint32_t>{1});
  CHECK(plan.blocked_why == "max_excluded_fraction allows 2");
}

TEST_CASE("planner: min_active_ranks keeps enough ranks in", "[engine][planner]") {
  PolicyConfig p;
  p.max_excluded_fraction = 0.5;
  p.min_active_ranks = 3;
  std::vector<RankSnapshot> ranks(4, Healthy());
  ranks[0] = Straggler(4.0);
  ranks[2] = Straggler(1.5);  // without rank 0 alone the job is 2x faster
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{0});
  CHECK(plan.blocked == std::vector<uint32_t>{2});
  CHECK(plan.blocked_why == "min_active_ranks is 3");
}

TEST_CASE("planner: the throughput guard withholds an exclusion that would not speed the job up",
          "[engine][planner]") {
  PolicyConfig p;
  std::vector<RankSnapshot> ranks(8, Healthy());
  // Three equally slow stragglers, room for two: without two of them the
  // third still sets the pace, so nothing is gained.
  ranks[2] = ranks[3] = ranks[5] = Straggler(3.0);
  ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  CHECK(plan.excluded.empty());
  CHECK(plan.blocked == std::vector<uint32_t>{2, 3, 5});
  CHECK(plan.blocked_why == "predicted throughput gain below 0.05");

  SECTION("two stragglers that fit go together") {
    ranks[5] = Healthy();
    plan = PlanExclusion(p, Input(ranks));
    CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{2, 3});
    CHECK(plan.blocked.empty());
    CHECK(plan.blocked_why.empty());
  }
}

TEST_CASE("planner: a predicted gain below min_throughput_gain is withheld", "[engine][planner]") {
  PolicyConfig p;  // min_throughput_gain 0.05
  std::vector<RankSnapshot> ranks(20, Healthy(1.0));
  // 19 ranks at 1.0 instead of 20 at 1.1: 19*1.1/20 - 1 = 4.5 % faster.
  ranks[7] = Straggler(1.1);
  ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  CHECK(plan.excluded.empty());
  CHECK(plan.blocked == std::vector<uint32_t>{7});
  CHECK(plan.blocked_why == "predicted throughput gain below 0.05");
  // At 1.2: 14 % faster.
  ranks[7] = Straggler(1.2);
  plan = PlanExclusion(p, Input(ranks));
  CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{7});
}

TEST_CASE("planner: overrides win over every guard, and exclusion disabled leaves only them",
          "[engine][planner]") {
  PolicyConfig p;
  p.exclusion_enabled = false;
  std::vector<RankSnapshot> ranks(4, Healthy());
  ranks[0].override = RankOverride::kForceExclude;
  ranks[1] = Straggler(9.0);
  ranks[1].override = RankOverride::kForceInclude;
  ranks[2] = Straggler(9.0);
  ranks[3].override = RankOverride::kForceExclude;
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  // Two forced out of 4 with max_excluded_fraction 0.25: forced ignores capacity.
  CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{0, 3});
  CHECK(plan.excluded[0].reason == ExclusionReason::kForced);
  CHECK(plan.excluded[0].detail == "forced out by an operator");
  CHECK(plan.blocked.empty());
}

TEST_CASE("planner: an excluded candidate keeps its entry, a cleared force is released",
          "[engine][planner]") {
  PolicyConfig p;
  std::vector<RankSnapshot> ranks(8, Healthy());
  ranks[1] = Straggler(3.0);
  ranks[5] = Healthy();  // forced out earlier, override cleared since
  ranks[7].state = WorkerState::kFinished;
  const std::vector<ExcludedRank> current = {
      {1, ExclusionReason::kStraggler, "old detail", 40},
      {5, ExclusionReason::kForced, "forced out by an operator", 10},
      {7, ExclusionReason::kStraggler, "left before it finished", 50}};
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks, current));
  REQUIRE(Ranks(plan.excluded) == std::vector<uint32_t>{1, 7});
  CHECK(plan.excluded[0].detail == "old detail");
  CHECK(plan.excluded[0].since_iteration == 40);
  // A finished rank keeps its place: an ending job changes no membership.
  CHECK(plan.excluded[1].since_iteration == 50);
}

TEST_CASE("planner: unresponsive ranks are admitted before stragglers", "[engine][planner]") {
  PolicyConfig p;
  std::vector<RankSnapshot> ranks(8, Healthy());
  ranks[2] = Straggler(6.0);
  ranks[3] = Unresponsive();
  ranks[6] = Unresponsive();
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  REQUIRE(Ranks(plan.excluded) == std::vector<uint32_t>{3, 6});
  CHECK(plan.excluded[0].reason == ExclusionReason::kUnresponsive);
  CHECK(plan.excluded[0].detail == "no report for 30s");
  CHECK(plan.blocked == std::vector<uint32_t>{2});
  CHECK(plan.blocked_why == "max_excluded_fraction allows 2");
}

TEST_CASE("planner: probation re-includes, and a failed probation is excluded as probation_end",
          "[engine][planner]") {
  PolicyConfig p;
  std::vector<RankSnapshot> ranks(8, Healthy());
  ranks[4] = Straggler(4.0);
  ranks[4].on_probation = true;
  const std::vector<ExcludedRank> current = {{4, ExclusionReason::kStraggler, "", 10}};
  CHECK(PlanExclusion(p, Input(ranks, current)).excluded.empty());

  ranks[4].on_probation = false;
  ranks[4].probation_failed = true;
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  REQUIRE(Ranks(plan.excluded) == std::vector<uint32_t>{4});
  CHECK(plan.excluded[0].reason == ExclusionReason::kProbationEnd);
}

TEST_CASE("planner: Capacity is the one capacity rule", "[engine][planner]") {
  PolicyConfig p;
  p.max_excluded_fraction = 0.3;
  p.min_active_ranks = 8;
  // Pure data parallelism: 10 replicas of one rank each.
  const Capacity cap(p, 10, 10, false);  // floor(3.0000000000000004) = 3 despite rounding
  CHECK(cap.max_excluded == 3);
  CHECK(cap.Room(0, 0, 1));
  CHECK(cap.Room(1, 1, 1));
  CHECK_FALSE(cap.Room(2, 2, 1));  // 10 - 2 - 1 = 7 < 8
  CHECK(cap.Why(2, 2, 1) == "min_active_ranks is 8");
  CHECK(cap.Why(3, 3, 1) == "max_excluded_fraction allows 3");
  CHECK(cap.Why(0, 0, 1).empty());
}

}  // namespace
}  // namespace straggler::engine::internal
