// Monitoring only against the real daemon over gRPC and HTTP (issue 28,
// item 3; docs/membership.md, "Monitoring only"): a hello's
// monitor_only_ranks keep a straggler in (no version published), and
// GetWorker, REST and /metrics show it a straggler "monitoring only", not
// excluded; a later hello without the mark (the client started asking for
// membership) lets the daemon exclude it; a mark for a rank the hello does
// not name is refused, naming it.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <string>

#include "daemon_test_util.h"
#include "http_daemon.h"

namespace straggler::daemon {
namespace {

using testutil::AddRank3Slower;
using testutil::AddReport;
using testutil::Hello;
using testutil::HttpDaemon;
using testutil::LoopbackDaemon;
using testutil::MembershipOf;
using testutil::OpenStream;
using testutil::WorkerOf;

constexpr uint32_t kWorld = 4;

// The /metrics sample of `family` for `rank` of job "mon" on node-a.
std::string RankSample(const std::string& family, uint32_t rank) {
  return family + "{job=\"mon\",rank=\"" + std::to_string(rank) +
         "\",node=\"node-a\",peer_group=\"\",replica=\"\"}";
}

bool Has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("monitor_only_excludes: a monitor-only straggler stays in over gRPC, REST and metrics, "
          "a later hello without the mark excludes it",
          "[monitor_only]") {
  HttpDaemon d{DaemonConfig()};
  OpenStream s(*d.ingest);
  v1::ReportBatch b = Hello("mon", kWorld, {0, 1, 2, 3}, "node-a");
  b.mutable_hello()->add_monitor_only_ranks(3);
  AddRank3Slower(b, kWorld);  // rank 3 a straggler at iteration 10
  REQUIRE(s.Send(b, 1).accepted() == 12 * kWorld);

  const v1::Worker w = WorkerOf(*d.query, "mon", 3);
  CHECK(w.state() == v1::WORKER_STATE_STRAGGLER);
  CHECK(w.monitor_only());
  CHECK_FALSE(w.excluded());
  CHECK_FALSE(WorkerOf(*d.query, "mon", 0).monitor_only());
  const v1::Membership m = MembershipOf(*d.query, "mon");
  CHECK(m.version() == 0);
  CHECK(m.excluded_size() == 0);

  auto res = d.Http()->Get("/v1/jobs/mon/workers/3");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  const std::string rest = res->body;
  INFO("REST: " << rest);
  CHECK(Has(rest, "\"state\":\"WORKER_STATE_STRAGGLER\""));
  CHECK(Has(rest, "\"excluded\":false"));
  CHECK(Has(rest, "\"monitorOnly\":true"));
  CHECK(d.Metric(RankSample("straggler_rank_excluded", 3)) == 0);
  CHECK(d.Metric(RankSample("straggler_rank_monitor_only", 3)) == 1);
  CHECK(d.Metric(RankSample("straggler_rank_monitor_only", 0)) == 0);

  // The client asked for membership: its next hello (a later one on the same
  // stream) names no monitor-only rank. Rank 3 is still slow: out it goes.
  v1::ReportBatch later = Hello("mon", kWorld, {0, 1, 2, 3}, "node-a");
  for (uint32_t r = 0; r < kWorld; ++r) AddReport(later, r, 13, r == 3 ? 0.3 : 0.1);
  const v1::Directive ack = s.Send(later, 2);
  CHECK(ack.accepted() == kWorld);
  CHECK(ack.rejections_size() == 0);
  const v1::Worker after = WorkerOf(*d.query, "mon", 3);
  CHECK_FALSE(after.monitor_only());
  CHECK(after.excluded());
  CHECK(after.exclusion_reason() == v1::EXCLUSION_REASON_STRAGGLER);
  CHECK(MembershipOf(*d.query, "mon").version() >= 1);
  CHECK(s.Close().ok());
}

TEST_CASE("monitor_only_excludes: a hello marking a rank it does not name is refused, naming it",
          "[monitor_only]") {
  LoopbackDaemon d(DaemonConfig{}, spdlog::level::err);
  v1::ReportBatch b = Hello("mon-bad", kWorld, {0, 1});
  b.mutable_hello()->add_monitor_only_ranks(2);
  const grpc::Status st = testutil::SendAndClose(*d.ingest, b);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message() ==
        "hello.monitor_only_ranks names rank 2, which is not among the hello's ranks of job "
        "'mon-bad'");
  // Nothing of the job was made.
  v1::Job job;
  CHECK(testutil::GetJob(*d.query, "mon-bad", &job).error_code() == grpc::StatusCode::NOT_FOUND);
}

}  // namespace straggler::daemon
