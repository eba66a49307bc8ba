// IngestSession (daemon/src/ingest/ingest_session.h) driven directly, without
// gRPC: a real JobRegistry and DaemonStats, a subscriber standing in for the
// reactor's link, batches applied at chosen wall and steady times.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/api.h"
#include "config/config.h"
#include "ingest/ingest_session.h"
#include "metrics/stats.h"
#include "registry/job_registry.h"
#include "straggler/common/directive.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;

namespace {

using Steady = std::chrono::steady_clock;

// The reactor's place: what the registry pushes lands here (under the job's lock).
class RecordingLink final : public sd::JobSubscriber {
 public:
  void OnMembershipChangedLocked(const sd::Job::Locked& job) override {
    if (session != nullptr) pushed.push_back(session->PushLocked(job));
  }
  void CloseLocked(const absl::Status& status) override { closed = status; }

  sd::IngestSession* session = nullptr;
  std::vector<v1::Directive> pushed;
  std::optional<absl::Status> closed;
};

struct Fixture {
  explicit Fixture(sd::Limits limits = {}) {
    auto c = std::make_shared<sd::DaemonConfig>();
    c->limits = limits;
    config = c;
    registry = std::make_unique<sd::JobRegistry>(config, stats);
    link = std::make_shared<RecordingLink>();
    session = std::make_unique<sd::IngestSession>(*registry, stats, "test-peer", link,
                                                  config->limits, start);
    link->session = session.get();
  }

  // Applies `batch` and returns its acknowledgement.
  v1::Directive Apply(v1::ReportBatch batch, Steady::time_point steady) {
    std::optional<v1::Directive> ack;
    session->Apply(batch, sd::WallNow(), steady, [&](v1::Directive&& d) { ack = std::move(d); });
    REQUIRE(ack.has_value());
    return *ack;
  }
  v1::Directive Apply(v1::ReportBatch batch) { return Apply(std::move(batch), start); }

  std::shared_ptr<const sd::DaemonConfig> config;
  sd::DaemonStats stats;
  std::unique_ptr<sd::JobRegistry> registry;
  std::shared_ptr<RecordingLink> link;
  std::unique_ptr<sd::IngestSession> session;
  const Steady::time_point start = Steady::now();
};

v1::ReportBatch Hello(std::vector<uint32_t> ranks, uint32_t world_size, uint64_t sequence = 1,
                      uint64_t incarnation = 0) {
  v1::ReportBatch b;
  b.set_sequence(sequence);
  v1::StreamHello* h = b.mutable_hello();
  h->set_job_id("session-job");
  h->set_node("node-a");
  h->set_world_size(world_size);
  for (uint32_t r : ranks) {
    h->add_ranks(r);
    if (incarnation != 0) {
      v1::RankDevice* d = h->add_devices();
      d->set_rank(r);
      d->set_incarnation(incarnation + r);
    }
  }
  return b;
}

void AddReport(v1::ReportBatch& b, uint32_t rank, uint64_t iteration, double seconds = 0.1) {
  v1::IterationReport* r = b.add_reports();
  r->set_rank(rank);
  r->set_iteration(iteration);
  r->set_compute_seconds(seconds);
}

v1::ReportBatch Reports(uint64_t sequence, std::vector<uint32_t> ranks, uint64_t iteration) {
  v1::ReportBatch b;
  b.set_sequence(sequence);
  for (uint32_t r : ranks) AddReport(b, r, iteration);
  return b;
}

}  // namespace

TEST_CASE("IngestSession Open refuses a first batch without a hello and attaches one with",
          "[ingest_session]") {
  Fixture f;
  v1::ReportBatch bare = Reports(1, {0}, 1);
  absl::Status s = f.session->Open(bare, sd::WallNow());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(f.session->job() == nullptr);

  v1::ReportBatch bad = Hello({5}, 4);  // rank 5 of a 4-rank job
  s = f.session->Open(bad, sd::WallNow());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find('5') != std::string::npos);

  v1::ReportBatch good = Hello({2, 0, 0}, 4);
  REQUIRE(f.session->Open(good, sd::WallNow()).ok());
  REQUIRE(f.session->job() != nullptr);
  CHECK(f.session->job()->id == "session-job");
  CHECK(f.session->ranks() == std::vector<uint32_t>{0, 2});  // sorted, unique
}

TEST_CASE("IngestSession Apply acknowledges a batch: counts, progress, sequence",
          "[ingest_session]") {
  Fixture f;
  v1::ReportBatch first = Hello({0, 1}, 2, /*sequence=*/7);
  REQUIRE(f.session->Open(first, sd::WallNow()).ok());
  AddReport(first, 0, 1);
  AddReport(first, 1, 1);
  v1::Directive ack = f.Apply(first);
  CHECK(ack.acked_sequence() == 7);
  CHECK(ack.accepted() == 2);
  CHECK(ack.rejected() == 0);
  CHECK(ack.rejections_size() == 0);
  // The first directive carries the progress of every rank and the job's
  // current membership.
  REQUIRE(ack.progress_size() == 2);
  CHECK(ack.progress(0).rank() == 0);
  CHECK(ack.progress(0).iteration() == 1);
  CHECK(ack.progress(1).rank() == 1);
  CHECK(ack.memberships_size() >= 1);
  CHECK(f.stats.reports_accepted.load() == 2);
  CHECK(f.stats.batches_total.load() == 1);

  // A later batch: only the touched rank's progress, no membership again.
  v1::Directive second = f.Apply(Reports(8, {1}, 2));
  CHECK(second.acked_sequence() == 8);
  CHECK(second.accepted() == 1);
  REQUIRE(second.progress_size() == 1);
  CHECK(second.progress(0).rank() == 1);
  CHECK(second.progress(0).iteration() == 2);
  CHECK(second.memberships_size() == 0);
}

TEST_CASE("IngestSession Apply rejects a rank the hello did not name and counts replays",
          "[ingest_session]") {
  Fixture f;
  v1::ReportBatch first = Hello({0, 1}, 4);
  REQUIRE(f.session->Open(first, sd::WallNow()).ok());
  AddReport(first, 0, 1);
  AddReport(first, 3, 1);  // rank 3 is of the job, not of this stream
  v1::Directive ack = f.Apply(first);
  CHECK(ack.accepted() == 1);
  CHECK(ack.rejected() == 1);
  REQUIRE(ack.rejections_size() == 1);
  CHECK(ack.rejections(0).rank() == 3);
  CHECK(ack.rejections(0).reason() == "rank_not_in_stream");
  CHECK(ack.rejections(0).message().find("rank 3") != std::string::npos);

  // The same report again (a resend after a reconnect): a duplicate, not an error.
  v1::Directive again = f.Apply(Reports(2, {0}, 1));
  CHECK(again.accepted() == 0);
  CHECK(again.duplicates() == 1);
  CHECK(again.rejected() == 0);
}

TEST_CASE("IngestSession Apply holds the stream to its rate limit at the given steady time",
          "[ingest_session]") {
  sd::Limits limits;
  limits.stream_reports_per_second = 10;
  limits.stream_reports_burst = 4;
  Fixture f(limits);
  v1::ReportBatch first = Hello({0, 1, 2, 3, 4, 5}, 6);
  REQUIRE(f.session->Open(first, sd::WallNow()).ok());
  for (uint32_t r = 0; r < 6; ++r) AddReport(first, r, 1);
  v1::Directive ack = f.Apply(first, f.start);
  CHECK(ack.accepted() == 4);  // the burst
  CHECK(ack.rejected() == 2);
  REQUIRE(ack.rejections_size() == 1);  // one entry for the dropped run
  CHECK(ack.rejections(0).reason() == "rate_limited");
  CHECK(ack.rejections(0).rank() == 4);
  CHECK(ack.rejections(0).message().find("stream_reports_per_second=10") != std::string::npos);

  // 200 ms later the bucket holds 2 tokens again.
  v1::Directive later =
      f.Apply(Reports(2, {4, 5, 0}, 2), f.start + std::chrono::milliseconds(200));
  CHECK(later.accepted() == 2);
  CHECK(later.rejected() == 1);
}

TEST_CASE("IngestSession Apply drops reports past limits.max_batch_reports and caps rejections",
          "[ingest_session]") {
  sd::Limits limits;
  limits.max_batch_reports = 3;
  Fixture f(limits);
  v1::ReportBatch first = Hello({0}, 1);
  REQUIRE(f.session->Open(first, sd::WallNow()).ok());
  for (uint64_t it = 1; it <= 5; ++it) AddReport(first, 0, it);
  v1::Directive ack = f.Apply(first);
  CHECK(ack.accepted() == 3);
  CHECK(ack.rejected() == 2);
  REQUIRE(ack.rejections_size() == 1);
  CHECK(ack.rejections(0).reason() == "batch_too_large");
  CHECK(ack.rejections(0).message().find("max_batch_reports=3") != std::string::npos);

  // Twenty reports of ranks not in the stream: all counted, at most
  // kMaxDirectiveRejections named.
  v1::ReportBatch many;
  many.set_sequence(2);
  Fixture g;
  v1::ReportBatch open = Hello({0}, 64);
  REQUIRE(g.session->Open(open, sd::WallNow()).ok());
  for (uint32_t r = 1; r <= 20; ++r) AddReport(many, r, 1);
  v1::Directive capped = g.Apply(many);
  CHECK(capped.rejected() == 20);
  CHECK(capped.rejections_size() == straggler::common::kMaxDirectiveRejections);
}

TEST_CASE("IngestSession PushLocked carries a membership change to the stream once",
          "[ingest_session]") {
  Fixture f;
  v1::ReportBatch first = Hello({0, 1, 2, 3}, 4);
  REQUIRE(f.session->Open(first, sd::WallNow()).ok());
  for (uint32_t r = 0; r < 4; ++r) AddReport(first, r, 1);
  v1::Directive ack = f.Apply(first);
  REQUIRE(ack.memberships_size() >= 1);
  const uint64_t version = ack.memberships(ack.memberships_size() - 1).version();

  // An operator forces rank 1 out: the registry pushes the new version to
  // the stream through its link, with the job's lock held.
  v1::SetRankOverrideRequest req;
  req.set_job_id("session-job");
  req.set_rank(1);
  req.set_override(v1::RANK_OVERRIDE_FORCE_EXCLUDE);
  req.set_reason("test");
  absl::StatusOr<v1::Membership> m = sd::api::SetRankOverride(*f.registry, req, "test");
  REQUIRE(m.ok());
  REQUIRE(m->version() > version);
  REQUIRE(f.link->pushed.size() == 1);
  const v1::Directive& push = f.link->pushed[0];
  REQUIRE(push.memberships_size() == 1);
  CHECK(push.memberships(0).version() == m->version());
  CHECK(push.progress_size() == 0);

  // The next acknowledgement does not carry that version again.
  v1::Directive next = f.Apply(Reports(2, {0}, 2));
  CHECK(next.accepted() == 1);
  CHECK(next.memberships_size() == 0);
}

TEST_CASE("IngestSession Apply: a later hello adds ranks, one of another world size is refused",
          "[ingest_session]") {
  Fixture f;
  v1::ReportBatch first = Hello({0, 1}, 4);
  REQUIRE(f.session->Open(first, sd::WallNow()).ok());
  AddReport(first, 0, 1);
  AddReport(first, 1, 1);
  v1::Directive ack = f.Apply(first);
  CHECK(ack.progress_size() == 2);
  v1::Directive quiet = f.Apply(Reports(2, {0}, 2));
  CHECK(quiet.progress_size() == 1);
  CHECK(quiet.memberships_size() == 0);

  // A later hello names ranks 2 and 3: they join the stream, and the next
  // directive carries every rank's progress and the memberships again.
  v1::ReportBatch more = Hello({3, 2}, 4, /*sequence=*/3);
  AddReport(more, 2, 1);
  v1::Directive joined = f.Apply(more);
  CHECK(f.session->ranks() == std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(joined.accepted() == 1);
  CHECK(joined.rejected() == 0);
  CHECK(joined.progress_size() == 3);  // ranks 0, 1, 2 have reported
  CHECK(joined.memberships_size() >= 1);

  // A later hello of another world size is refused by name; the stream goes on.
  v1::ReportBatch wrong = Hello({5}, 8, /*sequence=*/4);
  AddReport(wrong, 3, 1);
  v1::Directive refused = f.Apply(wrong);
  REQUIRE(refused.rejections_size() == 1);
  CHECK(refused.rejections(0).reason() == "invalid_hello");
  CHECK(refused.accepted() == 1);  // rank 3's report, from the ranks it already has
  CHECK(refused.rejected() == 0);  // a refused hello is no report
  CHECK(f.session->ranks().size() == 4);
}

TEST_CASE("IngestSession Apply: a later hello naming its ranks out of order still starts a "
          "restarted rank's iterations over",
          "[ingest_session]") {
  Fixture f;
  v1::ReportBatch first = Hello({0, 1}, 4, 1, /*incarnation=*/100);
  REQUIRE(f.session->Open(first, sd::WallNow()).ok());
  AddReport(first, 0, 1);
  AddReport(first, 1, 1);
  f.Apply(first);
  // An agent adds ranks 3 and 2, in that order, which report up to 5.
  v1::ReportBatch more = Hello({3, 2}, 4, 2, /*incarnation=*/100);
  AddReport(more, 2, 5);
  AddReport(more, 3, 5);
  CHECK(f.Apply(more).accepted() == 2);
  // Rank 2's trainer restarts from a checkpoint: a new incarnation, named
  // again out of order, and iterations from 1. The registry notes the new
  // incarnation (it binary-searches the hello's ranks: they must be sorted)
  // and the rank's iterations start over, so iteration 1 is not stale.
  v1::ReportBatch restarted = Hello({3, 2}, 4, 3, /*incarnation=*/200);
  AddReport(restarted, 2, 1);
  const v1::Directive ack = f.Apply(restarted);
  CHECK(ack.accepted() == 1);
  CHECK(ack.rejected() == 0);
}
