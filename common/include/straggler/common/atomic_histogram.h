// A Prometheus histogram for hot paths (the ingest batch duration), with
// prometheus::Histogram's bucket rules; AddHistogram builds its sample at
// scrape time.
//
//   AtomicHistogram h({0.001, 0.01, 0.1});
//   h.Observe(0.004);                       // any thread, no lock
//   AddHistogram(family, {{"job", "bert"}}, h);
//
// Thread safety: Observe and Collect are safe from any number of threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "straggler/common/metric_family.h"

namespace straggler::common {

// Observe is one relaxed atomic increment of the value's bucket and an
// atomic add to the sum, no mutex (prometheus::Histogram 1.0.1 locks one per
// observation). A value goes to the first bucket whose upper bound is >= it
// (+Inf for none, NaN included), as in prometheus::Histogram. Collect() gives
// the same ClientMetric: cumulative buckets, +Inf last, sample_count = the
// +Inf bucket's count. A scrape concurrent with observations may see a sum
// that does not yet (or already) include an observation its counts show.
class AtomicHistogram {
 public:
  // `bounds`: the buckets' upper bounds, ascending, without +Inf.
  explicit AtomicHistogram(std::vector<double> bounds);
  void Observe(double value);
  prometheus::ClientMetric Collect() const;

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, +Inf last; not cumulative
  std::atomic<double> sum_{0.0};
};
// A histogram sample of `family` (a Histogram family): `h`'s buckets.
void AddHistogram(prometheus::MetricFamily& family, Labels labels, const AtomicHistogram& h);

}  // namespace straggler::common
