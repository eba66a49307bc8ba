// YAML scalar reading shared by the config loaders of stragglerd
// (config.cc) and straggler-agent (agent/src/agent_config.cc): typed values
// whose errors name the file, line, key and value.
//
//   ConfigReader r("agent.yaml");
//   absl::StatusOr<uint32_t> n = r.Uint(node["max_reports"], "buffer.max_reports");
//   // error: "agent.yaml:4: buffer.max_reports=-1 is not an unsigned 32-bit integer"
//
// Plain value; no shared state.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "yaml-cpp/yaml.h"

namespace straggler::daemon {

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

 protected:
  std::string source_;
};

// Reads a whole file; NOT_FOUND names the path.
absl::StatusOr<std::string> ReadConfigFile(const std::string& path);

}  // namespace straggler::daemon
