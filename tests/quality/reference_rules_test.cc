// The two reference rules (bench only), case by case.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "straggler/quality/reference_rules.h"

using namespace straggler::quality;

namespace {
constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
}

TEST_CASE("Median of odd and even samples") {
  CHECK(Median({3, 1, 2}) == 2);
  CHECK(Median({4, 1, 3, 2}) == 2.5);
  CHECK(std::isnan(Median({})));
}

TEST_CASE("nvrx: score = fastest median / own median, flagged below 0.75") {
  NvrxRule rule(3, {.window = 3, .threshold = 0.75, .min_samples = 3});
  std::vector<uint8_t> f;
  const std::vector<double> row = {1.0, 1.1, 2.0};
  rule.Observe(row, f);
  rule.Observe(row, f);
  CHECK(f == std::vector<uint8_t>{0, 0, 0});  // 2 samples < min_samples: nobody scored
  rule.Observe(row, f);
  // medians 1.0, 1.1, 2.0 -> scores 1.0, 0.909, 0.5
  CHECK(rule.score(0) == Approx(1.0));
  CHECK(rule.score(1) == Approx(1.0 / 1.1));
  CHECK(rule.score(2) == Approx(0.5));
  CHECK(f == std::vector<uint8_t>{0, 0, 1});
  // rank 2 speeds up: window {2, 2, 1} -> median 2, still flagged ...
  rule.Observe(std::vector<double>{1.0, 1.1, 1.0}, f);
  CHECK(f[2] == 1);
  // ... window {2, 1, 1} -> median 1: score 1.0
  rule.Observe(std::vector<double>{1.0, 1.1, 1.0}, f);
  CHECK(f == std::vector<uint8_t>{0, 0, 0});
}

TEST_CASE("nvrx: exactly 0.75 is not a straggler, a silent rank is neither flagged nor the reference") {
  NvrxRule rule(3, {.window = 1, .threshold = 0.75, .min_samples = 1});
  std::vector<uint8_t> f;
  rule.Observe(std::vector<double>{3.0, 4.0, kNone}, f);  // 3/4 = 0.75
  CHECK(f == std::vector<uint8_t>{0, 0, 0});
  rule.Observe(std::vector<double>{3.0, 4.1, kNone}, f);  // 3/4.1 < 0.75
  CHECK(f == std::vector<uint8_t>{0, 1, 0});
  rule.Observe(std::vector<double>{kNone, 4.1, 1.0}, f);  // rank 0 silent; rank 2 is fastest
  CHECK(f == std::vector<uint8_t>{0, 1, 0});
  CHECK(rule.score(1) == Approx(1.0 / 4.1));
}

TEST_CASE("greyhound: > 1.1 x median of all ranks, with persistence both ways") {
  GreyhoundRule rule(4, {.window = 1, .ratio = 1.1, .persistence = 2, .min_samples = 1});
  std::vector<uint8_t> f;
  const std::vector<double> slow = {1.0, 1.0, 1.0, 1.2};  // median 1.0; 1.2 > 1.1
  rule.Observe(slow, f);
  CHECK(f[3] == 0);  // one slow step: not yet
  rule.Observe(slow, f);
  CHECK(f == std::vector<uint8_t>{0, 0, 0, 1});
  const std::vector<double> ok = {1.0, 1.0, 1.0, 1.05};
  rule.Observe(ok, f);
  CHECK(f[3] == 1);  // one good step: still flagged
  rule.Observe(ok, f);
  CHECK(f[3] == 0);
  // Exactly 1.1 x the median is not slow.
  rule.Observe(std::vector<double>{1.0, 1.0, 1.0, 1.1}, f);
  rule.Observe(std::vector<double>{1.0, 1.0, 1.0, 1.1}, f);
  CHECK(f[3] == 0);
}

TEST_CASE("greyhound: a slow step resets the good-step run (persistence is consecutive)") {
  GreyhoundRule rule(3, {.window = 1, .ratio = 1.1, .persistence = 3, .min_samples = 1});
  std::vector<uint8_t> f;
  const std::vector<double> slow = {1.0, 1.0, 2.0}, ok = {1.0, 1.0, 1.0};
  for (int i = 0; i < 3; ++i) rule.Observe(slow, f);
  CHECK(f[2] == 1);
  rule.Observe(ok, f);
  rule.Observe(ok, f);
  rule.Observe(slow, f);
  rule.Observe(ok, f);
  rule.Observe(ok, f);
  CHECK(f[2] == 1);  // never 3 good steps in a row
  rule.Observe(ok, f);
  CHECK(f[2] == 0);
}

TEST_CASE("greyhound: the window median smooths a single spike") {
  GreyhoundRule rule(3, {.window = 5, .ratio = 1.1, .persistence = 1, .min_samples = 5});
  std::vector<uint8_t> f;
  for (int i = 0; i < 5; ++i) rule.Observe(std::vector<double>{1.0, 1.0, 1.0}, f);
  rule.Observe(std::vector<double>{1.0, 1.0, 3.0}, f);  // window {1,1,1,1,3}: median 1
  CHECK(f[2] == 0);
}

TEST_CASE("RunNvrx / RunGreyhound over a trace give per-(rank, row) flags") {
  Trace t;
  t.ranks = 2;
  t.iterations = 4;
  t.compute = {1.0, 1.0, 1.0, 2.0, 1.0, 2.0, 1.0, 1.0};  // row-major: rank 1 slow at rows 1, 2
  t.epoch.assign(4, 0);
  const RankMatrix n = RunNvrx(t, {.window = 1, .threshold = 0.75, .min_samples = 1});
  CHECK(Intervals(n) == std::vector<Interval>{{1, 1, 3}});
  const RankMatrix g = RunGreyhound(t, {.window = 1, .ratio = 1.1, .persistence = 1, .min_samples = 1});
  // 2 ranks: median of {1, 2} = 1.5; 2 > 1.65 -> slow
  CHECK(Intervals(g) == std::vector<Interval>{{1, 1, 3}});
}
