// Prometheus text exposition (format 0.0.4), kept small and exact: no
// prometheus-cpp on Debian 12. Three pieces:
//
//  * Exposition: writes families. Each family is opened once (# HELP with
//    `\` and newline escaped, # TYPE) and its samples follow it, so a family's
//    samples are always contiguous. Label values escape `\`, `"` and newline;
//    metric and label names are validated (a bad one is dropped and reported
//    by status(), never written).
//
//      Exposition out;
//      out.Family("straggler_jobs", MetricType::kGauge, "Jobs tracked.");
//      out.Sample({}, 3);
//      out.Family("straggler_job_ranks", MetricType::kGauge, "World size.");
//      out.Sample({{"job", "bert"}}, 8);
//      std::string text = out.Take();
//
//  * Histogram: fixed buckets, lock-free Observe() (relaxed atomics), a
//    Snapshot() that Exposition::Histogram writes as cumulative
//    `_bucket{le="..."}` lines ending in le="+Inf", then `_sum` and `_count`
//    (`_count` always equals the +Inf bucket).
//
//  * FormatValue: "+Inf", "-Inf", "NaN"; integers without exponent where the
//    double is an exact integer below 2^63 in magnitude; otherwise the
//    shortest digits that read back as the same double, as a plain decimal
//    for 1e-4 <= |v| < 1e21 ("0.00025", "18446744073709552000") and as
//    d.ddde±XX outside ("1e-05", "2.5e-07", "1e+22"). `le` bounds use the
//    same rule.
//
// Also: the process_* metrics of the Prometheus client conventions read from
// /proc. Shared by stragglerd (daemon/src/metrics/daemon_metrics.h) and
// straggler-agent.
//
// Thread safety: Exposition is a plain value (one thread); Histogram is
// thread-safe; ReadProcessStats may run on any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace straggler::common {

enum class MetricType { kCounter, kGauge, kHistogram, kUntyped };
std::string_view MetricTypeName(MetricType t);

using Label = std::pair<std::string_view, std::string_view>;
using Labels = std::vector<Label>;

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(std::string_view name);
// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved by Prometheus).
bool IsValidLabelName(std::string_view name);

std::string FormatValue(double v);
std::string EscapeHelp(std::string_view help);         // `\` -> `\\`, newline -> `\n`
std::string EscapeLabelValue(std::string_view value);  // also `"` -> `\"`

// A point-in-time copy of a Histogram: per-bucket (not cumulative) counts,
// the last one for +Inf.
struct HistogramSnapshot {
  std::vector<double> upper_bounds;  // ascending, finite
  std::vector<uint64_t> counts;      // upper_bounds.size() + 1
  double sum = 0.0;
  uint64_t count() const;
};

class Histogram {
 public:
  // Ascending, finite, distinct bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> upper_bounds);
  Histogram(std::initializer_list<double> upper_bounds)
      : Histogram(std::vector<double>(upper_bounds)) {}
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `v` in the first bucket with v <= bound. NaN is ignored.
  void Observe(double v);
  HistogramSnapshot Snapshot() const;
  const std::vector<double>& upper_bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<double> sum_{0.0};
};

class Exposition {
 public:
  // Opens a family: writes # HELP and # TYPE. A name seen before, or an
  // invalid one, is an error: the family and its samples are dropped.
  void Family(std::string_view name, MetricType type, std::string_view help);
  // A sample of the open family (a counter, gauge or untyped family), named
  // as the family.
  void Sample(const Labels& labels, double value);
  // A histogram of the open family (which must be kHistogram): `labels` must
  // not contain `le`.
  void Histogram(const Labels& labels, const HistogramSnapshot& h);

  // The first error (invalid name, duplicate family, sample outside a
  // family); OK when everything was written.
  const absl::Status& status() const { return status_; }
  const std::string& text() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  bool Open(MetricType want);
  void Error(absl::Status s);
  bool ValidLabels(const Labels& labels);
  void Line(std::string_view suffix, const Labels& labels, const Label* extra,
            const std::string& value);

  std::string out_;
  std::vector<std::string> seen_;  // family names written so far
  std::string family_;             // open family; "" = none (or dropped)
  MetricType type_ = MetricType::kUntyped;
  absl::Status status_;
};

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
void WriteProcessMetrics(const ProcessStats& p, Exposition& out);

}  // namespace straggler::common
