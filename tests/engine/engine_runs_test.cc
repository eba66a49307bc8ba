// Runs and job end in the engine (docs/runs.md): a rank's new incarnation
// restarts its iterations, a finished rank never turns unresponsive, and a
// whole job restarted starts over above every published version.
#include <catch2/catch.hpp>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace std::chrono_literals;
using namespace testutil;  // engine_test_util.h

TEST_CASE("runs: a restarted rank may report lower iterations, without Restart they are stale",
          "[engine][runs]") {
  Harness h(4);
  h.Rows(0, 100, 0, Uniform(4, 1.0));
  JobEngine& e = h.engine();
  const Report older = testutil::MakeReport(2, 0, 50, 1.0, h.now());
  CHECK(e.Ingest(older, h.now()).reason == RejectReason::kStale);
  e.Restart(2);
  const IngestResult r = e.Ingest(older, h.now());
  CHECK(r.accepted);
  CHECK(e.Progress(2) == std::optional<uint64_t>(50));
  // Within the new incarnation iterations must grow again.
  CHECK(e.Ingest(testutil::MakeReport(2, 0, 49, 1.0, h.now()), h.now()).reason ==
        RejectReason::kStale);
  CHECK(e.Ingest(older, h.now()).reason == RejectReason::kDuplicate);
}

TEST_CASE("runs: a finished rank never turns unresponsive, all finished is a finished job",
          "[engine][runs]") {
  PolicyConfig p = DynamicPolicy();
  p.unresponsive_after_seconds = 1.0;
  Harness h(4, p);
  h.Rows(0, 20, 0, Uniform(4, 1.0));
  JobEngine& e = h.engine();
  for (uint32_t r = 0; r < 3; ++r) e.Finish(r, h.now());
  CHECK_FALSE(e.Finished());
  CHECK(e.View().finished_ranks == 3);
  h.Advance(10s);
  e.Tick(h.now());
  CHECK(h.State(0) == WorkerState::kFinished);
  CHECK(h.State(3) == WorkerState::kUnresponsive);  // it did not close: it went silent
  e.Finish(3, h.now());  // an unresponsive rank that closes after all
  CHECK(e.Finished());
  CHECK(e.View().unresponsive_ranks == 0);
  // Reporting again (the same rank back) makes it healthy.
  h.Feed(0, 0, 20, 1.0);
  CHECK(h.State(0) == WorkerState::kHealthy);
  CHECK_FALSE(e.Finished());
}

TEST_CASE("runs: a finished straggler keeps its exclusion, a job that ends publishes nothing",
          "[engine][runs]") {
  PolicyConfig p = DynamicPolicy();
  p.cooldown_iterations = 0;
  Harness h(8, p);
  std::vector<double> slow = Uniform(8, 1.0);
  slow[3] = 3.0;
  h.Rows(0, 10, 0, Uniform(8, 1.0));
  h.Rows(10, 20, 0, slow);
  JobEngine& e = h.engine();
  REQUIRE(ExcludedRanks(e.membership()) == std::vector<uint32_t>{3});
  const uint64_t version = e.membership().version;
  for (uint32_t r = 0; r < 8; ++r) e.Finish(r, h.now());
  CHECK(e.Finished());
  CHECK(e.membership().version == version);
}

TEST_CASE("runs: StartOver keeps policy and forced ranks, restarts versions above the old ones",
          "[engine][runs]") {
  PolicyConfig p = DynamicPolicy();
  p.cooldown_iterations = 0;
  Harness h(8, p);
  JobEngine& e = h.engine();
  REQUIRE(e.SetOverride(5, RankOverride::kForceExclude, "broken GPU", h.now()).ok());
  std::vector<double> slow = Uniform(8, 1.0);
  slow[3] = 3.0;
  h.Rows(0, 10, 0, Uniform(8, 1.0));
  h.Rows(10, 300, 0, slow);
  REQUIRE(ExcludedRanks(e.membership()) == std::vector<uint32_t>({3, 5}));
  const uint64_t old = e.membership().version;
  e.StartOver(old + 1, h.now());
  CHECK(e.membership().version == old + 1);
  CHECK(e.membership().effective_iteration == 0);
  CHECK(ExcludedRanks(e.membership()) == std::vector<uint32_t>{5});  // forced stays out
  CHECK(e.membership_history().size() == 1);
  CHECK(e.Worker(5).override == RankOverride::kForceExclude);
  CHECK(h.State(3) == WorkerState::kPending);
  CHECK_FALSE(e.Progress(3).has_value());
  // The restarted job, from a checkpoint at iteration 100: accepted, and a new
  // straggler is found and excluded at iterations after the restart.
  std::vector<double> slow1 = Uniform(8, 1.0);
  slow1[1] = 3.0;
  slow1[5] = testutil::kSkip;
  std::vector<double> fast = Uniform(8, 1.0);
  fast[5] = testutil::kSkip;
  h.Rows(100, 10, 0, fast);
  h.Rows(110, 20, 0, slow1);
  CHECK(ExcludedRanks(e.membership()) == std::vector<uint32_t>({1, 5}));
  CHECK(e.membership().version > old + 1);
  CHECK(e.membership().effective_iteration < 140);
}

}  // namespace
}  // namespace straggler::engine
