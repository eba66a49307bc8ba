// WorkFit (work_fit.h): the candidate that leaves a group's steps the least
// spread, scored row by row.
#include "work_fit.h"

#include <algorithm>

namespace straggler::engine::internal {

void WorkFit::AddRow(std::vector<std::pair<double, double>>& points) {
  const size_t n = points.size();
  if (n < 3) return;
  // A row scored after skipped ones forgets as much as the rows between.
  const double forget = rows_ < kWarmRows ? kForget : kForgetEvery;
  ++seen_;
  if (rows_ == 0) {
    xs_.clear();
    for (const auto& [log_t, w] : points) xs_.push_back(w);
    std::nth_element(xs_.begin(), xs_.begin() + n / 2, xs_.end());
    reference_ = xs_[n / 2];
  }
  // u^p per exponent and point, then each overhead's log over them.
  pow_.resize(kExponents.size() * n);
  for (size_t i = 0; i < n; ++i) {
    const double log_u = std::log(points[i].second / reference_);
    for (size_t e = 0; e < kExponents.size(); ++e)
      pow_[e * n + i] = std::exp(kExponents[e] * log_u);
  }
  for (size_t k = 0; k < kCandidates; ++k) {
    xs_.clear();
    if (k == kTimeAlone) {
      for (const auto& [log_t, w] : points) xs_.push_back(log_t);
    } else {
      const double g = kOverheads[k / kExponents.size()];
      const double* u_p = &pow_[(k % kExponents.size()) * n];
      for (size_t i = 0; i < n; ++i) xs_.push_back(points[i].first - Cost(g, u_p[i]));
    }
    std::nth_element(xs_.begin(), xs_.begin() + n / 2, xs_.end());
    const double median = xs_[n / 2];
    double dev = 0.0;
    for (double x : xs_) dev += std::min(std::abs(x - median), kClip);
    score_[k] = forget * score_[k] + dev / static_cast<double>(n);
  }
  rows_++;
  // Least spread; time alone unless a candidate does strictly better.
  best_ = kTimeAlone;
  for (size_t k = 0; k < kTimeAlone; ++k)
    if (score_[k] < score_[best_]) best_ = k;
}

}  // namespace straggler::engine::internal
