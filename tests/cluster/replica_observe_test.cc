// What a cluster of stragglerd replicas shows (issue 30, item 4;
// docs/cluster.md, docs/metrics.md "Cluster metrics"): each replica's
// /metrics exports the jobs it owns and no other, with the cluster's own
// numbers (replicas, jobs owned, ownership changes, etcd round trips); a
// replica alone exports none of those. Queries (gRPC and REST) on any
// replica answer for every job: forwarded to the owner, a watch redirected.
// Real replicas (in-process Servers on loopback) on a real etcd.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <optional>
#include <string>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/numbers.h"
#include "auth/auth.h"
#include "etcd_catch.h"
#include "replica_test_util.h"
#include "server/cluster_member.h"

namespace straggler::daemon {
namespace {

using namespace std::chrono_literals;
using cluster::testing::PollUntil;
using cluster::testing::RequireEtcd;
using testutil::LoopbackDaemon;
using testutil::ReplicaConfig;
using testutil::SendHello;
using testutil::Trailing;

std::string Scrape(const LoopbackDaemon& d) {
  httplib::Client http("127.0.0.1", d.server.http_port());
  auto res = http.Get("/metrics");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  return res->body;
}

// The value of the sample written exactly as `series` (name and labels),
// nullopt when the scrape has no such line.
std::optional<double> Sample(const std::string& text, const std::string& series) {
  const std::string at = "\n" + series + " ";
  const size_t i = text.find(at);
  if (i == std::string::npos) return std::nullopt;
  const size_t start = i + at.size();
  double v = 0;
  if (!absl::SimpleAtod(text.substr(start, text.find('\n', start) - start), &v)) return std::nullopt;
  return v;
}

TEST_CASE("replicas: each replica's /metrics exports the jobs it owns and the cluster's numbers",
          "[cluster]") {
  auto etcd = RequireEtcd();
  LoopbackDaemon a(ReplicaConfig(etcd->endpoint(), "ra"));
  LoopbackDaemon b(ReplicaConfig(etcd->endpoint(), "rb"));
  REQUIRE(SendHello(*a.ingest, "job-a").acked);
  REQUIRE(SendHello(*b.ingest, "job-b").acked);
  // Redirected, not taken: a hello for b's job at a changes nothing at a.
  CHECK_FALSE(SendHello(*a.ingest, "job-b").status.ok());

  // Each replica's view has seen the other register.
  REQUIRE(PollUntil(5s, [&] {
    return Sample(Scrape(a), "straggler_cluster_replicas") == 2.0 &&
           Sample(Scrape(b), "straggler_cluster_replicas") == 2.0;
  }));
  const std::string at_a = Scrape(a);
  const std::string at_b = Scrape(b);
  // Each job once, on its owner.
  CHECK(Sample(at_a, "straggler_job_ranks{job=\"job-a\"}") == 4.0);
  CHECK_FALSE(Sample(at_a, "straggler_job_ranks{job=\"job-b\"}"));
  CHECK(Sample(at_b, "straggler_job_ranks{job=\"job-b\"}") == 4.0);
  CHECK_FALSE(Sample(at_b, "straggler_job_ranks{job=\"job-a\"}"));
  CHECK(Sample(at_a, "straggler_jobs") == 1.0);

  CHECK(Sample(at_a, "straggler_cluster_replica_info{replica_id=\"ra\"}") == 1.0);
  CHECK(Sample(at_b, "straggler_cluster_replica_info{replica_id=\"rb\"}") == 1.0);
  CHECK(Sample(at_a, "straggler_cluster_jobs_owned") == 1.0);
  CHECK(Sample(at_a, "straggler_cluster_may_decide") == 1.0);
  CHECK(Sample(at_a, "straggler_cluster_ownership_changes_total{change=\"taken\"}") == 1.0);
  CHECK(Sample(at_a, "straggler_cluster_ownership_changes_total{change=\"lost\"}") == 0.0);
  // The join, the takes and the renewals went to etcd and came back.
  const std::optional<double> calls = Sample(at_a, "straggler_cluster_etcd_requests_total");
  REQUIRE(calls);
  CHECK(*calls >= 3);
  CHECK(Sample(at_a, "straggler_cluster_etcd_errors_total") == 0.0);
  CHECK(Sample(at_a, "straggler_cluster_etcd_streams_broken_total").has_value());
  const std::optional<double> observed =
      Sample(at_a, "straggler_cluster_etcd_round_trip_seconds_count");
  REQUIRE(observed);
  CHECK(*observed >= 3);
  CHECK(Sample(at_a, "straggler_cluster_etcd_round_trip_seconds_bucket{le=\"+Inf\"}") == *observed);

  SECTION("a replica that left owns nothing; the other takes its job and counts it") {
    a.server.Shutdown(0ms);
    REQUIRE(PollUntil(5s, [&] { return SendHello(*b.ingest, "job-a").acked; }));
    const std::string after = Scrape(b);
    CHECK(Sample(after, "straggler_job_ranks{job=\"job-a\"}") == 4.0);
    CHECK(Sample(after, "straggler_cluster_jobs_owned") == 2.0);
    CHECK(Sample(after, "straggler_cluster_ownership_changes_total{change=\"taken\"}") == 2.0);
    REQUIRE(PollUntil(5s, [&] { return Sample(Scrape(b), "straggler_cluster_replicas") == 1.0; }));
  }
}

TEST_CASE("replicas: a daemon alone exports no straggler_cluster_ family", "[cluster]") {
  LoopbackDaemon alone;
  REQUIRE(SendHello(*alone.ingest, "job-alone").acked);
  const std::string text = Scrape(alone);
  CHECK(Sample(text, "straggler_job_ranks{job=\"job-alone\"}") == 4.0);
  CHECK(text.find("straggler_cluster_") == std::string::npos);
}

template <class Msg>
Msg FromJson(const std::string& json) {
  Msg m;
  REQUIRE(google::protobuf::util::JsonStringToMessage(json, &m).ok());
  return m;
}

TEST_CASE("replicas: any replica answers queries about every job, from its owner", "[cluster]") {
  auto etcd = RequireEtcd();
  LoopbackDaemon a(ReplicaConfig(etcd->endpoint(), "ra"));
  LoopbackDaemon b(ReplicaConfig(etcd->endpoint(), "rb"));
  testutil::FeedRank3Slower(*a.ingest, "job-q", 4);  // a owns it; rank 3 excluded
  REQUIRE(SendHello(*b.ingest, "job-b").acked);
  const v1::Membership at_owner = testutil::MembershipOf(*a.query, "job-q");
  REQUIRE(at_owner.excluded_size() == 1);
  // b's view has seen a take the job.
  REQUIRE(PollUntil(5s, [&] { return b.server.cluster()->OwnerElsewhere("job-q").has_value(); }));

  SECTION("gRPC") {
    grpc::ClientContext ctx;
    v1::GetJobRequest get;
    get.set_job_id("job-q");
    v1::Job job;
    REQUIRE(b.query->GetJob(&ctx, get, &job).ok());
    CHECK(job.world_size() == 4);
    CHECK(job.owner().id() == "ra");
    CHECK(job.owner().grpc_address() == a.server.grpc_address());
    CHECK(job.owner().http_address() == a.server.http_address());
    CHECK(job.membership().version() == at_owner.version());
    CHECK(testutil::MembershipOf(*b.query, "job-q").version() == at_owner.version());
    const v1::Worker rank3 = testutil::WorkerOf(*b.query, "job-q", 3);
    CHECK(rank3.state() == v1::WORKER_STATE_STRAGGLER);
    CHECK(rank3.excluded());

    grpc::ClientContext list_ctx;
    v1::ListJobsResponse list;
    REQUIRE(b.query->ListJobs(&list_ctx, v1::ListJobsRequest(), &list).ok());
    REQUIRE(list.jobs_size() == 2);
    CHECK(list.jobs(0).job_id() == "job-b");
    CHECK(list.jobs(0).owner().id() == "rb");
    CHECK(list.jobs(1).job_id() == "job-q");
    CHECK(list.jobs(1).owner().id() == "ra");

    // The owner's journal: the exclusion of rank 3.
    grpc::ClientContext events_ctx;
    v1::ListEventsRequest events;
    events.set_job_id("job-q");
    v1::ListEventsResponse journal;
    REQUIRE(b.query->ListEvents(&events_ctx, events, &journal).ok());
    CHECK(journal.events_size() > 0);

    // A job nobody owns is answered as alone.
    grpc::ClientContext missing_ctx;
    get.set_job_id("job-nobody");
    CHECK(b.query->GetJob(&missing_ctx, get, &job).error_code() == grpc::StatusCode::NOT_FOUND);

    // A watch is a stream: redirected to the owner, not forwarded.
    grpc::ClientContext watch_ctx;
    v1::WatchMembershipRequest watch;
    watch.set_job_id("job-q");
    auto reader = b.query->WatchMembership(&watch_ctx, watch);
    v1::Membership m;
    CHECK_FALSE(reader->Read(&m));
    CHECK(reader->Finish().error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK(Trailing(watch_ctx, kOwnerGrpcMetadata) == a.server.grpc_address());
  }
  SECTION("REST and the console's calls") {
    httplib::Client http("127.0.0.1", b.server.http_port());
    auto res = http.Get("/v1/jobs");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    auto list = FromJson<v1::ListJobsResponse>(res->body);
    REQUIRE(list.jobs_size() == 2);
    CHECK(list.jobs(1).owner().http_address() == a.server.http_address());
    res = http.Get("/v1/jobs/job-q/workers/3");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    CHECK(FromJson<v1::Worker>(res->body).state() == v1::WORKER_STATE_STRAGGLER);
    res = http.Get("/v1/jobs/job-q/reports");
    REQUIRE(res);
    CHECK(res->status == 200);
  }
  SECTION("an owner that left: its jobs are nobody's until taken") {
    a.server.Shutdown(0ms);
    REQUIRE(PollUntil(5s, [&] { return !b.server.cluster()->OwnerElsewhere("job-q"); }));
    grpc::ClientContext ctx;
    v1::ListJobsResponse list;
    REQUIRE(b.query->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
    REQUIRE(list.jobs_size() == 1);
    CHECK(list.jobs(0).job_id() == "job-b");
  }
}

TEST_CASE("replicas: a forwarded query carries the caller's token to the owner", "[cluster]") {
  auto etcd = RequireEtcd();
  auto with_token = [&](const std::string& id) {
    DaemonConfig c = ReplicaConfig(etcd->endpoint(), id);
    c.auth.token_file = "/etc/stragglerd/token";
    c.auth.token_sha256 = TokenDigest("s3cret");
    c.auth.protect_reads = true;
    return c;
  };
  LoopbackDaemon a(with_token("ra"));
  LoopbackDaemon b(with_token("rb"));
  REQUIRE(SendHello(*a.ingest, "job-t").acked);
  REQUIRE(PollUntil(5s, [&] { return b.server.cluster()->OwnerElsewhere("job-t").has_value(); }));
  httplib::Client http("127.0.0.1", b.server.http_port());
  auto res = http.Get("/v1/jobs/job-t", {{"Authorization", "Bearer s3cret"}});
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(FromJson<v1::Job>(res->body).owner().id() == "ra");
  res = http.Get("/v1/jobs/job-t", {{"Authorization", "Bearer wrong"}});
  REQUIRE(res);
  CHECK(res->status == 401);
}

}  // namespace
}  // namespace straggler::daemon
