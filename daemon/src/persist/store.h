// The daemon's state database (SQLite, WAL): the event journal, each job's
// membership versions, its admin policy and its rank overrides, so that a
// restarted daemon (also after kill -9) keeps versions growing, restores the
// exclusions and finds its events again. docs/persistence.md has the why.
//
//   auto store = Store::Open({.path = "/var/lib/stragglerd/state.db"});
//   if (!store.ok()) ...;                       // names the path and SQLite's error
//   (*store)->SaveMembership(job_row, membership);   // durable when it returns
//   (*store)->EnqueueEvent(entry);              // written by the writer thread
//   (*store)->Flush();                          // everything enqueued so far is written
//
// Two kinds of write, on purpose:
//  * Events are many and may come from the ingest path with a job's mutex held,
//    so EnqueueEvent only appends to a bounded queue (no I/O); a writer thread
//    commits them in batches. A full queue drops the event and counts it
//    (events_dropped): ingest never waits on the disk.
//  * Membership versions and admin overrides are rare (a detection, an
//    operator's call) and must be on disk before anyone sees them (a version
//    handed to a client and then forgotten by a restarted daemon could be
//    handed out again with other content). They are written synchronously by
//    the caller; with synchronous=NORMAL in WAL mode a commit is a write() to
//    the WAL with no fsync, which survives kill -9 (the OS has the pages).
//
// Thread-safe: every method may be called from any thread; one connection
// guarded by a mutex (SQLite allows one writer anyway).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "registry/attribution.h"
#include "straggler/engine/job_engine.h"

struct sqlite3;
struct sqlite3_stmt;

namespace straggler::daemon {

// One journaled event (the registry's journal and the events table).
struct JournalEntry {
  uint64_t sequence = 0;  // daemon-wide, grows by one per event, also across restarts
  std::string job_id;
  engine::Event event;
  // On a transition to straggler: what the rank's GPU telemetry points at.
  LikelyCause likely_cause = LikelyCause::kUnspecified;
  std::string likely_cause_detail;
  std::string run_id;  // the job's run (docs/runs.md)
};

struct StoredOverride {
  uint32_t rank = 0;
  engine::RankOverride override = engine::RankOverride::kNone;
  std::string reason;
};

// What the database knows of one job.
struct StoredJob {
  std::string job_id;
  uint32_t world_size = 0;
  uint64_t incarnation = 0;            // daemon run that wrote it last
  std::string run_id;                  // the job's run the rest belongs to
  std::string policy_json;             // v1.PolicyConfig as JSON; "" = no admin policy
  std::vector<StoredOverride> overrides;  // ranks with an override other than none
  std::optional<engine::Membership> membership;  // the newest version written
  engine::Time updated{0};
};

struct StoreOptions {
  std::string path;                       // the database file (created with its directory)
  bool synchronous_full = false;          // PRAGMA synchronous=FULL instead of NORMAL
  uint32_t event_queue_capacity = 65536;  // events waiting for the writer; more are dropped
  uint32_t busy_timeout_ms = 5000;        // another process holding the write lock
};

class Store {
 public:
  // The schema this build writes; older databases are migrated on Open.
  static constexpr int kSchemaVersion = 3;

  // Creates the file's directory and the file when missing, sets WAL, the
  // synchronous level and the busy timeout, and creates or migrates the
  // schema. Errors name the path: "persistence.path=/x/state.db: file is not
  // a database".
  static absl::StatusOr<std::unique_ptr<Store>> Open(const StoreOptions& options);
  ~Store();  // writes what is queued, then closes
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Queues one event for the writer thread; never blocks on I/O. False (and
  // counted in events_dropped) when the queue is full.
  bool EnqueueEvent(const JournalEntry& entry);
  // Waits until every event enqueued before the call is committed (or failed).
  void Flush();

  // Synchronous, durable on return: the job's row and one membership version.
  absl::Status SaveMembership(const std::string& job_id, uint32_t world_size,
                              uint64_t incarnation, const engine::Membership& m);
  // Synchronous: the job's admin policy ("" = none) and its rank overrides
  // (replacing the stored ones); `now` is the job row's update time (the
  // store reads no clock: the registry's WallNow).
  absl::Status SaveOverrides(const std::string& job_id, uint32_t world_size,
                             uint64_t incarnation, const std::string& policy_json,
                             const std::vector<StoredOverride>& overrides, engine::Time now);

  // A new run of the job begins (docs/runs.md): records its run id and
  // forgets the previous run's memberships, overrides and admin policy, so a
  // restart restores the new run, not the old one. Events stay. `now` as
  // for SaveOverrides.
  absl::Status StartRun(const std::string& job_id, uint32_t world_size, uint64_t incarnation,
                        const std::string& run_id, engine::Time now);
  absl::StatusOr<std::optional<StoredJob>> LoadJob(const std::string& job_id);
  // Jobs updated at or after `since`, ascending by id.
  absl::StatusOr<std::vector<StoredJob>> LoadJobs(engine::Time since);
  // The newest `limit` events, ascending by sequence.
  absl::StatusOr<std::vector<JournalEntry>> LoadEvents(size_t limit);
  // Highest event sequence ever stored or reserved (also of events deleted by
  // retention: kept in the meta table), 0 when none. A restarted daemon
  // numbers its events from here + 1.
  absl::StatusOr<uint64_t> MaxSequence();
  // Synchronous, durable on return: sequences up to `upto` may be handed out
  // before their events are written, so MaxSequence() is at least `upto`
  // from now on. Events still in the writer's queue at a kill -9 are lost;
  // without the reservation the next daemon would number new events with
  // the lost events' sequences, which clients may already have seen (a
  // `since_sequence` cursor would then skip the new events).
  absl::Status ReserveSequences(uint64_t upto);

  // Deletes events older than `now - max_age` (max_age 0: no age limit) and
  // all but the newest `max_rows` (0: no row limit), and all but the newest
  // `keep_versions` membership versions of each job. Returns rows deleted.
  absl::StatusOr<uint64_t> ApplyRetention(engine::Time now, std::chrono::seconds max_age,
                                          uint64_t max_rows, uint32_t keep_versions);

  int schema_version() const { return schema_version_; }
  const std::string& path() const { return options_.path; }
  uint64_t events_written() const { return events_written_.load(std::memory_order_relaxed); }
  uint64_t events_dropped() const { return events_dropped_.load(std::memory_order_relaxed); }
  // Event batches the writer thread failed to commit (their events are lost
  // from the database; still served from memory until a restart).
  uint64_t write_errors() const { return write_errors_.load(std::memory_order_relaxed); }

 private:
  explicit Store(StoreOptions options);
  absl::Status Init() ABSL_LOCKS_EXCLUDED(db_mu_);
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // Names the path and sqlite3_errmsg.
  absl::Status Error(const char* what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // One transaction (under db_mu_): the job's row upserted, then `body`;
  // rolled back when either fails. `body` runs with db_mu_ held (a lambda
  // says so with ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_)).
  absl::Status JobTransaction(const std::string& job_id, uint32_t world_size,
                              uint64_t incarnation, engine::Time updated,
                              absl::FunctionRef<absl::Status()> body)
      ABSL_LOCKS_EXCLUDED(db_mu_);
  absl::Status UpsertJobLocked(const std::string& job_id, uint32_t world_size,
                               uint64_t incarnation, engine::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  absl::StatusOr<std::vector<StoredJob>> QueryJobsLocked(const char* where,
                                                         const std::string& arg_text,
                                                         int64_t arg_int)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  absl::Status WriteEventsLocked(const std::vector<JournalEntry>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  void WriterLoop() ABSL_LOCKS_EXCLUDED(queue_mu_, db_mu_);

  const StoreOptions options_;
  int schema_version_ = 0;  // written by Init (under db_mu_) before the Store is shared

  // The one connection: SQLite allows one writer anyway. Never taken with
  // queue_mu_ held (the writer releases the queue before it writes).
  absl::Mutex db_mu_;
  sqlite3* db_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  sqlite3_stmt* insert_event_ ABSL_GUARDED_BY(db_mu_) = nullptr;

  absl::Mutex queue_mu_;
  absl::CondVar queue_cv_;    // writer: work or stop
  absl::CondVar flushed_cv_;  // Flush: done_ advanced
  std::deque<JournalEntry> queue_ ABSL_GUARDED_BY(queue_mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(queue_mu_) = 0;  // events accepted so far
  uint64_t done_ ABSL_GUARDED_BY(queue_mu_) = 0;      // of those, written or failed
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::thread writer_;

  std::atomic<uint64_t> events_written_{0};
  std::atomic<uint64_t> events_dropped_{0};
  std::atomic<uint64_t> write_errors_{0};
};

}  // namespace straggler::daemon
