// One job's fan-in on the agent, per (job id, StreamHello.run_id): the
// buffer of reports not yet acknowledged by the daemon, the membership
// history and the daemon's per-rank progress, and the downstream links to
// relay them to. Its ONE upstream stream to stragglerd is a
// stream::StreamSession (the client library's, straggler/stream/
// stream_session.h) with this job as its Source: the buffer gives the
// batches and the hello, the job wants a stream while it has trainers or
// reports, and its directives are relayed down. The semantics a trainer
// relies on are agent.h's and docs/agent.md's.
//
// Promises:
//  * Take never waits for the daemon: a batch is acknowledged once buffered.
//  * Reports, later hellos and finished markers reach the daemon in arrival
//    order; a new upstream stream replays whatever was not acknowledged.
//  * Every daemon answer about a rank goes to the one link that owns it.
//
// Thread safety: every public member may be called from any thread; one
// mutex (mu_) guards the state. The session's threads call the Source
// methods, which take mu_. Lock order: JobTable's lock, then the job's, then
// a DownLink's (DownLink::Offer is called with the job's held).
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "agent.h"  // BatchContext, BatchDecorator
#include "agent_stats.h"
#include "report_buffer.h"
#include "straggler/nvml/telemetry.h"
#include "straggler/stream/stream_session.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::agent {

class DownstreamReactor;

// A downstream stream as its job sees it. Relay state (ranks, versions sent)
// is guarded by the job's mutex (UpstreamJob::mu_, which the analysis cannot
// name from here); the reactor pointer by mu (null once the reactor is done,
// as with the daemon's ReactorLink).
struct DownLink {
  explicit DownLink(DownstreamReactor* r) : reactor(r) {}
  // Hands `d` to the reactor's write slot (merged with a pending one); a
  // no-op once detached. Defined in downstream.cc.
  void Offer(v1::Directive d);
  void Detach() {
    absl::MutexLock lock(&mu);
    reactor = nullptr;
  }

  absl::Mutex mu;
  DownstreamReactor* reactor ABSL_GUARDED_BY(mu);
  // The trainer process on the other end (SO_PEERCRED of the agent's unix
  // socket; 0 = unknown, a TCP stream). Set before Attach, then constant.
  int64_t pid = 0;
  std::vector<uint32_t> ranks;           // ascending; job mutex
  std::set<uint64_t> sent_versions;      // job mutex
  uint64_t last_acked_sequence = 0;      // job mutex
  bool Owns(uint32_t rank) const { return std::binary_search(ranks.begin(), ranks.end(), rank); }
};

class UpstreamJob final : private stream::StreamSession::Source {
 public:
  UpstreamJob(std::string job_id, std::string run_id, uint32_t world_size,
              uint64_t iterations_per_epoch, std::shared_ptr<stream::ChannelPool> pool,
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
  // upstream session.
  absl::Status Attach(const v1::StreamHello& hello, const std::shared_ptr<DownLink>& link)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A later hello on the link's stream (a monitor-only client that started
  // asking for membership, docs/membership.md "Monitoring only"): the
  // monitor-only marks of the link's own ranks are taken from it, and a
  // change queues a later hello upstream behind the buffered reports. Its
  // other fields, and ranks the link does not own, are ignored.
  void LaterHello(const v1::StreamHello& hello, const DownLink& link) ABSL_LOCKS_EXCLUDED(mu_);
  // The link's stream ended; the last one gone starts the upstream
  // stream's idle grace.
  void Detach(const DownLink* link) ABSL_LOCKS_EXCLUDED(mu_);

  // Takes a downstream batch's reports into the buffer; never waits for the
  // daemon. Returns the acknowledgement to send back.
  v1::Directive Take(const std::shared_ptr<DownLink>& link, const v1::ReportBatch& batch)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Called by the table's sweeper: true when the job has had no downstream
  // stream and an empty buffer for `timeout`; it then stops (nothing to
  // flush) and must be forgotten. The table calls this holding its lock, so
  // no new stream can attach to a job that returned true.
  bool RetireIfIdle(Clock::time_point now, std::chrono::milliseconds timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  // SIGHUP's live keys; a smaller buffer bound drops the oldest reports.
  void SetLive(LiveConfig live) ABSL_LOCKS_EXCLUDED(mu_);

  // Begins the bounded flush: the upstream session ends once the buffer is
  // acknowledged or at the deadline (then its call is cancelled).
  void Stop(Clock::time_point deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for the upstream session (at most until the Stop deadline, see
  // StreamSession::Join); stops it now when Stop was not called.
  void Join() ABSL_LOCKS_EXCLUDED(mu_);

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
  Snapshot Snap() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Known {
    uint64_t version = 0, effective_iteration = 0, incarnation = 0;
    std::vector<v1::ExcludedRank> excluded;
  };

  // StreamSession::Source (the session's threads; each takes mu_).
  bool WantsStream() override;
  void Opening(std::vector<v1::ReportBatch>* out) override;
  bool NextBatch(v1::ReportBatch* batch) override;
  stream::Clock::time_point ReadyAt() const override;
  bool Drained() override;
  void OnConnected() override;
  void OnDirective(const v1::Directive& d) override;
  void OnDisconnected(const stream::StreamSession::Disconnect& how) override;
  std::string Describe() const override;

  // When the next upstream batch is due (see ReadyAt).
  Clock::time_point ReadyAtLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next batch out of the buffer (the hello first on a new stream),
  // then the decorator, outside the lock.
  void TakeBatch(v1::ReportBatch* batch) ABSL_LOCKS_EXCLUDED(mu_);
  // How far the job's ranks on this node are, for the upstream hello
  // (StreamHello.reported_iteration): the maximum over its trainers' hellos
  // and every report they sent here.
  void NoteReportedLocked(uint64_t iteration) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Versions kept that `link` has not been sent, ascending, into `d`.
  void AddUnsentVersionsLocked(DownLink& link, v1::Directive& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `hello`'s monitor-only marks for `ranks` (ascending, named by the
  // hello); true when one changed.
  bool NoteMonitorOnlyLocked(const v1::StreamHello& hello, const std::vector<uint32_t>& ranks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ranks, devices (client incarnations) and monitor-only marks an
  // upstream hello names now.
  v1::StreamHello HelloPartLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes b.hello (its ranks and devices come from the buffer: the hello
  // in force where the batch starts).
  void FillHelloLocked(v1::ReportBatch& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells every downstream stream whether the daemon is reachable through
  // this job's upstream stream.
  void OfferUpstreamStateLocked(bool unavailable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static stream::StreamSession::Options SessionOptions(const std::string& id,
                                                       const std::string& run_id,
                                                       const LiveConfig& live);

  const std::string id_;
  const std::string run_id_;  // StreamHello.run_id of every trainer of this fan-in
  const uint32_t world_size_;
  const std::string node_;
  AgentStats& stats_;
  const BatchDecorator* decorator_;

  mutable absl::Mutex mu_;
  uint64_t iterations_per_epoch_ ABSL_GUARDED_BY(mu_);
  LiveConfig live_ ABSL_GUARDED_BY(mu_);
  ReportBuffer buffer_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> ranks_ ABSL_GUARDED_BY(mu_);  // every rank a downstream hello named
  // Ranks whose client does not act on membership, by their newest hello.
  std::set<uint32_t> monitor_only_ ABSL_GUARDED_BY(mu_);
  bool hello_pending_ ABSL_GUARDED_BY(mu_) = true;  // a new upstream stream: its first hello
  bool flush_ ABSL_GUARDED_BY(mu_) = false;  // a marker is buffered: send without delay
  Known known_ ABSL_GUARDED_BY(mu_);
  std::optional<uint64_t> reported_ ABSL_GUARDED_BY(mu_);  // see NoteReportedLocked
  // Newest kMembershipHistory versions.
  std::map<uint64_t, v1::Membership> history_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> progress_ ABSL_GUARDED_BY(mu_);  // the daemon's, per rank
  // Highest iteration acknowledged upstream, reports acknowledged upstream,
  // reports taken from downstream: per rank.
  std::map<uint32_t, uint64_t> acked_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> acked_count_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> received_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<DownLink>> links_ ABSL_GUARDED_BY(mu_);
  // From downstream hellos, by rank; devices_version_ grows on every change.
  std::map<uint32_t, nvml::RankDevice> devices_ ABSL_GUARDED_BY(mu_);
  uint64_t devices_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Each rank's trainer process (DownLink::pid of its newest hello's link);
  // changes bump devices_version_ too.
  std::map<uint32_t, int64_t> pids_ ABSL_GUARDED_BY(mu_);
  std::optional<Clock::time_point> idle_since_ ABSL_GUARDED_BY(mu_);  // no links, empty buffer
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t connects_ ABSL_GUARDED_BY(mu_) = 0;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ = false;  // Join's caller only
  // The session's sender thread only: its copy of devices_, and the
  // decorator's marks (cleared per stream: a new daemon has seen nothing).
  std::map<uint32_t, nvml::RankDevice> run_devices_;
  std::map<uint32_t, int64_t> run_pids_;
  uint64_t run_devices_version_ = ~uint64_t{0};
  std::map<uint32_t, uint64_t> marks_;
  uint64_t host_mark_ = 0;
  std::map<uint32_t, uint64_t> process_marks_;

  // Last: its threads use everything above.
  stream::StreamSession session_;
};

}  // namespace straggler::agent
