// QueryService.ExportReports over gRPC on loopback: the per-job ring of
// recent accepted reports (content, (iteration, rank) order, since/limit,
// overflow counted in dropped_before), limits.recent_reports_per_job=0, and
// acknowledgements carrying progress only for the ranks of their batch.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "daemon_test_util.h"
#include "registry/job_registry.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;
using namespace straggler::daemon::testutil;

namespace {

sd::DaemonConfig RecentReports(uint32_t per_job) {
  sd::DaemonConfig config;
  config.limits.recent_reports_per_job = per_job;
  return config;
}

struct Fixture : LoopbackDaemon {
  explicit Fixture(uint32_t recent_reports_per_job)
      : LoopbackDaemon(RecentReports(recent_reports_per_job)) {}

  v1::ExportReportsResponse Export(const std::string& job, uint64_t since = 0,
                                   uint32_t limit = 0, grpc::StatusCode expect = grpc::OK) {
    grpc::ClientContext ctx;
    v1::ExportReportsRequest req;
    req.set_job_id(job);
    req.set_since_iteration(since);
    req.set_limit(limit);
    v1::ExportReportsResponse r;
    grpc::Status s = query->ExportReports(&ctx, req, &r);
    CHECK(s.error_code() == expect);
    return r;
  }
};

void Add(v1::ReportBatch& b, uint32_t rank, uint64_t iteration, double seconds,
         uint64_t epoch = 0) {
  v1::IterationReport* r = b.add_reports();
  r->set_rank(rank);
  r->set_iteration(iteration);
  r->set_epoch(epoch);
  r->set_compute_seconds(seconds);
  r->set_step_seconds(seconds * 2);  // not exported
}

std::vector<std::pair<uint64_t, uint32_t>> Keys(const v1::ExportReportsResponse& r) {
  std::vector<std::pair<uint64_t, uint32_t>> keys;
  for (const auto& rep : r.reports()) keys.emplace_back(rep.iteration(), rep.rank());
  return keys;
}

}  // namespace

TEST_CASE("the recent-reports ring keeps the newest, oldest first, and counts the rest") {
  sd::RecentReports ring(3);
  for (uint64_t it = 1; it <= 2; ++it) ring.Add({0, it, 0.1, 0});
  std::vector<uint64_t> seen;
  ring.ForEach([&](const sd::RecentReport& r) { seen.push_back(r.iteration); });
  CHECK(seen == std::vector<uint64_t>{1, 2});
  CHECK(ring.dropped() == 0);
  for (uint64_t it = 3; it <= 7; ++it) ring.Add({0, it, 0.1, 0});
  seen.clear();
  ring.ForEach([&](const sd::RecentReport& r) { seen.push_back(r.iteration); });
  CHECK(seen == std::vector<uint64_t>{5, 6, 7});
  CHECK(ring.size() == 3);
  CHECK(ring.dropped() == 4);
  CHECK(ring.dropped_max_iteration() == 4);

  sd::RecentReports none(0);
  none.Add({0, 1, 0.1, 0});
  CHECK(none.size() == 0);
  CHECK(none.dropped() == 0);
}

TEST_CASE("ExportReports returns accepted reports by (iteration, rank), with since and limit") {
  Fixture f(1000);
  OpenStream stream(*f.ingest);
  v1::ReportBatch b = Hello("exp", 3, {0, 1, 2});
  // Out of order across ranks, as agents send them.
  for (uint64_t it = 1; it <= 4; ++it) {
    for (uint32_t r : {2u, 0u, 1u}) Add(b, r, it, 0.1 + r * 0.01 + it * 1e-7, it / 3);
  }
  Add(b, 1, 2, 0.5);   // duplicate: not kept
  Add(b, 0, 5, -1.0);  // invalid: not kept
  v1::Directive ack = stream.Send(b, 1);
  CHECK(ack.accepted() == 12);

  v1::ExportReportsResponse all = f.Export("exp");
  REQUIRE(all.reports_size() == 12);
  CHECK(all.dropped_before() == 0);
  std::vector<std::pair<uint64_t, uint32_t>> expected;
  for (uint64_t it = 1; it <= 4; ++it)
    for (uint32_t r = 0; r < 3; ++r) expected.emplace_back(it, r);
  CHECK(Keys(all) == expected);
  const v1::IterationReport& one = all.reports(7);  // iteration 3, rank 1
  CHECK(one.iteration() == 3);
  CHECK(one.rank() == 1);
  CHECK(one.epoch() == 1);
  CHECK(one.compute_seconds() == 0.1 + 0.01 + 3e-7);  // exact, as sent
  CHECK_FALSE(one.has_step_seconds());
  CHECK_FALSE(one.has_start_time());

  v1::ExportReportsResponse page = f.Export("exp", 3, 4);
  CHECK(Keys(page) == std::vector<std::pair<uint64_t, uint32_t>>(expected.begin() + 6,
                                                                  expected.begin() + 10));
  CHECK(f.Export("exp", 5).reports_size() == 0);
  CHECK(f.Export("exp", 0, 100).reports_size() == 12);

  f.Export("no-such-job", 0, 0, grpc::StatusCode::NOT_FOUND);
  CHECK(stream.Close().ok());
}

TEST_CASE("ExportReports keeps a report's work and phases where it has them (issue 31)") {
  static_assert(sizeof(sd::RecentReport) == 48);
  Fixture f(100);
  OpenStream stream(*f.ingest);
  v1::ReportBatch b = Hello("exp-work", 2, {0, 1});
  Add(b, 0, 1, 0.1);
  b.mutable_reports(0)->set_work(4096);
  b.mutable_reports(0)->set_input_wait_seconds(0.25);
  b.mutable_reports(0)->set_optimizer_seconds(0.125);
  Add(b, 1, 1, 0.1);
  b.mutable_reports(1)->set_input_wait_seconds(0);  // zero is a value, not absent
  CHECK(stream.Send(b, 1).accepted() == 2);
  v1::ExportReportsResponse r = f.Export("exp-work");
  REQUIRE(r.reports_size() == 2);
  const v1::IterationReport& full = r.reports(0);
  CHECK(full.work() == 4096);  // exact in a float, as are the phases
  CHECK(full.input_wait_seconds() == 0.25);
  CHECK(full.optimizer_seconds() == 0.125);
  const v1::IterationReport& part = r.reports(1);
  CHECK_FALSE(part.has_work());
  REQUIRE(part.has_input_wait_seconds());
  CHECK(part.input_wait_seconds() == 0);
  CHECK_FALSE(part.has_optimizer_seconds());
  CHECK(stream.Close().ok());
}

TEST_CASE("ExportReports: an overflowing ring keeps the newest, dropped_before counts the rest") {
  Fixture f(10);
  OpenStream stream(*f.ingest);
  v1::ReportBatch b = Hello("ring", 2, {0, 1});
  for (uint64_t it = 1; it <= 8; ++it) {
    for (uint32_t r = 0; r < 2; ++r) Add(b, r, it, 0.1);
  }
  stream.Send(b, 1);  // 16 accepted, 10 kept: iterations 4 to 8

  v1::ExportReportsResponse r = f.Export("ring");
  REQUIRE(r.reports_size() == 10);
  CHECK(r.dropped_before() == 6);
  CHECK(r.reports(0).iteration() == 4);
  CHECK(r.reports(0).rank() == 0);
  CHECK(r.reports(9).iteration() == 8);
  CHECK(r.reports(9).rank() == 1);
  // The dropped reports are iterations 1-3.
  CHECK(f.Export("ring", 3).dropped_before() == 6);
  CHECK(f.Export("ring", 4).dropped_before() == 0);  // every requested report kept
  CHECK(f.Export("ring", 4, 3).reports_size() == 3);

  v1::ReportBatch more;
  for (uint32_t r = 0; r < 2; ++r) Add(more, r, 9, 0.1);
  stream.Send(more, 2);
  r = f.Export("ring");
  CHECK(r.dropped_before() == 8);
  CHECK(r.reports(0).iteration() == 5);
  CHECK(r.reports(9).iteration() == 9);
  CHECK(stream.Close().ok());
}

TEST_CASE("ExportReports with limits.recent_reports_per_job=0 keeps nothing") {
  Fixture f(0);
  OpenStream stream(*f.ingest);
  v1::ReportBatch b = Hello("off", 2, {0, 1});
  Add(b, 0, 1, 0.1);
  Add(b, 1, 1, 0.1);
  CHECK(stream.Send(b, 1).accepted() == 2);
  v1::ExportReportsResponse r = f.Export("off");
  CHECK(r.reports_size() == 0);
  CHECK(r.dropped_before() == 0);
  CHECK(stream.Close().ok());
}

TEST_CASE("acks carry progress for the ranks of their batch only, the first for every rank") {
  Fixture f(16);
  OpenStream stream(*f.ingest);
  v1::ReportBatch b = Hello("progress", 8, {0, 1, 2, 3, 4, 5, 6, 7});
  for (uint32_t r = 0; r < 8; ++r) Add(b, r, 1, 0.1);
  v1::Directive ack = stream.Send(b, 1);
  // The stream's first directive: every rank (it may be a push before the ack,
  // in which case the ack holds the batch's ranks, here all of them too).
  CHECK(ack.progress_size() == 8);

  v1::ReportBatch partial;
  Add(partial, 5, 2, 0.1);
  Add(partial, 2, 2, 0.1);
  Add(partial, 5, 3, 0.1);
  Add(partial, 2, 1, 0.1);  // duplicate: its rank still gets progress
  ack = stream.Send(partial, 2);
  CHECK(ack.accepted() == 3);
  REQUIRE(ack.progress_size() == 2);
  CHECK(ack.progress(0).rank() == 2);
  CHECK(ack.progress(0).iteration() == 2);
  CHECK(ack.progress(1).rank() == 5);
  CHECK(ack.progress(1).iteration() == 3);

  v1::ReportBatch empty;
  ack = stream.Send(empty, 3);
  CHECK(ack.progress_size() == 0);
  CHECK(stream.Close().ok());
}
