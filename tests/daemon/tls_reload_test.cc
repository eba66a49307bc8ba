// Certificate rotation without a restart (tls.reload_seconds): a daemon
// serving gRPC and HTTPS with certificate A has its files replaced by
// certificate B (as a renewal would, by rename); a new connection to either
// listener then gets B, and a client that trusts only A is refused. Real openssl certificates,
// a real daemon on loopback; no assertion on timing (the polling bound only
// limits how long a broken build fails). HTTPS's SslContextSource on its own:
// files that do not load keep the last good context, until they do.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "config/config.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "test_certificate.h"
#include "straggler/common/tls.h"

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

// Whether a new HTTPS connection that trusts only the certificate in
// `ca_file` is served /healthz (verified: the certificate must chain to it
// and name 127.0.0.1).
bool HttpsTrusting(int port, const std::string& ca_file) {
  httplib::Client http("https://127.0.0.1:" + std::to_string(port));
  http.set_ca_cert_path(ca_file.c_str());
  http.enable_server_certificate_verification(true);
  http.set_connection_timeout(5);
  http.set_read_timeout(5);
  auto res = http.Get("/healthz");
  return res && res->status == 200;
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

TEST_CASE("tls.reload_seconds: a replaced certificate serves new gRPC and HTTPS connections") {
  spdlog::set_level(spdlog::level::err);
  TestCertificate a, b, live;  // `live` only lends its directory: the served files
  ReplaceFile(live.cert, a.Pem());
  ReplaceFile(live.key, TestCertificate::Read(a.key));

  sd::DaemonConfig config;
  config.grpc_address = "127.0.0.1:0";
  config.http_address = "127.0.0.1:0";
  config.tls.cert_file = live.cert;
  config.tls.key_file = live.key;
  config.tls.reload_seconds = 1;
  sd::Server server;
  REQUIRE(server.Start(config).ok());
  const std::string address = server.grpc_dial_address();

  CHECK(ConnectsTrusting(address, a.Pem(), std::chrono::seconds(30)));
  CHECK_FALSE(ConnectsTrusting(address, b.Pem(), std::chrono::seconds(2)));
  CHECK(HttpsTrusting(server.http_port(), a.cert));
  CHECK_FALSE(HttpsTrusting(server.http_port(), b.cert));

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
  // HTTPS checks the files at most every reload_seconds, on a new connection.
  bool https_rotated = false;
  for (int attempt = 0; attempt < 60 && !https_rotated; ++attempt) {
    https_rotated = HttpsTrusting(server.http_port(), b.cert);
    if (!https_rotated) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  CHECK(https_rotated);
  CHECK_FALSE(HttpsTrusting(server.http_port(), a.cert));
  server.Shutdown(std::chrono::milliseconds(0));
}

TEST_CASE("SslContextSource keeps the last good context while the files do not load") {
  spdlog::set_level(spdlog::level::off);  // the bad files' warning is expected
  TestCertificate a, b, live;
  ReplaceFile(live.cert, a.Pem());
  ReplaceFile(live.key, TestCertificate::Read(a.key));
  straggler::common::TlsConfig config;
  config.cert_file = live.cert;
  config.key_file = live.key;
  config.reload_seconds = 1;
  auto tls = straggler::common::LoadServerTls(config);
  REQUIRE(tls.ok());
  auto source = straggler::common::SslContextSource::Create(*tls);
  REQUIRE(source.ok());
  const std::shared_ptr<SSL_CTX> first = (*source)->Current();
  REQUIRE(first);
  // The leaf certificate a context serves, as PEM.
  auto served = [](const std::shared_ptr<SSL_CTX>& ctx) {
    X509* leaf = SSL_CTX_get0_certificate(ctx.get());
    REQUIRE(leaf != nullptr);
    BIO* bio = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(bio, leaf);
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    std::string pem(data, static_cast<size_t>(n));
    BIO_free(bio);
    return pem;
  };
  CHECK(served(first) == a.Pem());

  ReplaceFile(live.cert, "not a certificate\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // past reload_seconds
  CHECK((*source)->Current() == first);  // checked, did not load: the last good one

  ReplaceFile(live.key, TestCertificate::Read(b.key));
  ReplaceFile(live.cert, b.Pem());
  std::shared_ptr<SSL_CTX> renewed;
  for (int attempt = 0; attempt < 60 && (!renewed || renewed == first); ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    renewed = (*source)->Current();
  }
  REQUIRE(renewed != first);
  CHECK(served(renewed) == b.Pem());
}
