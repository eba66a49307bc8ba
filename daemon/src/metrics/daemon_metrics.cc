#include "metrics/daemon_metrics.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "metrics/stats.h"
#include "registry/job_registry.h"

namespace straggler::daemon {

using common::Exposition;
using common::HistogramSnapshot;
using common::Label;
using common::Labels;
using common::MetricType;

// --------------------------------------------------------------------- daemon

namespace {

constexpr engine::WorkerState kAllStates[] = {
    engine::WorkerState::kPending, engine::WorkerState::kHealthy,
    engine::WorkerState::kStraggler, engine::WorkerState::kUnresponsive,
    engine::WorkerState::kFinished};

constexpr engine::EventKind kAllEventKinds[] = {
    engine::EventKind::kStateChange,   engine::EventKind::kMembership,
    engine::EventKind::kGuardBlocked,  engine::EventKind::kPolicyChanged,
    engine::EventKind::kOverride,      engine::EventKind::kReset,
    engine::EventKind::kReprofile,     engine::EventKind::kMembershipWithheld};

struct RankRow {
  std::string rank;  // label text
  std::string node;
  DeclaredTopology topology;  // labels peer_group, replica ("" = own replica)
  std::string replica;
  engine::WorkerView w;
  std::optional<v1::GpuTelemetry> gpu;  // fresh telemetry only
  std::string gpu_label;                // NVML index of that GPU
};

struct JobRow {
  std::string id;
  engine::JobView view;
  uint64_t membership_version = 0;
  uint32_t streams = 0;
  common::HistogramSnapshot latency;
  std::vector<RankRow> ranks;  // empty above per_rank_max_ranks
};

// Copies one job's numbers; the only place the renderer holds a job's mutex.
std::optional<JobRow> Copy(const Job& job, uint32_t per_rank_max_ranks) {
  const engine::Time now = WallNow();
  JobRow row;
  row.id = job.id;
  const bool per_rank = job.world_size <= per_rank_max_ranks;
  if (per_rank) row.ranks.resize(job.world_size);
  std::lock_guard lock(job.mu);
  if (job.removed.load()) return std::nullopt;
  row.view = job.engine.View();
  row.membership_version = job.engine.membership().version;
  row.streams = job.streams;
  row.latency = job.detection_latency.Snapshot();
  if (per_rank) {
    for (uint32_t r = 0; r < job.world_size; ++r) {
      row.ranks[r].w = job.engine.Worker(r);
      row.ranks[r].node = job.nodes[r];
      row.ranks[r].topology = job.topology.Of(r);
      // Stale telemetry is left out: a GPU whose agent went silent must not
      // keep an alert firing on its last reading.
      if (const v1::GpuTelemetry* t = job.FreshTelemetryLocked(r, now)) row.ranks[r].gpu = *t;
    }
  }
  return row;
}

}  // namespace

std::string RenderDaemonMetrics(const JobRegistry& registry, const DaemonStats& stats,
                                const MetricsOptions& options) {
  std::vector<JobRow> jobs;
  for (const auto& job : registry.Jobs()) {
    if (auto row = Copy(*job, options.per_rank_max_ranks)) jobs.push_back(*std::move(row));
  }
  // No lock from here on.
  for (JobRow& j : jobs) {
    for (size_t r = 0; r < j.ranks.size(); ++r) {
      j.ranks[r].rank = absl::StrCat(r);
      if (j.ranks[r].topology.replica) j.ranks[r].replica = absl::StrCat(*j.ranks[r].topology.replica);
      if (j.ranks[r].gpu) j.ranks[r].gpu_label = absl::StrCat(j.ranks[r].gpu->gpu_index());
    }
  }

  common::Exposition out;
  out.Family("straggler_build_info", common::MetricType::kGauge,
             "Always 1; the version label names the stragglerd build.");
  out.Sample({{"version", options.version}}, 1);
  out.Family("straggler_jobs", common::MetricType::kGauge, "Jobs tracked.");
  out.Sample({}, static_cast<double>(jobs.size()));
  out.Family("straggler_active_streams", common::MetricType::kGauge, "Open ingest streams.");
  out.Sample({}, static_cast<double>(stats.active_streams.load(std::memory_order_relaxed)));
  // The family always (its TYPE says what it is, as the GPU families do); a
  // sample only with TLS, where there is a certificate.
  out.Family("straggler_tls_certificate_expiry_seconds", common::MetricType::kGauge,
             "Unix time at which the serving certificate (tls.cert_file's leaf) expires; "
             "no sample without TLS.");
  if (const int64_t not_after = stats.tls_certificate_not_after.load(std::memory_order_relaxed);
      not_after != 0) {
    out.Sample({}, static_cast<double>(not_after));
  }
  out.Family("straggler_http_rejected_total", common::MetricType::kCounter,
             "HTTP requests answered with a status >= 400, by status.");
  for (size_t i = 0; i < stats.http_rejected.size(); ++i) {
    out.Sample({{"code", i < kHttpRejectStatuses.size() ? std::to_string(kHttpRejectStatuses[i])
                                                         : std::string("other")}},
               static_cast<double>(stats.http_rejected[i].load(std::memory_order_relaxed)));
  }
  out.Family("straggler_http_slow_clients_total", common::MetricType::kCounter,
             "HTTP connections closed for a request or response slower than the timeouts.");
  out.Sample({{"phase", "request"}},
             static_cast<double>(stats.http_slow_clients[0].load(std::memory_order_relaxed)));
  out.Sample({{"phase", "response"}},
             static_cast<double>(stats.http_slow_clients[1].load(std::memory_order_relaxed)));
  out.Family("straggler_streams_refused_total", common::MetricType::kCounter,
             "Ingest streams ended before taking a report, by reason.");
  for (size_t i = 0; i < kStreamRefuseReasons; ++i) {
    out.Sample({{"reason", StreamRefuseReasonName(static_cast<StreamRefuseReason>(i))}},
               static_cast<double>(stats.streams_refused[i].load(std::memory_order_relaxed)));
  }
  out.Family("straggler_topology_refused_total", MetricType::kCounter,
             "Ranks' topology claims (peer group, replica) refused in a hello, by reason; the "
             "rank keeps the topology it had.");
  for (size_t i = 0; i < kTopologyRefuseReasons; ++i) {
    out.Sample({{"reason", TopologyRefuseReasonName(static_cast<TopologyRefuseReason>(i))}},
               static_cast<double>(stats.topology_refused[i].load(std::memory_order_relaxed)));
  }
  out.Family("straggler_hello_claims_dropped_total", common::MetricType::kCounter,
             "Hellos whose reported_iteration the stream's first reports showed false.");
  out.Sample({}, static_cast<double>(stats.hello_claims_dropped.load(std::memory_order_relaxed)));
  out.Family("straggler_reports_accepted_total", common::MetricType::kCounter,
             "Reports taken, all jobs.");
  out.Sample({}, static_cast<double>(stats.reports_accepted.load(std::memory_order_relaxed)));

  out.Family("straggler_reports_rejected_total", common::MetricType::kCounter,
             "Reports refused, by reason (duplicate and stale are replays, not sender errors).");
  for (size_t i = 1; i < kEngineRejectReasons; ++i) {  // 0 is kNone
    const auto reason = static_cast<engine::RejectReason>(i);
    out.Sample({{"reason", engine::RejectReasonName(reason)}},
               static_cast<double>(stats.reports_rejected[i].load(std::memory_order_relaxed)));
  }
  for (size_t i = 0; i < kStreamRejectReasons; ++i) {
    const auto reason = static_cast<StreamRejectReason>(i);
    out.Sample({{"reason", StreamRejectReasonName(reason)}},
               static_cast<double>(
                   stats.reports_rejected_stream[i].load(std::memory_order_relaxed)));
  }

  out.Family("straggler_events_total", common::MetricType::kCounter, "Events journaled, by kind.");
  for (engine::EventKind kind : kAllEventKinds) {
    out.Sample({{"kind", engine::EventKindName(kind)}},
               static_cast<double>(stats.events_by_kind[static_cast<size_t>(kind)].load(
                   std::memory_order_relaxed)));
  }

  // Always present (0 without persistence), so an alert needs no absent().
  out.Family("straggler_state_db_events_dropped_total", common::MetricType::kCounter,
             "Events not persisted because the state database writer's queue was full.");
  out.Sample({}, static_cast<double>(stats.state_db_events_dropped.load(std::memory_order_relaxed)));
  out.Family("straggler_state_db_errors_total", common::MetricType::kCounter,
             "State database writes or reads that failed (event batches, memberships, "
             "overrides, sequence reservations, retention).");
  out.Sample({}, static_cast<double>(stats.state_db_errors.load(std::memory_order_relaxed) +
                                     registry.state_db_writer_errors()));

  out.Family("straggler_active_watches", common::MetricType::kGauge, "Open WatchMembership streams.");
  out.Sample({}, static_cast<double>(stats.active_watches.load(std::memory_order_relaxed)));
  out.Family("straggler_watch_versions_skipped_total", common::MetricType::kCounter,
             "Membership versions a WatchMembership stream never sent: a newer one replaced "
             "them while the watcher was not reading.");
  out.Sample({}, static_cast<double>(stats.watch_versions_skipped.load(std::memory_order_relaxed)));
  out.Family("straggler_grpc_refused_total", common::MetricType::kCounter,
             "Unary gRPC calls (query, admin, rendezvous) ended with an error, by service and "
             "status code; a series appears with its first refusal.");
  for (size_t i = 0; i < stats.grpc_refused.size(); ++i) {
    const uint64_t n = stats.grpc_refused[i].load(std::memory_order_relaxed);
    if (n == 0) continue;  // 3 x 16 series of zeros would say nothing
    out.Sample({{"service", GrpcServiceName(static_cast<GrpcService>(i / kGrpcCodes))},
                {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(i % kGrpcCodes))}},
               static_cast<double>(n));
  }
  out.Family("straggler_auth_rejected_total", common::MetricType::kCounter,
             "gRPC calls and HTTP requests refused for a missing or wrong bearer token.");
  out.Sample({}, static_cast<double>(stats.auth_rejected.load(std::memory_order_relaxed)));

  out.Family("straggler_ingest_batch_duration_seconds", common::MetricType::kHistogram,
             "Time to process one ReportBatch, under the job's lock.");
  out.Histogram({}, stats.ingest_batch_duration.Snapshot());

  // Per job.
  auto per_job = [&](const char* name, common::MetricType type, const char* help, auto value) {
    out.Family(name, type, help);
    for (const JobRow& j : jobs) out.Sample({{"job", j.id}}, static_cast<double>(value(j)));
  };
  per_job("straggler_job_ranks", common::MetricType::kGauge, "World size.",
          [](const JobRow& j) { return j.view.world_size; });
  // Alert rules join on it (`and on(job) straggler_job_running == 1`) so a
  // job that ended does not keep alerting until it is removed as idle.
  per_job("straggler_job_running", common::MetricType::kGauge,
          "1 while the job's current run has a rank that has not finished cleanly, else 0.",
          [](const JobRow& j) { return j.view.finished_ranks < j.view.world_size ? 1 : 0; });
  per_job("straggler_job_finished_ranks", common::MetricType::kGauge,
          "Ranks whose trainer closed cleanly (state finished).",
          [](const JobRow& j) { return j.view.finished_ranks; });
  per_job("straggler_job_active_ranks", common::MetricType::kGauge,
          "Ranks taking part in the collective (newest membership).",
          [](const JobRow& j) { return j.view.active_ranks; });
  per_job("straggler_job_excluded_ranks", common::MetricType::kGauge,
          "Ranks left out (newest membership).",
          [](const JobRow& j) { return j.view.excluded_ranks; });
  per_job("straggler_job_straggler_ranks", common::MetricType::kGauge,
          "Ranks classified straggler (excluded or withheld by a guard).",
          [](const JobRow& j) { return j.view.straggler_ranks; });
  per_job("straggler_job_unresponsive_ranks", common::MetricType::kGauge,
          "Ranks that stopped reporting.",
          [](const JobRow& j) { return j.view.unresponsive_ranks; });
  per_job("straggler_job_detached_ranks", common::MetricType::kGauge,
          "Ranks no report stream speaks for (not yet connected, or gone).",
          [](const JobRow& j) { return j.view.detached_ranks; });
  per_job("straggler_job_membership_withheld", common::MetricType::kGauge,
          "1 while a change of the excluded set waits for detached ranks.",
          [](const JobRow& j) { return j.view.membership_withheld ? 1 : 0; });
  per_job("straggler_job_threshold_seconds", common::MetricType::kGauge,
          "Current judging threshold (0 before the first profile).",
          [](const JobRow& j) { return j.view.threshold_seconds; });
  per_job("straggler_job_baseline_seconds", common::MetricType::kGauge,
          "Reference speed (profiled fastest-rank mean, or median EWMA).",
          [](const JobRow& j) { return j.view.baseline_seconds; });
  per_job("straggler_job_step_seconds", common::MetricType::kGauge,
          "Step time of the newest judged iteration: the slowest active rank's step_seconds "
          "(compute_seconds where no step time is reported). The job steps at this speed; "
          "against straggler_job_baseline_seconds it shows the time a straggler costs.",
          [](const JobRow& j) { return j.view.step_seconds; });
  per_job("straggler_job_membership_version", common::MetricType::kGauge, "Newest membership version.",
          [](const JobRow& j) { return j.membership_version; });
  per_job("straggler_job_streams", common::MetricType::kGauge, "Open report streams.",
          [](const JobRow& j) { return j.streams; });
  per_job("straggler_job_reports_total", common::MetricType::kCounter, "Reports accepted.",
          [](const JobRow& j) { return j.view.reports_total; });
  per_job("straggler_job_detections_total", common::MetricType::kCounter,
          "Healthy to straggler transitions.",
          [](const JobRow& j) { return j.view.detections_total; });
  per_job("straggler_job_recoveries_total", common::MetricType::kCounter,
          "Straggler to healthy transitions.",
          [](const JobRow& j) { return j.view.recoveries_total; });
  per_job("straggler_job_guard_blocks_total", common::MetricType::kCounter,
          "Exclusions withheld by a guard.",
          [](const JobRow& j) { return j.view.guard_blocks_total; });
  out.Family("straggler_job_detection_latency_iterations", common::MetricType::kHistogram,
             "Iterations from the first slow step of an episode to the detection.");
  for (const JobRow& j : jobs) out.Histogram({{"job", j.id}}, j.latency);

  // Per rank, for jobs up to metrics.per_rank_max_ranks.
  auto per_rank = [&](const char* name, const char* help, auto value) {
    out.Family(name, common::MetricType::kGauge, help);
    for (const JobRow& j : jobs) {
      for (const RankRow& r : j.ranks) {
        out.Sample({{"job", j.id}, {"rank", r.rank}, {"node", r.node},
                    {"peer_group", r.topology.peer_group}, {"replica", r.replica}},
                   static_cast<double>(value(r.w)));
      }
    }
  };
  per_rank("straggler_rank_compute_seconds", "Last reported compute time.",
           [](const engine::WorkerView& w) { return w.last_compute_seconds; });
  per_rank("straggler_rank_ewma_compute_seconds", "EWMA of the compute time.",
           [](const engine::WorkerView& w) { return w.ewma_compute_seconds; });
  per_rank("straggler_rank_slow_score", "The bounded counter (recent slow steps).",
           [](const engine::WorkerView& w) { return w.counter; });
  per_rank("straggler_rank_slow_score_limit",
           "The counter's limit: the rank is a straggler at this value.",
           [](const engine::WorkerView& w) { return w.limit; });
  per_rank("straggler_rank_slowdown_ratio", "EWMA over the job baseline (0 before a baseline).",
           [](const engine::WorkerView& w) { return w.slowdown_ratio; });
  per_rank("straggler_rank_excluded", "1 when left out of the newest membership.",
           [](const engine::WorkerView& w) { return w.excluded ? 1 : 0; });
  out.Family("straggler_rank_state", common::MetricType::kGauge,
             "1 for the rank's state (pending, healthy, straggler, unresponsive), 0 for the "
             "others.");
  for (const JobRow& j : jobs) {
    for (const RankRow& r : j.ranks) {
      for (engine::WorkerState s : kAllStates) {
        out.Sample({{"job", j.id}, {"rank", r.rank}, {"node", r.node},
                    {"peer_group", r.topology.peer_group}, {"replica", r.replica},
                    {"state", engine::WorkerStateName(s)}},
                   r.w.state == s ? 1 : 0);
      }
    }
  }

  // GPU telemetry per rank (agent, NVML): only ranks with a fresh sample,
  // only the values the GPU measures; labels job, rank, node, gpu.
  auto per_gpu = [&](const char* name, const char* help, auto value) {
    out.Family(name, common::MetricType::kGauge, help);
    for (const JobRow& j : jobs) {
      for (const RankRow& r : j.ranks) {
        if (!r.gpu) continue;
        if (std::optional<double> v = value(*r.gpu)) {
          out.Sample({{"job", j.id}, {"rank", r.rank}, {"node", r.node}, {"gpu", r.gpu_label}}, *v);
        }
      }
    }
  };
  using T = v1::GpuTelemetry;
  auto field = [](bool has, double v) { return has ? std::optional<double>(v) : std::nullopt; };
  auto reason = [](const T& t, uint64_t bits) {
    return t.has_clock_event_reasons()
               ? std::optional<double>((t.clock_event_reasons() & bits) != 0 ? 1 : 0)
               : std::nullopt;
  };
  per_gpu("straggler_rank_gpu_sm_clock_hertz", "SM clock of the rank's GPU.",
          [&](const T& t) { return field(t.has_sm_clock_hertz(), t.sm_clock_hertz()); });
  per_gpu("straggler_rank_gpu_max_sm_clock_hertz", "Maximum SM clock of the rank's GPU.",
          [&](const T& t) { return field(t.has_max_sm_clock_hertz(), t.max_sm_clock_hertz()); });
  per_gpu("straggler_rank_gpu_memory_clock_hertz", "Memory clock of the rank's GPU.",
          [&](const T& t) { return field(t.has_memory_clock_hertz(), t.memory_clock_hertz()); });
  per_gpu("straggler_rank_gpu_temperature_celsius", "Temperature of the rank's GPU.",
          [&](const T& t) { return field(t.has_temperature_celsius(), t.temperature_celsius()); });
  per_gpu("straggler_rank_gpu_power_watts", "Power draw of the rank's GPU.",
          [&](const T& t) { return field(t.has_power_watts(), t.power_watts()); });
  per_gpu("straggler_rank_gpu_power_limit_watts", "Enforced power limit of the rank's GPU.",
          [&](const T& t) { return field(t.has_power_limit_watts(), t.power_limit_watts()); });
  per_gpu("straggler_rank_gpu_utilization_ratio",
          "Share of the last sample period with a kernel running on the rank's GPU (0..1).",
          [&](const T& t) { return field(t.has_gpu_utilization(), t.gpu_utilization()); });
  per_gpu("straggler_rank_gpu_memory_utilization_ratio",
          "Share of the last sample period with the rank's GPU memory read or written (0..1).",
          [&](const T& t) { return field(t.has_memory_utilization(), t.memory_utilization()); });
  per_gpu("straggler_rank_gpu_throttle_thermal",
          "1 while the rank's GPU reports a thermal slowdown reason (SW or HW), else 0.",
          [&](const T& t) { return reason(t, 0x20 | 0x40); });
  per_gpu("straggler_rank_gpu_throttle_power",
          "1 while the rank's GPU reports a power cap or power brake reason, else 0.",
          [&](const T& t) { return reason(t, 0x4 | 0x80); });

  out.Family("straggler_telemetry_samples_total", common::MetricType::kCounter,
             "GPU telemetry samples kept (ReportBatch.telemetry).");
  out.Sample({}, static_cast<double>(stats.telemetry_accepted.load(std::memory_order_relaxed)));
  out.Family("straggler_telemetry_rejected_total", common::MetricType::kCounter,
             "GPU telemetry samples refused, by reason.");
  out.Sample({{"reason", "rank_not_in_stream"}},
             static_cast<double>(stats.telemetry_rejected_rank.load(std::memory_order_relaxed)));
  out.Sample({{"reason", "invalid_value"}},
             static_cast<double>(stats.telemetry_rejected_invalid.load(std::memory_order_relaxed)));

  common::WriteProcessMetrics(common::ReadProcessStats(), out);
  return out.Take();
}

}  // namespace straggler::daemon
