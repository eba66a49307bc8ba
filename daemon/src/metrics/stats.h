// Daemon-wide counters, kept as relaxed atomics so the ingest hot path pays
// one uncontended increment per report. daemon_metrics.cc (DaemonCollector)
// exposes them as straggler_* Prometheus series; nothing here formats them.
//
//   stats.reports_accepted.fetch_add(n, std::memory_order_relaxed);
//
// Thread-safe: every member is an atomic (the histogram a
// common::AtomicHistogram, no lock either); readers see a value that was true
// at some recent moment (no cross-counter consistency is promised).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "ingest/rank_topology.h"
#include "metrics/buckets.h"
#include "registry/attribution.h"
#include "straggler/common/atomic_histogram.h"
#include "straggler/common/rate_limit.h"
#include "straggler/engine/job_engine.h"

namespace straggler::daemon {

// Reasons the daemon rejects a report before the engine sees it; counted
// beside the engine's own RejectReason values.
enum class StreamRejectReason { kRankNotInStream, kBatchTooLarge, kRateLimited };
inline constexpr size_t kStreamRejectReasons = 3;
// Why an ingest stream was refused (ended before taking any report).
// kRunLive: a hello of another run while the job's current run is live
// (docs/runs.md); the client retries.
enum class StreamRefuseReason {
  kInvalidHello,
  kTooManyJobs,
  kTooManyStreams,
  kShuttingDown,
  kRunLive,
  // A replica that does not serve the job (docs/cluster.md): another owns it
  // (a redirect), or this one may not decide now.
  kNotOwner
};
inline constexpr size_t kStreamRefuseReasons = 6;
// engine::RejectReason runs kNone..kTooFarAhead.
inline constexpr size_t kEngineRejectReasons =
    static_cast<size_t>(engine::RejectReason::kTooFarAhead) + 1;
// engine::EventKind runs kStateChange..kJobLost.
inline constexpr size_t kEventKinds = static_cast<size_t>(engine::EventKind::kJobLost) + 1;

// The gRPC services whose unary calls (and WatchMembership's start) count
// their refusals, by status code: straggler_grpc_refused_total{service,code}.
// Ingest streams count theirs in streams_refused / reports_rejected.
enum class GrpcService { kQuery, kAdmin, kRendezvous };
inline constexpr size_t kGrpcServices = 3;
// absl::StatusCode (= grpc::StatusCode) runs kOk (0) .. kUnauthenticated (16).
inline constexpr size_t kGrpcCodes = 17;

// HTTP answers >= 400 are counted by status: these, and any other as "other".
inline constexpr std::array<int, 12> kHttpRejectStatuses = {400, 401, 403, 404, 405, 408,
                                                            411, 413, 414, 429, 431, 503};

struct DaemonStats {
  std::atomic<uint64_t> reports_accepted{0};
  std::array<std::atomic<uint64_t>, kEngineRejectReasons> reports_rejected{};
  std::array<std::atomic<uint64_t>, kStreamRejectReasons> reports_rejected_stream{};
  std::atomic<uint64_t> batches_total{0};
  std::atomic<int64_t> active_streams{0};
  // Unix time at which tls.cert_file's leaf certificate expires; 0 = no TLS
  // (no metric). Set at start and re-read by the tick every minute, so a
  // rotated certificate shows.
  std::atomic<int64_t> tls_certificate_not_after{0};
  // Lines that come in floods: 20 per 10 s each, the rest at debug and
  // summed up by the server's tick (Server::TickLoop, FloodLogs()).
  common::FloodLog stream_log{"ingest streams opened", spdlog::level::info, ""};
  common::FloodLog refused_log{"ingest streams refused", spdlog::level::warn,
                               "straggler_streams_refused_total counts them by reason"};
  // Each job event (registry/job_journal.cc): a job of 6 000 silent ranks
  // wrote 10 500 lines in 7 s. Every event stays in the journal.
  common::FloodLog event_log{"job events", spdlog::level::info,
                             "every event is kept: stragglerctl events JOB, "
                             "GET /v1/jobs/JOB/events",
                             100};
  std::atomic<uint64_t> streams_total{0};
  // Ingest streams that ended cancelled, not closed (IngestReactor::OnCancel).
  std::atomic<uint64_t> streams_cancelled{0};
  std::array<std::atomic<uint64_t>, kStreamRefuseReasons> streams_refused{};
  // Topology claims of hellos refused for one rank (rank_topology.h).
  std::array<std::atomic<uint64_t>, kTopologyRefuseReasons> topology_refused{};
  std::atomic<uint64_t> auth_rejected{0};  // calls refused for a missing or wrong token
  // Hellos whose reported_iteration the stream's first reports showed false
  // (engine::JobEngine::DropClaims), or that a live job took only up to its
  // progress + 1023 (NoteReportedIteration).
  std::atomic<uint64_t> hello_claims_dropped{0};
  // Later hellos whose job-level setting (iterations_per_epoch) differed
  // from the one the run's first announcement set: ignored.
  std::atomic<uint64_t> hello_settings_ignored{0};
  // Warnings about hellos (a claim bounded, a setting ignored, a topology or
  // a later hello refused): any ingest client can send hellos, so they come
  // in floods like the lines above (FloodLogs()).
  common::FloodLog hello_log{"hello warnings", spdlog::level::warn,
                             "straggler_hello_claims_dropped_total, "
                             "straggler_hello_settings_ignored_total and "
                             "straggler_streams_refused_total count them"};
  std::atomic<int64_t> active_watches{0};
  // A pending WatchMembership version replaced by a newer one (slow watcher).
  std::atomic<uint64_t> watch_versions_skipped{0};
  std::atomic<uint64_t> directives_written{0};
  std::atomic<uint64_t> directives_coalesced{0};  // merged into a pending write
  std::atomic<uint64_t> events_total{0};
  std::array<std::atomic<uint64_t>, kEventKinds> events_by_kind{};
  // Transitions to straggler journaled, by the likely cause found then.
  std::array<std::atomic<uint64_t>, kLikelyCauses> detections_by_cause{};
  // ReportBatch.telemetry samples kept, and refused (a rank the stream does
  // not speak for, a value out of range).
  std::atomic<uint64_t> telemetry_accepted{0};
  std::atomic<uint64_t> telemetry_rejected_rank{0};
  std::atomic<uint64_t> telemetry_rejected_invalid{0};
  // State database writes or reads that failed (membership versions,
  // overrides, sequence reservations, retention; the event writer counts
  // its own in Store, added in /metrics).
  std::atomic<uint64_t> state_db_errors{0};
  // Events the state database's writer queue had no room for.
  std::atomic<uint64_t> state_db_events_dropped{0};
  // HTTP connections closed because a request did not arrive whole within
  // http.read_timeout_seconds ([0]) or its response was not taken within
  // http.write_timeout_seconds ([1]) (http_deadline.h).
  std::array<std::atomic<uint64_t>, 2> http_slow_clients{};
  // HTTP answers >= 400, by kHttpRejectStatuses index; the last: any other.
  std::array<std::atomic<uint64_t>, kHttpRejectStatuses.size() + 1> http_rejected{};
  // Unary gRPC calls ended with an error, [service * kGrpcCodes + code].
  std::array<std::atomic<uint64_t>, kGrpcServices * kGrpcCodes> grpc_refused{};
  // SIGHUP reloads applied, and refused (a bad or empty file, a security
  // downgrade not allowed: Server::CheckReload).
  std::atomic<uint64_t> config_reloads_applied{0};
  std::atomic<uint64_t> config_reloads_rejected{0};
  // Wall time of IngestService's processing of one ReportBatch.
  // Lock-free: observed once per batch by every stream's thread.
  common::AtomicHistogram ingest_batch_duration{IngestBatchDurationBuckets()};

  // Every FloodLog above, for the tick's summaries.
  std::array<common::FloodLog*, 4> FloodLogs() {
    return {&stream_log, &refused_log, &event_log, &hello_log};
  }

  void CountRejected(engine::RejectReason r) {
    reports_rejected[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  }
  void CountRejected(StreamRejectReason r, uint64_t n = 1) {
    reports_rejected_stream[static_cast<size_t>(r)].fetch_add(n, std::memory_order_relaxed);
  }
  void CountHttpStatus(int status) {
    if (status < 400) return;
    size_t i = 0;
    while (i < kHttpRejectStatuses.size() && kHttpRejectStatuses[i] != status) ++i;
    http_rejected[i].fetch_add(1, std::memory_order_relaxed);
  }
  void CountRefused(TopologyRefuseReason r) {
    topology_refused[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  }
  void CountRefused(StreamRefuseReason r) {
    streams_refused[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  }
  // A call of `service` that ends with `code` (OK is not counted; a code
  // outside absl's numbering counts as UNKNOWN, keeping the labels bounded).
  void CountGrpcRefused(GrpcService service, absl::StatusCode code) {
    size_t c = static_cast<size_t>(code);
    if (c == 0) return;
    if (c >= kGrpcCodes) c = static_cast<size_t>(absl::StatusCode::kUnknown);
    grpc_refused[static_cast<size_t>(service) * kGrpcCodes + c].fetch_add(
        1, std::memory_order_relaxed);
  }
};

// Which service a call belongs to, for counting its refusals (FinishUnary in
// rpc_util.h). A service keeps one as a member: the pair never changes.
struct CallOf {
  DaemonStats& stats;
  GrpcService service;
};

inline const char* StreamRejectReasonName(StreamRejectReason r) {
  switch (r) {
    case StreamRejectReason::kRankNotInStream: return "rank_not_in_stream";
    case StreamRejectReason::kBatchTooLarge: return "batch_too_large";
    case StreamRejectReason::kRateLimited: return "rate_limited";
  }
  return "unknown";
}

inline const char* GrpcServiceName(GrpcService s) {
  switch (s) {
    case GrpcService::kQuery: return "query";
    case GrpcService::kAdmin: return "admin";
    case GrpcService::kRendezvous: return "rendezvous";
  }
  return "unknown";
}

inline const char* StreamRefuseReasonName(StreamRefuseReason r) {
  switch (r) {
    case StreamRefuseReason::kInvalidHello: return "invalid_hello";
    case StreamRefuseReason::kTooManyJobs: return "too_many_jobs";
    case StreamRefuseReason::kTooManyStreams: return "too_many_streams";
    case StreamRefuseReason::kShuttingDown: return "shutting_down";
    case StreamRefuseReason::kRunLive: return "run_live";
    case StreamRefuseReason::kNotOwner: return "not_owner";
  }
  return "unknown";
}

}  // namespace straggler::daemon
