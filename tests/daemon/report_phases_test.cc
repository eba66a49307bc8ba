// Issue 31's report fields (IterationReport.work, input_wait_seconds,
// optimizer_seconds) through a real daemon over gRPC on loopback: valid
// values are taken, a report from a client that does not send them is taken
// as before, and a bad value is refused with a message naming it, counted in
// straggler_reports_rejected_total{reason="invalid_value"} as a bad
// compute_seconds is, while the stream goes on. Phases are bounded as step
// times are.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "config/config.h"
#include "daemon_test_util.h"
#include "http_daemon.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;
using namespace straggler::daemon::testutil;

namespace {

struct Fields {
  std::optional<double> work, input_wait, optimizer;  // unset: not sent
};

void AddPhases(v1::ReportBatch& b, uint32_t rank, uint64_t iteration, Fields f) {
  AddReport(b, rank, iteration, 0.1);
  v1::IterationReport* r = b.mutable_reports(b.reports_size() - 1);
  if (f.work) r->set_work(*f.work);
  if (f.input_wait) r->set_input_wait_seconds(*f.input_wait);
  if (f.optimizer) r->set_optimizer_seconds(*f.optimizer);
}

}  // namespace

TEST_CASE("report work and phases: taken when valid, refused naming the value, counted") {
  HttpDaemon d{sd::DaemonConfig()};
  OpenStream stream(*d.ingest);
  v1::ReportBatch b = Hello("phases", 2, {0, 1});
  AddPhases(b, 0, 1, {.work = 4096, .input_wait = 0.01, .optimizer = 0.02});  // taken
  AddReport(b, 1, 1, 0.1);                          // an older client: none of them, taken
  AddPhases(b, 0, 2, {.work = 0});                  // work must be > 0
  AddPhases(b, 1, 2, {.input_wait = -0.5});         // phases must be >= 0
  AddPhases(b, 0, 3, {.optimizer = std::numeric_limits<double>::infinity()});
  AddPhases(b, 1, 3, {.work = 12, .input_wait = std::nan("")});
  v1::Directive ack = stream.Send(b, 1);
  CHECK(ack.accepted() == 2);
  CHECK(ack.rejected() == 4);
  REQUIRE(ack.rejections_size() == 4);
  for (const v1::ReportRejection& r : ack.rejections()) CHECK(r.reason() == "invalid_value");
  CHECK(ack.rejections(0).message() ==
        "rank 0 iteration 2 reported work=0 (must be a finite number > 0)");
  CHECK(ack.rejections(1).message() ==
        "rank 1 iteration 2 reported input_wait_seconds=-0.5 (must be a finite number >= 0)");
  CHECK(ack.rejections(2).message() ==
        "rank 0 iteration 3 reported optimizer_seconds=inf (must be a finite number >= 0)");
  CHECK_THAT(ack.rejections(3).message(),
             Catch::StartsWith("rank 1 iteration 3 reported input_wait_seconds=") &&
                 Catch::Contains("nan") && Catch::EndsWith("(must be a finite number >= 0)"));
  CHECK(d.Metric("straggler_reports_rejected_total{reason=\"invalid_value\"}") == 4);

  // Phases are bounded as step times are: 10 x the policy's
  // max_compute_seconds (default 3600 s).
  v1::ReportBatch big;
  AddPhases(big, 0, 4, {.input_wait = 36000.5});
  AddPhases(big, 1, 4, {.optimizer = 36000});
  ack = stream.Send(big, 3);
  CHECK(ack.accepted() == 1);
  REQUIRE(ack.rejections_size() == 1);
  CHECK(ack.rejections(0).message() ==
        "rank 0 iteration 4 reported input_wait_seconds=36000.5 (above 10 x "
        "max_compute_seconds=36000)");
  CHECK(d.Metric("straggler_reports_rejected_total{reason=\"invalid_value\"}") == 5);

  // A refused report was not taken: the same iteration, valid, is accepted
  // (not a duplicate), and the stream goes on.
  v1::ReportBatch again;
  AddPhases(again, 0, 2, {.work = 1, .input_wait = 0, .optimizer = 0});
  ack = stream.Send(again, 4);
  CHECK(ack.accepted() == 1);
  CHECK(ack.rejected() == 0);
  CHECK(ack.duplicates() == 0);
  CHECK(JobOf(*d.query, "phases").reports_total() == 4);
  CHECK(stream.Close().ok());
}
