// The Gloo PartialAllReduce against a real stragglerd (in process, on
// loopback): what a rank may still do after BeginIteration failed to build
// its context. The multi-process behaviour (exclusion, rejoin, late
// directives, a killed daemon) is in tests/integration/collective_test.py.
#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/hash_store.h>

#include "daemon_test_util.h"
#include "straggler/client.h"
#include "straggler/collective.h"
#include "straggler/collective_gloo.h"

using namespace std::chrono_literals;

namespace {

// A real client whose MembershipFor answers "not certain" (ok = false, the
// best known membership) at chosen iterations, at once: what the library's
// client answers when the daemon stopped acknowledging this rank's reports
// (it died, or restarted and this rank has not reconnected yet) - a race
// the real daemon cannot be made to lose on cue.
class UncertainClient final : public straggler::Client {
 public:
  explicit UncertainClient(std::unique_ptr<straggler::Client> inner) : inner_(std::move(inner)) {}
  void SetUncertain(std::set<uint64_t> its) {
    std::lock_guard<std::mutex> lock(mu_);
    uncertain_ = std::move(its);
  }
  bool Report(uint32_t rank, uint64_t epoch, uint64_t iteration, double s, std::optional<double> step,
              std::optional<double> wait) override {
    return inner_->Report(rank, epoch, iteration, s, step, wait);
  }
  straggler::MembershipView CurrentMembership() const override { return inner_->CurrentMembership(); }
  straggler::MembershipView MembershipFor(uint64_t iteration, std::chrono::milliseconds timeout,
                                          std::optional<uint32_t> rank) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (uncertain_.count(iteration) != 0) {
        straggler::MembershipView m = inner_->CurrentMembership();
        m.ok = false;
        return m;
      }
    }
    return inner_->MembershipFor(iteration, timeout, rank);
  }
  std::optional<straggler::MembershipView> ReadmissionAfter(uint64_t iteration,
                                                            std::optional<uint32_t> rank) override {
    return inner_->ReadmissionAfter(iteration, rank);
  }
  void OnMembershipChange(MembershipCallback cb) override { inner_->OnMembershipChange(std::move(cb)); }
  bool Flush(std::chrono::milliseconds timeout) override { return inner_->Flush(timeout); }
  straggler::ClientStats Stats() const override { return inner_->Stats(); }
  uint32_t FirstRank() const override { return inner_->FirstRank(); }

 private:
  std::unique_ptr<straggler::Client> inner_;
  std::mutex mu_;
  std::set<uint64_t> uncertain_;
};

struct Rank {
  std::unique_ptr<straggler::Client> client;
  std::unique_ptr<straggler::PartialAllReduce> reducer;
};

Rank Start(const std::string& endpoint, uint32_t rank, uint32_t world, bool uncertain_wrapper = false,
           uint32_t agreement_interval = 1,
           std::shared_ptr<gloo::rendezvous::Store> rendezvous_store = nullptr) {
  straggler::ClientOptions co;
  co.endpoint = endpoint;
  co.job_id = "gloo-guard";
  co.ranks = {rank};
  co.world_size = world;
  std::string error;
  Rank r;
  r.client = straggler::Client::Create(co, &error);
  REQUIRE(r.client != nullptr);
  if (uncertain_wrapper) r.client = std::make_unique<UncertainClient>(std::move(r.client));
  straggler::GlooOptions go;
  go.rendezvous_endpoint = endpoint;
  go.job_id = co.job_id;
  go.rank = rank;
  go.world_size = world;
  go.collective_timeout = 3s;
  go.membership_timeout = 3s;
  go.agreement_interval = agreement_interval;
  go.rendezvous_store = std::move(rendezvous_store);
  r.reducer = straggler::CreateGlooPartialAllReduce(*r.client, go, &error);
  REQUIRE(r.reducer != nullptr);
  return r;
}


// Each rank runs its own list of iterations, all ranks at once, each in its
// own thread (a collective needs its peers): report, BeginIteration, average
// (r + 1). A CollectiveError is recorded for its iteration (the rank goes on
// with the next) when `errors` is given, else it fails the test.
struct Step {
  straggler::StepPlan plan;
  straggler::AllReduceResult result;
  float value = 0;
};
using Steps = std::vector<std::map<uint64_t, Step>>;  // [rank][iteration]
using Errors = std::vector<std::map<uint64_t, std::string>>;  // [rank][iteration]

void RunLists(std::vector<Rank>& ranks, const std::map<uint32_t, std::vector<uint64_t>>& lists, Steps& out,
              Errors* errors = nullptr) {
  out.resize(ranks.size());
  Errors local(ranks.size());
  std::vector<std::thread> threads;
  for (const auto& [r, its] : lists) {
    threads.emplace_back([&, r = r, its = its] {
      for (uint64_t it : its) {
        try {
          ranks[r].client->Report(0, it, 0.01);
          Step s;
          s.plan = ranks[r].reducer->BeginIteration(it);
          std::vector<float> v{static_cast<float>(r + 1)};
          s.result = ranks[r].reducer->AllReduceAverage(std::span<float>(v));
          s.value = v[0];
          out[r][it] = s;
        } catch (const std::exception& e) {
          local[r][it] = e.what();
          if (errors == nullptr) return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (errors != nullptr) {
    *errors = std::move(local);
    return;
  }
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(local[r].empty());
  }
}

std::vector<uint64_t> Range(uint64_t from, uint64_t to) {
  std::vector<uint64_t> v;
  for (uint64_t it = from; it <= to; ++it) v.push_back(it);
  return v;
}

void RunSteps(std::vector<Rank>& ranks, uint64_t from, uint64_t to, Steps& out) {
  std::map<uint32_t, std::vector<uint64_t>> lists;
  for (uint32_t r = 0; r < ranks.size(); ++r) lists[r] = Range(from, to);
  RunLists(ranks, lists, out);
}

straggler::v1::Membership Override(straggler::daemon::testutil::LoopbackDaemon& d, const std::string& job,
                                   uint32_t rank, straggler::v1::RankOverride o) {
  grpc::ClientContext ctx;
  straggler::v1::SetRankOverrideRequest req;
  req.set_job_id(job);
  req.set_rank(rank);
  req.set_override(o);
  straggler::v1::Membership m;
  REQUIRE(d.admin->SetRankOverride(&ctx, req, &m).ok());
  return m;
}

// `world` ranks of job "gloo-guard" against `d`; rank `uncertain` (if any)
// behind an UncertainClient.
std::vector<Rank> StartRanks(straggler::daemon::testutil::LoopbackDaemon& d, uint32_t world,
                             int uncertain = -1, uint32_t agreement_interval = 1) {
  std::vector<Rank> ranks;
  for (uint32_t r = 0; r < world; ++r) {
    ranks.push_back(Start(d.server.grpc_dial_address(), r, world, static_cast<int>(r) == uncertain,
                          agreement_interval));
  }
  return ranks;
}

}  // namespace

TEST_CASE("gloo: after a BeginIteration that failed, averaging throws instead of using a stale context") {
  straggler::daemon::testutil::LoopbackDaemon d;
  std::vector<Rank> ranks = StartRanks(d, 3);

  // Iteration 0 together: every rank builds the context of {0, 1, 2}.
  Steps steps;
  RunSteps(ranks, 0, 0, steps);
  for (uint32_t r = 0; r < 3; ++r) REQUIRE(steps[r][0].value == 2.0f);

  // Ranks 1 and 2 stop stepping: rank 0 cannot agree with them on the
  // membership of iteration 1, and says so within collective_timeout.
  ranks[0].client->Report(0, 1, 0.01);
  REQUIRE_THROWS_WITH(ranks[0].reducer->BeginIteration(1),
                      Catch::Contains("iteration 1: Gloo agreement on the membership among ranks {0,1,2}"));
  std::vector<float> data{1.0f, 2.0f};
  REQUIRE_THROWS_WITH(ranks[0].reducer->AllReduceAverage(std::span<float>(data)),
                      Catch::Contains("after a failed BeginIteration"));
  REQUIRE_THROWS_WITH(ranks[0].reducer->SyncParameters({{data.data(), sizeof(float) * data.size()}}),
                      Catch::Contains("after a failed BeginIteration"));
  CHECK(data == std::vector<float>{1.0f, 2.0f});  // untouched
}

// The window a per-rank rule cannot close: the daemon has a new version and
// one rank cannot be certain of it (its acknowledgements are missing, as
// when the daemon dies or restarts inside the lead). Every rank of the set
// must keep the applied membership until all are certain, then switch at
// the same iteration - for an exclusion and for a readmission.
TEST_CASE("gloo: a rank not yet certain of a new version holds its whole set on the applied one") {
  straggler::daemon::testutil::LoopbackDaemon d;
  std::vector<Rank> ranks = StartRanks(d, 3, /*uncertain=*/1);
  Steps steps;
  RunSteps(ranks, 0, 4, steps);
  for (uint32_t r = 0; r < 3; ++r) REQUIRE(steps[r][4].value == 2.0f);
  auto* rank1 = static_cast<UncertainClient*>(ranks[1].client.get());

  // Exclusion of rank 2 at E; rank 1 is not certain of it at E and E + 1.
  const auto out = Override(d, "gloo-guard", 2, straggler::v1::RANK_OVERRIDE_FORCE_EXCLUDE);
  const uint64_t e = out.effective_iteration();
  REQUIRE(e > 4);
  rank1->SetUncertain({e, e + 1});
  RunSteps(ranks, 5, e + 3, steps);
  for (uint64_t it = 5; it <= e + 1; ++it) {
    INFO("iteration " << it << " (exclusion effective at " << e << ")");
    for (uint32_t r = 0; r < 3; ++r) {
      CHECK(steps[r][it].result.participated);
      CHECK(steps[r][it].plan.active_ranks == std::vector<uint32_t>{0, 1, 2});
      CHECK(steps[r][it].value == 2.0f);  // (1 + 2 + 3) / 3
    }
  }
  // Ranks 0 and 2 knew the version and put it off; rank 1 was not certain.
  CHECK(steps[0][e].plan.deferred_version == out.version());
  CHECK(steps[2][e].plan.deferred_version == out.version());
  CHECK_FALSE(steps[1][e].plan.certain);
  for (uint64_t it = e + 2; it <= e + 3; ++it) {
    INFO("iteration " << it);
    for (uint32_t r = 0; r < 2; ++r) {
      CHECK(steps[r][it].plan.version == out.version());
      CHECK(steps[r][it].plan.active_ranks == std::vector<uint32_t>{0, 1});
      CHECK(steps[r][it].value == 1.5f);  // (1 + 2) / 2
    }
    CHECK_FALSE(steps[2][it].result.participated);
    CHECK(steps[2][it].value == 3.0f);  // its own, untouched
  }

  // Readmission of rank 2 at E2; rank 1 is not certain of it at E2. Rank 2
  // has no context with the group: it joins where the group publishes.
  const uint64_t last = e + 3;
  const auto back = Override(d, "gloo-guard", 2, straggler::v1::RANK_OVERRIDE_FORCE_INCLUDE);
  const uint64_t e2 = back.effective_iteration();
  REQUIRE(e2 > last);
  rank1->SetUncertain({e2});
  RunSteps(ranks, last + 1, e2 + 2, steps);
  for (uint64_t it = last + 1; it <= e2; ++it) {
    INFO("iteration " << it << " (readmission effective at " << e2 << ")");
    CHECK(steps[0][it].value == 1.5f);
    CHECK(steps[1][it].value == 1.5f);
    CHECK_FALSE(steps[2][it].result.participated);
  }
  CHECK(steps[0][e2].plan.deferred_version == back.version());
  CHECK(steps[2][e2].plan.deferred_version == back.version());
  for (uint64_t it = e2 + 1; it <= e2 + 2; ++it) {
    INFO("iteration " << it);
    for (uint32_t r = 0; r < 3; ++r) {
      CHECK(steps[r][it].result.participated);
      CHECK(steps[r][it].plan.version == back.version());
      CHECK(steps[r][it].value == 2.0f);
      CHECK(steps[r][it].plan.sync_parameters == (it == e2 + 1));
    }
  }
}

TEST_CASE("gloo: with agreement_interval N the set changes only at multiples of N, on every rank") {
  straggler::daemon::testutil::LoopbackDaemon d;
  std::vector<Rank> ranks = StartRanks(d, 3, /*uncertain=*/-1, /*agreement_interval=*/8);

  Steps steps;
  RunSteps(ranks, 0, 2, steps);
  // Reports are sent in the background: wait until the daemon has every
  // rank's iteration 2, so e = 2 + 1 + lead = 5 (the daemon's gate), not 4
  // as when a report was still in flight (seen in CI).
  for (auto& r : ranks) REQUIRE(r.client->Flush(5s));
  const auto out = Override(d, "gloo-guard", 2, straggler::v1::RANK_OVERRIDE_FORCE_EXCLUDE);
  const uint64_t e = out.effective_iteration();
  REQUIRE(e > 2);
  const uint64_t slot = (e + 7) / 8 * 8;  // the first multiple of 8 at or after e
  // e = 5 falls between slots: the switch must wait for 8.
  REQUIRE(slot > e);
  // Between slots nothing is asked: deferred_version there names what the
  // client has received. Wait for the push, so the check below is about the
  // interval rule and not about delivery timing.
  for (auto& r : ranks) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (r.client->CurrentMembership().version < out.version() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    REQUIRE(r.client->CurrentMembership().version == out.version());
  }
  RunSteps(ranks, 3, slot + 1, steps);
  for (uint64_t it = 3; it < slot; ++it) {
    INFO("iteration " << it << " (effective " << e << ", slot " << slot << ")");
    for (uint32_t r = 0; r < 3; ++r) {
      CHECK(steps[r][it].value == 2.0f);
      CHECK(steps[r][it].plan.active_ranks == std::vector<uint32_t>{0, 1, 2});
    }
    if (it >= e) CHECK(steps[0][it].plan.deferred_version == out.version());
  }
  for (uint64_t it = slot; it <= slot + 1; ++it) {
    INFO("iteration " << it);
    CHECK(steps[0][it].value == 1.5f);
    CHECK(steps[1][it].value == 1.5f);
    CHECK(steps[0][it].plan.version == out.version());
    CHECK_FALSE(steps[2][it].result.participated);
  }
}

TEST_CASE("gloo: agreement_interval 0 is refused, naming the value") {
  straggler::ClientOptions co;
  co.endpoint = "127.0.0.1:1";
  co.job_id = "gloo-guard";
  co.ranks = {0};
  co.world_size = 2;
  auto client = straggler::Client::Create(co);
  REQUIRE(client != nullptr);
  straggler::GlooOptions go;
  go.rendezvous_endpoint = co.endpoint;
  go.job_id = co.job_id;
  go.world_size = 2;
  go.agreement_interval = 0;
  std::string error;
  CHECK(straggler::CreateGlooPartialAllReduce(*client, go, &error) == nullptr);
  CHECK_THAT(error, Catch::Contains("agreement_interval=0"));
}

// The fields every backend shares live in CollectiveOptions: set once, they
// fill a GlooOptions (NcclOptions takes the same part), and Validate checks
// each naming the value. Without a store of the trainer's own the daemon's
// address is required; with one it is not.
TEST_CASE("gloo: the shared CollectiveOptions part is checked by GlooOptions::Validate, naming the value") {
  straggler::CollectiveOptions shared;
  shared.rendezvous_endpoint = "127.0.0.1:1";
  shared.job_id = "shared-options";
  shared.rank = 1;
  shared.world_size = 2;
  shared.run_id = "launch-1";
  straggler::GlooOptions go;
  static_cast<straggler::CollectiveOptions&>(go) = shared;
  CHECK(go.job_id == "shared-options");
  CHECK(go.run_id == "launch-1");
  CHECK(go.hostname == "127.0.0.1");  // the Gloo part keeps its default
  CHECK(go.Validate().empty());

  auto broken = [&](auto change) {
    straggler::GlooOptions o = go;
    change(o);
    return o.Validate();
  };
  CHECK_THAT(broken([](auto& o) { o.job_id.clear(); }), Catch::Contains("job_id is empty"));
  CHECK_THAT(broken([](auto& o) { o.rank = 2; }), Catch::Contains("rank=2 must be < world_size=2"));
  CHECK_THAT(broken([](auto& o) { o.collective_timeout = 0ms; }),
             Catch::Contains("collective_timeout=0ms"));
  CHECK_THAT(broken([](auto& o) { o.membership_timeout = -1ms; }),
             Catch::Contains("membership_timeout=-1ms"));
  CHECK_THAT(broken([](auto& o) { o.agreement_interval = straggler::kMaxAgreementInterval + 1; }),
             Catch::Contains("agreement_interval=1025"));
  CHECK_THAT(broken([](auto& o) { o.rendezvous_endpoint.clear(); }),
             Catch::Contains("rendezvous_endpoint is empty"));
  CHECK(broken([](auto& o) {
          o.rendezvous_endpoint.clear();
          o.rendezvous_store = std::make_shared<gloo::rendezvous::HashStore>();
        }).empty());
  CHECK_THAT(broken([](auto& o) { o.hostname.clear(); }), Catch::Contains("hostname is empty"));
}

// A context whose collective failed is dropped: the survivors decide alone
// and move to the version that excludes the rank that went silent, instead
// of failing on the broken context at every later iteration.
TEST_CASE("gloo: after a failed agreement the survivors take the version that excludes the silent rank") {
  straggler::daemon::testutil::LoopbackDaemon d;
  std::vector<Rank> ranks = StartRanks(d, 3);
  Steps steps;
  RunSteps(ranks, 0, 2, steps);

  // Rank 2 stops stepping: the agreement of iteration 3 fails on 0 and 1.
  Errors errors;
  RunLists(ranks, {{0, {3}}, {1, {3}}}, steps, &errors);
  REQUIRE(errors[0].count(3) == 1);
  REQUIRE(errors[1].count(3) == 1);
  CHECK_THAT(errors[0][3], Catch::Contains("Gloo agreement on the membership among ranks {0,1,2}"));

  const auto out = Override(d, "gloo-guard", 2, straggler::v1::RANK_OVERRIDE_FORCE_EXCLUDE);
  const uint64_t e = out.effective_iteration();
  REQUIRE(e > 3);
  RunLists(ranks, {{0, Range(4, e + 1)}, {1, Range(4, e + 1)}}, steps, &errors);
  for (uint64_t it = e; it <= e + 1; ++it) {
    INFO("iteration " << it << " (exclusion effective at " << e << ")");
    for (uint32_t r = 0; r < 2; ++r) {
      REQUIRE(errors[r].count(it) == 0);
      CHECK(steps[r][it].plan.active_ranks == std::vector<uint32_t>{0, 1});
      CHECK(steps[r][it].value == 1.5f);
    }
  }
}

// A readmission put off at its effective iteration (rank 1 not certain
// there) while the joiner went on (it skipped to a later iteration, as a
// joiner whose wait ran out steps on): a joiner cannot go back, so the group
// takes it in where it waits, not at the next iteration it agrees.
TEST_CASE("gloo: after a put-off readmission the group takes the joiner in where it waits, not earlier") {
  straggler::daemon::testutil::LoopbackDaemon d;
  std::vector<Rank> ranks = StartRanks(d, 3, /*uncertain=*/1);
  auto* rank1 = static_cast<UncertainClient*>(ranks[1].client.get());
  Steps steps;
  RunSteps(ranks, 0, 2, steps);
  const auto out = Override(d, "gloo-guard", 2, straggler::v1::RANK_OVERRIDE_FORCE_EXCLUDE);
  const uint64_t e = out.effective_iteration();
  RunSteps(ranks, 3, e + 1, steps);
  REQUIRE_FALSE(steps[2][e + 1].result.participated);

  const auto back = Override(d, "gloo-guard", 2, straggler::v1::RANK_OVERRIDE_FORCE_INCLUDE);
  const uint64_t e2 = back.effective_iteration();
  REQUIRE(e2 > e + 1);
  rank1->SetUncertain({e2});
  // Rank 2 goes straight to e2 + 3; the group steps from e + 2 on.
  const uint64_t at = e2 + 3;
  RunLists(ranks, {{0, Range(e + 2, at + 1)}, {1, Range(e + 2, at + 1)}, {2, {at, at + 1}}}, steps);
  for (uint64_t it = e2; it < at; ++it) {
    INFO("iteration " << it << " (readmission effective at " << e2 << ", rank 2 waits at " << at << ")");
    CHECK(steps[0][it].value == 1.5f);
    CHECK(steps[0][it].plan.deferred_version == back.version());
  }
  for (uint64_t it = at; it <= at + 1; ++it) {
    INFO("iteration " << it);
    for (uint32_t r = 0; r < 3; ++r) {
      CHECK(steps[r][it].result.participated);
      CHECK(steps[r][it].value == 2.0f);
      CHECK(steps[r][it].plan.sync_parameters == (it == at));
    }
  }
}

TEST_CASE("gloo: with a rendezvous store of the trainer's own, ranks with no daemon average on the full group") {
  // Nothing listens on port 1: the clients retry in the background and the
  // agreement keeps the first membership, everyone. The contexts rendezvous through the shared
  // store (threads as ranks, as straggler.torch shares init_process_group's),
  // never the daemon: through it, the first build would fail.
  const std::string nowhere = "127.0.0.1:1";
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<Rank> ranks;
  for (uint32_t r = 0; r < 3; ++r) {
    ranks.push_back(Start(nowhere, r, 3, /*uncertain_wrapper=*/false, /*agreement_interval=*/1, store));
  }
  Steps steps;
  RunSteps(ranks, 0, 4, steps);
  for (uint64_t it = 0; it <= 4; ++it) {
    for (uint32_t r = 0; r < 3; ++r) {
      INFO("rank " << r << " iteration " << it);
      CHECK(steps[r][it].plan.active_ranks == std::vector<uint32_t>{0, 1, 2});
      CHECK(steps[r][it].result.participated);
      CHECK(steps[r][it].value == 2.0f);
    }
  }
  CHECK_FALSE(ranks[0].client->Stats().connected);
}
