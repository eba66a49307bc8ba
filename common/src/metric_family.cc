#include "straggler/common/metric_family.h"

#include <utility>

namespace straggler::common {

prometheus::MetricFamily& AddFamily(std::vector<prometheus::MetricFamily>& out, std::string name,
                                    prometheus::MetricType type, std::string help) {
  prometheus::MetricFamily& f = out.emplace_back();
  f.name = std::move(name);
  f.type = type;
  f.help = std::move(help);
  return f;
}

void AddSample(prometheus::MetricFamily& family, Labels labels, double value) {
  prometheus::ClientMetric& m = family.metric.emplace_back();
  m.label = std::move(labels);
  switch (family.type) {
    case prometheus::MetricType::Counter: m.counter.value = value; break;
    case prometheus::MetricType::Gauge: m.gauge.value = value; break;
    default: m.untyped.value = value; break;
  }
}
}  // namespace straggler::common
