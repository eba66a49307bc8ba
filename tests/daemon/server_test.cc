// The daemon's gRPC services in-process on loopback (port 0): the hello
// contract, acknowledgements, per-report rejections, queries, admin calls,
// membership pushes to streams and watchers, and draining on shutdown.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "config.h"
#include "server.h"
#include "spdlog/spdlog.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;

namespace {

using Stream = grpc::ClientReaderWriter<v1::ReportBatch, v1::Directive>;

struct Fixture {
  Fixture() {
    spdlog::set_level(spdlog::level::warn);  // keep test output to failures
    sd::DaemonConfig config;
    config.grpc_address = "127.0.0.1:0";
    REQUIRE(server.Start(config).ok());
    REQUIRE(server.grpc_port() > 0);
    channel = grpc::CreateChannel(server.grpc_dial_address(), grpc::InsecureChannelCredentials());
    ingest = v1::IngestService::NewStub(channel);
    query = v1::QueryService::NewStub(channel);
    admin = v1::AdminService::NewStub(channel);
  }

  static v1::ReportBatch Hello(const std::string& job, uint32_t world, std::vector<uint32_t> ranks) {
    v1::ReportBatch b;
    b.mutable_hello()->set_job_id(job);
    b.mutable_hello()->set_world_size(world);
    b.mutable_hello()->set_node("test-node");
    for (uint32_t r : ranks) b.mutable_hello()->add_ranks(r);
    return b;
  }

  static void AddReport(v1::ReportBatch& b, uint32_t rank, uint64_t iteration, double seconds) {
    v1::IterationReport* r = b.add_reports();
    r->set_rank(rank);
    r->set_iteration(iteration);
    r->set_compute_seconds(seconds);
  }

  sd::Server server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::IngestService::Stub> ingest;
  std::unique_ptr<v1::QueryService::Stub> query;
  std::unique_ptr<v1::AdminService::Stub> admin;
};

// Reads directives until one acknowledges `sequence` (pushes may come first).
v1::Directive ReadAck(Stream& stream, uint64_t sequence) {
  v1::Directive d;
  while (stream.Read(&d)) {
    if (d.acked_sequence() == sequence) return d;
  }
  FAIL("stream ended before the ack of sequence " << sequence);
  return d;
}

}  // namespace

TEST_CASE("a stream without a hello is refused with INVALID_ARGUMENT") {
  Fixture f;
  grpc::ClientContext ctx;
  auto stream = f.ingest->Stream(&ctx);
  v1::ReportBatch b;
  Fixture::AddReport(b, 0, 1, 0.1);
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
  auto refused = [&](v1::ReportBatch hello) {
    grpc::ClientContext ctx;
    auto stream = f.ingest->Stream(&ctx);
    stream->Write(hello);
    stream->WritesDone();
    v1::Directive d;
    while (stream->Read(&d)) {
    }
    return stream->Finish();
  };
  grpc::Status s = refused(Fixture::Hello("j", 4, {0, 4}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(s.error_message(), Catch::Contains("rank 4") && Catch::Contains("world_size=4"));

  s = refused(Fixture::Hello("", 4, {0}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  s = refused(Fixture::Hello("j", 0, {0}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  s = refused(Fixture::Hello("j", 4, {}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  // The job exists with world_size 4 after a good hello.
  CHECK(refused(Fixture::Hello("j", 4, {0})).ok());
  s = refused(Fixture::Hello("j", 8, {0}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.error_message() == "world_size=8 differs from job 'j' world_size=4");
}

TEST_CASE("batches are acknowledged with counts, rejections and the membership") {
  Fixture f;
  grpc::ClientContext ctx;
  auto stream = f.ingest->Stream(&ctx);
  v1::ReportBatch b = Fixture::Hello("acks", 4, {0, 1});
  b.set_sequence(1);
  Fixture::AddReport(b, 0, 1, 0.1);
  Fixture::AddReport(b, 1, 1, 0.1);
  Fixture::AddReport(b, 2, 1, 0.1);      // not this stream's rank
  Fixture::AddReport(b, 0, 2, -1.0);     // invalid value
  REQUIRE(stream->Write(b));
  v1::Directive ack = ReadAck(*stream, 1);
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
  again.set_sequence(2);
  Fixture::AddReport(again, 0, 1, 0.1);
  REQUIRE(stream->Write(again));
  ack = ReadAck(*stream, 2);
  CHECK(ack.accepted() == 0);
  CHECK(ack.rejected() == 0);
  CHECK(ack.duplicates() == 1);
  CHECK(ack.rejections_size() == 0);

  v1::Job job;
  grpc::ClientContext qctx;
  v1::GetJobRequest req;
  req.set_job_id("acks");
  REQUIRE(f.query->GetJob(&qctx, req, &job).ok());
  CHECK(job.world_size() == 4);
  CHECK(job.streams() == 1);
  CHECK(job.reports_total() == 2);
  CHECK(job.policy().threshold_factor() == 2.0);  // effective policy, every field set

  stream->WritesDone();
  while (stream->Read(&ack)) {
  }
  CHECK(stream->Finish().ok());
}

TEST_CASE("queries and admin calls report bad input with the right code") {
  Fixture f;
  {
    grpc::ClientContext ctx;
    auto stream = f.ingest->Stream(&ctx);
    v1::ReportBatch b = Fixture::Hello("q", 4, {0, 1, 2, 3});
    b.set_sequence(7);
    REQUIRE(stream->Write(b));
    ReadAck(*stream, 7);
    stream->WritesDone();
    v1::Directive d;
    while (stream->Read(&d)) {
    }
    REQUIRE(stream->Finish().ok());
  }
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id("nope");
    v1::Job job;
    grpc::Status s = f.query->GetJob(&ctx, req, &job);
    CHECK(s.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(s.error_message() == "job 'nope' not found");
  }
  {
    grpc::ClientContext ctx;
    v1::GetWorkerRequest req;
    req.set_job_id("q");
    req.set_rank(4);
    v1::Worker w;
    grpc::Status s = f.query->GetWorker(&ctx, req, &w);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(s.error_message(), Catch::Contains("rank 4") && Catch::Contains("world_size 4"));
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
    grpc::ClientContext ctx;
    v1::SetPolicyRequest req;
    req.set_job_id("q");
    req.mutable_policy()->set_threshold_factor(0.5);
    v1::Job job;
    grpc::Status s = f.admin->SetPolicy(&ctx, req, &job);
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(s.error_message(), Catch::Contains("threshold_factor=0.5"));
  }
  {
    grpc::ClientContext ctx;
    v1::SetPolicyRequest req;
    req.set_job_id("q");
    req.mutable_policy()->set_limit(9);
    v1::Job job;
    REQUIRE(f.admin->SetPolicy(&ctx, req, &job).ok());
    CHECK(job.policy().limit() == 9);
    CHECK(job.policy().threshold_factor() == 2.0);  // untouched fields keep their values
  }
  {
    grpc::ClientContext ctx;
    v1::SetRankOverrideRequest req;
    req.set_job_id("q");
    req.set_rank(1);
    v1::Membership m;
    grpc::Status s = f.admin->SetRankOverride(&ctx, req, &m);  // UNSPECIFIED
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
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
  grpc::ClientContext ctx;
  auto stream = f.ingest->Stream(&ctx);
  v1::ReportBatch b = Fixture::Hello("push", 4, {0, 1, 2, 3});
  b.set_sequence(1);
  REQUIRE(stream->Write(b));
  v1::Directive ack = ReadAck(*stream, 1);
  const uint64_t v0 = ack.memberships(ack.memberships_size() - 1).version();

  grpc::ClientContext wctx;
  v1::WatchMembershipRequest wreq;
  wreq.set_job_id("push");
  auto watch = f.query->WatchMembership(&wctx, wreq);
  v1::Membership current;
  REQUIRE(watch->Read(&current));
  CHECK(current.version() == v0);

  v1::Membership m;
  {
    grpc::ClientContext actx;
    v1::SetRankOverrideRequest req;
    req.set_job_id("push");
    req.set_rank(2);
    req.set_override(v1::RANK_OVERRIDE_FORCE_EXCLUDE);
    req.set_reason("test");
    REQUIRE(f.admin->SetRankOverride(&actx, req, &m).ok());
  }
  CHECK(m.version() > v0);
  REQUIRE(m.excluded_size() == 1);
  CHECK(m.excluded(0).rank() == 2);
  CHECK(m.excluded(0).reason() == v1::EXCLUSION_REASON_FORCED);

  v1::Directive push;
  REQUIRE(stream->Read(&push));
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
  while (stream->Read(&push)) {
  }
  CHECK(stream->Finish().error_code() == grpc::StatusCode::UNAVAILABLE);
}
