#include "metrics/daemon_metrics.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/etcd_stats.h"
#include "metrics/stats.h"
#include "registry/job_registry.h"
#include "straggler/common/atomic_histogram.h"
#include "straggler/common/metric_family.h"
#include "straggler/common/metric_text.h"
#include "straggler/common/process_metrics.h"

namespace straggler::daemon {

namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;
using common::AddFamily;
using common::AddSample;
using common::Family;
using common::Labels;

constexpr engine::WorkerState kAllStates[] = {
    engine::WorkerState::kPending, engine::WorkerState::kHealthy,
    engine::WorkerState::kStraggler, engine::WorkerState::kUnresponsive,
    engine::WorkerState::kFinished, engine::WorkerState::kMild};

constexpr engine::EventKind kAllEventKinds[] = {
    engine::EventKind::kStateChange,   engine::EventKind::kMembership,
    engine::EventKind::kGuardBlocked,  engine::EventKind::kPolicyChanged,
    engine::EventKind::kOverride,      engine::EventKind::kReset,
    engine::EventKind::kReprofile,     engine::EventKind::kMembershipWithheld,
    engine::EventKind::kJobLost};

struct RankRow {
  std::string node;
  DeclaredTopology topology;  // labels peer_group, replica ("" = own replica)
  engine::WorkerView w;
  std::optional<v1::GpuTelemetry> gpu;  // fresh telemetry only
  std::optional<LikelyCause> cause;     // a straggler's, found at its detection
};

struct JobRow {
  std::string id;
  engine::JobView view;
  uint64_t membership_version = 0;
  uint32_t streams = 0;
  prometheus::ClientMetric latency;  // detection_latency.Collect()
  std::vector<RankRow> ranks;        // empty above per_rank_max_ranks
  // The newest membership's replicas left out whole (docs/topology.md):
  // replica, culprit rank, culprit's peer group, ranks out with it.
  struct ExcludedReplica {
    uint32_t replica = 0;
    uint32_t culprit = 0;
    std::string group;
    uint32_t ranks = 0;
  };
  std::vector<ExcludedReplica> excluded_replicas;
  uint32_t excluded_units = 0;  // replicas out; a rank without a replica counts as one
};

// Copies one job's numbers; the only place the collector holds a job's mutex.
std::optional<JobRow> Copy(Job& job, uint32_t per_rank_max_ranks) {
  const engine::Time now = WallNow();
  JobRow row;
  row.id = job.id;
  const bool per_rank = job.world_size <= per_rank_max_ranks;
  if (per_rank) row.ranks.resize(job.world_size);
  const Job::Locked locked(job);
  if (job.removed()) return std::nullopt;
  const JobState& st = *locked;
  row.view = st.engine.View();
  row.membership_version = st.engine.membership().version;
  row.streams = st.streams;
  row.latency = st.detection_latency.Collect();
  // An ended job (finished or lost) has no current exclusion (JobView).
  const std::vector<engine::ExcludedRank> none;
  for (const engine::ExcludedRank& e :
       st.engine.Ended() ? none : st.engine.membership().excluded) {
    if (!e.replica || !e.culprit) {
      row.excluded_units++;
      continue;
    }
    auto it = std::find_if(
        row.excluded_replicas.begin(), row.excluded_replicas.end(),
        [&](const JobRow::ExcludedReplica& x) { return x.replica == *e.replica; });
    if (it == row.excluded_replicas.end()) {
      row.excluded_units++;
      row.excluded_replicas.push_back({*e.replica, *e.culprit, e.culprit_group, 0});
      it = std::prev(row.excluded_replicas.end());
    }
    it->ranks++;
  }
  if (per_rank) {
    for (uint32_t r = 0; r < job.world_size; ++r) {
      row.ranks[r].w = st.engine.Worker(r);
      row.ranks[r].node = st.nodes[r];
      row.ranks[r].topology = st.topology.Of(r);
      // Stale telemetry is left out: a GPU whose agent went silent must not
      // keep an alert firing on its last reading.
      if (const v1::GpuTelemetry* t = st.FreshTelemetry(r, now)) row.ranks[r].gpu = *t;
    }
    for (const auto& [rank, cause] : st.straggler_causes) {
      if (rank < row.ranks.size() && row.ranks[rank].w.state == engine::WorkerState::kStraggler)
        row.ranks[rank].cause = cause.cause;
    }
    // A healthy rank slow on time alone, not per unit of work (not a straggler).
    for (auto& rank : row.ranks)
      if (rank.w.data) rank.cause = LikelyCause::kData;
  }
  return row;
}

double Load(const std::atomic<uint64_t>& a) {
  return static_cast<double>(a.load(std::memory_order_relaxed));
}
double Load(const std::atomic<int64_t>& a) {
  return static_cast<double>(a.load(std::memory_order_relaxed));
}

// ---------------------------------------------------------------- the tables
// Adding a metric is one row in one of these tables (docs/metrics.md).

// common::Family of one sample per `From`: the daemon's (DaemonStats) or a
// job's (JobRow).
// Daemon-wide, one unlabelled sample from DaemonStats.
const Family<DaemonStats> kDaemonFamilies[] = {
    {"straggler_active_streams", MetricType::Gauge, "Open ingest streams.",
     [](const DaemonStats& s) { return Load(s.active_streams); }},
    {"straggler_streams_cancelled_total", MetricType::Counter,
     "Ingest streams that ended cancelled rather than closed: the client cancelled or "
     "vanished, or gRPC's memory quota cut the stream (ENHANCE_YOUR_CALM).",
     [](const DaemonStats& s) { return Load(s.streams_cancelled); }},
    {"straggler_hello_claims_dropped_total", MetricType::Counter,
     "Hellos whose reported_iteration the stream's first reports showed false, or that a live "
     "job took only up to its progress + 1023.",
     [](const DaemonStats& s) { return Load(s.hello_claims_dropped); }},
    {"straggler_hello_settings_ignored_total", MetricType::Counter,
     "Later hellos whose iterations_per_epoch differed from the run's first: ignored.",
     [](const DaemonStats& s) { return Load(s.hello_settings_ignored); }},
    {"straggler_reports_accepted_total", MetricType::Counter, "Reports taken, all jobs.",
     [](const DaemonStats& s) { return Load(s.reports_accepted); }},
    // Always present (0 without persistence), so an alert needs no absent().
    {"straggler_state_db_events_dropped_total", MetricType::Counter,
     "Events not persisted because the state database writer's queue was full.",
     [](const DaemonStats& s) { return Load(s.state_db_events_dropped); }},
    {"straggler_active_watches", MetricType::Gauge, "Open WatchMembership streams.",
     [](const DaemonStats& s) { return Load(s.active_watches); }},
    {"straggler_watch_versions_skipped_total", MetricType::Counter,
     "Membership versions a WatchMembership stream never sent: a newer one replaced "
     "them while the watcher was not reading.",
     [](const DaemonStats& s) { return Load(s.watch_versions_skipped); }},
    {"straggler_auth_rejected_total", MetricType::Counter,
     "gRPC calls and HTTP requests refused for a missing or wrong bearer token.",
     [](const DaemonStats& s) { return Load(s.auth_rejected); }},
    {"straggler_telemetry_samples_total", MetricType::Counter,
     "GPU telemetry samples kept (ReportBatch.telemetry).",
     [](const DaemonStats& s) { return Load(s.telemetry_accepted); }},
};

// Per job: one sample labelled job.
const Family<JobRow> kJobFamilies[] = {
    {"straggler_job_ranks", MetricType::Gauge, "World size.",
     [](const JobRow& j) { return double(j.view.world_size); }},
    // Alert rules join on it (`and on(job) straggler_job_running == 1`) so a
    // job that ended does not keep alerting until it is removed as idle.
    {"straggler_job_running", MetricType::Gauge,
     "1 while the job's current run has a rank that has not finished cleanly and the run is not "
     "lost (straggler_job_lost), else 0.",
     [](const JobRow& j) {
       return j.view.finished_ranks < j.view.world_size && !j.view.lost ? 1.0 : 0.0;
     }},
    {"straggler_job_lost", MetricType::Gauge,
     "1 while the job's current run has ended unexpectedly: no stream and no report for "
     "limits.job_lost_after_seconds (its ranks were killed), else 0.",
     [](const JobRow& j) { return j.view.lost ? 1.0 : 0.0; }},
    {"straggler_job_finished_ranks", MetricType::Gauge,
     "Ranks whose trainer closed cleanly (state finished).",
     [](const JobRow& j) { return double(j.view.finished_ranks); }},
    {"straggler_job_active_ranks", MetricType::Gauge,
     "Ranks taking part in the collective (newest membership).",
     [](const JobRow& j) { return double(j.view.active_ranks); }},
    {"straggler_job_excluded_ranks", MetricType::Gauge,
     "Ranks left out (newest membership); 0 once the job ended (finished or lost).",
     [](const JobRow& j) { return double(j.view.excluded_ranks); }},
    {"straggler_job_excluded_replicas", MetricType::Gauge,
     "Data-parallel replicas left out (newest membership); a rank that declared no replica is "
     "one of its own.",
     [](const JobRow& j) { return double(j.excluded_units); }},
    {"straggler_job_straggler_ranks", MetricType::Gauge,
     "Ranks classified straggler (excluded or withheld by a guard).",
     [](const JobRow& j) { return double(j.view.straggler_ranks); }},
    {"straggler_job_mild_ranks", MetricType::Gauge,
     "Ranks in the peer policy's gray zone (state mild): persistently slower than their peers, "
     "below peer_straggler_ratio; never excluded for it.",
     [](const JobRow& j) { return double(j.view.mild_ranks); }},
    {"straggler_job_unresponsive_ranks", MetricType::Gauge, "Ranks that stopped reporting.",
     [](const JobRow& j) { return double(j.view.unresponsive_ranks); }},
    {"straggler_job_detached_ranks", MetricType::Gauge,
     "Ranks no report stream speaks for (not yet connected, or gone).",
     [](const JobRow& j) { return double(j.view.detached_ranks); }},
    {"straggler_job_membership_withheld", MetricType::Gauge,
     "1 while a change of the excluded set waits for detached ranks.",
     [](const JobRow& j) { return j.view.membership_withheld ? 1.0 : 0.0; }},
    {"straggler_job_threshold_seconds", MetricType::Gauge,
     "Current judging threshold (0 before the first profile).",
     [](const JobRow& j) { return double(j.view.threshold_seconds); }},
    {"straggler_job_baseline_seconds", MetricType::Gauge,
     "Reference speed (profiled fastest-rank mean, or median EWMA).",
     [](const JobRow& j) { return double(j.view.baseline_seconds); }},
    {"straggler_job_step_seconds", MetricType::Gauge,
     "Step time of the newest judged iteration: the slowest active rank's step_seconds "
     "(compute_seconds where no step time is reported). The job steps at this speed; "
     "against straggler_job_baseline_seconds it shows the time a straggler costs.",
     [](const JobRow& j) { return double(j.view.step_seconds); }},
    {"straggler_job_membership_version", MetricType::Gauge, "Newest membership version.",
     [](const JobRow& j) { return double(j.membership_version); }},
    {"straggler_job_streams", MetricType::Gauge, "Open report streams.",
     [](const JobRow& j) { return double(j.streams); }},
    {"straggler_job_reports_total", MetricType::Counter, "Reports accepted.",
     [](const JobRow& j) { return double(j.view.reports_total); }},
    {"straggler_job_reports_late_total", MetricType::Counter,
     "Reports that came after their iteration was judged without them (the job had moved 3 "
     "iterations past it): judged alone, not within their row. A large share means streams "
     "far apart (batches spanning several iterations, a slow agent).",
     [](const JobRow& j) { return double(j.view.reports_late_total); }},
    {"straggler_job_detections_total", MetricType::Counter, "Healthy to straggler transitions.",
     [](const JobRow& j) { return double(j.view.detections_total); }},
    {"straggler_job_recoveries_total", MetricType::Counter, "Straggler to healthy transitions.",
     [](const JobRow& j) { return double(j.view.recoveries_total); }},
    {"straggler_job_guard_blocks_total", MetricType::Counter, "Exclusions withheld by a guard.",
     [](const JobRow& j) { return double(j.view.guard_blocks_total); }},
};

// Per rank (gauges labelled job, rank, node), for jobs up to
// metrics.per_rank_max_ranks.
struct RankFamily {
  const char* name;
  const char* help;
  double (*value)(const engine::WorkerView&);
};
const RankFamily kRankFamilies[] = {
    {"straggler_rank_compute_seconds", "Last reported compute time.",
     [](const engine::WorkerView& w) { return double(w.last_compute_seconds); }},
    {"straggler_rank_ewma_compute_seconds", "EWMA of the compute time.",
     [](const engine::WorkerView& w) { return double(w.ewma_compute_seconds); }},
    {"straggler_rank_slow_score", "The bounded counter (recent slow steps).",
     [](const engine::WorkerView& w) { return double(w.counter); }},
    {"straggler_rank_slow_score_limit", "The counter's limit: the rank is a straggler at this value.",
     [](const engine::WorkerView& w) { return double(w.limit); }},
    {"straggler_rank_slowdown_ratio", "EWMA over the baseline the rank is judged against (peer: its group's median; 0 before one).",
     [](const engine::WorkerView& w) { return double(w.slowdown_ratio); }},
    {"straggler_rank_excluded", "1 when left out of the newest membership.",
     [](const engine::WorkerView& w) { return w.excluded ? 1.0 : 0.0; }},
    {"straggler_rank_monitor_only", "1 when its client does not act on membership (monitoring only): never excluded for its state.",
     [](const engine::WorkerView& w) { return w.monitor_only ? 1.0 : 0.0; }},
};

// GPU telemetry per rank (agent, NVML), gauges labelled job, rank, node,
// gpu: only ranks with a fresh sample, only the values the GPU measures.
using T = v1::GpuTelemetry;
std::optional<double> Field(bool has, double v) {
  return has ? std::optional<double>(v) : std::nullopt;
}
std::optional<double> Reason(const T& t, uint64_t bits) {
  return t.has_clock_event_reasons()
             ? std::optional<double>((t.clock_event_reasons() & bits) != 0 ? 1 : 0)
             : std::nullopt;
}
struct GpuFamily {
  const char* name;
  const char* help;
  std::optional<double> (*value)(const T&);
};
const GpuFamily kGpuFamilies[] = {
    {"straggler_rank_gpu_sm_clock_hertz", "SM clock of the rank's GPU.",
     [](const T& t) { return Field(t.has_sm_clock_hertz(), t.sm_clock_hertz()); }},
    {"straggler_rank_gpu_max_sm_clock_hertz", "Maximum SM clock of the rank's GPU.",
     [](const T& t) { return Field(t.has_max_sm_clock_hertz(), t.max_sm_clock_hertz()); }},
    {"straggler_rank_gpu_memory_clock_hertz", "Memory clock of the rank's GPU.",
     [](const T& t) { return Field(t.has_memory_clock_hertz(), t.memory_clock_hertz()); }},
    {"straggler_rank_gpu_temperature_celsius", "Temperature of the rank's GPU.",
     [](const T& t) { return Field(t.has_temperature_celsius(), t.temperature_celsius()); }},
    {"straggler_rank_gpu_power_watts", "Power draw of the rank's GPU.",
     [](const T& t) { return Field(t.has_power_watts(), t.power_watts()); }},
    {"straggler_rank_gpu_power_limit_watts", "Enforced power limit of the rank's GPU.",
     [](const T& t) { return Field(t.has_power_limit_watts(), t.power_limit_watts()); }},
    {"straggler_rank_gpu_utilization_ratio",
     "Share of the last sample period with a kernel running on the rank's GPU (0..1).",
     [](const T& t) { return Field(t.has_gpu_utilization(), t.gpu_utilization()); }},
    {"straggler_rank_gpu_memory_utilization_ratio",
     "Share of the last sample period with the rank's GPU memory read or written (0..1).",
     [](const T& t) { return Field(t.has_memory_utilization(), t.memory_utilization()); }},
    {"straggler_rank_gpu_throttle_thermal",
     "1 while the rank's GPU reports a thermal slowdown reason (SW or HW), else 0.",
     [](const T& t) { return Reason(t, 0x20 | 0x40); }},
    {"straggler_rank_gpu_throttle_power",
     "1 while the rank's GPU reports a power cap or power brake reason, else 0.",
     [](const T& t) { return Reason(t, 0x4 | 0x80); }},
};

// Daemon-wide families with labels: one function each.
void LabelledFamilies(const DaemonStats& stats, std::vector<MetricFamily>& out) {
  // The family always (its TYPE says what it is, as the GPU families do); a
  // sample only with TLS, where there is a certificate.
  auto& tls = AddFamily(out, "straggler_tls_certificate_expiry_seconds", MetricType::Gauge,
                        "Unix time at which the serving certificate (tls.cert_file's leaf) "
                        "expires; no sample without TLS.");
  if (const double not_after = Load(stats.tls_certificate_not_after); not_after != 0) {
    AddSample(tls, {}, not_after);
  }
  auto& http = AddFamily(out, "straggler_http_rejected_total", MetricType::Counter,
                         "HTTP requests answered with a status >= 400, by status.");
  for (size_t i = 0; i < stats.http_rejected.size(); ++i) {
    AddSample(http,
              {{"code", i < kHttpRejectStatuses.size() ? std::to_string(kHttpRejectStatuses[i])
                                                        : std::string("other")}},
              Load(stats.http_rejected[i]));
  }
  auto& slow = AddFamily(out, "straggler_http_slow_clients_total", MetricType::Counter,
                         "HTTP connections closed for a request or response slower than the "
                         "timeouts.");
  AddSample(slow, {{"phase", "request"}}, Load(stats.http_slow_clients[0]));
  AddSample(slow, {{"phase", "response"}}, Load(stats.http_slow_clients[1]));
  auto& reloads = AddFamily(out, "straggler_config_reloads_total", MetricType::Counter,
                            "SIGHUP config reloads, by result: applied, or rejected (a bad or "
                            "empty file, a security downgrade not allowed; the old config kept).");
  AddSample(reloads, {{"result", "applied"}}, Load(stats.config_reloads_applied));
  AddSample(reloads, {{"result", "rejected"}}, Load(stats.config_reloads_rejected));
  auto& refused = AddFamily(out, "straggler_streams_refused_total", MetricType::Counter,
                            "Ingest streams ended before taking a report, by reason.");
  for (size_t i = 0; i < kStreamRefuseReasons; ++i) {
    AddSample(refused, {{"reason", StreamRefuseReasonName(static_cast<StreamRefuseReason>(i))}},
              Load(stats.streams_refused[i]));
  }
  auto& topology = AddFamily(out, "straggler_topology_refused_total", MetricType::Counter,
                             "Ranks' topology claims (peer group, replica) refused in a hello, "
                             "by reason; the rank keeps the topology it had.");
  for (size_t i = 0; i < kTopologyRefuseReasons; ++i) {
    AddSample(topology,
              {{"reason", TopologyRefuseReasonName(static_cast<TopologyRefuseReason>(i))}},
              Load(stats.topology_refused[i]));
  }
  auto& rejected = AddFamily(
      out, "straggler_reports_rejected_total", MetricType::Counter,
      "Reports refused, by reason (duplicate and stale are replays, not sender errors).");
  for (size_t i = 1; i < kEngineRejectReasons; ++i) {  // 0 is kNone
    const auto reason = static_cast<engine::RejectReason>(i);
    AddSample(rejected, {{"reason", std::string(engine::RejectReasonName(reason))}},
              Load(stats.reports_rejected[i]));
  }
  for (size_t i = 0; i < kStreamRejectReasons; ++i) {
    AddSample(rejected, {{"reason", StreamRejectReasonName(static_cast<StreamRejectReason>(i))}},
              Load(stats.reports_rejected_stream[i]));
  }
  auto& events =
      AddFamily(out, "straggler_events_total", MetricType::Counter, "Events journaled, by kind.");
  for (engine::EventKind kind : kAllEventKinds) {
    AddSample(events, {{"kind", std::string(engine::EventKindName(kind))}},
              Load(stats.events_by_kind[static_cast<size_t>(kind)]));
  }
  auto& causes = AddFamily(out, "straggler_detections_total", MetricType::Counter,
                           "Ranks turned straggler, by the likely cause found then "
                           "(docs/detection.md, \"Likely cause\").");
  for (size_t i = 0; i < kLikelyCauses; ++i) {
    AddSample(causes, {{"cause", std::string(LikelyCauseName(static_cast<LikelyCause>(i)))}},
              Load(stats.detections_by_cause[i]));
  }
  auto& grpc = AddFamily(out, "straggler_grpc_refused_total", MetricType::Counter,
                         "Unary gRPC calls (query, admin, rendezvous) ended with an error, by "
                         "service and status code; a series appears with its first refusal.");
  for (size_t i = 0; i < stats.grpc_refused.size(); ++i) {
    const double n = Load(stats.grpc_refused[i]);
    if (n == 0) continue;  // 3 x 16 series of zeros would say nothing
    AddSample(grpc,
              {{"service", GrpcServiceName(static_cast<GrpcService>(i / kGrpcCodes))},
               {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(i % kGrpcCodes))}},
              n);
  }
  auto& telemetry = AddFamily(out, "straggler_telemetry_rejected_total", MetricType::Counter,
                              "GPU telemetry samples refused, by reason.");
  AddSample(telemetry, {{"reason", "rank_not_in_stream"}}, Load(stats.telemetry_rejected_rank));
  AddSample(telemetry, {{"reason", "invalid_value"}}, Load(stats.telemetry_rejected_invalid));
  auto& batch = AddFamily(out, "straggler_ingest_batch_duration_seconds", MetricType::Histogram,
                          "Time to process one ReportBatch, under the job's lock.");
  common::AddHistogram(batch, {}, stats.ingest_batch_duration);
}

// A replica of a cluster (docs/cluster.md): only with --etcd-endpoints.
// Daemon-wide like the families above; the job series of this replica are
// the jobs it owns (the registry holds no other), so a Prometheus scraping
// every replica sees each job once.
void ClusterFamilies(const ClusterMetrics& c, std::vector<MetricFamily>& out) {
  AddSample(AddFamily(out, "straggler_cluster_replica_info", MetricType::Gauge,
                      "Always 1; replica_id names this stragglerd replica in etcd."),
            {{"replica_id", c.replica_id}}, 1);
  AddSample(AddFamily(out, "straggler_cluster_replicas", MetricType::Gauge,
                      "stragglerd replicas registered in etcd, as this replica's view sees them."),
            {}, static_cast<double>(c.replicas));
  AddSample(AddFamily(out, "straggler_cluster_jobs_owned", MetricType::Gauge,
                      "Jobs this replica owns (serves and exports) now."),
            {}, static_cast<double>(c.jobs_owned));
  AddSample(AddFamily(out, "straggler_cluster_may_decide", MetricType::Gauge,
                      "1 while this replica's etcd lease is renewed in time, so it may decide "
                      "its jobs' memberships; 0 when etcd cannot be reached (or not joined)."),
            {}, c.may_decide ? 1 : 0);
  auto& changes = AddFamily(out, "straggler_cluster_ownership_changes_total", MetricType::Counter,
                            "Jobs this replica took (change=taken), and jobs it lost while "
                            "running (change=lost: its lease expired, another replica owns "
                            "them).");
  AddSample(changes, {{"change", "taken"}}, static_cast<double>(c.jobs_taken));
  AddSample(changes, {{"change", "lost"}}, static_cast<double>(c.jobs_lost));
  if (c.etcd == nullptr) return;
  AddSample(AddFamily(out, "straggler_cluster_etcd_requests_total", MetricType::Counter,
                      "Round trips to etcd: unary calls and lease renewals."),
            {}, static_cast<double>(c.etcd->calls()));
  AddSample(AddFamily(out, "straggler_cluster_etcd_errors_total", MetricType::Counter,
                      "Round trips to etcd that failed (etcd unreachable, timed out, refused)."),
            {}, static_cast<double>(c.etcd->errors()));
  AddSample(AddFamily(out, "straggler_cluster_etcd_streams_broken_total", MetricType::Counter,
                      "Lease keep-alive and watch streams to etcd that broke (each reopened)."),
            {}, static_cast<double>(c.etcd->streams_broken()));
  auto& rtt = AddFamily(out, "straggler_cluster_etcd_round_trip_seconds", MetricType::Histogram,
                        "Time of each successful round trip to etcd.");
  common::AddHistogram(rtt, {}, c.etcd->round_trip_seconds());
}

void PerRankFamilies(const std::vector<JobRow>& jobs, std::vector<MetricFamily>& out) {
  // The label set of each rank, built once and copied into its series.
  std::vector<std::vector<Labels>> base(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    base[j].reserve(jobs[j].ranks.size());
    for (size_t r = 0; r < jobs[j].ranks.size(); ++r) {
      // Topology labels (docs/topology.md): "" = the default group, own replica.
      const DeclaredTopology& t = jobs[j].ranks[r].topology;
      base[j].push_back({{"job", jobs[j].id}, {"rank", absl::StrCat(r)},
                         {"node", jobs[j].ranks[r].node}, {"peer_group", t.peer_group},
                         {"replica", t.replica ? absl::StrCat(*t.replica) : std::string()}});
    }
  }
  size_t ranks = 0;
  for (const JobRow& j : jobs) ranks += j.ranks.size();
  // A family's samples reserved up front: 110 000 ClientMetric moved on
  // each growth would cost as much as building them.
  auto with = [](const Labels& base, const char* name, std::string value) {
    Labels labels;
    labels.reserve(base.size() + 1);
    labels.insert(labels.end(), base.begin(), base.end());
    labels.push_back({name, std::move(value)});
    return labels;
  };
  for (const RankFamily& f : kRankFamilies) {
    auto& family = AddFamily(out, f.name, MetricType::Gauge, f.help);
    family.metric.reserve(ranks);
    for (size_t j = 0; j < jobs.size(); ++j) {
      for (size_t r = 0; r < jobs[j].ranks.size(); ++r) {
        AddSample(family, base[j][r], f.value(jobs[j].ranks[r].w));
      }
    }
  }
  auto& state = AddFamily(out, "straggler_rank_state", MetricType::Gauge,
                          "1 for the rank's state (pending, healthy, straggler, unresponsive), 0 "
                          "for the others.");
  state.metric.reserve(ranks * std::size(kAllStates));
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (size_t r = 0; r < jobs[j].ranks.size(); ++r) {
      for (engine::WorkerState s : kAllStates) {
        AddSample(state, with(base[j][r], "state", std::string(engine::WorkerStateName(s))),
                  jobs[j].ranks[r].w.state == s ? 1 : 0);
      }
    }
  }
  // One series per straggler, none for the others: the cause label stays
  // bounded (kLikelyCauses values) and the family costs nothing in a
  // healthy job.
  auto& cause = AddFamily(out, "straggler_rank_likely_cause", MetricType::Gauge,
                          "1 for each straggler rank, labelled with the likely cause found at "
                          "its detection, and for each healthy rank slow on time alone but not "
                          "per unit of work, labelled data (docs/detection.md, \"Likely cause\").");
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (size_t r = 0; r < jobs[j].ranks.size(); ++r) {
      if (const auto& c = jobs[j].ranks[r].cause)
        AddSample(cause, with(base[j][r], "cause", std::string(LikelyCauseName(*c))), 1);
    }
  }
  for (const GpuFamily& f : kGpuFamilies) {
    auto& family = AddFamily(out, f.name, MetricType::Gauge, f.help);
    for (size_t j = 0; j < jobs.size(); ++j) {
      for (size_t r = 0; r < jobs[j].ranks.size(); ++r) {
        const RankRow& rank = jobs[j].ranks[r];
        if (!rank.gpu) continue;
        if (std::optional<double> v = f.value(*rank.gpu)) {
          // The GPU families keep job, rank, node and gpu (no topology labels).
          AddSample(family,
                    {{"job", jobs[j].id}, {"rank", absl::StrCat(r)}, {"node", rank.node},
                     {"gpu", absl::StrCat(rank.gpu->gpu_index())}},
                    *v);
        }
      }
    }
  }
}

}  // namespace

std::vector<MetricFamily> DaemonCollector::Collect() const {
  std::vector<JobRow> jobs;
  for (const auto& job : registry_.Jobs()) {
    if (auto row = Copy(*job, options_.per_rank_max_ranks)) jobs.push_back(*std::move(row));
  }
  // No lock from here on.
  std::vector<MetricFamily> out;
  out.reserve(std::size(kDaemonFamilies) + std::size(kJobFamilies) + std::size(kRankFamilies) +
              std::size(kGpuFamilies) + 16);
  AddSample(AddFamily(out, "straggler_build_info", MetricType::Gauge,
                      "Always 1; the version label names the stragglerd build."),
            {{"version", options_.version}}, 1);
  AddSample(AddFamily(out, "straggler_jobs", MetricType::Gauge, "Jobs tracked."), {},
            static_cast<double>(jobs.size()));
  for (const auto& f : kDaemonFamilies) {
    AddSample(AddFamily(out, f.name, f.type, f.help), {}, f.value(stats_));
  }
  // The event writer counts its own errors in the store.
  AddSample(AddFamily(out, "straggler_state_db_errors_total", MetricType::Counter,
                      "State database writes or reads that failed (event batches, memberships, "
                      "overrides, sequence reservations, retention)."),
            {}, Load(stats_.state_db_errors) + static_cast<double>(registry_.state_db_writer_errors()));
  LabelledFamilies(stats_, out);
  common::AddJobFamilies(out, kJobFamilies, jobs, [](const JobRow& j) {
    return std::pair<const std::string&, const JobRow&>(j.id, j);
  });
  auto& latency = AddFamily(out, "straggler_job_detection_latency_iterations",
                            MetricType::Histogram,
                            "Iterations from the first slow step of an episode to the detection.");
  for (JobRow& j : jobs) {
    j.latency.label = {{"job", j.id}};
    latency.metric.push_back(std::move(j.latency));
  }
  auto& replicas = AddFamily(out, "straggler_replica_excluded", MetricType::Gauge,
                             "Ranks of a data-parallel replica left out with it (newest "
                             "membership), labelled with the replica and the culprit rank and "
                             "peer group that took it out; no sample while none is out.");
  for (const JobRow& j : jobs) {
    for (const auto& x : j.excluded_replicas) {
      AddSample(replicas,
                {{"job", j.id}, {"replica", absl::StrCat(x.replica)},
                 {"culprit_rank", absl::StrCat(x.culprit)}, {"culprit_peer_group", x.group}},
                x.ranks);
    }
  }
  PerRankFamilies(jobs, out);
  if (options_.cluster) ClusterFamilies(*options_.cluster, out);
  return out;
}

std::string RenderDaemonMetrics(const JobRegistry& registry, const DaemonStats& stats,
                                const MetricsOptions& options) {
  const DaemonCollector daemon(registry, stats, options);
  const common::ProcessCollector process;
  return common::Scrape({&daemon, &process});
}

}  // namespace straggler::daemon
