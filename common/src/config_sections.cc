// ReadSection and ReadUintSection (config_sections.h), and ParseTlsSection
// (declared in config_reader.h), which reads its section through them.
#include "straggler/common/config_sections.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "straggler/common/config_reader.h"

namespace straggler::common {

absl::Status ReadSection(
    const ConfigReader& reader, const YAML::Node& node, absl::string_view section,
    const std::function<absl::Status(const std::string& key, const YAML::Node& value)>& read) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return reader.Error(node.Mark(), absl::StrCat(section, " must be a map"));
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    absl::Status s = read(key, kv.second);
    if (IsUnknownKey(s)) {
      return reader.Error(kv.first.Mark(), absl::StrCat("unknown key '", key, "' in ", section));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReadUintSection(const ConfigReader& reader, const YAML::Node& node,
                             absl::string_view section, const std::vector<UintKey>& keys,
                             const std::function<absl::Status(absl::string_view key, uint32_t value,
                                                              const YAML::Node& node)>& check) {
  return ReadSection(
      reader, node, section, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
        const UintKey* field = nullptr;
        for (const UintKey& k : keys) {
          if (k.key == key) field = &k;
        }
        if (field == nullptr) return UnknownKey();
        const std::string qualified = absl::StrCat(section, ".", key);
        auto v = reader.Uint(value, qualified);
        if (!v.ok()) return v.status();
        if (*v == 0 && !field->zero_allowed) {
          return reader.Error(value.Mark(), absl::StrCat(qualified, "=0 must be > 0"));
        }
        if (check) {
          if (absl::Status s = check(key, *v, value); !s.ok()) return s;
        }
        *field->target = *v;
        return absl::OkStatus();
      });
}

absl::Status ParseTlsSection(const ConfigReader& reader, const YAML::Node& node,
                             absl::string_view section, bool listener_switches, TlsConfig& tls) {
  absl::Status read = ReadSection(
      reader, node, section, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
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
          auto v = reader.String(value, qualified);
          if (!v.ok()) return v.status();
          *path = *v;
        } else if (flag != nullptr) {
          auto v = reader.Bool(value, qualified);
          if (!v.ok()) return v.status();
          *flag = *v;
        } else if (number != nullptr) {
          auto v = reader.Uint(value, qualified);
          if (!v.ok()) return v.status();
          *number = *v;
        } else {
          return UnknownKey();
        }
        return absl::OkStatus();
      });
  if (!read.ok() || node.IsNull()) return read;
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

}  // namespace straggler::common
