// straggler-agent's network listeners, in process on loopback: the HTTP
// listener (/metrics, probes) closes slowloris clients under the same
// whole-request deadlines as stragglerd's (daemon/src/http_deadline.h), so
// they cannot hold its workers. No assertion on timing: the timeouts only
// bound how long a broken build fails.
#include <catch2/catch.hpp>

#include <openssl/ssl.h>
#include <unistd.h>

#include <memory>
#include <string>

#include <httplib.h>

#include "agent.h"
#include "agent_config.h"
#include "slow_client.h"
#include "spdlog/spdlog.h"

namespace sa = straggler::agent;

namespace {

// An agent with nothing upstream (the listeners do not need the daemon): its
// own socket per test (`tag`), HTTP on a free port, no telemetry.
sa::AgentConfig LoopbackAgent(const std::string& tag) {
  sa::AgentConfig c;
  c.listen = "unix:///tmp/straggler-agent-listener-" + std::to_string(getpid()) + "-" + tag +
             ".sock";
  c.upstream = "127.0.0.1:1";
  c.http_address = "127.0.0.1:0";
  c.telemetry_enabled = false;
  c.log_level = "error";
  return c;
}

int PortOf(const std::string& dial_address) {
  return std::stoi(dial_address.substr(dial_address.rfind(':') + 1));
}

std::unique_ptr<httplib::Client> HttpClient(const sa::Agent& agent) {
  auto http = std::make_unique<httplib::Client>("http://" + agent.http_dial_address());
  http->set_connection_timeout(30);
  http->set_read_timeout(30);  // bounds a failing run only
  return http;
}

// The value of one sample of the agent's /metrics ("name{labels}"); -1 when absent.
double Metric(const sa::Agent& agent, const std::string& sample) {
  auto res = HttpClient(agent)->Get("/metrics");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  const std::string needle = "\n" + sample + " ";
  const size_t at = res->body.find(needle);
  if (at == std::string::npos) return -1;
  return std::stod(res->body.substr(at + needle.size()));
}

}  // namespace

TEST_CASE("slow HTTP clients holding every agent worker do not stop a probe", "[listener]") {
  spdlog::set_level(spdlog::level::err);
  sa::AgentConfig c = LoopbackAgent("slowloris");
  c.http_threads = 2;
  c.http_read_timeout_seconds = 1;
  c.http_keep_alive_timeout_seconds = 1;
  sa::Agent agent(c);
  REQUIRE(agent.Start().ok());

  // Four times as many slow clients as workers (slow_client.h).
  const straggler::testing::SlowlorisOutcome o = straggler::testing::Slowloris(
      PortOf(agent.http_dial_address()), /*tls=*/nullptr, /*clients=*/8, [&] {
        auto res = HttpClient(agent)->Get("/healthz");
        return res && res->status == 200;
      });
  CHECK(o.connected > 0);
  CHECK(o.served);
  CHECK(o.closed_by_server > 0);
  CHECK(Metric(agent, "straggler_agent_http_slow_clients_total{phase=\"request\"}") >= 1);
  agent.Shutdown();
}
