#include "sliced_median.h"

#include <algorithm>
#include <cmath>

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
  kept_.clear();
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
  kept_.reserve(upto + counts_[b] - before);
}

double SlicedMedian::Take() {
  if (n_ == 0) return 0.0;
  // Equal values (healthy ranks' rates of severe steps often are): one bin
  // holds them all, and no selection over them is needed.
  const auto [lo, hi] = std::minmax_element(kept_.begin(), kept_.end());
  if (*lo == *hi) return *lo;
  // kept_ holds the values of ranks offset_ .. offset_ + kept_.size() - 1 of
  // the whole sorted row (bins are ordered by value): Median()'s middle.
  const auto mid = kept_.begin() + static_cast<std::ptrdiff_t>(n_ / 2 - offset_);
  std::nth_element(kept_.begin(), mid, kept_.end());
  if (n_ % 2 == 1) return *mid;
  return 0.5 * (*mid + *std::max_element(kept_.begin(), mid));
}

}  // namespace straggler::engine::internal
