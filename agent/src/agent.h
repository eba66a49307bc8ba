// straggler-agent's core: serves straggler.v1.IngestService on a unix socket
// (and optionally TCP) to the trainer ranks of this node, and per job fans
// their streams into ONE upstream stream to stragglerd.
//
//   Agent agent(config);
//   if (absl::Status s = agent.Start(); !s.ok()) ...;
//   agent.Reload(next);                           // SIGHUP: the live part
//   agent.Shutdown();                             // SIGTERM: flush, then stop
//
// Semantics a client relies on (it cannot tell agent from daemon):
//  * Acknowledgement: a downstream batch is acknowledged (acked_sequence,
//    accepted) as soon as its reports are in the agent's buffer; from then on
//    the agent owns their delivery, so a client never waits for the daemon.
//  * Progress: RankProgress is the daemon's, relayed unchanged to the stream
//    owning the rank, in the same directive as (or after) every membership
//    version the daemon had sent upstream before it. So a client's
//    MembershipFor certainty rule ("my report of i + 1 - lead was processed")
//    still means processed by the daemon.
//  * Memberships: the agent keeps, per job, every version the daemon sent
//    (the newest 32); each downstream stream gets every kept version it has
//    not been sent yet (its first directive: all of them).
//  * Runs: one fan-in (and upstream stream) per (job id, StreamHello.run_id).
//  * New ranks and restarted trainers: a downstream hello naming ranks the
//    upstream stream does not speak for yet, or a new client incarnation of
//    a rank (RankDevice.incarnation), makes the agent send a later hello (all
//    its ranks and devices of the job) on the same upstream stream, in order
//    behind the reports buffered before it (proto: ReportBatch.hello).
//  * Monitoring only: the agent keeps each rank's monitor-only mark
//    (StreamHello.monitor_only_ranks) from its trainer's first hello and
//    later ones on the same stream (a client that starts asking for
//    membership sends one); a change makes it send a later hello upstream,
//    which names the marked ranks.
//  * Job end: a downstream batch's finished_ranks go upstream behind that
//    stream's reports (buffered and replayed in order). Once no trainer
//    stream is left and the buffer is acknowledged, the upstream stream ends
//    after a 2 s grace (the daemon then admits the job id's next run; a
//    refused hello, FAILED_PRECONDITION, is retried with backoff).
//  * Upstream state: each downstream stream's first directive, and one on
//    every change, says whether the job's upstream stream is down
//    (Directive.upstream_unavailable), so MembershipFor behind the agent
//    stops waiting every step while the daemon is gone.
//  * GPU telemetry (config telemetry.*): NVML is sampled on its own thread;
//    each upstream batch carries, per rank with a known device, that GPU's
//    latest sample when it is new to the current upstream stream.
//  * Host telemetry (config host_telemetry.*): /proc is read on its own
//    thread; each upstream batch carries the node's latest sample
//    (pressure, steal) and, per rank whose trainer connected on the unix
//    socket, its process's (run delay, involuntary context switches), each
//    when it is new to the current upstream stream.
//  * Idle jobs: a job with no downstream stream and an empty buffer for
//    jobs.idle_timeout_ms is removed (state freed);
//    its next trainer stream starts it afresh.
//  * Daemon restarts: reports stay buffered (bounded, drop-oldest, counted)
//    until the daemon acknowledges them; a new upstream stream replays the
//    unacknowledged ones in arrival order (the daemon deduplicates by
//    (job, rank, iteration)). The upstream hello carries the newest version
//    the agent or any of its clients holds, for the daemon's version floor.
//
// Thread-safe: Start, Reload and Shutdown from one thread (main); gRPC and
// the per-job upstream threads run the rest.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "agent_config.h"
#include "straggler/nvml/telemetry.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::agent {

// What a BatchDecorator sees of the job besides the batch.
struct BatchContext {
  const std::string& job_id;
  // Every device a downstream hello of the job reported (StreamHello.devices),
  // by rank; a rank's later hello replaces its entry.
  const std::map<uint32_t, nvml::RankDevice>& devices;
  // Per-rank marks the decorator keeps for the current upstream stream (e.g.
  // the sequence of the last telemetry sample sent); cleared whenever a new
  // upstream stream starts, so a restarted daemon gets everything again.
  std::map<uint32_t, uint64_t>& marks;
  // Each rank's trainer process id, as the agent's unix socket learned it
  // (SO_PEERCRED, docs/agent.md#host-telemetry); ranks on TCP have none.
  const std::map<uint32_t, int64_t>& pids;
  // The host telemetry's marks, cleared with `marks`: the node sample's
  // sequence last sent (0 = none) and each rank's process sample's.
  uint64_t& host_mark;
  std::map<uint32_t, uint64_t>& process_marks;
};

// Called on an upstream batch just before it is written (per job, on that
// job's upstream thread, never under a lock of the agent): the seam for
// per-rank extra data such as GPU telemetry. Calls for different jobs may
// run concurrently. Must not block for long.
using BatchDecorator = std::function<void(const BatchContext& context, v1::ReportBatch& batch)>;

class Agent {
 public:
  explicit Agent(AgentConfig config);
  ~Agent();  // Shutdown(0) if still running
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Before Start. Runs after the agent's own GPU telemetry decorator.
  void SetBatchDecorator(BatchDecorator decorator);

  // Starts GPU telemetry (when enabled; without NVML: one log line, off),
  // creates the socket's directory, reads the upstream_tls files, binds the
  // unix socket (created with mode 0660), the optional TCP listener and HTTP
  // (/metrics, /healthz, /readyz), starts serving. FAILED_PRECONDITION for a
  // directory that cannot be made or a TLS file that cannot be read.
  absl::Status Start();
  // Applies the live keys (log level, batching, buffer bound, reconnect
  // delays, shutdown flush); logs the keys that need a restart.
  void Reload(const AgentConfig& next);
  // Stops accepting, ends the downstream streams, gives every job up to
  // shutdown_flush_ms to deliver its buffer upstream, then stops.
  void Shutdown();

  const std::string& listen_address() const;
  std::string tcp_dial_address() const;   // "" without TCP
  std::string http_dial_address() const;  // "" without HTTP

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace straggler::agent
