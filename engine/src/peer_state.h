// What the peer reference (reference_peer.cc, docs/detection.md "peer")
// keeps per rank and per peer group. Plain data, one thread at a time (the
// engine's).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "peer_steps.h"
#include "work_fit.h"

namespace straggler::engine::internal {

// A report judged alone (an excluded rank's shadow step) ran at another time
// than the group's newest row: it is compared with the median of the group's
// last kSteadyRows row medians, so that one row's jitter (a CPU hog, a slow
// all-reduce) does not make a slow rank look fast.
constexpr size_t kSteadyRows = 5;
// Where a rank's ratios come from; its window starts over when this changes.
enum class Source : uint8_t { kNone, kGroup, kOwn };

struct PeerRank {
  Source source = Source::kNone;
  bool was_straggler = false;  // its state when this reference last judged it
  uint32_t group = 0;
  PeerSteps steps;
  // Consecutive rows, held at kMaxRows (Bump): far above every value they
  // are compared with (limit, peer_enter_rows, peer_exit_rows, peer_window:
  // at most 100 000), so they give the same verdicts as unbounded counts in
  // 8 bytes, not 12 (a million-rank job keeps one PeerRank per rank).
  static constexpr uint64_t kMaxRows = (uint64_t{1} << 21) - 1;
  static uint64_t Bump(uint64_t rows) { return rows < kMaxRows ? rows + 1 : rows; }
  uint64_t above_rows : 21 = 0;  // with a window at the threshold or above
  // While a straggler, healthy ones; while mild, ones with a full window
  // below the threshold.
  uint64_t below_rows : 21 = 0;
  // While a straggler: ones with its window below peer_straggler_ratio (it
  // leaves at peer_exit_rows). (The own baseline is not here:
  // PeerReference::bases_, built only for ranks that take one.)
  uint64_t gray_rows : 21 = 0;
  // The counters share one word: a verdict writes each only when it changes
  // (most ranks' stay 0), not three read-modify-writes of it in a row, each
  // waiting on the last (a fifth of a healthy rank's verdict, BENCHMARKS.md).
  void SetAbove(uint64_t v) {
    if (above_rows != v) above_rows = v;
  }
  void SetBelow(uint64_t v) {
    if (below_rows != v) below_rows = v;
  }
  void SetGray(uint64_t v) {
    if (gray_rows != v) gray_rows = v;
  }

  void Restart(Source s, uint32_t g) {
    source = s;
    group = g;
    steps.Clear();
    above_rows = below_rows = gray_rows = 0;
    was_straggler = false;
  }
  // Its windows start over from its newest step (PeerSteps::StartOver).
  void StartOver(const PeerLogs& p) {
    steps.StartOver(p);
    above_rows = below_rows = gray_rows = 0;
    was_straggler = false;
  }
};

static_assert(sizeof(PeerRank) <= 232, "a million-rank job keeps one per rank");

struct GroupState {
  bool have_noise = false;
  double noise2 = 0.0;      // variance of a step's log ratio
  uint64_t noise_rows = 0;
  // Judged per unit of work only: twice the mean square of the steps above
  // the median (the slow side's variance; noise2 where the spread is
  // symmetric). A unit that misses part of the cost (tokens where attention
  // grows as the square of a sequence) leaves residuals with a long slow
  // tail: a step that drew one long sequence is slower than its tokens say.
  // The thresholds, a one-sided test for slowness, are set from the larger
  // of the two (SigmaForThresholds).
  double upper2 = 0.0;
  bool have_upper = false;
  uint64_t upper_rows = 0;
  // Judged per unit of work only: the variance of a step's log ratio on time
  // alone (forgotten like noise2), and the threshold it gives, for the
  // `data` note (peer_data.h); 0 before a row was judged per unit of work.
  double time2 = 0.0;
  bool have_time = false;
  uint64_t time_rows = 0;
  double threshold_time = 0.0;
  uint64_t rows = 0;        // rows of the group with enough ranks
  bool profiled = false;    // past its first peer_profile_iterations rows
  double median = 0.0;     // seconds, its newest row
  double median_log = 0.0;  // log(median): where SlicedMedian looks first in the next row
  // BandMedian's half width around median_log for the next row (0: none yet).
  double median_band = 0.0;
  double threshold = 0.0;  // log ratio in force
  double threshold_long = 0.0;  // the long window's, taken with it (LongThreshold)
  bool pushed = false;  // this row's steps went in with PrepareGroup (else JudgeMember)
  bool judged = false;  // this row gives verdicts (past the profile)
  double slow_rate = 0.0;  // the median rank's rate of steps >= peer_severe_ratio
  uint64_t iteration = 0;  // its newest judged row's
  // How far a row's log median lands from the steady median of the rows
  // before it (squared, forgotten like noise2): the error a step judged
  // alone makes beyond the noise within a row.
  double drift2 = 0.0;
  bool have_drift = false;
  // The log medians of its last kSteadyRows rows (a ring), and their median,
  // taken once per row: what a step judged alone is compared with.
  std::array<double, kSteadyRows> recent_logs{};
  size_t recent_count = 0;
  size_t recent_next = 0;
  double steady_log = 0.0;
  // Its time per unit of work, where the job reports work (work_fit.h).
  WorkFit work;

  // A judged row's log median `m` into the steady median and its drift (how
  // far `m` lands from the steady median of the rows before it); `scratch`
  // is a buffer for the median.
  void UpdateSteady(double m, std::vector<double>& scratch);
  // Folds one row's log ratios `x` (of >= 2 ranks; clipped to +-`spike_log`,
  // log(peer_spike_ratio)) into the noise estimate.
  void UpdateNoise(const std::vector<double>& x, double spike_log);
  // The same in pieces, for a row judged in slices: the sum of NoiseTerm over
  // the row's ratios in order, with NoiseCap() taken before, into AddNoise.
  double NoiseCap() const;
  static double NoiseTerm(double x, double spike_log, double cap) {
    const double c = std::clamp(x, -spike_log, spike_log);
    return std::min(c * c, cap);
  }
  void AddNoise(double sum, size_t n);
  // A row's sum of 2 NoiseTerm(x) over its steps with x > 0, of n steps,
  // into upper2 (forgotten as noise2 is).
  void AddUpper(double sum, size_t n);
  // A row's sum of NoiseTerm(y) over n steps' log ratios on time alone, into time2.
  void AddTime(double sum, size_t n);
  // The spread the thresholds scale with: sqrt(noise2), or sqrt(upper2)
  // where the group judges per unit of work and its slow side is wider.
  double SigmaForThresholds() const {
    const bool upper = have_upper && work.active() && upper2 > noise2;
    return std::sqrt(upper ? upper2 : noise2);
  }
};

}  // namespace straggler::engine::internal
