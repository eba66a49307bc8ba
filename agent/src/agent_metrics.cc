// RenderAgentMetrics: see agent_metrics.h.
#include "agent_metrics.h"

#include <map>

#include "straggler/common/metric_family.h"
#include "straggler/common/metric_text.h"
#include "straggler/common/process_metrics.h"

#ifndef STRAGGLERD_VERSION
#define STRAGGLERD_VERSION "unknown"
#endif

namespace straggler::agent {

// The agent's families (docs/metrics.md), built at scrape time from the job
// table's snapshots and the relaxed counters of AgentStats.
std::vector<prometheus::MetricFamily> CollectAgentMetrics(
    const std::vector<std::shared_ptr<UpstreamJob>>& jobs, const AgentStats& stats,
    const nvml::NvmlSampler* sampler, uint64_t telemetry_sent) {

  using T = prometheus::MetricType;
  using common::AddFamily;
  using common::AddSample;
  std::vector<prometheus::MetricFamily> out;
  // Per job id: the fan-ins of its runs (briefly two, while a new run
  // waits for the old one's stream to end) add up.
  std::map<std::string, UpstreamJob::Snapshot> snaps;
  for (const auto& j : jobs) {
    auto [it, fresh] = snaps.try_emplace(j->id(), j->Snap());
    if (!fresh) it->second.Add(j->Snap());
  }
  using Snap = UpstreamJob::Snapshot;
  static const common::Family<Snap> kJobFamilies[] = {
      {"straggler_agent_buffered_reports", T::Gauge,
       "Reports held for the daemon (not yet acknowledged by it).",
       [](const Snap& s) { return static_cast<double>(s.buffered); }},
      {"straggler_agent_dropped_reports_total", T::Counter,
       "Reports dropped from a full buffer (oldest first) before the daemon acknowledged them.",
       [](const Snap& s) { return static_cast<double>(s.dropped); }},
      {"straggler_agent_upstream_connected", T::Gauge,
       "1 while the job's upstream stream to the daemon is up.",
       [](const Snap& s) { return s.connected ? 1.0 : 0.0; }},
      {"straggler_agent_upstream_connects_total", T::Counter,
       "Upstream stream attempts (the first one included).",
       [](const Snap& s) { return static_cast<double>(s.connects); }},
      {"straggler_agent_job_downstream_streams", T::Gauge, "Open trainer streams of the job.",
       [](const Snap& s) { return static_cast<double>(s.downstreams); }},
  };
  common::AddJobFamilies(out, kJobFamilies, snaps, [](const auto& id_snap) -> const auto& {
    return id_snap;  // (job id, Snapshot)
  });
  // Per rank: a node runs a handful of ranks, so the cardinality is small.
  struct RankFamily {
    const char* name;
    T type;
    const char* help;
    std::map<uint32_t, uint64_t> Snap::*member;
  };
  static const RankFamily kRankFamilies[] = {
      {"straggler_agent_rank_acked_iteration", T::Gauge,
       "Highest iteration of the rank the daemon acknowledged through this agent.",
       &Snap::acked},
      {"straggler_agent_rank_received_reports_total", T::Counter,
       "Reports of the rank taken from its trainer stream.", &Snap::received},
      {"straggler_agent_rank_acked_reports_total", T::Counter,
       "Reports of the rank the daemon acknowledged (all daemon runs together).",
       &Snap::acked_count},
  };
  for (const RankFamily& f : kRankFamilies) {
    auto& family = AddFamily(out, f.name, f.type, f.help);
    for (const auto& [id, s] : snaps) {
      for (const auto& [rank, v] : s.*f.member) {
        AddSample(family, {{"job", id}, {"rank", std::to_string(rank)}},
                  static_cast<double>(v));
      }
    }
  }
  const bool telemetry_on = sampler && sampler->enabled();
  struct AgentFamily {
    const char* name;
    T type;
    const char* help;
    double value;
  };
  const AgentFamily agent_families[] = {
      {"straggler_agent_downstream_streams", T::Gauge, "Open trainer streams.",
       static_cast<double>(stats.downstream_streams.load())},
      {"straggler_agent_reports_received_total", T::Counter,
       "Reports taken from trainer streams into the buffer.",
       static_cast<double>(stats.reports_received.load())},
      {"straggler_agent_reports_forwarded_total", T::Counter,
       "Reports the daemon acknowledged.", static_cast<double>(stats.reports_forwarded.load())},
      {"straggler_agent_reports_rejected_total", T::Counter,
       "Reports refused by the agent itself (rank not in the stream's hello).",
       static_cast<double>(stats.reports_rejected_local.load())},
      {"straggler_agent_directives_relayed_total", T::Counter,
       "Directives relayed from the daemon to trainer streams.",
       static_cast<double>(stats.directives_relayed.load())},
      {"straggler_agent_jobs", T::Gauge,
       "Jobs (per run) the agent holds, with an upstream stream, retrying, or waiting "
       "for a trainer stream.",
       static_cast<double>(jobs.size())},
      {"straggler_agent_jobs_removed_total", T::Counter,
       "Jobs removed after jobs.idle_timeout_ms without trainer streams or buffer.",
       static_cast<double>(stats.jobs_removed.load())},
      {"straggler_agent_telemetry_enabled", T::Gauge,
       "1 while GPU telemetry (NVML) is on; 0 when disabled or NVML is absent.",
       telemetry_on ? 1.0 : 0.0},
      {"straggler_agent_gpus", T::Gauge, "GPUs NVML lists on this node.",
       telemetry_on ? static_cast<double>(sampler->Gpus().size()) : 0.0},
      {"straggler_agent_telemetry_samples_sent_total", T::Counter,
       "Per-rank GPU samples attached to upstream batches.",
       static_cast<double>(telemetry_sent)},
  };
  for (const AgentFamily& f : agent_families) {
    AddSample(AddFamily(out, f.name, f.type, f.help), {}, f.value);
  }
  auto& slow = AddFamily(out, "straggler_agent_http_slow_clients_total", T::Counter,
                         "HTTP connections closed for a request or response slower than the "
                         "http.*_timeout_seconds.");
  AddSample(slow, {{"phase", "request"}}, static_cast<double>(stats.http_slow_clients[0].load()));
  AddSample(slow, {{"phase", "response"}}, static_cast<double>(stats.http_slow_clients[1].load()));
  AddSample(AddFamily(out, "straggler_agent_build_info", T::Gauge, "Always 1."),
            {{"version", STRAGGLERD_VERSION}}, 1);
  common::AddProcessMetrics(common::ReadProcessStats(), out);
  return out;
}

std::string RenderAgentMetrics(const std::vector<std::shared_ptr<UpstreamJob>>& jobs,
                               const AgentStats& stats, const nvml::NvmlSampler* sampler,
                               uint64_t telemetry_sent) {
  return common::TextSerializer().Serialize(
      CollectAgentMetrics(jobs, stats, sampler, telemetry_sent));
}

}  // namespace straggler::agent
