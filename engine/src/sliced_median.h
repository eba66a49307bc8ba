// The exact median of a large row's values in passes that a row judged in
// slices (docs/detection.md, "Large rows") spreads over many calls, so that
// no one call selects over the whole row. Plain data, one thread at a time
// (the engine's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
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
    // Written always, kept only in range: no branch on the value (kept_ has
    // a spare slot past the kept values, Plan).
    const uint32_t b = Bin(x);
    kept_[kept_count_] = x;
    kept_count_ += (b >= first_) & (b <= last_);
  }
  // The median (0 for no values); the kept values are reordered.
  double Take();

  // Values kept by Gather so far (tests: how far the guess was off).
  size_t kept() const { return kept_count_; }

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
  size_t kept_count_ = 0;
};

// The exact median of a group's values in the one pass that takes its logs,
// for a group below SlicedMedian's size: Add counts each value below a band
// around a guess (the group's previous median) and keeps those within it,
// without a branch; Take selects among the kept only - a small share of the
// group - and falls back to Median() over every value when the middle lies
// outside the band (a job-wide jump). `nth_element` over a whole group of
// 1 000 was a seventh of peer's time per report, mostly mispredicted
// branches (BENCHMARKS.md, issue 29). The result is Median()'s, bit for bit
// (the same one or two middle values, combined the same way). Plain data,
// one thread at a time (the engine's).
class BandMedian {
 public:
  // Starts a median of `n` values (at most) expected near `guess`, within
  // `half_width` of it; `half_width` <= 0 or either not finite: no band (Take
  // is Median() over every value).
  void Begin(double guess, double half_width, size_t n);
  void Add(double x) {
    below_ += x < lo_;
    kept_[kept_count_] = x;
    kept_count_ += (x >= lo_) & (x <= hi_);
    above_ += x > hi_;
  }
  // The median of the added values (0 for none); `all` are the same values
  // in any order, read (copied into `scratch`) only when the band missed.
  double Take(std::span<const double> all, std::vector<double>& scratch);
  // The half width for the group's next row: a band that kept more than an
  // 8th of the values narrows, one that missed or kept less than a 32nd
  // widens; with no band yet, `sigma_hint` / 8 (the group's noise: about a
  // tenth of a normal group's values). 0 when no hint is usable.
  double NextWidth(double sigma_hint) const;

  // What the last Take did (tests): the values it selected among, and
  // whether the middle was within the band.
  size_t kept() const { return kept_count_; }
  bool hit() const { return hit_; }

 private:
  // Below lo_ or above hi_: outside the band (NaN bounds: no band; every
  // value then counts as neither, and Take falls back).
  double lo_ = 0.0, hi_ = 0.0;
  double width_ = 0.0;
  size_t below_ = 0, above_ = 0, kept_count_ = 0;
  bool hit_ = false;
  std::vector<double> kept_;  // sized for every value: Add writes before it decides
};

}  // namespace straggler::engine::internal
