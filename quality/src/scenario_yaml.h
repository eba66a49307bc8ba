// Reading scenario YAML (scenario_parse.cc, scenario_models.cc): values with
// errors that name the file, line and key or value. Internal to the quality
// library; plain const methods, no shared state.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "straggler/quality/scenario.h"
#include "yaml-cpp/yaml.h"

namespace straggler::quality::internal {

class YamlReader {
 public:
  explicit YamlReader(std::string source) : source_(std::move(source)) {}

  // "SOURCE:LINE: message" (the line where the node starts, when known).
  absl::Status Error(const YAML::Node& node, absl::string_view message) const;
  absl::StatusOr<std::string> Scalar(const YAML::Node& n, absl::string_view key) const;
  absl::StatusOr<uint64_t> Uint(const YAML::Node& n, absl::string_view key) const;
  absl::StatusOr<double> Double(const YAML::Node& n, absl::string_view key) const;

  // A number within [lo, hi], each end open where said: the error reads
  // "KEY=V must be in [lo, hi)".
  struct Range {
    double lo, hi;
    bool lo_open = false, hi_open = false;
  };
  absl::StatusOr<double> Bounded(const YAML::Node& n, absl::string_view key, Range r) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

// The models a scenario may name (scenario.h), each a map whose keys are
// all optional: `work:`, `input:`, `host:`. They set `enabled`.
absl::Status ParseWork(const YamlReader& in, const YAML::Node& n, WorkModel& w);
absl::Status ParseInput(const YamlReader& in, const YAML::Node& n, InputModel& m);
absl::Status ParseHost(const YamlReader& in, const YAML::Node& n, HostModel& h);

}  // namespace straggler::quality::internal
