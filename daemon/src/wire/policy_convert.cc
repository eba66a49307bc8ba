#include "wire/policy_convert.h"

#include <type_traits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"

namespace straggler::daemon {

v1::PolicyKind ToProto(engine::PolicyKind k) {
  switch (k) {
    case engine::PolicyKind::kDynamic: return v1::POLICY_KIND_DYNAMIC;
    case engine::PolicyKind::kEwma: return v1::POLICY_KIND_EWMA;
    case engine::PolicyKind::kStatic: return v1::POLICY_KIND_STATIC;
    case engine::PolicyKind::kPeer: return v1::POLICY_KIND_PEER;
  }
  return v1::POLICY_KIND_UNSPECIFIED;
}

v1::RecoveryMode ToProto(engine::RecoveryMode m) {
  switch (m) {
    case engine::RecoveryMode::kShadow: return v1::RECOVERY_MODE_SHADOW;
    case engine::RecoveryMode::kProbation: return v1::RECOVERY_MODE_PROBATION;
  }
  return v1::RECOVERY_MODE_UNSPECIFIED;
}

namespace {

namespace pb = google::protobuf;

// The v1.PolicyConfig field of each numeric and bool PolicyFields() row: the
// field of the same name (daemon:"every policy field is on the wire" checks
// that each row has one, of its type). The two enums are mapped by hand.
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
  switch (u.kind()) {
    case v1::POLICY_KIND_UNSPECIFIED: break;
    case v1::POLICY_KIND_DYNAMIC: p.kind = engine::PolicyKind::kDynamic; break;
    case v1::POLICY_KIND_EWMA: p.kind = engine::PolicyKind::kEwma; break;
    case v1::POLICY_KIND_STATIC: p.kind = engine::PolicyKind::kStatic; break;
    case v1::POLICY_KIND_PEER: p.kind = engine::PolicyKind::kPeer; break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("kind=", u.kind(), " is not a PolicyKind"));
  }
  switch (u.recovery()) {
    case v1::RECOVERY_MODE_UNSPECIFIED: break;
    case v1::RECOVERY_MODE_SHADOW: p.recovery = engine::RecoveryMode::kShadow; break;
    case v1::RECOVERY_MODE_PROBATION: p.recovery = engine::RecoveryMode::kProbation; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("recovery=", u.recovery(), " is not a RecoveryMode"));
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
