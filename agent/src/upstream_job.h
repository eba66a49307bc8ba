// One job's fan-in on the agent, per (job id, StreamHello.run_id): the
// buffer of reports not yet acknowledged by the daemon, the ONE upstream
// stream to stragglerd (its own thread), the membership history and the
// daemon's per-rank progress, and the downstream links to relay them to.
// The semantics a trainer relies on are agent.h's and docs/agent.md's.
//
// Promises:
//  * Take never waits for the daemon: a batch is acknowledged once buffered.
//  * Reports, later hellos and finished markers reach the daemon in arrival
//    order; a new upstream stream replays whatever was not acknowledged.
//  * Every daemon answer about a rank goes to the one link that owns it.
//
// Thread safety: every public member may be called from any thread; one
// mutex (mu_) guards the state. The upstream thread and its reader thread
// are the job's own. Lock order: JobTable's lock, then the job's, then a
// DownLink's (DownLink::Offer is called with the job's held).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "agent.h"  // BatchContext, BatchDecorator
#include "agent_stats.h"
#include "report_buffer.h"
#include "straggler/nvml/telemetry.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::agent {

class DownstreamReactor;

// A downstream stream as its job sees it. Relay state (ranks, versions sent)
// is guarded by the job's mutex; the reactor pointer by mu (null once the
// reactor is done, as with the daemon's ReactorLink).
struct DownLink {
  explicit DownLink(DownstreamReactor* r) : reactor(r) {}
  // Hands `d` to the reactor's write slot (merged with a pending one); a
  // no-op once detached. Defined in downstream.cc.
  void Offer(v1::Directive d);
  void Detach() {
    std::lock_guard lock(mu);
    reactor = nullptr;
  }

  std::mutex mu;
  DownstreamReactor* reactor;            // guarded by mu
  std::vector<uint32_t> ranks;           // ascending; job mutex
  std::set<uint64_t> sent_versions;      // job mutex
  uint64_t last_acked_sequence = 0;      // job mutex
  bool Owns(uint32_t rank) const { return std::binary_search(ranks.begin(), ranks.end(), rank); }
};

class UpstreamJob {
 public:
  UpstreamJob(std::string job_id, std::string run_id, uint32_t world_size,
              uint64_t iterations_per_epoch, std::shared_ptr<grpc::Channel> channel,
              std::string node, LiveConfig live, AgentStats& stats,
              const BatchDecorator* decorator);
  ~UpstreamJob() { Join(); }

  const std::string& id() const { return id_; }
  const std::string& run_id() const { return run_id_; }

  // A downstream hello. Checks the world size against the job's; registers
  // the link, offers its first directive (every kept version, the daemon's
  // progress of its ranks) and, when it brings ranks the upstream stream
  // does not speak for or a new client incarnation of a rank (a restarted
  // trainer), queues a later hello behind the buffered reports (the old
  // incarnation's reach the daemon first). The first attach starts the
  // upstream thread.
  absl::Status Attach(const v1::StreamHello& hello, const std::shared_ptr<DownLink>& link);
  // The link's stream ended; the last one gone starts the upstream
  // stream's idle grace.
  void Detach(const DownLink* link);

  // Takes a downstream batch's reports into the buffer; never waits for the
  // daemon. Returns the acknowledgement to send back.
  v1::Directive Take(const std::shared_ptr<DownLink>& link, const v1::ReportBatch& batch);

  // Called by the table's sweeper: true when the job has had no downstream
  // stream and an empty buffer for `timeout`; it then stops (nothing to
  // flush) and must be forgotten. The table calls this holding its lock, so
  // no new stream can attach to a job that returned true.
  bool RetireIfIdle(Clock::time_point now, std::chrono::milliseconds timeout);

  // SIGHUP's live keys; a smaller buffer bound drops the oldest reports.
  void SetLive(LiveConfig live);

  // Begins the bounded flush: the upstream thread exits once the buffer is
  // acknowledged or at the deadline.
  void Stop(Clock::time_point deadline);
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  // What /metrics shows of the job (agent_metrics.h).
  struct Snapshot {
    size_t buffered = 0;
    uint64_t dropped = 0;
    bool connected = false;
    uint64_t connects = 0;
    size_t downstreams = 0;
    std::map<uint32_t, uint64_t> acked;        // highest iteration the daemon acknowledged
    std::map<uint32_t, uint64_t> acked_count;  // reports the daemon acknowledged
    std::map<uint32_t, uint64_t> received;     // reports taken from trainer streams

    // Another run's fan-in of the same job id (metrics are per job id).
    void Add(const Snapshot& o);
  };
  Snapshot Snap() const;

 private:
  struct Known {
    uint64_t version = 0, effective_iteration = 0, incarnation = 0;
    std::vector<v1::ExcludedRank> excluded;
  };

  // How far the job's ranks on this node are, for the upstream hello
  // (StreamHello.reported_iteration): the maximum over its trainers' hellos
  // and every report they sent here.
  void NoteReportedLocked(uint64_t iteration);
  // Versions kept that `link` has not been sent, ascending, into `d`.
  void AddUnsentVersionsLocked(DownLink& link, v1::Directive& d);
  // The ranks and devices (client incarnations) an upstream hello names now.
  v1::StreamHello HelloPartLocked() const;
  // Completes b.hello (its ranks and devices come from the buffer: the hello
  // in force where the batch starts).
  void FillHelloLocked(v1::ReportBatch& b);
  // Reader thread: an upstream directive.
  void HandleDirective(const v1::Directive& d);
  // With mu_ held: tells every downstream stream whether the daemon is
  // reachable through this job's upstream stream.
  void OfferUpstreamStateLocked(bool unavailable);
  bool FlushDone() const;
  // The upstream thread: connect, (re)send the hello, replay the buffer,
  // then batch by size and time; on failure back off with jitter and retry.
  void Run();

  const std::string id_;
  const std::string run_id_;  // StreamHello.run_id of every trainer of this fan-in
  const uint32_t world_size_;
  uint64_t iterations_per_epoch_;
  std::unique_ptr<v1::IngestService::Stub> stub_;
  const std::string node_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  LiveConfig live_;
  AgentStats& stats_;
  const BatchDecorator* decorator_;
  ReportBuffer buffer_;
  std::set<uint32_t> ranks_;                 // every rank a downstream hello named
  bool hello_pending_ = true;                // a new upstream stream: its first hello
  bool flush_ = false;                       // a marker is buffered: send without delay
  bool refused_logged_ = false;              // FAILED_PRECONDITION logged since connected
  Known known_;
  std::optional<uint64_t> reported_;  // see NoteReportedLocked
  std::map<uint64_t, v1::Membership> history_;  // newest kMembershipHistory versions
  std::map<uint32_t, uint64_t> progress_;       // the daemon's, per rank
  std::map<uint32_t, uint64_t> acked_;          // highest iteration acknowledged upstream
  std::map<uint32_t, uint64_t> acked_count_;    // reports acknowledged upstream, per rank
  std::map<uint32_t, uint64_t> received_;       // reports taken from downstream, per rank
  std::vector<std::shared_ptr<DownLink>> links_;
  std::map<uint32_t, nvml::RankDevice> devices_;  // from downstream hellos, by rank
  uint64_t devices_version_ = 0;                  // grows on every change of devices_
  std::optional<Clock::time_point> idle_since_;   // no links, empty buffer since
  // Upstream thread only: its copy of devices_, and the decorator's marks.
  std::map<uint32_t, nvml::RankDevice> run_devices_;
  uint64_t run_devices_version_ = ~uint64_t{0};
  std::map<uint32_t, uint64_t> marks_;
  uint64_t dropped_ = 0;
  uint64_t next_sequence_ = 0;
  uint64_t connects_ = 0;
  bool connected_ = false;
  bool stopping_ = false;
  Clock::time_point deadline_{};
  std::chrono::milliseconds backoff_{100};
  std::mt19937_64 rng_;
  std::thread thread_;
};

}  // namespace straggler::agent
