// The daemon's jobs: one detection engine per job plus who listens to it, and
// the daemon-wide event journal.
//
//   JobRegistry registry(config, stats);
//   auto job = registry.Attach(hello, subscriber, WallNow());   // first hello creates
//   {
//     std::lock_guard lock(job->mu);
//     job->engine.Ingest(report, now);
//     registry.CommitLocked(*job, now);   // journal events, push memberships
//   }
//
// Locking: `jobs_mu_` (shared_mutex) guards only the id -> Job map and is
// never held while a job's `mu` is taken; a job's `mu` guards its engine and
// listeners; `events_mu_` guards the journal and is taken (briefly, under a
// job's `mu`) only when an engine produced events, which is rare. So ingest
// pays one shared lock to find a job (streams keep the pointer after hello)
// and one uncontended per-job mutex.
//
// Idle jobs (no stream, no watcher, no activity for limits.job_idle_ttl_seconds)
// are removed by the tick thread: it marks the job `removed` under its `mu`,
// then erases it from the map. Whoever finds a job and then takes its `mu`
// checks `removed` and treats a removed job as absent (Attach creates a
// fresh one), so nothing subscribes to a job that is no longer in the map.
// Its events stay in the journal.
//
// Thread-safe: every public method may be called from any thread. Methods
// named *Locked require the caller to hold the job's `mu`.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "registry/attribution.h"
#include "config/config.h"
#include "metrics/buckets.h"
#include "straggler/common/metrics.h"
#include "ingest/rank_topology.h"
#include "metrics/stats.h"
#include "persist/store.h"
#include "straggler/engine/job_engine.h"
#include "straggler/v1/straggler.pb.h"
#include "straggler/common/validate.h"

namespace straggler::daemon {

// Wall-clock now, as the engine counts time (ns since the Unix epoch).
engine::Time WallNow();

struct Job;

// The latest GPU telemetry of a rank, as the agent sent it, and when the
// daemon received it (its own clock: staleness must not depend on the
// agent's clock being right).
struct RankGpu {
  v1::GpuTelemetry telemetry;
  engine::Time received{0};
  bool Fresh(engine::Time now) const { return now - received <= kTelemetryStaleAfter; }
};

// One accepted report as ExportReports returns it.
struct RecentReport {
  uint64_t epoch = 0;
  uint64_t iteration = 0;
  double compute_seconds = 0;
  uint32_t rank = 0;
  // The job's baseline and step time when it was accepted (JobView); floats
  // keep an entry at 40 bytes, and a heatmap colour needs no more precision.
  float reference_seconds = 0;
  float job_step_seconds = 0;
};

// A job's most recent accepted reports, oldest overwritten first: a vector
// used as a ring. It grows (amortized) to `capacity` on first use and is then
// reused, so a report costs a copy, never an allocation. capacity 0 keeps
// nothing (limits.recent_reports_per_job=0). Not thread-safe: Job::mu.
class RecentReports {
 public:
  explicit RecentReports(uint32_t capacity) : capacity_(capacity) {}

  void Add(const RecentReport& r) {
    if (capacity_ == 0) return;
    if (ring_.size() < capacity_) {
      ring_.push_back(r);
    } else {
      RecentReport& slot = ring_[next_];
      dropped_max_iteration_ = std::max(dropped_max_iteration_, slot.iteration);
      slot = r;
      ++dropped_;
    }
    if (++next_ == capacity_) next_ = 0;
  }
  // Every kept report, oldest first.
  template <class Fn>
  void ForEach(Fn&& fn) const {
    const size_t start = ring_.size() < capacity_ ? 0 : next_;
    for (size_t i = 0; i < ring_.size(); ++i) fn(ring_[(start + i) % ring_.size()]);
  }
  size_t size() const { return ring_.size(); }
  uint32_t capacity() const { return capacity_; }
  // Reports overwritten so far, and the highest iteration among them.
  uint64_t dropped() const { return dropped_; }
  uint64_t dropped_max_iteration() const { return dropped_max_iteration_; }

 private:
  uint32_t capacity_;
  std::vector<RecentReport> ring_;
  size_t next_ = 0;  // slot the next report goes to once the ring is full
  uint64_t dropped_ = 0;
  uint64_t dropped_max_iteration_ = 0;
};

// Something that wants a job's membership changes: an ingest stream (to push
// directives) or a WatchMembership call. The registry holds it by
// shared_ptr; the RPC behind it may already be gone, which the implementation
// must tolerate (see ingest_service.cc).
class JobSubscriber {
 public:
  virtual ~JobSubscriber() = default;
  // The job's membership version changed. Called with job.mu held: must not
  // block and must not call back into the registry.
  virtual void OnMembershipChangedLocked(const Job& job) = 0;
  // The daemon is shutting down: end the RPC with `status`. Called with
  // job.mu held, same rules.
  virtual void CloseLocked(const absl::Status& status) = 0;
};

struct Job {
  Job(std::string job_id, uint32_t world, engine::PolicyConfig policy, engine::Time now,
      uint64_t daemon_incarnation, uint32_t recent_reports_capacity = 0,
      std::string run = std::string())
      : id(std::move(job_id)),
        run_id(std::move(run)),
        world_size(world),
        created_at(now),
        incarnation(daemon_incarnation),
        engine(world, std::move(policy), now),
        nodes(world),
        rank_streams(world, 0),
        lineage_incarnation(world, 0),
        restarted(world, false),
        topology(world),
        last_activity(now),
        recent(recent_reports_capacity) {}

  const std::string id;
  // The launch of the job this object tracks (StreamHello.run_id; "" = the
  // default run). Another run gets another Job (docs/runs.md).
  const std::string run_id;
  const uint32_t world_size;
  const engine::Time created_at;
  // Random per daemon run, stamped on every membership: a client that
  // reconnects holding this run's versions needs no version floor.
  const uint64_t incarnation;

  mutable std::mutex mu;
  // Everything below is guarded by mu.
  engine::JobEngine engine;
  std::vector<std::string> nodes;  // node that last spoke for each rank
  std::vector<std::shared_ptr<JobSubscriber>> subscribers;
  uint32_t streams = 0;
  // Open streams speaking for each rank, and the ranks of each stream: a
  // rank is detached from the engine when its count drops to 0 (a reconnect
  // attaches the new stream before the old one ends, hence a count).
  std::vector<uint32_t> rank_streams;
  std::unordered_map<const JobSubscriber*, std::vector<uint32_t>> stream_ranks;
  // The client incarnation speaking for each rank since the engine's current
  // lineage began (0 = none yet), and which ranks another incarnation took
  // over since: see JobRegistry::NoteIncarnationsLocked.
  std::vector<uint64_t> lineage_incarnation;
  std::vector<bool> restarted;
  uint32_t restarted_count = 0;
  // Each rank's declared peer group and replica (docs/topology.md).
  RankTopologies topology;
  // Reports refused as stale (older than the rank's newest iteration within
  // one incarnation) and when one was last logged: logged at most every 10 s.
  uint64_t stale_reports = 0;
  engine::Time stale_logged{0};
  // Set by AdminService.SetPolicy: a SIGHUP reload then leaves the policy
  // alone, so an operator's runtime decision is not silently undone.
  bool policy_overridden = false;
  uint64_t pushed_version = 0;  // newest membership version pushed
  // The reason given with each rank's current SetRankOverride (what the
  // state database keeps with the override; the engine keeps only the kind).
  std::map<uint32_t, std::string> override_reasons;
  // Iterations from an episode's first slow step to its detection, one
  // observation per healthy -> straggler event journaled (CommitLocked).
  // Kept across Reset, like every cumulative metric.
  prometheus::Histogram detection_latency{DetectionLatencyBuckets()};  // its own lock
  // Creation, last report, last stream detach: what the idle sweep measures.
  engine::Time last_activity;
  // Set (under mu) by the idle sweep just before the job leaves the map;
  // atomic so the map lookup may skip it without taking mu.
  std::atomic<bool> removed{false};
  // The newest accepted reports (ingest appends, ExportReports reads);
  // capacity limits.recent_reports_per_job as of the job's creation.
  RecentReports recent;
  // Latest GPU telemetry per rank (ReportBatch.telemetry): empty until the
  // first sample arrives, then world_size slots, so bounded by the job.
  std::vector<std::optional<RankGpu>> gpu;

  // With mu held. `rank` < world_size.
  void StoreTelemetryLocked(uint32_t rank, v1::GpuTelemetry telemetry, engine::Time now) {
    if (gpu.empty()) gpu.resize(world_size);
    gpu[rank] = RankGpu{std::move(telemetry), now};
  }
  // The rank's telemetry if it is fresh at `now`, else null. With mu held.
  const v1::GpuTelemetry* FreshTelemetryLocked(uint32_t rank, engine::Time now) const {
    if (rank >= gpu.size() || !gpu[rank] || !gpu[rank]->Fresh(now)) return nullptr;
    return &gpu[rank]->telemetry;
  }
  // The likely cause of `rank` being slow, from its fresh telemetry against
  // the other ranks' fresh telemetry (attribution.h). With mu held.
  Attribution AttributeLocked(uint32_t rank, engine::Time now) const;
};

// StreamHello and ValidateHello: validate.h.


struct EventQuery {
  std::string job_id;             // "" = every job
  std::optional<std::string> run_id;  // nullopt = every run
  engine::Time since_time{0};     // events with time >= this
  uint64_t since_sequence = 0;    // events with sequence > this
  uint32_t limit = 1000;
  std::vector<engine::EventKind> kinds;  // only these; empty = every kind
  std::optional<uint32_t> rank;          // only events that name this rank
};

struct EventPage {
  std::vector<JournalEntry> events;
  // Resume cursor: pass as since_sequence to get what follows. The sequence
  // of the last event returned when the page was cut at `limit`, else the
  // newest sequence examined (so filtered polls do not rescan).
  uint64_t last_sequence = 0;
};

class JobRegistry {
 public:
  static constexpr uint32_t kDefaultEventLimit = 1000;
  static constexpr uint32_t kMaxEventLimit = common::kMaxEventLimit;  // validate.h

  // `store` (may be null: nothing persists) must outlive the registry.
  JobRegistry(std::shared_ptr<const DaemonConfig> config, DaemonStats& stats,
              Store* store = nullptr);
  JobRegistry(const JobRegistry&) = delete;
  JobRegistry& operator=(const JobRegistry&) = delete;

  // Validates a stream hello, creates the job on first sight (policy from the
  // config), records the nodes of the hello's ranks, raises the job's
  // membership above the version the client already holds (a daemon restart:
  // JobEngine::AdoptVersionFloor) and subscribes `stream`.
  // INVALID_ARGUMENT names the offending value; RESOURCE_EXHAUSTED at
  // limits.max_jobs; UNAVAILABLE while shutting down (also when the shutdown
  // began while attaching: a subscriber is never left unclosed). A rank's
  // refused topology claim (docs/topology.md) does not fail the hello: it
  // is logged, counted and added to *topology_refused (when given).
  absl::StatusOr<std::shared_ptr<Job>> Attach(
      const common::StreamHello& hello, std::shared_ptr<JobSubscriber> stream, engine::Time now,
      std::vector<TopologyRefusal>* topology_refused = nullptr);
  // With job.mu held: a later hello on a stream already attached to `job`
  // adds ranks to it (a node agent whose ranks connect at different times).
  // Same checks as Attach plus the same job id and world size; the ranks get
  // what Attach gives them (node, announcement, version floor). The caller
  // commits (CommitLocked). INVALID_ARGUMENT names the offending value.
  absl::Status AddRanksLocked(Job& job, const JobSubscriber* stream, const common::StreamHello& hello,
                              engine::Time now,
                              std::vector<TopologyRefusal>* topology_refused = nullptr);
  // Subscribes a watcher of `job` (from Find) and sends it the current
  // membership at once. UNAVAILABLE while shutting down; NOT_FOUND when the
  // job was removed as idle since Find.
  absl::Status Watch(Job& job, std::shared_ptr<JobSubscriber> watcher);
  // Removes a subscriber added by Attach (is_stream) or Watch. The ranks only
  // that stream spoke for are detached (JobEngine::Detach): changes of the
  // job's excluded set wait for them until they attach again.
  void Unsubscribe(Job& job, const JobSubscriber* subscriber, bool is_stream);

  std::shared_ptr<Job> Find(absl::string_view job_id) const;
  std::vector<std::shared_ptr<Job>> Jobs() const;  // ascending by id

  // Runs `fn` with the job's mu held. NOT_FOUND "job 'x' not found".
  absl::Status Read(absl::string_view job_id, absl::FunctionRef<void(const Job&)> fn) const;
  // Runs `fn` with the job's mu held, then commits (journal + pushes) even
  // when `fn` failed half-way. Returns fn's status.
  absl::Status Mutate(absl::string_view job_id,
                      absl::FunctionRef<absl::Status(Job&, engine::Time now)> fn);

  // After any engine mutation, with job.mu held: drains the engine's events
  // into the journal (and the log) and, when the membership version moved,
  // pushes it to every subscriber but `skip` (a stream that is about to
  // acknowledge with the same membership).
  void CommitLocked(Job& job, const JobSubscriber* skip = nullptr);

  // Engine::Tick on every job with a stream, then commit. Removes the jobs
  // with no stream and no watcher whose last activity (creation, report,
  // stream detach) is older than limits.job_idle_ttl_seconds; their events
  // stay in the journal. Called once a second.
  void TickAll(engine::Time now);

  // SIGHUP: new default policy for jobs created from now on; existing jobs
  // without an admin policy override get the config's policy for their id.
  void ApplyConfig(std::shared_ptr<const DaemonConfig> config);
  std::shared_ptr<const DaemonConfig> config() const;
  // limits.max_batch_reports without config_mu_: read on every batch.
  uint32_t max_batch_reports() const {
    return max_batch_reports_.load(std::memory_order_relaxed);
  }

  // Refuses new subscribers from now on and closes every current one.
  void CloseAll(const absl::Status& status);

  // Once, before serving, with a store: the journal's newest
  // limits.events_retained events and the sequence after the highest ever
  // stored, and the jobs active within limits.job_idle_ttl_seconds, each
  // restored (JobEngine::RestoreMembership: its last membership under a
  // higher version, its admin policy and rank overrides). A job that comes
  // back later is restored by Attach the same way. Errors name the path.
  absl::Status Restore(engine::Time now);

  // The last state of an earlier run of `job_id` (kept when the next run
  // began; the newest kMaxEarlierRuns per job id), or nullopt.
  std::optional<v1::Job> EarlierRun(absl::string_view job_id, absl::string_view run_id) const;
  // Sets out->earlier_runs: the kept earlier runs of `job_id`, newest first.
  void FillEarlierRuns(absl::string_view job_id, v1::Job* out) const;
  static constexpr size_t kMaxEarlierRuns = 8;

  // With job.mu held, for a batch's finished_ranks (ReportBatch): the ranks
  // the stream speaks for are finished (JobEngine::Finish). The caller commits.
  void FinishRanksLocked(Job& job, const JobSubscriber* stream,
                         const std::vector<uint32_t>& ranks, engine::Time now);

  EventPage Events(const EventQuery& query) const;
  uint64_t last_event_sequence() const;
  // Event batches the state database's writer failed to commit (0 without one).
  uint64_t state_db_writer_errors() const {
    return store_ != nullptr ? store_->write_errors() : 0;
  }

 private:
  // Returns the hello's refused topology claims (logged and counted).
  std::vector<TopologyRefusal> AdmitLocked(Job& job, const JobSubscriber* stream,
                                           const common::StreamHello& hello, engine::Time now);
  // With job.mu held: the hello's client incarnations. A rank taken over by
  // another incarnation (a new trainer process) starts its iterations over
  // (JobEngine::Restart). The engine starts over (JobEngine::StartOver, a
  // whole job restarted from a checkpoint) when no other rank is live, or
  // once every rank has been taken over.
  void NoteIncarnationsLocked(Job& job, const common::StreamHello& hello, engine::Time now);
  // With job.mu held: whether a rank of the job's run still has a stream and
  // is neither finished nor unresponsive, i.e. the run is live and a hello
  // of another run must wait (docs/runs.md).
  static bool RunLiveLocked(const Job& job);
  // With job.mu held: JobEngine::CheckClaims for the hello's known version
  // and reported_iteration, the message naming the job.
  static absl::Status CheckClaimsLocked(const Job& job, const common::StreamHello& hello);
  // With job.mu held: the run ends for good (another run of the job id
  // begins): marks it removed, keeps its last state, closes its subscribers.
  void RetireRunLocked(Job& job, const std::string& next_run);
  // A new Job for `job_id`, restored from the store when it knows the job.
  std::shared_ptr<Job> MakeJob(const std::string& job_id, uint32_t world_size,
                               const std::string& run_id, const DaemonConfig& config,
                               engine::Time now);
  void SaveOverridesLocked(const Job& job);
  void ApplyRetention(engine::Time now);
  void JournalLocked(Job& job, std::vector<engine::Event> events);

  DaemonStats& stats_;
  Store* const store_;  // null: no persistence
  engine::Time last_retention_{0};  // TickAll's thread only
  const uint64_t incarnation_;  // see Job::incarnation

  mutable std::mutex config_mu_;
  std::shared_ptr<const DaemonConfig> config_;  // guarded by config_mu_
  std::atomic<uint32_t> max_batch_reports_;

  mutable std::shared_mutex jobs_mu_;
  std::map<std::string, std::shared_ptr<Job>, std::less<>> jobs_;  // guarded by jobs_mu_
  // Set once by CloseAll (under jobs_mu_, before it takes any job's mu);
  // read under jobs_mu_ and again under a job's mu before subscribing, so a
  // subscriber added concurrently with CloseAll is either refused or closed.
  std::atomic<bool> closed_{false};

  // With a store, event sequences are reserved on disk in blocks of this
  // many before they are handed out (Store::ReserveSequences): one
  // synchronous write per block, under events_mu_.
  static constexpr uint64_t kSequenceBlock = 1024;

  // Earlier runs' last states by job id, newest first (kMaxEarlierRuns).
  mutable std::mutex earlier_mu_;
  std::map<std::string, std::deque<v1::Job>, std::less<>> earlier_;  // guarded by earlier_mu_

  mutable std::mutex events_mu_;
  std::deque<JournalEntry> events_;  // guarded by events_mu_
  uint64_t next_sequence_ = 1;       // guarded by events_mu_
  uint64_t reserved_sequence_ = 0;   // guarded by events_mu_: on disk, with a store
  size_t events_retained_;           // guarded by events_mu_
};

}  // namespace straggler::daemon
