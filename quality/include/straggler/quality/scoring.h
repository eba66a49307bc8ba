// Scoring a classification against ground truth, per (rank, iteration).
//
// Only cells where the rank reported are counted (`scored`). A cell is a true
// positive when flagged and true, a false positive when flagged and not true,
// a false negative when true and not flagged.
//  * precision = TP / (TP + FP), recall = TP / (TP + FN), F1 their harmonic
//    mean. precision is undefined (nullopt) without flags, recall without
//    truth; F1 is undefined without truth and 0 when nothing true was flagged.
//  * Episodes are the maximal runs of truth of one rank. Detection latency of
//    an episode [s, e): f - s for the first flagged row f in [s, e); an
//    episode with no flagged row in it is missed.
//  * Recovery latency of a detected episode that ends inside the trace:
//    u - e for the first row u >= e, before the rank's next episode and
//    while it still reports, that is not flagged; none such: not recovered.
//  * false positives per 1000 scored rank-iterations = 1000 x FP / scored.
//  * false alarms: flag runs that overlap no truth at all.
//  * flaps: within one episode, each time the rank is flagged again after
//    its flag was dropped (flagged, unflagged, flagged: 1 flap).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "straggler/quality/trace.h"

namespace straggler::quality {

struct Score {
  uint64_t scored = 0;  // rank-iterations counted
  uint64_t tp = 0, fp = 0, fn = 0, tn = 0;
  std::optional<double> precision, recall, f1;
  double fp_per_1000 = 0.0;
  uint64_t episodes = 0, detected = 0, missed = 0;
  std::vector<uint64_t> detection_latencies;  // per detected episode, in rows
  std::optional<double> detection_latency_mean;
  std::optional<uint64_t> detection_latency_max;
  uint64_t recoverable = 0;  // detected episodes that end inside the trace
  uint64_t recovered = 0, not_recovered = 0;
  std::vector<uint64_t> recovery_latencies;
  std::optional<double> recovery_latency_mean;
  std::optional<uint64_t> recovery_latency_max;
  uint64_t false_alarms = 0;
  uint64_t flaps = 0;
};

Score ScoreFlags(const RankMatrix& truth, const RankMatrix& flagged, const RankMatrix& scored);

}  // namespace straggler::quality
