// REST on stragglerd replicas (issue 30, docs/api.md "Replicas"): a call
// about a job another replica owns is answered 307 to the owner's HTTP
// address (the one it registered, straggler-owner-http), so an admin PUT or
// POST followed there changes the job on its owner.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <memory>
#include <string>

#include "daemon_test_util.h"
#include "etcd_catch.h"
#include "replica_test_util.h"

namespace straggler::daemon {
namespace {

using cluster::testing::RequireEtcd;
using testutil::LoopbackDaemon;
using testutil::kSteadyLeaseSeconds;
using testutil::ReplicaConfig;
using testutil::TakeWithHello;

std::unique_ptr<httplib::Client> Http(const LoopbackDaemon& d, bool follow) {
  auto http = std::make_unique<httplib::Client>(
      "http://127.0.0.1:" + std::to_string(d.server.http_port()));
  http->set_follow_location(follow);
  http->set_read_timeout(20);
  return http;
}

TEST_CASE("rest: changes of another replica's job are redirected (307) to the owner's HTTP "
          "address, reads are forwarded",
          "[cluster]") {
  auto etcd = RequireEtcd();
  LoopbackDaemon owner(ReplicaConfig(etcd->endpoint(), "ra", kSteadyLeaseSeconds));
  LoopbackDaemon other(ReplicaConfig(etcd->endpoint(), "rb", kSteadyLeaseSeconds));
  TakeWithHello(owner, "job-rest");
  const std::string owner_url = "http://" + owner.server.http_address();

  SECTION("an admin call: 307 with the owner's address; followed, it changes the job there") {
    const std::string body = R"({"limit": 7})";
    auto moved = Http(other, false)->Put("/v1/jobs/job-rest/policy", body, "application/json");
    REQUIRE(moved);
    CHECK(moved->status == 307);
    CHECK(moved->get_header_value("Location") == owner_url + "/v1/jobs/job-rest/policy");
    CHECK(moved->get_header_value("Straggler-Owner-Id") == "ra");
    CHECK_THAT(moved->body, Catch::Contains("UNAVAILABLE"));

    auto done = Http(other, true)->Put("/v1/jobs/job-rest/policy", body, "application/json");
    REQUIRE(done);
    CHECK(done->status == 200);
    auto job = Http(owner, false)->Get("/v1/jobs/job-rest");
    REQUIRE(job);
    CHECK_THAT(job->body, Catch::Contains("\"limit\":7"));

    auto reset = Http(other, false)->Post("/v1/jobs/job-rest/reset", "", "application/json");
    REQUIRE(reset);
    CHECK(reset->status == 307);
    auto override_rank = Http(other, true)->Put("/v1/jobs/job-rest/workers/1/override",
                                                R"({"override": "force_exclude"})",
                                                "application/json");
    REQUIRE(override_rank);
    CHECK(override_rank->status == 200);
  }
  SECTION("a query about one job: answered from the owner (forwarded), no redirect; the list "
          "of jobs: every replica's") {
    auto read = Http(other, false)->Get("/v1/jobs/job-rest/workers?");
    REQUIRE(read);
    CHECK(read->status == 200);
    CHECK(read->get_header_value("Location").empty());
    CHECK_THAT(read->body, Catch::Contains("\"rank\""));
    auto membership = Http(other, false)->Get("/v1/jobs/job-rest/membership");
    REQUIRE(membership);
    CHECK(membership->status == 200);
    auto jobs = Http(other, false)->Get("/v1/jobs");
    REQUIRE(jobs);
    CHECK(jobs->status == 200);
    CHECK_THAT(jobs->body, Catch::Contains("job-rest"));
  }
  SECTION("a job nobody owns is answered as alone") {
    auto missing = Http(other, false)->Get("/v1/jobs/job-nobody");
    REQUIRE(missing);
    CHECK(missing->status == 404);
    auto admin = Http(other, false)->Post("/v1/jobs/job-nobody/reset", "", "application/json");
    REQUIRE(admin);
    CHECK(admin->status == 404);
  }
}

}  // namespace
}  // namespace straggler::daemon
