// The pipeline model of straggler-sim --topology RxSxT (docs/tools.md,
// "The pipeline model"): what a hybrid-parallel job's throughput would be,
// computed from the modelled step times, not from wall-clock sleeps, so the
// figures are deterministic and a test can compare them without a timed
// assert.
//
// 1F1B with M microbatches (--microbatches): a rank's per-microbatch time is
// its modelled compute (--iteration-ms x its slowdown x its stage's cost)
// divided by M; a stage is as slow as its slowest tensor rank; a replica's
// step is (M + S - 1) x its slowest stage's per-microbatch time; the
// data-parallel all-reduce waits for the slowest ACTIVE replica. Throughput
// is microbatches per second: active replicas x M / the job's step time.
// Each completed step is recorded twice: with the replicas that took part
// (as run) and with all of them (what the job would do without exclusion).
//
//   PipelineModel model(options);          // options.topology set
//   model.Record(i, active_ranks);         // per completed step
//   PipelineSummary s = model.Summarize(); // after the run
//
// Thread safety: Record and Summarize may be called from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "options.h"

namespace straggler_sim {

// Throughput over a stretch of iterations, microbatches per second.
struct StretchThroughput {
  uint64_t from = 0;  // [from, to) of job iterations
  uint64_t to = 0;
  uint64_t iterations = 0;  // completed steps in it
  double with_exclusion = 0;
  double without_exclusion = 0;
};

struct PipelineSummary {
  uint32_t microbatches = 0;
  // All replicas, nobody slowed: R x M / ((M + S - 1) x slowest stage).
  double healthy = 0;
  StretchThroughput run;           // every completed step
  std::vector<StretchThroughput> slow;  // one per --slow window, in order
  // The steps some replica sat out: their count and throughput as run.
  uint64_t reduced_iterations = 0;
  double reduced = 0;
};

class PipelineModel {
 public:
  explicit PipelineModel(const SimOptions& options);

  // The replica of `rank` (rank = t + T*(r + R*s)).
  uint32_t ReplicaOf(uint32_t rank) const;
  // The modelled step of one replica at job iteration `iteration`, seconds.
  double ReplicaSeconds(uint32_t replica, uint64_t iteration) const;
  // The job's modelled step when the replicas marked in `active` take part:
  // the slowest of them (0 when none does).
  double StepSeconds(uint64_t iteration, const std::vector<bool>& active) const;

  // Step `iteration` completed with `members` (ranks) taking part.
  void Record(uint64_t iteration, const std::vector<uint32_t>& members);
  PipelineSummary Summarize() const;

 private:
  struct Step {
    bool done = false;
    uint32_t replicas = 0;  // that took part
    double seconds = 0;     // as run
    double all_seconds = 0;  // every replica
  };
  StretchThroughput Stretch(uint64_t from, uint64_t to) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SimOptions o_;
  mutable absl::Mutex mu_;
  std::vector<Step> steps_ ABSL_GUARDED_BY(mu_);  // by iteration
};

}  // namespace straggler_sim
