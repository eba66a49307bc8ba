// Store's reads (jobs, events, sequences) and retention: see store.h.
#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "persist/sqlite_stmt.h"
#include "persist/store.h"
#include "spdlog/spdlog.h"

namespace straggler::daemon {

using persist_internal::I;
using persist_internal::Stmt;

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
             "SELECT rank, reason, detail, since_iteration, culprit, culprit_group, replica "
             "FROM membership_excluded WHERE job_id = ? AND version = ? ORDER BY rank");
      x.Bind(1, j.job_id).Bind(2, I(mem.version));
      while (x.Step() == SQLITE_ROW) {
        mem.excluded.push_back({static_cast<uint32_t>(x.Int(0)),
                                static_cast<engine::ExclusionReason>(x.Int(1)), x.Text(2),
                                static_cast<uint64_t>(x.Int(3)), x.OptionalU32(4), x.Text(5),
                                x.OptionalU32(6)});
      }
      j.membership = std::move(mem);
    }
  }
  return jobs;
}

absl::StatusOr<std::optional<StoredJob>> Store::LoadJob(const std::string& job_id) {
  absl::MutexLock lock(&db_mu_);
  if (job_id.empty()) return std::optional<StoredJob>();
  auto jobs = QueryJobsLocked("job_id = ?", job_id, 0);
  if (!jobs.ok()) return jobs.status();
  if (jobs->empty()) return std::optional<StoredJob>();
  return std::optional<StoredJob>(std::move(jobs->front()));
}

absl::StatusOr<std::vector<StoredJob>> Store::LoadJobs(engine::Time since) {
  absl::MutexLock lock(&db_mu_);
  return QueryJobsLocked("updated_ns >= ?", "", since.count());
}

absl::StatusOr<std::vector<JournalEntry>> Store::LoadEvents(size_t limit) {
  absl::MutexLock lock(&db_mu_);
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
  absl::MutexLock lock(&db_mu_);
  Stmt st(db_,
          "SELECT max(coalesce((SELECT max(value) FROM meta "
          "WHERE key IN ('max_sequence', 'reserved_sequence')), 0), "
          "coalesce((SELECT max(sequence) FROM events), 0))");
  if (st.Step() != SQLITE_ROW) return Error("cannot read the event high-water mark");
  return static_cast<uint64_t>(st.Int(0));
}

absl::Status Store::ReserveSequences(uint64_t upto) {
  absl::MutexLock lock(&db_mu_);
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
  absl::MutexLock lock(&db_mu_);
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
