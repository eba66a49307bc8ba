// The process_* metrics of the Prometheus client conventions, read from
// /proc at each Collect(): ProcessCollector, registered beside the
// daemon's and the agent's own collectors.
//
//   std::string page = Scrape({&collector, &process_collector});  // metric_text.h
//
// Thread safety: stateless; Collect() from any thread.
#pragma once

#include <optional>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace straggler::common {

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

}  // namespace straggler::common
