// Shared by the daemon's in-process tests: a real Server on loopback with
// stubs of its services, and the ingest messages the tests send it.
//
//   LoopbackDaemon d;                                  // gRPC + HTTP on 127.0.0.1:0
//   v1::ReportBatch b = Hello("job", 4, {0, 1, 2, 3});
//   AddRank3Slower(b, 4);                              // rank 3 a straggler at iteration 10
//   v1::Directive ack = SendAlone(*d.ingest, b);
//
// Not thread-safe; one LoopbackDaemon per test.
#pragma once

#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::daemon::testutil {

using IngestStream = grpc::ClientReaderWriter<v1::ReportBatch, v1::Directive>;

// A real Server with gRPC and HTTP on 127.0.0.1, port 0 (never the default
// ports: tests run in parallel), and a channel to it with a stub per service.
// `log_level`: warn keeps test output to failures; tests whose refusals log
// warnings by design pass err.
struct LoopbackDaemon {
  // `kind`: these tests were written for the paper's rule, so a config that
  // leaves the policy's kind at the daemon's default (peer since issue 17)
  // runs dynamic; a kind the config or `kind` names is kept.
  explicit LoopbackDaemon(DaemonConfig config = {},
                          spdlog::level::level_enum log_level = spdlog::level::warn,
                          std::optional<engine::PolicyKind> kind = std::nullopt) {
    spdlog::set_level(log_level);
    if (kind) {
      config.policy.kind = *kind;
    } else if (config.policy.kind == engine::PolicyConfig{}.kind) {
      config.policy.kind = engine::PolicyKind::kDynamic;
    }
    config.grpc_address = "127.0.0.1:0";
    config.http_address = "127.0.0.1:0";
    REQUIRE(server.Start(config).ok());
    REQUIRE(server.grpc_port() > 0);
    channel = grpc::CreateChannel(server.grpc_dial_address(), grpc::InsecureChannelCredentials());
    ingest = v1::IngestService::NewStub(channel);
    query = v1::QueryService::NewStub(channel);
    admin = v1::AdminService::NewStub(channel);
  }

  Server server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::IngestService::Stub> ingest;
  std::unique_ptr<v1::QueryService::Stub> query;
  std::unique_ptr<v1::AdminService::Stub> admin;
};

// The first batch of a stream: the hello of `ranks` of `job` on `node`
// (sequence 0; every batch is acknowledged, whatever its sequence).
inline v1::ReportBatch Hello(const std::string& job, uint32_t world,
                             const std::vector<uint32_t>& ranks,
                             const std::string& node = "test-node") {
  v1::ReportBatch b;
  b.mutable_hello()->set_job_id(job);
  b.mutable_hello()->set_world_size(world);
  b.mutable_hello()->set_node(node);
  for (uint32_t r : ranks) b.mutable_hello()->add_ranks(r);
  return b;
}

inline void AddReport(v1::ReportBatch& b, uint32_t rank, uint64_t iteration, double seconds) {
  v1::IterationReport* r = b.add_reports();
  r->set_rank(rank);
  r->set_iteration(iteration);
  r->set_compute_seconds(seconds);
}

// Iterations [first, last] of ranks 0..3 in `epoch`, rank 3 at `slow`
// seconds, the others at 0.1 s.
inline void AddRows(v1::ReportBatch& b, uint64_t first, uint64_t last, double slow = 0.1,
                    uint64_t epoch = 0) {
  for (uint64_t it = first; it <= last; ++it) {
    for (uint32_t r = 0; r < 4; ++r) {
      AddReport(b, r, it, r == 3 ? slow : 0.1);
      b.mutable_reports(b.reports_size() - 1)->set_epoch(epoch);
    }
  }
}

// Iterations 1-12 of ranks 0..world-1, rank 3 three times slower (0.3 s,
// the others 0.1 s). Under the default policy the profile (iterations 1-5)
// sets the threshold at 0.2 s; rank 3 is slow from iteration 6 on and a
// straggler (counter 5/5) at iteration 10, then excluded.
inline void AddRank3Slower(v1::ReportBatch& b, uint32_t world) {
  for (uint64_t it = 1; it <= 12; ++it) {
    for (uint32_t r = 0; r < world; ++r) AddReport(b, r, it, r == 3 ? 0.3 : 0.1);
  }
}

// Reads directives until one acknowledges `sequence` (pushes may come first).
inline v1::Directive ReadAck(IngestStream& stream, uint64_t sequence) {
  v1::Directive d;
  while (stream.Read(&d)) {
    if (d.acked_sequence() == sequence) return d;
  }
  FAIL("stream ended before the ack of sequence " << sequence);
  return d;
}

// Half-closes `stream`, reads it to its end and returns how it ended.
inline grpc::Status Close(IngestStream& stream) {
  stream.WritesDone();
  v1::Directive rest;
  while (stream.Read(&rest)) {
  }
  return stream.Finish();
}

// Sends `batch` on a fresh stream and closes it: how the stream ended (a
// refused hello ends it with the error).
inline grpc::Status SendAndClose(v1::IngestService::Stub& ingest, const v1::ReportBatch& batch) {
  grpc::ClientContext ctx;
  auto stream = ingest.Stream(&ctx);
  stream->Write(batch);
  return Close(*stream);
}

// Sends `batch` (as sequence 1) as the only message of a fresh stream and
// returns its ack, once the stream has ended cleanly.
inline v1::Directive SendAlone(v1::IngestService::Stub& ingest, v1::ReportBatch batch) {
  grpc::ClientContext ctx;
  auto stream = ingest.Stream(&ctx);
  batch.set_sequence(1);
  REQUIRE(stream->Write(batch));
  const v1::Directive ack = ReadAck(*stream, 1);
  REQUIRE(Close(*stream).ok());
  return ack;
}

// One stream for ranks 0..3 of `job` on node-a, sending AddRank3Slower's 12
// iterations alone (rank 3 a straggler at iteration 10); every report must
// be accepted.
inline void FeedRank3Slower(v1::IngestService::Stub& ingest, const std::string& job,
                            uint32_t world) {
  v1::ReportBatch b = Hello(job, world, {0, 1, 2, 3}, "node-a");
  AddRank3Slower(b, world);
  CHECK(SendAlone(ingest, b).accepted() == 12 * world);
}

// An ingest stream of a LoopbackDaemon's; cancelled and finished on
// destruction unless the test ended it with Close() or Drain() (a test that
// finishes `stream` itself resets it).
//
//   OpenStream s(*d.ingest);
//   v1::Directive ack = s.Send(Hello("job", 2, {0, 1}), 1);
//   CHECK(s.Close().ok());
struct OpenStream {
  explicit OpenStream(v1::IngestService::Stub& ingest) : stream(ingest.Stream(&ctx)) {}
  ~OpenStream() {
    if (!stream) return;
    ctx.TryCancel();
    stream->Finish();
  }
  // Writes `batch` as `sequence` and returns its ack (pushes before it are
  // skipped).
  v1::Directive Send(v1::ReportBatch batch, uint64_t sequence) {
    batch.set_sequence(sequence);
    REQUIRE(stream->Write(batch));
    return ReadAck(*stream, sequence);
  }
  // Half-closes the stream, reads it to its end and returns how it ended.
  grpc::Status Close() {
    stream->WritesDone();
    return Drain();
  }
  // Reads the stream to its end (the daemon ends it) and returns how it ended.
  grpc::Status Drain() {
    v1::Directive rest;
    while (stream->Read(&rest)) {
    }
    const grpc::Status s = stream->Finish();
    stream.reset();
    return s;
  }

  grpc::ClientContext ctx;
  std::unique_ptr<IngestStream> stream;
};

// The query and admin calls the tests make, each with a fresh context: the
// status, and the answer in `out`.
inline grpc::Status GetJob(v1::QueryService::Stub& query, const std::string& job, v1::Job* out) {
  grpc::ClientContext ctx;
  v1::GetJobRequest req;
  req.set_job_id(job);
  return query.GetJob(&ctx, req, out);
}

inline grpc::Status GetWorker(v1::QueryService::Stub& query, const std::string& job,
                              uint32_t rank, v1::Worker* out) {
  grpc::ClientContext ctx;
  v1::GetWorkerRequest req;
  req.set_job_id(job);
  req.set_rank(rank);
  return query.GetWorker(&ctx, req, out);
}

inline grpc::Status GetMembership(v1::QueryService::Stub& query, const std::string& job,
                                  v1::Membership* out) {
  grpc::ClientContext ctx;
  v1::GetMembershipRequest req;
  req.set_job_id(job);
  return query.GetMembership(&ctx, req, out);
}

inline grpc::Status SetOverride(v1::AdminService::Stub& admin, const std::string& job,
                                uint32_t rank, v1::RankOverride override_kind,
                                const std::string& reason, v1::Membership* out) {
  grpc::ClientContext ctx;
  v1::SetRankOverrideRequest req;
  req.set_job_id(job);
  req.set_rank(rank);
  req.set_override(override_kind);
  req.set_reason(reason);
  return admin.SetRankOverride(&ctx, req, out);
}

inline grpc::Status SetPolicy(v1::AdminService::Stub& admin, const std::string& job,
                              const v1::PolicyConfig& policy, v1::Job* out) {
  grpc::ClientContext ctx;
  v1::SetPolicyRequest req;
  req.set_job_id(job);
  *req.mutable_policy() = policy;
  return admin.SetPolicy(&ctx, req, out);
}

// The same calls where the test needs them to succeed.
inline v1::Job JobOf(v1::QueryService::Stub& query, const std::string& job) {
  v1::Job out;
  REQUIRE(GetJob(query, job, &out).ok());
  return out;
}

inline v1::Worker WorkerOf(v1::QueryService::Stub& query, const std::string& job, uint32_t rank) {
  v1::Worker out;
  REQUIRE(GetWorker(query, job, rank, &out).ok());
  return out;
}

inline v1::Membership MembershipOf(v1::QueryService::Stub& query, const std::string& job) {
  v1::Membership out;
  REQUIRE(GetMembership(query, job, &out).ok());
  return out;
}

// The job's first transition of `rank` to straggler (its detection event);
// fails the test when there is none.
inline v1::Event DetectionOf(v1::QueryService::Stub& query, const std::string& job,
                             uint32_t rank) {
  grpc::ClientContext ctx;
  v1::ListEventsRequest req;
  req.set_job_id(job);
  v1::ListEventsResponse resp;
  REQUIRE(query.ListEvents(&ctx, req, &resp).ok());
  for (const v1::Event& e : resp.events()) {
    if (e.kind() == v1::EVENT_KIND_STATE_CHANGE && e.rank() == rank &&
        e.to() == v1::WORKER_STATE_STRAGGLER)
      return e;
  }
  FAIL("no detection event for rank " << rank << " of job " << job);
  return {};
}

// Forces `rank` of `job` out and returns the version that did it.
inline v1::Membership ForceExclude(v1::AdminService::Stub& admin, const std::string& job,
                                   uint32_t rank, const std::string& reason = "test") {
  v1::Membership out;
  REQUIRE(SetOverride(admin, job, rank, v1::RANK_OVERRIDE_FORCE_EXCLUDE, reason, &out).ok());
  return out;
}

}  // namespace straggler::daemon::testutil
