#include "config/config.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "auth/auth.h"
#include "straggler/common/channel_security.h"
#include "straggler/common/config_reader.h"
#include "yaml-cpp/yaml.h"

namespace straggler::daemon {
namespace {

using engine::PolicyConfig;
using engine::PolicyKind;
using engine::RecoveryMode;

// The field table lives with PolicyConfig; it drives parsing, equality and
// (through convert.cc) the wire mapping.
using engine::PolicyField;
using engine::PolicyMember;

class Parser : public ConfigReader {
 public:
  using ConfigReader::ConfigReader;

  // Applies the keys present in `node` (a map) over `policy`; `context`
  // names the map in messages ("policy", "jobs[2].policy").
  absl::Status ApplyPolicy(const YAML::Node& node, absl::string_view context,
                           PolicyConfig& policy) const {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return Error(node.Mark(), absl::StrCat(context, " must be a map"));
    for (const auto& kv : node) {
      const std::string key = kv.first.Scalar();
      const PolicyField* field = nullptr;
      for (const auto& f : engine::PolicyFields()) {
        if (key == f.name) field = &f;
      }
      if (field == nullptr) {
        return Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "' in ", context));
      }
      const std::string qualified = absl::StrCat(context, ".", key);
      absl::Status status = std::visit(
          [&](auto member) -> absl::Status {
            using T = std::remove_reference_t<decltype(policy.*member)>;
            if constexpr (std::is_same_v<T, uint32_t>) {
              auto v = Uint(kv.second, qualified);
              if (!v.ok()) return v.status();
              policy.*member = *v;
            } else if constexpr (std::is_same_v<T, double>) {
              auto v = Double(kv.second, qualified);
              if (!v.ok()) return v.status();
              policy.*member = *v;
            } else if constexpr (std::is_same_v<T, bool>) {
              auto v = Bool(kv.second, qualified);
              if (!v.ok()) return v.status();
              policy.*member = *v;
            } else if constexpr (std::is_same_v<T, PolicyKind>) {
              auto s = String(kv.second, qualified);
              if (!s.ok()) return s.status();
              auto v = engine::ParsePolicyKind(*s);
              if (!v.ok()) {
                return Error(kv.second.Mark(), absl::StrCat(qualified, "=", *s,
                                                            " is not dynamic, ewma or static"));
              }
              policy.*member = *v;
            } else {
              auto s = String(kv.second, qualified);
              if (!s.ok()) return s.status();
              auto v = engine::ParseRecoveryMode(*s);
              if (!v.ok()) {
                return Error(kv.second.Mark(),
                             absl::StrCat(qualified, "=", *s, " is not shadow or probation"));
              }
              policy.*member = *v;
            }
            return absl::OkStatus();
          },
          field->member);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  absl::Status ValidatePolicy(const YAML::Node& node, absl::string_view context,
                              const PolicyConfig& policy) const {
    absl::Status s = policy.Validate();
    if (s.ok()) return s;
    return Error(node.Mark(), absl::StrCat(context, ": ", s.message()));
  }

  absl::Status ApplyLimits(const YAML::Node& node, Limits& limits) const {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return Error(node.Mark(), "limits must be a map");
    for (const auto& kv : node) {
      const std::string key = kv.first.Scalar();
      uint32_t* target = nullptr;
      if (key == "max_jobs") target = &limits.max_jobs;
      if (key == "max_ranks_per_job") target = &limits.max_ranks_per_job;
      if (key == "max_batch_reports") target = &limits.max_batch_reports;
      if (key == "events_retained") target = &limits.events_retained;
      if (key == "job_idle_ttl_seconds") target = &limits.job_idle_ttl_seconds;
      if (key == "recent_reports_per_job") target = &limits.recent_reports_per_job;
      if (key == "max_streams") target = &limits.max_streams;
      if (key == "stream_reports_per_second") target = &limits.stream_reports_per_second;
      if (key == "stream_reports_burst") target = &limits.stream_reports_burst;
      if (key == "max_message_bytes") target = &limits.max_message_bytes;
      if (target == nullptr) {
        return Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "' in limits"));
      }
      const std::string qualified = absl::StrCat("limits.", key);
      auto v = Uint(kv.second, qualified);
      if (!v.ok()) return v.status();
      // recent_reports_per_job=0: keep no reports (ExportReports returns none);
      // stream_reports_per_second=0: no rate limit.
      if (*v == 0 && key != "recent_reports_per_job" && key != "stream_reports_per_second") {
        return Error(kv.second.Mark(), absl::StrCat(qualified, "=0 must be > 0"));
      }
      // Below this not even a hello with a few ranks fits.
      constexpr uint32_t kMinMessageBytes = 4096;
      if (key == "max_message_bytes" && *v < kMinMessageBytes) {
        return Error(kv.second.Mark(),
                     absl::StrCat(qualified, "=", *v, " must be >= ", kMinMessageBytes));
      }
      *target = *v;
    }
    return absl::OkStatus();
  }

  absl::Status ApplyRendezvous(const YAML::Node& node, RendezvousConfig& rv) const {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return Error(node.Mark(), "rendezvous must be a map");
    for (const auto& kv : node) {
      const std::string key = kv.first.Scalar();
      uint32_t* target = nullptr;
      if (key == "max_key_bytes") target = &rv.max_key_bytes;
      if (key == "max_value_bytes") target = &rv.max_value_bytes;
      if (key == "max_keys_per_job") target = &rv.max_keys_per_job;
      if (key == "max_jobs") target = &rv.max_jobs;
      if (key == "default_ttl_seconds") target = &rv.default_ttl_seconds;
      if (key == "max_ttl_seconds") target = &rv.max_ttl_seconds;
      if (key == "max_wait_seconds") target = &rv.max_wait_seconds;
      if (key == "max_waiters") target = &rv.max_waiters;
      if (target == nullptr) {
        return Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "' in rendezvous"));
      }
      const std::string qualified = absl::StrCat("rendezvous.", key);
      auto v = Uint(kv.second, qualified);
      if (!v.ok()) return v.status();
      if (*v == 0) return Error(kv.second.Mark(), absl::StrCat(qualified, "=0 must be > 0"));
      *target = *v;
    }
    if (rv.default_ttl_seconds > rv.max_ttl_seconds) {
      return Error(node.Mark(), absl::StrCat("rendezvous.default_ttl_seconds=", rv.default_ttl_seconds,
                                             " must be <= rendezvous.max_ttl_seconds=",
                                             rv.max_ttl_seconds));
    }
    return absl::OkStatus();
  }

  absl::Status ApplyMetrics(const YAML::Node& node, MetricsConfig& metrics) const {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return Error(node.Mark(), "metrics must be a map");
    for (const auto& kv : node) {
      const std::string key = kv.first.Scalar();
      if (key != "per_rank_max_ranks") {
        return Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "' in metrics"));
      }
      auto v = Uint(kv.second, "metrics.per_rank_max_ranks");  // 0 = no per-rank series
      if (!v.ok()) return v.status();
      metrics.per_rank_max_ranks = *v;
    }
    return absl::OkStatus();
  }

  absl::Status ApplyHttp(const YAML::Node& node, HttpConfig& http) const {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return Error(node.Mark(), "http must be a map");
    for (const auto& kv : node) {
      const std::string key = kv.first.Scalar();
      uint32_t* target = nullptr;
      if (key == "threads") target = &http.threads;
      if (key == "read_timeout_seconds") target = &http.read_timeout_seconds;
      if (key == "write_timeout_seconds") target = &http.write_timeout_seconds;
      if (key == "max_body_bytes") target = &http.max_body_bytes;
      if (key == "keep_alive_max_requests") target = &http.keep_alive_max_requests;
      if (key == "keep_alive_timeout_seconds") target = &http.keep_alive_timeout_seconds;
      if (target == nullptr) {
        return Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "' in http"));
      }
      const std::string qualified = absl::StrCat("http.", key);
      auto v = Uint(kv.second, qualified);
      if (!v.ok()) return v.status();
      if (*v == 0) return Error(kv.second.Mark(), absl::StrCat(qualified, "=0 must be > 0"));
      if (key == "threads" && *v > 256) {
        return Error(kv.second.Mark(), absl::StrCat(qualified, "=", *v, " must be <= 256"));
      }
      *target = *v;
    }
    return absl::OkStatus();
  }

  absl::Status ApplyPersistence(const YAML::Node& node, PersistenceConfig& p) const {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return Error(node.Mark(), "persistence must be a map");
    for (const auto& kv : node) {
      const std::string key = kv.first.Scalar();
      const std::string qualified = absl::StrCat("persistence.", key);
      if (key == "path" || key == "synchronous") {
        auto v = String(kv.second, qualified);
        if (!v.ok()) return v.status();
        if (key == "synchronous" && *v != "normal" && *v != "full") {
          return Error(kv.second.Mark(),
                       absl::StrCat(qualified, "=", *v, " must be 'normal' or 'full'"));
        }
        (key == "path" ? p.path : p.synchronous) = *v;
        continue;
      }
      uint32_t* target = nullptr;
      if (key == "event_queue_capacity") target = &p.event_queue_capacity;
      if (key == "events_max_age_seconds") target = &p.events_max_age_seconds;
      if (key == "events_max_rows") target = &p.events_max_rows;
      if (key == "membership_versions_kept") target = &p.membership_versions_kept;
      if (key == "retention_interval_seconds") target = &p.retention_interval_seconds;
      if (target == nullptr) {
        return Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "' in persistence"));
      }
      auto v = Uint(kv.second, qualified);
      if (!v.ok()) return v.status();
      // 0 means "no limit" only for the two event limits.
      if (*v == 0 && key != "events_max_age_seconds" && key != "events_max_rows") {
        return Error(kv.second.Mark(), absl::StrCat(qualified, "=0 must be > 0"));
      }
      *target = *v;
    }
    return absl::OkStatus();
  }

  absl::Status ApplyAuth(const YAML::Node& node, AuthConfig& auth) const {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return Error(node.Mark(), "auth must be a map");
    for (const auto& kv : node) {
      const std::string key = kv.first.Scalar();
      const std::string qualified = absl::StrCat("auth.", key);
      if (key == "token_file") {
        auto v = String(kv.second, qualified);
        if (!v.ok()) return v.status();
        auth.token_file = *v;
      } else if (key == "protect_reads") {
        auto v = Bool(kv.second, qualified);
        if (!v.ok()) return v.status();
        auth.protect_reads = *v;
      } else {
        return Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "' in auth"));
      }
    }
    if (auth.protect_reads && auth.token_file.empty()) {
      return Error(node.Mark(), "auth.protect_reads=true needs auth.token_file");
    }
    return absl::OkStatus();
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
      for (const auto& kv : item) {
        const std::string key = kv.first.Scalar();
        if (key == "match") {
          auto m = String(kv.second, context + ".match");
          if (!m.ok()) return m.status();
          if (m->empty()) return Error(kv.second.Mark(), context + ".match must not be empty");
          rule.match = *m;
          has_match = true;
        } else if (key == "policy") {
          policy_node = kv.second;
        } else {
          return Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "' in ", context));
        }
      }
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
    YAML::Node root;
    try {
      root = YAML::Load(std::string(text));
    } catch (const YAML::Exception& e) {
      return Error(e.mark, e.msg);
    }
    if (absl::Status s = CheckDuplicateKeys(root); !s.ok()) return s;
    DaemonConfig config;
    if (root.IsNull()) return config;  // an empty file means all defaults
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
        s = ParseTlsSection(*this, kv.second, "tls", /*listener_switches=*/true, config.tls);
      } else if (key == "auth") {
        s = ApplyAuth(kv.second, config.auth);
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

absl::Status ParseTlsSection(const ConfigReader& reader, const YAML::Node& node,
                             absl::string_view section, bool listener_switches, TlsConfig& tls) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return reader.Error(node.Mark(), absl::StrCat(section, " must be a map"));
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    const std::string qualified = absl::StrCat(section, ".", key);
    std::string* path = nullptr;
    bool* flag = nullptr;
    uint32_t* number = nullptr;
    if (key == "cert_file") path = &tls.cert_file;
    if (key == "key_file") path = &tls.key_file;
    if (key == "client_ca_file") path = &tls.client_ca_file;
    if (listener_switches && key == "grpc") flag = &tls.grpc;
    if (listener_switches && key == "http") flag = &tls.http;
    if (key == "reload_seconds") number = &tls.reload_seconds;
    if (path != nullptr) {
      auto v = reader.String(kv.second, qualified);
      if (!v.ok()) return v.status();
      *path = *v;
    } else if (flag != nullptr) {
      auto v = reader.Bool(kv.second, qualified);
      if (!v.ok()) return v.status();
      *flag = *v;
    } else if (number != nullptr) {
      auto v = reader.Uint(kv.second, qualified);
      if (!v.ok()) return v.status();
      *number = *v;
    } else {
      return reader.Error(kv.first.Mark(),
                          absl::StrCat("unknown key '", key, "' in ", section));
    }
  }
  // Half a TLS setup would serve plaintext while the operator believes
  // otherwise: refuse it.
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return reader.Error(node.Mark(),
                        tls.cert_file.empty()
                            ? absl::StrCat(section, ".key_file is set but ", section,
                                           ".cert_file is not")
                            : absl::StrCat(section, ".cert_file is set but ", section,
                                           ".key_file is not"));
  }
  if (!tls.client_ca_file.empty() && tls.cert_file.empty()) {
    return reader.Error(node.Mark(), absl::StrCat(section, ".client_ca_file (mutual TLS) needs ",
                                                  section, ".cert_file and ", section,
                                                  ".key_file"));
  }
  if (listener_switches && tls.enabled() && !tls.grpc && !tls.http) {
    return reader.Error(node.Mark(), absl::StrCat(section, ".grpc and ", section,
                                                  ".http are both false: the certificate would "
                                                  "serve nothing"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config file ", path,
        std::filesystem::is_directory(status) ? " is a directory" : " is not a regular file",
        ", not a YAML file"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status ValidateAddress(absl::string_view key, absl::string_view address,
                             bool allow_unix) {
  if (address.rfind("unix:", 0) == 0) {
    if (!allow_unix) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, "=", address, " must be HOST:PORT (no unix: sockets for HTTP)"));
    }
    if (address.size() > 5) return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, "=", address, " is not HOST:PORT (port 0 picks a free port)"));
  }
  return absl::OkStatus();
}

const engine::PolicyConfig& DaemonConfig::PolicyFor(absl::string_view job_id) const {
  for (const auto& rule : jobs) {
    if (GlobMatch(rule.match, job_id)) return rule.policy;
  }
  return policy;
}

std::optional<std::string> GetEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
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

absl::Status ValidateLogLevel(absl::string_view level) {
  for (const char* ok : {"trace", "debug", "info", "warn", "error"}) {
    if (level == ok) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("log_level=", level, " is not one of trace, debug, info, warn, error"));
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

absl::StatusOr<DaemonConfig> LoadConfig(const ConfigSources& flags, const EnvLookup& env) {
  absl::StatusOr<DaemonConfig> loaded = LoadConfigFileOrDefaults<DaemonConfig>(
      flags.config_file, "STRAGGLERD_CONFIG", env, ParseConfig);
  if (!loaded.ok()) return loaded.status();
  DaemonConfig config = *std::move(loaded);

  Override(config.grpc_address, env("STRAGGLERD_GRPC_ADDRESS"), flags.grpc_address);
  Override(config.http_address, env("STRAGGLERD_HTTP_ADDRESS"), flags.http_address);
  Override(config.log_level, env("STRAGGLERD_LOG_LEVEL"), flags.log_level);
  Override(config.persistence.path, env("STRAGGLERD_STATE_DB"), flags.state_db);

  if (absl::Status s = ValidateAddress("grpc_address", config.grpc_address, /*allow_unix=*/true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateAddress("http_address", config.http_address, /*allow_unix=*/false);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateLogLevel(config.log_level); !s.ok()) return s;
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
  const TlsConfig &t0 = running.tls, &t1 = next.tls;
  cmp("tls.cert_file", t0.cert_file, t1.cert_file);
  cmp("tls.key_file", t0.key_file, t1.key_file);
  cmp("tls.client_ca_file", t0.client_ca_file, t1.client_ca_file);
  cmp_bool("tls.grpc", t0.grpc, t1.grpc);
  cmp_bool("tls.http", t0.http, t1.http);
  cmp("tls.reload_seconds", t0.reload_seconds, t1.reload_seconds);
  return out;
}

}  // namespace straggler::daemon
