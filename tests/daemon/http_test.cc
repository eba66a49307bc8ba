// The HTTP front end over real HTTP on loopback: the daemon (gRPC and HTTP
// on 127.0.0.1:0) fed through a real IngestService stream, then /healthz,
// /readyz, /metrics and every REST endpoint with httplib::Client; JSON
// bodies are parsed back into the protos. Plus readiness phases and the
// status mapping on their own.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "auth/auth.h"
#include "config/config.h"
#include "daemon_test_util.h"
#include "http/http_server.h"
#include "registry/job_registry.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "metrics/stats.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;
using namespace straggler::daemon::testutil;

namespace {

constexpr char kJob[] = "train.a-1_b";
constexpr uint32_t kWorld = 4;

template <class Msg>
Msg FromJson(const std::string& body) {
  Msg msg;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto s = google::protobuf::util::JsonStringToMessage(body, &msg, options);
  INFO(body);
  REQUIRE(s.ok());
  return msg;
}

// {"code":"...","message":"..."}: parsed with the Struct JSON mapping.
std::pair<std::string, std::string> ErrorOf(const httplib::Result& res) {
  REQUIRE(res);
  CHECK(res->get_header_value("Content-Type") == "application/json");
  auto s = FromJson<google::protobuf::Struct>(res->body);
  CHECK(s.fields_size() == 2);
  return {s.fields().at("code").string_value(), s.fields().at("message").string_value()};
}

// The reason `rank` is excluded, UNSPECIFIED when it takes part.
v1::ExclusionReason ExclusionOf(const v1::Membership& m, uint32_t rank) {
  for (const auto& e : m.excluded()) {
    if (e.rank() == rank) return e.reason();
  }
  return v1::EXCLUSION_REASON_UNSPECIFIED;
}

struct Fixture : LoopbackDaemon {
  Fixture() {
    REQUIRE(server.http_port() > 0);
    CHECK(server.http_address() == "127.0.0.1:" + std::to_string(server.http_port()));
    CHECK(server.http_dial_address() == server.http_address());
    http = std::make_unique<httplib::Client>("127.0.0.1", server.http_port());
    http->set_read_timeout(10, 0);
    Feed();
    // The server detaches a finished stream on its own thread (OnDone), maybe
    // after Finish returned here: wait for it, so `streams` reads 0.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      auto res = http->Get((std::string("/v1/jobs/") + kJob).c_str());
      REQUIRE(res);
      REQUIRE(res->status == 200);
      v1::Job job;
      REQUIRE(google::protobuf::util::JsonStringToMessage(res->body, &job).ok());
      if (job.streams() == 0) break;
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // One stream speaking for every rank: 12 iterations, rank 3 a straggler at
  // iteration 10, then excluded (AddRank3Slower).
  void Feed() { FeedRank3Slower(*ingest, kJob, kWorld); }

  // An open stream speaking for every rank (hello only), so the job's
  // membership changes can go out (JobEngine "Membership gate"); closed by
  // its destructor.
  struct Listener {
    explicit Listener(const std::shared_ptr<grpc::Channel>& channel)
        : stub(v1::IngestService::NewStub(channel)), stream(stub->Stream(&ctx)) {
      v1::ReportBatch b = Hello(kJob, kWorld, {0, 1, 2, 3}, "node-a");
      b.set_sequence(1);
      REQUIRE(stream->Write(b));
      ReadAck(*stream, 1);
    }
    ~Listener() { Close(*stream); }
    std::unique_ptr<v1::IngestService::Stub> stub;
    grpc::ClientContext ctx;
    std::unique_ptr<IngestStream> stream;
  };

  std::unique_ptr<httplib::Client> http;
};

}  // namespace

TEST_CASE("http: health, readiness and the metrics exposition") {
  Fixture f;
  auto res = f.http->Get("/healthz");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->body == "ok");

  res = f.http->Get("/readyz");
  REQUIRE(res);
  CHECK(res->status == 200);

  res = f.http->Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == "text/plain; version=0.0.4; charset=utf-8");
  const std::string& text = res->body;
  for (const char* family :
       {"# TYPE straggler_build_info gauge\n", "# TYPE straggler_jobs gauge\n",
        "# TYPE straggler_active_streams gauge\n",
        "# TYPE straggler_reports_accepted_total counter\n",
        "# TYPE straggler_reports_rejected_total counter\n",
        "# TYPE straggler_events_total counter\n",
        "# TYPE straggler_ingest_batch_duration_seconds histogram\n",
        "# TYPE straggler_job_ranks gauge\n", "# TYPE straggler_job_reports_total counter\n",
        "# TYPE straggler_job_detection_latency_iterations histogram\n",
        "# TYPE straggler_rank_compute_seconds gauge\n", "# TYPE straggler_rank_state gauge\n",
        "# TYPE process_cpu_seconds_total counter\n",
        "# TYPE process_resident_memory_bytes gauge\n"}) {
    CHECK_THAT(text, Catch::Contains(family));
  }
  CHECK_THAT(text, Catch::Contains("straggler_build_info{version=\"" STRAGGLERD_VERSION "\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_jobs 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_reports_accepted_total 48\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_ranks{job=\"train.a-1_b\"} 4\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_reports_total{job=\"train.a-1_b\"} 48\n"));
  CHECK_THAT(text, Catch::Contains("# TYPE straggler_job_reports_late_total counter\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_streams{job=\"train.a-1_b\"} 0\n"));
  CHECK_THAT(text, Catch::Contains("straggler_ingest_batch_duration_seconds_count 1\n"));
  CHECK_THAT(text, Catch::Contains(
                       "straggler_rank_compute_seconds{job=\"train.a-1_b\",rank=\"3\",node=\"node-a\",peer_group=\"\",replica=\"\"} 0.3\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_state{job=\"train.a-1_b\",rank=\"3\",node=\"node-a\",peer_group=\"\",replica=\"\","
                                   "state=\"straggler\"} 1\n"));
  CHECK_THAT(text, Catch::Contains(
                       "straggler_rank_excluded{job=\"train.a-1_b\",rank=\"3\",node=\"node-a\",peer_group=\"\",replica=\"\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_detections_total{job=\"train.a-1_b\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_excluded_ranks{job=\"train.a-1_b\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_threshold_seconds{job=\"train.a-1_b\"} 0.2\n"));
  // Detected at iteration 10, slow from 6: 5 iterations, in the le="5" bucket.
  CHECK_THAT(text, Catch::Contains(
                       "straggler_job_detection_latency_iterations_bucket{job=\"train.a-1_b\",le=\"3\"} 0\n"
                       "straggler_job_detection_latency_iterations_bucket{job=\"train.a-1_b\",le=\"5\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_detection_latency_iterations_count{job=\"train.a-1_b\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_events_total{kind=\"state_change\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_state{job=\"train.a-1_b\",rank=\"0\",node=\"node-a\",peer_group=\"\",replica=\"\","
                                   "state=\"healthy\"} 1\n"));

  // HEAD: the headers of GET, no body.
  res = f.http->Head("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->body.empty());
}

TEST_CASE("http: every REST GET answers the proto3 JSON of the gRPC message") {
  Fixture f;
  const std::string job = std::string("/v1/jobs/") + kJob;

  auto res = f.http->Get("/v1/jobs");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == "application/json");
  auto jobs = FromJson<v1::ListJobsResponse>(res->body);
  REQUIRE(jobs.jobs_size() == 1);
  CHECK(jobs.jobs(0).job_id() == kJob);
  // lowerCamelCase names, zero values printed.
  CHECK_THAT(res->body, Catch::Contains("\"worldSize\":4"));
  CHECK_THAT(res->body, Catch::Contains("\"streams\":0"));

  res = f.http->Get(job.c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  auto j = FromJson<v1::Job>(res->body);
  CHECK(j.job_id() == kJob);
  CHECK(j.world_size() == kWorld);
  CHECK(j.reports_total() == 48);
  CHECK(j.policy().threshold_factor() == 2.0);
  CHECK(j.highest_iteration() == 12);

  // The id percent-encoded in the path is the same job.
  res = f.http->Get("/v1/jobs/train%2Ea-1%5Fb");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(FromJson<v1::Job>(res->body).job_id() == kJob);

  res = f.http->Get((job + "/workers").c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  auto workers = FromJson<v1::ListWorkersResponse>(res->body);
  REQUIRE(workers.workers_size() == static_cast<int>(kWorld));
  for (uint32_t r = 0; r < kWorld; ++r) {
    CHECK(workers.workers(r).rank() == r);
    CHECK(workers.workers(r).node() == "node-a");
    CHECK(workers.workers(r).last_iteration() == 12);
  }

  res = f.http->Get((job + "/workers/3").c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  auto w = FromJson<v1::Worker>(res->body);
  CHECK(w.job_id() == kJob);
  CHECK(w.rank() == 3);
  CHECK(w.last_compute_seconds() == 0.3);
  CHECK(w.state() == v1::WORKER_STATE_STRAGGLER);
  CHECK(w.excluded());
  CHECK(w.reports_total() == 12);

  res = f.http->Get((job + "/membership").c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  auto m = FromJson<v1::Membership>(res->body);
  CHECK(m.job_id() == kJob);
  CHECK(m.world_size() == kWorld);
  REQUIRE(m.excluded_size() == 1);
  CHECK(m.excluded(0).rank() == 3);
  CHECK(m.excluded(0).reason() == v1::EXCLUSION_REASON_STRAGGLER);
  {
    // The very message gRPC returns: one core behind both.
    grpc::ClientContext ctx;
    v1::GetMembershipRequest req;
    req.set_job_id(kJob);
    v1::Membership via_grpc;
    REQUIRE(f.query->GetMembership(&ctx, req, &via_grpc).ok());
    CHECK(google::protobuf::util::MessageDifferencer::Equals(m, via_grpc));
  }

  res = f.http->Get((job + "/events").c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  auto events = FromJson<v1::ListEventsResponse>(res->body);
  REQUIRE(events.events_size() >= 2);  // the detection and the membership
  for (const auto& e : events.events()) CHECK(e.job_id() == kJob);
  const uint64_t first = events.events(0).sequence();

  res = f.http->Get((job + "/events?since=" + std::to_string(first) + "&limit=1").c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  auto page = FromJson<v1::ListEventsResponse>(res->body);
  for (const auto& e : page.events()) CHECK(e.sequence() > first);
  CHECK(page.events_size() <= 1);

  res = f.http->Get((job + "/events?since_time=2000-01-01T00:00:00Z").c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(FromJson<v1::ListEventsResponse>(res->body).events_size() == events.events_size());
  res = f.http->Get((job + "/events?since_time=2999-01-01T00:00:00%2B02:00").c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(FromJson<v1::ListEventsResponse>(res->body).events_size() == 0);

  res = f.http->Get("/v1/events?limit=1000");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(FromJson<v1::ListEventsResponse>(res->body).events_size() == events.events_size());
}

TEST_CASE("http: GET /v1/jobs/{job}/reports is ExportReports") {
  Fixture f;
  const std::string job = std::string("/v1/jobs/") + kJob;
  auto res = f.http->Get((job + "/reports").c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  auto all = FromJson<v1::ExportReportsResponse>(res->body);
  CHECK(all.reports_size() == 48);
  CHECK(all.dropped_before() == 0);

  res = f.http->Get((job + "/reports?since_iteration=11&limit=5").c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  auto page = FromJson<v1::ExportReportsResponse>(res->body);
  REQUIRE(page.reports_size() == 5);
  CHECK(page.reports(0).iteration() == 11);
  CHECK(page.reports(0).rank() == 0);
  CHECK(page.reports(4).iteration() == 12);
  CHECK(page.reports(4).rank() == 0);
  CHECK(page.reports(3).compute_seconds() == 0.3);

  res = f.http->Get((job + "/reports?limit=x").c_str());
  REQUIRE(res);
  CHECK(res->status == 400);
  res = f.http->Get((job + "/reports?since=1").c_str());
  REQUIRE(res);
  CHECK(res->status == 400);
  res = f.http->Get("/v1/jobs/nope/reports");
  REQUIRE(res);
  CHECK(res->status == 404);
}

TEST_CASE("http: errors are JSON with the right status") {
  Fixture f;
  const std::string job = std::string("/v1/jobs/") + kJob;
  const std::string huge(2 * 1024 * 1024, ' ');
  // One refused request each: method, path, body (PUT/POST), the status, and
  // when given the error's code, a part of its message, and the Allow header.
  struct Case {
    std::string method, path, body;
    int status;
    std::string code = "", message = "", allow = "";
  };
  const std::vector<Case> cases = {
      {"GET", "/v1/jobs/nope", "", 404, "NOT_FOUND", "job 'nope' not found"},
      {"GET", "/v1/jobs/nope/workers", "", 404},
      {"GET", job + "/workers/9", "", 404, "", "rank 9 not found: job 'train.a-1_b' has world_size 4"},
      {"GET", job + "/workers/abc", "", 400, "INVALID_ARGUMENT",
       "rank 'abc' is not a non-negative integer"},
      {"GET", job + "/workers/-1", "", 400},
      {"GET", job + "/workers/99999999999", "", 400},
      {"GET", "/v1/nothing/here", "", 404, "NOT_FOUND"},
      {"GET", "/v1/jobs/", "", 404},
      {"DELETE", "/v1/jobs", "", 405, "METHOD_NOT_ALLOWED", "", "GET, HEAD"},
      {"GET", job + "/policy", "", 405, "", "", "PUT"},
      {"POST", job + "/workers/1", "{}", 405},
      {"PUT", job + "/policy", huge, 413, "PAYLOAD_TOO_LARGE"},
      {"PUT", job + "/policy", "{\"limt\": 3}", 400, "", "'limt'"},
      {"PUT", job + "/policy", "{\"limit\": ", 400},
      {"PUT", job + "/policy", "{\"thresholdFactor\": 0.5}", 400, "", "threshold_factor=0.5"},
      {"GET", job + "/events?since=x", "", 400},
      {"GET", job + "/events?since_time=yesterday", "", 400, "", "since_time"},
      {"GET", job + "/events?limit=10001", "", 400},
      {"GET", job + "/events?sinse=1", "", 400, "", "'sinse'"},
      {"PUT", job + "/workers/1/override", "{\"override\":\"sideways\"}", 400},
      {"PUT", job + "/workers/4/override", "{\"override\":\"force_exclude\"}", 404},
  };
  for (const Case& c : cases) {
    INFO(c.method << " " << c.path);
    httplib::Result res = c.method == "GET"      ? f.http->Get(c.path.c_str())
                          : c.method == "DELETE" ? f.http->Delete(c.path.c_str())
                          : c.method == "POST"
                              ? f.http->Post(c.path.c_str(), c.body, "application/json")
                              : f.http->Put(c.path.c_str(), c.body, "application/json");
    REQUIRE(res);
    CHECK(res->status == c.status);
    if (!c.code.empty()) CHECK(ErrorOf(res).first == c.code);
    if (!c.message.empty()) CHECK_THAT(ErrorOf(res).second, Catch::Contains(c.message));
    if (!c.allow.empty()) CHECK(res->get_header_value("Allow") == c.allow);
  }
  // The whole message, where it is known.
  CHECK(ErrorOf(f.http->Get("/v1/jobs/nope")) ==
        std::make_pair(std::string("NOT_FOUND"), std::string("job 'nope' not found")));
}

TEST_CASE("http: admin calls change the job") {
  Fixture f;
  const std::string job = std::string("/v1/jobs/") + kJob;

  // A partial policy: only the fields given change.
  auto res = f.http->Put((job + "/policy").c_str(), "{\"limit\": 9, \"kind\": \"POLICY_KIND_EWMA\"}",
                        "application/json");
  REQUIRE(res);
  CHECK(res->status == 200);
  auto j = FromJson<v1::Job>(res->body);
  CHECK(j.policy().limit() == 9);
  CHECK(j.policy().kind() == v1::POLICY_KIND_EWMA);
  CHECK(j.policy().threshold_factor() == 2.0);
  res = f.http->Get(job.c_str());
  REQUIRE(res);
  CHECK(FromJson<v1::Job>(res->body).policy().limit() == 9);

  res = f.http->Put((job + "/workers/2/override").c_str(),
                   "{\"override\":\"RANK_OVERRIDE_FORCE_EXCLUDE\",\"reason\":\"bad gpu\"}",
                   "application/json");
  REQUIRE(res);
  CHECK(res->status == 200);
  // The feeding stream is closed: no rank could hear a new version, so the
  // change waits (the membership gate) and the job says so.
  const auto before = FromJson<v1::Membership>(res->body);
  CHECK(ExclusionOf(before, 2) == v1::EXCLUSION_REASON_UNSPECIFIED);
  res = f.http->Get(job.c_str());
  REQUIRE(res);
  CHECK(FromJson<v1::Job>(res->body).membership_withheld());
  CHECK(FromJson<v1::Job>(res->body).detached_ranks() == kWorld);
  // Once a stream speaks for the ranks again it goes out.
  Fixture::Listener listener(f.channel);
  res = f.http->Get(job.c_str());
  REQUIRE(res);
  auto m = FromJson<v1::Job>(res->body).membership();
  CHECK_FALSE(FromJson<v1::Job>(res->body).membership_withheld());
  CHECK(m.version() > before.version());
  CHECK(ExclusionOf(m, 2) == v1::EXCLUSION_REASON_FORCED);
  CHECK(ExclusionOf(m, 3) == v1::EXCLUSION_REASON_STRAGGLER);  // detected while fed
  res = f.http->Get((job + "/membership").c_str());
  REQUIRE(res);
  auto current = FromJson<v1::Membership>(res->body);
  CHECK(ExclusionOf(current, 2) == v1::EXCLUSION_REASON_FORCED);
  CHECK(current.version() == m.version());

  // Short alias; clearing the override includes the rank again.
  res = f.http->Put((job + "/workers/2/override").c_str(), "{\"override\":\"none\"}",
                   "application/json");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(ExclusionOf(FromJson<v1::Membership>(res->body), 2) == v1::EXCLUSION_REASON_UNSPECIFIED);
  res = f.http->Put((job + "/workers/1/override").c_str(), "{\"override\":\"force_exclude\"}",
                   "application/json");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(ExclusionOf(FromJson<v1::Membership>(res->body), 1) == v1::EXCLUSION_REASON_FORCED);

  res = f.http->Post((job + "/reset").c_str(), "", "application/json");
  REQUIRE(res);
  CHECK(res->status == 200);
  auto reset = FromJson<v1::Job>(res->body);
  CHECK(reset.job_id() == kJob);
  CHECK(reset.membership().version() > m.version());
  res = f.http->Post((job + "/reset").c_str(), "{}", "application/json");
  REQUIRE(res);
  CHECK(res->status == 200);
  res = f.http->Post("/v1/jobs/nope/reset", "", "application/json");
  REQUIRE(res);
  CHECK(res->status == 404);

  // The admin calls were journaled.
  res = f.http->Get((job + "/events").c_str());
  REQUIRE(res);
  bool policy = false, override_ = false, reset_ = false, withheld = false;
  const auto journal = FromJson<v1::ListEventsResponse>(res->body);
  for (const auto& e : journal.events()) {
    policy |= e.kind() == v1::EVENT_KIND_POLICY_CHANGED;
    override_ |= e.kind() == v1::EVENT_KIND_OVERRIDE;
    reset_ |= e.kind() == v1::EVENT_KIND_RESET;
    if (e.kind() == v1::EVENT_KIND_MEMBERSHIP_WITHHELD) {
      withheld = true;
      CHECK_THAT(e.message(), Catch::Contains("no stream speaks for ranks 0, 1, 2;"));
    }
  }
  CHECK(policy);
  CHECK(override_);
  CHECK(reset_);
  CHECK(withheld);
}

TEST_CASE("http: a rank is detached only when its last stream ends") {
  Fixture f;
  const std::string job = std::string("/v1/jobs/") + kJob;
  auto detached = [&] {
    auto res = f.http->Get(job.c_str());
    REQUIRE(res);
    REQUIRE(res->status == 200);
    return FromJson<v1::Job>(res->body).detached_ranks();
  };
  // The fixture's feeding stream has ended (streams == 0).
  CHECK(detached() == kWorld);
  auto first = std::make_unique<Fixture::Listener>(f.channel);
  CHECK(detached() == 0);
  // A reconnect overlaps: the new stream attaches before the old one ends.
  Fixture::Listener second(f.channel);
  first.reset();
  // The server detaches a finished stream on its own thread (OnDone): wait
  // until it has (streams drops to 1), then the ranks must still be attached.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    auto res = f.http->Get(job.c_str());
    REQUIRE(res);
    if (FromJson<v1::Job>(res->body).streams() == 1) break;
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(detached() == 0);
}

TEST_CASE("http: /readyz follows the phases, REST answers 503 while draining") {
  sd::DaemonStats stats;
  sd::DaemonConfig config;
  config.http_address = "127.0.0.1:0";
  sd::JobRegistry registry(std::make_shared<const sd::DaemonConfig>(config), stats);
  sd::Authorizer auth(config.auth, stats);
  sd::HttpServer server(registry, stats, auth);
  REQUIRE(server.Start(config).ok());
  httplib::Client http("127.0.0.1", server.port());

  auto res = http.Get("/readyz");
  REQUIRE(res);
  CHECK(res->status == 503);
  CHECK(res->body == "starting");
  server.SetPhase(sd::HttpServer::Phase::kServing);
  res = http.Get("/readyz");
  REQUIRE(res);
  CHECK(res->status == 200);
  res = http.Get("/v1/jobs");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->body == "{\"jobs\":[]}\n");

  server.SetPhase(sd::HttpServer::Phase::kDraining);
  res = http.Get("/readyz");
  REQUIRE(res);
  CHECK(res->status == 503);
  CHECK(res->body == "draining");
  res = http.Get("/v1/jobs");
  REQUIRE(res);
  CHECK(res->status == 503);
  CHECK(ErrorOf(res).first == "UNAVAILABLE");
  res = http.Get("/healthz");
  REQUIRE(res);
  CHECK(res->status == 200);
  res = http.Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  server.Stop();
}

TEST_CASE("http: a port in use is an error, not a shared port") {
  sd::DaemonStats stats;
  sd::DaemonConfig config;
  config.http_address = "127.0.0.1:0";
  sd::JobRegistry registry(std::make_shared<const sd::DaemonConfig>(config), stats);
  sd::Authorizer auth(config.auth, stats);
  sd::HttpServer first(registry, stats, auth);
  REQUIRE(first.Start(config).ok());
  config.http_address = first.address();
  sd::HttpServer second(registry, stats, auth);
  absl::Status s = second.Start(config);
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(s.message()), Catch::Contains(first.address()));
}

TEST_CASE("http: status mapping and path decoding") {
  CHECK(sd::HttpStatusFor(absl::StatusCode::kOk) == 200);
  CHECK(sd::HttpStatusFor(absl::StatusCode::kInvalidArgument) == 400);
  CHECK(sd::HttpStatusFor(absl::StatusCode::kFailedPrecondition) == 400);
  CHECK(sd::HttpStatusFor(absl::StatusCode::kOutOfRange) == 400);
  CHECK(sd::HttpStatusFor(absl::StatusCode::kNotFound) == 404);
  CHECK(sd::HttpStatusFor(absl::StatusCode::kResourceExhausted) == 429);
  CHECK(sd::HttpStatusFor(absl::StatusCode::kUnavailable) == 503);
  CHECK(sd::HttpStatusFor(absl::StatusCode::kInternal) == 500);
  CHECK(sd::DecodePathSegment("a%2Fb.c-d_e+f") == std::optional<std::string>("a/b.c-d_e+f"));
  CHECK(sd::DecodePathSegment("%41%6a") == std::optional<std::string>("Aj"));
  CHECK_FALSE(sd::DecodePathSegment("a%2"));
  CHECK_FALSE(sd::DecodePathSegment("a%zz"));
  CHECK_FALSE(sd::DecodePathSegment("%"));
}
