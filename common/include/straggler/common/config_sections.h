// The sections of a config file (maps of keys), read one way by both
// loaders (stragglerd's config.cc, straggler-agent's agent_config.cc) and by
// ParseTlsSection: an absent (null) section has no keys, anything but a map
// is an error "SECTION must be a map", and a key nobody reads is an error
// "unknown key 'KEY' in SECTION" at its line.
//
//   absl::Status s = ReadSection(reader, node["auth"], "auth",
//       [&](const std::string& key, const YAML::Node& value) -> absl::Status {
//         if (key == "token_file") return reader.String(value, "auth.token_file").status();
//         return UnknownKey();
//       });
//   s = ReadUintSection(reader, node["http"], "http", {{"threads", &http.threads}});
//
// Pure functions; no shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "straggler/common/config_reader.h"
#include "yaml-cpp/yaml.h"

namespace straggler::common {

// What a section's key reader answers for a key it does not know. Told
// apart by its message too: a reader may pass on a NotFound of its own (a
// file it reads), which must not read as "unknown key".
inline constexpr absl::string_view kUnknownKeyMessage = "unknown key";
inline absl::Status UnknownKey() { return absl::NotFoundError(kUnknownKeyMessage); }
inline bool IsUnknownKey(const absl::Status& s) {
  return absl::IsNotFound(s) && s.message() == kUnknownKeyMessage;
}

// Calls `read(key, value)` for each entry of `node`, the map named
// `section`, in file order, and stops at the first error. UnknownKey() from
// `read` becomes the unknown-key error naming KEY and `section`.
absl::Status ReadSection(
    const ConfigReader& reader, const YAML::Node& node, absl::string_view section,
    const std::function<absl::Status(const std::string& key, const YAML::Node& value)>& read);

// One key of a section of unsigned 32-bit values, and the field it sets.
struct UintKey {
  absl::string_view key;
  uint32_t* target;
  bool zero_allowed = false;  // 0 has a meaning (no limit, keep none, ...)
};

// ReadSection of a section whose keys are `keys`: each value is read by
// ConfigReader::Uint as "SECTION.KEY", must be above 0 unless zero_allowed
// ("SECTION.KEY=0 must be > 0"), then pass `check` when one is given, and
// only then is stored.
absl::Status ReadUintSection(
    const ConfigReader& reader, const YAML::Node& node, absl::string_view section,
    const std::vector<UintKey>& keys,
    const std::function<absl::Status(absl::string_view key, uint32_t value,
                                     const YAML::Node& node)>& check = nullptr);

}  // namespace straggler::common
