// A monitor-only straggler::Client (ClientOptions::monitor_only, what
// straggler.torch.monitor makes) against a real stragglerd in process,
// directly and through the real agent core (issue 28, item 3;
// docs/membership.md, "Monitoring only"): its slow rank is a straggler the
// daemon never excludes; the client's first MembershipFor clears the mark in
// a later hello on its stream (the agent forwards it per rank), and the
// daemon then excludes the rank.
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include "agent.h"
#include "agent_config.h"
#include "config/config.h"
#include "daemon_test_util.h"
#include "server/server.h"
#include "straggler/client.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace sa = straggler::agent;
namespace v1 = straggler::v1;
namespace sd = straggler::daemon;
using namespace std::chrono_literals;
using straggler::daemon::testutil::GetWorker;
using straggler::daemon::testutil::MembershipOf;
using straggler::daemon::testutil::WorkerOf;

namespace {

constexpr uint32_t kWorld = 4;
constexpr uint32_t kSlow = 3;

template <typename Pred>
void WaitUntil(Pred pred) {
  // No deadline of our own: ctest's timeout fails a test that never gets here.
  while (!pred()) std::this_thread::sleep_for(5ms);
}

// Iterations [from, to) of every rank, rank 3 three times slower (as the
// daemon tests' AddRank3Slower: a straggler at iteration 10 under dynamic).
void ReportRank3Slower(straggler::Client& client, uint64_t from, uint64_t to) {
  for (uint64_t it = from; it < to; ++it)
    for (uint32_t r = 0; r < kWorld; ++r)
      REQUIRE(client.Report(r, 0, it, r == kSlow ? 0.3 : 0.1, std::nullopt));
}

}  // namespace

TEST_CASE("monitor_only_excludes: a monitor-only client's straggler stays in until its "
          "MembershipFor, directly and through the agent",
          "[relay][monitor_only]") {
  sd::DaemonConfig dc;
  dc.grpc_address = "127.0.0.1:0";
  dc.http_address = "127.0.0.1:0";  // never the default port: tests run in parallel
  dc.log_level = "warn";
  dc.policy.kind = straggler::engine::PolicyKind::kDynamic;  // AddRank3Slower's numbers
  sd::Server daemon;
  REQUIRE(daemon.Start(dc).ok());
  const std::string upstream = "127.0.0.1:" + std::to_string(daemon.grpc_port());
  auto query = v1::QueryService::NewStub(
      grpc::CreateChannel(upstream, grpc::InsecureChannelCredentials()));

  sa::AgentConfig ac;
  ac.listen = "unix:///tmp/straggler-agent-monitor-" + std::to_string(getpid()) + ".sock";
  ac.upstream = upstream;
  ac.http_address = "";
  ac.telemetry_enabled = false;
  ac.reconnect_initial_ms = 20;
  ac.reconnect_max_ms = 100;
  sa::Agent agent(ac);
  REQUIRE(agent.Start().ok());

  for (const auto& [endpoint, job] : {std::pair{upstream, std::string("mon-direct")},
                                      std::pair{ac.listen, std::string("mon-agent")}}) {
    INFO("endpoint " << endpoint);
    straggler::ClientOptions o;
    o.endpoint = endpoint;
    o.job_id = job;
    o.ranks = {0, 1, 2, 3};
    o.world_size = kWorld;
    o.monitor_only = true;
    auto client = straggler::Client::Create(o);
    REQUIRE(client);
    ReportRank3Slower(*client, 1, 13);
    REQUIRE(client->Flush(std::chrono::hours(1)));
    // Through the agent the flush means "buffered there": wait for the daemon
    // (the job exists there once the agent's upstream hello arrived).
    WaitUntil([&] {
      v1::Worker w;
      return GetWorker(*query, job, kSlow, &w).ok() && w.last_iteration() == 12;
    });
    const v1::Worker w = WorkerOf(*query, job, kSlow);
    CHECK(w.state() == v1::WORKER_STATE_STRAGGLER);
    CHECK(w.monitor_only());
    CHECK_FALSE(w.excluded());
    CHECK(MembershipOf(*query, job).version() == 0);

    // The trainer starts acting on membership: the mark goes with a later
    // hello, and the still-slow rank is excluded.
    (void)client->MembershipFor(12, 1ms);
    ReportRank3Slower(*client, 13, 14);
    WaitUntil([&] { return WorkerOf(*query, job, kSlow).excluded(); });
    const v1::Worker after = WorkerOf(*query, job, kSlow);
    CHECK_FALSE(after.monitor_only());
    CHECK(after.exclusion_reason() == v1::EXCLUSION_REASON_STRAGGLER);
    CHECK(MembershipOf(*query, job).version() >= 1);
    for (uint32_t r = 0; r < kSlow; ++r) CHECK_FALSE(WorkerOf(*query, job, r).monitor_only());
  }
  agent.Shutdown();
  daemon.Shutdown(0ms);
}
