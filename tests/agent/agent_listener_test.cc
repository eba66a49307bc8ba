// straggler-agent's network listeners, in process on loopback:
//  * The HTTP listener (/metrics, probes) closes slowloris clients under the
//    same whole-request deadlines as stragglerd's (straggler/common/http_deadline.h),
//    so they cannot hold its workers.
//  * listen_tcp_tls: the TCP listener speaks TLS (certificates the openssl
//    command makes at test time): a client trusting the certificate
//    connects, a plaintext one does not; with client_ca_file only a client
//    with a certificate that CA signed does. The unix socket stays plaintext.
//    A file that does not load stops Start naming it (exit 2 in main).
// No assertion on timing: the timeouts only bound how long a broken build fails.
#include <catch2/catch.hpp>

#include <openssl/ssl.h>
#include <unistd.h>

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include "agent.h"
#include "agent_config.h"
#include "slow_client.h"
#include "spdlog/spdlog.h"
#include "test_certificate.h"

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
  return straggler::testing::MetricSample(res->body, sample);
}

// Whether a new gRPC connection to `address` with `credentials` becomes
// ready within `wait` (a failed handshake never does).
bool Connects(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials,
              std::chrono::milliseconds wait) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  auto channel = grpc::CreateCustomChannel(address, credentials, args);
  return channel->WaitForConnected(std::chrono::system_clock::now() + wait);
}

std::shared_ptr<grpc::ChannelCredentials> Trusting(const std::string& root_pem,
                                                   const std::string& cert_pem = "",
                                                   const std::string& key_pem = "") {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = root_pem;
  o.pem_cert_chain = cert_pem;
  o.pem_private_key = key_pem;
  return grpc::SslCredentials(o);
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

TEST_CASE("listen_tcp_tls: TLS on the TCP listener, plaintext on the unix socket", "[listener]") {
  spdlog::set_level(spdlog::level::err);
  straggler::testing::TestCertificate server;
  sa::AgentConfig c = LoopbackAgent("tls");
  c.http_address = "";
  c.listen_tcp = "127.0.0.1:0";
  c.listen_tcp_tls.cert_file = server.cert;
  c.listen_tcp_tls.key_file = server.key;
  sa::Agent agent(c);
  REQUIRE(agent.Start().ok());
  const std::string tcp = agent.tcp_dial_address();

  CHECK(Connects(tcp, Trusting(server.Pem()), std::chrono::seconds(30)));
  CHECK_FALSE(Connects(tcp, grpc::InsecureChannelCredentials(), std::chrono::seconds(2)));
  CHECK(Connects(c.listen, grpc::InsecureChannelCredentials(), std::chrono::seconds(30)));
  agent.Shutdown();
}

TEST_CASE("listen_tcp_tls.client_ca_file: only clients with a certificate it signed",
          "[listener]") {
  spdlog::set_level(spdlog::level::err);
  straggler::testing::TestCertificate server, client, stranger;  // each self-signed: its own CA
  sa::AgentConfig c = LoopbackAgent("mtls");
  c.http_address = "";
  c.listen_tcp = "127.0.0.1:0";
  c.listen_tcp_tls.cert_file = server.cert;
  c.listen_tcp_tls.key_file = server.key;
  c.listen_tcp_tls.client_ca_file = client.cert;
  sa::Agent agent(c);
  REQUIRE(agent.Start().ok());
  const std::string tcp = agent.tcp_dial_address();
  using straggler::testing::TestCertificate;

  CHECK(Connects(tcp, Trusting(server.Pem(), client.Pem(), TestCertificate::Read(client.key)),
                 std::chrono::seconds(30)));
  CHECK_FALSE(Connects(tcp, Trusting(server.Pem()), std::chrono::seconds(2)));
  CHECK_FALSE(Connects(tcp,
                       Trusting(server.Pem(), stranger.Pem(), TestCertificate::Read(stranger.key)),
                       std::chrono::seconds(2)));
  agent.Shutdown();
}

TEST_CASE("listen_tcp_tls: a file that does not load stops the start, named", "[listener]") {
  spdlog::set_level(spdlog::level::err);
  straggler::testing::TestCertificate server, other;
  sa::AgentConfig c = LoopbackAgent("tls-bad");
  c.http_address = "";
  c.listen_tcp = "127.0.0.1:0";
  c.listen_tcp_tls.cert_file = server.dir + "/missing.pem";
  c.listen_tcp_tls.key_file = server.key;
  {
    sa::Agent agent(c);
    const absl::Status s = agent.Start();
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);  // main: exit 2
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("listen_tcp_tls.cert_file") &&
                   Catch::Contains(server.dir + "/missing.pem"));
  }
  c.listen_tcp_tls.cert_file = server.cert;
  c.listen_tcp_tls.key_file = other.key;  // not the certificate's key
  sa::Agent agent(c);
  const absl::Status s = agent.Start();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("listen_tcp_tls.key_file=" + other.key + " does not match "
                             "listen_tcp_tls.cert_file=" + server.cert));
}
