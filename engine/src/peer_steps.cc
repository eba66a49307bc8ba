#include "peer_steps.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace straggler::engine::internal {
namespace {

// A rank's rate of severe steps: counts forgotten by kRateDecay a step (a
// horizon of ~500 steps), with a prior of kPriorSlow such steps in
// kPriorSteps (a rate of 1% before the job shows its own).
constexpr double kRateDecay = 0.998;
constexpr double kPriorSlow = 0.5;
constexpr double kPriorSteps = 50.0;
// RecentlyFast: the episode's mean log ratio L over at least kEpisodeSteps
// steps, and the last m steps with m such that L / 2 is kFastExitZ of their
// mean's standard deviations.
constexpr size_t kEpisodeSteps = 10;
constexpr double kFastExitZ = 4.5;
constexpr size_t kFastExitMin = 3;

// P(X >= c) for X ~ Binomial(n, p).
double Tail(size_t n, size_t c, double p) {
  double sum = 0.0;
  for (size_t k = c; k <= n; ++k) {
    double comb = 1.0;
    for (size_t i = 0; i < k; ++i)
      comb = comb * static_cast<double>(n - i) / static_cast<double>(i + 1);
    sum += comb * std::pow(p, static_cast<double>(k)) *
           std::pow(1.0 - p, static_cast<double>(n - k));
  }
  return sum;
}

}  // namespace

double Median(std::vector<double>& v) {
  const size_t n = v.size();
  auto mid = v.begin() + n / 2;
  std::nth_element(v.begin(), mid, v.end());
  if (n % 2 == 1) return *mid;
  return 0.5 * (*mid + *std::max_element(v.begin(), mid));
}

void PeerSteps::Push(const PolicyConfig& p, double x) {
  slow_steps_ = slow_steps_ * kRateDecay + (x >= std::log(p.peer_severe_ratio) ? 1.0 : 0.0);
  steps_ = steps_ * kRateDecay + 1.0;
  AddToWindows(p, x);
}

void PeerSteps::StartOver(const PolicyConfig& p) {
  const bool any = raw_count_ > 0;
  const double newest = Newest();
  Clear();
  if (any) AddToWindows(p, newest);
}

void PeerSteps::Clear() {
  window_.clear();
  window_next_ = 0;
  raw_count_ = raw_next_ = 0;
  long_count_ = long_next_ = 0;
  StartEpisode();
}

void PeerSteps::AddToWindows(const PolicyConfig& p, double x) {
  raw_[raw_next_] = x;
  raw_next_ = (raw_next_ + 1) % kRaw;
  raw_count_ = std::min(raw_count_ + 1, kRaw);
  const double cut = std::log(p.peer_spike_ratio);
  if (x >= cut) return;  // a spike: not evidence of a lasting slowdown
  const double v = std::max(x, -cut);
  long_[long_next_] = v;
  long_next_ = (long_next_ + 1) % kLong;
  long_count_ = std::min(long_count_ + 1, kLong);
  if (window_.size() < p.peer_window) {
    window_.push_back(v);
    return;
  }
  if (window_.size() > p.peer_window) {  // the window was made shorter
    window_.resize(p.peer_window);
    window_next_ = 0;
  }
  window_[window_next_] = v;
  window_next_ = (window_next_ + 1) % window_.size();
}

double PeerSteps::Rate() const { return (slow_steps_ + kPriorSlow) / (steps_ + kPriorSteps); }

bool PeerSteps::HaveWindow(const PolicyConfig& p) const {
  // Too few non-spike steps give no mild verdict (a rank 3x slow from its
  // start has none at all); the severe rule still applies.
  return window_.size() >= std::max<size_t>(3, p.peer_window / 2);
}

double PeerSteps::Trimmed() const {
  double sum = 0.0, top = -std::numeric_limits<double>::infinity();
  for (double v : window_) {
    sum += v;
    top = std::max(top, v);
  }
  return (sum - top) / static_cast<double>(window_.size() - 1);
}

double PeerSteps::LongTrimmed() const {
  static_assert(kLongTrim == 2, "one pass keeps the two largest values");
  if (long_count_ < 2 * kLong / 3) return -std::numeric_limits<double>::infinity();
  // One pass (no copy, no sort): it runs for every rank at every row.
  constexpr double kLow = -std::numeric_limits<double>::infinity();
  double sum = 0.0, top = kLow, second = kLow;
  for (size_t i = 0; i < long_count_; ++i) {
    const double v = long_[i];
    sum += v;
    if (v > top) {
      second = top;
      top = v;
    } else if (v > second) {
      second = v;
    }
  }
  return (sum - top - second) / static_cast<double>(long_count_ - kLongTrim);
}

bool PeerSteps::Severe(const PolicyConfig& p, double rate, size_t* recent) const {
  const double s = std::log(p.peer_severe_ratio);
  size_t all = 0, span = 0, last = 0;
  for (size_t i = 0; i < raw_count_; ++i) {
    const bool slow = Newest(i) >= s;
    all += slow;
    if (i < kSevereSpan) span += slow;
    if (i < kSevereRun) last += slow;
  }
  *recent = last;
  return (span >= kSevereRun && Tail(kSevereSpan, span, rate) < kSevereAlpha) ||
         (all >= kSevereOf && Tail(kRaw, all, rate) < kSevereAlpha);
}

// A 3x rank in 3% noise needs 3 steps; a 1.3x rank in +-30% per-step
// variation would need 37, more than kRaw: it takes the slow way
// (peer_exit_rows rows with the window's mean below half the threshold).
bool PeerSteps::RecentlyFast(const PolicyConfig& p, double sigma) const {
  if (episode_steps_ < kEpisodeSteps) return false;
  const double level = episode_sum_ / episode_steps_;
  if (level <= 0.0) return false;
  const double root = 2.0 * kFastExitZ * sigma / level;  // sqrt(m)
  const double m = std::max<double>(kFastExitMin, std::ceil(root * root));
  if (m > static_cast<double>(kRaw) || static_cast<double>(raw_count_) < m) return false;
  const double cut = std::log(p.peer_spike_ratio);
  double sum = 0.0;
  for (size_t i = 0; i < static_cast<size_t>(m); ++i) {
    const double x = Newest(i);
    if (x >= level) return false;
    sum += std::max(x, -cut);
  }
  return sum / m < 0.5 * level;
}

void PeerSteps::AddToEpisode(const PolicyConfig& p) {
  if (raw_count_ == 0) return;
  const double cut = std::log(p.peer_spike_ratio);
  episode_sum_ += std::clamp(Newest(), -cut, cut);
  episode_steps_++;
}

void PeerSteps::StartEpisode() {
  episode_sum_ = 0.0;
  episode_steps_ = 0;
}

double PeerSteps::RecentRatio() const {
  double v[kSevereRun];
  const size_t n = std::min(raw_count_, kSevereRun);
  if (n == 0) return 1.0;
  for (size_t i = 0; i < n; ++i) v[i] = Newest(i);
  std::sort(v, v + n);
  return std::exp(n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

}  // namespace straggler::engine::internal
