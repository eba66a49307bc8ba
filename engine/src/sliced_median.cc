#include "sliced_median.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "peer_steps.h"

namespace straggler::engine::internal {

void SlicedMedian::Begin(double guess, double scale) {
  // The bins span 16 sigma either side of the guess: a row's median moves far
  // less between rows, and a bin is sigma / 128 wide, so the middle bin holds
  // about 0.4 / 128 = 0.3% of a normal row (a density of 0.4 / sigma at its
  // middle).
  if (std::isfinite(guess) && std::isfinite(scale) && scale > 0.0) {
    const double half = 16.0 * scale;
    base_ = guess - half;
    inv_width_ = kBins / (2.0 * half);
  } else {
    base_ = 0.0;  // two bins: below 0 and the rest (still exact, only coarse)
    inv_width_ = 0.0;
  }
  counts_.assign(kBins + 2, 0);
  kept_count_ = 0;
  if (kept_.empty()) kept_.resize(1);  // Gather's spare slot, before Plan sizes it
  first_ = last_ = 0;
  n_ = offset_ = 0;
}

void SlicedMedian::Plan() {
  n_ = 0;
  for (uint32_t c : counts_) n_ += c;
  if (n_ == 0) return;
  // Median() takes the value at n / 2 and, for an even count, the one below it.
  const size_t hi = n_ / 2;
  const size_t lo = n_ % 2 == 1 ? hi : hi - 1;
  size_t before = 0;
  uint32_t b = 0;
  while (before + counts_[b] <= lo) before += counts_[b++];
  first_ = b;
  offset_ = before;
  size_t upto = before;
  while (upto + counts_[b] <= hi) upto += counts_[b++];
  last_ = b;
  // The kept values and Gather's spare slot.
  const size_t kept = upto + counts_[b] - before;
  if (kept_.size() < kept + 1) kept_.resize(kept + 1);
}

double SlicedMedian::Take() {
  if (n_ == 0) return 0.0;
  const auto begin = kept_.begin();
  const auto end = begin + static_cast<std::ptrdiff_t>(kept_count_);
  // Equal values (healthy ranks' rates of severe steps often are): one bin
  // holds them all, and no selection over them is needed.
  const auto [lo, hi] = std::minmax_element(begin, end);
  if (*lo == *hi) return *lo;
  // The kept values are ranks offset_ .. offset_ + kept_count_ - 1 of the
  // whole sorted row (bins are ordered by value): Median()'s middle.
  return SelectMiddle({kept_.data(), kept_count_}, n_ / 2 - offset_, n_ % 2 == 1);
}

void BandMedian::Begin(double guess, double half_width, size_t n) {
  const bool band = std::isfinite(guess) && std::isfinite(half_width) && half_width > 0.0;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  width_ = band ? half_width : 0.0;
  lo_ = band ? guess - half_width : nan;
  hi_ = band ? guess + half_width : nan;
  below_ = above_ = kept_count_ = 0;
  hit_ = false;
  if (kept_.size() < n) kept_.resize(n);
}

double BandMedian::Take(std::span<const double> all, std::vector<double>& scratch) {
  const size_t n = all.size();
  if (n == 0) return 0.0;
  // Median() takes the value at n / 2 and, for an even count, the one below
  // it: both must lie in the band (a NaN anywhere leaves the counts short).
  const size_t hi = n / 2;
  const size_t lo = n % 2 == 1 ? hi : hi - 1;
  hit_ = below_ + kept_count_ + above_ == n && below_ <= lo && hi < below_ + kept_count_;
  if (!hit_) {
    scratch.assign(all.begin(), all.end());
    return Median(scratch);
  }
  // The kept values are ranks below_ .. below_ + kept_count_ - 1 of the
  // sorted group.
  return SelectMiddle({kept_.data(), kept_count_}, hi - below_, n % 2 == 1);
}

double BandMedian::NextWidth(double sigma_hint) const {
  if (width_ <= 0.0) return std::isfinite(sigma_hint) && sigma_hint > 0.0 ? sigma_hint / 8 : 0.0;
  const size_t n = below_ + kept_count_ + above_;
  if (!hit_) return 2.0 * width_;
  if (8 * kept_count_ > n) return 0.7 * width_;
  if (32 * kept_count_ < n) return 1.4 * width_;
  return width_;
}

}  // namespace straggler::engine::internal
