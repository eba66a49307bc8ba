// Two reference straggler rules that other tools use, implemented here only
// to compare against (they are not engine policies). Both are approximations
// of the published rules, reduced to per-iteration compute times; see
// scenarios/README.md "Reference rules".
//
//  * nvrx — after NVIDIA Resiliency Extension's straggler detection
//    (nvidia_resiliency_ext.straggler, "relative performance score": the
//    best-performing rank is the reference; score 1.0 best, 0.5 = twice as
//    slow as the fastest rank). Here: each rank's median over its last
//    `window` reports; score = min over reporting ranks of their medians /
//    this rank's median; flagged while score < `threshold` (0.75). Ranks
//    with fewer than `min_samples` reports are neither scored nor a reference.
//  * greyhound — after Greyhound / FALCON (Wu et al., USENIX ATC 2025;
//    arXiv 2410.12588): a rank whose time exceeds 1.1 x the median of all
//    ranks is slow. Here: each rank's median over its last `window` reports;
//    a step is slow when that median > `ratio` x the median of the reporting
//    ranks' medians; a rank is flagged after `persistence` consecutive slow
//    steps and unflagged after `persistence` consecutive steps that are not.
//
//   NvrxRule rule(8, {});
//   std::vector<uint8_t> flags;
//   rule.Observe(times_of_iteration, flags);   // NaN = rank did not report
//
// Not thread-safe; one instance per replay.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "straggler/quality/trace.h"

namespace straggler::quality {

struct NvrxOptions {
  uint32_t window = 100;
  double threshold = 0.75;
  uint32_t min_samples = 10;
};

struct GreyhoundOptions {
  uint32_t window = 20;
  double ratio = 1.1;
  uint32_t persistence = 3;
  uint32_t min_samples = 5;
};

// Median of a small sample (the mean of the two middle values when even).
double Median(std::vector<double> v);

class NvrxRule {
 public:
  NvrxRule(uint32_t ranks, NvrxOptions options);
  // One iteration: times[r] is rank r's compute time (NaN: no report).
  // flags[r] becomes 1 while rank r is flagged (0 for ranks that did not report).
  void Observe(std::span<const double> times, std::vector<uint8_t>& flags);
  // Score of the last Observe (1.0 for ranks not scored).
  double score(uint32_t rank) const { return score_[rank]; }

 private:
  NvrxOptions o_;
  std::vector<std::deque<double>> window_;
  std::vector<double> score_;
};

class GreyhoundRule {
 public:
  GreyhoundRule(uint32_t ranks, GreyhoundOptions options);
  void Observe(std::span<const double> times, std::vector<uint8_t>& flags);

 private:
  GreyhoundOptions o_;
  std::vector<std::deque<double>> window_;
  std::vector<uint32_t> slow_run_, fast_run_;
  std::vector<uint8_t> flagged_;
};

// The rule over a whole trace: flags per (rank, row).
RankMatrix RunNvrx(const Trace& t, const NvrxOptions& o);
RankMatrix RunGreyhound(const Trace& t, const GreyhoundOptions& o);

}  // namespace straggler::quality
