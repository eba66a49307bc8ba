// Store: the SQLite state database on a real file in a temp directory —
// schema creation, reopening, round trips of every kind of row, retention,
// and errors that name the path.
#include <catch2/catch.hpp>

#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "persist/store.h"
#include "registry_test_util.h"

namespace sd = straggler::daemon;
namespace eng = straggler::engine;
namespace fs = std::filesystem;
using straggler::daemon::testutil::TempDir;

namespace {

sd::JournalEntry Entry(uint64_t seq, const std::string& job, eng::Time time) {
  sd::JournalEntry j;
  j.sequence = seq;
  j.job_id = job;
  j.event.time = time;
  j.event.kind = eng::EventKind::kStateChange;
  j.event.rank = 3;
  j.event.from = eng::WorkerState::kHealthy;
  j.event.to = eng::WorkerState::kStraggler;
  j.event.iteration = 40 + seq;
  j.event.evidence.compute_seconds = 0.5;
  j.event.evidence.threshold_seconds = 0.2;
  j.event.evidence.counter = 5;
  j.event.evidence.limit = 5;
  j.event.message = "slow " + std::to_string(seq);
  j.likely_cause = sd::LikelyCause::kThermalThrottle;
  j.likely_cause_detail = "gpu at 91 C";
  return j;
}

eng::Membership Version(uint64_t v, uint64_t eff) {
  eng::Membership m;
  m.version = v;
  m.effective_iteration = eff;
  m.world_size = 8;
  m.lead_iterations = 2;
  m.created_at = eng::Time(1'000'000'000LL * static_cast<int64_t>(v));
  m.excluded = {{1, eng::ExclusionReason::kForced, "ECC errors", eff},
                {5, eng::ExclusionReason::kStraggler, "", eff}};
  return m;
}

}  // namespace

TEST_CASE("store: a new file gets the schema, WAL, and its directory") {
  TempDir dir;
  const std::string path = dir.path + "/nested/dir/state.db";
  auto store = sd::Store::Open({.path = path});
  REQUIRE(store.ok());
  CHECK((*store)->schema_version() == sd::Store::kSchemaVersion);
  CHECK(fs::exists(path));
  CHECK(fs::exists(path + "-wal"));
  auto seq = (*store)->MaxSequence();
  REQUIRE(seq.ok());
  CHECK(*seq == 0);
}

TEST_CASE("store: events, memberships and overrides survive reopening") {
  TempDir dir;
  const std::string path = dir.path + "/state.db";
  const eng::Time t0(1'700'000'000'000'000'000LL);
  {
    auto store = sd::Store::Open({.path = path});
    REQUIRE(store.ok());
    for (uint64_t s = 1; s <= 5; ++s) REQUIRE((*store)->EnqueueEvent(Entry(s, "bert", t0)));
    (*store)->Flush();
    CHECK((*store)->events_written() == 5);
    REQUIRE((*store)->SaveMembership("bert", 8, 77, Version(3, 20)).ok());
    REQUIRE((*store)->SaveMembership("bert", 8, 77, Version(4, 31)).ok());
    REQUIRE((*store)->SaveOverrides("bert", 8, 77, "{\"kind\":\"POLICY_KIND_EWMA\"}",
                                    {{1, eng::RankOverride::kForceExclude, "ECC errors"},
                                     {2, eng::RankOverride::kForceInclude, ""}},
                                    t0)
                .ok());
  }
  auto store = sd::Store::Open({.path = path});
  REQUIRE(store.ok());
  auto seq = (*store)->MaxSequence();
  REQUIRE(seq.ok());
  CHECK(*seq == 5);

  auto events = (*store)->LoadEvents(3);
  REQUIRE(events.ok());
  REQUIRE(events->size() == 3);
  CHECK((*events)[0].sequence == 3);  // the newest three, oldest first
  CHECK((*events)[2].sequence == 5);
  const sd::JournalEntry& e = (*events)[2];
  CHECK(e.job_id == "bert");
  CHECK(e.event.time == t0);
  CHECK(e.event.kind == eng::EventKind::kStateChange);
  CHECK(e.event.to == eng::WorkerState::kStraggler);
  CHECK(e.event.iteration == 45);
  CHECK(e.event.evidence.threshold_seconds == 0.2);
  CHECK(e.event.message == "slow 5");
  CHECK(e.likely_cause == sd::LikelyCause::kThermalThrottle);
  CHECK(e.likely_cause_detail == "gpu at 91 C");

  auto job = (*store)->LoadJob("bert");
  REQUIRE(job.ok());
  REQUIRE(job->has_value());
  const sd::StoredJob& j = **job;
  CHECK(j.world_size == 8);
  CHECK(j.incarnation == 77);
  CHECK(j.policy_json == "{\"kind\":\"POLICY_KIND_EWMA\"}");
  REQUIRE(j.overrides.size() == 2);
  CHECK(j.overrides[0].override == eng::RankOverride::kForceExclude);
  CHECK(j.overrides[0].reason == "ECC errors");
  REQUIRE(j.membership.has_value());
  CHECK(j.membership->version == 4);  // the newest
  CHECK(j.membership->effective_iteration == 31);
  CHECK(j.membership->lead_iterations == 2);
  REQUIRE(j.membership->excluded.size() == 2);
  CHECK(j.membership->excluded[0].reason == eng::ExclusionReason::kForced);
  CHECK(j.membership->excluded[0].detail == "ECC errors");
  CHECK(j.membership->excluded[1].rank == 5);

  auto none = (*store)->LoadJob("gpt");
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());
  auto all = (*store)->LoadJobs(eng::Time(0));
  REQUIRE(all.ok());
  CHECK(all->size() == 1);
}

TEST_CASE("store: a replica's culprit, its group and the replica survive reopening") {
  // Without them a restarted daemon cannot tell that a culprit's replica
  // mates belong with it until every rank's hello is in (docs/hybrid.md).
  TempDir dir;
  const std::string path = dir.path + "/state.db";
  eng::Membership m = Version(2, 40);
  m.excluded = {{1, eng::ExclusionReason::kStraggler, "slow", 37, 1u, "stage0", 1u},
                {3, eng::ExclusionReason::kForced, "ECC errors", 37},  // pure data-parallel
                {5, eng::ExclusionReason::kReplica, "replica 1 with rank 1", 37, 1u, "stage0", 1u}};
  {
    auto store = sd::Store::Open({.path = path});
    REQUIRE(store.ok());
    REQUIRE((*store)->SaveMembership("llama", 8, 3, m).ok());
  }
  auto store = sd::Store::Open({.path = path});
  REQUIRE(store.ok());
  auto job = (*store)->LoadJob("llama");
  REQUIRE(job.ok());
  REQUIRE(job->has_value());
  REQUIRE((*job)->membership.has_value());
  const auto& x = (*job)->membership->excluded;
  REQUIRE(x.size() == 3);
  CHECK(x[0].culprit == std::optional<uint32_t>(1));
  CHECK(x[0].culprit_group == "stage0");
  CHECK(x[0].replica == std::optional<uint32_t>(1));
  CHECK_FALSE(x[1].culprit.has_value());
  CHECK(x[1].culprit_group.empty());
  CHECK_FALSE(x[1].replica.has_value());
  CHECK(x[2].reason == eng::ExclusionReason::kReplica);
  CHECK(x[2].culprit == std::optional<uint32_t>(1));
  CHECK(x[2].culprit_group == "stage0");
  CHECK(x[2].replica == std::optional<uint32_t>(1));
}

TEST_CASE("store: a version 2 database (no replica columns) is migrated, its rows unset") {
  TempDir dir;
  const std::string path = dir.path + "/state.db";
  {
    auto store = sd::Store::Open({.path = path});
    REQUIRE(store.ok());
    REQUIRE((*store)->SaveMembership("llama", 8, 3, Version(2, 40)).ok());
  }
  {
    // Back to what a version 2 stragglerd wrote: the same rows without the
    // columns migration 3 adds.
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db,
                         "ALTER TABLE membership_excluded DROP COLUMN culprit;"
                         "ALTER TABLE membership_excluded DROP COLUMN culprit_group;"
                         "ALTER TABLE membership_excluded DROP COLUMN replica;"
                         "PRAGMA user_version=2",
                         nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = sd::Store::Open({.path = path});
  REQUIRE(store.ok());
  CHECK((*store)->schema_version() == 3);
  auto job = (*store)->LoadJob("llama");
  REQUIRE(job.ok());
  REQUIRE(job->has_value());
  REQUIRE((*job)->membership.has_value());
  const auto& x = (*job)->membership->excluded;
  REQUIRE(x.size() == 2);
  CHECK(x[0].rank == 1);
  CHECK(x[0].detail == "ECC errors");
  CHECK_FALSE(x[0].culprit.has_value());
  CHECK_FALSE(x[1].replica.has_value());
}

TEST_CASE("store: retention deletes old and surplus events but keeps the sequence mark") {
  TempDir dir;
  auto store = sd::Store::Open({.path = dir.path + "/state.db"});
  REQUIRE(store.ok());
  const eng::Time now(1'700'000'000'000'000'000LL);
  const eng::Time old = now - std::chrono::hours(48);
  for (uint64_t s = 1; s <= 4; ++s) REQUIRE((*store)->EnqueueEvent(Entry(s, "a", old)));
  for (uint64_t s = 5; s <= 10; ++s) REQUIRE((*store)->EnqueueEvent(Entry(s, "a", now)));
  (*store)->Flush();
  for (uint64_t v = 1; v <= 6; ++v) {
    REQUIRE((*store)->SaveMembership("a", 8, 1, Version(v, v * 10)).ok());
  }

  auto deleted = (*store)->ApplyRetention(now, std::chrono::hours(24), 3, 2);
  REQUIRE(deleted.ok());
  auto events = (*store)->LoadEvents(100);
  REQUIRE(events.ok());
  REQUIRE(events->size() == 3);  // 4 too old, then 3 of the 6 left are surplus
  CHECK(events->front().sequence == 8);
  auto job = (*store)->LoadJob("a");
  REQUIRE(job.ok());
  CHECK((*job)->membership->version == 6);  // the newest version is never deleted
  CHECK((*job)->membership->excluded.size() == 2);

  // Every event gone: the next daemon still starts above 10.
  REQUIRE((*store)->ApplyRetention(now + std::chrono::hours(100), std::chrono::hours(24), 0, 0).ok());
  events = (*store)->LoadEvents(100);
  REQUIRE(events.ok());
  CHECK(events->empty());
  auto seq = (*store)->MaxSequence();
  REQUIRE(seq.ok());
  CHECK(*seq == 10);
}

TEST_CASE("store: a file that is not a database is refused, naming the path") {
  TempDir dir;
  const std::string path = dir.path + "/state.db";
  {
    std::ofstream out(path);
    out << std::string(8192, 'x');
  }
  auto store = sd::Store::Open({.path = path});
  REQUIRE_FALSE(store.ok());
  const std::string msg(store.status().message());
  INFO(msg);
  CHECK(msg.find("persistence.path=" + path) != std::string::npos);
  CHECK(msg.find("not a database") != std::string::npos);
}

TEST_CASE("store: a directory that cannot be created is refused, naming the path") {
  TempDir dir;
  {
    std::ofstream out(dir.path + "/file");
    out << "x";
  }
  const std::string path = dir.path + "/file/sub/state.db";  // a regular file as a directory
  auto store = sd::Store::Open({.path = path});
  REQUIRE_FALSE(store.ok());
  const std::string msg(store.status().message());
  INFO(msg);
  CHECK(msg.find("persistence.path=" + path) != std::string::npos);
  CHECK(msg.find("cannot create directory") != std::string::npos);
}

TEST_CASE("store: a database from a newer stragglerd is refused") {
  TempDir dir;
  const std::string path = dir.path + "/state.db";
  {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, "PRAGMA user_version=99", nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = sd::Store::Open({.path = path});
  REQUIRE_FALSE(store.ok());
  CHECK(std::string(store.status().message()).find("schema version 99") != std::string::npos);
}

TEST_CASE("store: a full event queue drops and counts instead of blocking") {
  TempDir dir;
  const std::string path = dir.path + "/state.db";
  auto store = sd::Store::Open({.path = path, .event_queue_capacity = 1});
  REQUIRE(store.ok());
  // Another connection holds the write lock, so the writer thread stalls
  // (busy timeout) on the first batch it takes; at most one more event fits
  // in the queue, so of three at least one is dropped, without blocking.
  sqlite3* other = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &other) == SQLITE_OK);
  REQUIRE(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK);
  uint64_t accepted = 0;
  for (uint64_t s = 1; s <= 3; ++s) accepted += (*store)->EnqueueEvent(Entry(s, "a", eng::Time(1)));
  REQUIRE(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(other);
  (*store)->Flush();
  CHECK(accepted <= 2);
  CHECK((*store)->events_dropped() == 3 - accepted);
  CHECK((*store)->events_written() == accepted);
}

TEST_CASE("store: reserved sequences count as handed out, even when their events are lost") {
  TempDir dir;
  const std::string path = dir.path + "/state.db";
  {
    auto store = sd::Store::Open({.path = path, .busy_timeout_ms = 50});
    REQUIRE(store.ok());
    REQUIRE((*store)->EnqueueEvent(Entry(1, "a", eng::Time(1))));
    (*store)->Flush();
    REQUIRE((*store)->ReserveSequences(1024).ok());
    REQUIRE((*store)->ReserveSequences(10).ok());  // never lowers the mark
    // Events 2 and 3 are handed out under the reservation, but the writer
    // cannot commit them (another connection holds the write lock): the
    // batch fails and is counted.
    sqlite3* other = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &other) == SQLITE_OK);
    REQUIRE(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK);
    REQUIRE((*store)->EnqueueEvent(Entry(2, "a", eng::Time(2))));
    REQUIRE((*store)->EnqueueEvent(Entry(3, "a", eng::Time(3))));
    (*store)->Flush();
    CHECK((*store)->write_errors() >= 1);
    // The reservation cannot be raised meanwhile either: an error naming the path.
    absl::Status s = (*store)->ReserveSequences(2048);
    CHECK_FALSE(s.ok());
    CHECK(std::string(s.message()).find(path) != std::string::npos);
    REQUIRE(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(other);
  }
  auto store = sd::Store::Open({.path = path});
  REQUIRE(store.ok());
  auto events = (*store)->LoadEvents(100);
  REQUIRE(events.ok());
  CHECK(events->size() == 1);  // 2 and 3 never reached the file
  auto seq = (*store)->MaxSequence();
  REQUIRE(seq.ok());
  CHECK(*seq == 1024);  // the next daemon numbers from 1025: 2 and 3 are not reused
}
