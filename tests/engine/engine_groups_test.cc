// Peer groups in the engine (docs/detection.md, "Peer groups"): each rank's
// declared topology (SetTopology), and detection judging a rank against its
// peers - the ranks of the same peer group and GPU model - or, where it has
// too few, against its own earlier profile.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace testutil;  // engine_test_util.h

TEST_CASE("groups: SetTopology files a rank, Reset and StartOver keep it", "[groups]") {
  Harness h(4);
  JobEngine& e = h.engine();
  CHECK(e.Topology(2) == RankTopology{});  // the default group, its own replica, model unknown
  e.SetTopology(2, RankTopology{"stage1", 0, "NVIDIA H100 80GB HBM3"});
  e.SetTopology(3, RankTopology{"stage1", 1, ""});
  CHECK(e.Topology(2).peer_group == "stage1");
  REQUIRE(e.Topology(2).replica);
  CHECK(*e.Topology(2).replica == 0);
  CHECK(e.Topology(2).gpu_model == "NVIDIA H100 80GB HBM3");
  CHECK(e.Topology(0) == RankTopology{});
  h.Rows(0, 3, 0, Uniform(4, 1.0));
  e.Reset(h.now());
  CHECK(e.Topology(3) == (RankTopology{"stage1", 1, ""}));
  e.StartOver(1000, h.now());
  CHECK(e.Topology(2).gpu_model == "NVIDIA H100 80GB HBM3");
  // A new incarnation may move the rank.
  e.SetTopology(2, RankTopology{"stage0", 0, "NVIDIA H100 80GB HBM3"});
  CHECK(e.Topology(2).peer_group == "stage0");
}

}  // namespace
}  // namespace straggler::engine

namespace straggler::engine {
namespace {


PolicyConfig Peer() {
  PolicyConfig p = CounterOnlyPolicy();
  p.kind = PolicyKind::kPeer;
  return p;
}

// Feeds iterations [from, to): rank r's step is cost(r, i) x noise.
template <typename Cost>
void Run(Harness& h, Noise& n, uint32_t world, uint64_t from, uint64_t to, double cv, Cost cost) {
  std::vector<double> row(world);
  for (uint64_t i = from; i < to; ++i) {
    for (uint32_t r = 0; r < world; ++r) row[r] = n.Step(cost(r, i), cv);
    h.Row(i, 0, row);
  }
}

size_t Detections(const Harness& h) {
  size_t n = 0;
  for (const Event& e : h.Of(EventKind::kStateChange)) n += e.to == WorkerState::kStraggler;
  return n;
}

TEST_CASE("groups: a declared slower stage is never flagged, a 1.4x rank in its stage is",
          "[groups][peer]") {
  // 16 ranks: stage0 = ranks 0-7, stage1 = ranks 8-15, 1.6x slower by design.
  Harness h(16, Peer());
  for (uint32_t r = 0; r < 16; ++r)
    h.engine().SetTopology(r, RankTopology{r < 8 ? "stage0" : "stage1", r % 8, ""});
  Noise n(17);
  auto stage = [](uint32_t r) { return r < 8 ? 1.0 : 1.6; };
  Run(h, n, 16, 0, 200, 0.05, [&](uint32_t r, uint64_t) { return stage(r); });
  CHECK(Detections(h) == 0);
  // A view's slowdown is against the rank's own group: the slower stage by
  // design is 1x its peers, not 1.6x the larger (first) group's median.
  CHECK(h.engine().Worker(11).slowdown_ratio == Approx(1.0).margin(0.1));
  CHECK(h.engine().Worker(3).slowdown_ratio == Approx(1.0).margin(0.1));
  // Rank 11 slows to 1.4x its stage from iteration 200.
  Run(h, n, 16, 200, 260, 0.05,
      [&](uint32_t r, uint64_t) { return stage(r) * (r == 11 ? 1.4 : 1.0); });
  const auto at = Detected(h, 11);
  REQUIRE(at);
  CHECK(*at < 210);  // within 10 iterations of the onset
  CHECK(Detections(h) == 1);
  CHECK(h.engine().Worker(11).slowdown_ratio == Approx(1.4).margin(0.15));
  const Event e = h.Of(EventKind::kStateChange, 11).front();
  INFO(e.message);
  CHECK(testutil::Contains(e.message, "rank 11 (group stage1) 1."));
  CHECK(testutil::Contains(e.message, "its group's median 1.6"));
  CHECK(testutil::Contains(e.message, "over its last steps"));
}

TEST_CASE("groups: ranks of different GPU models are never peers", "[groups][peer]") {
  // Ranks 0-9 on H100, 10-15 on A100 at 1.5x: without the model, 6 of 16
  // (37%) would be slower than the median.
  Harness h(16, Peer());
  for (uint32_t r = 0; r < 16; ++r)
    h.engine().SetTopology(r, RankTopology{"", std::nullopt, r < 10 ? "H100" : "A100"});
  Noise n(5);
  auto gen = [](uint32_t r) { return r < 10 ? 1.0 : 1.5; };
  Run(h, n, 16, 0, 150, 0.05, [&](uint32_t r, uint64_t) { return gen(r); });
  CHECK(Detections(h) == 0);
  Run(h, n, 16, 150, 200, 0.05,
      [&](uint32_t r, uint64_t) { return gen(r) * (r == 12 ? 1.4 : 1.0); });
  const auto at = Detected(h, 12);
  REQUIRE(at);
  CHECK(*at < 160);
  CHECK(Detections(h) == 1);
  CHECK(testutil::Contains(h.Of(EventKind::kStateChange, 12).front().message, "on A100"));
}

TEST_CASE("groups: without device information, a slower minority above max_excluded_fraction "
          "from the start is a generation",
          "[groups][peer]") {
  Harness h(16, Peer());  // nothing declared: one group
  Noise n(6);
  auto gen = [](uint32_t r) { return r < 10 ? 1.0 : 1.5; };
  Run(h, n, 16, 0, 150, 0.05, [&](uint32_t r, uint64_t) { return gen(r); });
  CHECK(Detections(h) == 0);
  Run(h, n, 16, 150, 200, 0.05,
      [&](uint32_t r, uint64_t) { return gen(r) * (r == 12 ? 1.4 : 1.0); });
  REQUIRE(Detected(h, 12));
  CHECK(*Detected(h, 12) < 160);
  CHECK(Detections(h) == 1);

  // Three of 16 (19%, not above 25%) slower from the start are stragglers.
  Harness few(16, Peer());
  Noise m(7);
  Run(few, m, 16, 0, 60, 0.05, [](uint32_t r, uint64_t) { return r < 13 ? 1.0 : 1.5; });
  CHECK(Detections(few) == 3);
}

TEST_CASE("groups: groups of 1 (pipeline only) are judged against their own baseline",
          "[groups][peer][own]") {
  // 4 stages of 1 rank each, unbalanced by design; a global slowdown, then
  // stage 2 slows to 1.4x its own earlier speed.
  Harness h(4, Peer());
  for (uint32_t r = 0; r < 4; ++r)
    h.engine().SetTopology(r, RankTopology{"stage" + std::to_string(r), std::nullopt, ""});
  const double cost[] = {1.0, 1.2, 1.5, 1.7};
  Noise n(8);
  Run(h, n, 4, 0, 100, 0.05, [&](uint32_t r, uint64_t i) {
    return cost[r] * (i >= 40 && i < 70 ? 2.0 : 1.0);  // the whole job slows for 30 steps
  });
  CHECK(Detections(h) == 0);
  Run(h, n, 4, 100, 150, 0.05,
      [&](uint32_t r, uint64_t) { return cost[r] * (r == 2 ? 1.4 : 1.0); });
  const auto at = Detected(h, 2);
  REQUIRE(at);
  CHECK(*at < 110);
  CHECK(Detections(h) == 1);
  INFO(h.Of(EventKind::kStateChange, 2).front().message);
  CHECK(testutil::Contains(h.Of(EventKind::kStateChange, 2).front().message,
                           "its own baseline"));
}

TEST_CASE("groups: groups of 2 are judged against their own baseline", "[groups][peer][own]") {
  // 6 ranks in 3 groups of 2 (tensor pairs of 3 stages); rank 3 slows 1.5x.
  Harness h(6, Peer());
  for (uint32_t r = 0; r < 6; ++r)
    h.engine().SetTopology(r, RankTopology{"stage" + std::to_string(r / 2), std::nullopt, ""});
  Noise n(9);
  auto cost = [](uint32_t r) { return 1.0 + 0.3 * (r / 2); };
  Run(h, n, 6, 0, 100, 0.05, [&](uint32_t r, uint64_t) { return cost(r); });
  CHECK(Detections(h) == 0);
  Run(h, n, 6, 100, 150, 0.05,
      [&](uint32_t r, uint64_t) { return cost(r) * (r == 3 ? 1.5 : 1.0); });
  REQUIRE(Detected(h, 3));
  CHECK(*Detected(h, 3) < 110);
  CHECK(Detections(h) == 1);
}

TEST_CASE("groups: a gradual ramp with its peers unchanged is caught by 1.5x",
          "[groups][peer][ramp]") {
  // Rank 5 of 8 slows linearly from 1.0x at iteration 100 to 2.0x at 200:
  // 1.5x at iteration 150. Once in a group of 8, once as a group of 1.
  for (bool alone : {false, true}) {
    INFO("alone in its group: " << alone);
    Harness h(8, Peer());
    if (alone)
      for (uint32_t r = 0; r < 8; ++r)
        h.engine().SetTopology(r, RankTopology{"stage" + std::to_string(r), std::nullopt, ""});
    Noise n(10);
    Run(h, n, 8, 0, 200, 0.1, [](uint32_t r, uint64_t i) {
      if (r != 5 || i < 100) return 1.0;
      return 1.0 + static_cast<double>(i - 100) / 100.0;
    });
    const auto at = Detected(h, 5);
    REQUIRE(at);
    CHECK(*at <= 150);
    CHECK(Detections(h) == 1);
  }
}

TEST_CASE("groups: peer rides out spikes, checkpoints and warm-up, and does not flap",
          "[groups][peer]") {
  Harness h(16, Peer());
  Noise n(11);
  Run(h, n, 16, 0, 600, 0.1, [&](uint32_t r, uint64_t i) {
    double f = i < 8 ? 4.0 - 0.4 * static_cast<double>(i) : 1.0;  // warm-up
    if (i % 100 == 99) f *= 5.0;                                  // checkpoint: all at once
    if ((i + 7 * r) % 20 == 0) f *= 6.0;                          // periodic spikes, 1 in 20
    return f;
  });
  CHECK(Detections(h) == 0);
  // Rank 4 at 2.5x on 4 steps of 5: flagged once, within 10, and stays.
  Run(h, n, 16, 600, 800, 0.05,
      [](uint32_t r, uint64_t i) { return r == 4 && (i - 600) % 5 < 4 ? 2.5 : 1.0; });
  REQUIRE(Detected(h, 4));
  CHECK(*Detected(h, 4) < 610);
  CHECK(h.Flips(4) == 1);
  CHECK(h.State(4) == WorkerState::kStraggler);
  CHECK(Detections(h) == 1);
}

TEST_CASE("groups: peer finds a 2x rank within 5 iterations and lets it go after recovery",
          "[groups][peer]") {
  Harness h(8, Peer());
  Noise n(12);
  Run(h, n, 8, 0, 50, 0.05, [](uint32_t, uint64_t) { return 1.0; });
  Run(h, n, 8, 50, 80, 0.05, [](uint32_t r, uint64_t) { return r == 2 ? 2.0 : 1.0; });
  REQUIRE(Detected(h, 2));
  CHECK(*Detected(h, 2) < 55);
  Run(h, n, 8, 80, 120, 0.05, [](uint32_t, uint64_t) { return 1.0; });
  CHECK(h.State(2) == WorkerState::kHealthy);
  CHECK(h.Flips(2) == 2);
}


TEST_CASE("groups: an excluded straggler that recovers in shadow rejoins and is not flagged again",
          "[groups][peer]") {
  PolicyConfig p;  // the defaults: peer, exclusion on, shadow recovery
  REQUIRE(p.kind == PolicyKind::kPeer);
  Harness h(8, p);
  Noise n(13);
  Run(h, n, 8, 0, 40, 0.05, [](uint32_t, uint64_t) { return 1.0; });
  Run(h, n, 8, 40, 70, 0.05, [](uint32_t r, uint64_t) { return r == 2 ? 3.0 : 1.0; });
  REQUIRE(Detected(h, 2));
  CHECK(h.Excluded(2));
  Run(h, n, 8, 70, 160, 0.05, [](uint32_t, uint64_t) { return 1.0; });
  CHECK(h.State(2) == WorkerState::kHealthy);
  CHECK_FALSE(h.Excluded(2));
  CHECK(h.Flips(2) == 2);  // flagged once, recovered once
}

}  // namespace
}  // namespace straggler::engine
