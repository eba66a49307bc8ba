// What a cluster of stragglerd replicas shows (issue 30, item 4;
// docs/cluster.md, docs/metrics.md "Cluster metrics"): each replica's
// /metrics exports the jobs it owns and no other, with the cluster's own
// numbers (replicas, jobs owned, ownership changes, etcd round trips); a
// replica alone exports none of those. Real replicas (in-process Servers on
// loopback) on a real etcd.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <optional>
#include <string>

#include "absl/strings/numbers.h"
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

}  // namespace
}  // namespace straggler::daemon
