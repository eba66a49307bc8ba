// Exclusion by replica through the engine (docs/topology.md, "Exclusion by
// replica"): ranks declare their replica with SetTopology, a straggler takes
// its whole replica out in one version, the guards count replicas, the
// replica comes back when the culprit recovers, and a silent rank takes its
// replica out too. The planner's rules one by one: replica_planner_test.cc.
#include <catch2/catch.hpp>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace testutil;  // engine_test_util.h

// `replicas` replicas of 2 ranks each: rank 2r and 2r + 1 are replica r.
void Declare(Harness& h, uint32_t replicas) {
  for (uint32_t r = 0; r < 2 * replicas; ++r) {
    RankTopology t;
    t.replica = r / 2;
    h.engine().SetTopology(r, t);
  }
}

TEST_CASE("engine replica: a straggler takes its replica out in one version, back on recovery",
          "[engine][replica]") {
  Harness h(8);
  Declare(h, 4);
  h.Rows(0, 10, 0, Uniform(8, 1.0));
  h.Rows(10, 6, 0, With(Uniform(8, 1.0), 3, 3.0));
  REQUIRE(h.State(3) == WorkerState::kStraggler);
  CHECK(h.State(2) == WorkerState::kHealthy);
  const Membership out = h.engine().membership();
  CHECK(out.version == 1);
  CHECK(ExcludedRanks(out) == std::vector<uint32_t>{2, 3});
  CHECK(ReasonOf(out, 3) == ExclusionReason::kStraggler);
  CHECK(ReasonOf(out, 2) == ExclusionReason::kReplica);
  for (const ExcludedRank& e : out.excluded) {
    CHECK(e.culprit == 3u);
    CHECK(e.replica == 1u);
  }
  CHECK(h.engine().Worker(2).excluded);
  const auto membership_events = h.Of(EventKind::kMembership);
  REQUIRE(!membership_events.empty());
  CHECK_THAT(membership_events.back().message,
             Catch::Contains("replica 1 [2, 3] for rank 3 (straggler)"));

  // The culprit recovers (its shadow reports): the whole replica is back.
  h.Rows(16, 12, 0, Uniform(8, 1.0));
  CHECK(h.State(3) == WorkerState::kHealthy);
  CHECK(ExcludedRanks(h.engine().membership()).empty());
  CHECK(h.engine().membership().version == 2);
}

TEST_CASE("engine replica: 3 replicas allow none out at max_excluded_fraction 0.25",
          "[engine][replica]") {
  Harness h(6);
  Declare(h, 3);
  h.Rows(0, 10, 0, Uniform(6, 1.0));
  h.Rows(10, 6, 0, With(Uniform(6, 1.0), 4, 3.0));
  REQUIRE(h.State(4) == WorkerState::kStraggler);
  CHECK(ExcludedRanks(h.engine().membership()).empty());
  const auto blocked = h.Of(EventKind::kGuardBlocked, 4);
  REQUIRE(blocked.size() == 1);
  CHECK(blocked[0].message ==
        "exclusion of replica 2 for rank 4 withheld: max_excluded_fraction allows 0 of 3 "
        "replicas");
}

TEST_CASE("engine replica: an unresponsive rank takes its replica out",
          "[engine][replica][unresponsive]") {
  PolicyConfig p;
  p.unresponsive_after_seconds = 5.0;
  Harness h(8, p);
  Declare(h, 4);
  h.Rows(0, 10, 0, Uniform(8, 1.0));
  uint64_t it = 10;
  for (int k = 0; k < 7; ++k) {
    h.Advance(std::chrono::seconds(1) - Harness::kRowStep);
    h.Row(it++, 0, {1.0, 1.0, 1.0, 1.0, 1.0, kSkip, 1.0, 1.0});
  }
  h.engine().Tick(h.now());
  h.Collect();
  REQUIRE(h.State(5) == WorkerState::kUnresponsive);
  CHECK(ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{4, 5});
  CHECK(ReasonOf(h.engine().membership(), 5) == ExclusionReason::kUnresponsive);
  CHECK(ReasonOf(h.engine().membership(), 4) == ExclusionReason::kReplica);
  // It reports again: the replica is back.
  h.Advance(Harness::kRowStep);
  h.Feed(5, 0, it, 1.0);
  CHECK(ExcludedRanks(h.engine().membership()).empty());
}

TEST_CASE("engine replica: every rank its own replica behaves as pure data parallelism",
          "[engine][replica]") {
  Harness plain(8), declared(8);
  for (uint32_t r = 0; r < 8; ++r) {
    RankTopology t;
    t.replica = r;
    declared.engine().SetTopology(r, t);
  }
  for (Harness* h : {&plain, &declared}) {
    h->Rows(0, 10, 0, Uniform(8, 1.0));
    h->Rows(10, 6, 0, With(Uniform(8, 1.0), 6, 3.0));
  }
  CHECK(ExcludedRanks(plain.engine().membership()) == std::vector<uint32_t>{6});
  CHECK(ExcludedRanks(declared.engine().membership()) == std::vector<uint32_t>{6});
  CHECK(plain.engine().membership().effective_iteration ==
        declared.engine().membership().effective_iteration);
}

}  // namespace
}  // namespace straggler::engine
