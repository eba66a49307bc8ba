// Server-side TLS of stragglerd (docs/security.md): the PEM files of
// config.tls, read and checked once at start, turned into gRPC server
// credentials and into the OpenSSL context of the HTTPS listener. The agent's
// TCP listener (listen_tcp_tls) uses the same.
//
//   absl::StatusOr<ServerTls> tls = LoadServerTls(config.tls);
//   // FAILED_PRECONDITION "tls.key_file=/etc/x.key does not match tls.cert_file=..."
//   builder.AddListeningPort(address, GrpcServerCredentials(*tls));
//   auto https = SslContextSource::Create(*tls);  // the HTTPS listener's, renewed with the files
//
// Plain values and functions, no shared state, except SslContextSource
// (thread-safe). A change of the paths needs a restart (the daemon warns on
// SIGHUP); with tls.reload_seconds the gRPC credentials and the HTTPS
// listener's SslContextSource re-read the files' contents (rotation).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "straggler/common/tls_config.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace grpc {
class ServerCredentials;
}  // namespace grpc

namespace straggler::common {

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

// The validity period of the first (leaf) certificate in a PEM chain, as
// Unix seconds. An error when the text holds no certificate.
struct CertificateValidity {
  int64_t not_before = 0;
  int64_t not_after = 0;
};
absl::StatusOr<CertificateValidity> LeafValidity(const std::string& pem);

// A warning for a certificate outside its validity at `now_unix` ("" when
// it is valid): an expired or not-yet-valid certificate starts, but every
// client that verifies it refuses the connection.
std::string ValidityWarning(const CertificateValidity& v, int64_t now_unix,
                            absl::string_view what);

// TLS 1.2 or newer; with a client CA, a client certificate signed by it is
// required and verified. With tls.reload_seconds > 0 the files are re-read
// that often (gRPC's FileWatcherCertificateProvider): new connections get
// the current certificate; otherwise the contents read at start serve.
std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(const ServerTls& tls);

// Sets up `ctx` the same way: minimum TLS 1.2, the certificate chain and key,
// and with a client CA, required and verified client certificates.
absl::Status ConfigureSslContext(const ServerTls& tls, SSL_CTX* ctx);

// The HTTPS listener's OpenSSL context, renewed with its files as gRPC's
// credentials are (GrpcServerCredentials): with reload_seconds > 0, Current()
// looks at the files' modification time, size and inode at most every
// reload_seconds, and after a change re-reads and re-checks them
// (LoadServerTls) into a new context that serves the connections accepted
// from then on (open ones keep theirs). Files that do not load together (a
// key renewed before its certificate, a half-written file) keep the last
// good context, logged once per change of the files. With reload_seconds = 0
// the context of Create serves for good.
//
//   auto contexts = SslContextSource::Create(tls);     // shared_ptr
//   std::shared_ptr<SSL_CTX> ctx = (*contexts)->Current();   // per connection
//
// Thread-safe: Current() from any thread (the check runs under a mutex, at
// most every reload_seconds; otherwise it only copies a pointer).
class SslContextSource {
 public:
  // Reads `tls.config`'s files afresh (after noting their stamps, so that a
  // file renewed meanwhile is seen at the first check); errors as LoadServerTls.
  static absl::StatusOr<std::shared_ptr<SslContextSource>> Create(const ServerTls& tls);

  // The context for a new connection; never null.
  std::shared_ptr<SSL_CTX> Current();

 private:
  using Clock = std::chrono::steady_clock;
  // What tells a renewed file from the one read: modification time (ns),
  // size and inode (a rename over it changes the inode even within one
  // mtime tick). All zero for a file that cannot be stat-ed.
  struct Stamp {
    int64_t mtime_ns = 0;
    int64_t size = 0;
    uint64_t inode = 0;
    bool operator==(const Stamp&) const = default;
  };
  SslContextSource(TlsConfig config, std::string section);
  std::vector<Stamp> Stamps() const;
  // Loads the files into a new context; the error names the file.
  absl::StatusOr<std::shared_ptr<SSL_CTX>> Load() const;

  const TlsConfig config_;
  const std::string section_;
  absl::Mutex mu_;
  std::shared_ptr<SSL_CTX> current_ ABSL_GUARDED_BY(mu_);
  std::vector<Stamp> stamps_ ABSL_GUARDED_BY(mu_);  // of the files last tried
  Clock::time_point next_check_ ABSL_GUARDED_BY(mu_);
};

}  // namespace straggler::common
