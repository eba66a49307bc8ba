// Readmission of an excluded straggler (issue 28, items 1 and 2): a
// straggler restored by a restarted daemon is readmitted once its shadow
// steps are fast, never while they are slow, and a slow excluded rank is not
// readmitted by rows that jitter while it runs alone (a CPU hog).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace testutil;  // engine_test_util.h

constexpr uint32_t kWorld = 8;
constexpr uint32_t kSlow = 2;

// Healthy rows, then rank kSlow 3x until it is excluded; returns the
// iteration after the last row fed.
uint64_t ExcludeSlowRank(Harness& h, Noise& n) {
  std::vector<double> row(kWorld);
  uint64_t i = 0;
  for (; i < 40; ++i) {
    for (uint32_t r = 0; r < kWorld; ++r) row[r] = n.Step(1.0, 0.05);
    h.Row(i, 0, row);
  }
  for (; i < 80 && !h.Excluded(kSlow); ++i) {
    for (uint32_t r = 0; r < kWorld; ++r) row[r] = n.Step(r == kSlow ? 3.0 : 1.0, 0.05);
    h.Row(i, 0, row);
  }
  REQUIRE(h.Excluded(kSlow));
  return i;
}

// The job's rows from `from` (the active ranks, on the job's clock) and,
// after each, one shadow step of rank kSlow at its own lagging iteration
// `shadow` (an excluded rank is paced by the job and never catches up).
// `slow(i)`: rank kSlow's factor at job iteration i. Returns the job
// iteration at which it was readmitted (0: never).
template <typename Slow>
uint64_t RunShadow(Harness& h, Noise& n, uint64_t from, uint64_t count, uint64_t shadow,
                   Slow slow) {
  std::vector<double> row(kWorld, kSkip);
  for (uint64_t i = from; i < from + count; ++i) {
    for (uint32_t r = 0; r < kWorld; ++r) row[r] = r == kSlow ? kSkip : n.Step(1.0, 0.05);
    h.Row(i, 0, row);
    if (!h.Excluded(kSlow)) return i;
    h.Feed(kSlow, 0, shadow++, n.Step(slow(i), 0.05));
  }
  return 0;
}

TEST_CASE("restart_readmit: a straggler restored after a restart is readmitted once its shadow "
          "steps are fast, never while they are slow",
          "[readmit][peer]") {
  PolicyConfig p;  // the daemon's defaults: peer, exclusion on, shadow recovery
  Noise n(41);
  Harness before(kWorld, p);
  const uint64_t excluded_at = ExcludeSlowRank(before, n);
  const Membership held = before.engine().membership();

  // The restarted daemon's engine: nothing but the stored (or the hellos')
  // excluded set. The job goes on 60 iterations later; rank kSlow's shadow
  // steps lag by the 40 it fell behind while 3x slow.
  Harness after(kWorld, p);
  after.engine().RestoreMembership(held, {}, after.now());
  REQUIRE(after.Excluded(kSlow));
  REQUIRE(after.State(kSlow) == WorkerState::kStraggler);
  const uint64_t resume = excluded_at + 60, shadow = excluded_at + 20;

  SECTION("fast again: readmitted within the exit rows") {
    const uint64_t back = RunShadow(after, n, resume, 300, shadow, [](uint64_t) { return 1.0; });
    INFO("events: " << after.events.size());
    REQUIRE(back != 0);
    // Profile (10 rows), the window, peer_exit_rows: well within 40.
    CHECK(back < resume + 40);
    CHECK(after.State(kSlow) == WorkerState::kHealthy);
    const auto healthy = after.Of(EventKind::kStateChange, kSlow);
    REQUIRE_FALSE(healthy.empty());
    CHECK_THAT(healthy.back().message, Catch::Contains("judged alone"));
  }
  SECTION("still 3x: never readmitted") {
    CHECK(RunShadow(after, n, resume, 400, shadow, [](uint64_t) { return 3.0; }) == 0);
    CHECK(after.State(kSlow) == WorkerState::kStraggler);
    CHECK(after.Transitions(kSlow, WorkerState::kHealthy) == 0);
  }
  SECTION("slow for 100 more iterations, then fast: readmitted after, not before") {
    const uint64_t recovers = resume + 100;
    const uint64_t back = RunShadow(after, n, resume, 300, shadow,
                                    [&](uint64_t i) { return i < recovers ? 3.0 : 1.0; });
    REQUIRE(back != 0);
    CHECK(back > recovers);
    CHECK(back < recovers + 40);
  }
}

TEST_CASE("false_recovery: an excluded 3x rank is not readmitted while its group's rows jitter "
          "(a CPU hog), and is readmitted once fast",
          "[readmit][peer]") {
  PolicyConfig p;
  Noise n(7);
  Harness h(kWorld, p);
  const uint64_t from = ExcludeSlowRank(h, n);
  // A CPU hog competing with the trainers: bursts of 3 to 6 rows in which
  // the whole row runs 1.6-2.4x slower. The excluded rank runs alone, at
  // other times: its own steps are slowed by independent bursts.
  struct Hog {
    uint64_t left = 0;
    double factor = 1.0;
    double Next(Noise& n) {
      if (left == 0 && n.Uniform() < 0.2) {
        left = 3 + static_cast<uint64_t>(n.Uniform() * 4);
        factor = 1.6 + 0.8 * n.Uniform();
      }
      if (left == 0) return 1.0;
      --left;
      return factor;
    }
  } rows_hog, shadow_hog;
  std::vector<double> row(kWorld, kSkip);
  uint64_t shadow = from;
  uint64_t i = from;
  for (; i < from + 2000; ++i) {
    const double f = rows_hog.Next(n);
    for (uint32_t r = 0; r < kWorld; ++r) row[r] = r == kSlow ? kSkip : f * n.Step(1.0, 0.05);
    h.Row(i, 0, row);
    h.Feed(kSlow, 0, shadow++, shadow_hog.Next(n) * n.Step(3.0, 0.05));
  }
  const auto back = h.Of(EventKind::kStateChange, kSlow);
  INFO((back.empty() ? std::string("no state change") : back.back().message));
  CHECK(h.Transitions(kSlow, WorkerState::kHealthy) == 0);
  CHECK(h.Excluded(kSlow));
  // It recovers: readmitted under the same hog.
  uint64_t readmitted = 0;
  for (const uint64_t end = i + 200; i < end && readmitted == 0; ++i) {
    const double f = rows_hog.Next(n);
    for (uint32_t r = 0; r < kWorld; ++r) row[r] = r == kSlow ? kSkip : f * n.Step(1.0, 0.05);
    h.Row(i, 0, row);
    if (!h.Excluded(kSlow)) readmitted = i;
    else h.Feed(kSlow, 0, shadow++, n.Step(1.0, 0.05));
  }
  CHECK(readmitted != 0);
}

}  // namespace
}  // namespace straggler::engine
