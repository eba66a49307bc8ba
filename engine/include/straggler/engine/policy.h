// Policy configuration of one job's detection engine.
//
// A PolicyConfig is plain data with the defaults of deploy/stragglerd.yaml.
// Validate() names the first bad value:
//
//   straggler::engine::PolicyConfig p;
//   p.kind = straggler::engine::PolicyKind::kDynamic;
//   p.threshold_factor = 0.5;
//   p.Validate();  // InvalidArgument: "threshold_factor=0.5 must be > 1"
//
// The kinds and the fields with their defaults and ranges are written in one
// place, policy_table.inc, which the enum, kPolicyKinds, PolicyKindName,
// PolicyConfig and the PolicyFields() table below are made from.
// Validate() checks each field against its range, so config files, SIGHUP,
// REST, gRPC and straggler-replay all refuse the same values.
// The upper bounds keep everything derived from a field (a duration in int64
// nanoseconds, an iteration sum) far from overflow.
//
// Plain value type; no shared state.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace straggler::engine {

// One value per STRAGGLER_POLICY_KIND row of policy_table.inc.
enum class PolicyKind {
#define STRAGGLER_POLICY_KIND(Name, name) k##Name,
#include "straggler/engine/policy_table.inc"
};
enum class RecoveryMode { kShadow, kProbation };

// Every kind and mode, in the order messages list them (the default first).
inline constexpr PolicyKind kPolicyKinds[] = {
#define STRAGGLER_POLICY_KIND(Name, name) PolicyKind::k##Name,
#include "straggler/engine/policy_table.inc"
};
inline constexpr RecoveryMode kRecoveryModes[] = {RecoveryMode::kShadow,
                                                  RecoveryMode::kProbation};

std::string_view PolicyKindName(PolicyKind kind);
absl::StatusOr<PolicyKind> ParsePolicyKind(std::string_view name);
std::string_view RecoveryModeName(RecoveryMode mode);
absl::StatusOr<RecoveryMode> ParseRecoveryMode(std::string_view name);
// The names in kPolicyKinds / kRecoveryModes order as a sentence: "peer,
// dynamic, ewma or static", "shadow or probation".
std::string PolicyKindChoices();
std::string RecoveryModeChoices();

// The fields, their defaults and what each means: the
// STRAGGLER_POLICY_FIELD rows of policy_table.inc, in that order.
struct PolicyConfig {
#define STRAGGLER_POLICY_FIELD(type, name, default_value, ...) type name = default_value;
#include "straggler/engine/policy_table.inc"

  absl::Status Validate() const;
  // The limit in force for an epoch of `iterations_per_epoch` iterations
  // (0 = unknown).
  uint32_t EffectiveLimit(uint64_t iterations_per_epoch) const;
};

// Every PolicyConfig field by its YAML name (deploy/stragglerd.yaml), in
// declaration order: one table for the config loader, `straggler-replay
// --set` and anything else that sets fields by name.
using PolicyMember =
    std::variant<uint32_t PolicyConfig::*, double PolicyConfig::*, bool PolicyConfig::*,
                 PolicyKind PolicyConfig::*, RecoveryMode PolicyConfig::*>;
//
// Numeric fields carry their accepted range: min (exclusive when
// min_exclusive) to max, inclusive. Enums and bools ignore the bounds.
struct PolicyField {
  const char* name;
  PolicyMember member;
  double min = 0;
  double max = 0;
  bool min_exclusive = false;
};
std::span<const PolicyField> PolicyFields();

// The longest duration any policy field may hold: 7 days. Far below the
// ~292 years int64 nanoseconds can hold, so `now + duration` cannot wrap.
inline constexpr double kMaxPolicySeconds = 7 * 24 * 3600.0;

// `seconds` as nanoseconds, saturating at the int64 limits (NaN -> 0): a
// conversion that can never overflow, whatever Validate let through.
std::chrono::nanoseconds SaturatingNanoseconds(double seconds);

// The shortest text that reads back as exactly `v` ("3600.0001", "1e+300",
// "0.1"): messages that compare a value with a bound must show the
// difference.
std::string ExactNumber(double v);

// What a policy change changed, for its event and log line: every field
// whose value differs, in PolicyFields() order, as
// "limit 5 -> 7, threshold_factor 2 -> 2.5" (enums by their YAML words);
// "" when no field differs.
std::string PolicyChanges(const PolicyConfig& before, const PolicyConfig& after);

}  // namespace straggler::engine
