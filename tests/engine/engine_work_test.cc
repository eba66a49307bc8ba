// Own time and time per unit of work (issue 31, docs/detection.md, "Own time
// and work"): every policy judges input wait + compute + optimizer; the peer
// policy judges a job that reports work per unit of work.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"
#include "work_fit.h"

namespace se = straggler::engine;

namespace {

constexpr uint32_t kWorld = 16;

// A fixed pseudo-random draw in [0, 1).
double Unit(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<double>(s >> 11) / static_cast<double>(1ull << 53);
}

struct Outcome {
  std::vector<se::WorkerState> states;
  std::vector<std::string> straggler_messages;  // of every change to straggler
  std::vector<std::optional<se::DataNote>> data;  // WorkerView::data at the end
  std::vector<uint32_t> data_iterations = std::vector<uint32_t>(kWorld);  // with a note, per rank
};

// 16 ranks, 200 iterations of the default policy. `step(rank, it, rep)`
// fills the report's times and optional fields. `groups`: ranks 0-7 in
// peer group "a", 8-15 in "b" (each group's work in a bucket of its own).
template <typename F>
Outcome Drive(F&& step, bool groups = false) {
  se::JobEngine e(kWorld, se::PolicyConfig{}, se::Time(0));
  if (groups)
    for (uint32_t r = 0; r < kWorld; ++r) {
      se::RankTopology t;
      t.peer_group = r < 8 ? "a" : "b";
      e.SetTopology(r, t);
    }
  Outcome out;
  for (uint64_t it = 0; it < 200; ++it) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      se::Report rep;
      rep.rank = r;
      rep.iteration = it;
      step(r, it, rep);
      REQUIRE(e.Ingest(rep, se::Time(static_cast<int64_t>(it) * 100'000'000 + r)).accepted);
    }
    for (const se::Event& ev : e.TakeEvents())
      if (ev.kind == se::EventKind::kStateChange && ev.to == se::WorkerState::kStraggler)
        out.straggler_messages.push_back(ev.message);
    for (uint32_t r = 0; r < kWorld; ++r) out.data_iterations[r] += e.Worker(r).data.has_value();
  }
  for (uint32_t r = 0; r < kWorld; ++r) {
    out.states.push_back(e.Worker(r).state);
    out.data.push_back(e.Worker(r).data);
  }
  return out;
}

}  // namespace

TEST_CASE("own time: a rank slow in its input wait is a straggler like a slow GPU") {
  // Every rank: compute 0.1 s +-3%, input wait 5 ms; rank 5's input wait
  // grows to 0.1 s from iteration 60 (its own time 1.9x, compute unchanged).
  auto run = [](bool report_input) {
    uint64_t s = 11;
    return Drive([&](uint32_t r, uint64_t it, se::Report& rep) {
      rep.compute_seconds = 0.1 * (0.97 + 0.06 * Unit(s));
      if (report_input) rep.input_wait_seconds = r == 5 && it >= 60 ? 0.1 : 0.005;
    });
  };
  const Outcome with = run(true);
  CHECK(with.states[5] == se::WorkerState::kStraggler);
  for (uint32_t r = 0; r < kWorld; ++r)
    if (r != 5) CHECK(with.states[r] == se::WorkerState::kHealthy);
  // Compute alone (the input wait not reported): nobody is slow.
  const Outcome without = run(false);
  for (uint32_t r = 0; r < kWorld; ++r) CHECK(without.states[r] == se::WorkerState::kHealthy);
}

TEST_CASE("work: more work is no straggler, a rank slower per unit of work is one") {
  // Work per step 500-2000 units; time = (0.02 s + 0.1 ms per unit) x 1 +-2%.
  // Rank 7 always draws 1.6x the work (longer sequences); rank 3 is 1.3x
  // slower per unit of work from iteration 80.
  // With `groups`, group "b" runs 2x slower per unit of work than "a".
  auto run = [](bool report_work, bool groups = false) {
    uint64_t s = 5;
    return Drive(
        [&](uint32_t r, uint64_t it, se::Report& rep) {
          double w = 500 + 1500 * Unit(s);
          if (r == 7) w *= 1.6;
          double t = (0.02 + 1e-4 * w) * (0.98 + 0.04 * Unit(s));
          if (r == 3 && it >= 80) t *= 1.3;
          if (groups && r >= 8) t *= 2;
          rep.compute_seconds = t;
          if (report_work) rep.work = w;
        },
        groups);
  };
  for (bool groups : {false, true}) {
    INFO("peer groups: " << groups);
    const Outcome with = run(true, groups);
    CHECK(with.states[3] == se::WorkerState::kStraggler);
    for (uint32_t r = 0; r < kWorld; ++r)
      if (r != 3) CHECK(with.states[r] == se::WorkerState::kHealthy);
  }
  const Outcome with = run(true);
  CHECK(with.states[3] == se::WorkerState::kStraggler);
  CHECK(with.states[7] == se::WorkerState::kHealthy);
  for (uint32_t r = 0; r < kWorld; ++r)
    if (r != 3) CHECK(with.states[r] == se::WorkerState::kHealthy);
  REQUIRE(with.straggler_messages.size() == 1);
  CHECK(with.straggler_messages[0].find("units of work") != std::string::npos);
  // Rank 7 is slow on time alone, not per unit of work: the `data` note,
  // with its numbers; nobody else has one (rank 3 is a straggler).
  REQUIRE(with.data[7].has_value());
  CHECK(with.data[7]->time_ratio > with.data[7]->threshold_ratio);
  CHECK(with.data[7]->threshold_ratio > 1.0);
  CHECK(with.data[7]->per_work_ratio == Approx(1.0).epsilon(0.1));
  CHECK(with.data[7]->work_ratio > 1.3);
  for (uint32_t r = 0; r < kWorld; ++r)
    if (r != 7) CHECK(with.data_iterations[r] == 0);
  // On time alone rank 7's extra work looks like a straggler's, and rank
  // 3's 1.3x drowns in the variation the work explained.
  const Outcome without = run(false);
  CHECK(without.states[7] == se::WorkerState::kStraggler);
  for (uint32_t r = 0; r < kWorld; ++r) CHECK_FALSE(without.data[r].has_value());
  for (const std::string& m : without.straggler_messages)
    CHECK(m.find("units of work") == std::string::npos);
}

TEST_CASE("work fit: the overhead and exponent that explain the steps, or time alone") {
  namespace si = se::internal;
  uint64_t s = 3;
  std::vector<std::pair<double, double>> points;
  SECTION("time = 0.5 + w, in proportion beyond the overhead") {
    si::WorkFit fit;
    for (int row = 0; row < 20; ++row) {
      points.clear();
      for (int i = 0; i < 16; ++i) {
        const double w = 0.25 + 2 * Unit(s);
        points.emplace_back(std::log((0.5 + w) * (0.99 + 0.02 * Unit(s))), w);
      }
      fit.AddRow(points);
    }
    REQUIRE(fit.active());
    // Nearby candidates (g, p) describe almost the same curve; what counts
    // is the prediction: over the range of work, the expected ratio of two
    // steps' times within 5% of (0.5 + w2) / (0.5 + w1) (the grid's
    // resolution, at the ends of the range).
    for (double w : {0.25, 0.5, 1.0, 1.5, 2.25}) {
      const double predicted = fit.LogCost(w) - fit.LogCost(1.0);
      INFO("g " << fit.overhead() << " p " << fit.exponent());
      CHECK(std::abs(predicted - std::log((0.5 + w) / 1.5)) < 0.05);
    }
    const double g = fit.overhead(), p = fit.exponent();
    CHECK(fit.LogCost(2 * fit.reference_work()) ==
          Approx(std::log((g + std::pow(2.0, p)) / (g + 1))));
    CHECK(fit.LogCost(std::nan("")) == 0.0);
  }
  SECTION("time that does not follow the work: judged on time alone") {
    si::WorkFit fit;
    for (int row = 0; row < 20; ++row) {
      points.clear();
      for (int i = 0; i < 16; ++i)
        points.emplace_back(std::log(1.0 + 0.05 * Unit(s)), 0.25 + 2 * Unit(s));
      fit.AddRow(points);
    }
    CHECK_FALSE(fit.active());
    CHECK(fit.LogCost(3.0) == 0.0);
  }
  SECTION("past its first rows, the fit still follows a change of the job's work") {
    // Scored one row in WorkFit::kEvery after kWarmRows: a job whose time
    // stops following its work (a new data mix) is judged on time alone
    // again within a few dozen rows.
    si::WorkFit fit;
    auto rows = [&](int n, bool follows) {
      for (int row = 0; row < n; ++row) {
        points.clear();
        for (int i = 0; i < 64; ++i) {
          const double w = 0.25 + 2 * Unit(s);
          points.emplace_back(std::log((follows ? w : 1.0) * (0.99 + 0.02 * Unit(s))), w);
        }
        if (fit.WantsRow()) fit.AddRow(points); else fit.SkipRow();
      }
    };
    rows(2 * static_cast<int>(si::WorkFit::kWarmRows), true);
    REQUIRE(fit.active());
    CHECK(fit.exponent() == 1.0);
    rows(100, false);
    CHECK_FALSE(fit.active());
  }
  SECTION("fewer than three steps say nothing") {
    si::WorkFit fit;
    points = {{0.0, 1.0}, {0.1, 2.0}};
    fit.AddRow(points);
    CHECK_FALSE(fit.active());
  }
}

TEST_CASE("work: a long slow tail the unit misses raises the threshold, a fast one does not") {
  // Time = 0.1 ms per unit of work x exp(e): e is +0.45 on one step in ten
  // and -0.05 otherwise (mean 0), like tokens reported where one long
  // sequence's attention makes a step slower than its tokens say; mirrored,
  // the same spread on the fast side. Both have the same variance; the
  // thresholds, a test for slowness, follow the slow side's spread.
  auto threshold_ratio = [](double sign) {
    uint64_t s = 17;
    se::JobEngine e(kWorld, se::PolicyConfig{}, se::Time(0));
    for (uint64_t it = 0; it < 150; ++it)
      for (uint32_t r = 0; r < kWorld; ++r) {
        se::Report rep;
        rep.rank = r;
        rep.iteration = it;
        const double w = 500 + 1500 * Unit(s);
        const double tail = Unit(s) < 0.1 ? 0.45 : -0.05;
        rep.compute_seconds = 1e-4 * w * std::exp(sign * tail);
        rep.work = w;
        REQUIRE(e.Ingest(rep, se::Time(static_cast<int64_t>(it) * 100'000'000 + r)).accepted);
        // Every rank draws its work alike: nobody's time is the data's doing.
        CHECK_FALSE(e.Worker(r).data.has_value());
      }
    const se::JobView v = e.View();
    REQUIRE(v.baseline_seconds > 0);
    return v.threshold_seconds / v.baseline_seconds;
  };
  const double slow_tail = threshold_ratio(+1), fast_tail = threshold_ratio(-1);
  INFO("threshold / median: slow tail " << slow_tail << ", fast tail " << fast_tail);
  // Around the median (-0.05): the variance is 0.1 x 0.5^2 = 0.025, so the
  // fast tail's threshold is exp(1.5 x 0.158) ~ 1.27; the slow side's,
  // twice its mean square above the median, is 0.05: exp(1.5 x 0.224) ~ 1.40.
  CHECK(slow_tail > 1.05 * fast_tail);
  CHECK(fast_tail == Approx(std::exp(1.5 * std::sqrt(0.025))).epsilon(0.05));
  CHECK(slow_tail == Approx(std::exp(1.5 * std::sqrt(0.05))).epsilon(0.05));
}
