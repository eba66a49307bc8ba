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
//  * 8 slow readers of a /metrics larger than the socket buffers (4 000
//    ranks, ~4 MB) while /healthz is timed, over HTTP and HTTPS: each probe
//    within 1 s. When workers wrote responses themselves, the slow readers
//    held all 4 for the write timeout and the probes waited behind them;
//    the unsent tails now go to the poller, which drops them, counted, at
//    the write timeout. A reader at full speed gets the whole response.
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

#include <openssl/ssl.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "daemon_test_util.h"
#include "http_daemon.h"
#include "server/server.h"
#include "slow_client.h"
#include "test_certificate.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;
using namespace straggler::daemon::testutil;

namespace {

using Clock = std::chrono::steady_clock;

using Daemon = HttpDaemon;  // http_daemon.h

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

namespace {

// A client that asks for `path` with a 4 KiB receive buffer (set before
// connect, so the window stays small) and then reads nothing: the daemon's
// response stops at the socket buffers. Over TLS with a `tls` context.
class SlowReader {
 public:
  SlowReader(int port, SSL_CTX* tls, const std::string& path) {
    sock_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int small = 4096;
    ::setsockopt(sock_, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(sock_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return;
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
    if (tls == nullptr) {
      sent_ = ::send(sock_, request.data(), request.size(), MSG_NOSIGNAL) ==
              static_cast<ssize_t>(request.size());
      return;
    }
    ssl_ = SSL_new(tls);
    sent_ = ssl_ != nullptr && SSL_set_fd(ssl_, sock_) == 1 && SSL_connect(ssl_) == 1 &&
            SSL_write(ssl_, request.data(), static_cast<int>(request.size())) ==
                static_cast<int>(request.size());
  }
  ~SlowReader() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    ::close(sock_);
  }
  SlowReader(const SlowReader&) = delete;
  SlowReader& operator=(const SlowReader&) = delete;

  bool sent() const { return sent_; }

 private:
  int sock_ = -1;
  SSL* ssl_ = nullptr;
  bool sent_ = false;
};

// A job of `world` ranks with one report each, so /metrics carries a
// straggler_rank_* series set per rank (~1 KB each).
void FeedJob(Daemon& d, uint32_t world) {
  std::vector<uint32_t> ranks(world);
  for (uint32_t r = 0; r < world; ++r) ranks[r] = r;
  v1::ReportBatch batch = Hello("big", world, ranks);
  for (uint32_t r = 0; r < world; ++r) AddReport(batch, r, 1, 0.1);
  SendAlone(*d.ingest, batch);
}

// 8 slow readers of a large /metrics while /healthz is probed 10 times.
void CheckSlowReadersHoldNoWorker(sd::DaemonConfig config) {
  config.http.write_timeout_seconds = 2;
  Daemon d(config);
  FeedJob(d, 4000);
  // A reader at full speed gets all of it (the tail the worker could not
  // write at once is sent by the poller).
  auto full = d.Http()->Get("/metrics");
  REQUIRE(full);
  REQUIRE(full->status == 200);
  const size_t size = full->body.size();
  INFO("/metrics is " << size << " bytes");
  REQUIRE(size > 2'000'000);  // well above what the socket buffers take
  CHECK(full->get_header_value("Content-Length") == std::to_string(size));
  CHECK(full->body.back() == '\n');

  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> tls(nullptr, SSL_CTX_free);
  if (d.https) tls.reset(SSL_CTX_new(TLS_client_method()));
  std::vector<std::unique_ptr<SlowReader>> readers;
  for (int i = 0; i < 8; ++i) {
    readers.push_back(std::make_unique<SlowReader>(d.server.http_port(), tls.get(), "/metrics"));
    REQUIRE(readers.back()->sent());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rendered, stuck in the socket
  double slowest = 0;
  for (int i = 0; i < 10; ++i) {
    const auto start = Clock::now();
    auto res = d.Http()->Get("/healthz");  // a fresh connection, as a kubelet's
    slowest = std::max(slowest, std::chrono::duration<double>(Clock::now() - start).count());
    REQUIRE(res);
    CHECK(res->status == 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO("slowest /healthz " << slowest << " s under 8 slow readers of " << size << " bytes");
  CHECK(slowest < 1.0);
  // The readers' responses are dropped at the write timeout, and counted.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  double dropped = 0;
  while ((dropped = d.Metric("straggler_http_slow_clients_total{phase=\"response\"}")) < 8 &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(dropped == 8);
}

}  // namespace

TEST_CASE("probes answer within 1 s while 8 slow readers hold large /metrics responses") {
  CheckSlowReadersHoldNoWorker(sd::DaemonConfig());
}

TEST_CASE("probes answer within 1 s while 8 slow HTTPS readers hold large /metrics responses") {
  straggler::testing::TestCertificate cert;
  CheckSlowReadersHoldNoWorker(HttpsOnlyConfig(cert));
}
