// The versioned membership (versions only grow, effective_iteration strictly
// grows with them, bounded history), Progress, events with evidence, ranks
// that stop reporting and ranks that join late.
#include <catch2/catch.hpp>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace testutil;  // engine_test_util.h

std::vector<uint64_t> Versions(const std::vector<Membership>& ms) {
  std::vector<uint64_t> out;
  for (const auto& m : ms) out.push_back(m.version);
  return out;
}

TEST_CASE("membership: version 0 with nobody excluded at start", "[engine][membership]") {
  PolicyConfig p = DynamicPolicy();
  p.lead_iterations = 3;
  Harness h(8, p);
  const Membership& m = h.engine().membership();
  CHECK(m.version == 0);
  CHECK(m.excluded.empty());
  CHECK(m.world_size == 8);
  CHECK(m.lead_iterations == 3);
  for (uint32_t r = 0; r < 8; ++r) CHECK_FALSE(m.IsExcluded(r));
  REQUIRE(h.engine().membership_history().size() == 1);
  CHECK(h.engine().membership_history().back().version == 0);
  CHECK(h.engine().world_size() == 8);
  const JobView v = h.engine().View();
  CHECK(v.world_size == 8);
  CHECK(v.active_ranks == 8);  // pending ranks count as active
  CHECK(v.excluded_ranks == 0);
  for (uint32_t r = 0; r < 8; ++r) CHECK(h.State(r) == WorkerState::kPending);
}

TEST_CASE("membership: effective_iteration = highest active iteration + lead, strictly growing",
          "[engine][membership]") {
  PolicyConfig p = DynamicPolicy();
  p.lead_iterations = 2;  // the numbers below (the default is 3)
  Harness h(4, p);
  h.Rows(0, 11, 0, Uniform(4, 1.0));
  CHECK(h.engine().View().highest_iteration == 10);
  auto& e = h.engine();

  REQUIRE(e.SetOverride(1, RankOverride::kForceExclude, "t", h.now()).ok());
  CHECK(e.membership().version == 1);
  CHECK(e.membership().effective_iteration == 12);  // 10 + 2
  REQUIRE(e.SetOverride(1, RankOverride::kNone, "", h.now()).ok());
  CHECK(e.membership().version == 2);
  CHECK(e.membership().effective_iteration == 13);  // max(12, 12 + 1)
  REQUIRE(e.SetOverride(1, RankOverride::kForceExclude, "t", h.now()).ok());
  CHECK(e.membership().version == 3);
  CHECK(e.membership().effective_iteration == 14);
  CHECK(e.membership().created_at == h.now());

  h.Rows(11, 10, 0, Uniform(4, 1.0));  // active ranks reach 20
  REQUIRE(e.SetOverride(1, RankOverride::kNone, "", h.now()).ok());
  CHECK(e.membership().version == 4);
  CHECK(e.membership().effective_iteration == 22);  // max(20 + 2, 14 + 1)

  SECTION("MembershipsFrom: the version in force at i and every later one") {
    CHECK(Versions(e.MembershipsFrom(0)) == std::vector<uint64_t>{0, 1, 2, 3, 4});
    CHECK(Versions(e.MembershipsFrom(11)) == std::vector<uint64_t>{0, 1, 2, 3, 4});
    CHECK(Versions(e.MembershipsFrom(12)) == std::vector<uint64_t>{1, 2, 3, 4});
    CHECK(Versions(e.MembershipsFrom(13)) == std::vector<uint64_t>{2, 3, 4});
    CHECK(Versions(e.MembershipsFrom(14)) == std::vector<uint64_t>{3, 4});
    CHECK(Versions(e.MembershipsFrom(21)) == std::vector<uint64_t>{3, 4});
    CHECK(Versions(e.MembershipsFrom(22)) == std::vector<uint64_t>{4});
    CHECK(Versions(e.MembershipsFrom(1000)) == std::vector<uint64_t>{4});
    const auto from14 = e.MembershipsFrom(14);
    CHECK(ExcludedRanks(from14.front()) == std::vector<uint32_t>{1});
    CHECK(from14.back().excluded.empty());
  }
  SECTION("history is ascending and ends with membership()") {
    const auto& hist = e.membership_history();
    REQUIRE(hist.size() == 5);
    for (size_t i = 1; i < hist.size(); ++i) {
      CHECK(hist[i].version > hist[i - 1].version);
      CHECK(hist[i].effective_iteration > hist[i - 1].effective_iteration);
    }
    CHECK(hist.back().version == e.membership().version);
  }
}

TEST_CASE("membership: history is bounded by kMembershipHistory", "[engine][membership]") {
  Harness h(4);
  h.Rows(0, 3, 0, Uniform(4, 1.0));
  auto& e = h.engine();
  for (int i = 0; i < 40; ++i) {
    const auto o = (i % 2 == 0) ? RankOverride::kForceExclude : RankOverride::kNone;
    REQUIRE(e.SetOverride(2, o, "toggle", h.now()).ok());
  }
  CHECK(e.membership().version == 40);
  const auto& hist = e.membership_history();
  CHECK(hist.size() == JobEngine::kMembershipHistory);
  CHECK(hist.back().version == 40);
  CHECK(hist.front().version == 40 - JobEngine::kMembershipHistory + 1);
  for (size_t i = 1; i < hist.size(); ++i) {
    CHECK(hist[i].version == hist[i - 1].version + 1);
    CHECK(hist[i].effective_iteration > hist[i - 1].effective_iteration);
  }
  CHECK(Versions(e.MembershipsFrom(1'000'000)) == std::vector<uint64_t>{40});
}

TEST_CASE("membership: Reset re-includes everyone as a new, higher version",
          "[engine][membership]") {
  Harness h(4);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  h.Rows(10, 5, 0, With(Uniform(4, 1.0), 3, 3.0));
  REQUIRE(h.Excluded(3));
  const Membership before = h.engine().membership();
  REQUIRE(before.version == 1);
  h.events.clear();

  h.engine().Reset(h.now());
  h.Collect();
  const Membership& after = h.engine().membership();
  CHECK(after.version == 2);
  CHECK(after.excluded.empty());
  CHECK(after.effective_iteration > before.effective_iteration);
  CHECK(h.Count(EventKind::kReset) == 1);
  CHECK(h.Counter(3) == 0);
  CHECK(h.State(3) != WorkerState::kStraggler);
  CHECK_FALSE(h.engine().Worker(3).excluded);
  CHECK(h.engine().View().excluded_ranks == 0);

  // Versions keep growing after a reset.
  REQUIRE(h.engine().SetOverride(0, RankOverride::kForceExclude, "t", h.now()).ok());
  CHECK(h.engine().membership().version == 3);
  CHECK(h.engine().membership().effective_iteration > after.effective_iteration);
}

TEST_CASE("membership: Progress reports the highest processed iteration", "[engine][membership]") {
  Harness h(3);
  CHECK_FALSE(h.engine().Progress(0).has_value());
  h.Feed(0, 0, 5, 1.0);
  CHECK(h.engine().Progress(0) == std::optional<uint64_t>(5));
  CHECK(h.Send(0, 0, 5, 1.0).reason == RejectReason::kDuplicate);
  CHECK(h.engine().Progress(0) == std::optional<uint64_t>(5));
  CHECK(h.Send(0, 0, 3, 1.0).reason == RejectReason::kStale);
  CHECK(h.engine().Progress(0) == std::optional<uint64_t>(5));
  h.Feed(0, 0, 7, 1.0);
  CHECK(h.engine().Progress(0) == std::optional<uint64_t>(7));
  CHECK(h.Send(0, 0, 9, -1.0).reason == RejectReason::kInvalidValue);
  CHECK(h.engine().Progress(0) == std::optional<uint64_t>(7));
  CHECK_FALSE(h.engine().Progress(1).has_value());
}

TEST_CASE("events: the straggler transition carries its evidence", "[engine][membership][events]") {
  Harness h(4);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  h.Rows(10, 4, 0, With(Uniform(4, 1.0), 3, 3.0));
  h.events.clear();
  h.Row(14, 0, With(Uniform(4, 1.0), 3, 3.0));
  const Time at = h.now();

  const auto changes = h.Of(EventKind::kStateChange, 3);
  REQUIRE(changes.size() == 1);
  const Event& e = changes[0];
  CHECK(e.from == WorkerState::kHealthy);
  CHECK(e.to == WorkerState::kStraggler);
  CHECK(e.iteration == 14);
  CHECK(e.time == at);
  CHECK(e.evidence.compute_seconds == Approx(3.0));
  CHECK(e.evidence.threshold_seconds == Approx(2.0));
  CHECK(e.evidence.baseline_seconds == Approx(1.0));
  CHECK(e.evidence.counter == 5);
  CHECK(e.evidence.limit == 5);

  const auto ms = h.Of(EventKind::kMembership);
  REQUIRE(ms.size() == 1);
  CHECK(ms[0].membership_version == 1);
  CHECK(ms[0].time == at);
  // Nothing about the healthy ranks.
  CHECK(h.Count(EventKind::kStateChange, 0) == 0);

  // TakeEvents drains.
  CHECK(h.engine().TakeEvents().empty());
}

TEST_CASE("unresponsive: a silent rank is marked by Tick, excluded, and rejoins when it reports",
          "[engine][membership][unresponsive]") {
  PolicyConfig p = DynamicPolicy();
  p.unresponsive_after_seconds = 5.0;
  Harness h(4, p);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  const Time last_seen = h.now();

  // Rank 3 goes silent; the others go on, 1 s per row.
  uint64_t it = 10;
  for (int k = 0; k < 4; ++k) {
    h.Advance(std::chrono::seconds(1) - Harness::kRowStep);
    h.Row(it++, 0, {1.0, 1.0, 1.0, kSkip});
  }
  h.engine().Tick(h.now());  // 4 s of silence: not yet
  h.Collect();
  CHECK(h.State(3) != WorkerState::kUnresponsive);
  CHECK_FALSE(h.Excluded(3));

  for (int k = 0; k < 3; ++k) {
    h.Advance(std::chrono::seconds(1) - Harness::kRowStep);
    h.Row(it++, 0, {1.0, 1.0, 1.0, kSkip});
  }
  REQUIRE(h.now() - last_seen > std::chrono::seconds(5));
  h.engine().Tick(h.now());
  h.Collect();
  CHECK(h.State(3) == WorkerState::kUnresponsive);
  CHECK(h.Transitions(3, WorkerState::kUnresponsive) == 1);
  for (uint32_t r = 0; r < 3; ++r) CHECK(h.State(r) != WorkerState::kUnresponsive);
  CHECK(h.Excluded(3));
  CHECK(ReasonOf(h.engine().membership(), 3) == ExclusionReason::kUnresponsive);
  CHECK(h.engine().Worker(3).exclusion_reason == ExclusionReason::kUnresponsive);
  CHECK(h.engine().View().unresponsive_ranks == 1);
  const uint64_t version = h.engine().membership().version;
  CHECK(version == 1);

  // Rows now complete without rank 3: a slow step of rank 2 counts at once.
  h.Row(it++, 0, {1.0, 1.0, 3.0, kSkip});
  CHECK(h.Counter(2) == 1);
  h.Row(it++, 0, {1.0, 1.0, 3.0, kSkip});
  CHECK(h.Counter(2) == 2);

  // Rank 3 reports again: healthy, counter 0, re-included.
  h.Advance(Harness::kRowStep);
  h.Feed(3, 0, it, 1.0);
  CHECK(h.State(3) == WorkerState::kHealthy);
  CHECK(h.Counter(3) == 0);
  CHECK_FALSE(h.Excluded(3));
  CHECK(h.engine().membership().version == version + 1);
  CHECK(h.engine().View().unresponsive_ranks == 0);
}

TEST_CASE("gate: after a restart a readmission waits until every rank is back",
          "[engine][membership][gate]") {
  PolicyConfig p = DynamicPolicy();
  p.cooldown_iterations = 0;
  Harness h(4, p);
  // A daemon restarting from its state database: rank 3 was out.
  Membership held;
  held.version = 5;
  held.effective_iteration = 100;
  held.excluded = {{3, ExclusionReason::kStraggler, "slow", 90}};
  h.engine().RestoreMembership(held, {}, h.now());
  REQUIRE(h.engine().membership().version == 6);
  REQUIRE(h.Excluded(3));
  // Ranks 0, 1 and 3 reconnect; rank 2 is still in its reconnect backoff.
  for (uint32_t r : {0u, 1u, 3u}) h.engine().Announce(r, h.now());
  CHECK(h.engine().View().detached_ranks == 1);
  // Rank 3 has recovered: its shadow steps are fast.
  h.Rows(120, 20, 1, {1.0, 1.0, kSkip, 1.0});
  REQUIRE(h.State(3) == WorkerState::kHealthy);
  // It would be readmitted, but rank 2 could not hear of it: it would reach
  // the switch iteration still applying version 6 while the others switch.
  CHECK(h.engine().membership().version == 6);
  CHECK(h.Excluded(3));
  CHECK(h.engine().View().membership_withheld);
  REQUIRE(h.Count(EventKind::kMembershipWithheld) == 1);  // once, not per row
  CHECK(h.Of(EventKind::kMembershipWithheld)[0].rank == 2);
  CHECK_THAT(h.Of(EventKind::kMembershipWithheld)[0].message,
             Catch::Contains("no stream speaks for rank 2;"));

  // Rank 2 is back: the readmission goes out, after the progress seen.
  h.engine().Announce(2, h.now());
  h.Collect();
  const Membership& m = h.engine().membership();
  CHECK(m.version == 7);
  CHECK_FALSE(m.IsExcluded(3));
  CHECK(m.effective_iteration >= 139 + m.lead_iterations);
  CHECK_FALSE(h.engine().View().membership_withheld);
  CHECK(h.engine().View().detached_ranks == 0);
}

TEST_CASE("gate: a rank whose stream ended holds changes until it is back or unresponsive",
          "[engine][membership][gate]") {
  PolicyConfig p = DynamicPolicy();
  p.cooldown_iterations = 0;
  p.unresponsive_after_seconds = 5.0;
  p.max_excluded_fraction = 0.5;
  Harness h(4, p);
  for (uint32_t r = 0; r < 4; ++r) h.engine().Announce(r, h.now());
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  h.engine().Detach(2);
  // Rank 3 turns slow while rank 2's stream is gone.
  uint64_t it = 10;
  for (; it < 20; ++it) h.Row(it, 0, {1.0, 1.0, kSkip, 3.0});
  REQUIRE(h.State(3) == WorkerState::kStraggler);
  CHECK(h.engine().membership().version == 0);
  CHECK(h.engine().View().membership_withheld);
  CHECK(h.Count(EventKind::kMembershipWithheld) == 1);

  SECTION("rank 2 reconnects: rank 3 alone goes out") {
    h.engine().Announce(2, h.now());
    h.Collect();
    CHECK(h.engine().membership().version == 1);
    CHECK(ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{3});
  }
  SECTION("rank 2 stays away: once unresponsive it leaves together with rank 3") {
    // The others go on reporting, 1 s per row.
    for (int k = 0; k < 6; ++k) {
      h.Advance(std::chrono::seconds(1) - Harness::kRowStep);
      h.Row(it++, 0, {1.0, 1.0, kSkip, 3.0});
    }
    h.engine().Tick(h.now());
    h.Collect();
    REQUIRE(h.State(2) == WorkerState::kUnresponsive);
    CHECK(h.engine().membership().version == 1);
    CHECK(ReasonOf(h.engine().membership(), 2) == ExclusionReason::kUnresponsive);
    CHECK(ReasonOf(h.engine().membership(), 3) == ExclusionReason::kStraggler);
    CHECK_FALSE(h.engine().View().membership_withheld);
  }
  SECTION("an operator's exclusion of the detached rank waits too") {
    REQUIRE(h.engine().SetOverride(3, RankOverride::kForceInclude, "", h.now()).ok());
    h.Collect();
    REQUIRE(h.engine().SetOverride(2, RankOverride::kForceExclude, "", h.now()).ok());
    h.Collect();
    // Rank 2 would keep issuing collectives on version 0 with the others.
    CHECK(h.engine().membership().version == 0);
    h.engine().Announce(2, h.now());
    h.Collect();
    CHECK(ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{2});
  }
}

TEST_CASE("gate: a rank that never connected holds changes, offline replay is not affected",
          "[engine][membership][gate]") {
  PolicyConfig p = DynamicPolicy();
  p.cooldown_iterations = 0;
  Harness h(4, p);
  SECTION("reports attach their ranks (replay, tests): nothing waits") {
    h.Rows(0, 20, 0, With(Uniform(4, 1.0), 3, 3.0));
    CHECK(h.Excluded(3));
  }
  SECTION("rank 2 never reported nor was announced") {
    h.Rows(0, 20, 0, {1.0, 1.0, kSkip, 3.0});
    REQUIRE(h.State(3) == WorkerState::kStraggler);
    CHECK_FALSE(h.Excluded(3));
    CHECK(h.engine().View().detached_ranks == 1);
    h.engine().Announce(2, h.now());
    CHECK(h.Excluded(3));
  }
}

TEST_CASE("late join: a rank that first reports at iteration 100 takes part from then on",
          "[engine][membership][late]") {
  Harness h(4, CounterOnlyPolicy());
  h.Rows(0, 100, 0, {1.0, 1.0, 1.0, kSkip});
  CHECK(h.State(3) == WorkerState::kPending);
  CHECK_FALSE(h.engine().Progress(3).has_value());
  REQUIRE(h.engine().View().threshold_seconds == Approx(2.0));

  // Rank 3 reports first in row 100.
  h.Advance(Harness::kRowStep);
  h.Feed(3, 0, 100, 1.0);
  for (uint32_t r = 0; r < 3; ++r) h.Feed(r, 0, 100, 1.0);
  CHECK(h.engine().Progress(3) == std::optional<uint64_t>(100));

  // Row 101 now waits for rank 3: rank 1's slow step is judged only when
  // rank 3 has reported too.
  h.Advance(Harness::kRowStep);
  h.Feed(0, 0, 101, 1.0);
  h.Feed(1, 0, 101, 3.0);
  h.Feed(2, 0, 101, 1.0);
  CHECK(h.Counter(1) == 0);
  h.Feed(3, 0, 101, 1.0);
  CHECK(h.Counter(1) == 1);

  // And it is judged in its rows like everyone else.
  h.Rows(102, 5, 0, With(Uniform(4, 1.0), 3, 3.0));
  CHECK(h.Counter(3) == 5);
  CHECK(h.State(3) == WorkerState::kStraggler);
}

TEST_CASE("rows: a rank that misses an iteration does not stall the job beyond the grace",
          "[engine][membership]") {
  Harness h(4, CounterOnlyPolicy());
  h.Rows(0, 5, 0, Uniform(4, 1.0));
  // Iteration 5: rank 3 never reports it; rank 1 is slow.
  h.Row(5, 0, {1.0, 3.0, 1.0, kSkip});
  CHECK(h.Counter(1) == 0);  // the row waits for rank 3
  const uint64_t grace = JobEngine::kRowGraceIterations;
  for (uint64_t i = 6; i < 5 + grace; ++i) h.Row(i, 0, {1.0, 1.0, 1.0, kSkip});
  CHECK(h.Counter(1) == 0);  // nobody is kRowGraceIterations past it yet
  h.Advance(Harness::kRowStep);
  h.Feed(0, 0, 5 + grace, 1.0);  // an active rank at 5 + grace: row 5 is judged
  CHECK(h.Counter(1) == 1);
  // Rank 3's report of iteration 5 after all: late, judged alone, counted
  // (the ranks of the job's first row, which the first report completed
  // while it was the only rank known, were counted so already).
  const uint64_t late = h.engine().View().reports_late_total;
  h.Feed(3, 0, 5, 1.0);
  CHECK(h.engine().View().reports_late_total == late + 1);
  h.Feed(3, 0, 6, 1.0);  // row 6 waits for it still: not late
  CHECK(h.engine().View().reports_late_total == late + 1);
}

}  // namespace
}  // namespace straggler::engine

TEST_CASE("rows: announced ranks are waited for, unannounced ones are not",
          "[engine][membership][rows]") {
  using namespace straggler::engine;
  PolicyConfig p = DynamicPolicy();
  p.profile_iterations = 1;  // the first complete row sets the threshold
  const Time t0{std::chrono::seconds(1)};

  SECTION("announced: the row waits for rank 3, whose time is the fastest") {
    JobEngine job(4, p, t0);
    for (uint32_t r = 0; r < 4; ++r) job.Announce(r, t0);
    job.Ingest(straggler::engine::testutil::MakeReport(0, 0, 0, 1.0), t0);
    job.Ingest(straggler::engine::testutil::MakeReport(1, 0, 0, 0.5), t0);
    job.Ingest(straggler::engine::testutil::MakeReport(2, 0, 0, 0.5), t0);
    CHECK(job.View().threshold_seconds == 0.0);
    job.Ingest(straggler::engine::testutil::MakeReport(3, 0, 0, 0.25), t0);
    CHECK(job.View().threshold_seconds == Approx(0.5));
  }
  SECTION("not announced: the row completes with the ranks that reported") {
    JobEngine job(4, p, t0);
    job.Ingest(straggler::engine::testutil::MakeReport(0, 0, 0, 1.0), t0);
    CHECK(job.View().threshold_seconds == Approx(2.0));
    // A report for the judged row is judged alone, not made into a new row.
    job.Ingest(straggler::engine::testutil::MakeReport(1, 0, 0, 0.25), t0);
    CHECK(job.View().threshold_seconds == Approx(2.0));
  }
}

namespace straggler::engine {
namespace {

// An agent replaying its backlog after a daemon restart sends, in one batch,
// a straggler's recovery and its relapse: the job must not switch sets
// twice for states that are already over (issue 14: v3, v4, v5 in 1 ms).
TEST_CASE("membership: one batch publishes one decision, for the state it ends in",
          "[engine][membership]") {
  PolicyConfig p = DynamicPolicy();
  p.cooldown_iterations = 0;
  const bool batched = GENERATE(false, true);
  testutil::Harness h(8, p);
  std::vector<double> slow = testutil::Uniform(8, 1.0);
  slow[3] = 3.0;
  h.Rows(0, 20, 0, testutil::Uniform(8, 1.0));
  h.Rows(20, 20, 0, slow);
  REQUIRE(testutil::ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{3});
  const uint64_t before = h.engine().membership().version;
  if (batched) h.engine().BeginBatch();
  h.Rows(40, 15, 0, testutil::Uniform(8, 1.0));  // rank 3 recovers...
  h.Rows(55, 15, 0, slow);                        // ...and relapses
  if (batched) h.engine().EndBatch(h.now());
  INFO("batched " << batched);
  CHECK(testutil::ExcludedRanks(h.engine().membership()) == std::vector<uint32_t>{3});
  if (batched) {
    CHECK(h.engine().membership().version == before);  // excluded all along: no version
  } else {
    CHECK(h.engine().membership().version >= before + 2);  // readmitted, excluded again
  }
}

}  // namespace
}  // namespace straggler::engine
