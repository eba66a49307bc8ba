// The daemon's jobs: one detection engine per job plus who listens to it, and
// the daemon-wide event journal.
//
//   JobRegistry registry(config, stats);
//   auto job = registry.Attach(hello, subscriber, WallNow());   // first hello creates
//   {
//     Job::Locked locked(**job);             // the job's mutex (registry/job.h)
//     locked->engine.Ingest(report, now);
//     registry.CommitLocked(locked);         // journal events, push memberships
//   }
//
// Locking (each mutex an absl::Mutex whose guarded fields are annotated, so
// clang's -Wthread-safety checks them: ctest layout:thread_safety):
//  * `jobs_mu_` (reader/writer) guards only the id -> Job map and is never
//    held while a job's mutex is taken;
//  * a job's mutex guards its JobState (engine, listeners), reached only
//    through a Job::Locked; every *Locked method takes that handle;
//  * `events_mu_` guards the journal and is taken (briefly, under a job's
//    mutex) only when an engine produced events, which is rare;
//  * `config_mu_` and `earlier_mu_` are leaves.
// So ingest pays one shared lock to find a job (streams keep the pointer
// after hello) and one uncontended per-job mutex.
//
// Idle jobs (no stream, no watcher, no activity for limits.job_idle_ttl_seconds)
// are removed by the tick thread: it marks the job removed under its mutex,
// then erases it from the map. Whoever finds a job and then locks it checks
// removed() and treats a removed job as absent (Attach creates a fresh one),
// so nothing subscribes to a job that is no longer in the map. Its events
// stay in the journal.
//
// Thread-safe: every public method may be called from any thread. The
// sources: job_registry.cc (jobs, streams, watchers, tick, reload, close),
// job_runs.cc (incarnations, runs, job end), job_journal.cc (commit, event
// journal, queries), job_restore.cc (the state database: restore, saves,
// retention).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "config/config.h"
#include "ingest/rank_topology.h"
#include "metrics/stats.h"
#include "persist/store.h"
#include "registry/job.h"
#include "registry/shared_state.h"
#include "straggler/engine/job_engine.h"
#include "straggler/v1/straggler.pb.h"
#include "straggler/common/validate.h"

namespace straggler::daemon {

// Wall-clock now, as the engine counts time (ns since the Unix epoch).
engine::Time WallNow();

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
      std::vector<TopologyRefusal>* topology_refused = nullptr) ABSL_LOCKS_EXCLUDED(jobs_mu_);
  // Under the job's lock: a later hello on a stream already attached to `job`
  // adds ranks to it (a node agent whose ranks connect at different times).
  // Same checks as Attach plus the same job id and world size; the ranks get
  // what Attach gives them (node, announcement, version floor). The caller
  // commits (CommitLocked). INVALID_ARGUMENT names the offending value.
  absl::Status AddRanksLocked(Job::Locked& job, const JobSubscriber* stream,
                              const common::StreamHello& hello, engine::Time now,
                              std::vector<TopologyRefusal>* topology_refused = nullptr);
  // Subscribes a watcher of `job` (from Find) and sends it the current
  // membership at once. UNAVAILABLE while shutting down; NOT_FOUND when the
  // job was removed as idle since Find.
  absl::Status Watch(Job& job, std::shared_ptr<JobSubscriber> watcher);
  // Removes a subscriber added by Attach (is_stream) or Watch. The ranks only
  // that stream spoke for are detached (JobEngine::Detach): changes of the
  // job's excluded set wait for them until they attach again.
  void Unsubscribe(Job& job, const JobSubscriber* subscriber, bool is_stream);

  std::shared_ptr<Job> Find(absl::string_view job_id) const ABSL_LOCKS_EXCLUDED(jobs_mu_);
  // Ascending by id.
  std::vector<std::shared_ptr<Job>> Jobs() const ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Runs `fn` under the job's lock. NOT_FOUND "job 'x' not found".
  absl::Status Read(absl::string_view job_id,
                    absl::FunctionRef<void(const Job::Locked&)> fn) const;
  // Runs `fn` under the job's lock, then commits (journal + pushes) even
  // when `fn` failed half-way. Returns fn's status.
  absl::Status Mutate(absl::string_view job_id,
                      absl::FunctionRef<absl::Status(Job::Locked&, engine::Time now)> fn);

  // After any engine mutation, under the job's lock: drains the engine's
  // events into the journal (and the log) and, when the membership version
  // moved, pushes it to every subscriber but `skip` (a stream that is about
  // to acknowledge with the same membership).
  void CommitLocked(Job::Locked& job, const JobSubscriber* skip = nullptr)
      ABSL_LOCKS_EXCLUDED(events_mu_);

  // Engine::Tick on every job with a stream, then commit. Removes the jobs
  // with no stream and no watcher whose last activity (creation, report,
  // stream detach) is older than limits.job_idle_ttl_seconds; their events
  // stay in the journal. A job with no stream that has not ended and whose
  // last activity is older than limits.job_lost_after_seconds is lost
  // (JobEngine::Lose, docs/runs.md "Job end"). Called once a second.
  void TickAll(engine::Time now) ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // SIGHUP: new default policy for jobs created from now on; existing jobs
  // without an admin policy override get the config's policy for their id.
  void ApplyConfig(std::shared_ptr<const DaemonConfig> config)
      ABSL_LOCKS_EXCLUDED(config_mu_, events_mu_);
  std::shared_ptr<const DaemonConfig> config() const ABSL_LOCKS_EXCLUDED(config_mu_);
  // limits.max_batch_reports without config_mu_: read on every batch.
  uint32_t max_batch_reports() const {
    return max_batch_reports_.load(std::memory_order_relaxed);
  }

  // The job is no longer this daemon's to serve (another replica owns it,
  // docs/cluster.md): closes its subscribers with `status` and forgets it as
  // the idle sweep does (its events stay); /metrics stops exporting it. A
  // later hello that this daemon may serve creates it afresh. No-op for an
  // unknown job.
  void Drop(absl::string_view job_id, const absl::Status& status) ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Refuses new subscribers from now on and closes every current one.
  void CloseAll(const absl::Status& status) ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Once, before Restore and serving: where each new membership is written
  // before it is published, and what a new job starts from (a cluster on
  // etcd, docs/cluster.md). A membership that cannot be written there is not
  // published: the job is removed and its subscribers closed with the
  // error. `shared` must outlive the registry; null (the default): none.
  void SetSharedState(SharedJobState* shared) { shared_ = shared; }

  // Once, before serving, with a store: the journal's newest
  // limits.events_retained events and the sequence after the highest ever
  // stored, and the jobs active within limits.job_idle_ttl_seconds, each
  // restored (JobEngine::RestoreMembership: its last membership under a
  // higher version, its admin policy and rank overrides). A job that comes
  // back later is restored by Attach the same way. Errors name the path.
  absl::Status Restore(engine::Time now) ABSL_LOCKS_EXCLUDED(jobs_mu_, events_mu_);

  // The last state of an earlier run of `job_id` (kept when the next run
  // began; the newest kMaxEarlierRuns per job id), or nullopt.
  std::optional<v1::Job> EarlierRun(absl::string_view job_id, absl::string_view run_id) const
      ABSL_LOCKS_EXCLUDED(earlier_mu_);
  // Sets out->earlier_runs: the kept earlier runs of `job_id`, newest first.
  void FillEarlierRuns(absl::string_view job_id, v1::Job* out) const
      ABSL_LOCKS_EXCLUDED(earlier_mu_);
  static constexpr size_t kMaxEarlierRuns = 8;

  // Under the job's lock, for a batch's finished_ranks (ReportBatch): the
  // ranks the stream speaks for are finished (JobEngine::Finish). The caller
  // commits.
  void FinishRanksLocked(Job::Locked& job, const JobSubscriber* stream,
                         const std::vector<uint32_t>& ranks, engine::Time now);

  EventPage Events(const EventQuery& query) const ABSL_LOCKS_EXCLUDED(events_mu_);
  uint64_t last_event_sequence() const ABSL_LOCKS_EXCLUDED(events_mu_);
  // Event batches the state database's writer failed to commit (0 without one).
  uint64_t state_db_writer_errors() const {
    return store_ != nullptr ? store_->write_errors() : 0;
  }

 private:
  // Returns the hello's refused topology claims (logged and counted).
  std::vector<TopologyRefusal> AdmitLocked(Job::Locked& job, const JobSubscriber* stream,
                                           const common::StreamHello& hello, engine::Time now);
  // Under the job's lock: the hello's client incarnations. A rank taken over
  // by another incarnation (a new trainer process) starts its iterations
  // over (JobEngine::Restart). The engine starts over (JobEngine::StartOver,
  // a whole job restarted from a checkpoint) when no other rank is live, or
  // once every rank has been taken over.
  void NoteIncarnationsLocked(Job::Locked& job, const common::StreamHello& hello,
                              engine::Time now);
  // Under the job's lock: whether a rank of the job's run still has a
  // stream and is neither finished nor unresponsive, i.e. the run is live
  // and a hello of another run must wait (docs/runs.md).
  static bool RunLiveLocked(const Job::Locked& job);
  // Under the job's lock: JobEngine::CheckClaims for the hello's known
  // version and reported_iteration, the message naming the job.
  static absl::Status CheckClaimsLocked(const Job::Locked& job, const common::StreamHello& hello);
  // Under the job's lock: the run ends for good (another run of the job id
  // begins): marks it removed, keeps its last state, closes its subscribers.
  void RetireRunLocked(Job::Locked& job, const std::string& next_run)
      ABSL_LOCKS_EXCLUDED(earlier_mu_);
  // Under the job's lock, from TickAll: the job, silent for `after`, ended
  // unexpectedly (JobEngine::Lose with a message naming the bound), logged
  // and committed.
  void LoseLocked(Job::Locked& job, engine::Time now, std::chrono::seconds after)
      ABSL_LOCKS_EXCLUDED(events_mu_);

  // A new Job for `job_id`, restored from the store when it knows the job,
  // else from the shared state (the job's last owner in a cluster).
  // `reported`: the creating hello's reported_iteration, taken
  // (JobEngine::NoteReportedIteration) before the restore, so that the
  // restored version takes effect after the iterations the ranks already
  // reached: every rank then applies it at the same iteration, as the
  // version a restart without a store publishes from the hellos.
  std::shared_ptr<Job> MakeJob(const std::string& job_id, uint32_t world_size,
                               const std::string& run_id, const DaemonConfig& config,
                               engine::Time now, std::optional<uint64_t> reported = std::nullopt);
  // MakeJob's: the store's state of the job's run; whether a membership was
  // restored.
  bool RestoreStoredLocked(Job::Locked& job, engine::Time now);
  // MakeJob's: the membership the job's last owner saved (SharedJobState),
  // restored as a restart restores the store's (JobEngine::RestoreMembership).
  void RestoreSharedLocked(Job::Locked& job, engine::Time now);
  // The job's admin policy and rank overrides, as the store and etcd keep them.
  SharedAdminState AdminStateLocked(const Job::Locked& job) const;
  // To the state database (errors logged and counted).
  void SaveOverridesLocked(const Job::Locked& job, engine::Time now);
  // A stored admin policy (JSON) merged over the job's configured one; false
  // (logged) when it cannot be.
  bool ApplyStoredPolicyLocked(Job::Locked& job, const std::string& policy_json, engine::Time now);
  void ApplyRetention(engine::Time now);
  void JournalLocked(Job::Locked& job, std::vector<engine::Event> events)
      ABSL_LOCKS_EXCLUDED(events_mu_);
  // A restored job's straggler causes, from its newest transitions among
  // the journal's events up to sequence `upto` (those of the previous run:
  // the engine restores the stragglers, not why they were slow).
  void RestoreCausesLocked(Job::Locked& job, uint64_t upto) ABSL_LOCKS_EXCLUDED(events_mu_);

  DaemonStats& stats_;
  Store* const store_;  // null: no persistence
  SharedJobState* shared_ = nullptr;  // null: no cluster (set before serving)
  engine::Time last_retention_{0};  // TickAll's thread only
  const uint64_t incarnation_;  // see Job::incarnation

  mutable absl::Mutex config_mu_;
  std::shared_ptr<const DaemonConfig> config_ ABSL_GUARDED_BY(config_mu_);
  std::atomic<uint32_t> max_batch_reports_;

  mutable absl::Mutex jobs_mu_;  // reader/writer
  std::map<std::string, std::shared_ptr<Job>, std::less<>> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  // Set once by CloseAll (under jobs_mu_, before it takes any job's mutex);
  // read under jobs_mu_ and again under a job's mutex before subscribing, so
  // a subscriber added concurrently with CloseAll is either refused or
  // closed.
  std::atomic<bool> closed_{false};

  // With a store, event sequences are reserved on disk in blocks of this
  // many before they are handed out (Store::ReserveSequences): one
  // synchronous write per block, under events_mu_.
  static constexpr uint64_t kSequenceBlock = 1024;

  // Earlier runs' last states by job id, newest first (kMaxEarlierRuns).
  mutable absl::Mutex earlier_mu_;
  std::map<std::string, std::deque<v1::Job>, std::less<>> earlier_ ABSL_GUARDED_BY(earlier_mu_);

  mutable absl::Mutex events_mu_;
  std::deque<JournalEntry> events_ ABSL_GUARDED_BY(events_mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(events_mu_) = 1;
  uint64_t reserved_sequence_ ABSL_GUARDED_BY(events_mu_) = 0;  // on disk, with a store
  size_t events_retained_ ABSL_GUARDED_BY(events_mu_);
};

}  // namespace straggler::daemon
