// Issue 17's criteria (criteria.h) and flap counting (scoring.h) on small
// hand-made traces whose outcome is worked out in the comments: deadlines of
// 5 rows at >= 2x, 10 at >= 1.3x, "by 1.5x" for a ramp, onsets not before
// the first profile, false alarms and flaps.
#include <catch2/catch.hpp>

#include "straggler/quality/criteria.h"
#include "straggler/quality/scoring.h"

using namespace straggler::quality;

namespace {

// A trace of `ranks` x `rows` that every rank reports, truth factor 1.
Trace Blank(uint32_t ranks, uint64_t rows) {
  Trace t;
  t.ranks = ranks;
  t.iterations = rows;
  t.first_iteration = 100;  // messages name iterations, not rows
  t.compute.assign(static_cast<size_t>(ranks) * rows, 1.0);
  t.has_truth = true;
  t.truth = RankMatrix(ranks, rows);
  t.ramping = RankMatrix(ranks, rows);
  t.truth_factor.assign(static_cast<size_t>(ranks) * rows, 1.0f);
  return t;
}
// Rank `r` a straggler of `factor` over rows [from, to).
void Slow(Trace& t, uint32_t r, uint64_t from, uint64_t to, float factor) {
  for (uint64_t i = from; i < to; ++i) {
    t.truth.set(r, i, true);
    t.truth_factor[static_cast<size_t>(i) * t.ranks + r] = factor;
  }
}

}  // namespace

TEST_CASE("criteria: 2x within 5 rows, 1.3x within 10, an episode below 1.3 has no deadline") {
  Trace t = Blank(3, 60);
  Slow(t, 0, 10, 40, 2.0f);   // deadline 15
  Slow(t, 1, 10, 40, 1.3f);   // deadline 20
  Slow(t, 2, 10, 40, 1.25f);  // truth (a scenario may set truth_min_factor lower), no deadline
  RankMatrix in_time(3, 60);
  in_time.Fill(0, 15, 42, true);
  in_time.Fill(1, 20, 40, true);
  Criteria c = CheckCriteria(t, in_time, 5);
  CHECK(c.pass());
  CHECK(c.episodes == 2);
  CHECK(c.in_time == 2);
  CHECK(c.Summary() == "pass");

  RankMatrix late(3, 60);
  late.Fill(0, 16, 40, true);  // one row past 15
  late.Fill(1, 21, 40, true);  // one row past 20
  c = CheckCriteria(t, late, 5);
  CHECK_FALSE(c.pass());
  CHECK(c.late == 2);
  REQUIRE(c.failures.size() == 2);
  CHECK(c.failures[0] == "rank 0 [110, 140) 2.00x: flagged at 116, deadline 115");
  CHECK(c.Summary() == "FAIL: late 2, missed 0, false alarms 0, flaps 0, stuck 0");

  c = CheckCriteria(t, RankMatrix(3, 60), 5);
  CHECK(c.missed == 2);
  CHECK(c.failures[1] == "rank 1 [110, 140) 1.30x: never flagged, deadline 120");
}

TEST_CASE("criteria: onsets count from the end of the first profile") {
  // Truth from row 0; profile of 5 rows: onset 5, 2x deadline 10.
  Trace t = Blank(2, 30);
  Slow(t, 1, 0, 20, 3.0f);
  RankMatrix f(2, 30);
  f.Fill(1, 10, 20, true);
  CHECK(CheckCriteria(t, f, 5).pass());
  CHECK(CheckCriteria(t, f, 0).late == 1);  // counted from row 0: deadline 5
  // An episode over before the profile ends is not judged.
  Trace early = Blank(2, 30);
  Slow(early, 0, 0, 4, 3.0f);
  CHECK(CheckCriteria(early, RankMatrix(2, 30), 5).episodes == 0);
}

TEST_CASE("criteria: a ramp must be flagged by the row it reaches 1.5x") {
  // Rank 0 ramping over rows [10, 30): factor 1.3 at row 10 rising 0.01 a
  // row, 1.5 from row 30 on (held): deadline 30, not the 10 + 10 = 20 of a
  // step to 1.3x.
  Trace t = Blank(1, 50);
  for (uint64_t i = 10; i < 50; ++i) {
    const float f = i < 30 ? 1.3f + 0.01f * static_cast<float>(i - 10) : 1.5f;
    Slow(t, 0, i, i + 1, f);
    if (i < 30) t.ramping.set(0, i, true);
  }
  RankMatrix f(1, 50);
  f.Fill(0, 29, 50, true);  // row 29 (1.49x): before 1.5x, in time; 10 + 10 = 20 would fail
  CHECK(CheckCriteria(t, f, 5).pass());
  RankMatrix later(1, 50);
  later.Fill(0, 31, 50, true);
  const Criteria c = CheckCriteria(t, later, 5);
  CHECK(c.late == 1);
  CHECK(c.failures[0] == "rank 0 [110, 150) 1.30x: flagged at 131, deadline 130");
}

TEST_CASE("criteria: a ramp held below 1.5x is due 10 rows after it stops rising") {
  Trace t = Blank(1, 50);
  for (uint64_t i = 10; i < 50; ++i) {
    Slow(t, 0, i, i + 1, i < 20 ? 1.3f + 0.01f * static_cast<float>(i - 10) : 1.4f);
    if (i < 20) t.ramping.set(0, i, true);
  }
  RankMatrix f(1, 50);
  f.Fill(0, 30, 50, true);  // ramp stops at row 20: deadline 30
  CHECK(CheckCriteria(t, f, 5).pass());
  f.set(0, 30, false);
  CHECK(CheckCriteria(t, f, 5).late == 1);
}

TEST_CASE("criteria and scoring: false alarms and flaps") {
  Trace t = Blank(2, 40);
  Slow(t, 0, 10, 30, 2.0f);
  RankMatrix f(2, 40);
  // Rank 0 (truth 10-29): flagged 12-15, dropped 16-17, flagged 18-31 (a
  // flap), then 36-37 outside the episode (a false alarm: it touches no
  // truth). Rank 1: flagged 5-6 (a false alarm).
  f.Fill(0, 12, 16, true);
  f.Fill(0, 18, 32, true);
  f.Fill(0, 36, 38, true);
  f.Fill(1, 5, 7, true);
  const Criteria c = CheckCriteria(t, f, 5);
  CHECK(c.in_time == 1);  // first flag 12 <= 15
  CHECK(c.flaps == 1);
  CHECK(c.false_alarms == 2);
  CHECK_FALSE(c.pass());
  RankMatrix all(2, 40);
  all.Fill(0, 0, 40, true);
  all.Fill(1, 0, 40, true);
  const Score s = ScoreFlags(t.truth, f, all);
  CHECK(s.flaps == 1);
  CHECK(s.false_alarms == 2);
  // A flag that outlasts its episode is recovery latency, not an alarm.
  RankMatrix lingering(2, 40);
  lingering.Fill(0, 11, 35, true);
  CHECK(CheckCriteria(t, lingering, 5).pass());
}

TEST_CASE("criteria: a ramp whose truth starts at 1.5x is due by the step rule, not at once") {
  // truth_min_factor 1.5: the episode starts where the ramp reaches 1.5x
  // (row 10), rising to 2x at row 30; due 10 rows after its onset, as a step
  // to 1.5x would be, not at its first row.
  Trace t = Blank(1, 50);
  for (uint64_t i = 10; i < 50; ++i) {
    Slow(t, 0, i, i + 1, i < 30 ? 1.5f + 0.025f * static_cast<float>(i - 10) : 2.0f);
    if (i < 30) t.ramping.set(0, i, true);
  }
  RankMatrix f(1, 50);
  f.Fill(0, 20, 50, true);
  CHECK(CheckCriteria(t, f, 5).pass());
  f.set(0, 20, false);
  CHECK(CheckCriteria(t, f, 5).late == 1);
}

TEST_CASE("criteria: no rank below 1.25x stays flagged past its stretch plus the exit window") {
  // Rank 0: a 3x episode over rows [10, 40), then 1.1x for good (truth factor
  // only, no truth: below the scenario's truth_min_factor). Rank 1: 1.08x
  // throughout, with a stretch at 1.18x over [50, 60) (truth, as with
  // truth_min_factor 1.15).
  Trace t = Blank(2, 200);
  Slow(t, 0, 10, 40, 3.0f);
  for (uint64_t i = 40; i < 200; ++i) t.truth_factor[static_cast<size_t>(i) * t.ranks + 0] = 1.1f;
  for (uint64_t i = 0; i < 200; ++i) t.truth_factor[static_cast<size_t>(i) * t.ranks + 1] = 1.08f;
  Slow(t, 1, 50, 60, 1.18f);

  // Released within the exit window of the stretch's end (rows 39 and 59 are
  // the last stretch rows): the flags may run to row 39 + 30 and 59 + 30.
  RankMatrix released(2, 200);
  released.Fill(0, 14, 39 + kExitWindowRows + 1, true);
  released.Fill(1, 55, 59 + kExitWindowRows + 1, true);
  Criteria c = CheckCriteria(t, released, 5);
  CHECK(c.stuck == 0);
  CHECK(c.pass());

  // One row more each: stuck, once per flag run, named with the row it was
  // still flagged at and where its stretch ended.
  RankMatrix held(2, 200);
  held.Fill(0, 14, 39 + kExitWindowRows + 2, true);
  held.Fill(1, 55, 200, true);
  c = CheckCriteria(t, held, 5);
  CHECK(c.stuck == 2);
  CHECK_FALSE(c.pass());
  REQUIRE(c.failures.size() == 2);
  CHECK(c.failures[0] ==
        "rank 0 still a straggler at 1.10x at 170, 31 rows after its stretch at 139 (exit "
        "window 30)");
  CHECK(c.failures[1] ==
        "rank 1 still a straggler at 1.08x at 190, 31 rows after its stretch at 159 (exit "
        "window 30)");

  // A flag on a steady 1.08x rank that never had a stretch: the window runs
  // from the flag (and it is a false alarm too).
  Trace steady = Blank(1, 100);
  for (auto& f : steady.truth_factor) f = 1.08f;
  RankMatrix flag(1, 100);
  flag.Fill(0, 20, 100, true);
  c = CheckCriteria(steady, flag, 5);
  CHECK(c.stuck == 1);
  CHECK(c.false_alarms == 1);
  CHECK(c.failures.back() ==
        "rank 0 still a straggler at 1.08x at 151, 31 rows after its flag at 120 (exit window 30)");
}

TEST_CASE("criteria: a scenario's cause - each detection of a true episode must have it") {
  Trace t = Blank(4, 40);
  Slow(t, 1, 10, 30, 2.0f);
  RankMatrix flagged(4, 40);
  flagged.Fill(1, 12, 30, true);
  flagged.Fill(2, 20, 22, true);  // a false alarm: its cause is not the point
  std::vector<std::vector<uint64_t>> at = {{}, {112}, {120}, {}};
  std::vector<std::vector<std::string>> causes = {{}, {"compute"}, {"compute"}, {}};
  // No cause named: not checked, and the JSON says nothing of it.
  Criteria c = CheckCriteria(t, flagged, 5);
  CheckCauses(t, at, causes, c);
  CHECK_FALSE(c.cause_checked);
  CHECK(c.wrong_cause == 0);
  t.expected_cause = "input_pipeline";
  c = CheckCriteria(t, flagged, 5);
  CheckCauses(t, at, causes, c);
  CHECK(c.cause_checked);
  CHECK(c.wrong_cause == 1);  // rank 1's; rank 2's detection is of no true episode
  CHECK_FALSE(c.pass());
  CHECK(c.failures.back() == "rank 1 detected at 112: likely cause compute, expected input_pipeline");
  CHECK(c.Summary() == "FAIL: late 0, missed 0, false alarms 1, flaps 0, stuck 0, wrong cause 1");
  causes[1][0] = "input_pipeline";
  c = CheckCriteria(t, flagged, 5);
  CheckCauses(t, at, causes, c);
  CHECK(c.wrong_cause == 0);
  // A run without causes (a reference rule) is not checked.
  c = CheckCriteria(t, flagged, 5);
  CheckCauses(t, at, {}, c);
  CHECK_FALSE(c.cause_checked);
}
