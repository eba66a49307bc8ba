// stragglerd's configuration: embedded defaults, an optional YAML file,
// environment variables and command-line flags, in rising precedence.
//
//   ConfigSources src;
//   src.config_file = "/etc/stragglerd.yaml";    // or STRAGGLERD_CONFIG
//   absl::StatusOr<DaemonConfig> cfg = LoadConfig(src, common::GetEnv);
//   if (!cfg.ok()) { /* "stragglerd.yaml:7: unknown key 'limt' in policy" */ }
//   const engine::PolicyConfig& p = cfg->PolicyFor("resnet-42");
//
// Every key, with its default, is documented in deploy/stragglerd.yaml.
// Plain value types and pure functions; no shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "straggler/engine/policy.h"
#include "straggler/common/config_reader.h"  // EnvLookup, GetEnv
#include "straggler/common/tls_config.h"

namespace straggler::daemon {

inline constexpr char kDefaultGrpcAddress[] = "0.0.0.0:7070";
inline constexpr char kDefaultHttpAddress[] = "0.0.0.0:7071";
inline constexpr char kDefaultLogLevel[] = "info";

struct Limits {
  uint32_t max_jobs = 1000;             // jobs the daemon tracks at once
  uint32_t max_ranks_per_job = 65536;   // largest world_size accepted in a hello
  uint32_t max_batch_reports = 10000;   // reports taken from one ReportBatch
  uint32_t events_retained = 100000;    // size of the daemon-wide event ring
  // A job with no open stream and no watcher is forgotten this long after its
  // last activity (last report, last stream detach); its events stay.
  uint32_t job_idle_ttl_seconds = 3600;
  // A job that is not finished, with no open stream and no report for this
  // long, ended unexpectedly (its ranks were killed: docs/runs.md, "Job
  // end"). Far above a client's or agent's reconnect backoff (about 2 s by default)
  // and a daemon restart, whose restored jobs count from the restart, so a
  // job only waiting for its streams to come back is not ended; above the
  // default unresponsive_after_seconds (30), so the ranks have gone
  // unresponsive first.
  uint32_t job_lost_after_seconds = 120;
  // Accepted reports kept per job for ExportReports (a ring, 48 bytes each,
  // filled on use); 0 keeps none. A change applies to jobs created after it.
  uint32_t recent_reports_per_job = 65536;
  // Ingest streams open at once, all jobs; one more is refused with
  // RESOURCE_EXHAUSTED (counted: too_many_streams). A change applies to
  // streams opened after the reload, like the two below. gRPC's memory quota
  // is sized to hold this many (kGrpcStreamQuotaBytes each, server.cc), so
  // that this limit, not the quota's unannounced cuts, is what refuses: the
  // old default of 65 536 was never held (the 32 MiB quota cut streams from
  // about 4 000 on their own connections, 10 000 multiplexed).
  uint32_t max_streams = 2048;
  // Reports per second one stream may send (a token bucket holding up to
  // stream_reports_burst); reports beyond it are rejected as rate_limited.
  // 0 = no limit.
  uint32_t stream_reports_per_second = 20000;
  uint32_t stream_reports_burst = 100000;
  // Largest gRPC message the daemon accepts (any service); a larger one ends
  // its call with RESOURCE_EXHAUSTED.
  uint32_t max_message_bytes = 4194304;
};

// The /metrics exposition (reloadable).
struct MetricsConfig {
  // straggler_rank_* series only for jobs with world_size <= this; 0 = none.
  uint32_t per_rank_max_ranks = 4096;
};

// The HTTP server on http_address (a change needs a restart).
struct HttpConfig {
  uint32_t threads = 4;                 // worker threads serving requests
  // A request must arrive whole within read_timeout_seconds of its first
  // byte, its response be taken within write_timeout_seconds, or the
  // connection is closed (http_deadline.h): slow clients cannot hold workers.
  uint32_t read_timeout_seconds = 5;
  uint32_t write_timeout_seconds = 5;
  uint32_t max_body_bytes = 1048576;    // larger request bodies: 413
  // Keep-alive: a connection serves at most this many requests and is closed
  // after this long idle. A shutdown waits for idle connections to time out
  // (httplib cannot close them), so keep the timeout short.
  uint32_t keep_alive_max_requests = 100;
  uint32_t keep_alive_timeout_seconds = 2;
};

// The job-scoped rendezvous key-value store (RendezvousService; reloadable:
// a change applies to later requests, stored keys keep their expiry).
struct RendezvousConfig {
  uint32_t max_key_bytes = 512;            // longer keys: INVALID_ARGUMENT
  uint32_t max_value_bytes = 1048576;      // larger values: INVALID_ARGUMENT
  uint32_t max_keys_per_job = 65536;       // more live keys: RESOURCE_EXHAUSTED
  uint32_t max_jobs = 1000;                // jobs holding keys at once
  uint32_t default_ttl_seconds = 3600;     // a Set/Add without a TTL
  uint32_t max_ttl_seconds = 86400;        // longer TTLs are capped
  uint32_t max_wait_seconds = 300;         // longest Wait; longer ones are capped
  uint32_t max_waiters = 100000;           // Waits held at once, all jobs
  // Bytes (keys + values) one job's keys hold; a Set beyond: RESOURCE_EXHAUSTED.
  // 64 MiB: thousands of ranks' addresses and communicator ids are far less.
  uint32_t max_bytes_per_job = 67108864;
};

// The state database (docs/persistence.md). path "" keeps everything in
// memory only. A change of path or synchronous needs a restart; the
// retention keys apply at the next retention pass after a reload.
struct PersistenceConfig {
  std::string path;                      // SQLite file, created with its directory
  std::string synchronous = "normal";    // normal | full (docs/persistence.md "Durability level")
  uint32_t event_queue_capacity = 65536; // events waiting for the writer; more are dropped
  uint32_t events_max_age_seconds = 604800;  // 7 days; 0 = no age limit
  uint32_t events_max_rows = 1000000;        // 0 = no row limit
  uint32_t membership_versions_kept = 32;    // per job, newest first (>= 1)
  uint32_t retention_interval_seconds = 60;  // how often retention runs
};

// Replicas on etcd (docs/cluster.md). etcd_endpoints "" (the default): the
// daemon runs alone, as before. Every key needs a restart.
struct ClusterConfig {
  // etcd's client URLs, comma-separated host:port (http:// accepted).
  std::string etcd_endpoints;
  // This replica's id (job-id characters); "" = <hostname>-<gRPC port>.
  std::string replica_id;
  std::string key_prefix = "/stragglerd/";  // must end with '/'
  // The addresses other replicas and clients are redirected to; "" = the
  // listen address, a wildcard host replaced by this host's name.
  std::string advertise_grpc_address;
  std::string advertise_http_address;
  // The lease's TTL asked for (etcd may raise it): a dead replica's jobs are
  // taken over within about this long.
  uint32_t lease_ttl_seconds = 3;
};

// Bearer-token authorization (docs/security.md; reloadable: a SIGHUP
// re-reads token_file, and an unreadable one keeps the running config).
struct AuthConfig {
  std::string token_file;      // "" = no token: admin calls are open to anyone who can connect
  bool protect_reads = false;  // true: QueryService, REST GETs and /metrics need the token too
  // SHA-256 of the token, filled by LoadConfig from token_file ("" = none).
  // The token itself is not kept: a digest cannot leak it into a log or a
  // core dump, and comparing digests takes the same time for any token.
  std::string token_sha256;
};

// What a SIGHUP reload may do to the running security (docs/security.md,
// "Reloading"). Read from each reload's file: it must be written in the file
// that turns something off, and is best removed once that reload is done.
struct SecurityConfig {
  // false: a reload that would turn off the admin token, auth.protect_reads,
  // client certificates or TLS on a listener is refused (an empty or
  // truncated file must not open the daemon).
  bool allow_downgrade = false;
};

// A per-job policy: `match` is a job id or a glob where `*` matches any run
// of characters; `policy` is the top-level policy with the rule's overrides
// applied (already merged and validated).
struct JobPolicyRule {
  std::string match;
  engine::PolicyConfig policy;
};

struct DaemonConfig {
  std::string grpc_address = kDefaultGrpcAddress;
  std::string http_address = kDefaultHttpAddress;
  std::string log_level = kDefaultLogLevel;  // trace|debug|info|warn|error
  engine::PolicyConfig policy;               // default of every job
  std::vector<JobPolicyRule> jobs;           // first match wins
  Limits limits;
  MetricsConfig metrics;
  HttpConfig http;
  RendezvousConfig rendezvous;
  PersistenceConfig persistence;
  common::TlsConfig tls;
  AuthConfig auth;
  SecurityConfig security;
  ClusterConfig cluster;
  std::string config_file;                   // "" = embedded defaults only
  // The file held no key (empty, comments only): all defaults. Accepted at
  // start; a reload refuses it (common::ServeUntilStopped).
  bool empty_file = false;
  // Problems that do not stop the daemon (a token file others can read, a
  // short token), filled by LoadConfig; logged as warnings at the start and
  // at each reload.
  std::vector<std::string> warnings;

  // The policy for `job_id`: the first rule whose pattern matches, else the
  // top-level policy.
  const engine::PolicyConfig& PolicyFor(absl::string_view job_id) const;
};

// Where LoadConfig looks besides the environment: the values of flags that
// were given (unset = not given).
struct ConfigSources {
  std::optional<std::string> config_file;
  std::optional<std::string> grpc_address;
  std::optional<std::string> http_address;
  std::optional<std::string> log_level;
  std::optional<std::string> state_db;  // --state-db: persistence.path
  std::optional<std::string> etcd_endpoints;  // --etcd-endpoints: cluster.etcd_endpoints
};

// Parses YAML text. `source_name` prefixes error messages ("file:line: ...").
absl::StatusOr<DaemonConfig> ParseConfig(absl::string_view yaml_text,
                                         absl::string_view source_name);

// Defaults <- file (flag --config, else STRAGGLERD_CONFIG, else none)
//          <- STRAGGLERD_GRPC_ADDRESS / _HTTP_ADDRESS / _LOG_LEVEL / _STATE_DB
//             / _ETCD_ENDPOINTS <- flags.
// Then reads auth.token_file into auth.token_sha256; an unreadable, empty or
// malformed token file is an error naming the path (never the contents).
absl::StatusOr<DaemonConfig> LoadConfig(const ConfigSources& flags, const common::EnvLookup& env);

// `*` matches any run of characters (also none); every other character
// matches itself.
bool GlobMatch(absl::string_view pattern, absl::string_view text);

// The keys that only a restart applies (addresses, http.*, tls.*,
// persistence.path/synchronous/event_queue_capacity,
// limits.max_message_bytes, cluster.*) whose value differs between the running
// config and a reloaded one, each as "key (old -> new)", in file order.
std::vector<std::string> RestartOnlyChanges(const DaemonConfig& running,
                                            const DaemonConfig& next);

// What a reload from `running` to `next` would turn off: the admin token,
// auth.protect_reads, client certificates (tls.client_ca_file), TLS on the
// gRPC or HTTP listener; each as a phrase naming the key and its old value,
// e.g. "the admin token (auth.token_file=/etc/stragglerd/token)". Empty when
// nothing is turned off.
std::vector<std::string> SecurityDowngrades(const DaemonConfig& running,
                                            const DaemonConfig& next);

// SHA-256 of `token`, 32 raw bytes: what auth.token_sha256 holds, and what
// the Authorizer (auth/auth.h) compares a presented token's digest with.
std::string TokenDigest(std::string_view token);

// A token shorter than this draws a warning at start and reload.
inline constexpr size_t kMinTokenLength = 16;

// Field-by-field equality (engine::PolicyConfig has no operator==).
bool SamePolicy(const engine::PolicyConfig& a, const engine::PolicyConfig& b);

}  // namespace straggler::daemon
