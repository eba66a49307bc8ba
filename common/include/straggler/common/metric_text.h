// The Prometheus text format (0.0.4) on prometheus-cpp core (Debian
// prometheus-cpp-dev 1.0.1): TextSerializer, a prometheus::Serializer, and
// the name, value and escaping rules it writes by. docs/metrics.md says how
// to add a metric; metric_family.h fills the data model it serializes.
//
// Unlike 1.0.1's prometheus::TextSerializer it writes NaN as "NaN", escapes
// newlines in HELP, drops (and reports) invalid or repeated names, and writes
// a 120 000-series scrape about 3x faster (appending to one string, no
// iostream). Values: "+Inf", "-Inf", "NaN"; integers without exponent where
// the double is an exact integer below 2^63 in magnitude; otherwise the
// shortest digits that read back as the same double, as a plain decimal for
// 1e-4 <= |v| < 1e21 ("0.00025") and as d.ddde±XX outside ("1e-05",
// "1e+22"). `le` bounds use the same rule.
//
//   std::string text = TextSerializer().Serialize(families);
//   std::string page = Scrape({&daemon_collector, &process_collector});
//
// Shared by stragglerd and straggler-agent. Thread safety: stateless, any
// thread.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/serializer.h"

namespace straggler::common {

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

// Collects every collectable (in order) and serializes the families.
std::string Scrape(const std::vector<const prometheus::Collectable*>& collectables);

}  // namespace straggler::common
