// The Gloo PartialAllReduce against a real stragglerd (in process, on
// loopback): what a rank may still do after BeginIteration failed to build
// its context. The multi-process behaviour (exclusion, rejoin, late
// directives, a killed daemon) is in tests/integration/collective_test.py.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon_test_util.h"
#include "straggler/client.h"
#include "straggler/collective.h"

using namespace std::chrono_literals;

namespace {

struct Rank {
  std::unique_ptr<straggler::Client> client;
  std::unique_ptr<straggler::PartialAllReduce> reducer;
};

Rank Start(const std::string& endpoint, uint32_t rank, uint32_t world) {
  straggler::ClientOptions co;
  co.endpoint = endpoint;
  co.job_id = "gloo-guard";
  co.ranks = {rank};
  co.world_size = world;
  std::string error;
  Rank r;
  r.client = straggler::Client::Create(co, &error);
  REQUIRE(r.client != nullptr);
  straggler::GlooOptions go;
  go.rendezvous_endpoint = endpoint;
  go.job_id = co.job_id;
  go.rank = rank;
  go.world_size = world;
  go.collective_timeout = 2s;
  go.membership_timeout = 2s;
  r.reducer = straggler::CreateGlooPartialAllReduce(*r.client, go, &error);
  REQUIRE(r.reducer != nullptr);
  return r;
}

}  // namespace

TEST_CASE("gloo: after a BeginIteration that could not build its context, averaging throws instead of using none") {
  straggler::daemon::testutil::LoopbackDaemon d;
  const std::string endpoint = d.server.grpc_dial_address();
  std::vector<Rank> ranks;
  for (uint32_t r = 0; r < 3; ++r) ranks.push_back(Start(endpoint, r, 3));

  // Iteration 0 together: every rank builds the context of {0, 1, 2}.
  std::vector<std::thread> threads;
  std::vector<float> out(3);
  for (uint32_t r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      ranks[r].client->Report(0, 0, 0.01);
      ranks[r].reducer->BeginIteration(0);
      std::vector<float> v{static_cast<float>(r)};
      ranks[r].reducer->AllReduceAverage(std::span<float>(v));
      out[r] = v[0];
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(out == std::vector<float>{1.0f, 1.0f, 1.0f});

  // Rank 2 is forced out; rank 1 stays connected but stops stepping, so
  // rank 0 cannot build the context of {0, 1} at the switch.
  grpc::ClientContext ctx;
  straggler::v1::SetRankOverrideRequest req;
  req.set_job_id("gloo-guard");
  req.set_rank(2);
  req.set_override(straggler::v1::RANK_OVERRIDE_FORCE_EXCLUDE);
  straggler::v1::Membership m;
  REQUIRE(d.admin->SetRankOverride(&ctx, req, &m).ok());
  REQUIRE(m.effective_iteration() > 0);

  bool failed = false;
  for (uint64_t it = 1; it <= m.effective_iteration() && !failed; ++it) {
    ranks[0].client->Report(0, it, 0.01);
    try {
      ranks[0].reducer->BeginIteration(it);
    } catch (const straggler::CollectiveError&) {
      failed = true;
      CHECK(it == m.effective_iteration());
    }
  }
  REQUIRE(failed);
  std::vector<float> data{1.0f, 2.0f};
  REQUIRE_THROWS_WITH(ranks[0].reducer->AllReduceAverage(std::span<float>(data)),
                      Catch::Contains("after a failed BeginIteration"));
  REQUIRE_THROWS_WITH(ranks[0].reducer->SyncParameters({{data.data(), sizeof(float) * data.size()}}),
                      Catch::Contains("after a failed BeginIteration"));
  CHECK(data == std::vector<float>{1.0f, 2.0f});  // untouched
}
