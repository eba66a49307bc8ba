// Daemon-wide counters, kept as relaxed atomics so the ingest hot path pays
// one uncontended increment per report. metrics.cc (RenderDaemonMetrics)
// exposes them as straggler_* Prometheus series; nothing here formats them.
//
//   stats.reports_accepted.fetch_add(n, std::memory_order_relaxed);
//
// Thread-safe: every member is an atomic (or the atomic Histogram); readers see a value that was true
// at some recent moment (no cross-counter consistency is promised).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "metrics.h"
#include "straggler/engine/job_engine.h"

namespace straggler::daemon {

// Reasons the daemon rejects a report before the engine sees it; counted
// beside the engine's own RejectReason values.
enum class StreamRejectReason { kRankNotInStream, kBatchTooLarge };
inline constexpr size_t kStreamRejectReasons = 2;
// engine::RejectReason runs kNone..kStale.
inline constexpr size_t kEngineRejectReasons =
    static_cast<size_t>(engine::RejectReason::kStale) + 1;
// engine::EventKind runs kStateChange..kReprofile.
inline constexpr size_t kEventKinds = static_cast<size_t>(engine::EventKind::kReprofile) + 1;

struct DaemonStats {
  std::atomic<uint64_t> reports_accepted{0};
  std::array<std::atomic<uint64_t>, kEngineRejectReasons> reports_rejected{};
  std::array<std::atomic<uint64_t>, kStreamRejectReasons> reports_rejected_stream{};
  std::atomic<uint64_t> batches_total{0};
  std::atomic<int64_t> active_streams{0};
  std::atomic<uint64_t> streams_total{0};
  std::atomic<uint64_t> streams_refused{0};     // bad hello, job limit, shutdown
  std::atomic<uint64_t> auth_rejected{0};       // calls refused for a missing or wrong token
  std::atomic<int64_t> active_watches{0};
  std::atomic<uint64_t> directives_written{0};
  std::atomic<uint64_t> directives_coalesced{0};  // merged into a pending write
  std::atomic<uint64_t> events_total{0};
  std::array<std::atomic<uint64_t>, kEventKinds> events_by_kind{};
  // ReportBatch.telemetry samples kept, and refused (a rank the stream does
  // not speak for, a value out of range).
  std::atomic<uint64_t> telemetry_accepted{0};
  std::atomic<uint64_t> telemetry_rejected_rank{0};
  std::atomic<uint64_t> telemetry_rejected_invalid{0};
  // State database writes or reads that failed (membership versions,
  // overrides, retention; the event writer counts its own in Store).
  std::atomic<uint64_t> state_db_errors{0};
  // Events the state database's writer queue had no room for.
  std::atomic<uint64_t> state_db_events_dropped{0};
  // Wall time of IngestService's processing of one ReportBatch.
  Histogram ingest_batch_duration{IngestBatchDurationBuckets()};

  void CountRejected(engine::RejectReason r) {
    reports_rejected[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  }
  void CountRejected(StreamRejectReason r, uint64_t n = 1) {
    reports_rejected_stream[static_cast<size_t>(r)].fetch_add(n, std::memory_order_relaxed);
  }
};

inline const char* StreamRejectReasonName(StreamRejectReason r) {
  switch (r) {
    case StreamRejectReason::kRankNotInStream: return "rank_not_in_stream";
    case StreamRejectReason::kBatchTooLarge: return "batch_too_large";
  }
  return "unknown";
}

}  // namespace straggler::daemon
