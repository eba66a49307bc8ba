// stragglerd's /metrics: every straggler_* and process_* family of
// docs/metrics.md, written with the shared exposition (straggler/common/metrics.h).
// RenderDaemonMetrics copies each job's numbers under that job's mutex only,
// one job at a time, and writes text with no lock held.
//
// Thread safety: RenderDaemonMetrics may run on any thread.
#pragma once

#include <cstdint>
#include <string>

#include "straggler/common/metrics.h"

namespace straggler::daemon {

class JobRegistry;
struct DaemonStats;

struct MetricsOptions {
  std::string version;               // straggler_build_info{version}
  uint32_t per_rank_max_ranks = 4096;  // per-rank series only for jobs up to this size
};

// Every straggler_* and process_* family of docs/metrics.md's tables.
std::string RenderDaemonMetrics(const JobRegistry& registry, const DaemonStats& stats,
                                const MetricsOptions& options);

}  // namespace straggler::daemon
