// Monitoring only (issue 28, item 3; docs/membership.md, "Monitoring only"):
// a rank whose client does not act on membership is shown as a straggler
// that is never excluded, no version is published for it, no guard event is
// raised for it, and it is judged in the rows with its peers.
#include <catch2/catch.hpp>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace testutil;  // engine_test_util.h

constexpr uint32_t kWorld = 8;
constexpr uint32_t kSlow = 3;

TEST_CASE("monitor_only_excludes: a monitor-only straggler is shown a straggler, never excluded, "
          "judged in the rows",
          "[engine][monitor_only]") {
  Harness h(kWorld);
  h.engine().SetMonitorOnly(kSlow, true, h.now());
  CHECK(h.engine().Worker(kSlow).monitor_only);
  CHECK_FALSE(h.engine().Worker(0).monitor_only);
  h.Rows(0, 10, 0, Uniform(kWorld, 1.0));
  h.Rows(10, 20, 0, With(Uniform(kWorld, 1.0), kSlow, 6.0));

  const WorkerView w = h.engine().Worker(kSlow);
  CHECK(w.state == WorkerState::kStraggler);
  CHECK(w.monitor_only);
  CHECK_FALSE(w.excluded);
  CHECK(h.engine().membership().version == 0);  // nothing published for it
  CHECK(h.engine().membership().excluded.empty());
  CHECK(h.Count(EventKind::kMembership) == 0);
  CHECK(h.Count(EventKind::kGuardBlocked) == 0);
  CHECK(h.engine().View().straggler_ranks == 1);
  CHECK(h.engine().View().excluded_ranks == 0);
  // It takes part: its 6 s are in the rows, so the job steps at its pace.
  CHECK(h.engine().View().step_seconds == Approx(6.0));

  // It speeds up: judged in the rows with its peers, it recovers.
  h.Rows(30, 40, 0, Uniform(kWorld, 1.0));
  CHECK(h.State(kSlow) == WorkerState::kHealthy);
  CHECK(h.Transitions(kSlow, WorkerState::kHealthy) == 1);
  CHECK(h.engine().View().step_seconds == Approx(1.0));
  CHECK(h.engine().membership().version == 0);
}

TEST_CASE("monitor_only_excludes: the same straggler acting on membership is excluded",
          "[engine][monitor_only]") {
  // The control of the case above: without the mark the rank goes out, a
  // version is published and the job steps without it.
  Harness h(kWorld);
  h.Rows(0, 10, 0, Uniform(kWorld, 1.0));
  h.Rows(10, 20, 0, With(Uniform(kWorld, 1.0), kSlow, 6.0));
  CHECK(h.State(kSlow) == WorkerState::kStraggler);
  CHECK(h.Excluded(kSlow));
  CHECK_FALSE(h.engine().Worker(kSlow).monitor_only);
  CHECK(h.engine().membership().version >= 1);
  CHECK(h.engine().View().step_seconds == Approx(1.0));
}

TEST_CASE("monitor_only_excludes: a rank marked while excluded is released by the next version, "
          "cleared, it is excluded again",
          "[engine][monitor_only]") {
  Harness h(kWorld);
  h.Rows(0, 10, 0, Uniform(kWorld, 1.0));
  h.Rows(10, 20, 0, With(Uniform(kWorld, 1.0), kSlow, 6.0));
  REQUIRE(h.Excluded(kSlow));
  const uint64_t out = h.engine().membership().version;

  // Its client turns out not to act on membership (a later hello says so).
  h.engine().SetMonitorOnly(kSlow, true, h.now());
  h.Collect();
  CHECK_FALSE(h.Excluded(kSlow));
  CHECK(h.engine().membership().version == out + 1);
  CHECK(h.State(kSlow) == WorkerState::kStraggler);  // still slow: a straggler that stays in
  CHECK_FALSE(h.engine().Worker(kSlow).excluded);
  // Setting the same mark again changes nothing.
  h.engine().SetMonitorOnly(kSlow, true, h.now());
  CHECK(h.engine().membership().version == out + 1);

  // Still slow in the rows past the release: no version, no guard event.
  const uint64_t released = h.engine().membership().effective_iteration;
  h.Rows(30, released - 30 + 10, 0, With(Uniform(kWorld, 1.0), kSlow, 6.0));
  CHECK(h.engine().membership().version == out + 1);
  CHECK(h.Count(EventKind::kGuardBlocked, kSlow) == 0);
  CHECK(h.State(kSlow) == WorkerState::kStraggler);

  // Its client starts asking for membership (MembershipFor): the next hello
  // clears the mark and the straggler goes out as any.
  h.engine().SetMonitorOnly(kSlow, false, h.now());
  CHECK(h.Excluded(kSlow));
  CHECK(h.engine().membership().version == out + 2);
}

TEST_CASE("monitor_only_excludes: a replica with a monitor-only rank stays in, and Reset keeps "
          "the mark",
          "[engine][monitor_only]") {
  // Two ranks per replica: rank 3's replica mate (rank 2) is monitor-only,
  // so the replica keeps taking part whatever a version says.
  Harness h(kWorld);
  for (uint32_t r = 0; r < kWorld; ++r)
    h.engine().SetTopology(r, RankTopology{"", r / 2, ""});
  h.engine().SetMonitorOnly(2, true, h.now());
  h.Rows(0, 10, 0, Uniform(kWorld, 1.0));
  h.Rows(10, 20, 0, With(Uniform(kWorld, 1.0), kSlow, 6.0));
  CHECK(h.State(kSlow) == WorkerState::kStraggler);
  CHECK_FALSE(h.Excluded(kSlow));
  CHECK_FALSE(h.Excluded(2));
  CHECK(h.Count(EventKind::kGuardBlocked) == 0);

  h.engine().Reset(h.now());
  CHECK(h.engine().Worker(2).monitor_only);
  CHECK_FALSE(h.engine().Worker(kSlow).monitor_only);
}

}  // namespace
}  // namespace straggler::engine
