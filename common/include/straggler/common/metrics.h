// Prometheus exposition on prometheus-cpp core (Debian prometheus-cpp-dev
// 1.0.1): the library's data model (prometheus::MetricFamily, ClientMetric),
// its Collectable interface and its Histogram; this header adds what 1.0.1
// lacks or does too slowly. docs/metrics.md says how to add a metric.
//
//  * TextSerializer: a prometheus::Serializer writing text format 0.0.4.
//    Unlike 1.0.1's prometheus::TextSerializer it writes NaN as "NaN",
//    escapes newlines in HELP, drops (and reports) invalid or repeated
//    names, and writes a 120 000-series scrape about 3x faster (appending to
//    one string, no iostream). Values: "+Inf", "-Inf", "NaN"; integers
//    without exponent where the double is an exact integer below 2^63 in
//    magnitude; otherwise the shortest digits that read back as the same
//    double, as a plain decimal for 1e-4 <= |v| < 1e21 ("0.00025") and as
//    d.ddde±XX outside ("1e-05", "1e+22"). `le` bounds use the same rule.
//
//  * AddFamily / AddSample / AddHistogram: fill the data model. A sample's
//    value goes to the member of the family's type (counter, gauge or
//    untyped); a histogram sample is AtomicHistogram::Collect() with labels
//    added.
//
//      std::vector<prometheus::MetricFamily> out;
//      auto& f = AddFamily(out, "straggler_job_ranks", prometheus::MetricType::Gauge,
//                          "World size.");
//      AddSample(f, {{"job", "bert"}}, 8);
//      std::string text = TextSerializer().Serialize(out);
//
//  * Family<From> / AddJobFamilies: a table row per metric whose samples
//    are read from a `From` (the daemon's stats, a job's row, an agent
//    job's snapshot); adding such a metric is one row (docs/metrics.md).
//
//  * AtomicHistogram: a histogram whose Observe takes no lock, for hot
//    paths (the ingest batch duration), with prometheus::Histogram's bucket
//    rules; AddHistogram builds its sample at scrape time.
//
//  * ProcessCollector: the process_* metrics of the Prometheus client
//    conventions, read from /proc at each Collect().
//
// Shared by stragglerd (daemon/src/metrics/daemon_metrics.h) and
// straggler-agent. Thread safety: TextSerializer and ProcessCollector are
// stateless (any thread); the Add* helpers work on the caller's vector;
// AtomicHistogram is safe from any number of threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"
#include "prometheus/serializer.h"

namespace straggler::common {

using Labels = std::vector<prometheus::ClientMetric::Label>;

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(std::string_view name);
// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved by Prometheus).
bool IsValidLabelName(std::string_view name);

std::string FormatValue(double v);
std::string EscapeHelp(std::string_view help);         // `\` -> `\\`, newline -> `\n`
std::string EscapeLabelValue(std::string_view value);  // also `"` -> `\"`

class TextSerializer final : public prometheus::Serializer {
 public:
  // The text of `families`. A family with an invalid or already written
  // name is dropped with its samples; a sample with an invalid or repeated
  // label name (or `le` on a histogram) is dropped; `status` (optional)
  // gets the first such error, OK when everything was written.
  std::string Write(const std::vector<prometheus::MetricFamily>& families,
                    absl::Status* status) const;

  std::string Serialize(const std::vector<prometheus::MetricFamily>& families) const override {
    return Write(families, nullptr);
  }
  void Serialize(std::ostream& out,
                 const std::vector<prometheus::MetricFamily>& families) const override {
    out << Write(families, nullptr);
  }
};

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

// A Prometheus histogram for hot paths: Observe is one relaxed atomic
// increment of the value's bucket and an atomic add to the sum, no mutex
// (prometheus::Histogram 1.0.1 locks one per observation). A value goes to
// the first bucket whose upper bound is >= it (+Inf for none, NaN included),
// as in prometheus::Histogram. Collect() gives the same ClientMetric:
// cumulative buckets, +Inf last, sample_count = the +Inf bucket's count.
// Thread-safe; a scrape concurrent with observations may see a sum that
// does not yet (or already) include an observation its counts show.
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

// The standard process_* values, from /proc; a value that cannot be read is
// nullopt and its family is left out.
struct ProcessStats {
  std::optional<double> cpu_seconds;
  std::optional<double> resident_memory_bytes;
  std::optional<double> virtual_memory_bytes;
  std::optional<double> open_fds;
  std::optional<double> max_fds;
  std::optional<double> start_time_seconds;
};
ProcessStats ReadProcessStats();
void AddProcessMetrics(const ProcessStats& p, std::vector<prometheus::MetricFamily>& out);

class ProcessCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

// Collects every collectable (in order) and serializes the families.
std::string Scrape(const std::vector<const prometheus::Collectable*>& collectables);

}  // namespace straggler::common
