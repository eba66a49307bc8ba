// YAML scalar reading shared by the config loaders of stragglerd
// (config.cc) and straggler-agent (agent/src/agent_config.cc): typed values
// whose errors name the file, line, key and value. Also the precedence both
// loaders follow: config file (from --config, else its environment
// variable) over built-in defaults, then environment, then flags
// (LoadConfigFileOrDefaults, then Override per field), and the server TLS
// section both have (ParseTlsSection).
//
//   ConfigReader r("agent.yaml");
//   absl::StatusOr<uint32_t> n = r.Uint(node["max_reports"], "buffer.max_reports");
//   // error: "agent.yaml:4: buffer.max_reports=-1 is not an unsigned 32-bit integer"
//
// Plain value; no shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "straggler/common/tls_config.h"
#include "yaml-cpp/yaml.h"

namespace straggler::common {

// The largest value of any *_seconds key of a config file (one year).
inline constexpr uint32_t kMaxConfigSeconds = 365 * 24 * 3600;
// The bounds of a config file's tree (ConfigReader::Load): nesting, and
// nodes with every alias expanded. A site's longest file (a `jobs:` rule per
// team) has some hundreds of nodes; walking the bound costs ~50 ms.
inline constexpr int kMaxConfigDepth = 32;
inline constexpr size_t kMaxConfigNodes = 100000;

class ConfigReader {
 public:
  explicit ConfigReader(absl::string_view source) : source_(source) {}

  absl::Status Error(const YAML::Mark& mark, absl::string_view message) const {
    // yaml-cpp lines are 0-based; editors count from 1. A null mark (-1)
    // means the node has no position (an absent key): name the file only.
    if (mark.line < 0) return absl::InvalidArgumentError(absl::StrCat(source_, ": ", message));
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ":", mark.line + 1, ": ", message));
  }

  absl::StatusOr<std::string> Scalar(const YAML::Node& node, absl::string_view key) const {
    if (!node.IsScalar()) {
      return Error(node.Mark(), absl::StrCat(key, " must be a single value"));
    }
    return node.Scalar();
  }

  absl::StatusOr<uint32_t> Uint(const YAML::Node& node, absl::string_view key) const {
    auto text = Scalar(node, key);
    if (!text.ok()) return text.status();
    uint32_t value = 0;
    if (!absl::SimpleAtoi(*text, &value)) {
      return Error(node.Mark(),
                   absl::StrCat(key, "=", *text, " is not an unsigned 32-bit integer"));
    }
    // Every duration key (*_seconds) has one documented upper bound: a year.
    // A deadline now + duration then stays far inside int64 nanoseconds.
    if (absl::EndsWith(key, "_seconds") && value > kMaxConfigSeconds) {
      return Error(node.Mark(), absl::StrCat(key, "=", value,
                                             " is above its upper bound: must be <= ",
                                             kMaxConfigSeconds, " (a year)"));
    }
    return value;
  }

  absl::StatusOr<double> Double(const YAML::Node& node, absl::string_view key) const {
    auto text = Scalar(node, key);
    if (!text.ok()) return text.status();
    double value = 0;
    if (!absl::SimpleAtod(*text, &value)) {
      return Error(node.Mark(), absl::StrCat(key, "=", *text, " is not a number"));
    }
    return value;
  }

  absl::StatusOr<bool> Bool(const YAML::Node& node, absl::string_view key) const {
    auto text = Scalar(node, key);
    if (!text.ok()) return text.status();
    const std::string v = absl::AsciiStrToLower(*text);
    if (v == "true" || v == "yes" || v == "on") return true;
    if (v == "false" || v == "no" || v == "off") return false;
    return Error(node.Mark(), absl::StrCat(key, "=", *text, " is not true or false"));
  }

  absl::StatusOr<std::string> String(const YAML::Node& node, absl::string_view key) const {
    return Scalar(node, key);
  }

  // Parses a whole config file. Every error names the file and line:
  //  - YAML syntax, with a hint when an earlier line opens a quote that it
  //    does not close (yaml-cpp reports where it gave up, lines later);
  //  - a quoted value not closed on the line it opens (yaml-cpp 0.7 reads an
  //    unclosed quote on to the end of the file and takes all of it as the
  //    value: `log_level: "info` once read as log_level="info grpc_address:
  //    ..."); no key takes a multi-line value;
  //  - a key given twice in one map (yaml-cpp keeps both and a loader would
  //    silently take one);
  //  - a tree deeper than kMaxConfigDepth or, aliases expanded, larger than
  //    kMaxConfigNodes nodes: a 540-byte alias bomb (each level a list of
  //    nine aliases of the one before) stands for 9^9 nodes, which took 28 s
  //    of CPU to walk at start and 50 s on reload. A config file has a few
  //    hundred.
  // A null root (an empty or comment-only file) is returned as is.
  absl::StatusOr<YAML::Node> Load(const std::string& text) const;

 protected:
  // The checks of Load after parsing, over the tree under `node`.
  absl::Status CheckTree(const YAML::Node& node, const std::string& text, int depth,
                         size_t& visited) const;

  std::string source_;
};

// A server TLS section (stragglerd's `tls:`, straggler-agent's
// `listen_tcp_tls:`) over `tls`: cert_file, key_file, client_ca_file,
// reload_seconds, and with `listener_switches` grpc and http. Errors name
// `section`.key; half a setup (a certificate without its key, a client CA
// without a certificate) is refused.
absl::Status ParseTlsSection(const ConfigReader& reader, const YAML::Node& node,
                             absl::string_view section, bool listener_switches, TlsConfig& tls);

// Reads an environment variable; injectable so tests need not touch the
// process environment.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
std::optional<std::string> GetEnv(const char* name);

// trace|debug|info|warn|error; the error names the value.
absl::Status ValidateLogLevel(absl::string_view level);

// HOST:PORT (port 0..65535), or unix:PATH when `allow_unix`. The error names
// `key` and the value.
absl::Status ValidateAddress(absl::string_view key, absl::string_view address, bool allow_unix);

// Reads a whole file; NOT_FOUND names the path, and so does
// FAILED_PRECONDITION for a path that is not a regular file (a directory
// reads as empty: it would silently run on the defaults).
absl::StatusOr<std::string> ReadConfigFile(const std::string& path);

// The config before environment and flag overrides. The file is `flag` if
// given, else env(env_name); an empty name from either means no file. No
// file: a default-constructed Config (the built-in defaults). Otherwise the
// file is read (ReadConfigFile) and parse(text, path) — returning
// absl::StatusOr<Config> — turns it into the Config, whose config_file is
// set to the path; a read or parse error is returned as is.
template <typename Config, typename Env, typename Parse>
absl::StatusOr<Config> LoadConfigFileOrDefaults(const std::optional<std::string>& flag,
                                                const char* env_name, const Env& env,
                                                const Parse& parse) {
  std::optional<std::string> file = flag;
  if (!file) file = env(env_name);
  // An empty value lets a deployment that always sets the variable ask for
  // the built-in defaults.
  if (file && file->empty()) file.reset();

  Config config;
  if (!file) return config;
  absl::StatusOr<std::string> text = ReadConfigFile(*file);
  if (!text.ok()) return text.status();
  absl::StatusOr<Config> parsed = parse(*text, *file);
  if (!parsed.ok()) return parsed.status();
  config = *std::move(parsed);
  config.config_file = *file;
  return config;
}

// Environment over file, flag over environment: sets `field` to `env_value`
// when the variable is set (even to ""), then to `flag` when the flag was
// given. Neither: `field` keeps the file's or default value.
inline void Override(std::string& field, const std::optional<std::string>& env_value,
                     const std::optional<std::string>& flag) {
  if (env_value) field = *env_value;
  if (flag) field = *flag;
}

}  // namespace straggler::common
