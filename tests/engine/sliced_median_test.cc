// SlicedMedian and BandMedian (engine/src/sliced_median.h): the median of a
// large row in two passes, and of a smaller group in one pass around a guess,
// equal Median() of the same values bit for bit, however far the guess is
// off - only the number of values kept for the final selection grows, or
// BandMedian falls back to every value.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "peer_steps.h"
#include "sliced_median.h"

namespace si = straggler::engine::internal;

namespace {

// The median of `v` in SlicedMedian's passes; `kept`: how many it selected among.
double Sliced(const std::vector<double>& v, double guess, double scale, size_t* kept = nullptr) {
  si::SlicedMedian m;
  m.Begin(guess, scale);
  for (double x : v) m.Count(x);
  m.Plan();
  for (double x : v) m.Gather(x);
  if (kept) *kept = m.kept();
  return m.Take();
}

double Whole(std::vector<double> v) { return si::Median(v); }

// The median of `v` in BandMedian's pass; `m` keeps what it did.
double Band(si::BandMedian& m, const std::vector<double>& v, double guess, double half_width) {
  m.Begin(guess, half_width, v.size());
  for (double x : v) m.Add(x);
  std::vector<double> scratch;
  return m.Take(v, scratch);
}

}  // namespace

TEST_CASE("sliced median: equal to Median() for odd and even rows, any guess") {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> noise(0.0, 0.05);
  for (size_t n : {1u, 2u, 3u, 4u, 5u, 100u, 4097u, 10000u, 65536u}) {
    std::vector<double> v(n);
    for (double& x : v) x = std::log(0.1) + noise(rng);
    const double want = Whole(v);
    for (double guess : {std::log(0.1), std::log(0.1) + 0.02, std::log(0.1) - 3.0,
                         std::log(0.1) + 40.0, 0.0}) {
      for (double scale : {0.05, 1e-6, 10.0, 0.0, -1.0, std::nan("")}) {
        INFO("n " << n << " guess " << guess << " scale " << scale);
        CHECK(Sliced(v, guess, scale) == want);
      }
    }
  }
}

TEST_CASE("sliced median: ties, two clusters and outliers") {
  std::vector<double> equal(5000, -2.302585092994046);
  CHECK(Sliced(equal, -2.3, 0.05) == Whole(equal));
  // Two generations: half the ranks 1.6x slower; the middle pair straddles the gap.
  std::vector<double> two;
  for (int i = 0; i < 5000; ++i) two.push_back(-2.3 + 1e-5 * i);
  for (int i = 0; i < 5000; ++i) two.push_back(-1.83 + 1e-5 * i);
  CHECK(Sliced(two, -2.3, 0.05) == Whole(two));
  CHECK(Sliced(two, -1.83, 0.05) == Whole(two));
  // Spikes far outside the bins on both sides, and the extreme log values a
  // rank's clamp produces (log(1e-9)).
  std::vector<double> spikes = two;
  for (int i = 0; i < 700; ++i) spikes.push_back(i % 2 ? 50.0 : std::log(1e-9));
  CHECK(Sliced(spikes, -2.0, 0.05) == Whole(spikes));
  // Rates of severe steps: most ranks exactly equal (no severe step), a few
  // apart, the median among the equal ones or next to them; even and odd.
  for (size_t n : {4096u, 4097u}) {
    std::vector<double> rates(n, 0.0123);
    for (size_t i = 0; i < n / 3; ++i) rates[i * 3] = 0.0123 + 1e-4 * static_cast<double>(i % 7);
    CHECK(Sliced(rates, 0.01, 0.01 / 8) == Whole(rates));
    std::vector<double> half(n, 0.01);
    for (size_t i = 0; i < n / 2; ++i) half[i] = 0.02;
    CHECK(Sliced(half, 0.01, 0.01 / 8) == Whole(half));
  }
}

TEST_CASE("sliced median: a close guess keeps a small share of the row") {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0.0, 0.05);
  std::vector<double> v(100000);
  for (double& x : v) x = noise(rng);
  size_t near = 0, far = 0;
  CHECK(Sliced(v, 0.0, 0.05, &near) == Whole(v));
  CHECK(Sliced(v, 2.0, 0.05, &far) == Whole(v));  // 40 sigma off: all below the bins
  CHECK(near < v.size() / 100);
  CHECK(far > v.size() / 2);
}

TEST_CASE("median: a few values, with ties, give the middle values of a full sort") {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> pick(0, 6);  // ties on purpose
  for (size_t n = 1; n <= 40; ++n) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<double> v(n);
      for (double& x : v) x = -2.3 + 0.01 * pick(rng) + (trial % 2 ? 1e-7 * pick(rng) : 0.0);
      std::vector<double> s = v;
      std::sort(s.begin(), s.end());
      const double want = n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2] + s[n / 2 - 1]);
      CHECK(Whole(v) == want);
    }
  }
}

TEST_CASE("band median: equal to Median() for odd and even groups, any guess and width") {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> noise(0.0, 0.05);
  si::BandMedian m;
  const double nan = std::nan("");
  for (size_t n : {1u, 2u, 3u, 4u, 5u, 64u, 999u, 1000u, 4095u}) {
    std::vector<double> v(n);
    for (double& x : v) x = std::log(0.1) + noise(rng);
    const double want = Whole(v);
    for (double guess : {std::log(0.1), std::log(0.1) + 0.02, std::log(0.1) - 3.0, 40.0, nan}) {
      for (double width : {0.005, 1e-9, 10.0, 0.0, -1.0, nan}) {
        INFO("n " << n << " guess " << guess << " width " << width);
        CHECK(Band(m, v, guess, width) == want);
      }
    }
  }
}

TEST_CASE("band median: a close guess selects among a few, a far one or a NaN falls back") {
  std::mt19937_64 rng(9);
  std::normal_distribution<double> noise(0.0, 0.05);
  std::vector<double> v(1000);
  for (double& x : v) x = noise(rng);
  si::BandMedian m;
  CHECK(Band(m, v, 0.0, 0.05 / 8) == Whole(v));
  CHECK(m.hit());
  CHECK(m.kept() < v.size() / 8);
  // A job-wide jump: the middle is far outside the band.
  CHECK(Band(m, v, 1.0, 0.05 / 8) == Whole(v));
  CHECK_FALSE(m.hit());
  CHECK(m.NextWidth(0.05) == 2 * 0.05 / 8);  // wider after a miss
  // Ties: every value equal to the guess is in the band.
  std::vector<double> equal(1000, -2.302585092994046);
  CHECK(Band(m, equal, -2.302585092994046, 0.01) == Whole(equal));
  CHECK(m.hit());
  CHECK(m.NextWidth(0.05) < 0.01);  // it kept them all: narrower
  // A NaN among the values: not counted on either side, so no band result.
  std::vector<double> with_nan = v;
  with_nan[17] = std::nan("");
  Band(m, with_nan, 0.0, 0.05);
  CHECK_FALSE(m.hit());
  // No band yet: the hint sets the first width.
  m.Begin(std::nan(""), 0.0, v.size());
  CHECK(m.NextWidth(0.08) == 0.01);
  CHECK(m.NextWidth(0.0) == 0.0);
}

TEST_CASE("band median: two generations in one group, the middle in the gap") {
  std::vector<double> two;
  for (int i = 0; i < 500; ++i) two.push_back(-2.3 + 1e-5 * i);
  for (int i = 0; i < 500; ++i) two.push_back(-1.83 + 1e-5 * i);
  si::BandMedian m;
  for (double guess : {-2.3, -2.07, -1.83})
    for (double width : {0.001, 0.1, 0.3}) CHECK(Band(m, two, guess, width) == Whole(two));
}
