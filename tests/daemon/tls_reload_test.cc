// Certificate rotation without a restart (tls.reload_seconds): a daemon
// serving gRPC over TLS with certificate A has its files replaced by
// certificate B (as a renewal would, by rename); a new connection then gets
// B, and a client that trusts only A is refused. Real openssl certificates,
// a real daemon on loopback; no assertion on timing (the polling bound only
// limits how long a broken build fails).
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "config.h"
#include "server.h"
#include "spdlog/spdlog.h"
#include "test_certificate.h"

namespace sd = straggler::daemon;
using straggler::testing::TestCertificate;

namespace {

// Whether a new connection that trusts only `root_pem` becomes ready within
// `wait` (a handshake with another certificate never does).
bool ConnectsTrusting(const std::string& address, const std::string& root_pem,
                      std::chrono::milliseconds wait) {
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = root_pem;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  auto channel = grpc::CreateCustomChannel(address, grpc::SslCredentials(tls), args);
  return channel->WaitForConnected(std::chrono::system_clock::now() + wait);
}

// Replaces `path` with `contents` at once (write aside, rename over), as a
// certificate renewal does.
void ReplaceFile(const std::string& path, const std::string& contents) {
  const std::string aside = path + ".new";
  {
    std::ofstream out(aside, std::ios::trunc);
    out << contents;
    REQUIRE(out.good());
  }
  REQUIRE(std::rename(aside.c_str(), path.c_str()) == 0);
}

}  // namespace

TEST_CASE("tls.reload_seconds: a replaced certificate serves new gRPC connections") {
  spdlog::set_level(spdlog::level::err);
  TestCertificate a, b, live;  // `live` only lends its directory: the served files
  ReplaceFile(live.cert, a.Pem());
  ReplaceFile(live.key, TestCertificate::Read(a.key));

  sd::DaemonConfig config;
  config.grpc_address = "127.0.0.1:0";
  config.http_address = "127.0.0.1:0";
  config.tls.cert_file = live.cert;
  config.tls.key_file = live.key;
  config.tls.http = false;
  config.tls.reload_seconds = 1;
  sd::Server server;
  REQUIRE(server.Start(config).ok());
  const std::string address = server.grpc_dial_address();

  CHECK(ConnectsTrusting(address, a.Pem(), std::chrono::seconds(30)));
  CHECK_FALSE(ConnectsTrusting(address, b.Pem(), std::chrono::seconds(2)));

  // Key first: until the certificate follows, the pair does not match and
  // the watcher keeps serving A.
  ReplaceFile(live.key, TestCertificate::Read(b.key));
  ReplaceFile(live.cert, b.Pem());
  bool rotated = false;
  for (int attempt = 0; attempt < 60 && !rotated; ++attempt) {
    rotated = ConnectsTrusting(address, b.Pem(), std::chrono::seconds(1));
  }
  CHECK(rotated);
  CHECK_FALSE(ConnectsTrusting(address, a.Pem(), std::chrono::seconds(2)));
  server.Shutdown(std::chrono::milliseconds(0));
}
