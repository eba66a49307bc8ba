// The agent's /metrics: every straggler_agent_* family (per job id, per
// rank of a job, process-wide) and the process metrics, as Prometheus text.
// The families are listed in docs/metrics.md.
//
// Thread safety: reads the jobs' snapshots (each under its job's lock) and
// relaxed counters; may run on any HTTP worker concurrently with everything.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent_stats.h"
#include "prometheus/metric_family.h"
#include "straggler/nvml/nvml_sampler.h"
#include "upstream_job.h"

namespace straggler::agent {

// The fan-ins of one job id's runs add up into one series per job id.
// `sampler` is null when telemetry is disabled; `telemetry_sent` counts the
// per-rank GPU samples attached to upstream batches.
// The agent's metric families in prometheus-cpp's data model; RenderAgentMetrics
// serializes them as the text exposition format (common::TextSerializer).
std::vector<prometheus::MetricFamily> CollectAgentMetrics(
    const std::vector<std::shared_ptr<UpstreamJob>>& jobs, const AgentStats& stats,
    const nvml::NvmlSampler* sampler, uint64_t telemetry_sent);
std::string RenderAgentMetrics(const std::vector<std::shared_ptr<UpstreamJob>>& jobs,
                               const AgentStats& stats, const nvml::NvmlSampler* sampler,
                               uint64_t telemetry_sent);

}  // namespace straggler::agent
