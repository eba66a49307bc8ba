#include "agent_config.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "straggler/stream/channel_pool.h"
#include "straggler/common/config_reader.h"
#include "straggler/common/config_sections.h"

namespace straggler::agent {
namespace {

using common::ConfigReader;

class Parser : public ConfigReader {
 public:
  using ConfigReader::ConfigReader;

  absl::StatusOr<AgentConfig> Parse(const std::string& text) const {
    absl::StatusOr<YAML::Node> loaded = Load(text);
    if (!loaded.ok()) return loaded.status();
    const YAML::Node& root = *loaded;
    AgentConfig c;
    // All defaults at start; a reload refuses it (common::ServeUntilStopped).
    c.empty_file = root.IsNull();
    if (root.IsNull()) return c;
    if (!root.IsMap()) return Error(root.Mark(), "the top level must be a map");
    for (const auto& kv : root) {
      const std::string key = kv.first.Scalar();
      absl::Status s;
      if (key == "listen") {
        s = Str(kv.second, key, c.listen);
      } else if (key == "listen_tcp") {
        s = Str(kv.second, key, c.listen_tcp);
      } else if (key == "listen_tcp_tls") {
        s = common::ParseTlsSection(*this, kv.second, key, /*listener_switches=*/false,
                                    c.listen_tcp_tls);
      } else if (key == "upstream") {
        s = Str(kv.second, key, c.upstream);
      } else if (key == "http_address") {
        s = Str(kv.second, key, c.http_address);
      } else if (key == "node") {
        s = Str(kv.second, key, c.node);
      } else if (key == "log_level") {
        s = Str(kv.second, key, c.log_level);
      } else if (key == "batch") {
        s = Section(kv.second, key, {{"max_reports", &c.batch_max_reports},
                                     {"max_delay_ms", &c.batch_max_delay_ms}});
      } else if (key == "http") {
        s = Section(kv.second, key,
                    {{"threads", &c.http_threads},
                     {"read_timeout_seconds", &c.http_read_timeout_seconds},
                     {"write_timeout_seconds", &c.http_write_timeout_seconds},
                     {"keep_alive_timeout_seconds", &c.http_keep_alive_timeout_seconds}});
      } else if (key == "buffer") {
        s = Section(kv.second, key, {{"max_reports", &c.buffer_max_reports}});
      } else if (key == "reconnect") {
        s = Section(kv.second, key, {{"initial_ms", &c.reconnect_initial_ms},
                                     {"max_ms", &c.reconnect_max_ms}});
      } else if (key == "shutdown") {
        s = Section(kv.second, key, {{"flush_ms", &c.shutdown_flush_ms}});
      } else if (key == "jobs") {
        s = Section(kv.second, key, {{"idle_timeout_ms", &c.idle_job_timeout_ms}});
      } else if (key == "telemetry") {
        s = Telemetry(kv.second, c);
      } else if (key == "host_telemetry") {
        s = HostTelemetry(kv.second, c);
      } else if (key == "upstream_tls") {
        s = UpstreamTls(kv.second, c);
      } else {
        s = Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "'"));
      }
      if (!s.ok()) return s;
    }
    // Values that would make the agent useless are errors, named.
    for (auto [name, v, node_key] :
         {std::tuple{"batch.max_reports", c.batch_max_reports, "batch"},
          std::tuple{"buffer.max_reports", c.buffer_max_reports, "buffer"},
          std::tuple{"reconnect.initial_ms", c.reconnect_initial_ms, "reconnect"},
          std::tuple{"reconnect.max_ms", c.reconnect_max_ms, "reconnect"},
          std::tuple{"telemetry.interval_ms", c.telemetry_interval_ms, "telemetry"},
          std::tuple{"host_telemetry.interval_ms", c.host_telemetry_interval_ms,
                     "host_telemetry"},
          std::tuple{"jobs.idle_timeout_ms", c.idle_job_timeout_ms, "jobs"},
          std::tuple{"http.threads", c.http_threads, "http"},
          std::tuple{"http.read_timeout_seconds", c.http_read_timeout_seconds, "http"},
          std::tuple{"http.write_timeout_seconds", c.http_write_timeout_seconds, "http"},
          std::tuple{"http.keep_alive_timeout_seconds", c.http_keep_alive_timeout_seconds,
                     "http"}}) {
      if (v == 0) return Error(root[node_key].Mark(), absl::StrCat(name, "=0 must be >= 1"));
    }
    return c;
  }

 private:
  absl::Status Str(const YAML::Node& node, const std::string& key, std::string& out) const {
    if (node.IsNull()) {
      out.clear();
      return absl::OkStatus();
    }
    auto v = String(node, key);
    if (!v.ok()) return v.status();
    out = *v;
    return absl::OkStatus();
  }

  // telemetry: {enabled: BOOL, interval_ms: N, nvml_library: PATH}
  absl::Status Telemetry(const YAML::Node& node, AgentConfig& c) const {
    return common::ReadSection(
        *this, node, "telemetry",
        [&](const std::string& key, const YAML::Node& value) -> absl::Status {
          if (key == "enabled") {
            auto v = Bool(value, "telemetry.enabled");
            if (!v.ok()) return v.status();
            c.telemetry_enabled = *v;
          } else if (key == "interval_ms") {
            auto v = Uint(value, "telemetry.interval_ms");
            if (!v.ok()) return v.status();
            c.telemetry_interval_ms = *v;
          } else if (key == "nvml_library") {
            return Str(value, "telemetry.nvml_library", c.nvml_library);
          } else {
            return common::UnknownKey();
          }
          return absl::OkStatus();
        });
  }

  // host_telemetry: {enabled: BOOL, interval_ms: N, proc_root: PATH}
  absl::Status HostTelemetry(const YAML::Node& node, AgentConfig& c) const {
    return common::ReadSection(
        *this, node, "host_telemetry",
        [&](const std::string& key, const YAML::Node& value) -> absl::Status {
          if (key == "enabled") {
            auto v = Bool(value, "host_telemetry.enabled");
            if (!v.ok()) return v.status();
            c.host_telemetry_enabled = *v;
          } else if (key == "interval_ms") {
            auto v = Uint(value, "host_telemetry.interval_ms");
            if (!v.ok()) return v.status();
            c.host_telemetry_interval_ms = *v;
          } else if (key == "proc_root") {
            if (absl::Status s = Str(value, "host_telemetry.proc_root", c.proc_root); !s.ok()) {
              return s;
            }
            if (c.proc_root.empty()) {
              return Error(value.Mark(), "host_telemetry.proc_root='' must name a directory");
            }
          } else {
            return common::UnknownKey();
          }
          return absl::OkStatus();
        });
  }

  // upstream_tls: {ca_file, cert_file, key_file}: TLS to stragglerd.
  absl::Status UpstreamTls(const YAML::Node& node, AgentConfig& c) const {
    absl::Status read = common::ReadSection(
        *this, node, "upstream_tls",
        [&](const std::string& key, const YAML::Node& value) -> absl::Status {
          std::string* target = key == "ca_file"     ? &c.upstream_tls.ca_file
                                : key == "cert_file" ? &c.upstream_tls.cert_file
                                : key == "key_file"  ? &c.upstream_tls.key_file
                                                     : nullptr;
          if (target == nullptr) return common::UnknownKey();
          return Str(value, absl::StrCat("upstream_tls.", key), *target);
        });
    if (!read.ok() || node.IsNull()) return read;
    if (std::string problem = c.upstream_tls.Validate(); !problem.empty()) {
      return Error(node.Mark(), absl::StrCat("upstream_tls: ", problem));
    }
    return absl::OkStatus();
  }

  // A section of unsigned numbers. 0 is read here and refused by Parse,
  // once every key is in ("=0 must be >= 1").
  absl::Status Section(const YAML::Node& node, const std::string& section,
                       std::vector<common::UintKey> fields) const {
    for (common::UintKey& f : fields) f.zero_allowed = true;
    return common::ReadUintSection(*this, node, section, fields);
  }
};

}  // namespace

std::optional<std::string> UnixSocketPath(const std::string& address) {
  if (address.rfind("unix://", 0) == 0) {
    std::string path = address.substr(7);
    if (path.empty() || path[0] != '/') return std::nullopt;
    return path;
  }
  if (address.rfind("unix:", 0) == 0 && address.size() > 5) return address.substr(5);
  return std::nullopt;
}

absl::StatusOr<AgentConfig> ParseAgentConfig(const std::string& yaml_text,
                                             const std::string& source_name) {
  return Parser(source_name).Parse(yaml_text);
}

absl::StatusOr<AgentConfig> LoadAgentConfig(const AgentSources& flags,
                                            const common::EnvLookup& env) {
  absl::StatusOr<AgentConfig> loaded = common::LoadConfigFileOrDefaults<AgentConfig>(
      flags.config_file, "STRAGGLER_AGENT_CONFIG", env, ParseAgentConfig);
  if (!loaded.ok()) return loaded.status();
  AgentConfig config = *std::move(loaded);

  using common::Override;
  Override(config.listen, env("STRAGGLER_AGENT_LISTEN"), flags.listen);
  Override(config.listen_tcp, env("STRAGGLER_AGENT_LISTEN_TCP"), flags.listen_tcp);
  Override(config.upstream, env("STRAGGLER_AGENT_UPSTREAM"), flags.upstream);
  Override(config.http_address, env("STRAGGLER_AGENT_HTTP_ADDRESS"), flags.http_address);
  Override(config.log_level, env("STRAGGLER_AGENT_LOG_LEVEL"), flags.log_level);
  // The Kubernetes DaemonSet sets this from spec.nodeName (downward API).
  Override(config.node, env("STRAGGLER_AGENT_NODE"), flags.node);
  if (auto v = env("STRAGGLER_AGENT_TELEMETRY_ENABLED")) {
    if (*v == "true" || *v == "1") {
      config.telemetry_enabled = true;
    } else if (*v == "false" || *v == "0") {
      config.telemetry_enabled = false;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "STRAGGLER_AGENT_TELEMETRY_ENABLED=", *v, " must be true, false, 1 or 0"));
    }
  }
  if (auto v = env("STRAGGLER_AGENT_TELEMETRY_INTERVAL_MS")) {
    uint32_t ms = 0;
    if (!absl::SimpleAtoi(*v, &ms) || ms == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "STRAGGLER_AGENT_TELEMETRY_INTERVAL_MS=", *v, " must be an integer >= 1"));
    }
    config.telemetry_interval_ms = ms;
  }

  if (!UnixSocketPath(config.listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen=", config.listen, " is not a unix socket address (unix:///PATH or unix:PATH)"));
  }
  if (!config.listen_tcp.empty()) {
    if (absl::Status s = common::ValidateAddress("listen_tcp", config.listen_tcp, false); !s.ok())
      return s;
  } else if (config.listen_tcp_tls.enabled()) {
    // A certificate for a listener that does not exist: the operator meant
    // something else (the unix socket is never TLS).
    return absl::InvalidArgumentError(absl::StrCat(
        "listen_tcp_tls.cert_file=", config.listen_tcp_tls.cert_file,
        " is set but listen_tcp is empty: TLS applies only to the TCP listener"));
  }
  // One address, or several replicas comma-separated (docs/cluster.md,
  // "Clients"): each is checked.
  absl::StatusOr<std::vector<std::string>> upstreams = stream::SplitEndpoints(config.upstream);
  if (!upstreams.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("upstream: ", upstreams.status().message()));
  }
  for (const std::string& address : *upstreams) {
    if (absl::Status s = common::ValidateAddress("upstream", address, true); !s.ok()) return s;
  }
  if (!config.http_address.empty()) {
    if (absl::Status s = common::ValidateAddress("http_address", config.http_address, false);
        !s.ok())
      return s;
  }
  if (absl::Status s = common::ValidateLogLevel(config.log_level); !s.ok()) return s;
  return config;
}

}  // namespace straggler::agent
