#include "wire/policy_convert.h"

#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "straggler/v1/enum_names.h"

namespace straggler::daemon {

// The engine's kinds and modes are the v1 values of the same name
// (straggler/v1/enum_names.h): a new kind needs its value in straggler.proto,
// not a case here. daemon:"policy wire mapping: every PolicyKind and
// RecoveryMode ..." checks that each one has it.
v1::PolicyKind ToProto(engine::PolicyKind k) {
  const std::optional<int> v =
      v1::ParseEnumShortName(v1::PolicyKind_descriptor(), engine::PolicyKindName(k));
  return v ? static_cast<v1::PolicyKind>(*v) : v1::POLICY_KIND_UNSPECIFIED;
}

v1::RecoveryMode ToProto(engine::RecoveryMode m) {
  const std::optional<int> v =
      v1::ParseEnumShortName(v1::RecoveryMode_descriptor(), engine::RecoveryModeName(m));
  return v ? static_cast<v1::RecoveryMode>(*v) : v1::RECOVERY_MODE_UNSPECIFIED;
}

namespace {

namespace pb = google::protobuf;

// The v1.PolicyConfig field of each numeric and bool PolicyFields() row: the
// field of the same name (daemon:"every policy field is on the wire" checks
// that each row has one, of its type). The two enums are mapped by name, above.
template <class Fn>
void ForEachWireField(Fn&& fn) {
  const pb::Descriptor* message = v1::PolicyConfig::descriptor();
  for (const engine::PolicyField& f : engine::PolicyFields()) {
    const pb::FieldDescriptor* wire = message->FindFieldByName(f.name);
    // A row without its wire field: daemon:"policy wire mapping: every
    // PolicyFields row is the v1.PolicyConfig field of its name" fails.
    if (wire == nullptr) continue;
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(std::declval<engine::PolicyConfig&>().*member)>;
          if constexpr (std::is_same_v<T, uint32_t> || std::is_same_v<T, double> ||
                        std::is_same_v<T, bool>) {
            fn(wire, member);
          }
        },
        f.member);
  }
}

}  // namespace

void ToProto(const engine::PolicyConfig& p, v1::PolicyConfig* out) {
  out->set_kind(ToProto(p.kind));
  out->set_recovery(ToProto(p.recovery));
  const pb::Reflection* r = out->GetReflection();
  ForEachWireField([&](const pb::FieldDescriptor* wire, auto member) {
    using T = std::remove_cvref_t<decltype(p.*member)>;
    if constexpr (std::is_same_v<T, uint32_t>) r->SetUInt32(out, wire, p.*member);
    if constexpr (std::is_same_v<T, double>) r->SetDouble(out, wire, p.*member);
    if constexpr (std::is_same_v<T, bool>) r->SetBool(out, wire, p.*member);
  });
}

absl::StatusOr<engine::PolicyConfig> MergePolicy(const v1::PolicyConfig& u,
                                                 engine::PolicyConfig p) {
  if (u.kind() != v1::POLICY_KIND_UNSPECIFIED) {
    auto kind = engine::ParsePolicyKind(v1::EnumShortName(v1::PolicyKind_descriptor(), u.kind()));
    if (!kind.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("kind=", u.kind(), " is not a PolicyKind"));
    }
    p.kind = *kind;
  }
  if (u.recovery() != v1::RECOVERY_MODE_UNSPECIFIED) {
    auto mode =
        engine::ParseRecoveryMode(v1::EnumShortName(v1::RecoveryMode_descriptor(), u.recovery()));
    if (!mode.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("recovery=", u.recovery(), " is not a RecoveryMode"));
    }
    p.recovery = *mode;
  }
  const pb::Reflection* r = u.GetReflection();
  ForEachWireField([&](const pb::FieldDescriptor* wire, auto member) {
    if (!r->HasField(u, wire)) return;
    using T = std::remove_cvref_t<decltype(p.*member)>;
    if constexpr (std::is_same_v<T, uint32_t>) p.*member = r->GetUInt32(u, wire);
    if constexpr (std::is_same_v<T, double>) p.*member = r->GetDouble(u, wire);
    if constexpr (std::is_same_v<T, bool>) p.*member = r->GetBool(u, wire);
  });
  if (absl::Status s = p.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  return p;
}

}  // namespace straggler::daemon
