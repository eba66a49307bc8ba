// Job end in the registry (docs/runs.md, "Job end"), driven without gRPC: a
// job whose streams are gone and whose ranks are silent for
// limits.job_lost_after_seconds is lost (one job_lost event, not running),
// a restored job counts that bound from the restart, and an ended job,
// finished or lost, shows no current exclusion in its Job, its workers and
// /metrics while its versions and events keep the history.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "metrics/daemon_metrics.h"
#include "persist/store.h"
#include "registry/job_proto.h"
#include "registry_test_util.h"
#include "spdlog/spdlog.h"

namespace sd = straggler::daemon;
namespace eng = straggler::engine;
namespace v1 = straggler::v1;
using namespace straggler::daemon::testutil;
using std::chrono::seconds;

namespace {

constexpr uint32_t kWorld = 4;
constexpr uint32_t kLostAfter = 10;

std::shared_ptr<sd::DaemonConfig> Config() {
  auto config = std::make_shared<sd::DaemonConfig>();
  config->limits.job_lost_after_seconds = kLostAfter;
  config->policy.unresponsive_after_seconds = 1;
  return config;
}

// A job `id` of kWorld ranks on one stream, each rank reporting iterations
// 1..3, rank 3 forced out by an operator (an exclusion in force).
struct RunningJob {
  RunningJob(sd::JobRegistry& registry, const std::string& id) : registry(registry) {
    auto attached = registry.Attach(RegistryHello(id, kWorld, {0, 1, 2, 3}), stream, sd::WallNow());
    REQUIRE(attached.ok());
    job = *attached;
    for (uint64_t it = 1; it <= 3; ++it)
      for (uint32_t r = 0; r < kWorld; ++r) IngestLocked(*job, r, it, 0.1, sd::WallNow());
    REQUIRE(registry
                .Mutate(id,
                        [](sd::Job::Locked& j, eng::Time now) {
                          return j->engine.SetOverride(3, eng::RankOverride::kForceExclude,
                                                       "test", now);
                        })
                .ok());
    REQUIRE(Proto().excluded_ranks() == 1);
  }
  v1::Job Proto() {
    v1::Job out;
    sd::Job::Locked locked(*job);
    sd::ToProto(locked, &out);
    return out;
  }
  v1::Worker Worker(uint32_t rank) {
    v1::Worker out;
    sd::Job::Locked locked(*job);
    sd::ToProto(locked->engine.Worker(rank), locked, &out);
    return out;
  }
  size_t Events(eng::EventKind kind) {
    sd::EventQuery q;
    q.job_id = job->id;
    q.kinds = {kind};
    return registry.Events(q).events.size();
  }
  void Leave() { registry.Unsubscribe(*job, stream.get(), /*is_stream=*/true); }

  sd::JobRegistry& registry;
  std::shared_ptr<RecordingSubscriber> stream = std::make_shared<RecordingSubscriber>();
  std::shared_ptr<sd::Job> job;
};

std::string Metrics(const sd::JobRegistry& registry, const sd::DaemonStats& stats) {
  return sd::RenderDaemonMetrics(registry, stats, sd::MetricsOptions{});
}

// What an ended job must show: nobody excluded now, its last version kept.
void CheckNoCurrentExclusion(RunningJob& j, const sd::JobRegistry& registry,
                             const sd::DaemonStats& stats) {
  const v1::Job p = j.Proto();
  CHECK(p.excluded_ranks() == 0);
  CHECK(p.active_ranks() == kWorld);
  CHECK_FALSE(p.membership_withheld());
  REQUIRE(p.membership().excluded_size() == 1);  // the history: the last version
  CHECK(p.membership().excluded(0).rank() == 3);
  CHECK_FALSE(j.Worker(3).excluded());
  CHECK(j.Worker(3).exclusion_reason() == v1::EXCLUSION_REASON_UNSPECIFIED);
  const std::string text = Metrics(registry, stats);
  const std::string job = "{job=\"" + j.job->id + "\"}";
  CHECK_THAT(text, Catch::Contains("straggler_job_excluded_ranks" + job + " 0\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_excluded_replicas" + job + " 0\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_running" + job + " 0\n"));
  const std::string rank3 = "straggler_rank_excluded{job=\"" + j.job->id +
                           "\",rank=\"3\",node=\"n\",peer_group=\"\",replica=\"\"} ";
  CHECK_THAT(text, Catch::Contains(rank3 + "0\n"));
}

// A registry with Config(), quiet below errors.
struct Registry {
  Registry() { spdlog::set_level(spdlog::level::err); }
  sd::DaemonStats stats;
  sd::JobRegistry registry{Config(), stats};
};

}  // namespace

TEST_CASE("job_lost: no stream and no report for limits.job_lost_after_seconds ends the job, "
          "a hello of the run resumes it") {
  Registry r;
  auto& [stats, registry] = r;
  RunningJob j(registry, "killed");
  j.Leave();  // every rank SIGKILLed: the stream ends without finished_ranks
  const eng::Time left = sd::WallNow();

  // Silent ranks turn unresponsive, but a job no stream speaks for logs no
  // guard_blocked for them (nothing it could exclude would help a rank).
  registry.TickAll(left + seconds(kLostAfter - 2));
  CHECK(j.Proto().unresponsive_ranks() == kWorld);
  CHECK_FALSE(j.Proto().lost());
  CHECK(j.Events(eng::EventKind::kGuardBlocked) == 0);
  CHECK(j.Proto().guard_blocks_total() == 0);
  CHECK_THAT(Metrics(registry, stats), Catch::Contains("straggler_job_running{job=\"killed\"} 1\n"));

  registry.TickAll(left + seconds(kLostAfter + 2));
  CHECK(j.Proto().lost());
  CHECK_FALSE(j.Proto().finished());
  REQUIRE(j.Events(eng::EventKind::kJobLost) == 1);
  sd::EventQuery q;
  q.job_id = "killed";
  q.kinds = {eng::EventKind::kJobLost};
  CHECK_THAT(registry.Events(q).events[0].event.message,
             Catch::Contains("limits.job_lost_after_seconds=10"));
  CHECK_THAT(Metrics(registry, stats), Catch::Contains("straggler_job_lost{job=\"killed\"} 1\n"));
  CheckNoCurrentExclusion(j, registry, stats);
  registry.TickAll(left + seconds(kLostAfter + 60));
  CHECK(j.Events(eng::EventKind::kJobLost) == 1);  // once
  CHECK(j.Events(eng::EventKind::kGuardBlocked) == 0);

  // Its ranks come back within the run (same incarnations: a partition that
  // healed): the same job resumes, its exclusion in force again.
  auto again = registry.Attach(RegistryHello("killed", kWorld, {0, 1, 2, 3}),
                               std::make_shared<RecordingSubscriber>(), sd::WallNow());
  REQUIRE(again.ok());
  CHECK(*again == j.job);
  CHECK_FALSE(j.Proto().lost());
  CHECK(j.Proto().excluded_ranks() == 1);
  const std::string text = Metrics(registry, stats);
  CHECK_THAT(text, Catch::Contains("straggler_job_running{job=\"killed\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_lost{job=\"killed\"} 0\n"));
}

TEST_CASE("job_lost: a job restored from the state database counts the bound from the restart") {
  spdlog::set_level(spdlog::level::err);
  TempDir dir;
  const std::string path = dir.path + "/state.db";
  sd::DaemonStats stats;
  {
    auto store = sd::Store::Open({.path = path});
    REQUIRE(store.ok());
    sd::JobRegistry registry(Config(), stats, store->get());
    RunningJob j(registry, "restored");
    // The daemon is killed: the stream never ends here.
  }
  auto store = sd::Store::Open({.path = path});
  REQUIRE(store.ok());
  sd::JobRegistry registry(Config(), stats, store->get());
  // Restarted well after the job's last report (backoff, a slow restart).
  const eng::Time restart = sd::WallNow() + seconds(3 * kLostAfter);
  REQUIRE(registry.Restore(restart).ok());
  auto job = registry.Find("restored");
  REQUIRE(job);
  auto lost = [&] {
    sd::Job::Locked locked(*job);
    return locked->engine.Lost();
  };
  registry.TickAll(restart + seconds(kLostAfter - 2));
  CHECK_FALSE(lost());
  registry.TickAll(restart + seconds(kLostAfter + 2));
  CHECK(lost());
}

TEST_CASE("finished_clean: a finished job shows no current exclusion, its versions and events "
          "stay") {
  Registry r;
  auto& [stats, registry] = r;
  RunningJob j(registry, "done");
  {
    sd::Job::Locked locked(*j.job);
    registry.FinishRanksLocked(locked, j.stream.get(), {0, 1, 2, 3}, sd::WallNow());
    registry.CommitLocked(locked);
  }
  j.Leave();
  CHECK(j.Proto().finished());
  CHECK_FALSE(j.Proto().lost());
  CheckNoCurrentExclusion(j, registry, stats);
  CHECK(j.Events(eng::EventKind::kMembership) >= 1);  // the version that excluded rank 3
  // Long after: still finished, never lost, nothing unresponsive.
  registry.TickAll(sd::WallNow() + seconds(kLostAfter * 10));
  CHECK(j.Proto().finished());
  CHECK_FALSE(j.Proto().lost());
  CHECK(j.Events(eng::EventKind::kJobLost) == 0);
  CHECK(j.Proto().unresponsive_ranks() == 0);
}
