// Filling prometheus-cpp's data model (prometheus::MetricFamily,
// ClientMetric) for a Collectable's Collect(): AddFamily / AddSample, and
// Family<From> / AddJobFamilies, a table row per metric whose samples are
// read from a `From` (the daemon's stats, a job's row, an agent job's
// snapshot), so that adding such a metric is one row (docs/metrics.md).
//
//   std::vector<prometheus::MetricFamily> out;
//   auto& f = AddFamily(out, "straggler_job_ranks", prometheus::MetricType::Gauge,
//                       "World size.");
//   AddSample(f, {{"job", "bert"}}, 8);
//
// A sample's value goes to the member of the family's type (counter, gauge
// or untyped). Thread safety: the helpers work on the caller's vector only.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"

namespace straggler::common {

using Labels = std::vector<prometheus::ClientMetric::Label>;

// Appends a family to `out` and returns it (valid until `out` grows).
prometheus::MetricFamily& AddFamily(std::vector<prometheus::MetricFamily>& out, std::string name,
                                    prometheus::MetricType type, std::string help);
// A counter, gauge or untyped sample of `family`.
void AddSample(prometheus::MetricFamily& family, Labels labels, double value);

// A family whose one sample per `From` is `value(from)`.
template <class From>
struct Family {
  const char* name;
  prometheus::MetricType type;
  const char* help;
  double (*value)(const From&);
};

// Appends each of `families` with one sample per element of `rows`,
// labelled job=id, where `job_of(row)` gives the row's (id, From) pair.
template <class From, std::size_t N, class Rows, class JobOf>
void AddJobFamilies(std::vector<prometheus::MetricFamily>& out, const Family<From> (&families)[N],
                    const Rows& rows, JobOf job_of) {
  for (const Family<From>& f : families) {
    prometheus::MetricFamily& family = AddFamily(out, f.name, f.type, f.help);
    for (const auto& row : rows) {
      const auto& [id, from] = job_of(row);
      AddSample(family, {{"job", std::string(id)}}, f.value(from));
    }
  }
}

}  // namespace straggler::common
