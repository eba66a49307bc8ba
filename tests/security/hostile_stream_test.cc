// Hostile ingest input against a real daemon over gRPC on loopback (issue
// 15, items 1 and 5): a hello that claims a version or iteration far past
// the job must not freeze its membership, and one forged report must not
// silence a rank. Any ingest client can send these: ingest needs no token.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "daemon_test_util.h"
#include "straggler/engine/job_engine.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace v1 = straggler::v1;
using namespace straggler::daemon::testutil;

namespace {

constexpr uint64_t kFarVersion = 1'000'000'000'000ull;          // 10^12
constexpr uint64_t kFarIteration = 1'000'000'000'000'000ull;    // 10^15

}  // namespace

TEST_CASE("a hello claiming a version or iteration far past a running job is refused, and the "
          "job's next exclusion takes effect where the ranks are") {
  LoopbackDaemon d({}, spdlog::level::err);
  OpenStream job(*d.ingest);
  v1::ReportBatch b = Hello("hostile-hello", 4, {0, 1, 2, 3});
  AddRows(b, 0, 30);
  job.Send(b, 1);

  for (int claim = 0; claim < 3; ++claim) {
    v1::ReportBatch h = Hello("hostile-hello", 4, {0});
    if (claim == 0) {  // the issue's: a version and an effective iteration from nowhere
      h.mutable_hello()->set_known_membership_version(kFarVersion);
      h.mutable_hello()->set_known_effective_iteration(kFarIteration);
    } else if (claim == 1) {  // a plausible version far ahead in iterations
      h.mutable_hello()->set_known_membership_version(2);
      h.mutable_hello()->set_known_effective_iteration(kFarIteration);
      h.mutable_hello()->set_reported_iteration(31);
    } else {  // a reported iteration from nowhere
      h.mutable_hello()->set_reported_iteration(kFarIteration);
    }
    const grpc::Status s = SendAndClose(*d.ingest, h);
    INFO("claim " << claim << ": " << s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("hostile-hello") != std::string::npos);
    CHECK(s.error_message().find(claim == 2 ? "reported_iteration" : "known_") !=
          std::string::npos);
  }
  CHECK(MembershipOf(*d.query, "hostile-hello").version() == 0);

  // The real straggler: excluded from an iteration the job reaches.
  v1::ReportBatch slow;
  AddRows(slow, 31, 60, 0.3);
  job.Send(slow, 2);
  const v1::Membership m = MembershipOf(*d.query, "hostile-hello");
  REQUIRE(m.excluded_size() == 1);
  CHECK(m.excluded(0).rank() == 3);
  CHECK(m.effective_iteration() < 70);
  CHECK(job.Close().ok());
}

TEST_CASE("a false reported_iteration on a new job is dropped by the stream's first reports") {
  LoopbackDaemon d({}, spdlog::level::err);
  OpenStream liar(*d.ingest);
  // A new job knows no progress: the claim cannot be checked yet, and a
  // version floor above it is published (as for a restarted daemon).
  v1::ReportBatch h = Hello("false-claim", 4, {0, 1, 2, 3});
  h.mutable_hello()->set_known_membership_version(5);
  h.mutable_hello()->set_known_effective_iteration(kFarIteration - 10);
  h.mutable_hello()->set_reported_iteration(kFarIteration);
  liar.Send(h, 1);
  CHECK(MembershipOf(*d.query, "false-claim").effective_iteration() > kFarIteration);
  // Its reports are at iteration 0..: the claim was false.
  v1::ReportBatch b;
  AddRows(b, 0, 40, 0.3);
  liar.Send(b, 2);
  const v1::Membership m = MembershipOf(*d.query, "false-claim");
  CHECK(m.version() > 6);
  CHECK(m.effective_iteration() < 50);
  REQUIRE(m.excluded_size() == 1);  // rank 3's exclusion, where the job is
  CHECK(m.excluded(0).rank() == 3);
  CHECK(liar.Close().ok());
}

TEST_CASE("one forged iteration does not silence a rank") {
  LoopbackDaemon d({}, spdlog::level::err);
  OpenStream job(*d.ingest);
  v1::ReportBatch b = Hello("forged", 4, {0, 1, 2, 3});
  AddRows(b, 0, 20);
  job.Send(b, 1);

  // Another stream may speak for rank 1 (ingest has no token) and forge.
  v1::ReportBatch forged = Hello("forged", 4, {1});
  AddReport(forged, 1, uint64_t{1} << 62, 0.1);  // beyond any jump: refused
  AddReport(forged, 1, 20 + 5000, 0.1);          // far ahead, within the bound: judged alone
  const v1::Directive ack = SendAlone(*d.ingest, forged);
  CHECK(ack.accepted() == 1);
  REQUIRE(ack.rejections_size() == 1);
  CHECK(ack.rejections(0).reason() == "too_far_ahead");
  CHECK(ack.rejections(0).message().find("iteration 4611686018427387904") != std::string::npos);
  // The directive does not tell rank 1's clients it reached 5020: they judge
  // certainty by this progress, and the real rank is at 20.
  REQUIRE(ack.progress_size() == 1);
  CHECK(ack.progress(0).rank() == 1);
  CHECK(ack.progress(0).iteration() == 20);
  // The forged report again (a reconnect's replay) is a duplicate, not taken
  // twice and not stale.
  v1::ReportBatch resent = Hello("forged", 4, {1});
  AddReport(resent, 1, 20 + 5000, 0.1);
  const v1::Directive again = SendAlone(*d.ingest, resent);
  CHECK(again.accepted() == 0);
  CHECK(again.duplicates() == 1);
  CHECK(again.rejected() == 0);
  REQUIRE(again.progress_size() == 1);
  CHECK(again.progress(0).iteration() == 20);

  // The real rank 1 goes on from 21: nothing refused, the rank keeps up.
  v1::ReportBatch next;
  AddRows(next, 21, 60);
  const v1::Directive a2 = job.Send(next, 2);
  CHECK(a2.accepted() == 160);
  CHECK(a2.rejected() == 0);
  CHECK(a2.duplicates() == 0);
  const v1::Worker w = WorkerOf(*d.query, "forged", 1);
  CHECK(w.last_iteration() == 60);
  CHECK(w.state() == v1::WORKER_STATE_HEALTHY);
  CHECK(job.Close().ok());
}
