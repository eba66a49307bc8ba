// The real straggler-agent core (in process) between a real stragglerd
// Server and a real straggler::Client: what a client learns through the
// agent that it would learn from the daemon directly.
//  * The daemon's rejections reach Stats().rejected once (through the agent
//    and directly), though the agent acknowledged the batch long before.
//  * While the daemon is down the agent says so (upstream_unavailable), and
//    MembershipFor stops waiting its full timeout at every step (else this
//    test hangs on a one-hour wait until ctest's timeout fails it); once the
//    daemon is back, MembershipFor is certain again. The C ABI shows the
//    same flag (straggler_stats_sized).
//  * A daemon restarted without state, behind the agent: its first version
//    keeps the excluded rank the agent's hello names and takes effect after
//    the iterations the agent's ranks reported while it was down.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "agent.h"
#include "agent_config.h"
#include "config/config.h"
#include "server/server.h"
#include "straggler/client.h"
#include "straggler/straggler_c.h"
#include "straggler/v1/straggler.grpc.pb.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

namespace sa = straggler::agent;
namespace v1 = straggler::v1;
namespace sd = straggler::daemon;
using namespace std::chrono_literals;

namespace {

sd::DaemonConfig DaemonOn(const std::string& grpc_address) {
  sd::DaemonConfig c;
  c.grpc_address = grpc_address;
  c.http_address = "127.0.0.1:0";  // never the default port: tests run in parallel
  c.log_level = "warn";
  return c;
}

// An agent for these tests: its own socket per test (`tag`), no HTTP, no
// telemetry, quick reconnects to `upstream`.
sa::AgentConfig AgentTo(const std::string& upstream, const std::string& tag) {
  sa::AgentConfig ac;
  ac.listen = "unix:///tmp/straggler-agent-relay-" + std::to_string(getpid()) + "-" + tag + ".sock";
  ac.upstream = upstream;
  ac.http_address = "";
  ac.telemetry_enabled = false;
  ac.reconnect_initial_ms = 20;
  ac.reconnect_max_ms = 100;
  return ac;
}

straggler::ClientOptions ClientTo(const std::string& endpoint, const std::string& job) {
  straggler::ClientOptions o;
  o.endpoint = endpoint;
  o.job_id = job;
  o.ranks = {0};
  o.world_size = 1;
  return o;
}

template <typename Pred>
void WaitUntil(Pred pred) {
  // No deadline of our own: ctest's timeout fails a test that never gets here.
  while (!pred()) std::this_thread::sleep_for(5ms);
}

}  // namespace

TEST_CASE("daemon rejections reach the client's stats once, with and without the agent",
          "[relay]") {
  sd::Server daemon;
  REQUIRE(daemon.Start(DaemonOn("127.0.0.1:0")).ok());
  const std::string upstream = "127.0.0.1:" + std::to_string(daemon.grpc_port());

  sa::AgentConfig ac = AgentTo(upstream, "a");
  sa::Agent agent(ac);
  REQUIRE(agent.Start().ok());

  for (const std::string& endpoint : {ac.listen, upstream}) {
    INFO("endpoint " << endpoint);
    auto client = straggler::Client::Create(ClientTo(endpoint, "reject-" + endpoint.substr(0, 4)));
    REQUIRE(client);
    REQUIRE(client->Report(0, 0, 0.1));
    REQUIRE(client->Report(0, 1, -0.3));  // the daemon refuses a negative compute time
    REQUIRE(client->Report(0, 2, 0.1));
    // Certain for iteration 3 once the daemon processed iteration 2 (lead 2):
    // every directive about the batches before it has arrived by then.
    REQUIRE(client->MembershipFor(3, std::chrono::hours(1)).ok);
    const straggler::ClientStats s = client->Stats();
    CHECK(s.rejected == 1);
    CHECK(s.last_rejection.find("compute_seconds=-0.3") != std::string::npos);
    CHECK_FALSE(s.upstream_unavailable);
  }
  agent.Shutdown();
  daemon.Shutdown(0ms);
}

// Issue 31: the agent relays a report's work and phases untouched; the
// daemon judges them there as it does directly (a bad one refused, named).
TEST_CASE("work and phases reach the daemon through the agent as directly", "[relay]") {
  sd::Server daemon;
  REQUIRE(daemon.Start(DaemonOn("127.0.0.1:0")).ok());
  const std::string upstream = "127.0.0.1:" + std::to_string(daemon.grpc_port());
  sa::AgentConfig ac = AgentTo(upstream, "phases");
  sa::Agent agent(ac);
  REQUIRE(agent.Start().ok());
  for (const std::string& endpoint : {ac.listen, upstream}) {
    INFO("endpoint " << endpoint);
    auto client = straggler::Client::Create(ClientTo(endpoint, "phases-" + endpoint.substr(0, 4)));
    REQUIRE(client);
    REQUIRE(client->Report(0, 0, 0, 0.1,
                           straggler::StepDetails{.input_wait_seconds = 0.01,
                                                  .optimizer_seconds = 0.02,
                                                  .work = 2048}));
    REQUIRE(client->Report(0, 0, 1, 0.1, straggler::StepDetails{.work = 0}));  // refused
    REQUIRE(client->Report(0, 2, 0.1));
    REQUIRE(client->MembershipFor(3, std::chrono::hours(1)).ok);  // as above
    const straggler::ClientStats s = client->Stats();
    CHECK(s.rejected == 1);  // (acked is what the agent took there, so not checked)
    CHECK(s.last_rejection == "rank 0 iteration 1 reported work=0 (must be a finite number > 0)");
  }
  agent.Shutdown();
  daemon.Shutdown(0ms);
}

TEST_CASE("behind the agent, MembershipFor waits once per daemon outage", "[relay]") {
  auto first = std::make_unique<sd::Server>();
  REQUIRE(first->Start(DaemonOn("127.0.0.1:0")).ok());
  const std::string upstream = "127.0.0.1:" + std::to_string(first->grpc_port());

  sa::AgentConfig ac = AgentTo(upstream, "b");
  sa::Agent agent(ac);
  REQUIRE(agent.Start().ok());

  auto client = straggler::Client::Create(ClientTo(ac.listen, "outage"));
  REQUIRE(client);
  // The same through the C ABI (straggler_stats_sized).
  straggler_options_t co;
  straggler_options_init(&co);
  const uint32_t c_rank = 0;
  co.endpoint = ac.listen.c_str();
  co.job_id = "outage-c";
  co.ranks = &c_rank;
  co.num_ranks = 1;
  co.world_size = 1;
  char err[256];
  straggler_client_t* c_client = straggler_client_create(&co, err, sizeof err);
  REQUIRE(c_client != nullptr);
  auto c_stats = [&] {
    straggler_stats_t s{};
    s.upstream_unavailable = -1;
    REQUIRE(straggler_stats_sized(c_client, &s, sizeof s) == STRAGGLER_OK);
    return s;
  };
  WaitUntil([&] { return c_stats().connected == 1; });
  // Its own job: the agent opens that job's upstream stream after the hello,
  // and says "unavailable" until it is up.
  WaitUntil([&] { return c_stats().upstream_unavailable == 0; });
  for (uint64_t it = 0; it <= 5; ++it) REQUIRE(client->Report(0, it, 0.1));
  REQUIRE(client->MembershipFor(6, std::chrono::hours(1)).ok);
  CHECK_FALSE(client->Stats().upstream_unavailable);

  // The daemon goes away; the client's stream to the agent stays up.
  first->Shutdown(0ms);
  first.reset();
  WaitUntil([&] { return client->Stats().upstream_unavailable; });
  CHECK(client->Stats().connected);
  WaitUntil([&] { return c_stats().upstream_unavailable == 1; });
  CHECK(c_stats().connected == 1);
  for (uint64_t it = 6; it <= 20; ++it) REQUIRE(client->Report(0, it, 0.1));
  // One wait runs out its timeout...
  CHECK_FALSE(client->MembershipFor(20, 50ms).ok);
  // ...after which the client knows: an hour's wait answers at once, and
  // still uncertain (the last agreed membership stays in force).
  const straggler::MembershipView known = client->MembershipFor(21, std::chrono::hours(1));
  CHECK_FALSE(known.ok);
  CHECK(known.version == client->CurrentMembership().version);

  // The daemon comes back on the same address; the agent replays, and
  // MembershipFor waits (and becomes certain) again.
  sd::Server second;
  REQUIRE(second.Start(DaemonOn(upstream)).ok());
  WaitUntil([&] { return !client->Stats().upstream_unavailable; });
  WaitUntil([&] { return c_stats().upstream_unavailable == 0; });
  straggler_client_destroy(c_client);
  for (uint64_t it = 21; it <= 30; ++it) REQUIRE(client->Report(0, it, 0.1));
  CHECK(client->MembershipFor(31, std::chrono::hours(1)).ok);
  client.reset();
  agent.Shutdown();
  second.Shutdown(0ms);
}

TEST_CASE("behind the agent, a daemon restarted without state keeps the exclusion, in force "
          "after the ranks' progress", "[relay]") {
  auto first = std::make_unique<sd::Server>();
  REQUIRE(first->Start(DaemonOn("127.0.0.1:0")).ok());
  const std::string upstream = "127.0.0.1:" + std::to_string(first->grpc_port());

  sa::AgentConfig ac = AgentTo(upstream, "c");
  sa::Agent agent(ac);
  REQUIRE(agent.Start().ok());

  straggler::ClientOptions o = ClientTo(ac.listen, "restart-floor");
  o.ranks = {0, 1};
  o.world_size = 2;
  auto client = straggler::Client::Create(o);
  REQUIRE(client);
  for (uint64_t it = 0; it <= 10; ++it) {
    REQUIRE(client->Report(0, 0, it, 0.1));
    REQUIRE(client->Report(1, 0, it, 0.1));
  }
  REQUIRE(client->MembershipFor(11, std::chrono::hours(1)).ok);
  {
    auto admin = v1::AdminService::NewStub(
        grpc::CreateChannel(upstream, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::SetRankOverrideRequest req;
    req.set_job_id("restart-floor");
    req.set_rank(1);
    req.set_override(v1::RANK_OVERRIDE_FORCE_EXCLUDE);
    v1::Membership m;
    REQUIRE(admin->SetRankOverride(&ctx, req, &m).ok());
  }
  WaitUntil([&] { return client->CurrentMembership().IsExcluded(1); });
  const straggler::MembershipView before = client->CurrentMembership();

  // The daemon goes away (nothing persists); the ranks go on to iteration 60.
  first->Shutdown(0ms);
  first.reset();
  WaitUntil([&] { return client->Stats().upstream_unavailable; });
  for (uint64_t it = 11; it <= 60; ++it) REQUIRE(client->Report(0, 0, it, 0.1));
  REQUIRE(client->Flush(std::chrono::hours(1)));  // the agent acknowledges once buffered

  sd::Server second;
  REQUIRE(second.Start(DaemonOn(upstream)).ok());
  WaitUntil([&] { return client->CurrentMembership().version > before.version; });
  const straggler::MembershipView floor = client->CurrentMembership();
  // The agent's hello carried the version with its excluded rank and the
  // highest iteration its ranks reported (60, from the reports it buffered).
  CHECK(floor.IsExcluded(1));
  CHECK(floor.excluded.size() == 1);
  CHECK(floor.effective_iteration >= 60 + 1 + floor.lead_iterations);
  client.reset();
  agent.Shutdown();
  second.Shutdown(0ms);
}

// The agent checks hellos with the daemon's own rules (daemon::ValidateHello)
// before it opens anything upstream; the refusal names the value.
TEST_CASE("the agent refuses a bad hello with the daemon's message", "[relay]") {
  sa::AgentConfig ac = AgentTo("127.0.0.1:1", "h");  // never reached: the hello is refused first
  sa::Agent agent(ac);
  REQUIRE(agent.Start().ok());

  auto stub = straggler::v1::IngestService::NewStub(
      grpc::CreateChannel(ac.listen, grpc::InsecureChannelCredentials()));
  struct Case {
    std::string job;
    uint32_t world;
    std::vector<uint32_t> ranks;
    std::string message;
  };
  const Case cases[] = {
      {"", 4, {0}, "hello.job_id must not be empty"},
      {"j", 0, {0}, "hello.world_size=0"},
      {"j", 4, {}, "hello.ranks is empty"},
      {"j", 4, {5}, "hello rank 5 >= world_size=4"},
  };
  for (const Case& c : cases) {
    INFO("expect: " << c.message);
    grpc::ClientContext ctx;
    auto stream = stub->Stream(&ctx);
    straggler::v1::ReportBatch b;
    b.mutable_hello()->set_job_id(c.job);
    b.mutable_hello()->set_world_size(c.world);
    for (uint32_t r : c.ranks) b.mutable_hello()->add_ranks(r);
    stream->Write(b);
    stream->WritesDone();
    straggler::v1::Directive d;
    while (stream->Read(&d)) {
    }
    const grpc::Status st = stream->Finish();
    CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(st.error_message().find(c.message) != std::string::npos);
  }
  agent.Shutdown();
}

// The agent answers the standard gRPC health check like stragglerd does, so
// probes and clients cannot tell the two apart. The messages are built by
// hand (grpc.health.v1 is not among Debian's installed protos): an empty
// HealthCheckRequest asks for the server as a whole, and a response of
// status SERVING (1) is the two bytes 08 01.
TEST_CASE("the agent answers the gRPC health check as SERVING", "[relay]") {
  sa::AgentConfig ac = AgentTo("127.0.0.1:1", "health");
  sa::Agent agent(ac);
  REQUIRE(agent.Start().ok());
  grpc::GenericStub stub(grpc::CreateChannel(ac.listen, grpc::InsecureChannelCredentials()));
  auto check = [&](const std::string& service) {
    std::string request;
    if (!service.empty()) {
      request.push_back('\x0a');  // field 1 (service), length-delimited
      request.push_back(static_cast<char>(service.size()));
      request += service;
    }
    grpc::Slice slice(request);
    grpc::ByteBuffer in(&slice, 1);
    grpc::ByteBuffer out;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out,
                   [&](grpc::Status s) {
                     std::lock_guard<std::mutex> lock(mu);
                     status = std::move(s);
                     done = true;
                     cv.notify_one();
                   });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    REQUIRE(status.ok());
    std::vector<grpc::Slice> slices;
    REQUIRE(out.Dump(&slices).ok());
    std::string bytes;
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    return bytes;
  };
  CHECK(check("") == std::string("\x08\x01", 2));
  CHECK(check(straggler::v1::IngestService::service_full_name()) == std::string("\x08\x01", 2));
  agent.Shutdown();
}

// Upstream batching (batch.max_reports, batch.max_delay_ms): a full batch
// goes up at once, long before its delay; a partial one goes up when its
// oldest report has waited the delay, and not earlier. (A hello goes up at
// once and takes what is buffered with it, so each case first gets its
// trainer's hello and one report through.)
TEST_CASE("the agent sends a full batch at once and a partial one after its delay", "[relay]") {
  sd::Server daemon;
  REQUIRE(daemon.Start(DaemonOn("127.0.0.1:0")).ok());
  const std::string upstream = "127.0.0.1:" + std::to_string(daemon.grpc_port());
  auto accepted = [&] { return daemon.stats().reports_accepted.load(); };
  auto wait_accepted = [&](uint64_t n) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (accepted() < n && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    return accepted();
  };
  const bool by_size = GENERATE(true, false);
  INFO((by_size ? "by size: 4 a batch, a 10-minute delay" : "by time: 1000 a batch, a 2 s delay"));

  sa::AgentConfig ac = AgentTo(upstream, by_size ? "size" : "time");
  ac.batch_max_reports = by_size ? 4 : 1000;
  ac.batch_max_delay_ms = by_size ? 600000 : 2000;
  sa::Agent agent(ac);
  REQUIRE(agent.Start().ok());
  auto client = straggler::Client::Create(ClientTo(ac.listen, by_size ? "batch-size" : "batch-time"));
  REQUIRE(client);
  REQUIRE(client->Report(0, 0, 0.1));  // goes up with the hello
  REQUIRE(client->Flush(std::chrono::seconds(10)));
  REQUIRE(wait_accepted(1) == 1);

  if (by_size) {
    for (uint64_t it = 1; it <= 9; ++it) REQUIRE(client->Report(0, it, 0.1));
    REQUIRE(client->Flush(std::chrono::seconds(10)));
    CHECK(wait_accepted(9) == 9);  // two full batches at once
    std::this_thread::sleep_for(300ms);
    CHECK(accepted() == 9);  // the tenth waits for three more or its 10 minutes
  } else {
    for (uint64_t it = 1; it <= 3; ++it) REQUIRE(client->Report(0, it, 0.1));
    REQUIRE(client->Flush(std::chrono::seconds(10)));
    std::this_thread::sleep_for(300ms);
    CHECK(accepted() == 1);  // held for the delay
    CHECK(wait_accepted(4) == 4);
  }
  agent.Shutdown();
  daemon.Shutdown(0ms);
}

TEST_CASE("behind the agent, a restarted trainer (new incarnation) starts its rank over",
          "[relay]") {
  // The agent's upstream hello names each rank's client incarnation, and a
  // new one is sent after the old process's reports: the restart from a
  // checkpoint (iterations below those reported) is accepted, not stale.
  sd::Server daemon;
  REQUIRE(daemon.Start(DaemonOn("127.0.0.1:0")).ok());
  const std::string upstream = "127.0.0.1:" + std::to_string(daemon.grpc_port());
  sa::AgentConfig ac = AgentTo(upstream, "incarnation");
  sa::Agent agent(ac);
  REQUIRE(agent.Start().ok());

  auto run = [&](uint64_t first, uint64_t last) {
    auto client = straggler::Client::Create(ClientTo(ac.listen, "incarnation"));
    REQUIRE(client);
    for (uint64_t i = first; i < last; ++i) REQUIRE(client->Report(0, i, 0.01));
    // Certain once the daemon processed iteration last - 1 (lead 2).
    REQUIRE(client->MembershipFor(last + 1, std::chrono::hours(1)).ok);
    return client->Stats();
  };
  const straggler::ClientStats before = run(0, 100);
  CHECK(before.acked == 100);
  const straggler::ClientStats after = run(50, 150);  // a new process: a new incarnation
  CHECK(after.acked == 100);
  CHECK(after.rejected == 0);
  CHECK(after.duplicates == 0);
  agent.Shutdown();
  daemon.Shutdown(0ms);
}
