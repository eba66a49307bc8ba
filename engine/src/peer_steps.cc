#include "peer_steps.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace straggler::engine::internal {
namespace {

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

// The median of 1..16 values as Median() takes it (the same one or two
// middle values, combined the same way): sorted by Batcher's odd-even merge
// network for 16 inputs (63 compare-exchanges, padded with +inf), min and
// max in registers, no branch. `nth_element` over a profile's 10 values took
// ~108 ns, mostly mispredicted branches, and the profile's end takes two such
// medians per rank (a 4 096-report batch then waited 7 ms at 65 536 ranks);
// this takes ~23 ns (engine_bench BM_Median). Unrolled with constant indices:
// a loop over a table of pairs kept the values in memory and was slower.
namespace {

double SmallMedian(std::span<const double> v) {
  const size_t n = v.size();
  double a[16];
  for (size_t i = 0; i < 16; ++i) a[i] = i < n ? v[i] : std::numeric_limits<double>::infinity();
  auto ce = [](double& x, double& y) {
    const double lo = std::min(x, y);
    y = std::max(x, y);
    x = lo;
  };
  ce(a[0], a[1]); ce(a[2], a[3]); ce(a[0], a[2]); ce(a[1], a[3]); ce(a[1], a[2]); ce(a[4], a[5]);
  ce(a[6], a[7]); ce(a[4], a[6]); ce(a[5], a[7]); ce(a[5], a[6]); ce(a[0], a[4]); ce(a[2], a[6]);
  ce(a[2], a[4]); ce(a[1], a[5]); ce(a[3], a[7]); ce(a[3], a[5]); ce(a[1], a[2]); ce(a[3], a[4]);
  ce(a[5], a[6]); ce(a[8], a[9]); ce(a[10], a[11]); ce(a[8], a[10]); ce(a[9], a[11]);
  ce(a[9], a[10]); ce(a[12], a[13]); ce(a[14], a[15]); ce(a[12], a[14]); ce(a[13], a[15]);
  ce(a[13], a[14]); ce(a[8], a[12]); ce(a[10], a[14]); ce(a[10], a[12]); ce(a[9], a[13]);
  ce(a[11], a[15]); ce(a[11], a[13]); ce(a[9], a[10]); ce(a[11], a[12]); ce(a[13], a[14]);
  ce(a[0], a[8]); ce(a[4], a[12]); ce(a[4], a[8]); ce(a[2], a[10]); ce(a[6], a[14]);
  ce(a[6], a[10]); ce(a[2], a[4]); ce(a[6], a[8]); ce(a[10], a[12]); ce(a[1], a[9]);
  ce(a[5], a[13]); ce(a[5], a[9]); ce(a[3], a[11]); ce(a[7], a[15]); ce(a[7], a[11]);
  ce(a[3], a[5]); ce(a[7], a[9]); ce(a[11], a[13]); ce(a[1], a[2]); ce(a[3], a[4]);
  ce(a[5], a[6]); ce(a[7], a[8]); ce(a[9], a[10]); ce(a[11], a[12]); ce(a[13], a[14]);
  return n % 2 == 1 ? a[n / 2] : 0.5 * (a[n / 2] + a[n / 2 - 1]);
}

}  // namespace

double SelectMiddle(std::span<double> v, size_t k, bool odd) {
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(k);
  std::nth_element(v.begin(), mid, v.end());
  if (odd) return *mid;
  return 0.5 * (*mid + *std::max_element(v.begin(), mid));
}

double Median(std::span<double> v) {
  const size_t n = v.size();
  if (n >= 1 && n <= 16) return SmallMedian(v);
  return SelectMiddle(v, n / 2, n % 2 == 1);
}

WindowFloats& WindowFloats::operator=(const WindowFloats& o) {
  if (this == &o) return *this;
  size_ = 0;
  reserve(o.size_);
  std::copy(o.begin(), o.end(), data());
  size_ = o.size_;
  return *this;
}

void WindowFloats::Grow(size_t n) {
  n = std::max<size_t>(n, kInPlace + 1);
  float* to = new float[n];
  std::copy(begin(), end(), to);
  Free();
  cap_ = static_cast<uint16_t>(n);
  SetHeap(to);
}

bool PeerLogs::Changed(const PolicyConfig& p) {
  window = p.peer_window;
  if (p.peer_straggler_ratio != straggler_ratio_) {  // no step counts by it: no Recount
    straggler_ratio_ = p.peer_straggler_ratio;
    straggler = std::log(straggler_ratio_);
  }
  if (p.peer_severe_ratio == severe_ratio_ && p.peer_spike_ratio == spike_ratio_ &&
      p.peer_enter_ratio == enter_ratio_)
    return false;
  severe_ratio_ = p.peer_severe_ratio;
  spike_ratio_ = p.peer_spike_ratio;
  enter_ratio_ = p.peer_enter_ratio;
  severe = std::log(severe_ratio_);
  spike = std::log(spike_ratio_);
  enter = std::log(enter_ratio_);
  return true;
}

void PeerSteps::StartOver(const PeerLogs& p) {
  const bool any = raw_count_ > 0;
  const double newest = Newest();
  Clear();
  if (any) AddToWindows(p, newest);
}

void PeerSteps::Clear() {
  window_.clear();
  window_next_ = 0;
  raw_count_ = raw_next_ = 0;
  severe_bits_ = 0;
  long_count_ = long_next_ = 0;
  window_sum_ = long_sum_ = 0.0;
  StartEpisode();
}

void PeerSteps::Recount(const PeerLogs& p) {
  severe_bits_ = 0;
  for (size_t i = raw_count_; i-- > 0;)
    severe_bits_ = static_cast<uint16_t>(severe_bits_ << 1 | (Newest(i) >= p.severe));
}

void PeerSteps::ResumWindow() {
  window_sum_ = 0.0;
  for (double v : window_) window_sum_ += v;
}

void PeerSteps::ResumLong() {
  long_sum_ = 0.0;
  for (size_t i = 0; i < long_count_; ++i) long_sum_ += long_[i];
}

void PeerSteps::AddToWindows(const PeerLogs& p, double x) {
  raw_[raw_next_] = x;
  severe_bits_ = static_cast<uint16_t>((severe_bits_ << 1 | (x >= p.severe)) & ((1u << kRaw) - 1));
  // Ring indices wrap by a compare, not %: kRaw, kLong and the window are
  // no powers of two, and a division per ring was a tenth of a report's cost.
  if (++raw_next_ == kRaw) raw_next_ = 0;
  raw_count_ = static_cast<uint8_t>(std::min<size_t>(raw_count_ + 1, kRaw));
  const double cut = p.spike;
  if (x >= cut) return;  // a spike: not evidence of a lasting slowdown
  // As stored (a float), so that the running sums add what the rings hold.
  const double v = static_cast<float>(std::max(x, -cut));
  if (long_count_ == kLong) long_sum_ -= long_[long_next_];
  long_[long_next_] = v;
  long_sum_ += v;
  long_count_ = static_cast<uint8_t>(std::min<size_t>(long_count_ + 1, kLong));
  if (++long_next_ == kLong) {
    long_next_ = 0;
    ResumLong();
  }
  if (window_.size() < p.window) {
    if (window_.empty()) window_.reserve(p.window);  // one allocation, not a growth
    window_.push_back(v);
    window_sum_ += v;
    return;
  }
  bool wrapped = false;
  if (window_.size() > p.window) {  // the window was made shorter
    window_.resize(p.window);
    window_next_ = 0;
    wrapped = true;
  }
  window_sum_ += v - window_[window_next_];
  window_[window_next_] = v;
  if (++window_next_ == window_.size()) window_next_ = 0;
  if (wrapped || window_next_ == 0) ResumWindow();
}

double PeerSteps::Rate() const { return (slow_steps_ + kPriorSlow) / (steps_ + kPriorSteps); }

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

bool PeerSteps::Severe(double rate, size_t* recent) const {
  // A table, not std::popcount: without -mpopcnt that is a libgcc call.
  static constexpr auto kOnes = [] {
    std::array<uint8_t, 1u << kRaw> t{};
    for (size_t i = 1; i < t.size(); ++i) t[i] = static_cast<uint8_t>(t[i / 2] + (i & 1));
    return t;
  }();
  if (severe_bits_ == 0) {  // most ranks: no severe step among the last kRaw
    *recent = 0;
    return false;
  }
  const auto count = [&](size_t n) { return size_t{kOnes[severe_bits_ & ((1u << n) - 1)]}; };
  const size_t all = count(kRaw), span = count(kSevereSpan);
  *recent = count(kSevereRun);
  return (span >= kSevereRun && Tail(kSevereSpan, span, rate) < kSevereAlpha) ||
         (all >= kSevereOf && Tail(kRaw, all, rate) < kSevereAlpha);
}

// A 3x rank in 3% noise needs 3 steps; a 1.3x rank in +-30% per-step
// variation would need 37, more than kRaw: it takes the slow way
// (peer_exit_rows rows with the window's mean below half the threshold).
bool PeerSteps::RecentlyFast(const PeerLogs& p, double sigma) const {
  if (episode_steps_ < kEpisodeSteps) return false;
  const double level = episode_sum_ / episode_steps_;
  if (level <= 0.0) return false;
  const double root = 2.0 * kFastExitZ * sigma / level;  // sqrt(m)
  const double m = std::max<double>(kFastExitMin, std::ceil(root * root));
  if (m > static_cast<double>(kRaw) || static_cast<double>(raw_count_) < m) return false;
  const double cut = p.spike;
  double sum = 0.0;
  for (size_t i = 0; i < static_cast<size_t>(m); ++i) {
    const double x = Newest(i);
    if (x >= level) return false;
    sum += std::max(x, -cut);
  }
  return sum / m < 0.5 * level;
}

void PeerSteps::AddToEpisode(const PeerLogs& p) {
  if (raw_count_ == 0) return;
  const double cut = p.spike;
  episode_sum_ += std::clamp(Newest(), -cut, cut);
  episode_steps_++;
}

void PeerSteps::StartEpisode() {
  episode_sum_ = 0.0;
  episode_steps_ = 0;
}

double PeerSteps::RecentRatio() const {
  double v[kSevereRun];
  const size_t n = std::min<size_t>(raw_count_, kSevereRun);
  if (n == 0) return 1.0;
  for (size_t i = 0; i < n; ++i) v[i] = Newest(i);
  std::sort(v, v + n);
  return std::exp(n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

}  // namespace straggler::engine::internal
