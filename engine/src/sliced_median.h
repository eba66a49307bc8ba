// The exact median of a large row's values in passes that a row judged in
// slices (docs/detection.md, "Large rows") spreads over many calls, so that
// no one call selects over the whole row. Plain data, one thread at a time
// (the engine's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace straggler::engine::internal {

// Pass one (Count) files every value in a histogram around a guess (the
// previous row's median); pass two (Gather) keeps only the values of the
// bins that hold the middle; Take selects among those few. The result is
// Median()'s on the same values, bit for bit: the same one or two middle
// values, combined the same way. A guess far off (a job-wide jump) only
// makes the kept set larger, never the answer different.
class SlicedMedian {
 public:
  // Starts a median of values expected near `guess`, `scale` apart (a log
  // ratio's noise sigma); `scale` <= 0 or not finite (no guess yet): every
  // value is kept.
  void Begin(double guess, double scale);
  // Pass one: every value once, in any order.
  void Count(double x) { ++counts_[Bin(x)]; }
  // Between the passes: picks the bins that hold the middle value(s).
  void Plan();
  // Pass two: every value again.
  void Gather(double x) {
    const uint32_t b = Bin(x);
    if (b >= first_ && b <= last_) kept_.push_back(x);
  }
  // The median (0 for no values); the kept values are reordered.
  double Take();

  // Values kept by Gather so far (tests: how far the guess was off).
  size_t kept() const { return kept_.size(); }

 private:
  // Bins 1..kBins span [base_, base_ + kBins / inv_width_); 0 and kBins + 1
  // take everything below and above (so a value's bin is a pure function of
  // it: Count and Gather agree).
  static constexpr uint32_t kBins = 4096;
  uint32_t Bin(double x) const {
    if (!(x >= base_)) return 0;
    const double b = (x - base_) * inv_width_;
    return b < kBins ? 1 + static_cast<uint32_t>(b) : kBins + 1;
  }

  double base_ = 0.0;
  double inv_width_ = 0.0;
  std::vector<uint32_t> counts_;
  uint32_t first_ = 0, last_ = 0;  // the kept bins
  size_t n_ = 0;
  size_t offset_ = 0;  // values in bins below first_
  std::vector<double> kept_;
};

}  // namespace straggler::engine::internal
