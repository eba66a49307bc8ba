// The daemon's limits against a real server on loopback (gRPC and HTTP, port
// 0): jobs, ranks per job, open streams, reports per second per stream,
// gRPC message size, bad job ids and override reasons over gRPC, and slow
// HTTP clients (slowloris, also over HTTPS with a certificate the openssl
// command makes at test time) that must not keep a normal request from being
// served. Every refusal names the limit and shows in /metrics. No assertion
// on timing: the timeouts below only bound how long a broken build fails.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config/config.h"
#include "daemon_test_util.h"
#include "http_daemon.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "straggler/v1/straggler.grpc.pb.h"
#include "slow_client.h"
#include "test_certificate.h"
#include "straggler/common/tls.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;
using namespace straggler::daemon::testutil;

namespace {

using Daemon = HttpDaemon;  // http_daemon.h

// An open ingest stream (daemon_test_util.h) whose hello was acknowledged.
std::unique_ptr<OpenStream> Open(Daemon& d, const v1::ReportBatch& hello) {
  auto s = std::make_unique<OpenStream>(*d.ingest);
  REQUIRE(s->stream->Write(hello));
  v1::Directive ack;
  REQUIRE(s->stream->Read(&ack));
  return s;
}

grpc::Status Refused(Daemon& d, const v1::ReportBatch& batch) {
  return SendAndClose(*d.ingest, batch);
}

}  // namespace

TEST_CASE("limits.max_jobs and max_ranks_per_job refuse the stream naming the limit") {
  sd::DaemonConfig config;
  config.limits.max_jobs = 2;
  config.limits.max_ranks_per_job = 8;
  Daemon d(config);
  auto a = Open(d, Hello("job-a", 2, {0}));
  auto b = Open(d, Hello("job-b", 2, {0}));
  grpc::Status s = Refused(d, Hello("job-c", 2, {0}));
  CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(s.error_message(), Catch::Contains("max_jobs"));
  // A known job is still welcome.
  auto a2 = Open(d, Hello("job-a", 2, {1}));

  s = Refused(d, Hello("job-a", 9, {0}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.error_message() == "hello.world_size=9 exceeds limits.max_ranks_per_job=8");
  s = Refused(d, Hello("job a", 2, {0}));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(s.error_message(), Catch::StartsWith("hello.job_id 'job a' has ' ' at byte 3"));

  CHECK(d.Metric("straggler_streams_refused_total{reason=\"too_many_jobs\"}") == 1);
  CHECK(d.Metric("straggler_streams_refused_total{reason=\"invalid_hello\"}") == 2);
}

TEST_CASE("limits.max_streams refuses one stream more, before reading it") {
  sd::DaemonConfig config;
  config.limits.max_streams = 2;
  Daemon d(config);
  auto a = Open(d, Hello("j", 4, {0}));
  auto b = Open(d, Hello("j", 4, {1}));
  grpc::Status s = Refused(d, Hello("j", 4, {2}));
  CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(s.error_message() == "2 ingest streams are open (limits.max_streams=2); retry later");
  CHECK(d.Metric("straggler_streams_refused_total{reason=\"too_many_streams\"}") == 1);

  // A stream that closes makes room (once the server has seen it end).
  CHECK(a->Close().ok());
  bool opened = false;
  for (int attempt = 0; attempt < 500 && !opened; ++attempt) {
    grpc::ClientContext ctx;
    auto stream = d.ingest->Stream(&ctx);
    stream->Write(Hello("j", 4, {2}));
    v1::Directive ack;
    opened = stream->Read(&ack);
    if (opened) stream->WritesDone();
    grpc::Status st = stream->Finish();
    CHECK(st.error_code() == (opened ? grpc::StatusCode::OK : grpc::StatusCode::RESOURCE_EXHAUSTED));
    if (!opened) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(opened);
}

TEST_CASE("limits.max_streams: refusals at once name the open streams, not the refused ones") {
  // Refused streams that have not ended yet used to count as open: many at
  // once read "1088 ingest streams are open" with max_streams=1024.
  sd::DaemonConfig config;
  config.limits.max_streams = 2;
  Daemon d(config);
  auto a = Open(d, Hello("j", 4, {0}));
  auto b = Open(d, Hello("j", 4, {1}));
  constexpr int kThreads = 8, kEach = 25;
  std::vector<std::string> messages(kThreads * kEach);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
      std::vector<std::unique_ptr<IngestStream>> streams;
      // Open them all before finishing any, so that they overlap.
      for (int i = 0; i < kEach; ++i) {
        contexts.push_back(std::make_unique<grpc::ClientContext>());
        streams.push_back(d.ingest->Stream(contexts.back().get()));
      }
      for (int i = 0; i < kEach; ++i) {
        messages[t * kEach + i] = streams[i]->Finish().error_message();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& m : messages) {
    CHECK(m == "2 ingest streams are open (limits.max_streams=2); retry later");
  }
  CHECK(d.Metric("straggler_active_streams") == 2);
}

TEST_CASE("a stream over its reports-per-second budget has the excess rejected as rate_limited") {
  sd::DaemonConfig config;
  config.limits.stream_reports_per_second = 1;
  config.limits.stream_reports_burst = 5;
  Daemon d(config);
  auto s = Open(d, Hello("rate", 1, {0}));
  v1::ReportBatch batch;
  batch.set_sequence(2);
  constexpr int kReports = 1000;
  for (int i = 1; i <= kReports; ++i) {
    v1::IterationReport* r = batch.add_reports();
    r->set_rank(0);
    r->set_iteration(static_cast<uint64_t>(i));
    r->set_compute_seconds(0.1);
  }
  REQUIRE(s->stream->Write(batch));
  v1::Directive ack;
  do {
    REQUIRE(s->stream->Read(&ack));
  } while (ack.acked_sequence() != 2);
  // The burst of 5, plus 1 per second the test took (far below 1000).
  CHECK(ack.accepted() >= 5);
  CHECK(ack.accepted() < kReports);
  CHECK(ack.accepted() + ack.rejected() == kReports);
  REQUIRE(ack.rejections_size() == 1);
  CHECK(ack.rejections(0).reason() == "rate_limited");
  CHECK_THAT(ack.rejections(0).message(),
             Catch::Contains("limits.stream_reports_per_second=1 (burst 5)"));
  CHECK(ack.rejections(0).iteration() == ack.accepted() + 1);  // the first one dropped
  CHECK(d.Metric("straggler_reports_rejected_total{reason=\"rate_limited\"}") == ack.rejected());
  // The stream stays open.
  CHECK(s->Close().ok());
}

TEST_CASE("limits.max_message_bytes ends a call with a larger message") {
  sd::DaemonConfig config;
  config.limits.max_message_bytes = 4096;
  Daemon d(config);
  v1::ReportBatch big = Hello("big", 1, {0});
  big.mutable_hello()->set_node(std::string(5000, 'n'));
  grpc::Status s = Refused(d, big);
  CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Below the limit the same daemon serves.
  CHECK(Refused(d, Hello("small", 1, {0})).ok());
}

TEST_CASE("oversized messages at once, beyond gRPC's memory quota, end RESOURCE_EXHAUSTED") {
  // 4 x 48 MB over their own connections: more than the daemon's gRPC
  // ResourceQuota (32 MiB by default) and than max_message_bytes. Each call
  // ends RESOURCE_EXHAUSTED, whichever gRPC layer refuses it (the quota's
  // RST_STREAM or the message-size check), and the daemon serves on. Memory
  // figures are measured by bench/grpc_memory (BENCHMARKS.md), not here.
  Daemon d{sd::DaemonConfig()};
  v1::ReportBatch big = Hello("big", 1, {0});
  big.mutable_hello()->set_node(std::string(size_t{48} << 20, 'n'));
  std::vector<grpc::StatusCode> codes(4, grpc::StatusCode::OK);
  std::vector<std::thread> callers;
  for (size_t i = 0; i < codes.size(); ++i) {
    callers.emplace_back([&, i] {
      grpc::ChannelArguments args;
      args.SetInt("limits_test.connection", static_cast<int>(i));  // no shared connection
      auto channel = grpc::CreateCustomChannel(d.server.grpc_dial_address(),
                                               grpc::InsecureChannelCredentials(), args);
      auto stub = v1::IngestService::NewStub(channel);
      codes[i] = SendAndClose(*stub, big).error_code();
    });
  }
  for (std::thread& t : callers) t.join();
  for (grpc::StatusCode code : codes) CHECK(code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(Refused(d, Hello("small", 1, {0})).ok());
}

TEST_CASE("query and admin calls refuse job ids no job can have, and bad override reasons") {
  Daemon d{sd::DaemonConfig()};
  auto s = Open(d, Hello("ok-job", 2, {0, 1}));
  v1::Job job;
  grpc::Status st = GetJob(*d.query, "no such/job", &job);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(st.error_message(), Catch::StartsWith("job_id 'no such/job' has ' ' at byte 2"));
  // Well-formed: simply not there.
  CHECK(GetJob(*d.query, "no-such-job", &job).error_code() == grpc::StatusCode::NOT_FOUND);
  {
    v1::Membership m;
    st = SetOverride(*d.admin, "ok-job", 1, v1::RANK_OVERRIDE_FORCE_EXCLUDE, "line one\nline two",
                     &m);
    CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(st.error_message(), Catch::Contains("control character 0x0a at byte 8"));
  }
  {
    // The order of the errors: the id first, then the reason, then NOT_FOUND.
    v1::Membership m;
    st = SetOverride(*d.admin, "no such/job", 1, v1::RANK_OVERRIDE_FORCE_EXCLUDE,
                     "line one\nline two", &m);
    CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(st.error_message(), Catch::StartsWith("job_id 'no such/job' has ' ' at byte 2"));
    st = SetOverride(*d.admin, "no-such-job", 1, v1::RANK_OVERRIDE_FORCE_EXCLUDE,
                     "line one\nline two", &m);
    CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(st.error_message(), Catch::Contains("control character 0x0a at byte 8"));
  }
  {
    grpc::ClientContext ctx;
    v1::WatchMembershipRequest req;
    req.set_job_id(std::string(200, 'w'));
    auto reader = d.query->WatchMembership(&ctx, req);
    v1::Membership m;
    CHECK_FALSE(reader->Read(&m));
    st = reader->Finish();
    CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(st.error_message(), Catch::Contains("200 bytes; at most 128"));
  }
}

// http.threads = 2 workers, and four times as many slowloris connections
// (slow_client.h; since the listener reads requests before a worker is
// taken, they hold none). A normal request must still be answered, and the
// slow ones closed and counted.
void CheckSlowClientsCannotHoldWorkers(sd::DaemonConfig config) {
  config.http.threads = 2;
  config.http.read_timeout_seconds = 1;
  config.http.keep_alive_timeout_seconds = 1;
  Daemon d(config);
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> tls(
      d.https ? SSL_CTX_new(TLS_client_method()) : nullptr, &SSL_CTX_free);

  const straggler::testing::SlowlorisOutcome o = straggler::testing::Slowloris(
      d.server.http_port(), tls.get(), /*clients=*/8, [&] {
        auto res = d.Http()->Get("/healthz");
        return res && res->status == 200;
      });
  CHECK(o.connected > 0);
  CHECK(o.served);
  CHECK(o.closed_by_server > 0);
  CHECK(d.Metric("straggler_http_slow_clients_total{phase=\"request\"}") >= 1);
}

TEST_CASE("slow HTTP clients holding every worker do not stop a normal request") {
  CheckSlowClientsCannotHoldWorkers(sd::DaemonConfig());
}

TEST_CASE("slow HTTPS clients holding every worker do not stop a normal request") {
  straggler::testing::TestCertificate cert;
  CheckSlowClientsCannotHoldWorkers(HttpsOnlyConfig(cert));
}

TEST_CASE("HTTP refusals are counted by status in /metrics") {
  Daemon d{sd::DaemonConfig()};
  httplib::Client http("127.0.0.1", d.server.http_port());
  auto res = http.Get("/v1/jobs/bad%20id");
  REQUIRE(res);
  CHECK(res->status == 400);
  CHECK_THAT(res->body, Catch::Contains("job_id 'bad id' has ' ' at byte 3"));
  res = http.Get("/v1/nope");
  REQUIRE(res);
  CHECK(res->status == 404);
  res = http.Delete("/v1/jobs");
  REQUIRE(res);
  CHECK(res->status == 405);
  CHECK(d.MetricOnceAtLeast("straggler_http_rejected_total{code=\"400\"}", 1) == 1);
  CHECK(d.MetricOnceAtLeast("straggler_http_rejected_total{code=\"404\"}", 1) == 1);
  CHECK(d.MetricOnceAtLeast("straggler_http_rejected_total{code=\"405\"}", 1) == 1);
}

TEST_CASE("gRPC refusals of query, admin and rendezvous calls are counted in /metrics") {
  Daemon d{sd::DaemonConfig()};
  auto s = Open(d, Hello("counted", 2, {0, 1}));
  auto refused = [&](const char* service, const char* code) {
    return d.Metric(std::string("straggler_grpc_refused_total{service=\"") + service +
                    "\",code=\"" + code + "\"}");
  };
  // No series before the first refusal.
  CHECK(refused("query", "NOT_FOUND") == -1);
  JobOf(*d.query, "counted");  // served: not counted
  v1::Job job;
  for (const char* id : {"missing", "bad id"}) CHECK_FALSE(GetJob(*d.query, id, &job).ok());
  {
    grpc::ClientContext ctx;  // a watch refused at its start counts too
    v1::WatchMembershipRequest req;
    req.set_job_id("missing");
    auto reader = d.query->WatchMembership(&ctx, req);
    v1::Membership m;
    while (reader->Read(&m)) {
    }
    CHECK(reader->Finish().error_code() == grpc::StatusCode::NOT_FOUND);
  }
  v1::PolicyConfig bad_policy;
  bad_policy.set_threshold_factor(0.5);
  CHECK(SetPolicy(*d.admin, "counted", bad_policy, &job).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
  auto rendezvous = v1::RendezvousService::NewStub(d.channel);
  {
    grpc::ClientContext ctx;
    v1::RendezvousGetRequest req;
    req.set_job_id("counted");
    req.add_keys("unset");
    v1::RendezvousGetResponse resp;
    CHECK(rendezvous->Get(&ctx, req, &resp).error_code() == grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;  // Wait finishes later, outside FinishUnary
    v1::RendezvousWaitRequest req;
    req.set_job_id("counted");
    req.add_keys("never");
    req.mutable_timeout()->set_nanos(20'000'000);
    v1::RendezvousWaitResponse resp;
    CHECK(rendezvous->Wait(&ctx, req, &resp).error_code() ==
          grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  CHECK(refused("query", "NOT_FOUND") == 2);
  CHECK(refused("query", "INVALID_ARGUMENT") == 1);
  CHECK(refused("admin", "INVALID_ARGUMENT") == 1);
  CHECK(refused("rendezvous", "NOT_FOUND") == 1);
  CHECK(refused("rendezvous", "DEADLINE_EXCEEDED") == 1);
  CHECK(refused("query", "OK") == -1);
}

namespace {

// Re-signs `cert`'s certificate with its own key, valid from 2 days ago to
// 1 day ago: expired, otherwise the same.
int64_t MakeExpired(const straggler::testing::TestCertificate& cert) {
  FILE* f = fopen(cert.cert.c_str(), "r");
  REQUIRE(f != nullptr);
  X509* x = PEM_read_X509(f, nullptr, nullptr, nullptr);
  fclose(f);
  f = fopen(cert.key.c_str(), "r");
  REQUIRE(f != nullptr);
  EVP_PKEY* key = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
  fclose(f);
  REQUIRE(x != nullptr);
  REQUIRE(key != nullptr);
  time_t now = time(nullptr);
  REQUIRE(X509_time_adj_ex(X509_getm_notBefore(x), -2, 0, &now) != nullptr);
  REQUIRE(X509_time_adj_ex(X509_getm_notAfter(x), -1, 0, &now) != nullptr);
  REQUIRE(X509_sign(x, key, EVP_sha256()) > 0);
  f = fopen(cert.cert.c_str(), "w");
  REQUIRE(f != nullptr);
  REQUIRE(PEM_write_X509(f, x) == 1);
  fclose(f);
  X509_free(x);
  EVP_PKEY_free(key);
  return static_cast<int64_t>(now) - 86400;
}

}  // namespace

TEST_CASE("an expired certificate starts with a warning and its expiry in /metrics") {
  straggler::testing::TestCertificate cert;
  const int64_t not_after = MakeExpired(cert);
  std::ifstream in(cert.cert);
  std::stringstream pem;
  pem << in.rdbuf();
  auto validity = straggler::common::LeafValidity(pem.str());
  REQUIRE(validity.ok());
  CHECK(validity->not_after == not_after);
  CHECK_THAT(straggler::common::ValidityWarning(*validity, not_after + 10, "tls.cert_file=x"),
             Catch::StartsWith("tls.cert_file=x expired at ") &&
                 Catch::Contains(": clients that verify it refuse every connection"));
  CHECK_THAT(straggler::common::ValidityWarning(*validity, validity->not_before - 10, "c"),
             Catch::StartsWith("c is not valid before "));
  CHECK(straggler::common::ValidityWarning(*validity, not_after - 10, "c").empty());

  sd::DaemonConfig config;
  config.tls.cert_file = cert.cert;
  config.tls.key_file = cert.key;
  Daemon d(config);
  CHECK(d.Metric("straggler_tls_certificate_expiry_seconds") == static_cast<double>(not_after));
  // Without TLS the series is absent.
  Daemon plain{sd::DaemonConfig{}};
  CHECK(plain.Metric("straggler_tls_certificate_expiry_seconds") == -1);
}
