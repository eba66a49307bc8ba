#include "persist/store.h"

#include <sqlite3.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace straggler::daemon {
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
};
static_assert(std::size(kMigrations) == Store::kSchemaVersion);

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return s_; }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  int Step() { return sqlite3_step(s_); }
  int64_t Int(int col) { return sqlite3_column_int64(s_, col); }
  std::string Text(int col) {
    const auto* p = sqlite3_column_text(s_, col);
    return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p));
  }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_OK;
};

constexpr const char* kInsertEvent =
    "INSERT OR REPLACE INTO events(sequence, job_id, time_ns, kind, rank, from_state, to_state, "
    "iteration, membership_version, message, compute_seconds, threshold_seconds, counter, limit_, "
    "baseline_seconds, latency_iterations, likely_cause, likely_cause_detail, run_id) "
    "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";

int64_t I(uint64_t v) { return static_cast<int64_t>(v); }

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
  std::lock_guard lock(db_mu_);
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
    std::lock_guard lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  std::lock_guard lock(db_mu_);
  sqlite3_finalize(insert_event_);
  // Closing the last connection checkpoints the WAL into the database file.
  sqlite3_close(db_);
}

bool Store::EnqueueEvent(const JournalEntry& entry) {
  {
    std::lock_guard lock(queue_mu_);
    if (queue_.size() >= options_.event_queue_capacity) {
      events_dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    queue_.push_back(entry);
    ++enqueued_;
  }
  queue_cv_.notify_one();
  return true;
}

void Store::Flush() {
  std::unique_lock lock(queue_mu_);
  const uint64_t target = enqueued_;
  flushed_cv_.wait(lock, [&] { return done_ >= target || writer_.get_id() == std::thread::id(); });
}

void Store::WriterLoop() {
  std::unique_lock lock(queue_mu_);
  for (;;) {
    queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping with nothing left
    std::vector<JournalEntry> batch(std::make_move_iterator(queue_.begin()),
                                    std::make_move_iterator(queue_.end()));
    queue_.clear();
    lock.unlock();
    absl::Status s;
    {
      std::lock_guard db(db_mu_);
      s = WriteEventsLocked(batch);
    }
    if (!s.ok()) {
      write_errors_.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("{} events not written: {}", batch.size(), std::string(s.message()));
    } else {
      events_written_.fetch_add(batch.size(), std::memory_order_relaxed);
    }
    lock.lock();
    done_ += batch.size();
    flushed_cv_.notify_all();
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
  std::lock_guard lock(db_mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status s = UpsertJobLocked(job_id, world_size, incarnation, updated);
  if (s.ok()) s = body();
  if (s.ok()) s = Exec("COMMIT");
  if (!s.ok()) Exec("ROLLBACK").IgnoreError();
  return s;
}

absl::Status Store::SaveMembership(const std::string& job_id, uint32_t world_size,
                                   uint64_t incarnation, const engine::Membership& m) {
  return JobTransaction(job_id, world_size, incarnation, m.created_at, [&]() -> absl::Status {
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
              "since_iteration) VALUES(?,?,?,?,?,?)");
      st.Bind(1, job_id).Bind(2, I(m.version)).Bind(3, e.rank);
      st.Bind(4, static_cast<int>(e.reason)).Bind(5, e.detail).Bind(6, I(e.since_iteration));
      if (st.Step() != SQLITE_DONE) return Error("cannot write excluded ranks");
    }
    return absl::OkStatus();
  });
}

absl::Status Store::StartRun(const std::string& job_id, uint32_t world_size,
                             uint64_t incarnation, const std::string& run_id) {
  const auto now = std::chrono::duration_cast<engine::Time>(
      std::chrono::system_clock::now().time_since_epoch());
  return JobTransaction(job_id, world_size, incarnation, now, [&]() -> absl::Status {
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
  });
}

absl::Status Store::SaveOverrides(const std::string& job_id, uint32_t world_size,
                                  uint64_t incarnation, const std::string& policy_json,
                                  const std::vector<StoredOverride>& overrides) {
  const auto now = std::chrono::duration_cast<engine::Time>(
      std::chrono::system_clock::now().time_since_epoch());
  return JobTransaction(job_id, world_size, incarnation, now, [&]() -> absl::Status {
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
  });
}

absl::StatusOr<std::vector<StoredJob>> Store::QueryJobsLocked(const char* where,
                                                              const std::string& arg_text,
                                                              int64_t arg_int) {
  std::vector<StoredJob> jobs;
  {
    const std::string sql = absl::StrCat(
        "SELECT job_id, world_size, incarnation, policy_json, updated_ns, run_id FROM jobs WHERE ",
        where, " ORDER BY job_id");
    Stmt st(db_, sql.c_str());
    if (!st.ok()) return Error("cannot read jobs");
    if (arg_text.empty()) {
      st.Bind(1, arg_int);
    } else {
      st.Bind(1, arg_text);
    }
    int rc;
    while ((rc = st.Step()) == SQLITE_ROW) {
      StoredJob j;
      j.job_id = st.Text(0);
      j.world_size = static_cast<uint32_t>(st.Int(1));
      j.incarnation = static_cast<uint64_t>(st.Int(2));
      j.policy_json = st.Text(3);
      j.updated = engine::Time(st.Int(4));
      j.run_id = st.Text(5);
      jobs.push_back(std::move(j));
    }
    if (rc != SQLITE_DONE) return Error("cannot read jobs");
  }
  for (StoredJob& j : jobs) {
    Stmt o(db_, "SELECT rank, override, reason FROM rank_overrides WHERE job_id = ? ORDER BY rank");
    o.Bind(1, j.job_id);
    while (o.Step() == SQLITE_ROW) {
      j.overrides.push_back({static_cast<uint32_t>(o.Int(0)),
                             static_cast<engine::RankOverride>(o.Int(1)), o.Text(2)});
    }
    Stmt m(db_,
           "SELECT version, effective_iteration, world_size, lead_iterations, created_ns "
           "FROM memberships WHERE job_id = ? ORDER BY version DESC LIMIT 1");
    m.Bind(1, j.job_id);
    if (m.Step() == SQLITE_ROW) {
      engine::Membership mem;
      mem.version = static_cast<uint64_t>(m.Int(0));
      mem.effective_iteration = static_cast<uint64_t>(m.Int(1));
      mem.world_size = static_cast<uint32_t>(m.Int(2));
      mem.lead_iterations = static_cast<uint32_t>(m.Int(3));
      mem.created_at = engine::Time(m.Int(4));
      Stmt x(db_,
             "SELECT rank, reason, detail, since_iteration FROM membership_excluded "
             "WHERE job_id = ? AND version = ? ORDER BY rank");
      x.Bind(1, j.job_id).Bind(2, I(mem.version));
      while (x.Step() == SQLITE_ROW) {
        mem.excluded.push_back({static_cast<uint32_t>(x.Int(0)),
                                static_cast<engine::ExclusionReason>(x.Int(1)), x.Text(2),
                                static_cast<uint64_t>(x.Int(3))});
      }
      j.membership = std::move(mem);
    }
  }
  return jobs;
}

absl::StatusOr<std::optional<StoredJob>> Store::LoadJob(const std::string& job_id) {
  std::lock_guard lock(db_mu_);
  if (job_id.empty()) return std::optional<StoredJob>();
  auto jobs = QueryJobsLocked("job_id = ?", job_id, 0);
  if (!jobs.ok()) return jobs.status();
  if (jobs->empty()) return std::optional<StoredJob>();
  return std::optional<StoredJob>(std::move(jobs->front()));
}

absl::StatusOr<std::vector<StoredJob>> Store::LoadJobs(engine::Time since) {
  std::lock_guard lock(db_mu_);
  return QueryJobsLocked("updated_ns >= ?", "", since.count());
}

absl::StatusOr<std::vector<JournalEntry>> Store::LoadEvents(size_t limit) {
  std::lock_guard lock(db_mu_);
  Stmt st(db_,
          "SELECT sequence, job_id, time_ns, kind, rank, from_state, to_state, iteration, "
          "membership_version, message, compute_seconds, threshold_seconds, counter, limit_, "
          "baseline_seconds, latency_iterations, likely_cause, likely_cause_detail, run_id "
          "FROM events ORDER BY sequence DESC LIMIT ?");
  st.Bind(1, static_cast<int64_t>(limit));
  std::vector<JournalEntry> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    JournalEntry j;
    j.sequence = static_cast<uint64_t>(st.Int(0));
    j.job_id = st.Text(1);
    engine::Event& e = j.event;
    e.time = engine::Time(st.Int(2));
    e.kind = static_cast<engine::EventKind>(st.Int(3));
    e.rank = static_cast<uint32_t>(st.Int(4));
    e.from = static_cast<engine::WorkerState>(st.Int(5));
    e.to = static_cast<engine::WorkerState>(st.Int(6));
    e.iteration = static_cast<uint64_t>(st.Int(7));
    e.membership_version = static_cast<uint64_t>(st.Int(8));
    e.message = st.Text(9);
    e.evidence.compute_seconds = sqlite3_column_double(st.get(), 10);
    e.evidence.threshold_seconds = sqlite3_column_double(st.get(), 11);
    e.evidence.counter = static_cast<uint32_t>(st.Int(12));
    e.evidence.limit = static_cast<uint32_t>(st.Int(13));
    e.evidence.baseline_seconds = sqlite3_column_double(st.get(), 14);
    e.evidence.latency_iterations = static_cast<uint64_t>(st.Int(15));
    j.likely_cause = static_cast<LikelyCause>(st.Int(16));
    j.likely_cause_detail = st.Text(17);
    j.run_id = st.Text(18);
    out.push_back(std::move(j));
  }
  if (rc != SQLITE_DONE) return Error("cannot read events");
  std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<uint64_t> Store::MaxSequence() {
  std::lock_guard lock(db_mu_);
  Stmt st(db_,
          "SELECT max(coalesce((SELECT max(value) FROM meta "
          "WHERE key IN ('max_sequence', 'reserved_sequence')), 0), "
          "coalesce((SELECT max(sequence) FROM events), 0))");
  if (st.Step() != SQLITE_ROW) return Error("cannot read the event high-water mark");
  return static_cast<uint64_t>(st.Int(0));
}

absl::Status Store::ReserveSequences(uint64_t upto) {
  std::lock_guard lock(db_mu_);
  // One statement: its own transaction, committed (in the WAL) on return.
  Stmt st(db_,
          "INSERT INTO meta(key, value) VALUES('reserved_sequence', ?) "
          "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)");
  st.Bind(1, I(upto));
  if (st.Step() != SQLITE_DONE) return Error("cannot reserve event sequences");
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Store::ApplyRetention(engine::Time now, std::chrono::seconds max_age,
                                               uint64_t max_rows, uint32_t keep_versions) {
  std::lock_guard lock(db_mu_);
  uint64_t deleted = 0;
  if (max_age.count() > 0) {
    Stmt st(db_, "DELETE FROM events WHERE time_ns < ?");
    st.Bind(1, (now - std::chrono::duration_cast<engine::Time>(max_age)).count());
    if (st.Step() != SQLITE_DONE) return Error("cannot apply retention");
    deleted += static_cast<uint64_t>(sqlite3_changes(db_));
  }
  if (max_rows > 0) {
    Stmt st(db_,
            "DELETE FROM events WHERE sequence <= "
            "(SELECT sequence FROM events ORDER BY sequence DESC LIMIT 1 OFFSET ?)");
    st.Bind(1, I(max_rows));
    if (st.Step() != SQLITE_DONE) return Error("cannot apply retention");
    deleted += static_cast<uint64_t>(sqlite3_changes(db_));
  }
  if (keep_versions > 0) {
    // Only the newest version is needed for a restart; a few more keep the
    // history readable with sqlite3.
    // Excluded ranks first: their subquery reads the versions still in memberships.
    for (const char* table : {"membership_excluded", "memberships"}) {
      const std::string sql = absl::StrCat(
          "DELETE FROM ", table, " AS t WHERE version <= "
          "(SELECT m.version FROM memberships m WHERE m.job_id = t.job_id "
          "ORDER BY m.version DESC LIMIT 1 OFFSET ?)");
      Stmt st(db_, sql.c_str());
      if (!st.ok()) return Error("cannot apply retention");
      st.Bind(1, keep_versions);
      if (st.Step() != SQLITE_DONE) return Error("cannot apply retention");
      deleted += static_cast<uint64_t>(sqlite3_changes(db_));
    }
  }
  return deleted;
}

}  // namespace straggler::daemon
