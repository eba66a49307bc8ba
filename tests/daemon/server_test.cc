// The daemon's gRPC services in-process on loopback (port 0): the hello
// contract, acknowledgements, per-report rejections, queries, admin calls,
// membership pushes to streams and watchers, and draining on shutdown; the
// registry alone for idle-job removal and the shutdown race.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "daemon_test_util.h"
#include "registry/job_registry.h"
#include "registry_test_util.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;

using namespace straggler::daemon::testutil;

namespace {

// Every test case starts its own daemon.
using Fixture = LoopbackDaemon;

// The hello of a client that holds `version` (effective from `effective`) of
// an earlier daemon, or of this one when `incarnation` is its.
v1::ReportBatch HelloHolding(const std::string& job, const std::vector<uint32_t>& ranks,
                             uint64_t version, uint64_t effective, uint64_t incarnation = 0) {
  v1::ReportBatch b = Hello(job, 4, ranks);
  b.mutable_hello()->set_known_membership_version(version);
  b.mutable_hello()->set_known_effective_iteration(effective);
  if (incarnation != 0) b.mutable_hello()->set_known_incarnation(incarnation);
  return b;
}

}  // namespace

TEST_CASE("a stream without a hello is refused with INVALID_ARGUMENT") {
  Fixture f;
  grpc::ClientContext ctx;
  auto stream = f.ingest->Stream(&ctx);
  v1::ReportBatch b;
  AddReport(b, 0, 1, 0.1);
  REQUIRE(stream->Write(b));
  stream->WritesDone();
  v1::Directive d;
  CHECK_FALSE(stream->Read(&d));
  grpc::Status s = stream->Finish();
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(s.error_message(), Catch::Contains("hello"));
}

TEST_CASE("hello errors name the offending value") {
  Fixture f;
  auto refused = [&](const v1::ReportBatch& hello) { return SendAndClose(*f.ingest, hello); };
  grpc::Status s = refused(Hello("j", 4, {0, 4}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(s.error_message(), Catch::Contains("rank 4") && Catch::Contains("world_size=4"));

  s = refused(Hello("", 4, {0}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  s = refused(Hello("j", 0, {0}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  s = refused(Hello("j", 4, {}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  // The job exists with world_size 4 after a good hello.
  CHECK(refused(Hello("j", 4, {0})).ok());
  s = refused(Hello("j", 8, {0}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.error_message() == "world_size=8 differs from job 'j' world_size=4");
}

TEST_CASE("batches are acknowledged with counts, rejections and the membership") {
  Fixture f;
  OpenStream stream(*f.ingest);
  v1::ReportBatch b = Hello("acks", 4, {0, 1});
  AddReport(b, 0, 1, 0.1);
  AddReport(b, 1, 1, 0.1);
  AddReport(b, 2, 1, 0.1);      // not this stream's rank
  AddReport(b, 0, 2, -1.0);     // invalid value
  v1::Directive ack = stream.Send(b, 1);
  CHECK(ack.accepted() == 2);
  CHECK(ack.rejected() == 2);
  REQUIRE(ack.rejections_size() == 2);
  CHECK(ack.rejections(0).reason() == "rank_not_in_stream");
  CHECK(ack.rejections(0).rank() == 2);
  CHECK(ack.rejections(1).reason() == "invalid_value");
  CHECK_FALSE(ack.rejections(1).message().empty());
  CHECK(ack.memberships_size() >= 1);
  REQUIRE(ack.progress_size() == 2);
  CHECK(ack.progress(0).rank() == 0);
  CHECK(ack.progress(1).rank() == 1);

  // Duplicates are acknowledged, counted apart from rejections, change nothing.
  v1::ReportBatch again;
  AddReport(again, 0, 1, 0.1);
  ack = stream.Send(again, 2);
  CHECK(ack.accepted() == 0);
  CHECK(ack.rejected() == 0);
  CHECK(ack.duplicates() == 1);
  CHECK(ack.rejections_size() == 0);

  const v1::Job job = JobOf(*f.query, "acks");
  CHECK(job.world_size() == 4);
  CHECK(job.streams() == 1);
  CHECK(job.reports_total() == 2);
  CHECK(job.policy().threshold_factor() == 2.0);  // effective policy, every field set

  CHECK(stream.Close().ok());
}

TEST_CASE("a later hello adds ranks to a stream, a bad one is refused and the stream goes on") {
  // The node agent's case: ranks of one job connect to it at different times
  // and it speaks for all of them on one upstream stream.
  Fixture f;
  OpenStream stream(*f.ingest);
  v1::ReportBatch b = Hello("later", 4, {0});
  AddReport(b, 0, 1, 0.1);
  v1::Directive ack = stream.Send(b, 1);
  CHECK(ack.accepted() == 1);

  // Before the later hello rank 2 is not the stream's.
  v1::ReportBatch before;
  AddReport(before, 2, 1, 0.1);
  ack = stream.Send(before, 2);
  CHECK(ack.accepted() == 0);
  REQUIRE(ack.rejections_size() == 1);
  CHECK(ack.rejections(0).reason() == "rank_not_in_stream");

  v1::ReportBatch later = Hello("later", 4, {2, 3});
  AddReport(later, 2, 1, 0.1);
  AddReport(later, 3, 1, 0.1);
  ack = stream.Send(later, 3);
  CHECK(ack.accepted() == 2);
  CHECK(ack.rejected() == 0);
  // A full set again: progress of every rank of the stream, and memberships.
  REQUIRE(ack.progress_size() == 3);
  CHECK(ack.progress(0).rank() == 0);
  CHECK(ack.progress(1).rank() == 2);
  CHECK(ack.progress(2).rank() == 3);
  CHECK(ack.memberships_size() >= 1);

  // Another job's hello, or another world size, is refused by name; the
  // stream keeps its ranks and goes on.
  v1::ReportBatch wrong = Hello("other-job", 4, {1});
  AddReport(wrong, 0, 2, 0.1);
  ack = stream.Send(wrong, 4);
  CHECK(ack.accepted() == 1);
  REQUIRE(ack.rejections_size() == 1);
  CHECK(ack.rejections(0).reason() == "invalid_hello");
  CHECK(ack.rejections(0).message().find("other-job") != std::string::npos);

  ack = stream.Send(Hello("later", 8, {1}), 5);
  REQUIRE(ack.rejections_size() == 1);
  CHECK(ack.rejections(0).message().find("world_size=8") != std::string::npos);

  const v1::Job job = JobOf(*f.query, "later");
  CHECK(job.streams() == 1);
  CHECK(job.reports_total() == 4);

  CHECK(stream.Close().ok());
}

TEST_CASE("queries and admin calls report bad input with the right code") {
  Fixture f;
  {
    OpenStream stream(*f.ingest);
    stream.Send(Hello("q", 4, {0, 1, 2, 3}), 7);
    REQUIRE(stream.Close().ok());
  }
  {
    v1::Job job;
    grpc::Status s = GetJob(*f.query, "nope", &job);
    CHECK(s.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(s.error_message() == "job 'nope' not found");
  }
  {
    v1::Worker w;
    grpc::Status s = GetWorker(*f.query, "q", 4, &w);
    // The same answer as REST's 404 (one query core, api.cc).
    CHECK(s.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(s.error_message() == "rank 4 not found: job 'q' has world_size 4");
  }
  {
    grpc::ClientContext ctx;
    v1::ListWorkersRequest req;
    req.set_job_id("q");
    v1::ListWorkersResponse resp;
    REQUIRE(f.query->ListWorkers(&ctx, req, &resp).ok());
    CHECK(resp.workers_size() == 4);
    CHECK(resp.workers(3).node() == "test-node");
  }
  {
    v1::PolicyConfig policy;
    policy.set_threshold_factor(0.5);
    v1::Job job;
    grpc::Status s = SetPolicy(*f.admin, "q", policy, &job);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(s.error_message(), Catch::Contains("threshold_factor=0.5"));
  }
  {
    v1::PolicyConfig policy;
    policy.set_limit(9);
    v1::Job job;
    REQUIRE(SetPolicy(*f.admin, "q", policy, &job).ok());
    CHECK(job.policy().limit() == 9);
    CHECK(job.policy().threshold_factor() == 2.0);  // untouched fields keep their values
  }
  {
    v1::Membership m;
    grpc::Status s = SetOverride(*f.admin, "q", 1, v1::RANK_OVERRIDE_UNSPECIFIED, "", &m);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    // A number outside the enum has no name: the message shows the number.
    v1::Membership m;
    grpc::Status s = SetOverride(*f.admin, "q", 1, static_cast<v1::RankOverride>(42), "", &m);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(s.error_message(), Catch::StartsWith("override=42 is not RANK_OVERRIDE_NONE"));
  }
  {
    grpc::ClientContext ctx;
    v1::ListEventsRequest req;
    req.set_job_id("q");
    v1::ListEventsResponse resp;
    REQUIRE(f.query->ListEvents(&ctx, req, &resp).ok());
    REQUIRE(resp.events_size() >= 1);  // at least the policy change
    CHECK(resp.last_sequence() >= resp.events(resp.events_size() - 1).sequence());
    for (const auto& e : resp.events()) CHECK(e.job_id() == "q");
  }
}

TEST_CASE("a forced exclusion is pushed to the job's streams and watchers") {
  Fixture f;
  OpenStream stream(*f.ingest);
  v1::ReportBatch b = Hello("push", 4, {0, 1, 2, 3});
  v1::Directive ack = stream.Send(b, 1);
  const uint64_t v0 = ack.memberships(ack.memberships_size() - 1).version();

  grpc::ClientContext wctx;
  v1::WatchMembershipRequest wreq;
  wreq.set_job_id("push");
  auto watch = f.query->WatchMembership(&wctx, wreq);
  v1::Membership current;
  REQUIRE(watch->Read(&current));
  CHECK(current.version() == v0);

  const v1::Membership m = ForceExclude(*f.admin, "push", 2);
  CHECK(m.version() > v0);
  REQUIRE(m.excluded_size() == 1);
  CHECK(m.excluded(0).rank() == 2);
  CHECK(m.excluded(0).reason() == v1::EXCLUSION_REASON_FORCED);

  v1::Directive push;
  REQUIRE(stream.stream->Read(&push));
  REQUIRE(push.memberships_size() >= 1);
  CHECK(push.memberships(push.memberships_size() - 1).version() == m.version());

  v1::Membership watched;
  REQUIRE(watch->Read(&watched));
  CHECK(watched.version() == m.version());

  wctx.TryCancel();
  while (watch->Read(&watched)) {
  }
  CHECK(watch->Finish().error_code() == grpc::StatusCode::CANCELLED);

  // Shutdown tells the open stream to go away and come back later.
  f.server.Shutdown(std::chrono::seconds(2));
  CHECK(stream.Drain().error_code() == grpc::StatusCode::UNAVAILABLE);
}

TEST_CASE("a hello naming a version from an earlier daemon raises the job above it") {
  Fixture f;
  OpenStream stream(*f.ingest);
  v1::ReportBatch b = HelloHolding("restarted", {0, 1}, 7, 100);
  b.set_sequence(1);
  REQUIRE(stream.stream->Write(b));
  // Pushes may come before the ack: look at every directive up to it.
  uint64_t newest = 0, newest_effective = 0;
  v1::Directive d;
  while (stream.stream->Read(&d)) {
    for (const auto& m : d.memberships()) {
      if (m.version() >= newest) {
        newest = m.version();
        newest_effective = m.effective_iteration();
      }
    }
    if (d.acked_sequence() == 1) break;
  }
  REQUIRE(d.acked_sequence() == 1);
  CHECK(newest >= 8);
  CHECK(newest_effective > 100);

  const v1::Membership current = MembershipOf(*f.query, "restarted");
  CHECK(current.version() == newest);
  CHECK(current.excluded_size() == 0);  // same (empty) excluded set

  // Another stream of the job holding the same version changes nothing.
  OpenStream stream2(*f.ingest);
  v1::ReportBatch b2 = HelloHolding("restarted", {2, 3}, 7, 100);
  v1::Directive ack2 = stream2.Send(b2, 1);
  REQUIRE(ack2.memberships_size() >= 1);
  CHECK(ack2.memberships(ack2.memberships_size() - 1).version() == newest);

  // A reconnect holding this daemon run's newest version (same incarnation)
  // is a plain reconnect: no new version.
  REQUIRE(current.incarnation() != 0);
  OpenStream stream3(*f.ingest);
  v1::ReportBatch b3 = HelloHolding("restarted", {0, 1}, current.version(),
                                    current.effective_iteration(), current.incarnation());
  v1::Directive ack3 = stream3.Send(b3, 1);
  REQUIRE(ack3.memberships_size() >= 1);
  CHECK(ack3.memberships(ack3.memberships_size() - 1).version() == newest);

  for (OpenStream* s : {&stream, &stream2, &stream3}) CHECK(s->Close().ok());
}

TEST_CASE("a hello's excluded ranks and progress shape a restarted daemon's first version") {
  Fixture f;
  OpenStream stream(*f.ingest);
  // The client holds v7 (rank 2 out as a straggler, since iteration 100) and
  // its ranks have reached iteration 500: the old daemon is gone, nothing
  // else is known here.
  v1::ReportBatch b = HelloHolding("restarted-excluded", {0, 1}, 7, 100);
  v1::ExcludedRank* x = b.mutable_hello()->add_known_excluded();
  x->set_rank(2);
  x->set_reason(v1::EXCLUSION_REASON_STRAGGLER);
  x->set_detail("1.9x the baseline");
  b.mutable_hello()->set_reported_iteration(500);
  stream.Send(b, 1);

  const v1::Membership current = MembershipOf(*f.query, "restarted-excluded");
  CHECK(current.version() == 8);
  // Not 101: the ranks are past it. After 500, the one step a rank not heard
  // from may be further, and the lead.
  CHECK(current.effective_iteration() == 500 + 1 + current.lead_iterations());
  REQUIRE(current.excluded_size() == 1);
  CHECK(current.excluded(0).rank() == 2);
  CHECK(current.excluded(0).reason() == v1::EXCLUSION_REASON_STRAGGLER);
  CHECK(stream.Close().ok());

  // An excluded rank outside the job is refused, naming it.
  v1::ReportBatch b2 = Hello("restarted-bad", 4, {0});
  b2.mutable_hello()->set_known_membership_version(3);
  b2.mutable_hello()->add_known_excluded()->set_rank(9);
  b2.set_sequence(1);
  const grpc::Status st = SendAndClose(*f.ingest, b2);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().find("hello.known_excluded rank 9 >= world_size=4") !=
        std::string::npos);
}

TEST_CASE("a hello cannot force a rank out: a held forced exclusion gets no override") {
  // Ingest needs no token (docs/security.md): a client that says it holds
  // a version of an earlier daemon with rank 2 forced out may keep rank 2
  // out for agreement's sake, but only as a held straggler that its own
  // reports release, never as an operator's override.
  Fixture f;
  OpenStream stream(*f.ingest);
  // 12345: not this daemon's incarnation.
  v1::ReportBatch b = HelloHolding("forged", {0, 1, 2, 3}, 7, 1, 12345);
  v1::ExcludedRank* x = b.mutable_hello()->add_known_excluded();
  x->set_rank(2);
  x->set_reason(v1::EXCLUSION_REASON_FORCED);
  x->set_detail("operator");
  stream.Send(b, 1);

  auto membership = [&] { return MembershipOf(*f.query, "forged"); };
  auto worker = [&] { return WorkerOf(*f.query, "forged", 2); };
  const v1::Membership held = membership();
  CHECK(held.version() == 8);
  REQUIRE(held.excluded_size() == 1);
  CHECK(held.excluded(0).rank() == 2);
  CHECK(held.excluded(0).reason() == v1::EXCLUSION_REASON_STRAGGLER);
  CHECK(worker().override() != v1::RANK_OVERRIDE_FORCE_EXCLUDE);

  // Every rank fast, rank 2 included (its shadow steps): it is released.
  v1::ReportBatch reports;
  for (uint64_t it = 1; it <= 200; ++it) {
    for (uint32_t r = 0; r < 4; ++r) AddReport(reports, r, it, 0.1);
  }
  stream.Send(reports, 2);
  const v1::Membership after = membership();
  CHECK(after.version() > held.version());
  CHECK(after.excluded_size() == 0);
  CHECK(worker().override() != v1::RANK_OVERRIDE_FORCE_EXCLUDE);
  CHECK(stream.Close().ok());
}

TEST_CASE("after the first directive a stream is sent only the versions it lacks") {
  Fixture f;
  OpenStream stream(*f.ingest);
  v1::ReportBatch b = Hello("delta", 4, {0, 1, 2, 3});
  b.set_sequence(1);
  REQUIRE(stream.stream->Write(b));
  std::vector<uint64_t> carried;  // every version carried on the stream, in order
  auto read_until_ack = [&](uint64_t sequence) {
    v1::Directive d;
    while (stream.stream->Read(&d)) {
      for (const auto& m : d.memberships()) carried.push_back(m.version());
      if (d.acked_sequence() == sequence) return d;
    }
    FAIL("stream ended before the ack of sequence " << sequence);
    return d;
  };
  v1::Directive ack = read_until_ack(1);
  REQUIRE(ack.memberships_size() >= 1);  // the full set: version 0

  v1::ReportBatch r;
  r.set_sequence(2);
  for (uint32_t rank = 0; rank < 4; ++rank) AddReport(r, rank, 1, 0.1);
  REQUIRE(stream.stream->Write(r));
  ack = read_until_ack(2);
  CHECK(ack.memberships_size() == 0);  // nothing new
  CHECK(ack.accepted() == 4);
  CHECK(ack.progress_size() == 4);

  // Two forced exclusions: each new version is carried exactly once.
  uint64_t last = 0;
  for (uint32_t rank : {2u, 3u}) last = ForceExclude(*f.admin, "delta", rank).version();
  r.Clear();
  r.set_sequence(3);
  AddReport(r, 0, 2, 0.1);
  REQUIRE(stream.stream->Write(r));
  read_until_ack(3);
  REQUIRE_FALSE(carried.empty());
  CHECK(carried.back() == last);
  CHECK(std::is_sorted(carried.begin(), carried.end()));
  CHECK(std::adjacent_find(carried.begin(), carried.end()) == carried.end());  // no repeats

  CHECK(stream.Close().ok());
}

TEST_CASE("a job with no stream and no watcher is removed after the idle TTL") {
  spdlog::set_level(spdlog::level::warn);
  auto config = std::make_shared<sd::DaemonConfig>();
  config->limits.job_idle_ttl_seconds = 60;
  sd::DaemonStats stats;
  sd::JobRegistry registry(config, stats);
  using std::chrono::hours;
  using std::chrono::seconds;

  auto stream = std::make_shared<RecordingSubscriber>();
  auto attached = registry.Attach(RegistryHello("idle", 2, {0}), stream, sd::WallNow());
  REQUIRE(attached.ok());
  std::shared_ptr<sd::Job> job = *attached;
  // An open stream keeps it (the tick judges it instead: unresponsive events).
  registry.TickAll(sd::WallNow() + hours(2));
  REQUIRE(registry.Find("idle") == job);
  sd::EventQuery query;
  query.job_id = "idle";
  const size_t events = registry.Events(query).events.size();
  CHECK(events >= 1);

  registry.Unsubscribe(*job, stream.get(), /*is_stream=*/true);
  // So does a watcher.
  auto watcher = std::make_shared<RecordingSubscriber>();
  REQUIRE(registry.Watch(*job, watcher).ok());
  registry.TickAll(sd::WallNow() + hours(2));
  REQUIRE(registry.Find("idle") == job);
  registry.Unsubscribe(*job, watcher.get(), /*is_stream=*/false);
  // Two hours without a stream: it was lost meanwhile, one job_lost event.
  const size_t kept = registry.Events(query).events.size();
  CHECK(kept == events + 1);

  registry.TickAll(sd::WallNow() + seconds(30));  // within the TTL of the detach
  REQUIRE(registry.Find("idle") == job);
  registry.TickAll(sd::WallNow() + seconds(61));
  CHECK(registry.Find("idle") == nullptr);
  CHECK(registry.Jobs().empty());
  CHECK(registry.Read("idle", [](const sd::Job::Locked&) {}).code() == absl::StatusCode::kNotFound);
  // A watcher that found it just before is told it is gone.
  CHECK(registry.Watch(*job, watcher).code() == absl::StatusCode::kNotFound);
  // Its events stay in the journal.
  CHECK(registry.Events(query).events.size() == kept);

  // A new hello starts a fresh job of that id.
  auto again = registry.Attach(RegistryHello("idle", 2, {0}), stream, sd::WallNow());
  REQUIRE(again.ok());
  CHECK(*again != job);
  CHECK(registry.Find("idle") == *again);
}

TEST_CASE("a subscriber attached while the registry closes is refused or closed") {
  spdlog::set_level(spdlog::level::warn);
  for (int round = 0; round < 200; ++round) {
    auto config = std::make_shared<sd::DaemonConfig>();
    sd::DaemonStats stats;
    sd::JobRegistry registry(config, stats);
    REQUIRE(registry.Attach(RegistryHello("race", 2, {0}), std::make_shared<RecordingSubscriber>(),
                            sd::WallNow())
                .ok());
    auto stream = std::make_shared<RecordingSubscriber>();
    auto watcher = std::make_shared<RecordingSubscriber>();
    std::shared_ptr<sd::Job> job = registry.Find("race");
    absl::Status attach_status, watch_status;
    std::thread attacher([&] {
      attach_status = registry.Attach(RegistryHello("race", 2, {0}), stream, sd::WallNow()).status();
    });
    std::thread watching([&] { watch_status = registry.Watch(*job, watcher); });
    registry.CloseAll(absl::UnavailableError("bye"));
    attacher.join();
    watching.join();
    if (attach_status.ok()) {
      CHECK(stream->closed.load());
    } else {
      CHECK(attach_status.code() == absl::StatusCode::kUnavailable);
    }
    if (watch_status.ok()) {
      CHECK(watcher->closed.load());
    } else {
      CHECK(watch_status.code() == absl::StatusCode::kUnavailable);
    }
  }
}
