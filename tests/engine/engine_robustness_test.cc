// Cases from review: traces the plain rule handles badly, and protocol edges
// of the membership (lead changes, daemon restarts, re-inclusion).
#include <catch2/catch.hpp>

#include "engine_test_util.h"

using namespace straggler::engine;
using namespace straggler::engine::testutil;

namespace {

std::vector<uint32_t> Excluded(const Membership& m) {
  std::vector<uint32_t> out;
  for (const auto& e : m.excluded) out.push_back(e.rank);
  return out;
}

}  // namespace

TEST_CASE("mixed generations: a fast minority does not blind detection",
          "[engine][dynamic][robustness]") {
  // 3 new GPUs at 1.0 s, 5 old ones at 2.5 s: k x fastest = 2.0 puts the
  // majority above the threshold. The baseline falls back to the median
  // (2.5 s, threshold 5.0 s) instead of re-profiling forever.
  Harness h(8);
  for (uint32_t r = 0; r < 8; ++r) h.engine().Announce(r, h.now());
  std::vector<double> mixed = {1.0, 1.0, 1.0, 2.5, 2.5, 2.5, 2.5, 2.5};
  h.Rows(0, 10, 0, mixed);
  CHECK(h.engine().View().baseline_seconds == Approx(2.5));
  CHECK(h.engine().View().threshold_seconds == Approx(5.0));
  const size_t reprofiles = h.Count(EventKind::kReprofile);
  CHECK(reprofiles == 1);
  h.Rows(10, 20, 0, mixed);
  CHECK(h.Count(EventKind::kReprofile) == reprofiles);  // no flood
  for (uint32_t r = 0; r < 8; ++r) CHECK(h.State(r) == WorkerState::kHealthy);
  // An old GPU that slows 3x is still caught.
  h.Rows(30, 6, 0, With(mixed, 5, 7.5));
  CHECK(h.State(5) == WorkerState::kStraggler);
  for (uint32_t r = 0; r < 8; ++r)
    if (r != 5) CHECK(h.State(r) == WorkerState::kHealthy);
}

TEST_CASE("far ahead: one rank jumping 10^6 iterations moves nothing",
          "[engine][rows][robustness]") {
  Harness h(4);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  const uint64_t highest = h.engine().View().highest_iteration;
  CHECK(h.Send(2, 0, 1'000'000, 1.0).accepted);
  CHECK(h.engine().View().highest_iteration == highest);
  // The others keep forming rows: a slow rank is still detected.
  for (uint64_t i = 10; i < 16; ++i) {
    h.Feed(0, 0, i, 1.0);
    h.Feed(1, 0, i, 3.0);
    h.Feed(2, 0, 1'000'000 + i, 1.0);  // still running far ahead
    h.Feed(3, 0, i, 1.0);
  }
  CHECK(h.State(1) == WorkerState::kStraggler);
  // A membership made now takes effect near the job, not near 10^6.
  CHECK(h.engine().membership().effective_iteration < 100);
}

TEST_CASE("far ahead: the whole job jumping (resume from a checkpoint) restarts the rows",
          "[engine][rows][robustness]") {
  Harness h(4);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  h.Rows(50'000, 10, 0, Uniform(4, 1.0));
  CHECK(h.engine().View().highest_iteration == 50'009);
  h.Rows(50'010, 6, 0, With(Uniform(4, 1.0), 0, 3.0));
  CHECK(h.State(0) == WorkerState::kStraggler);
  CHECK(h.engine().membership().effective_iteration > 50'000);
}

TEST_CASE("lead: a lowered lead counts only from the version that announces it",
          "[engine][membership]") {
  PolicyConfig p = DynamicPolicy();
  p.lead_iterations = 5;
  p.cooldown_iterations = 0;
  Harness h(4, p);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  REQUIRE(h.engine().SetOverride(1, RankOverride::kForceExclude, "", h.now()).ok());
  const Membership v1 = h.engine().membership();
  CHECK(v1.effective_iteration == 9 + 5);
  CHECK(v1.lead_iterations == 5);
  p.lead_iterations = 2;
  REQUIRE(h.engine().SetPolicy(p, h.now()).ok());
  h.Rows(10, 10, 0, Uniform(4, 1.0));  // highest 19
  REQUIRE(h.engine().SetOverride(1, RankOverride::kNone, "", h.now()).ok());
  const Membership v2 = h.engine().membership();
  // Clients holding v1 judge certainty with lead 5: v2 must respect it.
  CHECK(v2.effective_iteration == 19 + 5);
  CHECK(v2.lead_iterations == 2);
  REQUIRE(h.engine().SetOverride(2, RankOverride::kForceExclude, "", h.now()).ok());
  const Membership v3 = h.engine().membership();
  CHECK(v3.effective_iteration == std::max<uint64_t>(19 + 2, v2.effective_iteration + 1));
}

Membership Held(uint64_t version, uint64_t effective, std::vector<ExcludedRank> excluded = {}) {
  Membership m;
  m.version = version;
  m.effective_iteration = effective;
  m.excluded = std::move(excluded);
  return m;
}

TEST_CASE("daemon restart: a client's version floor makes versions keep growing",
          "[engine][membership]") {
  Harness h(4);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  REQUIRE(h.engine().membership().version == 0);
  h.engine().AdoptVersionFloor(Held(7, 100), h.now());
  const Membership& m = h.engine().membership();
  CHECK(m.version == 8);
  CHECK(m.effective_iteration == 101);
  CHECK(m.excluded.empty());
  // A floor below what we have changes nothing.
  h.engine().AdoptVersionFloor(Held(3, 50), h.now());
  CHECK(h.engine().membership().version == 8);
}

TEST_CASE("daemon restart: the floor keeps the held excluded set and follows the hellos' progress",
          "[engine][membership]") {
  Harness h(4);
  // Restarted without a state database: nothing known but what hellos say.
  // The ranks are at iteration 300, far past the held version's 100.
  h.engine().NoteReportedIteration(300);
  h.engine().AdoptVersionFloor(
      Held(7, 100, {{3, ExclusionReason::kStraggler, "slow", 90}}), h.now());
  const Membership m = h.engine().membership();
  CHECK(m.version == 8);
  // After 300, plus the one step a rank not heard from may be ahead, plus
  // the lead: no rank can have been certain of anything there.
  CHECK(m.effective_iteration == 300 + 1 + m.lead_iterations);
  REQUIRE(m.excluded.size() == 1);
  CHECK(m.excluded[0].rank == 3);
  CHECK(m.excluded[0].reason == ExclusionReason::kStraggler);
  // Kept out as a straggler with a full counter, not released blindly.
  CHECK(h.engine().Worker(3).state == WorkerState::kStraggler);

  // A second floor (a client holding a newer version) keeps this engine's
  // own set, whatever the hello says.
  h.engine().AdoptVersionFloor(Held(9, 150, {}), h.now());
  CHECK(h.engine().membership().version == 10);
  REQUIRE(h.engine().membership().excluded.size() == 1);
  CHECK(h.engine().membership().effective_iteration > m.effective_iteration);

  // Later versions also take effect after the hellos' progress (the ranks'
  // streams are back: a change would otherwise wait for them).
  for (uint32_t r = 0; r < 4; ++r) h.engine().Announce(r, h.now());
  h.engine().NoteReportedIteration(400);
  REQUIRE(h.engine().SetOverride(1, RankOverride::kForceExclude, "", h.now()).ok());
  CHECK(h.engine().membership().effective_iteration >= 400 + 1 + m.lead_iterations);
}

TEST_CASE("daemon restart: a forced exclusion known only from a hello creates no override",
          "[engine][membership][security]") {
  // A hello needs no token, so what it says was forced cannot become an
  // operator's override: the rank stays out (the ranks apply that set) but
  // as a straggler, released once its own reports show recovery.
  Harness h(4);
  h.engine().NoteReportedIteration(50);
  h.engine().AdoptVersionFloor(Held(4, 30, {{2, ExclusionReason::kForced, "operator", 20}}),
                               h.now());
  const Membership first = h.engine().membership();
  REQUIRE(first.version == 5);
  REQUIRE(first.IsExcluded(2));
  CHECK(first.excluded[0].reason == ExclusionReason::kStraggler);
  CHECK(h.engine().Worker(2).override == RankOverride::kNone);
  CHECK(h.engine().Worker(2).state == WorkerState::kStraggler);
  // Healthy rows of every rank (rank 2's are shadow steps): it recovers
  // and a later version readmits it. Nobody had to clear an override.
  for (uint32_t r = 0; r < 4; ++r) h.engine().Announce(r, h.now());
  h.Rows(51, 200, 0, Uniform(4, 1.0));
  CHECK(h.State(2) == WorkerState::kHealthy);
  CHECK_FALSE(h.engine().membership().IsExcluded(2));
  CHECK(h.engine().membership().version > first.version);
  CHECK(h.engine().Worker(2).override == RankOverride::kNone);
}

TEST_CASE("daemon restart: a forced exclusion restored with its override stays forced",
          "[engine][membership]") {
  Harness h(4);
  Membership stored = Held(4, 30, {{2, ExclusionReason::kForced, "operator", 20}});
  // The state database restores the override with the membership.
  h.engine().RestoreMembership(stored, {{2, RankOverride::kForceExclude}}, h.now());
  REQUIRE(h.engine().membership().IsExcluded(2));
  CHECK(h.engine().membership().excluded[0].reason == ExclusionReason::kForced);
  CHECK(h.engine().Worker(2).override == RankOverride::kForceExclude);
  for (uint32_t r = 0; r < 4; ++r) h.engine().Announce(r, h.now());
  // Healthy rows of every rank: nothing releases rank 2 but an operator.
  h.Rows(31, 200, 0, Uniform(4, 1.0));
  CHECK(h.engine().membership().IsExcluded(2));
  REQUIRE(h.engine().SetOverride(2, RankOverride::kNone, "", h.now()).ok());
  CHECK_FALSE(h.engine().membership().IsExcluded(2));

  // Stored as forced but with no override (cleared while the release was
  // withheld): not forced again, held as a straggler.
  Harness g(4);
  g.engine().RestoreMembership(stored, {}, g.now());
  REQUIRE(g.engine().membership().IsExcluded(2));
  CHECK(g.engine().Worker(2).override == RankOverride::kNone);
  CHECK(g.engine().membership().excluded[0].reason == ExclusionReason::kStraggler);
}

TEST_CASE("re-inclusion: a rank that ran ahead while excluded is not expected in its past",
          "[engine][membership]") {
  PolicyConfig p = DynamicPolicy();
  p.cooldown_iterations = 0;
  Harness h(4, p);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  REQUIRE(h.engine().SetOverride(3, RankOverride::kForceExclude, "", h.now()).ok());
  const uint64_t e1 = h.engine().membership().effective_iteration;
  h.Rows(10, e1 - 10, 0, Uniform(4, 1.0));
  // Excluded rank 3 runs far ahead on its own (it waits on no collective).
  for (uint64_t i = e1; i < e1 + 40; ++i) h.Feed(3, 0, i, 0.5);
  for (uint64_t i = e1; i < e1 + 5; ++i) {
    h.Feed(0, 0, i, 1.0);
    h.Feed(1, 0, i, 1.0);
    h.Feed(2, 0, i, 1.0);
  }
  REQUIRE(h.engine().SetOverride(3, RankOverride::kNone, "", h.now()).ok());
  const Membership& m = h.engine().membership();
  CHECK(Excluded(m).empty());
  // Rank 3's last report is e1 + 39: once it is acknowledged, rank 3 is
  // certain of its membership up to e1 + 39 + lead - 1 under the version it
  // holds (still excluded there). The readmission must come after that, or
  // rank 3 would stay out at an iteration where the others count it in.
  // (The client's rule: certain of i when progress + lead > i.)
  CHECK(m.effective_iteration >= e1 + 39 + m.lead_iterations);
}

TEST_CASE("rows: forcing out a rank that never reported does not shorten rows",
          "[engine][rows]") {
  PolicyConfig p = DynamicPolicy();
  p.profile_iterations = 1;
  Harness h(4, p);
  for (uint32_t r = 0; r < 3; ++r) h.engine().Announce(r, h.now());
  REQUIRE(h.engine().SetOverride(3, RankOverride::kForceExclude, "", h.now()).ok());
  // Ranks 0..2 are expected; the row must wait for all three.
  h.Feed(0, 0, 0, 1.0);
  h.Feed(1, 0, 0, 1.0);
  CHECK(h.engine().View().threshold_seconds == 0.0);
  h.Feed(2, 0, 0, 0.5);
  CHECK(h.engine().View().threshold_seconds == Approx(1.0));
}

TEST_CASE("mixed generations: an older half of the job is not a set of stragglers",
          "[engine][dynamic][robustness]") {
  // Exactly half the ranks 2x slower for the whole job: "more than half above
  // the threshold" never happens, yet flagging 8 of 16 ranks forever is
  // wrong. The profile falls back to the speed most ranks reach.
  Harness h(16);
  for (uint32_t r = 0; r < 16; ++r) h.engine().Announce(r, h.now());
  std::vector<double> two_gens(16, 1.0);
  for (uint32_t r = 8; r < 16; ++r) two_gens[r] = 2.1;
  h.Rows(0, 40, 0, two_gens);
  for (uint32_t r = 0; r < 16; ++r) CHECK(h.State(r) == WorkerState::kHealthy);
  CHECK(h.engine().View().baseline_seconds == Approx(2.1));
  // A rank of the older generation slowing 3x is still caught.
  h.Rows(40, 6, 0, With(two_gens, 12, 6.3));
  CHECK(h.State(12) == WorkerState::kStraggler);
}

TEST_CASE("few ranks: a straggler present from the first iteration is still found",
          "[engine][dynamic][robustness]") {
  // With fewer than 4 ranks there is no "majority speed" to fall back to: a
  // 2-rank job with one slow rank from the start is a straggler, not two
  // generations.
  Harness h(2);
  for (uint32_t r = 0; r < 2; ++r) h.engine().Announce(r, h.now());
  h.Rows(0, 12, 0, {1.0, 3.0});
  CHECK(h.State(1) == WorkerState::kStraggler);
}
