// A LoopbackDaemon (daemon_test_util.h) read over its HTTP(S) listener, for
// the tests of slow and oversized HTTP clients (http_slow_test.cc,
// limits_test.cc). Refusals log warnings by design: only errors are shown.
//
//   HttpDaemon d{sd::DaemonConfig()};
//   auto res = d.Http()->Get("/healthz");
//   double slow = d.Metric("straggler_http_slow_clients_total{phase=\"request\"}");
//
// Not thread-safe beyond Http(): each call returns a client of its own.
#pragma once

#include <catch2/catch.hpp>

#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "config/config.h"
#include "daemon_test_util.h"
#include "slow_client.h"
#include "spdlog/spdlog.h"
#include "test_certificate.h"

namespace straggler::daemon::testutil {

struct HttpDaemon : LoopbackDaemon {
  // `kind` as LoopbackDaemon's (dynamic unless the config or `kind` names one).
  explicit HttpDaemon(const DaemonConfig& config,
                      std::optional<engine::PolicyKind> kind = std::nullopt)
      : LoopbackDaemon(config, spdlog::level::err, kind),
        https(config.tls.enabled() && config.tls.http) {}

  // An HTTP(S) client of the daemon (HTTPS with tls.http; the test's
  // throwaway certificate is not checked).
  std::unique_ptr<httplib::Client> Http() {
    auto http = std::make_unique<httplib::Client>(
        (https ? "https://127.0.0.1:" : "http://127.0.0.1:") +
        std::to_string(server.http_port()));
    http->enable_server_certificate_verification(false);
    http->set_connection_timeout(30);
    http->set_read_timeout(30);  // bounds a failing run only
    return http;
  }

  // The value of one sample of /metrics ("name{labels}"); -1 when absent.
  double Metric(const std::string& sample) {
    auto res = Http()->Get("/metrics");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    return straggler::testing::MetricSample(res->body, sample);
  }

  // Metric(sample) once it is at least `at_least`, or its value after 10 s:
  // for counters the daemon updates after it has written the answer (HTTP
  // statuses are counted in httplib's logger, which runs after the write,
  // so a client can read /metrics before the count of its own request).
  double MetricOnceAtLeast(const std::string& sample, double at_least) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    double v = Metric(sample);
    while (v < at_least && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      v = Metric(sample);
    }
    return v;
  }

  const bool https;
};

// A default config serving HTTPS with `cert`; gRPC stays plaintext (the
// LoopbackDaemon's stubs are).
inline DaemonConfig HttpsOnlyConfig(const straggler::testing::TestCertificate& cert) {
  DaemonConfig config;
  config.tls.cert_file = cert.cert;
  config.tls.key_file = cert.key;
  config.tls.grpc = false;
  return config;
}

}  // namespace straggler::daemon::testutil
