#include "peer_state.h"

#include <algorithm>
#include <limits>

namespace straggler::engine::internal {
namespace {

// Exponential forgetting of a group's noise estimate: about the last 50 rows.
constexpr double kNoiseAlpha = 0.02;
// A step beyond this many noise sigmas counts as this many in the estimate.
constexpr double kNoiseWinsor = 2.5;

}  // namespace

void GroupState::UpdateSteady(double m, std::vector<double>& scratch) {
  if (recent_count > 0) {
    const double d = m - steady_log;
    drift2 = have_drift ? (1 - kNoiseAlpha) * drift2 + kNoiseAlpha * d * d : d * d;
    have_drift = true;
  }
  recent_logs[recent_next] = m;
  recent_next = (recent_next + 1) % kSteadyRows;
  recent_count = std::min(recent_count + 1, kSteadyRows);
  scratch.assign(recent_logs.begin(), recent_logs.begin() + recent_count);
  steady_log = Median(scratch);
}

void GroupState::UpdateNoise(const std::vector<double>& x, double spike_log) {
  if (x.size() < 2) return;
  const double cap = NoiseCap();
  double sum = 0.0;
  for (double v : x) sum += NoiseTerm(v, spike_log, cap);
  AddNoise(sum, x.size());
}

double GroupState::NoiseCap() const {
  return have_noise ? kNoiseWinsor * kNoiseWinsor * noise2
                    : std::numeric_limits<double>::infinity();
}

void GroupState::AddNoise(double sum, size_t n) {
  if (n < 2) return;
  // Ratios to the row's own median spread less than the steps do.
  const double v =
      sum / static_cast<double>(n) * static_cast<double>(n) / static_cast<double>(n - 1);
  const double a = std::max(kNoiseAlpha, 1.0 / static_cast<double>(++noise_rows));
  noise2 = have_noise ? (1 - a) * noise2 + a * v : v;
  have_noise = true;
}

namespace {
// One row's mean square `sum` / (n - 1) into a variance forgotten like noise2.
void Fold(double sum, size_t n, double& var, bool& have, uint64_t& rows) {
  if (n < 2) return;
  const double v = sum / static_cast<double>(n - 1);
  const double a = std::max(kNoiseAlpha, 1.0 / static_cast<double>(++rows));
  var = have ? (1 - a) * var + a * v : v;
  have = true;
}
}  // namespace

void GroupState::AddUpper(double sum, size_t n) { Fold(sum, n, upper2, have_upper, upper_rows); }
void GroupState::AddTime(double sum, size_t n) { Fold(sum, n, time2, have_time, time_rows); }

}  // namespace straggler::engine::internal
