#include "persist/store.h"

#include <sqlite3.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "persist/sqlite_stmt.h"
#include "spdlog/spdlog.h"

namespace straggler::daemon {

using persist_internal::I;
using persist_internal::Stmt;

namespace {

// Schema migrations: kMigrations[i] takes a database from version i to i + 1,
// in one transaction with the version bump. Append only; never edit a step
// that has shipped (databases in the field already ran it). Enums are stored
// as their integer values, so reordering an engine enum needs a migration.
constexpr const char* kMigrations[] = {
    // 0 -> 1: the first schema.
    R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE jobs(
  job_id TEXT PRIMARY KEY,
  world_size INTEGER NOT NULL,
  incarnation INTEGER NOT NULL,
  policy_json TEXT NOT NULL DEFAULT '',
  updated_ns INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE memberships(
  job_id TEXT NOT NULL,
  version INTEGER NOT NULL,
  effective_iteration INTEGER NOT NULL,
  world_size INTEGER NOT NULL,
  lead_iterations INTEGER NOT NULL,
  incarnation INTEGER NOT NULL,
  created_ns INTEGER NOT NULL,
  PRIMARY KEY(job_id, version)) WITHOUT ROWID;
CREATE TABLE membership_excluded(
  job_id TEXT NOT NULL,
  version INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  reason INTEGER NOT NULL,
  detail TEXT NOT NULL,
  since_iteration INTEGER NOT NULL,
  PRIMARY KEY(job_id, version, rank)) WITHOUT ROWID;
CREATE TABLE rank_overrides(
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  override INTEGER NOT NULL,
  reason TEXT NOT NULL,
  PRIMARY KEY(job_id, rank)) WITHOUT ROWID;
CREATE TABLE events(
  sequence INTEGER PRIMARY KEY,
  job_id TEXT NOT NULL,
  time_ns INTEGER NOT NULL,
  kind INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  from_state INTEGER NOT NULL,
  to_state INTEGER NOT NULL,
  iteration INTEGER NOT NULL,
  membership_version INTEGER NOT NULL,
  message TEXT NOT NULL,
  compute_seconds REAL NOT NULL,
  threshold_seconds REAL NOT NULL,
  counter INTEGER NOT NULL,
  limit_ INTEGER NOT NULL,
  baseline_seconds REAL NOT NULL,
  latency_iterations INTEGER NOT NULL,
  likely_cause INTEGER NOT NULL,
  likely_cause_detail TEXT NOT NULL);
CREATE INDEX events_by_time ON events(time_ns);
)sql",
    // 1 -> 2: runs (docs/runs.md): the run a job row and an event belong to.
    R"sql(
ALTER TABLE jobs ADD COLUMN run_id TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN run_id TEXT NOT NULL DEFAULT '';
)sql",
    // 2 -> 3: replicas (docs/hybrid.md): who took an excluded rank's replica
    // out. NULL = unset (a pure data-parallel rank, or a row written before).
    R"sql(
ALTER TABLE membership_excluded ADD COLUMN culprit INTEGER;
ALTER TABLE membership_excluded ADD COLUMN culprit_group TEXT NOT NULL DEFAULT '';
ALTER TABLE membership_excluded ADD COLUMN replica INTEGER;
)sql",
};
static_assert(std::size(kMigrations) == Store::kSchemaVersion);

constexpr const char* kInsertEvent =
    "INSERT OR REPLACE INTO events(sequence, job_id, time_ns, kind, rank, from_state, to_state, "
    "iteration, membership_version, message, compute_seconds, threshold_seconds, counter, limit_, "
    "baseline_seconds, latency_iterations, likely_cause, likely_cause_detail, run_id) "
    "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";


}  // namespace

Store::Store(StoreOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const StoreOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("persistence.path is empty");
  }
  const std::filesystem::path file(options.path);
  if (file.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("persistence.path=", options.path, ": cannot create directory ",
                       file.parent_path().string(), ": ", ec.message()));
    }
  }
  // SQLite opens what is there: a FIFO would hold the start on its first
  // read, for ever. Only a regular file, or nothing yet.
  std::error_code ec;
  const auto kind = std::filesystem::status(file, ec);
  if (!ec && std::filesystem::exists(kind) && !std::filesystem::is_regular_file(kind)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "persistence.path=", options.path, " is not a regular file (",
        std::filesystem::is_directory(kind) ? "a directory" : "a FIFO, socket or device",
        "); give the path of a database file"));
  }
  std::unique_ptr<Store> store(new Store(options));
  if (absl::Status s = store->Init(); !s.ok()) return s;
  store->writer_ = std::thread([s = store.get()] { s->WriterLoop(); });
  return store;
}

absl::Status Store::Error(const char* what) const {
  return absl::FailedPreconditionError(absl::StrCat("persistence.path=", options_.path, ": ",
                                                    what, ": ", sqlite3_errmsg(db_)));
}

absl::Status Store::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err != nullptr ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    return absl::FailedPreconditionError(
        absl::StrCat("persistence.path=", options_.path, ": ", msg));
  }
  return absl::OkStatus();
}

absl::Status Store::Init() {
  absl::MutexLock lock(&db_mu_);
  const int rc = sqlite3_open_v2(options_.path.c_str(), &db_,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = absl::FailedPreconditionError(
        absl::StrCat("persistence.path=", options_.path, ": cannot open the state database: ",
                     db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc)));
    sqlite3_close(db_);
    db_ = nullptr;
    return s;
  }
  sqlite3_busy_timeout(db_, static_cast<int>(options_.busy_timeout_ms));
  // journal_mode is the first statement that reads the file, so a file that is
  // not a database fails here ("file is not a database").
  {
    Stmt wal(db_, "PRAGMA journal_mode=WAL");
    if (!wal.ok() || wal.Step() != SQLITE_ROW) return Error("cannot open the state database");
    if (wal.Text(0) != "wal") {
      return absl::FailedPreconditionError(absl::StrCat(
          "persistence.path=", options_.path, ": WAL mode refused (journal_mode=", wal.Text(0),
          "); the database must be on a local file system"));
    }
  }
  // NORMAL in WAL mode: a commit survives the process dying (kill -9); only an
  // OS crash or power loss can lose the last commits, and then clients' hellos
  // still carry the versions they hold (docs/persistence.md).
  if (absl::Status s = Exec(options_.synchronous_full ? "PRAGMA synchronous=FULL"
                                                      : "PRAGMA synchronous=NORMAL");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Migrate(); !s.ok()) return s;
  sqlite3_prepare_v2(db_, kInsertEvent, -1, &insert_event_, nullptr);
  if (insert_event_ == nullptr) return Error("cannot prepare the event insert");
  return absl::OkStatus();
}

absl::Status Store::Migrate() {
  // PRAGMA user_version is the schema version: 0 in a new file.
  {
    Stmt v(db_, "PRAGMA user_version");
    if (!v.ok() || v.Step() != SQLITE_ROW) return Error("cannot read the schema version");
    schema_version_ = static_cast<int>(v.Int(0));
  }
  if (schema_version_ > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "persistence.path=", options_.path, ": schema version ", schema_version_,
        " was written by a newer stragglerd (this one knows up to ", kSchemaVersion, ")"));
  }
  while (schema_version_ < kSchemaVersion) {
    const int to = schema_version_ + 1;
    const std::string sql = absl::StrCat("BEGIN IMMEDIATE;", kMigrations[schema_version_],
                                         "PRAGMA user_version=", to, ";COMMIT;");
    if (absl::Status s = Exec(sql.c_str()); !s.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return absl::FailedPreconditionError(absl::StrCat("migrating the schema to version ", to,
                                                        ": ", s.message()));
    }
    spdlog::info("state database {}: schema version {}", options_.path, to);
    schema_version_ = to;
  }
  return absl::OkStatus();
}

Store::~Store() {
  {
    absl::MutexLock lock(&queue_mu_);
    stopping_ = true;
  }
  queue_cv_.SignalAll();
  if (writer_.joinable()) writer_.join();
  absl::MutexLock lock(&db_mu_);
  sqlite3_finalize(insert_event_);
  // Closing the last connection checkpoints the WAL into the database file.
  sqlite3_close(db_);
}

bool Store::EnqueueEvent(const JournalEntry& entry) {
  {
    absl::MutexLock lock(&queue_mu_);
    if (queue_.size() >= options_.event_queue_capacity) {
      events_dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    queue_.push_back(entry);
    ++enqueued_;
  }
  queue_cv_.Signal();
  return true;
}

void Store::Flush() {
  absl::MutexLock lock(&queue_mu_);
  const uint64_t target = enqueued_;
  while (done_ < target && writer_.get_id() != std::thread::id()) flushed_cv_.Wait(&queue_mu_);
}

void Store::WriterLoop() {
  for (;;) {
    std::vector<JournalEntry> batch;
    {
      absl::MutexLock lock(&queue_mu_);
      while (!stopping_ && queue_.empty()) queue_cv_.Wait(&queue_mu_);
      if (queue_.empty()) return;  // stopping with nothing left
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
    }
    absl::Status s;
    {
      absl::MutexLock db(&db_mu_);
      s = WriteEventsLocked(batch);
    }
    if (!s.ok()) {
      write_errors_.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("{} events not written: {}", batch.size(), std::string(s.message()));
    } else {
      events_written_.fetch_add(batch.size(), std::memory_order_relaxed);
    }
    absl::MutexLock lock(&queue_mu_);
    done_ += batch.size();
    flushed_cv_.SignalAll();
  }
}

absl::Status Store::WriteEventsLocked(const std::vector<JournalEntry>& batch) {
  // One transaction per batch: one WAL append for many events.
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  uint64_t max_sequence = 0;
  for (const JournalEntry& j : batch) {
    const engine::Event& e = j.event;
    sqlite3_stmt* st = insert_event_;
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, I(j.sequence));
    sqlite3_bind_text(st, 2, j.job_id.data(), static_cast<int>(j.job_id.size()), SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, e.time.count());
    sqlite3_bind_int64(st, 4, static_cast<int>(e.kind));
    sqlite3_bind_int64(st, 5, e.rank);
    sqlite3_bind_int64(st, 6, static_cast<int>(e.from));
    sqlite3_bind_int64(st, 7, static_cast<int>(e.to));
    sqlite3_bind_int64(st, 8, I(e.iteration));
    sqlite3_bind_int64(st, 9, I(e.membership_version));
    sqlite3_bind_text(st, 10, e.message.data(), static_cast<int>(e.message.size()),
                      SQLITE_STATIC);
    sqlite3_bind_double(st, 11, e.evidence.compute_seconds);
    sqlite3_bind_double(st, 12, e.evidence.threshold_seconds);
    sqlite3_bind_int64(st, 13, e.evidence.counter);
    sqlite3_bind_int64(st, 14, e.evidence.limit);
    sqlite3_bind_double(st, 15, e.evidence.baseline_seconds);
    sqlite3_bind_int64(st, 16, I(e.evidence.latency_iterations));
    sqlite3_bind_int64(st, 17, static_cast<int>(j.likely_cause));
    sqlite3_bind_text(st, 18, j.likely_cause_detail.data(),
                      static_cast<int>(j.likely_cause_detail.size()), SQLITE_STATIC);
    sqlite3_bind_text(st, 19, j.run_id.data(), static_cast<int>(j.run_id.size()), SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) {
      absl::Status s = Error("cannot insert an event");
      sqlite3_reset(st);
      Exec("ROLLBACK").IgnoreError();
      return s;
    }
    max_sequence = std::max(max_sequence, j.sequence);
  }
  sqlite3_reset(insert_event_);
  sqlite3_clear_bindings(insert_event_);
  // The high-water mark outlives retention, so a restarted daemon never hands
  // out a sequence number again even when every event row was deleted.
  Stmt hw(db_,
          "INSERT INTO meta(key, value) VALUES('max_sequence', ?) "
          "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)");
  hw.Bind(1, I(max_sequence));
  if (hw.Step() != SQLITE_DONE) {
    absl::Status s = Error("cannot update the event high-water mark");
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  if (absl::Status s = Exec("COMMIT"); !s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  return absl::OkStatus();
}

absl::Status Store::UpsertJobLocked(const std::string& job_id, uint32_t world_size,
                                    uint64_t incarnation, engine::Time now) {
  Stmt st(db_,
          "INSERT INTO jobs(job_id, world_size, incarnation, updated_ns) VALUES(?,?,?,?) "
          "ON CONFLICT(job_id) DO UPDATE SET world_size = excluded.world_size, "
          "incarnation = excluded.incarnation, updated_ns = excluded.updated_ns");
  st.Bind(1, job_id).Bind(2, world_size).Bind(3, I(incarnation)).Bind(4, now.count());
  if (st.Step() != SQLITE_DONE) return Error("cannot write job row");
  return absl::OkStatus();
}

absl::Status Store::JobTransaction(const std::string& job_id, uint32_t world_size,
                                   uint64_t incarnation, engine::Time updated,
                                   absl::FunctionRef<absl::Status()> body) {
  absl::MutexLock lock(&db_mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status s = UpsertJobLocked(job_id, world_size, incarnation, updated);
  if (s.ok()) s = body();
  if (s.ok()) s = Exec("COMMIT");
  if (!s.ok()) Exec("ROLLBACK").IgnoreError();
  return s;
}

absl::Status Store::SaveMembership(const std::string& job_id, uint32_t world_size,
                                   uint64_t incarnation, const engine::Membership& m) {
  // Runs inside JobTransaction, which holds db_mu_.
  const auto body = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_) -> absl::Status {
    {
      Stmt st(db_,
              "INSERT OR REPLACE INTO memberships(job_id, version, effective_iteration, world_size, "
              "lead_iterations, incarnation, created_ns) VALUES(?,?,?,?,?,?,?)");
      st.Bind(1, job_id).Bind(2, I(m.version)).Bind(3, I(m.effective_iteration));
      st.Bind(4, m.world_size).Bind(5, m.lead_iterations).Bind(6, I(incarnation));
      st.Bind(7, m.created_at.count());
      if (st.Step() != SQLITE_DONE) return Error("cannot write a membership version");
    }
    {
      Stmt del(db_, "DELETE FROM membership_excluded WHERE job_id = ? AND version = ?");
      del.Bind(1, job_id).Bind(2, I(m.version));
      if (del.Step() != SQLITE_DONE) return Error("cannot write excluded ranks");
    }
    for (const auto& e : m.excluded) {
      Stmt st(db_,
              "INSERT INTO membership_excluded(job_id, version, rank, reason, detail, "
              "since_iteration, culprit, culprit_group, replica) VALUES(?,?,?,?,?,?,?,?,?)");
      st.Bind(1, job_id).Bind(2, I(m.version)).Bind(3, e.rank);
      st.Bind(4, static_cast<int>(e.reason)).Bind(5, e.detail).Bind(6, I(e.since_iteration));
      st.Bind(7, e.culprit).Bind(8, e.culprit_group).Bind(9, e.replica);
      if (st.Step() != SQLITE_DONE) return Error("cannot write excluded ranks");
    }
    return absl::OkStatus();
  };
  return JobTransaction(job_id, world_size, incarnation, m.created_at, body);
}

absl::Status Store::StartRun(const std::string& job_id, uint32_t world_size,
                             uint64_t incarnation, const std::string& run_id, engine::Time now) {
  const auto body = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_) -> absl::Status {
    {
      Stmt st(db_, "UPDATE jobs SET run_id = ?, policy_json = '' WHERE job_id = ?");
      st.Bind(1, run_id).Bind(2, job_id);
      if (st.Step() != SQLITE_DONE) return Error("cannot write the run");
    }
    for (const char* table : {"memberships", "membership_excluded", "rank_overrides"}) {
      const std::string sql = absl::StrCat("DELETE FROM ", table, " WHERE job_id = ?");
      Stmt del(db_, sql.c_str());
      del.Bind(1, job_id);
      if (del.Step() != SQLITE_DONE) return Error("cannot forget the previous run");
    }
    return absl::OkStatus();
  };
  return JobTransaction(job_id, world_size, incarnation, now, body);
}

absl::Status Store::SaveOverrides(const std::string& job_id, uint32_t world_size,
                                  uint64_t incarnation, const std::string& policy_json,
                                  const std::vector<StoredOverride>& overrides,
                                  engine::Time now) {
  const auto body = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_) -> absl::Status {
    {
      Stmt st(db_, "UPDATE jobs SET policy_json = ? WHERE job_id = ?");
      st.Bind(1, policy_json).Bind(2, job_id);
      if (st.Step() != SQLITE_DONE) return Error("cannot write the policy");
    }
    {
      Stmt del(db_, "DELETE FROM rank_overrides WHERE job_id = ?");
      del.Bind(1, job_id);
      if (del.Step() != SQLITE_DONE) return Error("cannot write rank overrides");
    }
    for (const auto& o : overrides) {
      Stmt st(db_,
              "INSERT INTO rank_overrides(job_id, rank, override, reason) VALUES(?,?,?,?)");
      st.Bind(1, job_id).Bind(2, o.rank).Bind(3, static_cast<int>(o.override)).Bind(4, o.reason);
      if (st.Step() != SQLITE_DONE) return Error("cannot write rank overrides");
    }
    return absl::OkStatus();
  };
  return JobTransaction(job_id, world_size, incarnation, now, body);
}

}  // namespace straggler::daemon
