// Runs and job end in the engine (docs/runs.md): a rank's new incarnation
// restarts its iterations, a finished rank never turns unresponsive, a
// whole job restarted starts over above every published version, and an
// ended job (finished or lost) shows nobody excluded.
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

// The policy of the job-end cases below: no cool-down, silent after 1 s.
PolicyConfig JobEndPolicy(PolicyConfig p = DynamicPolicy()) {
  p.cooldown_iterations = 0;
  p.unresponsive_after_seconds = 1.0;
  return p;
}

// An 8-rank job's rank 3 (3x slow) excluded: where issue 28's items 4 and 5
// start from.
void ExcludeRank3(Harness& h) {
  std::vector<double> slow = Uniform(8, 1.0);
  slow[3] = 3.0;
  h.Rows(0, 10, 0, Uniform(8, 1.0));
  h.Rows(10, 20, 0, slow);
  REQUIRE(ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{3});
}

// An ended job has no current exclusion; the versions keep the history.
void CheckNoCurrentExclusion(const JobEngine& e) {
  CHECK(e.View().excluded_ranks == 0);
  CHECK(e.View().active_ranks == 8);
  CHECK_FALSE(e.View().membership_withheld);
  CHECK_FALSE(e.Worker(3).excluded);
  CHECK(e.Worker(3).exclusion_reason == ExclusionReason::kNone);
  CHECK(ExcludedRanks(e.membership()) == std::vector<uint32_t>{3});
}

TEST_CASE("runs: finished_clean - a finished job shows nobody excluded, its versions stay",
          "[engine][runs]") {
  Harness h(8, JobEndPolicy());
  ExcludeRank3(h);
  JobEngine& e = h.engine();
  CHECK(e.View().excluded_ranks == 1);
  CHECK(e.Worker(3).excluded);
  for (uint32_t r = 0; r < 7; ++r) e.Finish(r, h.now());
  CHECK(e.View().excluded_ranks == 1);  // not ended yet: rank 3 still out
  e.Finish(7, h.now());
  REQUIRE(e.Ended());
  CheckNoCurrentExclusion(e);
  // A rank that reports again reopens the job: its view is the newest
  // membership's again.
  h.Feed(0, 0, 30, 1.0);
  CHECK_FALSE(e.Ended());
  CHECK(e.View().excluded_ranks == e.membership().excluded.size());
  CHECK(e.Worker(3).excluded == e.membership().IsExcluded(3));
}

TEST_CASE("runs: job_lost - every rank killed: no guard_blocked, Lose ends the job once, "
          "Announce resumes it",
          "[engine][runs]") {
  Harness h(8, JobEndPolicy());
  ExcludeRank3(h);
  JobEngine& e = h.engine();
  h.Collect();
  const size_t guard_events = h.Count(EventKind::kGuardBlocked);
  const uint64_t guard_blocks = e.View().guard_blocks_total;
  // Every process killed: every stream ends, nothing reports.
  for (uint32_t r = 0; r < 8; ++r) e.Detach(r);
  h.Advance(10s);
  e.Tick(h.now());
  h.Collect();
  REQUIRE(e.View().unresponsive_ranks == 8);
  // max_excluded_fraction leaves room for one more: 6 silent ranks are kept
  // in by the guard, but with no rank training that is worth no event.
  CHECK(h.Count(EventKind::kGuardBlocked) == guard_events);
  CHECK(e.View().guard_blocks_total == guard_blocks);
  CHECK_FALSE(e.Ended());

  e.Lose(h.now(), "gone");
  e.Lose(h.now(), "gone again");  // once
  h.Collect();
  REQUIRE(h.Count(EventKind::kJobLost) == 1);
  CHECK(h.Of(EventKind::kJobLost)[0].message == "gone");
  CHECK_FALSE(EventNamesRank(EventKind::kJobLost));
  CHECK(e.Lost());
  CHECK(e.Ended());
  CHECK(e.View().lost);
  CheckNoCurrentExclusion(e);
  const uint64_t version = e.membership().version;
  h.Advance(3600s);
  e.Tick(h.now());
  h.Collect();
  CHECK(e.membership().version == version);
  CHECK(h.Count(EventKind::kGuardBlocked) == guard_events);

  // A stream speaks for a rank again: the job resumes, its exclusion shows.
  e.Announce(0, h.now());
  CHECK_FALSE(e.Lost());
  CHECK_FALSE(e.View().lost);
  CHECK(e.Worker(3).excluded);
}

TEST_CASE("runs: job_lost - a finished job is never lost",
          "[engine][runs]") {
  Harness h(8, JobEndPolicy());
  ExcludeRank3(h);
  JobEngine& e = h.engine();
  for (uint32_t r = 0; r < 8; ++r) e.Finish(r, h.now());
  e.Lose(h.now(), "gone");
  h.Collect();
  CHECK(h.Count(EventKind::kJobLost) == 0);
  CHECK_FALSE(e.Lost());
  CHECK(e.Ended());
}

TEST_CASE("runs: job_lost - an unresponsive rank kept in by a guard while others train is "
          "still a guard_blocked event",
          "[engine][runs]") {
  PolicyConfig p = DynamicPolicy();
  p.max_excluded_fraction = 0.125;  // one of 8: rank 3 fills it
  Harness h(8, JobEndPolicy(p));
  ExcludeRank3(h);
  JobEngine& e = h.engine();
  h.Collect();
  const size_t before = h.Count(EventKind::kGuardBlocked);
  e.Detach(5);  // one trainer killed; the others keep training
  std::vector<double> slow = Uniform(8, 1.0);
  slow[3] = 3.0;
  slow[5] = testutil::kSkip;
  for (uint64_t i = 30; i < 50; ++i) {
    h.Row(i, 0, slow);
    h.Advance(100ms);
    e.Tick(h.now());
  }
  h.Collect();
  REQUIRE(h.State(5) == WorkerState::kUnresponsive);
  CHECK(h.Count(EventKind::kGuardBlocked, 5) == 1);
  CHECK(h.Count(EventKind::kGuardBlocked) == before + 1);
}

}  // namespace
}  // namespace straggler::engine
