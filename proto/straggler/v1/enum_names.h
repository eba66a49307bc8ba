// The short names of straggler.proto's enum values, read from the enum's
// descriptor: the .proto is the one table of names (policy kinds, recovery
// modes, event kinds, ...), and tools that print or parse them take the names
// from it instead of listing them again.
//
//   const auto* kinds = v1::PolicyKind_descriptor();
//   EnumShortName(kinds, v1::POLICY_KIND_PEER);  // "peer"
//   EnumShortNames(kinds);             // {"dynamic", "ewma", "static", "peer"}
//   ParseEnumShortName(kinds, "ewma"); // v1::POLICY_KIND_EWMA; "unspecified",
//                                      // "bogus": std::nullopt
//
// A short name is the value's name without the enum's prefix (PolicyKind ->
// POLICY_KIND_), in lower case. The *_UNSPECIFIED value (the proto3 zero) is
// "no value", never a name. Header-only; descriptors are immutable, so safe
// from any thread.
#pragma once

#include <cctype>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/descriptor.h>

namespace straggler::v1 {

// "POLICY_KIND_" for PolicyKind: the enum's name in upper snake case.
inline std::string EnumValuePrefix(const google::protobuf::EnumDescriptor* e) {
  std::string prefix;
  for (char c : e->name()) {
    if (std::isupper(static_cast<unsigned char>(c)) && !prefix.empty()) prefix += '_';
    prefix += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return prefix + "_";
}

// The short name of `value`, or "" for the unspecified value and numbers the
// enum does not have.
inline std::string EnumShortName(const google::protobuf::EnumDescriptor* e, int value) {
  const google::protobuf::EnumValueDescriptor* v = e->FindValueByNumber(value);
  if (v == nullptr || value == 0) return "";
  const std::string prefix = EnumValuePrefix(e);
  std::string name = v->name();
  if (name.rfind(prefix, 0) == 0) name.erase(0, prefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// Every short name but the unspecified value's, in the order the .proto
// declares them.
inline std::vector<std::string> EnumShortNames(const google::protobuf::EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() != 0) names.push_back(EnumShortName(e, e->value(i)->number()));
  }
  return names;
}

// The value whose short name is `name`; std::nullopt for any other text.
inline std::optional<int> ParseEnumShortName(const google::protobuf::EnumDescriptor* e,
                                             std::string_view name) {
  for (int i = 0; i < e->value_count(); ++i) {
    const int number = e->value(i)->number();
    if (number != 0 && EnumShortName(e, number) == name) return number;
  }
  return std::nullopt;
}

}  // namespace straggler::v1
