// Large rows judged in slices (JobEngine::kSliceMinValues, docs/detection.md,
// "Large rows"): the same verdicts, in the same order, with the same events,
// as the whole row at once - only later, spread over the reports that follow.
// A membership change they cause is planned once the row's verdicts are all
// in, so it may take effect an iteration or so later (progress moved on).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"

namespace se = straggler::engine;

namespace {

struct Run {
  std::vector<std::string> events;     // state changes: rank, states, iteration, message
  std::vector<std::string> excluded;   // each published version's excluded ranks
  size_t first_straggler_report = 0;   // how many reports went in before it was seen
  std::vector<se::WorkerState> states;
};

// 64 ranks in one peer group, 160 iterations of 0.1 s +-3% (a fixed
// pseudo-random draw), rank 40 at 2x from iteration 40 to 100, rank 50 at
// 1.5x from 70 on (late in their row's bucket, which is in rank order);
// `slices` = 0: rows judged whole; else that many verdicts per later
// report, every row sliced.
// With `groups`: ranks 0-29 in peer group "a", 30-61 in "b", 62 and 63 in
// groups of one (too small: judged against their own baselines), and rank 62
// at 3x from iteration 60 as well.
// `world`: 64 ranks, or one group large enough for its medians in passes
// (PeerReference::kSlicedMedianMin).
Run Drive(uint32_t slices, bool groups = false, uint32_t world = 64) {
  const uint32_t kWorld = world;
  se::PolicyConfig p;  // peer, the default
  se::JobEngine e(kWorld, p, se::Time(0));
  e.SetRowSlicing(2, slices);  // 0: every row whole, however large
  if (groups) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      se::RankTopology t;
      t.peer_group = r < 30 ? "a" : r < 62 ? "b" : "solo-" + std::to_string(r);
      e.SetTopology(r, t);
    }
  }
  Run run;
  uint64_t s = 7;
  size_t reports = 0;
  auto take = [&] {
    for (const se::Event& ev : e.TakeEvents()) {
      if (ev.kind == se::EventKind::kStateChange)
        run.events.push_back(std::to_string(ev.rank) + " " +
                             std::to_string(static_cast<int>(ev.from)) + ">" +
                             std::to_string(static_cast<int>(ev.to)) + " @" +
                             std::to_string(ev.iteration) + " " + ev.message);
      if (ev.kind == se::EventKind::kMembership) {
        std::string ex;
        for (const auto& x : e.membership().excluded) ex += std::to_string(x.rank) + ",";
        run.excluded.push_back(ex);
      }
      if (run.first_straggler_report == 0 && ev.kind == se::EventKind::kStateChange &&
          ev.to == se::WorkerState::kStraggler)
        run.first_straggler_report = reports;
    }
  };
  for (uint64_t it = 0; it < 160; ++it) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      double t = 0.1 * (0.97 + 0.06 * static_cast<double>(s >> 11) / static_cast<double>(1ull << 53));
      if (r == 40 && it >= 40 && it < 100) t *= 2.0;
      if (r == 50 && it >= 70) t *= 1.5;
      if (groups && r == 62 && it >= 60) t *= 3.0;
      se::Report rep;
      rep.rank = r;
      rep.iteration = it;
      rep.compute_seconds = t;
      const se::Time now(static_cast<int64_t>(it) * 100'000'000 + r);
      REQUIRE(e.Ingest(rep, now).accepted);
      ++reports;
      take();
    }
  }
  e.Tick(se::Time(160LL * 100'000'000));  // gives whatever is left
  take();
  for (uint32_t r = 0; r < kWorld; ++r) run.states.push_back(e.Worker(r).state);
  return run;
}

}  // namespace

TEST_CASE("row slices: a sliced row gives the whole row's verdicts and events, later") {
  const Run whole = Drive(0);
  const Run sliced = Drive(1);
  REQUIRE(whole.first_straggler_report > 0);  // the job has a straggler to find
  CHECK(sliced.events == whole.events);
  CHECK(sliced.excluded == whole.excluded);
  CHECK(sliced.states == whole.states);
  // One verdict per later report: rank 40's comes some 40 reports after the
  // row that holds it was complete.
  CHECK(sliced.first_straggler_report > whole.first_straggler_report);
  // Four per report: sooner, the same verdicts.
  const Run four = Drive(4);
  CHECK(four.events == whole.events);
  CHECK(four.first_straggler_report > whole.first_straggler_report);
  CHECK(four.first_straggler_report < sliced.first_straggler_report);
}

TEST_CASE("row slices: peer groups and ranks judged against their own baselines, sliced alike") {
  const Run whole = Drive(0, /*groups=*/true);
  const Run sliced = Drive(3, /*groups=*/true);
  REQUIRE(whole.first_straggler_report > 0);
  bool solo_flagged = false;  // rank 62, alone in its group
  for (const std::string& ev : whole.events) solo_flagged |= ev.rfind("62 1>2", 0) == 0;
  CHECK(solo_flagged);
  CHECK(sliced.events == whole.events);
  CHECK(sliced.excluded == whole.excluded);
  CHECK(sliced.states == whole.states);
  CHECK(sliced.first_straggler_report > whole.first_straggler_report);
}

TEST_CASE("row slices: a group of 16 500, its medians and rate median in passes, sliced alike") {
  // The row, the group's median and, at the profile's end and every 16th
  // row, its median rate of severe steps are taken in two passes
  // (SlicedMedian) in both runs; sliced, each pass is spread over reports
  // and paced to end within the next row.
  const Run whole = Drive(0, /*groups=*/false, 16500);
  const Run sliced = Drive(4, /*groups=*/false, 16500);
  REQUIRE(whole.first_straggler_report > 0);
  CHECK(sliced.events == whole.events);
  CHECK(sliced.excluded == whole.excluded);
  CHECK(sliced.states == whole.states);
  CHECK(sliced.first_straggler_report > whole.first_straggler_report);
}

TEST_CASE("row slices: a tick waits for a sliced row's end, a second one finishes it") {
  se::PolicyConfig p;
  p.unresponsive_after_seconds = 1.0;
  // Enough ranks that the row's work outlasts the report completing it.
  constexpr uint32_t kWorld = 64;
  auto unresponsive = [](se::JobEngine& e) {
    std::vector<uint32_t> ranks;
    for (const se::Event& ev : e.TakeEvents())
      if (ev.kind == se::EventKind::kStateChange && ev.to == se::WorkerState::kUnresponsive)
        ranks.push_back(ev.rank);
    return ranks;
  };
  auto row = [](se::JobEngine& e, uint64_t it, uint32_t ranks, se::Time now, uint32_t from = 0) {
    for (uint32_t r = from; r < ranks; ++r) {
      se::Report rep;
      rep.rank = r;
      rep.iteration = it;
      rep.compute_seconds = 0.1 + 0.001 * r;
      REQUIRE(e.Ingest(rep, now).accepted);
    }
  };
  const se::Time t5(5'000'000'000);
  SECTION("the row's end runs it") {
    se::JobEngine e(kWorld, p, se::Time(0));
    e.SetRowSlicing(2, 1);
    for (uint32_t r = 0; r < kWorld; ++r) e.Announce(r, se::Time(0));  // a hello
    row(e, 0, kWorld, se::Time(0));  // complete: judged in slices from here on
    e.Tick(t5);                      // every rank silent for 5 s, but the row is not done
    CHECK(unresponsive(e).empty());
    // Rank 63 stays silent. Some of these reports end row 0, and the tick
    // runs then, as of 5 s: the ranks that reported by then are not
    // unresponsive, those still to report and rank 63 are.
    row(e, 1, kWorld - 1, t5);
    const std::vector<uint32_t> flagged = unresponsive(e);
    REQUIRE(!flagged.empty());
    CHECK(flagged.front() > 0);
    CHECK(flagged.back() == 63);
    for (size_t i = 1; i < flagged.size(); ++i) CHECK(flagged[i] == flagged[i - 1] + 1);
  }
  SECTION("no reports come: the next tick finishes the row and runs") {
    se::JobEngine e(kWorld, p, se::Time(0));
    e.SetRowSlicing(2, 1);
    for (uint32_t r = 0; r < kWorld; ++r) e.Announce(r, se::Time(0));  // a hello
    row(e, 0, kWorld, se::Time(0));
    e.Tick(t5);
    CHECK(unresponsive(e).empty());
    e.Tick(t5 + se::Time(1'000'000'000));
    CHECK(unresponsive(e).size() == kWorld);
  }
  SECTION("reports keep coming: a later tick waits too, and runs as of its time") {
    se::JobEngine e(kWorld, p, se::Time(0));
    e.SetRowSlicing(2, 1);
    for (uint32_t r = 0; r < kWorld; ++r) e.Announce(r, se::Time(0));
    row(e, 0, kWorld, se::Time(0));
    e.Tick(t5);
    row(e, 1, 2, t5);  // ranks 0 and 1: two slices, the row not done
    const se::Time t6 = t5 + se::Time(1'000'000'000);
    e.Tick(t6);
    CHECK(unresponsive(e).empty());
    row(e, 1, kWorld - 1, t6, 2);
    const std::vector<uint32_t> flagged = unresponsive(e);
    REQUIRE(!flagged.empty());
    CHECK(flagged.front() > 2);
    CHECK(flagged.back() == 63);
  }
  SECTION("whole rows: at once") {
    se::JobEngine e(kWorld, p, se::Time(0));
    row(e, 0, kWorld, se::Time(0));
    e.Tick(t5);
    CHECK(unresponsive(e).size() == kWorld);
  }
}
