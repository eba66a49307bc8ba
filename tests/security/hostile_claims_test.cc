// Hostile hellos and reports against a real daemon over gRPC on loopback
// (issue 28, items 8 and 11): a hello's reported_iteration must not hold a
// live job's membership versions far ahead, a later hello must not change a
// job-level setting, and one report's epoch must not pin the job's epoch.
// Any ingest client can send these: ingest needs no token.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <limits>
#include <string>

#include "daemon_test_util.h"
#include "straggler/engine/job_engine.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace v1 = straggler::v1;
using namespace straggler::daemon::testutil;

namespace {

constexpr uint64_t kLead = 3;  // the default policy's lead_iterations

}  // namespace

TEST_CASE("hello_claim: a live job takes a hello's reported_iteration only up to its progress + "
          "1023, counts the cut, and its next exclusion is not held at the claim") {
  LoopbackDaemon d({}, spdlog::level::err);
  OpenStream job(*d.ingest);
  v1::ReportBatch b = Hello("claim-live", 4, {0, 1, 2, 3});
  AddRows(b, 0, 30);
  job.Send(b, 1);
  const auto dropped = [&] { return d.server.stats().hello_claims_dropped.load(); };

  // A claim a reconnecting rank could make (one step ahead): taken whole.
  OpenStream near(*d.ingest);
  v1::ReportBatch h = Hello("claim-live", 4, {0});
  h.mutable_hello()->set_reported_iteration(31);
  near.Send(h, 1);
  CHECK(dropped() == 0);

  // The hello: the right job, no reports, progress + 10 000. It is
  // not refused (a rank's reports behind it would be kept) but bounded.
  OpenStream liar(*d.ingest);
  h.mutable_hello()->set_reported_iteration(30 + 10'000);
  const v1::Directive ack = liar.Send(h, 1);
  CHECK(ack.rejected() == 0);
  CHECK(dropped() == 1);

  // The real straggler: excluded from where the job is + lead + at most the
  // agreement interval (1024), not from 10 000 iterations on.
  v1::ReportBatch slow;
  AddRows(slow, 31, 60, 0.3);
  job.Send(slow, 2);
  const v1::Membership m = MembershipOf(*d.query, "claim-live");
  REQUIRE(m.excluded_size() == 1);
  CHECK(m.excluded(0).rank() == 3);
  INFO("effective_iteration " << m.effective_iteration());
  CHECK(m.effective_iteration() <= 30 + 1023 + 1 + kLead);
  CHECK(liar.Close().ok());
  CHECK(near.Close().ok());
  CHECK(job.Close().ok());
}

TEST_CASE("hello_claim: a daemon without reports of the job (restarted without its database) "
          "still takes a hello's reported_iteration whole") {
  LoopbackDaemon d({}, spdlog::level::err);
  OpenStream job(*d.ingest);
  // The ranks are at iteration 5 000 and hold version 7 of an earlier daemon.
  v1::ReportBatch h = Hello("claim-takeover", 4, {0, 1, 2, 3});
  h.mutable_hello()->set_known_membership_version(7);
  h.mutable_hello()->set_known_effective_iteration(4990);
  h.mutable_hello()->set_reported_iteration(5000);
  job.Send(h, 1);
  CHECK(d.server.stats().hello_claims_dropped.load() == 0);
  const v1::Membership m = MembershipOf(*d.query, "claim-takeover");
  CHECK(m.version() == 8);
  CHECK(m.effective_iteration() == 5000 + 1 + kLead);
  CHECK(job.Close().ok());
}

TEST_CASE("epoch_claim: a later hello's iterations_per_epoch is ignored and counted, the first "
          "one's limit stays") {
  straggler::daemon::DaemonConfig config;
  config.policy.limit_fraction = 0.5;  // limit = ceil(0.5 x iterations per epoch)
  LoopbackDaemon d(config, spdlog::level::err);
  OpenStream job(*d.ingest);
  v1::ReportBatch b = Hello("epoch-hello", 4, {0, 1, 2, 3});
  b.mutable_hello()->set_iterations_per_epoch(20);
  AddRows(b, 0, 5);
  job.Send(b, 1);
  REQUIRE(WorkerOf(*d.query, "epoch-hello", 3).limit() == 10);

  // 2^64-1 made the limit 100 000: detection off for the job.
  v1::ReportBatch later = Hello("epoch-hello", 4, {3});
  later.mutable_hello()->set_iterations_per_epoch(std::numeric_limits<uint64_t>::max());
  const v1::Directive ack = SendAlone(*d.ingest, later);
  CHECK(ack.rejected() == 0);  // the hello itself is taken, its setting is not
  CHECK(d.server.stats().hello_settings_ignored.load() == 1);
  CHECK(WorkerOf(*d.query, "epoch-hello", 3).limit() == 10);
  // The same value again changes nothing and is no conflict.
  v1::ReportBatch same = Hello("epoch-hello", 4, {2});
  same.mutable_hello()->set_iterations_per_epoch(20);
  SendAlone(*d.ingest, same);
  CHECK(d.server.stats().hello_settings_ignored.load() == 1);

  // Rank 3 still becomes a straggler after 10 slow iterations.
  v1::ReportBatch slow;
  AddRows(slow, 6, 30, 0.3);
  job.Send(slow, 2);
  CHECK(WorkerOf(*d.query, "epoch-hello", 3).state() == v1::WORKER_STATE_STRAGGLER);
  CHECK(job.Close().ok());
}

TEST_CASE("epoch_claim: a report's epoch beyond what its iteration allows is rejected, and the "
          "job's epoch goes on") {
  LoopbackDaemon d({}, spdlog::level::err);
  OpenStream job(*d.ingest);
  v1::ReportBatch b = Hello("epoch-report", 4, {0, 1, 2, 3});
  AddRows(b, 0, 20, 0.1, 0);
  AddRows(b, 21, 40, 0.1, 1);
  job.Send(b, 1);
  REQUIRE(JobOf(*d.query, "epoch-report").epoch() == 1);

  // Another stream speaks for rank 1 (ingest has no token) with the issue's
  // epoch, and one a single iteration cannot reach.
  v1::ReportBatch forged = Hello("epoch-report", 4, {1});
  AddReport(forged, 1, 41, 0.1);
  forged.mutable_reports(0)->set_epoch(std::numeric_limits<uint64_t>::max());
  const v1::Directive ack = SendAlone(*d.ingest, forged);
  CHECK(ack.accepted() == 0);
  CHECK(ack.rejected() == 1);
  REQUIRE(ack.rejections_size() == 1);
  CHECK(ack.rejections(0).reason() == "too_far_ahead");
  CHECK(ack.rejections(0).message() ==
        "rank 1 iteration 41 epoch 18446744073709551615 is no epoch a job reaches (2^62 or more)");
  v1::ReportBatch jump = Hello("epoch-report", 4, {1});
  AddReport(jump, 1, 45, 0.1);
  jump.mutable_reports(0)->set_epoch(1 + 26);  // 26 epochs in 24 iterations since 21
  const v1::Directive ack2 = SendAlone(*d.ingest, jump);
  REQUIRE(ack2.rejections_size() == 1);
  CHECK(ack2.rejections(0).reason() == "too_far_ahead");
  CHECK(ack2.rejections(0).message() ==
        "rank 1 iteration 45 epoch 27 is more than 25 epochs past the job's epoch 1 (first seen "
        "at iteration 21): an epoch has at least one iteration");
  CHECK(JobOf(*d.query, "epoch-report").epoch() == 1);

  // The real ranks go on into epoch 2: the job follows, rank 1's real
  // reports are taken.
  v1::ReportBatch next;
  AddRows(next, 41, 60, 0.1, 2);
  const v1::Directive a = job.Send(next, 2);
  CHECK(a.accepted() == 80);
  CHECK(a.rejected() == 0);
  CHECK(JobOf(*d.query, "epoch-report").epoch() == 2);
  CHECK(job.Close().ok());
}
