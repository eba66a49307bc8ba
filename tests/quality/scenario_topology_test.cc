// Scenario features of issue 17 (scenarios/README.md): declared topology
// (a Megatron-style layout or explicit entries) with by-design costs, ground
// truth relative to a rank's peers, data-dependent variation, periodic and
// ranged spikes, global patterns (checkpoint steps), warm-up and late join.
// Every expected number is worked out by hand in the comments.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "straggler/quality/scenario.h"

using namespace straggler::quality;

namespace {

// Noiseless: every time is exactly base x the effects.
std::string Base(int ranks, int iterations = 40) {
  return "name: t\nranks: " + std::to_string(ranks) + "\niterations: " +
         std::to_string(iterations) + "\nbase_seconds: 1.0\nnoise: 0.0\nseed: 7\n";
}
Scenario Must(const std::string& text) {
  auto s = ParseScenario(text, "t.yaml");
  INFO(s.status().message());
  REQUIRE(s.ok());
  return *s;
}
std::string Error(const std::string& text) {
  auto s = ParseScenario(text, "t.yaml");
  REQUIRE_FALSE(s.ok());
  return std::string(s.status().message());
}

}  // namespace

TEST_CASE("scenario topology: a Megatron layout names each rank's stage and replica, stage_cost") {
  // 4 replicas x 2 stages x 2 tensor, default order tp-cp-ep-dp-pp:
  // rank = t + 2 (r + 4 s): rank 9 = t1 + 2 (r0 + 4 s1) -> stage1, replica 0;
  // rank 6 = t0 + 2 (r3 + 0) -> stage0, replica 3.
  const Scenario s = Must(Base(16) +
                          "topology: {replicas: 4, stages: 2, tensor: 2, stage_cost: [1, 1.6]}\n");
  REQUIRE(s.topology.size() == 16);
  CHECK(s.topology[9].peer_group == "stage1");
  CHECK(s.topology[9].replica == 0u);
  CHECK(s.topology[6].peer_group == "stage0");
  CHECK(s.topology[6].replica == 3u);
  const Trace t = Generate(s);
  CHECK(t.peer_group[9] == "stage1");
  CHECK(t.replica[6] == 3u);
  CHECK(t.At(0, 6) == 1.0);
  CHECK(t.At(0, 9) == Approx(1.6));  // by design: not a straggler
  CHECK(t.truth.Count() == 0);

  // The older order tp-pp-dp: rank = t + 2 (s + 2 r): rank 6 = t0 + 2 (s1 + 2 r1).
  const Scenario o = Must(Base(8) + "topology: {replicas: 2, stages: 2, tensor: 2, order: tp-pp-dp}\n");
  CHECK(o.topology[6].peer_group == "stage1");
  CHECK(o.topology[6].replica == 1u);
}

TEST_CASE("scenario topology: explicit entries with gpu_model and cost, others keep defaults") {
  const Scenario s = Must(Base(6) +
                          "topology:\n"
                          "  - {ranks: [\"0-2\"], peer_group: a, gpu_model: H100}\n"
                          "  - {rank: 4, peer_group: b, replica: 1, gpu_model: A100, cost: 2}\n");
  CHECK(s.topology[1].gpu_model == "H100");
  CHECK_FALSE(s.topology[1].replica.has_value());
  CHECK(s.topology[3].peer_group.empty());
  CHECK(s.topology[4].replica == 1u);
  const Trace t = Generate(s);
  CHECK(t.gpu_model[4] == "A100");
  CHECK(t.At(3, 4) == 2.0);
  CHECK(t.At(3, 5) == 1.0);
}

TEST_CASE("scenario topology: errors name the value") {
  CHECK_THAT(Error(Base(12) + "topology: {replicas: 4, stages: 2, tensor: 2}\n"),
             Catch::Contains("is 16 ranks, but ranks=12"));
  CHECK_THAT(Error(Base(4) + "topology: {replicas: 2, stages: 2, stage_cost: [1]}\n"),
             Catch::Contains("one factor per stage (2)"));
  CHECK_THAT(Error(Base(4) + "topology: {replicas: 2, stages: 2, stage_cost: [1, 0]}\n"),
             Catch::Contains("stage_cost[1]=0 must be > 0"));
  CHECK_THAT(Error(Base(4) + "topology: {replicas: 2, stages: 2, order: tp-xx}\n"),
             Catch::Contains("xx"));
  CHECK_THAT(Error(Base(4) + "topology: {replicas: 4, shards: 2}\n"),
             Catch::Contains("unknown key 'shards' in topology"));
  CHECK_THAT(Error(Base(4) + "topology:\n  - {rank: 1, peer_group: \"stage 1\"}\n"),
             Catch::Contains("peer_group 'stage 1' has ' ' at byte 5"));
  CHECK_THAT(Error(Base(4) + "topology:\n  - {rank: 1, replica: 4}\n"),
             Catch::Contains("replica=4 must be below ranks=4"));
  CHECK_THAT(Error(Base(4) + "topology:\n  - {rank: 1, cost: -1}\n"),
             Catch::Contains("cost=-1 must be > 0"));
}

TEST_CASE("scenario truth: relative to the rank's peers (group and GPU model)") {
  // Two groups of 3: group a all slowed 2x (a group-wide slowdown, lower
  // median 2: truth 1 for each), group b's rank 5 alone 2x (median 1: truth 2).
  const Trace t = Generate(Must(Base(6) +
                                "topology:\n  - {ranks: [\"0-2\"], peer_group: a}\n"
                                "  - {ranks: [\"3-5\"], peer_group: b}\n"
                                "effects:\n  - {type: slow, ranks: [\"0-2\"], factor: 2}\n"
                                "  - {type: slow, rank: 5, factor: 2}\n"));
  CHECK(Intervals(t.truth) == std::vector<Interval>{{5, 0, 40}});
  CHECK(t.TruthFactorAt(3, 0) == Approx(1.0));
  CHECK(t.TruthFactorAt(3, 5) == Approx(2.0));

  // Half a group slowed: the lower median (1 of {1, 1, 2, 2}) keeps both stragglers.
  const Trace half = Generate(Must(Base(4) + "effects:\n  - {type: slow, ranks: [2, 3], factor: 2}\n"));
  CHECK(half.truth.Count() == 80);

  // Same group name, other GPU model: not peers. A100 ranks 3-5 slowed 1.5x
  // as a generation-wide `slow` are judged among themselves: no truth.
  const Trace gen = Generate(Must(Base(6) +
                                  "topology:\n  - {ranks: [\"0-2\"], gpu_model: H100}\n"
                                  "  - {ranks: [\"3-5\"], gpu_model: A100}\n"
                                  "effects:\n  - {type: slow, ranks: [\"3-5\"], factor: 1.5}\n"));
  CHECK(gen.truth.Count() == 0);
}

TEST_CASE("scenario truth: groups of 1 and 2 judge a rank by its own factor") {
  // 1 replica x 2 stages x 1: groups of 1. Rank 1 at 1.5x: own factor 1.5.
  const Trace one = Generate(Must(Base(2) + "topology: {stages: 2}\n"
                                            "effects:\n  - {type: slow, rank: 1, factor: 1.5}\n"));
  CHECK(Intervals(one.truth) == std::vector<Interval>{{1, 0, 40}});
  // Groups of 2 (2 replicas x 2 stages): a ramp 1 -> 2 over [0, 20) on rank 3
  // reaches 1.5 at i = 10 (its peer rank 1 stays 1), and is ramping until 20.
  const Trace two = Generate(Must(
      Base(4) + "topology: {replicas: 2, stages: 2}\n"
                "effects:\n  - {type: ramp, rank: 3, from: 0, to: 20, end_factor: 2, hold_until: 30}\n"));
  CHECK(Intervals(two.truth) == std::vector<Interval>{{3, 10, 30}});
  CHECK(two.ramping.at(3, 19));
  CHECK_FALSE(two.ramping.at(3, 20));
  CHECK_FALSE(two.ramping.at(1, 5));
}

TEST_CASE("scenario: variation multiplies each step by uniform(1 - a, 1 + a), seeded") {
  const std::string text = Base(4, 2000) + "variation: 0.3\n";
  const Trace t = Generate(Must(text));
  double lo = 2, hi = 0, sum = 0;
  for (double v : t.compute) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  CHECK(lo >= 0.7);
  CHECK(hi <= 1.3);
  CHECK(lo < 0.71);   // 8000 draws fill the range
  CHECK(hi > 1.29);
  CHECK(sum / t.compute.size() == Approx(1.0).margin(0.01));
  CHECK(Generate(Must(text)).compute == t.compute);
  CHECK(t.truth.Count() == 0);
  CHECK_THAT(Error(Base(4) + "variation: 1\n"), Catch::Contains("variation=1 must be in [0, 1)"));
}

TEST_CASE("scenario: periodic spikes, ranged spike factors") {
  // every 10 from offset 3 on rank 1: rows 3, 13, 23, 33 at 6x.
  const Trace p = Generate(Must(
      Base(4) + "effects:\n  - {type: spike, rank: 1, factor: 6, every: 10, offset: 3}\n"));
  for (uint64_t i = 0; i < 40; ++i) CHECK(p.At(i, 1) == (i % 10 == 3 ? 6.0 : 1.0));
  CHECK(p.truth.Count() == 0);
  // Ranged: every spike in [5, 8], some above 5.
  const Trace r = Generate(Must(
      Base(4, 400) + "effects:\n  - {type: spike, ranks: all, factor: 5, max_factor: 8, "
                     "probability: 0.05}\n"));
  int spikes = 0;
  bool above = false;
  for (double v : r.compute)
    if (v > 1.0) {
      ++spikes;
      CHECK(v >= 5.0);
      CHECK(v <= 8.0);
      above = above || v > 5.5;
    }
  CHECK(spikes > 40);  // 1600 steps x 0.05 = 80 expected
  CHECK(spikes < 130);
  CHECK(above);
  CHECK_THAT(Error(Base(4) + "effects:\n  - {type: spike, rank: 1, factor: 6}\n"),
             Catch::Contains("needs exactly one of `probability`"));
  CHECK_THAT(Error(Base(4) + "effects:\n  - {type: spike, rank: 1, factor: 6, every: 0}\n"),
             Catch::Contains("every=0 must be >= 1"));
  CHECK_THAT(Error(Base(4) + "effects:\n  - {type: spike, rank: 1, factor: 6, max_factor: 5, "
                             "probability: 0.1}\n"),
             Catch::Contains("max_factor=5 must be >= factor=6"));
}

TEST_CASE("scenario: global pattern (checkpoint steps) and warm-up slow every rank, not truth") {
  const Trace c = Generate(Must(
      Base(4) + "effects:\n  - {type: global, factor: 8, from: 9, pattern: 1/10}\n"));
  CHECK(c.At(9, 0) == 8.0);
  CHECK(c.At(19, 3) == 8.0);
  CHECK(c.At(10, 0) == 1.0);
  CHECK(c.At(8, 0) == 1.0);
  // constant 3x for 5 iterations, times linear 4x -> 1 over 10: row 0: 3 x 4,
  // row 5: 1 x (4 - 3 x 0.5) = 2.5, row 10 on: 1.
  const Trace w = Generate(Must(Base(4) + "effects:\n  - {type: warmup, iterations: 5, factor: 3}\n"
                                          "  - {type: warmup, iterations: 10, factor: 4, "
                                          "shape: linear}\n"));
  CHECK(w.At(0, 2) == Approx(12.0));
  CHECK(w.At(5, 2) == Approx(2.5));
  CHECK(w.At(10, 2) == 1.0);
  CHECK(c.truth.Count() + w.truth.Count() == 0);
  CHECK_THAT(Error(Base(4) + "effects:\n  - {type: warmup, iterations: 5, factor: 3, shape: s}\n"),
             Catch::Contains("shape=s is not constant or linear"));
}

TEST_CASE("scenario: a late joiner reports from `at`, its first row is kept for its hello") {
  const Scenario s = Must(Base(4) + "effects:\n  - {type: join, ranks: [2, 3], at: 12}\n"
                                    "  - {type: slow, rank: 3, factor: 3}\n");
  CHECK(JoinIteration(s, 3) == 12);
  CHECK(JoinIteration(s, 0) == 0);
  const Trace t = Generate(s);
  CHECK_FALSE(t.Reported(11, 2));
  CHECK(t.Reported(12, 2));
  REQUIRE(t.join_row.size() == 4);
  CHECK(t.join_row[3] == 12);
  CHECK(Intervals(t.truth) == std::vector<Interval>{{3, 12, 40}});
  CHECK_THAT(Error(Base(4) + "effects:\n  - {type: join, rank: 1, at: 40}\n"),
             Catch::Contains("at=40 must be below iterations=40"));
}
