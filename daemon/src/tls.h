// Server-side TLS of stragglerd (README "Security"): the PEM files of
// config.tls, read and checked once at start, turned into gRPC server
// credentials and into the OpenSSL context of the HTTPS listener. The agent's
// TCP listener (listen_tcp_tls) uses the same.
//
//   absl::StatusOr<ServerTls> tls = LoadServerTls(config.tls);
//   // FAILED_PRECONDITION "tls.key_file=/etc/x.key does not match tls.cert_file=..."
//   builder.AddListeningPort(address, GrpcServerCredentials(*tls));
//   httplib::SSLServer https([&](SSL_CTX& ctx) { return ConfigureSslContext(*tls, &ctx).ok(); });
//
// Plain values and functions; no shared state. A change of the paths needs a
// restart (the daemon warns on SIGHUP); with tls.reload_seconds the gRPC
// credentials re-read the files' contents themselves (rotation).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "config.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace grpc {
class ServerCredentials;
}  // namespace grpc

namespace straggler::daemon {

struct ServerTls {
  TlsConfig config;         // the paths, for messages
  std::string section = "tls";  // the config section, for messages ("tls.cert_file=...")
  std::string cert_chain;   // PEM contents
  std::string private_key;
  std::string client_ca;    // "" = no client certificates asked for
};

// Reads the files and checks them with OpenSSL (each parses, the key belongs
// to the certificate, the client CA holds a certificate). Errors are
// FAILED_PRECONDITION naming the key (`section`.cert_file, ...), the path and
// OpenSSL's reason; never the key's contents. `config.enabled()` must hold.
// stragglerd's section is `tls`, straggler-agent's `listen_tcp_tls`.
absl::StatusOr<ServerTls> LoadServerTls(const TlsConfig& config,
                                        absl::string_view section = "tls");

// TLS 1.2 or newer; with a client CA, a client certificate signed by it is
// required and verified. With tls.reload_seconds > 0 the files are re-read
// that often (gRPC's FileWatcherCertificateProvider): new connections get
// the current certificate; otherwise the contents read at start serve.
std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(const ServerTls& tls);

// Sets up `ctx` the same way: minimum TLS 1.2, the certificate chain and key,
// and with a client CA, required and verified client certificates.
absl::Status ConfigureSslContext(const ServerTls& tls, SSL_CTX* ctx);

}  // namespace straggler::daemon
