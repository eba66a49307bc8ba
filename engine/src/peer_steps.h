// One rank's recent steps under the peer policy (docs/detection.md, "peer"):
// its log ratios to its reference in rings (the last steps with spikes, the
// short and the long window without), its rate of severe steps, and the
// statistics the policy's rules read from them. Plain data, one thread at a
// time (the engine's).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "straggler/engine/policy.h"

namespace straggler::engine::internal {

// Severe tier: kSevereRun of the last kSevereSpan steps, or kSevereOf of the
// last kRaw, at least peer_severe_ratio (5 of 6: a rank slow on 4 steps of 5
// within 5 of its onset)...
inline constexpr size_t kRaw = 10;
inline constexpr size_t kSevereRun = 5;
inline constexpr size_t kSevereSpan = 6;
inline constexpr size_t kSevereOf = 8;
// ...but only when so many slow steps are improbable (below kSevereAlpha)
// at the rate the rank's group has such steps anyway: in a job whose ranks
// spike one step in 20, five spikes in six steps come once in ~550 000 rank
// steps, so there the rule waits for six in a row (or 8 of 10).
inline constexpr double kSevereAlpha = 1e-7;
// The long window: a mild straggler in steps too noisy for the short window
// to tell apart within its length (1.3x under +-30% per-step variation) is
// found over kLong steps, against a threshold shrunk by the square root of
// how many more steps it averages.
inline constexpr size_t kLong = 20;
inline constexpr size_t kLongTrim = 2;  // its largest values left out
// How far a running sum's mean may be off the exact one: its terms are log
// ratios clipped to +-log(peer_spike_ratio) (at most ~7), summed at most
// 2 x 1000 times between exact sums, an error near 1e-12; 1e-9 leaves room.
inline constexpr double kSumSlack = 1e-9;

// The policy's ratios as log ratios, and its window length: taken once per
// policy, not per step (five log() calls per report were 7% of a daemon
// taking 2.5 M reports/s). Compared by value: a policy update (SetPolicy)
// is seen at the next report.
struct PeerLogs {
  double severe = 0.0;  // log(peer_severe_ratio)
  double spike = 0.0;   // log(peer_spike_ratio)
  double enter = 0.0;   // log(peer_enter_ratio)
  double straggler = 0.0;  // log(peer_straggler_ratio): the gray zone's top
  uint32_t window = 0;  // peer_window

  // Refreshes from `p`; true when its ratios changed since the last call
  // (then every PeerSteps must Recount). The check inline: it runs for
  // every report judged alone.
  bool Refresh(const PolicyConfig& p) {
    if (p.peer_window == window && p.peer_straggler_ratio == straggler_ratio_ &&
        p.peer_severe_ratio == severe_ratio_ && p.peer_spike_ratio == spike_ratio_ &&
        p.peer_enter_ratio == enter_ratio_)
      return false;
    return Changed(p);
  }

 private:
  bool Changed(const PolicyConfig& p);

  double severe_ratio_ = 0.0, spike_ratio_ = 0.0, enter_ratio_ = 0.0, straggler_ratio_ = 0.0;
};

// The short window's values: in place up to kInPlace of them (the default
// peer_window is 10), on the heap for a longer window. A std::vector took a
// heap block per rank (48 bytes for 10 floats, besides its own 24) in a
// million-rank job. The few vector calls PeerSteps makes, with a vector's
// values and order.
class WindowFloats {
 public:
  static constexpr uint16_t kInPlace = 10;

  WindowFloats() = default;
  WindowFloats(const WindowFloats& o) { *this = o; }
  WindowFloats& operator=(const WindowFloats& o);
  ~WindowFloats() { Free(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n > cap_) Grow(n);
  }
  void push_back(float v) {
    if (size_ == cap_) Grow(size_t{cap_} * 2);
    data()[size_++] = v;
  }
  // Only ever shrinks (the window was made shorter).
  void resize(size_t n) { size_ = static_cast<uint16_t>(std::min<size_t>(n, size_)); }
  float& operator[](size_t i) { return data()[i]; }
  float operator[](size_t i) const { return data()[i]; }
  const float* begin() const { return data(); }
  const float* end() const { return data() + size_; }

 private:
  bool OnHeap() const { return cap_ > kInPlace; }
  // On the heap, the block's address lies in in_place_'s first bytes: no
  // pointer member, so the whole is 44 bytes aligned to 4, not 48.
  float* Heap() const {
    float* p;
    std::memcpy(&p, in_place_, sizeof p);
    return p;
  }
  void SetHeap(float* p) { std::memcpy(in_place_, &p, sizeof p); }
  float* data() { return OnHeap() ? Heap() : in_place_; }
  const float* data() const { return OnHeap() ? Heap() : in_place_; }
  void Grow(size_t n);
  void Free() {
    if (OnHeap()) delete[] Heap();
  }

  float in_place_[kInPlace];
  uint16_t size_ = 0;
  uint16_t cap_ = kInPlace;  // peer_window <= 1000
  static_assert(sizeof(float*) <= sizeof(float) * kInPlace);
};

class PeerSteps {
 public:
  // A rank's rate of severe steps: counts forgotten by kRateDecay a step (a
  // horizon of ~500 steps), with a prior of kPriorSlow such steps in
  // kPriorSteps (a rate of 1% before the job shows its own).
  static constexpr double kRateDecay = 0.998;
  static constexpr double kPriorSlow = 0.5;
  static constexpr double kPriorSteps = 50.0;

  // A step's log ratio: into the rate of severe steps and every window.
  void Push(const PeerLogs& p, double x) {
    slow_steps_ = slow_steps_ * kRateDecay + (x >= p.severe ? 1.0 : 0.0);
    steps_ = steps_ * kRateDecay + 1.0;
    AddToWindows(p, x);
  }
  // Every window starts over from the newest step (the rate stays): they
  // hold steps from before the rank became healthy again, which would flag
  // it on its past.
  void StartOver(const PeerLogs& p);
  // Empties the windows and the episode (the rate stays).
  void Clear();
  // Which of the last kRaw steps are severe, again, after the policy's
  // peer_severe_ratio changed (PeerLogs::Refresh returned true).
  void Recount(const PeerLogs& p);

  // Its rate of steps >= peer_severe_ratio, about the last 500 steps, with a
  // prior of 1% before it has its own.
  double Rate() const;
  // Whether the short window holds enough steps for a mild verdict: too few
  // non-spike steps give none (a rank 3x slow from its start has none at
  // all); the severe rule still applies. Inline, as the two below: every
  // rank's verdict asks them, and a call each was a tenth of peer's cost.
  bool HaveWindow(const PeerLogs& p) const {
    return window_.size() >= std::max<size_t>(3, p.window / 2);
  }
  // The short window's mean without its largest value.
  double Trimmed() const;
  // The long window's mean without its kLongTrim largest values, or -inf
  // while it holds fewer than two thirds of kLong.
  double LongTrimmed() const;
  // Whether Trimmed() (with HaveWindow) / LongTrimmed() may be >= `thr`:
  // false only when they are surely below it. O(1), from running sums: a
  // trimmed mean is at most the plain mean, and a healthy rank's plain mean
  // sits far below any threshold, so most ranks skip both passes.
  // Multiplied out, not divided: a division each was a tenth of a verdict
  // (the slack dwarfs the rounding either way).
  bool TrimmedMayReach(double thr) const {
    const double n = static_cast<double>(window_.size());
    return window_sum_ + kSumSlack * n >= thr * n;
  }
  bool LongMayReach(double thr) const {
    if (long_count_ < 2 * kLong / 3) return false;  // LongTrimmed() is -inf
    const double n = static_cast<double>(long_count_);
    return long_sum_ + kSumSlack * n >= thr * n;
  }
  // The severe rule at the group's rate of severe steps `rate`; `recent`:
  // how many of the last kSevereRun steps are severe (>= PeerLogs::severe as
  // of their Push or the last Recount).
  bool Severe(double rate, size_t* recent) const;
  // No severe step among the last kRaw (Severe is then false, `recent` 0).
  bool NoneSevere() const { return severe_bits_ == 0; }
  // The quick way back (docs/detection.md, "peer"): an episode that
  // averaged L over at least 10 steps is over when the last m steps average
  // below L / 2 with none at L, m = (9 sigma / L)^2 within [3, kRaw].
  bool RecentlyFast(const PeerLogs& p, double sigma) const;
  // A straggler's newest step, counted into its episode's level.
  void AddToEpisode(const PeerLogs& p);
  void StartEpisode();
  // The median ratio (not log) of the last kSevereRun steps, for messages.
  double RecentRatio() const;

 private:
  void AddToWindows(const PeerLogs& p, double x);
  // A running sum starts over from its ring's values (exact again), each
  // time its ring wraps.
  void ResumWindow();
  void ResumLong();
  double Newest(size_t back = 0) const { return raw_[(raw_next_ + kRaw - 1 - back) % kRaw]; }
  static_assert(kRaw <= 16 && kLong < 256, "severe_bits_ and the ring counters are narrow");

  // Running sums of window_ and long_, summed exactly again each time a
  // ring wraps, so their rounding error stays below kSumSlack.
  double window_sum_ = 0.0;
  double long_sum_ = 0.0;
  double slow_steps_ = 0.0;  // forgotten counts for the rate of severe steps
  double steps_ = 0.0;
  double episode_sum_ = 0.0;  // log ratios (spikes clipped) since it was flagged
  // The rings after the doubles, the narrow fields last: no padding. The
  // rings hold floats: a log ratio's 7 significant digits are far finer
  // than any threshold, and half the bytes count in a million-rank job (the
  // 58 scenarios and 280 seed-sweep runs give byte-identical reports).
  WindowFloats window_;  // ring of the last peer_window non-spike log ratios
  std::array<float, kRaw> raw_{};  // ring of the last kRaw log ratios, spikes included
  std::array<float, kLong> long_{};  // ring of the last kLong non-spike log ratios
  uint32_t episode_steps_ = 0;
  // Bit i: the step i before the newest in raw_ is >= PeerLogs::severe (Severe
  // counts them with a table instead of a pass over the ring).
  uint16_t severe_bits_ = 0;
  uint16_t window_next_ = 0;  // peer_window <= 1000
  uint8_t raw_count_ = 0;
  uint8_t raw_next_ = 0;
  uint8_t long_count_ = 0;
  uint8_t long_next_ = 0;
};

// The median of `v` (may be reordered): the mean of the two middle values
// for an even count, so that two halves of a group pull it alike. Up to 16
// values by a sorting network (branch-free), more by SelectMiddle.
double Median(std::span<double> v);
// Median()'s selection where `v` holds the middle of a larger set: the value
// at index `k` of sorted `v` and, unless the set's count is `odd`, the mean
// of it and the one below it (k >= 1 then). `v` is reordered. SlicedMedian
// and BandMedian select among the values they kept with it.
double SelectMiddle(std::span<double> v, size_t k, bool odd);

}  // namespace straggler::engine::internal
