// straggler-agent's configuration: embedded defaults, an optional YAML file,
// environment variables and flags, in rising precedence (as stragglerd's,
// through the same YAML reader, straggler/common/config_reader.h).
//
//   AgentSources src;
//   src.upstream = "stragglerd.cluster:7070";          // --upstream
//   absl::StatusOr<AgentConfig> cfg = LoadAgentConfig(src, common::GetEnv);
//   // error: "agent.yaml:5: buffer.max_reports=0 must be >= 1"
//
// Every key, with its default, is documented in deploy/straggler-agent.yaml.
// Plain value types and pure functions; no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "straggler/common/channel_security.h"
#include "straggler/common/config_reader.h"  // EnvLookup, GetEnv
#include "straggler/common/tls_config.h"

namespace straggler::agent {

inline constexpr char kDefaultListen[] = "unix:///run/straggler/agent.sock";
inline constexpr char kDefaultUpstream[] = "127.0.0.1:7070";
inline constexpr char kDefaultHttpAddress[] = "0.0.0.0:7072";

struct AgentConfig {
  // Restart needed for a change of these.
  std::string listen = kDefaultListen;  // unix:PATH or unix:///PATH
  std::string listen_tcp;               // HOST:PORT, "" = no TCP listener
  // TLS on listen_tcp (docs/security.md), as stragglerd's tls: cert_file +
  // key_file ("" = plaintext), client_ca_file (mutual TLS), reload_seconds
  // (gRPC re-reads the files that often). grpc/http are unused here. The
  // unix socket is always plaintext: its file mode guards it.
  common::TlsConfig listen_tcp_tls;
  std::string upstream = kDefaultUpstream;
  // TLS to the daemon (docs/security.md); all empty = plaintext.
  ChannelSecurity upstream_tls;
  std::string http_address = kDefaultHttpAddress;  // "" = no HTTP
  // The HTTP listener (restart needed for a change), as stragglerd's http.*:
  // a request must arrive whole within http_read_timeout_seconds of its
  // first byte and its response be taken within http_write_timeout_seconds,
  // or the connection is closed (straggler/common/http_deadline.h), so slow
  // clients cannot hold the http_threads workers; idle keep-alive
  // connections close after http_keep_alive_timeout_seconds.
  uint32_t http_threads = 4;
  uint32_t http_read_timeout_seconds = 5;
  uint32_t http_write_timeout_seconds = 5;
  uint32_t http_keep_alive_timeout_seconds = 2;
  std::string node;                     // name sent upstream; "" = host name
  // GPU telemetry (restart needed for a change): NVML sampled every
  // telemetry_interval_ms; nvml_library "" = $STRAGGLER_NVML_LIBRARY, else
  // libnvidia-ml.so.1. Without NVML the agent runs with telemetry off.
  bool telemetry_enabled = true;
  uint32_t telemetry_interval_ms = 1000;
  std::string nvml_library;
  // Host telemetry (restart needed for a change; docs/agent.md#host-telemetry):
  // pressure, steal and the trainers' run delay read from proc_root every
  // host_telemetry_interval_ms.
  bool host_telemetry_enabled = true;
  uint32_t host_telemetry_interval_ms = 1000;
  std::string proc_root = "/proc";
  // Live on SIGHUP.
  std::string log_level = "info";
  uint32_t batch_max_reports = 256;     // an upstream batch is sent at this size...
  uint32_t batch_max_delay_ms = 5;      // ...or this long after its oldest report arrived
  // Reports held per job while unacknowledged: 8 ranks x 10 iterations/s for
  // ~13 minutes. Overflow drops the oldest (counted).
  uint32_t buffer_max_reports = 65536;
  uint32_t reconnect_initial_ms = 100;  // first retry delay; doubles per failure
  uint32_t reconnect_max_ms = 2000;     // retry delay cap (+-20% jitter): a daemon back is found within ~2 s
  uint32_t shutdown_flush_ms = 5000;    // SIGTERM: time to deliver the buffer upstream
  // A job with no trainer stream and an empty buffer for this long is
  // forgotten (its upstream stream closed, its state freed).
  uint32_t idle_job_timeout_ms = 300000;
  std::string config_file;              // "" = embedded defaults only
  // The file held no key (empty, comments only): all defaults. Accepted at
  // start; a reload refuses it (common::ServeUntilStopped).
  bool empty_file = false;
};

// Flags that were given (unset = not given).
struct AgentSources {
  std::optional<std::string> config_file;
  std::optional<std::string> listen;
  std::optional<std::string> listen_tcp;
  std::optional<std::string> upstream;
  std::optional<std::string> http_address;
  std::optional<std::string> log_level;
  std::optional<std::string> node;
};

// Parses YAML text over the defaults; `source_name` prefixes errors.
absl::StatusOr<AgentConfig> ParseAgentConfig(const std::string& yaml_text,
                                             const std::string& source_name);

// Defaults <- file (--config, else STRAGGLER_AGENT_CONFIG) <- environment
// (STRAGGLER_AGENT_LISTEN, _LISTEN_TCP, _UPSTREAM, _HTTP_ADDRESS, _LOG_LEVEL,
// _NODE, _TELEMETRY_ENABLED, _TELEMETRY_INTERVAL_MS) <- flags, validated.
// A bad environment value is an error naming the variable and the value.
absl::StatusOr<AgentConfig> LoadAgentConfig(const AgentSources& flags,
                                            const common::EnvLookup& env);

// unix:///a/b or unix:/a/b -> /a/b; nullopt for anything else.
std::optional<std::string> UnixSocketPath(const std::string& address);

}  // namespace straggler::agent
