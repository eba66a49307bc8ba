#include "config/config.h"

#include <openssl/sha.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "straggler/common/channel_security.h"
#include "straggler/common/config_reader.h"
#include "straggler/common/config_sections.h"
#include "straggler/common/validate.h"
#include "yaml-cpp/yaml.h"

namespace straggler::daemon {
namespace {

using engine::PolicyConfig;
using engine::PolicyKind;
using engine::RecoveryMode;

// The field table lives with PolicyConfig; it drives parsing, equality and
// (through wire/policy_convert.cc) the wire mapping.
using engine::PolicyField;
using engine::PolicyMember;

class Parser : public common::ConfigReader {
 public:
  using common::ConfigReader::ConfigReader;

  // Applies the keys present in `node` (a map) over `policy`; `context`
  // names the map in messages ("policy", "jobs[2].policy").
  absl::Status ApplyPolicy(const YAML::Node& node, absl::string_view context,
                           PolicyConfig& policy) const {
    return common::ReadSection(
        *this, node, context, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
          const PolicyField* field = nullptr;
          for (const auto& f : engine::PolicyFields()) {
            if (key == f.name) field = &f;
          }
          if (field == nullptr) return common::UnknownKey();
          const std::string qualified = absl::StrCat(context, ".", key);
          return std::visit(
              [&](auto member) -> absl::Status {
                using T = std::remove_reference_t<decltype(policy.*member)>;
                if constexpr (std::is_same_v<T, uint32_t>) {
                  auto v = Uint(value, qualified);
                  if (!v.ok()) return v.status();
                  policy.*member = *v;
                } else if constexpr (std::is_same_v<T, double>) {
                  auto v = Double(value, qualified);
                  if (!v.ok()) return v.status();
                  policy.*member = *v;
                } else if constexpr (std::is_same_v<T, bool>) {
                  auto v = Bool(value, qualified);
                  if (!v.ok()) return v.status();
                  policy.*member = *v;
                } else {  // PolicyKind or RecoveryMode, by its name
                  constexpr bool kKind = std::is_same_v<T, PolicyKind>;
                  auto s = String(value, qualified);
                  if (!s.ok()) return s.status();
                  absl::StatusOr<T> v;
                  if constexpr (kKind) {
                    v = engine::ParsePolicyKind(*s);
                  } else {
                    v = engine::ParseRecoveryMode(*s);
                  }
                  if (!v.ok()) {
                    return Error(value.Mark(),
                                 absl::StrCat(qualified, "=", *s, " is not ",
                                              kKind ? engine::PolicyKindChoices()
                                                    : engine::RecoveryModeChoices()));
                  }
                  policy.*member = *v;
                }
                return absl::OkStatus();
              },
              field->member);
        });
  }

  absl::Status ValidatePolicy(const YAML::Node& node, absl::string_view context,
                              const PolicyConfig& policy) const {
    absl::Status s = policy.Validate();
    if (s.ok()) return s;
    return Error(node.Mark(), absl::StrCat(context, ": ", s.message()));
  }

  absl::Status ApplyLimits(const YAML::Node& node, Limits& limits) const {
    // Below this not even a hello with a few ranks fits.
    constexpr uint32_t kMinMessageBytes = 4096;
    return common::ReadUintSection(
        *this, node, "limits",
        {{"max_jobs", &limits.max_jobs},
         {"max_ranks_per_job", &limits.max_ranks_per_job},
         {"max_batch_reports", &limits.max_batch_reports},
         {"events_retained", &limits.events_retained},
         {"job_idle_ttl_seconds", &limits.job_idle_ttl_seconds},
         {"job_lost_after_seconds", &limits.job_lost_after_seconds},
         // 0: keep no reports (ExportReports returns none).
         {"recent_reports_per_job", &limits.recent_reports_per_job, /*zero_allowed=*/true},
         {"max_streams", &limits.max_streams},
         // 0: no rate limit.
         {"stream_reports_per_second", &limits.stream_reports_per_second, /*zero_allowed=*/true},
         {"stream_reports_burst", &limits.stream_reports_burst},
         {"max_message_bytes", &limits.max_message_bytes}},
        [&](absl::string_view key, uint32_t v, const YAML::Node& value) -> absl::Status {
          if (key == "max_message_bytes" && v < kMinMessageBytes) {
            return Error(value.Mark(), absl::StrCat("limits.max_message_bytes=", v,
                                                    " must be >= ", kMinMessageBytes));
          }
          return absl::OkStatus();
        });
  }

  absl::Status ApplyRendezvous(const YAML::Node& node, RendezvousConfig& rv) const {
    absl::Status read = common::ReadUintSection(*this, node, "rendezvous",
                                                {{"max_key_bytes", &rv.max_key_bytes},
                                                 {"max_value_bytes", &rv.max_value_bytes},
                                                 {"max_keys_per_job", &rv.max_keys_per_job},
                                                 {"max_jobs", &rv.max_jobs},
                                                 {"default_ttl_seconds", &rv.default_ttl_seconds},
                                                 {"max_ttl_seconds", &rv.max_ttl_seconds},
                                                 {"max_wait_seconds", &rv.max_wait_seconds},
                                                 {"max_waiters", &rv.max_waiters},
                                                 {"max_bytes_per_job", &rv.max_bytes_per_job}});
    if (!read.ok()) return read;
    if (rv.default_ttl_seconds > rv.max_ttl_seconds) {
      return Error(node.Mark(),
                   absl::StrCat("rendezvous.default_ttl_seconds=", rv.default_ttl_seconds,
                                " must be <= rendezvous.max_ttl_seconds=", rv.max_ttl_seconds));
    }
    // Else the largest key and value allowed could never be stored.
    if (const uint64_t one = uint64_t{rv.max_key_bytes} + rv.max_value_bytes;
        rv.max_bytes_per_job < one) {
      return Error(node.Mark(),
                   absl::StrCat("rendezvous.max_bytes_per_job=", rv.max_bytes_per_job,
                                " must be >= rendezvous.max_key_bytes + max_value_bytes (", one,
                                ")"));
    }
    return absl::OkStatus();
  }

  absl::Status ApplyMetrics(const YAML::Node& node, MetricsConfig& metrics) const {
    // 0 = no per-rank series.
    return common::ReadUintSection(
        *this, node, "metrics",
        {{"per_rank_max_ranks", &metrics.per_rank_max_ranks, /*zero_allowed=*/true}});
  }

  absl::Status ApplyHttp(const YAML::Node& node, HttpConfig& http) const {
    return common::ReadUintSection(
        *this, node, "http",
        {{"threads", &http.threads},
         {"read_timeout_seconds", &http.read_timeout_seconds},
         {"write_timeout_seconds", &http.write_timeout_seconds},
         {"max_body_bytes", &http.max_body_bytes},
         {"keep_alive_max_requests", &http.keep_alive_max_requests},
         {"keep_alive_timeout_seconds", &http.keep_alive_timeout_seconds}},
        [&](absl::string_view key, uint32_t v, const YAML::Node& value) -> absl::Status {
          if (key == "threads" && v > 256) {
            return Error(value.Mark(), absl::StrCat("http.threads=", v, " must be <= 256"));
          }
          return absl::OkStatus();
        });
  }

  absl::Status ApplyPersistence(const YAML::Node& node, PersistenceConfig& p) const {
    return common::ReadSection(
        *this, node, "persistence",
        [&](const std::string& key, const YAML::Node& value) -> absl::Status {
          const std::string qualified = absl::StrCat("persistence.", key);
          if (key == "path" || key == "synchronous") {
            auto v = String(value, qualified);
            if (!v.ok()) return v.status();
            if (key == "synchronous" && *v != "normal" && *v != "full") {
              return Error(value.Mark(),
                           absl::StrCat(qualified, "=", *v, " must be 'normal' or 'full'"));
            }
            (key == "path" ? p.path : p.synchronous) = *v;
            return absl::OkStatus();
          }
          uint32_t* target = nullptr;
          if (key == "event_queue_capacity") target = &p.event_queue_capacity;
          if (key == "events_max_age_seconds") target = &p.events_max_age_seconds;
          if (key == "events_max_rows") target = &p.events_max_rows;
          if (key == "membership_versions_kept") target = &p.membership_versions_kept;
          if (key == "retention_interval_seconds") target = &p.retention_interval_seconds;
          if (target == nullptr) return common::UnknownKey();
          auto v = Uint(value, qualified);
          if (!v.ok()) return v.status();
          // 0 means "no limit" only for the two event limits.
          if (*v == 0 && key != "events_max_age_seconds" && key != "events_max_rows") {
            return Error(value.Mark(), absl::StrCat(qualified, "=0 must be > 0"));
          }
          *target = *v;
          return absl::OkStatus();
        });
  }

  absl::Status ApplyAuth(const YAML::Node& node, AuthConfig& auth) const {
    absl::Status read = common::ReadSection(
        *this, node, "auth", [&](const std::string& key, const YAML::Node& value) -> absl::Status {
          const std::string qualified = absl::StrCat("auth.", key);
          if (key == "token_file") {
            auto v = String(value, qualified);
            if (!v.ok()) return v.status();
            auth.token_file = *v;
          } else if (key == "protect_reads") {
            auto v = Bool(value, qualified);
            if (!v.ok()) return v.status();
            auth.protect_reads = *v;
          } else {
            return common::UnknownKey();
          }
          return absl::OkStatus();
        });
    if (!read.ok()) return read;
    if (auth.protect_reads && auth.token_file.empty()) {
      return Error(node.Mark(), "auth.protect_reads=true needs auth.token_file");
    }
    return absl::OkStatus();
  }

  absl::Status ApplyCluster(const YAML::Node& node, ClusterConfig& c) const {
    return common::ReadSection(
        *this, node, "cluster",
        [&](const std::string& key, const YAML::Node& value) -> absl::Status {
          const std::string qualified = absl::StrCat("cluster.", key);
          if (key == "lease_ttl_seconds") {
            auto v = Uint(value, qualified);
            if (!v.ok()) return v.status();
            if (*v == 0) return Error(value.Mark(), absl::StrCat(qualified, "=0 must be > 0"));
            c.lease_ttl_seconds = *v;
            return absl::OkStatus();
          }
          std::string* target = key == "etcd_endpoints"           ? &c.etcd_endpoints
                                : key == "replica_id"             ? &c.replica_id
                                : key == "key_prefix"             ? &c.key_prefix
                                : key == "advertise_grpc_address" ? &c.advertise_grpc_address
                                : key == "advertise_http_address" ? &c.advertise_http_address
                                                                  : nullptr;
          if (target == nullptr) return common::UnknownKey();
          auto v = String(value, qualified);
          if (!v.ok()) return v.status();
          if (key == "key_prefix" && (v->empty() || v->back() != '/')) {
            return Error(value.Mark(), absl::StrCat(qualified, "=", *v, " must end with '/'"));
          }
          *target = *v;
          return absl::OkStatus();
        });
  }

  absl::Status ApplyJobs(const YAML::Node& node, DaemonConfig& config) const {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsSequence()) {
      return Error(node.Mark(), "jobs must be a list of {match, policy}");
    }
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node item = node[i];
      const std::string context = absl::StrCat("jobs[", i, "]");
      if (!item.IsMap()) return Error(item.Mark(), absl::StrCat(context, " must be a map"));
      JobPolicyRule rule;
      rule.policy = config.policy;
      bool has_match = false;
      YAML::Node policy_node;
      absl::Status read = common::ReadSection(
          *this, item, context, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
            if (key == "match") {
              auto m = String(value, context + ".match");
              if (!m.ok()) return m.status();
              if (m->empty()) return Error(value.Mark(), context + ".match must not be empty");
              rule.match = *m;
              has_match = true;
            } else if (key == "policy") {
              policy_node = value;
            } else {
              return common::UnknownKey();
            }
            return absl::OkStatus();
          });
      if (!read.ok()) return read;
      if (!has_match) return Error(item.Mark(), context + " needs a 'match' key");
      const std::string policy_context = absl::StrCat(context, " (match '", rule.match, "') policy");
      if (policy_node) {
        if (absl::Status s = ApplyPolicy(policy_node, policy_context, rule.policy); !s.ok()) {
          return s;
        }
        if (absl::Status s = ValidatePolicy(policy_node, policy_context, rule.policy); !s.ok()) {
          return s;
        }
      }
      config.jobs.push_back(std::move(rule));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<DaemonConfig> Parse(absl::string_view text) const {
    absl::StatusOr<YAML::Node> loaded = Load(std::string(text));
    if (!loaded.ok()) return loaded.status();
    const YAML::Node& root = *loaded;
    DaemonConfig config;
    // An empty file means all defaults at start; a reload refuses it
    // (common::ServeUntilStopped).
    config.empty_file = root.IsNull();
    if (root.IsNull()) return config;
    if (!root.IsMap()) return Error(root.Mark(), "the top level must be a map of keys");

    // `policy` first: job rules are overrides on top of it, wherever they
    // appear in the file.
    YAML::Node jobs_node;
    for (const auto& kv : root) {
      const std::string key = kv.first.Scalar();
      absl::Status s;
      if (key == "grpc_address" || key == "http_address" || key == "log_level") {
        auto v = String(kv.second, key);
        if (!v.ok()) return v.status();
        if (key == "grpc_address") config.grpc_address = *v;
        if (key == "http_address") config.http_address = *v;
        if (key == "log_level") config.log_level = *v;
      } else if (key == "policy") {
        s = ApplyPolicy(kv.second, "policy", config.policy);
        if (s.ok()) s = ValidatePolicy(kv.second, "policy", config.policy);
      } else if (key == "jobs") {
        jobs_node = kv.second;
      } else if (key == "limits") {
        s = ApplyLimits(kv.second, config.limits);
      } else if (key == "metrics") {
        s = ApplyMetrics(kv.second, config.metrics);
      } else if (key == "rendezvous") {
        s = ApplyRendezvous(kv.second, config.rendezvous);
      } else if (key == "http") {
        s = ApplyHttp(kv.second, config.http);
      } else if (key == "persistence") {
        s = ApplyPersistence(kv.second, config.persistence);
      } else if (key == "tls") {
        s = common::ParseTlsSection(*this, kv.second, "tls", /*listener_switches=*/true,
                                    config.tls);
      } else if (key == "auth") {
        s = ApplyAuth(kv.second, config.auth);
      } else if (key == "cluster") {
        s = ApplyCluster(kv.second, config.cluster);
      } else if (key == "security") {
        s = common::ReadSection(
            *this, kv.second, "security",
            [&](const std::string& k, const YAML::Node& value) -> absl::Status {
              if (k != "allow_downgrade") return common::UnknownKey();
              auto v = Bool(value, "security.allow_downgrade");
              if (!v.ok()) return v.status();
              config.security.allow_downgrade = *v;
              return absl::OkStatus();
            });
      } else {
        s = Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "'"));
      }
      if (!s.ok()) return s;
    }
    if (jobs_node) {
      if (absl::Status s = ApplyJobs(jobs_node, config); !s.ok()) return s;
    }
    return config;
  }
};

}  // namespace

const engine::PolicyConfig& DaemonConfig::PolicyFor(absl::string_view job_id) const {
  for (const auto& rule : jobs) {
    if (GlobMatch(rule.match, job_id)) return rule.policy;
  }
  return policy;
}

std::string TokenDigest(std::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof digest);
}

bool GlobMatch(absl::string_view pattern, absl::string_view text) {
  // Iterative matcher with one backtrack point: linear in practice and no
  // recursion on hostile patterns.
  size_t p = 0, t = 0, star = absl::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (p < pattern.size() && pattern[p] == text[t]) {
      ++p;
      ++t;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool SamePolicy(const engine::PolicyConfig& a, const engine::PolicyConfig& b) {
  for (const auto& f : engine::PolicyFields()) {
    const bool same = std::visit([&](auto member) { return a.*member == b.*member; }, f.member);
    if (!same) return false;
  }
  return true;
}

absl::StatusOr<DaemonConfig> ParseConfig(absl::string_view yaml_text,
                                         absl::string_view source_name) {
  return Parser(source_name).Parse(yaml_text);
}

absl::StatusOr<DaemonConfig> LoadConfig(const ConfigSources& flags, const common::EnvLookup& env) {
  absl::StatusOr<DaemonConfig> loaded = common::LoadConfigFileOrDefaults<DaemonConfig>(
      flags.config_file, "STRAGGLERD_CONFIG", env, ParseConfig);
  if (!loaded.ok()) return loaded.status();
  DaemonConfig config = *std::move(loaded);

  common::Override(config.grpc_address, env("STRAGGLERD_GRPC_ADDRESS"), flags.grpc_address);
  common::Override(config.http_address, env("STRAGGLERD_HTTP_ADDRESS"), flags.http_address);
  common::Override(config.log_level, env("STRAGGLERD_LOG_LEVEL"), flags.log_level);
  common::Override(config.persistence.path, env("STRAGGLERD_STATE_DB"), flags.state_db);
  common::Override(config.cluster.etcd_endpoints, env("STRAGGLERD_ETCD_ENDPOINTS"),
                   flags.etcd_endpoints);

  if (absl::Status s =
          common::ValidateAddress("grpc_address", config.grpc_address, /*allow_unix=*/true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          common::ValidateAddress("http_address", config.http_address, /*allow_unix=*/false);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = common::ValidateLogLevel(config.log_level); !s.ok()) return s;
  if (!config.cluster.replica_id.empty()) {
    if (absl::Status s = common::ValidateJobId("cluster.replica_id", config.cluster.replica_id);
        !s.ok()) {
      return s;
    }
  }
  if (!config.auth.token_file.empty()) {
    std::string token, error;
    if (!ReadBearerToken(config.auth.token_file, &token, &error)) {
      return absl::FailedPreconditionError(absl::StrCat("auth.token_file: ", error));
    }
    config.auth.token_sha256 = TokenDigest(token);
    struct stat st {};
    if (stat(config.auth.token_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      config.warnings.push_back(absl::StrFormat(
          "auth.token_file %s has mode %04o: group or others may read the token (chmod 600 it)",
          config.auth.token_file, st.st_mode & 07777));
    }
    if (token.size() < kMinTokenLength) {
      config.warnings.push_back(absl::StrCat(
          "auth.token_file ", config.auth.token_file, " holds a ", token.size(),
          "-character token: use at least ", kMinTokenLength,
          " random characters (openssl rand -hex 32)"));
    }
  }
  return config;
}

std::vector<std::string> RestartOnlyChanges(const DaemonConfig& running,
                                            const DaemonConfig& next) {
  std::vector<std::string> out;
  auto cmp = [&](const char* key, const auto& a, const auto& b) {
    if (a == b) return;
    out.push_back(absl::StrCat(key, " (", a, " -> ", b, ")"));
  };
  auto cmp_bool = [&](const char* key, bool a, bool b) {
    cmp(key, a ? "true" : "false", b ? "true" : "false");
  };
  cmp("grpc_address", running.grpc_address, next.grpc_address);
  cmp("http_address", running.http_address, next.http_address);
  cmp("limits.max_message_bytes", running.limits.max_message_bytes,
      next.limits.max_message_bytes);
  const HttpConfig &h0 = running.http, &h1 = next.http;
  cmp("http.threads", h0.threads, h1.threads);
  cmp("http.read_timeout_seconds", h0.read_timeout_seconds, h1.read_timeout_seconds);
  cmp("http.write_timeout_seconds", h0.write_timeout_seconds, h1.write_timeout_seconds);
  cmp("http.max_body_bytes", h0.max_body_bytes, h1.max_body_bytes);
  cmp("http.keep_alive_max_requests", h0.keep_alive_max_requests, h1.keep_alive_max_requests);
  cmp("http.keep_alive_timeout_seconds", h0.keep_alive_timeout_seconds,
      h1.keep_alive_timeout_seconds);
  const PersistenceConfig &p0 = running.persistence, &p1 = next.persistence;
  cmp("persistence.path", p0.path, p1.path);
  cmp("persistence.synchronous", p0.synchronous, p1.synchronous);
  cmp("persistence.event_queue_capacity", p0.event_queue_capacity, p1.event_queue_capacity);
  const common::TlsConfig &t0 = running.tls, &t1 = next.tls;
  cmp("tls.cert_file", t0.cert_file, t1.cert_file);
  cmp("tls.key_file", t0.key_file, t1.key_file);
  cmp("tls.client_ca_file", t0.client_ca_file, t1.client_ca_file);
  cmp_bool("tls.grpc", t0.grpc, t1.grpc);
  cmp_bool("tls.http", t0.http, t1.http);
  cmp("tls.reload_seconds", t0.reload_seconds, t1.reload_seconds);
  const ClusterConfig &c0 = running.cluster, &c1 = next.cluster;
  cmp("cluster.etcd_endpoints", c0.etcd_endpoints, c1.etcd_endpoints);
  cmp("cluster.replica_id", c0.replica_id, c1.replica_id);
  cmp("cluster.key_prefix", c0.key_prefix, c1.key_prefix);
  cmp("cluster.advertise_grpc_address", c0.advertise_grpc_address, c1.advertise_grpc_address);
  cmp("cluster.advertise_http_address", c0.advertise_http_address, c1.advertise_http_address);
  cmp("cluster.lease_ttl_seconds", c0.lease_ttl_seconds, c1.lease_ttl_seconds);
  return out;
}

std::vector<std::string> SecurityDowngrades(const DaemonConfig& running,
                                            const DaemonConfig& next) {
  std::vector<std::string> out;
  if (!running.auth.token_file.empty() && next.auth.token_file.empty()) {
    out.push_back(absl::StrCat("the admin token (auth.token_file=", running.auth.token_file, ")"));
  }
  if (running.auth.protect_reads && !next.auth.protect_reads) {
    out.push_back("the token on reads (auth.protect_reads=true)");
  }
  const common::TlsConfig &t0 = running.tls, &t1 = next.tls;
  if (!t0.client_ca_file.empty() && t1.client_ca_file.empty()) {
    out.push_back(absl::StrCat("client certificates (tls.client_ca_file=", t0.client_ca_file, ")"));
  }
  // TLS changes take effect at the next restart: refused now, as the
  // restart would apply them.
  for (const auto& [name, was, is] : {std::tuple{"gRPC", t0.enabled() && t0.grpc,
                                                 t1.enabled() && t1.grpc},
                                      std::tuple{"HTTP", t0.enabled() && t0.http,
                                                 t1.enabled() && t1.http}}) {
    if (was && !is) {
      out.push_back(absl::StrCat("TLS on the ", name, " listener (tls.cert_file=", t0.cert_file,
                                 ")"));
    }
  }
  return out;
}

}  // namespace straggler::daemon
