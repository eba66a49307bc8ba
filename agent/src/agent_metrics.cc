// RenderAgentMetrics: see agent_metrics.h.
#include "agent_metrics.h"

#include <map>

#include "straggler/common/metrics.h"

#ifndef STRAGGLERD_VERSION
#define STRAGGLERD_VERSION "unknown"
#endif

namespace straggler::agent {

std::string RenderAgentMetrics(const std::vector<std::shared_ptr<UpstreamJob>>& jobs,
                               const AgentStats& stats, const nvml::NvmlSampler* sampler,
                               uint64_t telemetry_sent) {
  common::Exposition out;
  // Per job id: the fan-ins of its runs (briefly two, while a new run
  // waits for the old one's stream to end) add up.
  std::map<std::string, UpstreamJob::Snapshot> snaps;
  for (const auto& j : jobs) {
    auto [it, fresh] = snaps.try_emplace(j->id(), j->Snap());
    if (!fresh) it->second.Add(j->Snap());
  }
  auto per_job = [&](const char* name, common::MetricType type, const char* help, auto value) {
    out.Family(name, type, help);
    for (const auto& [id, s] : snaps) out.Sample({{"job", id}}, value(s));
  };
  using T = common::MetricType;
  per_job("straggler_agent_buffered_reports", T::kGauge,
          "Reports held for the daemon (not yet acknowledged by it).",
          [](const auto& s) { return static_cast<double>(s.buffered); });
  per_job("straggler_agent_dropped_reports_total", T::kCounter,
          "Reports dropped from a full buffer (oldest first) before the daemon acknowledged them.",
          [](const auto& s) { return static_cast<double>(s.dropped); });
  per_job("straggler_agent_upstream_connected", T::kGauge,
          "1 while the job's upstream stream to the daemon is up.",
          [](const auto& s) { return s.connected ? 1.0 : 0.0; });
  per_job("straggler_agent_upstream_connects_total", T::kCounter,
          "Upstream stream attempts (the first one included).",
          [](const auto& s) { return static_cast<double>(s.connects); });
  per_job("straggler_agent_job_downstream_streams", T::kGauge,
          "Open trainer streams of the job.",
          [](const auto& s) { return static_cast<double>(s.downstreams); });
  out.Family("straggler_agent_rank_acked_iteration", T::kGauge,
             "Highest iteration of the rank the daemon acknowledged through this agent.");
  for (const auto& [id, s] : snaps) {
    for (const auto& [rank, it] : s.acked) {
      const std::string r = std::to_string(rank);
      out.Sample({{"job", id}, {"rank", r}}, static_cast<double>(it));
    }
  }
  auto per_rank = [&](const char* name, common::MetricType type, const char* help, auto member) {
    out.Family(name, type, help);
    for (const auto& [id, s] : snaps) {
      for (const auto& [rank, v] : s.*member) {
        const std::string r = std::to_string(rank);
        out.Sample({{"job", id}, {"rank", r}}, static_cast<double>(v));
      }
    }
  };
  // Per rank: a node runs a handful of ranks, so the cardinality is small.
  per_rank("straggler_agent_rank_received_reports_total", T::kCounter,
           "Reports of the rank taken from its trainer stream.",
           &UpstreamJob::Snapshot::received);
  per_rank("straggler_agent_rank_acked_reports_total", T::kCounter,
           "Reports of the rank the daemon acknowledged (all daemon runs together).",
           &UpstreamJob::Snapshot::acked_count);
  out.Family("straggler_agent_downstream_streams", T::kGauge, "Open trainer streams.");
  out.Sample({}, static_cast<double>(stats.downstream_streams.load()));
  out.Family("straggler_agent_reports_received_total", T::kCounter,
             "Reports taken from trainer streams into the buffer.");
  out.Sample({}, static_cast<double>(stats.reports_received.load()));
  out.Family("straggler_agent_reports_forwarded_total", T::kCounter,
             "Reports the daemon acknowledged.");
  out.Sample({}, static_cast<double>(stats.reports_forwarded.load()));
  out.Family("straggler_agent_reports_rejected_total", T::kCounter,
             "Reports refused by the agent itself (rank not in the stream's hello).");
  out.Sample({}, static_cast<double>(stats.reports_rejected_local.load()));
  out.Family("straggler_agent_directives_relayed_total", T::kCounter,
             "Directives relayed from the daemon to trainer streams.");
  out.Sample({}, static_cast<double>(stats.directives_relayed.load()));
  out.Family("straggler_agent_jobs", T::kGauge,
             "Jobs (per run) the agent holds, with an upstream stream, retrying, or waiting "
             "for a trainer stream.");
  out.Sample({}, static_cast<double>(jobs.size()));
  out.Family("straggler_agent_jobs_removed_total", T::kCounter,
             "Jobs removed after jobs.idle_timeout_ms without trainer streams or buffer.");
  out.Sample({}, static_cast<double>(stats.jobs_removed.load()));
  const bool telemetry_on = sampler != nullptr && sampler->enabled();
  out.Family("straggler_agent_telemetry_enabled", T::kGauge,
             "1 while GPU telemetry (NVML) is on; 0 when disabled or NVML is absent.");
  out.Sample({}, telemetry_on ? 1.0 : 0.0);
  out.Family("straggler_agent_gpus", T::kGauge, "GPUs NVML lists on this node.");
  out.Sample({}, telemetry_on ? static_cast<double>(sampler->Gpus().size()) : 0.0);
  out.Family("straggler_agent_telemetry_samples_sent_total", T::kCounter,
             "Per-rank GPU samples attached to upstream batches.");
  out.Sample({}, static_cast<double>(telemetry_sent));
  out.Family("straggler_agent_http_slow_clients_total", T::kCounter,
             "HTTP connections closed for a request or response slower than the "
             "http.*_timeout_seconds.");
  out.Sample({{"phase", "request"}}, static_cast<double>(stats.http_slow_clients[0].load()));
  out.Sample({{"phase", "response"}}, static_cast<double>(stats.http_slow_clients[1].load()));
  out.Family("straggler_agent_build_info", T::kGauge, "Always 1.");
  out.Sample({{"version", STRAGGLERD_VERSION}}, 1);
  common::WriteProcessMetrics(common::ReadProcessStats(), out);
  return out.Take();
}

}  // namespace straggler::agent
