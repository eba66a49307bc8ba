// The server TLS section shared by stragglerd (`tls:`) and straggler-agent
// (`listen_tcp_tls:`): paths of PEM files and the reload period. Read by
// ParseTlsSection (config_reader.h), loaded by LoadServerTls (tls.h).
//
// Plain value; no shared state.
#pragma once

#include <cstdint>
#include <string>

namespace straggler::common {

// TLS for the gRPC and HTTP listeners (docs/security.md; a change of these
// keys needs a restart). PEM files; cert_file and key_file come together.
// Both listeners re-read the files' contents every reload_seconds
// (certificate rotation without a restart; HTTPS: tls.h SslContextSource).
struct TlsConfig {
  std::string cert_file;       // certificate chain; "" = plaintext (the default)
  std::string key_file;        // private key of cert_file
  std::string client_ca_file;  // set: mutual TLS, clients need a certificate this CA signed
  bool grpc = true;            // with cert_file: serve gRPC over TLS
  bool http = true;            // with cert_file: serve HTTP over TLS
  uint32_t reload_seconds = 60;  // gRPC and HTTPS re-read the files this often; 0 = only at start
  bool enabled() const { return !cert_file.empty(); }
};

}  // namespace straggler::common
