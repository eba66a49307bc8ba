// The paper's dynamic rule (Kim, Yu, Kim 2023, Algorithm 1) pinned case by
// case: threshold from the per-iteration fastest rank, the bounded counter,
// classification at limit, hysteresis, re-profiling and recovery.
#include <catch2/catch.hpp>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace testutil;  // engine_test_util.h

TEST_CASE("dynamic: threshold = k x mean of the per-iteration fastest rank over the first n rows",
          "[engine][dynamic]") {
  Harness h(4);  // defaults: n = 5, k = 2
  // Row minima 1.0, 1.2, 0.8, 1.0, 1.0 -> baseline 1.0, threshold 2.0. The
  // fastest rank changes from row to row; rank 3 is ~3x slow throughout and
  // must not affect the minimum. (Row 0's minimum is rank 0, which reports
  // first, so the row's minimum is the same whoever is in it.)
  const std::vector<std::vector<double>> rows = {
      {1.0, 1.1, 1.3, 3.0},  // min 1.0 (rank 0)
      {1.4, 1.2, 1.5, 3.6},  // min 1.2 (rank 1)
      {1.1, 0.9, 0.8, 2.4},  // min 0.8 (rank 2)
      {1.0, 1.0, 1.2, 3.0},  // min 1.0
      {1.3, 1.0, 1.1, 3.0},  // min 1.0 (rank 1)
  };
  for (uint64_t i = 0; i < 4; ++i) {
    h.Row(i, 0, rows[i]);
    INFO("after row " << i);
    // No threshold yet, so nothing is judged: even the 3x rank stays at 0.
    CHECK(h.engine().View().threshold_seconds == 0.0);
    for (uint32_t r = 0; r < 4; ++r) CHECK(h.Counter(r) == 0);
  }
  // Row 4 is incomplete until rank 3 reports it.
  h.Advance(Harness::kRowStep);
  for (uint32_t r = 0; r < 3; ++r) h.Feed(r, 0, 4, rows[4][r]);
  CHECK(h.engine().View().threshold_seconds == 0.0);
  CHECK(h.Counter(3) == 0);
  h.Feed(3, 0, 4, rows[4][3]);

  const JobView v = h.engine().View();
  CHECK(v.baseline_seconds == Approx(1.0));
  CHECK(v.threshold_seconds == Approx(2.0));
  // The row that completes the profile is judged at once.
  CHECK(h.Counter(3) == 1);
  CHECK(h.Counter(0) == 0);
  CHECK(h.Counter(1) == 0);
  CHECK(h.Counter(2) == 0);
  CHECK(h.State(3) != WorkerState::kStraggler);
}

TEST_CASE("dynamic: threshold_factor and profile_iterations are honoured", "[engine][dynamic]") {
  PolicyConfig p = DynamicPolicy();
  p.profile_iterations = 3;
  p.threshold_factor = 3.0;
  Harness h(3, p);
  h.Row(0, 0, {0.5, 0.5, 0.5});
  h.Row(1, 0, {0.6, 0.4, 0.9});
  CHECK(h.engine().View().threshold_seconds == 0.0);
  h.Row(2, 0, {0.7, 0.8, 0.6});
  // minima 0.5, 0.4, 0.6 -> baseline 0.5, threshold 1.5
  CHECK(h.engine().View().baseline_seconds == Approx(0.5));
  CHECK(h.engine().View().threshold_seconds == Approx(1.5));
}

TEST_CASE("dynamic: the threshold is re-profiled at every new epoch", "[engine][dynamic]") {
  Harness h(4, CounterOnlyPolicy());
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  REQUIRE(h.engine().View().threshold_seconds == Approx(2.0));

  // Epoch 1: everyone faster (0.8 s: new threshold 1.6); rank 3 at 1.8 lies
  // between the new threshold and the old one.
  const auto epoch1 = With(Uniform(4, 0.8), 3, 1.8);
  for (uint64_t i = 10; i < 14; ++i) {
    h.Row(i, 1, epoch1);
    INFO("row " << i << " is inside the new profile: judged against the old threshold");
    CHECK(h.engine().View().threshold_seconds == Approx(2.0));
    CHECK(h.Counter(3) == 0);
  }
  h.Row(14, 1, epoch1);  // completes the profile: new threshold, judged at once
  CHECK(h.engine().View().epoch == 1);
  CHECK(h.engine().View().baseline_seconds == Approx(0.8));
  CHECK(h.engine().View().threshold_seconds == Approx(1.6));
  CHECK(h.Counter(3) == 1);
  h.Row(15, 1, epoch1);
  CHECK(h.Counter(3) == 2);
  CHECK(h.Counter(0) == 0);
}

TEST_CASE("dynamic: window_iterations re-profiles inside a long epoch", "[engine][dynamic]") {
  for (uint32_t window : {0u, 10u}) {
    PolicyConfig p = CounterOnlyPolicy();
    p.window_iterations = window;
    Harness h(4, p);
    h.Rows(0, 10, 0, Uniform(4, 1.0));
    REQUIRE(h.engine().View().threshold_seconds == Approx(2.0));
    // Same epoch, everyone at 0.8 s (not fast enough for a speed-up re-profile).
    h.Rows(10, 30, 0, Uniform(4, 0.8));
    INFO("window_iterations=" << window);
    if (window == 0) {
      CHECK(h.engine().View().threshold_seconds == Approx(2.0));
      CHECK(h.engine().View().baseline_seconds == Approx(1.0));
    } else {
      CHECK(h.engine().View().threshold_seconds == Approx(1.6));
      CHECK(h.engine().View().baseline_seconds == Approx(0.8));
    }
  }
}

TEST_CASE("counter: +1 above, -1 strictly below, unchanged when equal, bounded to [0, limit]",
          "[engine][dynamic][counter]") {
  Harness h(4, CounterOnlyPolicy());  // limit 5, rejoin_mark 0
  h.Rows(0, 5, 0, Uniform(4, 1.0));
  REQUIRE(h.engine().View().threshold_seconds == 2.0);  // 2 x mean(1,1,1,1,1): exact

  struct Step {
    double t;
    uint32_t counter;
    WorkerState state;
  };
  const auto H = WorkerState::kHealthy;
  const auto S = WorkerState::kStraggler;
  const std::vector<Step> steps = {
      {3.0, 1, H}, {3.0, 2, H}, {2.0, 2, H},  // exactly the threshold: unchanged
      {1.0, 1, H}, {2.0, 1, H}, {1.0, 0, H},
      {1.0, 0, H},                              // never below 0
      {3.0, 1, H}, {3.0, 2, H}, {3.0, 3, H},
      {3.0, 4, H},                              // limit - 1: not yet
      {3.0, 5, S},                              // reaches limit: straggler
      {3.0, 5, S}, {3.0, 5, S},                 // capped at limit
      {1.0, 4, S}, {1.0, 3, S}, {1.0, 2, S},
      {1.0, 1, S},                              // rejoin_mark 0 not reached yet
      {1.0, 0, H},                              // limit fast steps: healthy again
  };
  uint64_t it = 5;
  for (const auto& s : steps) {
    h.Row(it, 0, With(Uniform(4, 1.0), 1, s.t));
    INFO("row " << it << " rank 1 at " << s.t);
    CHECK(h.Counter(1) == s.counter);
    CHECK(h.State(1) == s.state);
    CHECK(h.Counter(0) == 0);
    ++it;
  }
  CHECK(h.engine().Worker(1).limit == 5);
  CHECK(h.Transitions(1, WorkerState::kStraggler) == 1);
  CHECK(h.engine().View().detections_total == 1);
  CHECK(h.engine().View().recoveries_total == 1);
  // Classified but never excluded (exclusion disabled here).
  CHECK(h.engine().membership().version == 0);
}

TEST_CASE("hysteresis: rejoin_mark = limit - 1 rejoins at the first fast step (the paper)",
          "[engine][dynamic][counter]") {
  PolicyConfig p = CounterOnlyPolicy();
  p.rejoin_mark = 4;
  Harness h(4, p);
  h.Rows(0, 5, 0, Uniform(4, 1.0));
  h.Rows(5, 5, 0, With(Uniform(4, 1.0), 1, 3.0));
  REQUIRE(h.State(1) == WorkerState::kStraggler);
  REQUIRE(h.Counter(1) == 5);
  h.Row(10, 0, Uniform(4, 1.0));
  CHECK(h.Counter(1) == 4);
  CHECK(h.State(1) == WorkerState::kHealthy);
}

TEST_CASE("hysteresis: a rank slow 4 of every 5 steps is detected and does not flap",
          "[engine][dynamic][counter]") {
  for (uint32_t mark : {0u, 4u}) {
    PolicyConfig p = CounterOnlyPolicy();
    p.rejoin_mark = mark;
    Harness h(4, p);
    h.Rows(0, 5, 0, Uniform(4, 1.0));
    uint64_t detected_at = 0;
    for (uint64_t k = 0; k < 50; ++k) {
      const bool slow = (k % 5) != 4;  // S S S S F
      h.Row(5 + k, 0, With(Uniform(4, 1.0), 1, slow ? 3.0 : 1.0));
      if (detected_at == 0 && h.State(1) == WorkerState::kStraggler) detected_at = 5 + k;
    }
    INFO("rejoin_mark=" << mark);
    // counter 1 2 3 4 3 4 5: straggler at the 7th step (row 11)
    CHECK(detected_at == 11);
    if (mark == 0) {
      CHECK(h.Flips(1) == 1);
      CHECK(h.State(1) == WorkerState::kStraggler);
    } else {
      // The paper's rule flaps: twice per 5-step cycle after detection.
      CHECK(h.Flips(1) >= 10);
    }
  }
}

TEST_CASE("counter: a healthy rank with rare 3x spikes (1 in 10) is never flagged",
          "[engine][dynamic][counter]") {
  Harness h(4);  // defaults, exclusion on
  h.Rows(0, 5, 0, Uniform(4, 1.0));
  uint32_t max_counter = 0;
  for (uint64_t i = 5; i < 105; ++i) {
    h.Row(i, 0, With(Uniform(4, 1.0), 2, i % 10 == 0 ? 3.0 : 1.0));
    max_counter = std::max(max_counter, h.Counter(2));
  }
  CHECK(max_counter == 1);
  CHECK(h.Transitions(2, WorkerState::kStraggler) == 0);
  CHECK(h.engine().View().detections_total == 0);
  CHECK(h.engine().membership().version == 0);
  CHECK(h.engine().membership().excluded.empty());
}

TEST_CASE("limit_fraction: limit = ceil(fraction x iterations per epoch), never below 2",
          "[engine][dynamic][counter]") {
  PolicyConfig p = DynamicPolicy();
  p.limit = 10;
  p.limit_fraction = 0.025;
  CHECK(p.EffectiveLimit(200) == 5);
  CHECK(p.EffectiveLimit(0) == 10);  // unknown epoch length: `limit`
  CHECK(p.EffectiveLimit(40) == 2);  // ceil(1.0) = 1 -> 2
  CHECK(p.EffectiveLimit(1) == 2);   // ceil(0.025) = 1 -> 2
  CHECK(p.EffectiveLimit(1000) == 25);
  CHECK(p.EffectiveLimit(210) == 6);  // ceil(5.25)
  PolicyConfig plain = DynamicPolicy();
  plain.limit = 7;
  CHECK(plain.EffectiveLimit(200) == 7);  // fraction 0: the count

  SECTION("the engine uses the announced epoch length") {
    Harness h(4, CounterOnlyPolicy(p));
    h.Rows(0, 5, 0, Uniform(4, 1.0));
    CHECK(h.engine().Worker(1).limit == 10);
    h.engine().SetIterationsPerEpoch(200);
    CHECK(h.engine().View().iterations_per_epoch == 200);
    CHECK(h.engine().Worker(1).limit == 5);
    h.Rows(5, 4, 0, With(Uniform(4, 1.0), 1, 3.0));
    CHECK(h.Counter(1) == 4);
    CHECK(h.State(1) == WorkerState::kHealthy);
    h.Row(9, 0, With(Uniform(4, 1.0), 1, 3.0));
    CHECK(h.Counter(1) == 5);
    CHECK(h.State(1) == WorkerState::kStraggler);
    h.Row(10, 0, With(Uniform(4, 1.0), 1, 3.0));
    CHECK(h.Counter(1) == 5);  // capped at the effective limit
  }
}

TEST_CASE("global shift: all ranks 3x slower at once flags no one and re-profiles",
          "[engine][dynamic][shift]") {
  Harness h(4);
  h.Rows(0, 5, 0, Uniform(4, 1.0));
  REQUIRE(h.engine().View().threshold_seconds == Approx(2.0));
  h.events.clear();

  h.Row(5, 0, Uniform(4, 3.0));
  for (uint32_t r = 0; r < 4; ++r) CHECK(h.Counter(r) == 0);
  // The new profile runs over the next n rows, judged against the old threshold.
  h.Rows(6, 4, 0, Uniform(4, 3.0));
  CHECK(h.engine().View().threshold_seconds == Approx(2.0));
  for (uint32_t r = 0; r < 4; ++r) CHECK(h.Counter(r) == 0);
  h.Row(10, 0, Uniform(4, 3.0));
  CHECK(h.Count(EventKind::kReprofile) >= 1);
  CHECK(h.engine().View().baseline_seconds == Approx(3.0));
  CHECK(h.engine().View().threshold_seconds == Approx(6.0));
  for (uint32_t r = 0; r < 4; ++r) {
    CHECK(h.Counter(r) == 0);
    CHECK(h.State(r) != WorkerState::kStraggler);
  }
  CHECK(h.engine().View().detections_total == 0);
  CHECK(h.engine().membership().version == 0);

  // Against the new speed, a rank 3x slower (9 s) is a straggler after limit rows.
  h.Rows(11, 4, 0, With(Uniform(4, 3.0), 2, 9.0));
  CHECK(h.Counter(2) == 4);
  CHECK(h.State(2) == WorkerState::kHealthy);
  h.Row(15, 0, With(Uniform(4, 3.0), 2, 9.0));
  CHECK(h.State(2) == WorkerState::kStraggler);
}

TEST_CASE("speed-up: a job that became much faster re-profiles and still finds stragglers",
          "[engine][dynamic][shift]") {
  Harness h(4);
  h.Rows(0, 5, 0, Uniform(4, 1.0));
  REQUIRE(h.engine().View().threshold_seconds == Approx(2.0));
  h.events.clear();
  // Everyone 3.3x faster: row minimum 0.3 < baseline / kSpeedupRatio for
  // kSpeedupRows rows and more; enough rows for a full new profile.
  const uint64_t fast_rows =
      JobEngine::kSpeedupRows + DynamicPolicy().profile_iterations + 4;
  h.Rows(5, fast_rows, 0, Uniform(4, 0.3));
  CHECK(h.Count(EventKind::kReprofile) >= 1);
  CHECK(h.engine().View().baseline_seconds == Approx(0.3));
  CHECK(h.engine().View().threshold_seconds == Approx(0.6));
  for (uint32_t r = 0; r < 4; ++r) CHECK(h.Counter(r) == 0);

  // 3x the new speed (0.9 s) is below the stale 2.0 s threshold but a straggler now.
  uint64_t it = 5 + fast_rows;
  for (int k = 0; k < 5; ++k) h.Row(it++, 0, With(Uniform(4, 0.3), 1, 0.9));
  CHECK(h.Counter(1) == 5);
  CHECK(h.State(1) == WorkerState::kStraggler);
}

TEST_CASE("shadow recovery: an excluded straggler is judged on its own reports and rejoins",
          "[engine][dynamic][recovery]") {
  Harness h(4);  // defaults: shadow recovery, limit 5, rejoin_mark 0
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  h.Rows(10, 4, 0, With(Uniform(4, 1.0), 3, 3.0));
  CHECK(h.Counter(3) == 4);
  CHECK_FALSE(h.Excluded(3));
  h.Row(14, 0, With(Uniform(4, 1.0), 3, 3.0));
  REQUIRE(h.State(3) == WorkerState::kStraggler);
  REQUIRE(h.Excluded(3));
  CHECK(ReasonOf(h.engine().membership(), 3) == ExclusionReason::kStraggler);
  CHECK(h.engine().membership().version == 1);
  CHECK(h.engine().Worker(3).excluded);
  CHECK(h.engine().Worker(3).exclusion_reason == ExclusionReason::kStraggler);
  CHECK(h.engine().View().detections_total == 1);
  CHECK(h.engine().View().excluded_ranks == 1);
  CHECK(h.engine().View().straggler_ranks == 1);
  CHECK(h.engine().View().active_ranks == 3);

  // Rank 3 keeps computing at its own (slower) pace; the others run 3
  // iterations for each of its iterations, and their rows no longer wait for it.
  uint64_t others = 15;
  auto others_rows = [&](double rank0) {
    for (int k = 0; k < 3; ++k) {
      h.Row(others, 0, {rank0, 1.0, 1.0, kSkip});
      rank0 = 1.0;
      ++others;
    }
  };
  uint64_t own = 15;
  for (int k = 0; k < 5; ++k) {  // still slow
    h.Feed(3, 0, own++, 3.0);
    CHECK(h.Counter(3) == 5);
    others_rows(1.0);
  }
  // Rows complete without the excluded rank: a slow step of rank 0 counts at once.
  h.Row(others++, 0, {3.0, 1.0, 1.0, kSkip});
  CHECK(h.Counter(0) == 1);

  for (uint32_t expect = 4; expect >= 1; --expect) {  // recovering
    h.Feed(3, 0, own++, 1.0);
    INFO("fast report " << (5 - expect));
    CHECK(h.Counter(3) == expect);
    CHECK(h.State(3) == WorkerState::kStraggler);
    CHECK(h.Excluded(3));
    others_rows(1.0);
  }
  h.Feed(3, 0, own++, 1.0);  // 5th fast report: counter 0 = rejoin_mark
  CHECK(h.Counter(3) == 0);
  CHECK(h.State(3) == WorkerState::kHealthy);
  CHECK_FALSE(h.Excluded(3));
  CHECK(h.engine().membership().version == 2);
  CHECK(h.engine().membership().excluded.empty());
  CHECK(h.engine().View().recoveries_total == 1);
  CHECK(h.engine().View().detections_total == 1);
  CHECK(h.Transitions(3, WorkerState::kHealthy) >= 1);
}

TEST_CASE("probation recovery: excluded stragglers rejoin for the first n rows of an epoch",
          "[engine][dynamic][recovery]") {
  PolicyConfig p = DynamicPolicy();
  p.recovery = RecoveryMode::kProbation;
  Harness h(4, p);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  h.Rows(10, 10, 0, With(Uniform(4, 1.0), 3, 3.0));
  REQUIRE(h.Excluded(3));
  REQUIRE(ReasonOf(h.engine().membership(), 3) == ExclusionReason::kStraggler);

  SECTION("still slow: excluded again when the probation ends") {
    h.Row(20, 1, With(Uniform(4, 1.0), 3, 3.0));
    CHECK_FALSE(h.Excluded(3));  // re-included for the probation
    const uint64_t reincluded = h.engine().membership().version;
    // The probation lasts profile_iterations iterations; the header leaves
    // open whether they count from the epoch's first row or from the
    // re-inclusion's effective_iteration (lead 3), so allow for both.
    h.Rows(21, 11, 1, With(Uniform(4, 1.0), 3, 3.0));
    CHECK(h.engine().membership().version == reincluded + 1);
    CHECK(h.Excluded(3));
    CHECK(ReasonOf(h.engine().membership(), 3) == ExclusionReason::kProbationEnd);
    CHECK(h.State(3) == WorkerState::kStraggler);
  }
  SECTION("recovered: stays in") {
    h.Row(20, 1, Uniform(4, 1.0));
    CHECK_FALSE(h.Excluded(3));
    h.Rows(21, 7, 1, Uniform(4, 1.0));
    CHECK_FALSE(h.Excluded(3));
    CHECK(h.State(3) == WorkerState::kHealthy);
    CHECK(h.Counter(3) == 0);
    CHECK(h.engine().View().recoveries_total == 1);
  }
}

}  // namespace
}  // namespace straggler::engine

TEST_CASE("dynamic: detection latency counts from the first slow step of the episode",
          "[engine][dynamic][events]") {
  using namespace straggler::engine::testutil;
  Harness h(4);
  h.Rows(0, 10, 0, Uniform(4, 1.0));
  h.Rows(10, 5, 0, With(Uniform(4, 1.0), 2, 3.0));  // limit 5: detected at iteration 14
  REQUIRE(h.State(2) == straggler::engine::WorkerState::kStraggler);
  const auto changes = h.Of(straggler::engine::EventKind::kStateChange, 2);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].iteration == 14);
  CHECK(changes[0].evidence.latency_iterations == 5);
}
