// stragglerd's /metrics: every straggler_* and process_* family of
// docs/metrics.md, built at scrape time as prometheus-cpp's data model
// (prometheus::MetricFamily) by DaemonCollector and written by
// common::TextSerializer (straggler/common/metric_text.h). The ingest hot path
// keeps its relaxed counters (stats.h); the collector reads them here.
// Each family is one row of a table in daemon_metrics.cc (docs/metrics.md,
// "Adding a metric").
//
// Collect() copies each job's numbers under that job's mutex only, one job
// at a time, and builds the families with no lock held.
//
// Thread safety: Collect() and RenderDaemonMetrics may run on any thread,
// concurrently; the registry and stats must outlive the collector.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "metrics/cluster_metrics.h"
#include "prometheus/metric_family.h"

namespace straggler::daemon {

class JobRegistry;
struct DaemonStats;

struct MetricsOptions {
  std::string version;               // straggler_build_info{version}
  uint32_t per_rank_max_ranks = 4096;  // per-rank series only for jobs up to this size
  // A replica of a cluster: the straggler_cluster_* families; none alone.
  std::optional<ClusterMetrics> cluster;
};

// Every straggler_* family of docs/metrics.md's tables (process_* come from
// common::ProcessCollector).
class DaemonCollector final : public prometheus::Collectable {
 public:
  DaemonCollector(const JobRegistry& registry, const DaemonStats& stats, MetricsOptions options)
      : registry_(registry), stats_(stats), options_(std::move(options)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const JobRegistry& registry_;
  const DaemonStats& stats_;
  const MetricsOptions options_;
};

// The /metrics text: DaemonCollector's and ProcessCollector's families.
std::string RenderDaemonMetrics(const JobRegistry& registry, const DaemonStats& stats,
                                const MetricsOptions& options);

}  // namespace straggler::daemon
