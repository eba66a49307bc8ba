// The agent's process-wide counters and the live (SIGHUP-reloadable) part of
// its config, shared by the job table, the upstream jobs, the downstream
// reactors and the /metrics rendering (agent_metrics.h).
//
// Thread safety: AgentStats is a set of relaxed atomics, written from any
// thread and read at scrape time without a lock. LiveConfig is a plain value,
// copied under the lock of whoever holds it (a job, the table).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "agent_config.h"
#include "straggler/common/http_deadline.h"

namespace straggler::agent {

using Clock = std::chrono::steady_clock;

struct AgentStats {
  std::atomic<int64_t> downstream_streams{0};
  std::atomic<uint64_t> downstream_streams_total{0};
  std::atomic<uint64_t> reports_received{0};
  std::atomic<uint64_t> reports_forwarded{0};  // acknowledged by the daemon
  std::atomic<uint64_t> reports_rejected_local{0};
  std::atomic<uint64_t> upstream_connects{0};
  std::atomic<uint64_t> directives_relayed{0};
  std::atomic<uint64_t> jobs_removed{0};
  common::SlowClientCounters http_slow_clients{};  // the HTTP listener's (http_deadline.h)
};

// The live part of the config, copied under the job's mutex when used.
struct LiveConfig {
  uint32_t batch_max_reports;
  std::chrono::milliseconds batch_max_delay;
  uint32_t buffer_max_reports;
  std::chrono::milliseconds reconnect_initial;
  std::chrono::milliseconds reconnect_max;
  std::chrono::milliseconds shutdown_flush;
  std::chrono::milliseconds idle_job_timeout;
  static LiveConfig From(const AgentConfig& c) {
    return {c.batch_max_reports,
            std::chrono::milliseconds(c.batch_max_delay_ms),
            c.buffer_max_reports,
            std::chrono::milliseconds(c.reconnect_initial_ms),
            std::chrono::milliseconds(c.reconnect_max_ms),
            std::chrono::milliseconds(c.shutdown_flush_ms),
            std::chrono::milliseconds(c.idle_job_timeout_ms)};
  }
};

}  // namespace straggler::agent
