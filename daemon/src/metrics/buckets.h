// The bucket bounds of the daemon's histograms, next to the counters that
// observe into them (stats.h, registry/job_registry.h) and apart from the
// exposition (daemon_metrics.h) so that neither includes the other.
#pragma once

#include <vector>

namespace straggler::daemon {

// straggler_ingest_batch_duration_seconds: 10 us .. 100 ms.
inline const std::vector<double>& IngestBatchDurationBuckets() {
  static const std::vector<double> buckets = {1e-5,   2.5e-5, 5e-5,   1e-4, 2.5e-4,
                                              5e-4,   1e-3,   2.5e-3, 5e-3, 1e-2,
                                              2.5e-2, 5e-2,   1e-1};
  return buckets;
}

// straggler_job_detection_latency_iterations: Fibonacci, 1 .. 89.
inline const std::vector<double>& DetectionLatencyBuckets() {
  static const std::vector<double> buckets = {1, 2, 3, 5, 8, 13, 21, 34, 55, 89};
  return buckets;
}

}  // namespace straggler::daemon
