#include "straggler/quality/reference_rules.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace straggler::quality {

double Median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t n = v.size();
  auto mid = v.begin() + n / 2;
  std::nth_element(v.begin(), mid, v.end());
  if (n % 2 == 1) return *mid;
  const double hi = *mid;
  const double lo = *std::max_element(v.begin(), mid);
  return (lo + hi) / 2;
}

namespace {

void Push(std::deque<double>& w, double t, uint32_t window) {
  w.push_back(t);
  while (w.size() > window) w.pop_front();
}

}  // namespace

NvrxRule::NvrxRule(uint32_t ranks, NvrxOptions options)
    : o_(options), window_(ranks), score_(ranks, 1.0) {}

void NvrxRule::Observe(std::span<const double> times, std::vector<uint8_t>& flags) {
  const uint32_t n = static_cast<uint32_t>(window_.size());
  flags.assign(n, 0);
  std::vector<double> median(n, std::numeric_limits<double>::quiet_NaN());
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t r = 0; r < n; ++r) {
    score_[r] = 1.0;
    if (std::isnan(times[r])) continue;
    Push(window_[r], times[r], o_.window);
    if (window_[r].size() < o_.min_samples) continue;
    median[r] = Median(std::vector<double>(window_[r].begin(), window_[r].end()));
    best = std::min(best, median[r]);
  }
  for (uint32_t r = 0; r < n; ++r) {
    if (std::isnan(median[r]) || median[r] <= 0) continue;
    score_[r] = best / median[r];
    flags[r] = score_[r] < o_.threshold;
  }
}

GreyhoundRule::GreyhoundRule(uint32_t ranks, GreyhoundOptions options)
    : o_(options), window_(ranks), slow_run_(ranks, 0), fast_run_(ranks, 0), flagged_(ranks, 0) {}

void GreyhoundRule::Observe(std::span<const double> times, std::vector<uint8_t>& flags) {
  const uint32_t n = static_cast<uint32_t>(window_.size());
  flags.assign(n, 0);
  std::vector<double> median(n, std::numeric_limits<double>::quiet_NaN());
  std::vector<double> all;
  for (uint32_t r = 0; r < n; ++r) {
    if (std::isnan(times[r])) continue;
    Push(window_[r], times[r], o_.window);
    if (window_[r].size() < o_.min_samples) continue;
    median[r] = Median(std::vector<double>(window_[r].begin(), window_[r].end()));
    all.push_back(median[r]);
  }
  if (all.size() < 2) {
    for (uint32_t r = 0; r < n; ++r) flags[r] = flagged_[r] && !std::isnan(times[r]);
    return;
  }
  const double reference = Median(all);
  for (uint32_t r = 0; r < n; ++r) {
    if (std::isnan(median[r])) continue;
    if (median[r] > o_.ratio * reference) {
      fast_run_[r] = 0;
      if (++slow_run_[r] >= o_.persistence) flagged_[r] = 1;
    } else {
      slow_run_[r] = 0;
      if (++fast_run_[r] >= o_.persistence) flagged_[r] = 0;
    }
    flags[r] = flagged_[r];
  }
}

namespace {

template <typename Rule>
RankMatrix RunRule(const Trace& t, Rule& rule) {
  RankMatrix m(t.ranks, t.iterations);
  std::vector<uint8_t> flags;
  for (uint64_t row = 0; row < t.iterations; ++row) {
    rule.Observe(std::span<const double>(&t.compute[static_cast<size_t>(row) * t.ranks], t.ranks),
                 flags);
    for (uint32_t r = 0; r < t.ranks; ++r)
      if (flags[r]) m.set(r, row, true);
  }
  return m;
}

}  // namespace

RankMatrix RunNvrx(const Trace& t, const NvrxOptions& o) {
  NvrxRule rule(t.ranks, o);
  return RunRule(t, rule);
}

RankMatrix RunGreyhound(const Trace& t, const GreyhoundOptions& o) {
  GreyhoundRule rule(t.ranks, o);
  return RunRule(t, rule);
}

}  // namespace straggler::quality
