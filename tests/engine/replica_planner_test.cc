// The exclusion planner in a hybrid-parallel job (docs/topology.md,
// "Exclusion by replica"): the data-parallel replica is the unit a partial
// all-reduce can leave out, so a culprit takes its whole replica out and the
// guards count replicas. Pure function, pinned case by case.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "exclusion_planner.h"
#include "planner_fixtures.h"
#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"

namespace straggler::engine::internal {
namespace {

// `replicas` replicas of `per` ranks: rank = per * r + s, peer group stage<s>.
std::vector<RankSnapshot> Job(uint32_t replicas, uint32_t per) {
  std::vector<RankSnapshot> ranks(replicas * per);
  for (uint32_t i = 0; i < ranks.size(); ++i) {
    ranks[i].state = WorkerState::kHealthy;
    ranks[i].ewma = 1.0;
    ranks[i].replica = i / per;
    ranks[i].peer_group = "stage" + std::to_string(i % per);
  }
  return ranks;
}

void Slow(RankSnapshot& r, double ewma) {
  r.state = WorkerState::kStraggler;
  r.ewma = ewma;
  r.counter = 5;
}

using testing::Input;
using testing::Ranks;

TEST_CASE("planner replica: a straggler takes its whole replica out, the culprit named",
          "[engine][planner][replica]") {
  PolicyConfig p;
  std::vector<RankSnapshot> ranks = Job(4, 4);
  Slow(ranks[6], 3.0);
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  REQUIRE(Ranks(plan.excluded) == std::vector<uint32_t>{4, 5, 6, 7});
  CHECK(plan.blocked.empty());
  for (const ExcludedRank& e : plan.excluded) {
    CHECK(e.culprit == 6u);
    CHECK(e.culprit_group == "stage2");
    CHECK(e.replica == 1u);
    CHECK(e.since_iteration == 100);
    CHECK(e.reason == (e.rank == 6 ? ExclusionReason::kStraggler : ExclusionReason::kReplica));
  }
  CHECK(plan.excluded[0].detail == "replica 1 with rank 6 (group stage2)");
  CHECK(plan.excluded[2].detail == "ewma 3s = 3.00x baseline 1s; counter 5/5");
}

TEST_CASE("planner replica: max_excluded_fraction counts replicas, slowest replica first",
          "[engine][planner][replica]") {
  PolicyConfig p;  // 0.25: one of 4 replicas, none of 3
  std::vector<RankSnapshot> ranks = Job(4, 2);
  Slow(ranks[2], 2.0);  // replica 1
  Slow(ranks[7], 4.0);  // replica 3
  ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{6, 7});
  CHECK(plan.blocked == std::vector<uint32_t>{2});
  CHECK(plan.blocked_why == "max_excluded_fraction allows 1 of 4 replicas");

  ranks.resize(6);  // 3 replicas
  plan = PlanExclusion(p, Input(ranks));
  CHECK(plan.excluded.empty());
  CHECK(plan.blocked == std::vector<uint32_t>{2});
  CHECK(plan.blocked_why == "max_excluded_fraction allows 0 of 3 replicas");
}

TEST_CASE("planner replica: min_active_replicas keeps enough replicas in",
          "[engine][planner][replica]") {
  PolicyConfig p;
  p.max_excluded_fraction = 0.5;
  p.min_active_replicas = 3;
  std::vector<RankSnapshot> ranks = Job(4, 2);
  Slow(ranks[0], 4.0);
  Slow(ranks[5], 1.5);  // without replica 0 alone the job is 2x faster
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{0, 1});
  CHECK(plan.blocked == std::vector<uint32_t>{5});
  CHECK(plan.blocked_why == "min_active_replicas is 3");
  // min_active_ranks still counts ranks: 8 - 2 - 2 < 5.
  p.min_active_replicas = 1;
  p.min_active_ranks = 5;
  CHECK(PlanExclusion(p, Input(ranks)).blocked_why == "min_active_ranks is 5");
}

TEST_CASE("planner replica: the throughput guard compares (R-x)/T with R/T in replicas",
          "[engine][planner][replica]") {
  PolicyConfig p;  // min_throughput_gain 0.05
  std::vector<RankSnapshot> ranks = Job(4, 4);
  // Per rank, 15 x 1.2 / 16 - 1 = +12.5 % would pay; per replica it is
  // 3 x 1.2 / 4 - 1 = -10 %: the replica's three healthy ranks go too.
  Slow(ranks[9], 1.2);
  ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  CHECK(plan.excluded.empty());
  CHECK(plan.blocked == std::vector<uint32_t>{9});
  CHECK(plan.blocked_why == "predicted throughput gain below 0.05");
  // 3 x 1.5 / 4 - 1 = +12.5 %.
  Slow(ranks[9], 1.5);
  plan = PlanExclusion(p, Input(ranks));
  CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{8, 9, 10, 11});
}

TEST_CASE("planner replica: readmitted when its culprit recovers, kept while it has one",
          "[engine][planner][replica]") {
  PolicyConfig p;
  std::vector<RankSnapshot> ranks = Job(4, 2);
  std::vector<ExcludedRank> current = {
      {2, ExclusionReason::kStraggler, "slow", 40, 2u, "stage0", 1u},
      {3, ExclusionReason::kReplica, "replica 1 with rank 2 (group stage0)", 40, 2u, "stage0", 1u}};
  Slow(ranks[2], 3.0);
  ExclusionPlan plan = PlanExclusion(p, Input(ranks, current));
  REQUIRE(Ranks(plan.excluded) == std::vector<uint32_t>{2, 3});
  CHECK(plan.excluded[0].detail == "slow");
  CHECK(plan.excluded[1].since_iteration == 40);

  SECTION("the culprit recovered: the whole replica is back") {
    ranks[2].state = WorkerState::kHealthy;
    CHECK(PlanExclusion(p, Input(ranks, current)).excluded.empty());
  }
  SECTION("a mate is a straggler now: the replica stays out, no guard asked") {
    ranks[2].state = WorkerState::kHealthy;
    Slow(ranks[3], 1.01);  // would not pass the throughput guard as a new candidate
    plan = PlanExclusion(p, Input(ranks, current));
    CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{2, 3});
  }
  SECTION("on probation the culprit is no candidate: the replica is re-included") {
    ranks[2].on_probation = true;
    CHECK(PlanExclusion(p, Input(ranks, current)).excluded.empty());
  }
}

TEST_CASE("planner replica: a restored set keeps the mates out until the hellos declare it",
          "[engine][planner][replica]") {
  // A restarted daemon: the state database gave the set (with its replica
  // fields), the culprit is a straggler again, and only some ranks have sent
  // their hello. Grouped by the entries, the mates stay with their culprit.
  PolicyConfig p;
  std::vector<RankSnapshot> ranks = Job(4, 2);
  for (uint32_t i : {2u, 3u}) ranks[i].replica.reset();  // no hello yet
  Slow(ranks[2], 3.0);
  std::vector<ExcludedRank> current = {
      {2, ExclusionReason::kStraggler, "slow", 40, 2u, "stage0", 1u},
      {3, ExclusionReason::kReplica, "replica 1 with rank 2 (group stage0)", 40, 2u, "stage0", 1u}};
  ExclusionPlan plan = PlanExclusion(p, Input(ranks, current));
  REQUIRE(Ranks(plan.excluded) == std::vector<uint32_t>{2, 3});
  CHECK(plan.excluded[1].reason == ExclusionReason::kReplica);
  CHECK(plan.excluded[1].culprit == 2u);
  SECTION("only the culprit has not said hello") {
    ranks[3].replica = 1;
    plan = PlanExclusion(p, Input(ranks, current));
    CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{2, 3});
  }
  SECTION("the culprit recovered: both are back") {
    ranks[2].state = WorkerState::kHealthy;
    CHECK(PlanExclusion(p, Input(ranks, current)).excluded.empty());
  }
  SECTION("entries without replica fields (an older database): each rank on its own") {
    for (ExcludedRank& e : current) {
      e.culprit.reset();
      e.replica.reset();
    }
    CHECK(Ranks(PlanExclusion(p, Input(ranks, current)).excluded) == std::vector<uint32_t>{2});
  }
}

TEST_CASE("planner replica: an unresponsive rank takes its replica out, before stragglers",
          "[engine][planner][replica]") {
  PolicyConfig p;
  std::vector<RankSnapshot> ranks = Job(4, 3);
  Slow(ranks[1], 6.0);
  ranks[10].state = WorkerState::kUnresponsive;
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  REQUIRE(Ranks(plan.excluded) == std::vector<uint32_t>{9, 10, 11});
  CHECK(plan.excluded[1].reason == ExclusionReason::kUnresponsive);
  CHECK(plan.excluded[0].reason == ExclusionReason::kReplica);
  CHECK(plan.excluded[0].culprit == 10u);
  CHECK(plan.blocked == std::vector<uint32_t>{1});
  CHECK(plan.blocked_why == "max_excluded_fraction allows 1 of 4 replicas");
}

TEST_CASE("planner replica: a forced rank takes its replica out, a forced-in one keeps it in",
          "[engine][planner][replica]") {
  PolicyConfig p;
  std::vector<RankSnapshot> ranks = Job(4, 2);
  ranks[4].override = RankOverride::kForceExclude;
  Slow(ranks[1], 5.0);
  ranks[0].override = RankOverride::kForceInclude;
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  REQUIRE(Ranks(plan.excluded) == std::vector<uint32_t>{4, 5});
  CHECK(plan.excluded[0].reason == ExclusionReason::kForced);
  CHECK(plan.excluded[1].reason == ExclusionReason::kReplica);
  CHECK(plan.excluded[1].culprit == 4u);
  CHECK(plan.blocked.empty());  // replica 0 is forced in: rank 1 is no candidate
}

TEST_CASE("planner replica: every rank its own declared replica plans as pure data parallelism",
          "[engine][planner][replica]") {
  PolicyConfig p;
  std::vector<RankSnapshot> ranks = Job(8, 1);
  Slow(ranks[1], 3.0);
  Slow(ranks[4], 5.0);
  Slow(ranks[6], 4.0);
  const ExclusionPlan plan = PlanExclusion(p, Input(ranks));
  CHECK(Ranks(plan.excluded) == std::vector<uint32_t>{4, 6});
  CHECK(plan.excluded[0].culprit == 4u);
  CHECK(plan.excluded[0].replica == 4u);
  CHECK(plan.blocked == std::vector<uint32_t>{1});
  CHECK(plan.blocked_why == "max_excluded_fraction allows 2");
}

}  // namespace
}  // namespace straggler::engine::internal
