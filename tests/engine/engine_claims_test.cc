// Hostile and broken input the engine bounds (issue 15): hello claims far
// past the job, a version floor put out of reach, forged iterations, and a
// straggler restored from the state database that has not reconnected.
#include <catch2/catch.hpp>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace std::chrono_literals;
using namespace testutil;  // engine_test_util.h

Membership Held(uint64_t version, uint64_t effective) {
  Membership m;
  m.version = version;
  m.effective_iteration = effective;
  return m;
}

TEST_CASE("claims: a hello's version, effective and reported iterations are bounded",
          "[engine][claims]") {
  Harness h(4);
  JobEngine& e = h.engine();
  // No progress yet (a restarted daemon without a database): a client at
  // iteration 1000 holding version 7 in force from 905 is believed.
  CHECK(e.CheckClaims(Held(7, 905), 1000).ok());
  CHECK(e.CheckClaims(Held(7, 5000), std::nullopt).code() == absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(e.CheckClaims(Held(uint64_t{1} << 40, 10), 1000).ok());
  h.Rows(0, 500, 0, Uniform(4, 1.0));
  CHECK(e.CheckClaims(Held(3, 503), 499).ok());
  CHECK(e.CheckClaims(Held(3, 499 + 3 + 1024), std::nullopt).ok());
  const absl::Status far = e.CheckClaims(Held(3, 499 + 3 + 1025), std::nullopt);
  CHECK(far.code() == absl::StatusCode::kInvalidArgument);
  CHECK(far.message().find("known_effective_iteration=1527") != std::string::npos);
  CHECK_FALSE(e.CheckClaims(Held(0, 0), 499 + 1'000'001).ok());
  CHECK(e.CheckClaims(Held(0, 0), 499 + 1'000'000).ok());
  CHECK_FALSE(e.CheckClaims(Held(1'000'000'000'000ull, 1'000'000'000'000'000ull), 500).ok());
}

// Issue 28 item 8: a hello with progress + 10 000 held every later version
// of a live job there.
TEST_CASE("claims: the job's progress drops with its ranks' restarts, not held at the old top",
          "[engine][claims]") {
  // The bound reads the highest progress kept as reports raise it; ranks
  // restarted from an earlier checkpoint lower it, and it is taken again.
  Harness h(4);
  JobEngine& e = h.engine();
  h.Rows(0, 500, 0, Uniform(4, 1.0));
  CHECK(e.CheckClaims(Held(0, 0), 499 + 1'000'000).ok());
  for (uint32_t r = 0; r < 4; ++r) e.Restart(r);
  h.Rows(0, 3, 0, Uniform(4, 1.0));  // every rank back at iteration 2
  CHECK_FALSE(e.CheckClaims(Held(0, 0), 499 + 1'000'000).ok());
  CHECK(e.CheckClaims(Held(0, 0), 2 + 1'000'000).ok());
}

TEST_CASE("hello_claim: a live job takes a reported_iteration as a floor only up to its "
          "progress + 1023, a job without reports takes it whole",
          "[engine][claims]") {
  SECTION("no reports yet: a daemon restarted without its database takes the job over") {
    Harness h(4);
    CHECK(h.engine().NoteReportedIteration(5000) == std::optional<uint64_t>(5000));
    CHECK(h.engine().NoteReportedIteration(uint64_t{1} << 62) == std::nullopt);
  }
  Harness h(4);
  JobEngine& e = h.engine();
  h.Rows(0, 500, 0, Uniform(4, 1.0));  // progress: 499
  CHECK(e.NoteReportedIteration(510) == std::optional<uint64_t>(510));
  CHECK(e.NoteReportedIteration(499 + 10'000) == std::optional<uint64_t>(499 + 1023));
  // known_effective_iteration is bounded against the floor as taken.
  CHECK(e.CheckClaims(Held(3, 499 + 1023 + 3 + 1024), 499 + 10'000).ok());
  const absl::Status far = e.CheckClaims(Held(3, 499 + 1023 + 3 + 1025), 499 + 10'000);
  CHECK(far.code() == absl::StatusCode::kInvalidArgument);
  // The next version takes effect at most lead + 1024 past the progress.
  REQUIRE(e.SetOverride(1, RankOverride::kForceExclude, "", h.now()).ok());
  CHECK(ExcludedRanks(e.membership()) == std::vector<uint32_t>{1});
  CHECK(e.membership().effective_iteration == 499 + 1023 + 1 + 3);
}

TEST_CASE("claims: a version floor out of reach is rebased at the next decision and by Reset",
          "[engine][claims]") {
  PolicyConfig p = DynamicPolicy();
  p.cooldown_iterations = 0;
  Harness h(8, p);
  JobEngine& e = h.engine();
  // What an unbounded hello did before: a floor at 10^15.
  e.NoteReportedIteration(1'000'000'000'000'000ull);
  e.AdoptVersionFloor(Held(1'000'000'000'000ull, 1'000'000'000'000'000ull), h.now());
  REQUIRE(e.membership().effective_iteration > 1'000'000'000'000'000ull);
  std::vector<double> slow = Uniform(8, 1.0);
  slow[3] = 3.0;
  h.Rows(0, 10, 0, Uniform(8, 1.0));
  h.Rows(10, 20, 0, slow);
  CHECK(ExcludedRanks(e.membership()) == std::vector<uint32_t>{3});
  CHECK(e.membership().version > 1'000'000'000'001ull);
  CHECK(e.membership().effective_iteration < 40);

  SECTION("Reset restores a working lineage") {
    e.NoteReportedIteration(1'000'000'000'000'000ull);
    e.Reset(h.now());
    CHECK(e.membership().excluded.empty());
    CHECK(e.membership().effective_iteration < 40);
  }
}

TEST_CASE("claims: a forged report is refused past the jump bound, and below it does not make "
          "the rank's real reports stale",
          "[engine][claims]") {
  Harness h(4);
  JobEngine& e = h.engine();
  h.Rows(0, 100, 0, Uniform(4, 1.0));
  const IngestResult absurd = e.Ingest(MakeReport(1, 0, uint64_t{1} << 62, 1.0, h.now()), h.now());
  CHECK(absurd.reason == RejectReason::kTooFarAhead);
  CHECK(absurd.message.find("more than 1000000 past the job's progress (iteration 99)") !=
        std::string::npos);
  CHECK(e.Ingest(MakeReport(1, 0, 99 + 5000, 1.0, h.now()), h.now()).accepted);
  // The rank's real next report, and every one after it, is taken.
  h.Rows(100, 20, 0, Uniform(4, 1.0));
  CHECK(e.Progress(1) == std::optional<uint64_t>(119));
  CHECK(e.View().highest_iteration == 119);
}

TEST_CASE("claims: a restored straggler stays out until its reports show recovery",
          "[engine][claims]") {
  Harness h(4);
  JobEngine& e = h.engine();
  Membership stored = Held(4, 100);
  stored.excluded.push_back({3, ExclusionReason::kStraggler, "slow", 90});
  e.RestoreMembership(stored, {}, h.now());
  REQUIRE(ExcludedRanks(e.membership()) == std::vector<uint32_t>{3});
  // Not silent since 1970: its unresponsive clock starts at the restore.
  h.Advance(5s);
  e.Tick(h.now());
  CHECK(h.State(3) == WorkerState::kStraggler);
  // Silent past the timeout: unresponsive; reporting again it is still a
  // straggler with a full counter, not healthy and readmitted.
  h.Advance(60s);
  e.Tick(h.now());
  CHECK(h.State(3) == WorkerState::kUnresponsive);
  CHECK(ExcludedRanks(e.membership()) == std::vector<uint32_t>{3});
  h.Feed(3, 0, 101, 1.0);
  CHECK(h.State(3) == WorkerState::kStraggler);
  CHECK(e.Worker(3).counter == e.Worker(3).limit);
  CHECK(ExcludedRanks(e.membership()) == std::vector<uint32_t>{3});
}

TEST_CASE("claims: a far-ahead report does not advance the rank's published progress until its "
          "real reports catch up, and the same report again is a duplicate",
          "[engine][claims]") {
  Harness h(4);
  JobEngine& e = h.engine();
  h.Rows(0, 100, 0, Uniform(4, 1.0));
  // Far ahead of the job (more than 1024) but within the jump bound: taken,
  // judged alone.
  REQUIRE(e.Ingest(MakeReport(1, 0, 99 + 5000, 1.0, h.now()), h.now()).accepted);
  // Progress is what the daemon's directive tells the rank's clients (they
  // judge certainty by it): still where the rank really is.
  CHECK(e.Progress(1) == std::optional<uint64_t>(99));
  // A resend of the forged report (a reconnect's replay) is a duplicate:
  // neither taken again nor stale.
  const IngestResult again = e.Ingest(MakeReport(1, 0, 99 + 5000, 1.0, h.now()), h.now());
  CHECK(again.reason == RejectReason::kDuplicate);
  CHECK(again.message == "rank 1 iteration 5099 was already reported");
  CHECK(e.Progress(1) == std::optional<uint64_t>(99));
  // The rank's real reports catch up: its progress follows them again.
  h.Rows(100, 5, 0, Uniform(4, 1.0));
  CHECK(e.Progress(1) == std::optional<uint64_t>(104));
  CHECK(e.Worker(1).state == WorkerState::kHealthy);

  SECTION("a rank whose first report is far ahead has no published progress") {
    Harness g(4);
    g.Rows(0, 100, 0, {1.0, testutil::kSkip, 1.0, 1.0});
    REQUIRE(g.engine().Ingest(MakeReport(1, 0, 99 + 5000, 1.0, g.now()), g.now()).accepted);
    CHECK(g.engine().Progress(1) == std::nullopt);
  }
}

// Issue 28 item 11: one report with epoch 2^64-1 pinned the job's epoch.
TEST_CASE("epoch_claim: a report may be at most one epoch per iteration ahead of the job's",
          "[engine][claims]") {
  Harness h(4);
  JobEngine& e = h.engine();
  const IngestResult first = h.Send(0, uint64_t{1} << 62, 0, 1.0);
  CHECK(first.reason == RejectReason::kTooFarAhead);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  h.Rows(10, 2, 10, Uniform(4, 1.0));  // ten epochs in ten iterations: plausible
  REQUIRE(e.View().epoch == 10);
  const IngestResult jump = h.Send(1, 14, 12, 1.0);
  CHECK(jump.reason == RejectReason::kTooFarAhead);
  CHECK(jump.message ==
        "rank 1 iteration 12 epoch 14 is more than 3 epochs past the job's epoch 10 (first seen "
        "at iteration 10): an epoch has at least one iteration");
  // Epochs one per iteration, or slower, are taken.
  h.Rows(12, 1, 12, Uniform(4, 1.0));
  h.Rows(13, 3, 13, Uniform(4, 1.0));
  CHECK(e.View().epoch == 13);
}

}  // namespace
}  // namespace straggler::engine
