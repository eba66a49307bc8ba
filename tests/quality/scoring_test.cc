// Scoring: per (rank, iteration) classification against truth, episodes,
// latencies, false positives per 1000. Every expected number is worked out
// by hand in the comments.
#include <catch2/catch.hpp>

#include "straggler/quality/scoring.h"

using namespace straggler::quality;

namespace {
RankMatrix All(uint32_t ranks, uint64_t n) {
  RankMatrix m(ranks, n);
  for (uint32_t r = 0; r < ranks; ++r) m.Fill(r, 0, n, true);
  return m;
}
}  // namespace

TEST_CASE("overlapping truth and flags: TP/FP/FN, latencies, FP per 1000") {
  // One rank, 10 iterations. truth [2,6), flagged [4,8).
  RankMatrix truth(1, 10), flagged(1, 10);
  truth.Fill(0, 2, 6, true);
  flagged.Fill(0, 4, 8, true);
  const Score s = ScoreFlags(truth, flagged, All(1, 10));
  CHECK(s.scored == 10);
  CHECK(s.tp == 2);  // rows 4, 5
  CHECK(s.fp == 2);  // rows 6, 7
  CHECK(s.fn == 2);  // rows 2, 3
  CHECK(s.tn == 4);  // rows 0, 1, 8, 9
  CHECK(*s.precision == Approx(0.5));
  CHECK(*s.recall == Approx(0.5));
  CHECK(*s.f1 == Approx(0.5));
  CHECK(s.fp_per_1000 == Approx(200.0));  // 1000 x 2 / 10
  CHECK(s.episodes == 1);
  CHECK(s.detected == 1);
  REQUIRE(s.detection_latencies == std::vector<uint64_t>{2});  // first flag 4 - onset 2
  CHECK(*s.detection_latency_mean == Approx(2.0));
  CHECK(*s.detection_latency_max == 2);
  CHECK(s.recoverable == 1);
  REQUIRE(s.recovery_latencies == std::vector<uint64_t>{2});  // unflagged at 8 - end 6
  CHECK(s.false_alarms == 0);  // the flag run touches truth
}

TEST_CASE("missed episode, false alarm, not recovered, truth to the end") {
  // Two ranks, 10 iterations.
  // rank 0: truth [3,5), flagged [4,10): detected (latency 1), never unflagged
  //         before the trace ends -> not recovered.
  // rank 1: truth [7,10) never flagged -> missed (and not recoverable);
  //         flagged [0,1) with no truth -> one false alarm.
  RankMatrix truth(2, 10), flagged(2, 10);
  truth.Fill(0, 3, 5, true);
  flagged.Fill(0, 4, 10, true);
  truth.Fill(1, 7, 10, true);
  flagged.Fill(1, 0, 1, true);
  const Score s = ScoreFlags(truth, flagged, All(2, 10));
  CHECK(s.tp == 1);       // r0 row 4
  CHECK(s.fp == 5 + 1);   // r0 rows 5..9, r1 row 0
  CHECK(s.fn == 1 + 3);   // r0 row 3, r1 rows 7..9
  CHECK(s.tn == 20 - 1 - 6 - 4);
  CHECK(*s.precision == Approx(1.0 / 7));
  CHECK(*s.recall == Approx(1.0 / 5));
  CHECK(*s.f1 == Approx(2 * (1.0 / 7) * (1.0 / 5) / (1.0 / 7 + 1.0 / 5)));
  CHECK(s.episodes == 2);
  CHECK(s.detected == 1);
  CHECK(s.missed == 1);
  CHECK(s.recoverable == 1);
  CHECK(s.recovered == 0);
  CHECK(s.not_recovered == 1);
  CHECK_FALSE(s.recovery_latency_mean.has_value());
  CHECK(s.false_alarms == 1);
  CHECK(s.fp_per_1000 == Approx(300.0));  // 1000 x 6 / 20
}

TEST_CASE("unscored cells are not counted, a rank that stops reporting ends its episode") {
  // One rank, 10 iterations; it reports rows 0..5 only. truth [2,8) -> the
  // scored episode is [2,6) and it ends where the reports end, so the flag
  // that stays up cannot be judged as a missing recovery there.
  RankMatrix truth(1, 10), flagged(1, 10), scored(1, 10);
  truth.Fill(0, 2, 8, true);
  flagged.Fill(0, 3, 10, true);
  scored.Fill(0, 0, 6, true);
  const Score s = ScoreFlags(truth, flagged, scored);
  CHECK(s.scored == 6);
  CHECK(s.tp == 3);  // rows 3, 4, 5
  CHECK(s.fn == 1);  // row 2
  CHECK(s.fp == 0);
  CHECK(s.detection_latencies == std::vector<uint64_t>{1});
  CHECK(s.recoverable == 1);
  CHECK(s.not_recovered == 1);  // row 6 is not scored: no unflagged row seen
}

TEST_CASE("relapse: recovery is looked for only before the next episode") {
  // truth [1,3) and [5,7); flagged [1,9): recovery of the first episode is
  // never seen before row 5 -> not recovered; the second recovers at 9 (latency 2).
  RankMatrix truth(1, 12), flagged(1, 12);
  truth.Fill(0, 1, 3, true);
  truth.Fill(0, 5, 7, true);
  flagged.Fill(0, 1, 9, true);
  const Score s = ScoreFlags(truth, flagged, All(1, 12));
  CHECK(s.episodes == 2);
  CHECK(s.detected == 2);
  CHECK(s.detection_latencies == std::vector<uint64_t>{0, 0});
  CHECK(s.not_recovered == 1);
  CHECK(s.recovery_latencies == std::vector<uint64_t>{2});
}

TEST_CASE("no truth, no flags: precision, recall and F1 undefined, zero FP") {
  const Score s = ScoreFlags(RankMatrix(4, 100), RankMatrix(4, 100), All(4, 100));
  CHECK_FALSE(s.precision.has_value());
  CHECK_FALSE(s.recall.has_value());
  CHECK_FALSE(s.f1.has_value());
  CHECK(s.fp_per_1000 == 0.0);
  CHECK(s.tn == 400);
}

TEST_CASE("truth but no flags: recall 0, F1 0, precision undefined") {
  RankMatrix truth(1, 10);
  truth.Fill(0, 0, 5, true);
  const Score s = ScoreFlags(truth, RankMatrix(1, 10), All(1, 10));
  CHECK_FALSE(s.precision.has_value());
  CHECK(*s.recall == 0.0);
  CHECK(*s.f1 == 0.0);
  CHECK(s.missed == 1);
}

TEST_CASE("Intervals lists maximal runs by rank") {
  RankMatrix m(2, 6);
  m.Fill(0, 0, 2, true);
  m.Fill(0, 3, 6, true);
  m.Fill(1, 5, 6, true);
  CHECK(Intervals(m) == std::vector<Interval>{{0, 0, 2}, {0, 3, 6}, {1, 5, 6}});
}
