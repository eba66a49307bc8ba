// The peer policy's gray zone and its exit rule (issue 33; docs/detection.md,
// "States"): a rank persistently a little slower than its peers is `mild`,
// not a straggler - never excluded, not counted as one - and a straggler
// whose window stays below peer_straggler_ratio leaves the straggler state
// even while it stays above its peers.
#include <catch2/catch.hpp>

#include <optional>
#include <vector>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace testutil;  // engine_test_util.h

constexpr uint32_t kWorld = 16;

// Feeds iterations [from, to): rank r's step is factor(r) x 5% noise.
template <typename Factor>
void Run(Harness& h, Noise& n, uint64_t from, uint64_t to, Factor factor, double cv = 0.05) {
  std::vector<double> row(kWorld);
  for (uint64_t i = from; i < to; ++i) {
    for (uint32_t r = 0; r < kWorld; ++r) row[r] = n.Step(0.25 * factor(r), cv);
    h.Row(i, 0, row);
  }
}

size_t ToState(const Harness& h, uint32_t rank, WorkerState to) {
  size_t k = 0;
  for (const Event& e : h.Of(EventKind::kStateChange, rank)) k += e.to == to;
  return k;
}

TEST_CASE("gray zone: a rank 1.15x slower for good is mild and never a straggler or excluded",
          "[peer][gray]") {
  Harness h(kWorld, PolicyConfig{});  // the daemon's defaults: peer, exclusion on
  Noise n(33);
  Run(h, n, 0, 400, [](uint32_t r) { return r == 6 ? 1.15 : 1.0; });
  JobEngine& e = h.engine();
  CHECK(e.Worker(6).state == WorkerState::kMild);
  CHECK(e.Worker(6).slowdown_ratio == Approx(1.15).margin(0.05));
  CHECK_FALSE(e.Worker(6).excluded);
  CHECK(e.membership().excluded.empty());
  CHECK(ToState(h, 6, WorkerState::kStraggler) == 0);
  CHECK(e.View().straggler_ranks == 0);
  CHECK(e.View().mild_ranks == 1);
  CHECK(e.View().detections_total == 0);
  // Its event says what it is, with its ratio and the straggler ratio.
  const std::vector<Event> changes = h.Of(EventKind::kStateChange, 6);
  REQUIRE_FALSE(changes.empty());
  CHECK(changes.front().to == WorkerState::kMild);
  INFO(changes.front().message);
  CHECK(Contains(changes.front().message, "rank 6 mild: 1.1"));
  CHECK(Contains(changes.front().message, "below the straggler ratio 1.25"));
  CHECK(WorkerStateName(WorkerState::kMild) == "mild");
  // Back at its peers' speed, it is healthy again.
  Run(h, n, 400, 460, [](uint32_t) { return 1.0; });
  CHECK(e.Worker(6).state == WorkerState::kHealthy);
  CHECK(e.View().mild_ranks == 0);
}

TEST_CASE("gray zone: a 1.3x rank is still a straggler within 10 iterations and 2x within 5",
          "[peer][gray]") {
  for (const double factor : {1.3, 2.0}) {
    Harness h(kWorld, PolicyConfig{});
    Noise n(330 + static_cast<uint64_t>(factor * 10));
    Run(h, n, 0, 100, [](uint32_t) { return 1.0; });
    Run(h, n, 100, 130, [&](uint32_t r) { return r == 3 ? factor : 1.0; });
    const auto at = Detected(h, 3);
    REQUIRE(at);
    CHECK(*at < (factor >= 2.0 ? 105u : 110u));
    // Found as a straggler with no mild event before it.
    CHECK(h.Of(EventKind::kStateChange, 3).front().to == WorkerState::kStraggler);
    CHECK(h.engine().Worker(3).excluded);
  }
}

TEST_CASE("gray zone: a straggler that recovers only to 1.1x leaves the straggler state",
          "[peer][gray]") {
  // 1.4x over [100, 200), then 1.1x for good, in 5% noise: before issue 33
  // it was let go when the episode ended, flagged again at 1.1x (above the
  // 1.12x threshold on enough rows) and then never left - 1.1x never gets
  // below 1.04x (the slow way back) and that episode is too mild for the
  // quick way - so it was a straggler, and excluded, for the rest of the
  // job (scenarios/recovers-to-1.1x.yaml, rank 3).
  Harness h(kWorld, PolicyConfig{});
  Noise n(3302);
  Run(h, n, 0, 100, [](uint32_t) { return 1.0; });
  Run(h, n, 100, 200, [](uint32_t r) { return r == 3 ? 1.4 : 1.0; });
  REQUIRE(Detected(h, 3));
  CHECK(h.engine().Worker(3).state == WorkerState::kStraggler);
  Run(h, n, 200, 600, [](uint32_t r) { return r == 3 ? 1.1 : 1.0; });
  JobEngine& e = h.engine();
  CHECK(e.Worker(3).state != WorkerState::kStraggler);
  CHECK_FALSE(e.Worker(3).excluded);
  CHECK(ToState(h, 3, WorkerState::kStraggler) == 1);  // and not flagged again
  // It left within its window plus the exit window of the episode's end
  // (bench/quality's criteria allow 30 rows).
  std::optional<uint64_t> left;
  for (const Event& ev : h.Of(EventKind::kStateChange, 3))
    if (ev.from == WorkerState::kStraggler) left = ev.iteration;
  REQUIRE(left);
  CHECK(*left <= 230);
  CHECK(e.View().recoveries_total == 1);
}

TEST_CASE("gray zone: peer_straggler_ratio is a policy field with a bound", "[peer][gray]") {
  PolicyConfig p;
  CHECK(p.peer_straggler_ratio == 1.25);
  p.peer_straggler_ratio = 1.0;
  const absl::Status s = p.Validate();
  CHECK(absl::IsInvalidArgument(s));
  CHECK(Contains(std::string(s.message()), "peer_straggler_ratio=1"));
  // A higher ratio widens the gray zone: a 1.3x rank is then mild.
  PolicyConfig wide;
  wide.peer_straggler_ratio = 1.5;
  Harness h(kWorld, wide);
  Noise n(34);
  Run(h, n, 0, 300, [](uint32_t r) { return r == 9 ? 1.3 : 1.0; });
  CHECK(h.engine().Worker(9).state == WorkerState::kMild);
  CHECK(ToState(h, 9, WorkerState::kStraggler) == 0);
}

}  // namespace
}  // namespace straggler::engine
