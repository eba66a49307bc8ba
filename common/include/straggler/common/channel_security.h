// How every straggler gRPC client (the client library, the agent's upstream
// stream, stragglerctl, straggler-sim, straggler-loadgen, the Gloo rendezvous
// store) secures its channel to stragglerd: TLS with a private CA, optionally
// a client certificate (mutual TLS), and for operator tools a bearer token.
// One place, so every tool reads the same environment variables and reports
// the same errors.
//
//   straggler::ChannelSecurity sec = straggler::ChannelSecurityFromEnv();
//   std::string error;
//   // Insecure credentials when sec is empty or endpoint is unix:...
//   auto creds = straggler::MakeChannelCredentials(sec, endpoint, &error);
//   if (!creds) { std::cerr << error; ... }  // "cannot read tls ca file /x: No such file"
//   auto channel = grpc::CreateChannel(endpoint, creds);
//
// Internal to the project (not installed); the public ClientOptions carry the
// same three paths as plain strings. Pure functions apart from reading the
// named files and the environment; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <grpcpp/security/credentials.h>

namespace straggler {

// Environment variables that ChannelSecurityFromEnv reads.
inline constexpr char kEnvTlsCa[] = "STRAGGLER_TLS_CA";
inline constexpr char kEnvTlsCert[] = "STRAGGLER_TLS_CERT";
inline constexpr char kEnvTlsKey[] = "STRAGGLER_TLS_KEY";

// PEM file paths. TLS is on when any is set; all empty means a plaintext
// channel (the default, as before TLS existed).
struct ChannelSecurity {
  std::string ca_file;    // roots that verify the daemon's certificate; "" = the system's roots
  std::string cert_file;  // client certificate chain, for a daemon that requires mutual TLS
  std::string key_file;   // its private key (needed with cert_file, and only with it)

  bool tls() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
  // Empty when usable, else what is wrong ("tls cert file is set but tls key file is not").
  std::string Validate() const;
};

// STRAGGLER_TLS_CA, STRAGGLER_TLS_CERT, STRAGGLER_TLS_KEY (unset or "" = not set).
ChannelSecurity ChannelSecurityFromEnv();

// SslCredentials from the files when sec.tls(), else InsecureChannelCredentials.
// A unix: endpoint (the node agent's socket, guarded by its file mode) is
// always plaintext, so one environment serves a trainer whose Client talks to
// its agent and whose rendezvous store talks to a TLS daemon. nullptr and
// *error (naming the file, never its contents) when a file cannot be read or
// the combination is invalid.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const ChannelSecurity& sec,
                                                                 std::string_view endpoint,
                                                                 std::string* error);

// Reads a whole file into *out. false and *error = "cannot read <what>
// <path>: <reason>" when it cannot, or when the path is not a regular file
// (a directory, a FIFO, a socket, a device): refused before any read, so a
// FIFO with no writer cannot hold the caller.
bool ReadWholeFile(const std::string& path, std::string_view what, std::string* out,
                   std::string* error);

// A bearer token from a file: surrounding whitespace (a trailing newline) is
// dropped; the rest must be non-empty printable ASCII without spaces (it goes
// into an HTTP header). Errors name the path and never quote the contents.
bool ReadBearerToken(const std::string& path, std::string* token, std::string* error);

// "Bearer <token>", the value of the `authorization` header or gRPC metadata.
std::string BearerAuthorization(std::string_view token);

}  // namespace straggler
