// Time per unit of work for one peer group (docs/detection.md, "Own time and
// work"): a step of work w is expected to take s * (g + u^p) with u = w / W,
// W the group's reference work (the median work of its first row with
// work): a fixed per-step overhead g (in units of W's cost) plus a part that
// grows with the work, in proportion (p = 1) or faster or slower (a cost the
// reported unit only partly captures: tokens where attention grows as the
// square of a sequence). s is the group's speed in that row; its median
// takes s out. Steps are judged on log t - log((g + u^p) / (g + 1)): their
// time at the reference work, so the group's median stays in seconds.
//
// (g, p) is not fitted by least squares: a straggler or a spike would pull
// it. WorkFit scores a fixed grid - g from none to 16 in steps of sqrt(2),
// p from 1/2 to 2, and time alone (time does not follow work) - by how far each
// row's steps spread around their median under each candidate (a clipped
// mean absolute deviation, forgotten over ~30 rows), and uses the one that
// leaves the least. A few slow ranks add about the same to every candidate;
// the work that explains most of the steps wins. Plain data, one thread at a
// time (the engine's).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

namespace straggler::engine::internal {

class WorkFit {
 public:
  // Overheads tried, in units of the reference work's cost; the last is
  // unbounded (time alone), the same for every exponent.
  static constexpr std::array<double, 18> kOverheads = {
      0.0,   0.0625, 0.0884, 0.125, 0.177, 0.25, 0.354, 0.5, 0.707,
      1.0,   1.414,  2.0,    2.828, 4.0,   5.657, 8.0,  11.31, 16.0};
  static constexpr std::array<double, 11> kExponents = {0.5,   0.625, 0.75, 0.875, 1.0, 1.125,
                                                        1.25,  1.375, 1.5,  1.75,  2.0};
  static constexpr size_t kCandidates = kOverheads.size() * kExponents.size() + 1;
  static constexpr size_t kTimeAlone = kCandidates - 1;
  // Points of a row scored at most: an even stride over a larger group,
  // starting one rank further each scored row, so that every rank is
  // sampled in turn.
  static constexpr size_t kMaxPoints = 32;
  // The first kWarmRows rows are all scored, then one row in kEvery: a row
  // costs kMaxPoints x kCandidates logs, more than its reports' judging
  // (issue 31: half a daemon's CPU when every row of 128 points was scored).
  // The choice settles within the first rows; later rows only follow a
  // slow change of the job's work, and kEvery rows apart do that as well.
  static constexpr size_t kWarmRows = 30;
  static constexpr size_t kEvery = 4;

  // Whether the group's next row is scored (AddRow then does the work; a
  // row not wanted is only counted, so its points need not be gathered).
  bool WantsRow() const { return rows_ < kWarmRows || (seen_ - kWarmRows) % kEvery == 0; }
  // Counts a row that WantsRow() declined.
  void SkipRow() { ++seen_; }
  // Where the next row's stride of `stride` ranks starts.
  size_t Offset(size_t stride) const { return rows_ % stride; }

  // Scores one row of the group: `points` are (log t, w) with w finite and
  // > 0, at least 3 of them (fewer say nothing about the spread). The first
  // such row sets W.
  void AddRow(std::vector<std::pair<double, double>>& points);

  // log((g + u^p) / (g + 1)) for the chosen candidate: what is taken off a
  // step's log time. 0 before any row, when time does not follow work, and
  // for a step without work (w not finite: judged as if at W).
  double LogCost(double w) const {
    if (!active() || !(w > 0) || !std::isfinite(w)) return 0.0;
    return Cost(overhead(), std::exp(exponent() * std::log(w / reference_)));
  }
  // A report's work (none: 0, judged as if at W).
  double LogCost(const std::optional<double>& w) const { return w ? LogCost(*w) : 0.0; }

  // Whether steps are judged per unit of work (a row scored, a candidate
  // other than time alone chosen).
  bool active() const { return rows_ > 0 && best_ != kTimeAlone; }
  // The chosen overhead g (units of W's cost) and exponent p.
  double overhead() const {
    return best_ == kTimeAlone ? std::numeric_limits<double>::infinity()
                               : kOverheads[best_ / kExponents.size()];
  }
  double exponent() const {
    return best_ == kTimeAlone ? 0.0 : kExponents[best_ % kExponents.size()];
  }
  double reference_work() const { return reference_; }

 private:
  // Each row's score is forgotten at this rate: recent rows decide, and a
  // change of the job's work (a new data mix) is followed within ~30 rows.
  static constexpr double kForget = 0.97;
  static constexpr double kForgetEvery = [] {
    double f = 1.0;
    for (size_t i = 0; i < kEvery; ++i) f *= kForget;
    return f;
  }();
  // A step's deviation counts at most this much (log): spikes and
  // stragglers add a constant, not their size.
  static constexpr double kClip = 0.5;

  // log((g + u^p) / (g + 1)), given u^p.
  static double Cost(double g, double u_p) { return std::log((g + u_p) / (g + 1.0)); }

  std::array<double, kCandidates> score_{};
  size_t seen_ = 0;  // rows offered since the first scored one (scored or skipped)
  std::vector<double> xs_, pow_;  // scratch
  double reference_ = 0.0;
  size_t best_ = kTimeAlone;
  size_t rows_ = 0;
};

}  // namespace straggler::engine::internal
