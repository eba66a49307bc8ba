#include "straggler/quality/scoring.h"

#include <algorithm>
#include <numeric>

namespace straggler::quality {

Score ScoreFlags(const RankMatrix& truth, const RankMatrix& flagged, const RankMatrix& scored) {
  Score s;
  const uint32_t ranks = truth.ranks();
  const uint64_t n = truth.iterations();
  for (uint32_t r = 0; r < ranks; ++r) {
    for (uint64_t i = 0; i < n; ++i) {
      if (!scored.at(r, i)) continue;
      ++s.scored;
      const bool t = truth.at(r, i), f = flagged.at(r, i);
      if (t && f) ++s.tp;
      else if (!t && f) ++s.fp;
      else if (t && !f) ++s.fn;
      else ++s.tn;
    }
  }
  if (s.tp + s.fp > 0) s.precision = static_cast<double>(s.tp) / static_cast<double>(s.tp + s.fp);
  if (s.tp + s.fn > 0) s.recall = static_cast<double>(s.tp) / static_cast<double>(s.tp + s.fn);
  if (s.recall) {
    // No flags at all (precision undefined) means TP = 0: recall 0, F1 0.
    const double p = s.precision.value_or(0.0), r = *s.recall;
    s.f1 = p + r > 0 ? 2 * p * r / (p + r) : 0.0;
  }
  s.fp_per_1000 = s.scored ? 1000.0 * static_cast<double>(s.fp) / static_cast<double>(s.scored)
                           : 0.0;

  // Episodes: maximal runs of truth among scored cells.
  RankMatrix scored_truth(ranks, n);
  for (uint32_t r = 0; r < ranks; ++r)
    for (uint64_t i = 0; i < n; ++i) scored_truth.set(r, i, truth.at(r, i) && scored.at(r, i));
  const std::vector<Interval> episodes = Intervals(scored_truth);
  s.episodes = episodes.size();
  for (size_t k = 0; k < episodes.size(); ++k) {
    const Interval& e = episodes[k];
    std::optional<uint64_t> first;
    for (uint64_t i = e.from; i < e.to; ++i)
      if (flagged.at(e.rank, i)) {
        first = i;
        break;
      }
    if (!first) {
      ++s.missed;
      continue;
    }
    ++s.detected;
    s.detection_latencies.push_back(*first - e.from);
    for (uint64_t i = *first + 1; i < e.to; ++i)
      s.flaps += flagged.at(e.rank, i) && !flagged.at(e.rank, i - 1);
    if (e.to >= n) continue;  // truth lasts to the end of the trace
    const uint64_t next = (k + 1 < episodes.size() && episodes[k + 1].rank == e.rank)
                              ? episodes[k + 1].from
                              : n;
    ++s.recoverable;
    std::optional<uint64_t> unflag;
    for (uint64_t i = e.to; i < next && scored.at(e.rank, i); ++i)
      if (!flagged.at(e.rank, i)) {
        unflag = i;
        break;
      }
    if (unflag) {
      ++s.recovered;
      s.recovery_latencies.push_back(*unflag - e.to);
    } else {
      ++s.not_recovered;
    }
  }
  auto mean = [](const std::vector<uint64_t>& v) {
    return static_cast<double>(std::accumulate(v.begin(), v.end(), uint64_t{0})) /
           static_cast<double>(v.size());
  };
  if (!s.detection_latencies.empty()) {
    s.detection_latency_mean = mean(s.detection_latencies);
    s.detection_latency_max =
        *std::max_element(s.detection_latencies.begin(), s.detection_latencies.end());
  }
  if (!s.recovery_latencies.empty()) {
    s.recovery_latency_mean = mean(s.recovery_latencies);
    s.recovery_latency_max =
        *std::max_element(s.recovery_latencies.begin(), s.recovery_latencies.end());
  }
  for (const auto& run : Intervals(flagged)) {
    bool overlaps = false;
    for (uint64_t i = run.from; i < run.to && !overlaps; ++i)
      overlaps = truth.at(run.rank, i) && scored.at(run.rank, i);
    s.false_alarms += !overlaps;
  }
  return s;
}

}  // namespace straggler::quality
