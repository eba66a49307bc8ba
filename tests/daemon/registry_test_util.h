// Shared by the tests that drive a JobRegistry or the state database
// directly, without gRPC: a subscriber standing in for a stream or watcher,
// the hello that attaches one, a report ingested under the job's lock, and
// a temporary directory for a database.
//
//   sd::JobRegistry registry(config, stats);
//   auto job = registry.Attach(RegistryHello("j", 2, {0, 1}),
//                              std::make_shared<RecordingSubscriber>(), sd::WallNow());
//   IngestLocked(**job, /*rank=*/1, /*iteration=*/1, /*compute_seconds=*/0.5, sd::WallNow());
//
// Not thread-safe beyond RecordingSubscriber::closed.
#pragma once

#include <catch2/catch.hpp>

#include <stdlib.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "registry/job_registry.h"

namespace straggler::daemon::testutil {

// A directory under /tmp for a state database, removed with everything in it.
struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/stragglerd_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

// Records whether the registry closed it; ignores membership changes.
class RecordingSubscriber final : public JobSubscriber {
 public:
  void OnMembershipChangedLocked(const Job::Locked&) override {}
  void CloseLocked(const absl::Status&) override { closed.store(true); }
  std::atomic<bool> closed{false};
};

inline common::StreamHello RegistryHello(const std::string& job, uint32_t world_size,
                                         std::vector<uint32_t> ranks,
                                         const std::string& node = "n") {
  common::StreamHello h;
  h.job_id = job;
  h.node = node;
  h.world_size = world_size;
  h.ranks = std::move(ranks);
  return h;
}

// Ingests a report of `rank` into `job`'s engine under its lock; the engine
// must accept it.
inline void IngestLocked(Job& job, uint32_t rank, uint64_t iteration, double compute_seconds,
                         engine::Time now, std::optional<double> step_seconds = std::nullopt) {
  engine::Report r;
  r.rank = rank;
  r.iteration = iteration;
  r.compute_seconds = compute_seconds;
  r.step_seconds = step_seconds;
  Job::Locked locked(job);
  REQUIRE(locked->engine.Ingest(r, now).accepted);
}

}  // namespace straggler::daemon::testutil
