// What Client::Report() stores in the queue, and how one becomes an
// IterationReport on the wire.
#pragma once

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "straggler/v1/straggler.pb.h"

namespace straggler::detail {

// The wall time stamped on a report only dates it (start_time = this -
// compute_seconds): CLOCK_REALTIME_COARSE (vDSO, a few ns, 1-4 ms resolution)
// instead of CLOCK_REALTIME (~30 ns here, half of Report()'s cost).
inline int64_t CoarseUnixNanos() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Fixed size, trivially copyable (see BoundedQueue).
struct QueuedReport {
  uint32_t rank;
  uint64_t epoch;
  uint64_t iteration;
  double compute_seconds;
  double step_seconds;             // NaN = absent
  double collective_wait_seconds;  // NaN = absent
  int64_t reported_unix_ns;        // wall clock when Report() was called
  // Issue 31 (straggler::StepDetails): NaN = absent. Last, so that the
  // fields Report()'s short forms write keep their offsets.
  double work;
  double input_wait_seconds;
  double optimizer_seconds;
};

inline void FillReport(const QueuedReport& q, ::straggler::v1::IterationReport* r) {
  r->set_rank(q.rank);
  r->set_epoch(q.epoch);
  r->set_iteration(q.iteration);
  r->set_compute_seconds(q.compute_seconds);
  if (!std::isnan(q.step_seconds)) r->set_step_seconds(q.step_seconds);
  if (!std::isnan(q.collective_wait_seconds))
    r->set_collective_wait_seconds(q.collective_wait_seconds);
  if (!std::isnan(q.work)) r->set_work(q.work);
  if (!std::isnan(q.input_wait_seconds)) r->set_input_wait_seconds(q.input_wait_seconds);
  if (!std::isnan(q.optimizer_seconds)) r->set_optimizer_seconds(q.optimizer_seconds);
  // The step started compute_seconds before it was reported. Garbage compute
  // times are the daemon's to reject with a reason; here they only must not
  // corrupt the timestamp.
  int64_t start_ns = q.reported_unix_ns;
  if (std::isfinite(q.compute_seconds) && q.compute_seconds > 0 && q.compute_seconds < 1e6)
    start_ns -= static_cast<int64_t>(q.compute_seconds * 1e9);
  // A fixed64, not the Timestamp sub-message 0.1 sent (docs/api.md).
  r->set_start_unix_nanos(static_cast<uint64_t>(std::max<int64_t>(start_ns, 1)));
}

}  // namespace straggler::detail
