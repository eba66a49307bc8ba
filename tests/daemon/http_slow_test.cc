// Slow and oversized HTTP requests against a real daemon on loopback (port 0),
// issue 15 item 2 and the HTTP statuses of item 6:
//  * 50 slowloris connections (a header byte every 200 ms, slow_client.h)
//    while /healthz and /readyz are timed: each must answer within 1 s (a
//    kubelet probe's default timeout). httplib alone gives each connection
//    a worker while it is open, so the probes waited behind the slow ones
//    for the whole read timeout (5 s and more).
//  * a body shorter than its Content-Length: 408 at the read timeout;
//  * a 100 KB header: 431; a 100 MB Content-Length: 413 before any body is
//    read, long before the read timeout.
// The 1 s bound is loose on purpose (the goal figures, 100 ms p99, are in
// BENCHMARKS.md "HTTP probes under slow clients", measured by
// bench/http/slowloris_bench.py); other timeouts only bound a failing run.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>

#include "config/config.h"
#include "daemon_test_util.h"
#include "server/server.h"
#include "slow_client.h"

namespace sd = straggler::daemon;
using namespace straggler::daemon::testutil;

namespace {

using Clock = std::chrono::steady_clock;

struct Daemon : LoopbackDaemon {
  explicit Daemon(const sd::DaemonConfig& config) : LoopbackDaemon(config, spdlog::level::err) {}

  std::unique_ptr<httplib::Client> Http() {
    auto http = std::make_unique<httplib::Client>("127.0.0.1", server.http_port());
    http->set_connection_timeout(30);
    http->set_read_timeout(30);  // bounds a failing run only
    return http;
  }
  double Metric(const std::string& sample) {
    auto res = Http()->Get("/metrics");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    return straggler::testing::MetricSample(res->body, sample);
  }
};

// Sends `request` on a fresh connection and returns what the daemon answers
// until it closes the connection (or `wait` passes).
std::string Exchange(int port, const std::string& request, std::chrono::seconds wait) {
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    timeval tv{};
    tv.tv_sec = wait.count();
    ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    for (size_t sent = 0; sent < request.size();) {
      const ssize_t n =
          ::send(sock, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;  // refused early: read what the daemon said
      sent += static_cast<size_t>(n);
    }
    char buf[4096];
    for (ssize_t n; (n = ::recv(sock, buf, sizeof buf, 0)) > 0;) answer.append(buf, n);
  }
  ::close(sock);
  return answer;
}

}  // namespace

TEST_CASE("probes answer within 1 s while 50 slowloris connections trickle headers") {
  Daemon d{sd::DaemonConfig()};  // defaults: 4 workers, 5 s read timeout
  double slowest_healthz = 0, slowest_readyz = 0;
  bool all_ok = true;
  const straggler::testing::SlowlorisOutcome o = straggler::testing::Slowloris(
      d.server.http_port(), nullptr, /*clients=*/50, [&] {
        for (int i = 0; i < 5; ++i) {
          for (const char* path : {"/healthz", "/readyz"}) {
            const auto start = Clock::now();
            auto res = d.Http()->Get(path);  // a fresh connection, as a kubelet's
            const double took = std::chrono::duration<double>(Clock::now() - start).count();
            all_ok = all_ok && res && res->status == 200;
            double& slowest = path[1] == 'h' ? slowest_healthz : slowest_readyz;
            slowest = std::max(slowest, took);
          }
        }
        return all_ok;
      });
  INFO("slowest /healthz " << slowest_healthz << " s, /readyz " << slowest_readyz << " s");
  CHECK(o.connected == 50);
  CHECK(o.served);
  CHECK(slowest_healthz < 1.0);
  CHECK(slowest_readyz < 1.0);
}

TEST_CASE("slowloris connections are answered 408 at the read timeout and counted") {
  sd::DaemonConfig config;
  config.http.read_timeout_seconds = 1;
  Daemon d(config);
  // A body shorter than its Content-Length.
  const std::string answer = Exchange(
      d.server.http_port(),
      "PUT /v1/jobs/j/policy HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"thr",
      std::chrono::seconds(30));
  CHECK_THAT(answer, Catch::StartsWith("HTTP/1.1 408 "));
  CHECK_THAT(answer, Catch::Contains("REQUEST_TIMEOUT"));
  // Headers that never end.
  straggler::testing::SlowClient slow(d.server.http_port(), nullptr);
  REQUIRE(slow.connected());
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (slow.Send("X") && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(Clock::now() < give_up);
  CHECK(d.Metric("straggler_http_slow_clients_total{phase=\"request\"}") == 2);
  CHECK(d.Metric("straggler_http_rejected_total{code=\"408\"}") == 2);
  // The daemon still serves.
  auto res = d.Http()->Get("/healthz");
  REQUIRE(res);
  CHECK(res->status == 200);
}

TEST_CASE("oversized HTTP heads and bodies are refused at once: 431, 414, 413") {
  sd::DaemonConfig config;
  config.http.read_timeout_seconds = 60;  // "at once": long before it
  Daemon d(config);
  const int port = d.server.http_port();
  const auto start = Clock::now();

  const std::string header = Exchange(
      port, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(100 * 1024, 'a') +
                "\r\n\r\n",
      std::chrono::seconds(30));
  CHECK_THAT(header, Catch::StartsWith("HTTP/1.1 431 "));

  const std::string uri = Exchange(
      port, "GET /" + std::string(100 * 1024, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n",
      std::chrono::seconds(30));
  CHECK_THAT(uri, Catch::StartsWith("HTTP/1.1 414 "));

  // 100 MB announced, none sent: refused on the head alone.
  const std::string body = Exchange(
      port,
      "PUT /v1/jobs/j/policy HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n",
      std::chrono::seconds(30));
  CHECK_THAT(body, Catch::StartsWith("HTTP/1.1 413 "));
  CHECK_THAT(body, Catch::Contains("104857600"));
  CHECK(Clock::now() - start < std::chrono::seconds(30));  // not the 60 s read timeout

  CHECK(d.Metric("straggler_http_rejected_total{code=\"431\"}") == 1);
  CHECK(d.Metric("straggler_http_rejected_total{code=\"414\"}") == 1);
  CHECK(d.Metric("straggler_http_rejected_total{code=\"413\"}") == 1);
  auto res = d.Http()->Get("/healthz");
  REQUIRE(res);
  CHECK(res->status == 200);
}

TEST_CASE("keep-alive and pipelined requests are served after the poller hand-off") {
  Daemon d{sd::DaemonConfig()};
  auto http = d.Http();
  http->set_keep_alive(true);
  for (int i = 0; i < 5; ++i) {  // one connection, five requests
    auto res = http->Get(i % 2 ? "/readyz" : "/healthz");
    REQUIRE(res);
    CHECK(res->status == 200);
  }
  // Two requests in one write; the second closes the connection.
  const std::string answer = Exchange(
      d.server.http_port(),
      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n"
      "Connection: close\r\n\r\n",
      std::chrono::seconds(30));
  size_t oks = 0;
  for (size_t at = 0; (at = answer.find("HTTP/1.1 200 ", at)) != std::string::npos; ++at) ++oks;
  CHECK(oks == 2);
}
