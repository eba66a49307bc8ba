#include "straggler/common/atomic_histogram.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace straggler::common {

AtomicHistogram::AtomicHistogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void AtomicHistogram::Observe(double value) {
  // prometheus::Histogram's rule (a NaN finds no bound: +Inf).
  const size_t i = static_cast<size_t>(
      std::find_if(bounds_.begin(), bounds_.end(), [value](double b) { return b >= value; }) -
      bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

prometheus::ClientMetric AtomicHistogram::Collect() const {
  prometheus::ClientMetric m;
  m.histogram.bucket.resize(bounds_.size() + 1);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    m.histogram.bucket[i].cumulative_count = cumulative;
    m.histogram.bucket[i].upper_bound =
        i == bounds_.size() ? std::numeric_limits<double>::infinity() : bounds_[i];
  }
  m.histogram.sample_count = cumulative;
  m.histogram.sample_sum = sum_.load(std::memory_order_relaxed);
  return m;
}

void AddHistogram(prometheus::MetricFamily& family, Labels labels, const AtomicHistogram& h) {
  prometheus::ClientMetric m = h.Collect();
  m.label = std::move(labels);
  family.metric.push_back(std::move(m));
}
}  // namespace straggler::common
