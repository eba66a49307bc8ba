#include "straggler/engine/policy.h"

#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace straggler::engine {
namespace {

// The value of `all` whose name (the one spelling `name_of` gives, the same
// the other way) is `name`; the error lists the names in `all`'s order.
template <class E, size_t N>
absl::StatusOr<E> ParseName(std::string_view what, std::string_view name, const E (&all)[N],
                            std::string_view (*name_of)(E)) {
  for (E e : all) {
    if (name_of(e) == name) return e;
  }
  const std::string names = absl::StrJoin(
      all, ", ", [name_of](std::string* out, E e) { out->append(name_of(e)); });
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(what), " '", std::string(name), "' is not one of ", names));
}

// "a, b or c": the names of `all` in order, the last after " or ".
template <class E, size_t N>
std::string Choices(const E (&all)[N], std::string_view (*name_of)(E)) {
  std::string text;
  for (size_t i = 0; i < N; ++i) {
    text.append(i == 0 ? "" : i + 1 == N ? " or " : ", ").append(name_of(all[i]));
  }
  return text;
}

}  // namespace

std::string_view PolicyKindName(PolicyKind kind) {
  switch (kind) {
#define STRAGGLER_POLICY_KIND(Name, name) \
  case PolicyKind::k##Name:               \
    return name;
#include "straggler/engine/policy_table.inc"
  }
  return "unknown";
}

absl::StatusOr<PolicyKind> ParsePolicyKind(std::string_view name) {
  return ParseName("policy kind", name, kPolicyKinds, PolicyKindName);
}

std::string PolicyKindChoices() { return Choices(kPolicyKinds, PolicyKindName); }

std::string_view RecoveryModeName(RecoveryMode mode) {
  switch (mode) {
    case RecoveryMode::kShadow: return "shadow";
    case RecoveryMode::kProbation: return "probation";
  }
  return "unknown";
}

absl::StatusOr<RecoveryMode> ParseRecoveryMode(std::string_view name) {
  return ParseName("recovery", name, kRecoveryModes, RecoveryModeName);
}

std::string RecoveryModeChoices() { return Choices(kRecoveryModes, RecoveryModeName); }

namespace {

absl::Status Bad(std::string_view field, double value, std::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(field), "=", ExactNumber(value), " ", std::string(rule)));
}

// "must be in [1, 100000]" / "(0, 604800]"; a one-sided message for the
// side that failed keeps the common case short ("must be > 1").
absl::Status OutOfRange(const PolicyField& f, double v) {
  const std::string lo = ExactNumber(f.min), hi = ExactNumber(f.max);
  if (!std::isfinite(v)) {
    return Bad(f.name, v, absl::StrCat("must be a finite number in ", f.min_exclusive ? "(" : "[",
                                       lo, ", ", hi, "]"));
  }
  if (v > f.max) {
    return Bad(f.name, v, absl::StrCat("is above its upper bound: must be <= ", hi));
  }
  return Bad(f.name, v, absl::StrCat("must be ", f.min_exclusive ? "> " : ">= ", lo));
}

bool InRange(const PolicyField& f, double v) {
  if (!std::isfinite(v) || v > f.max) return false;
  return f.min_exclusive ? v > f.min : v >= f.min;
}

}  // namespace

std::chrono::nanoseconds SaturatingNanoseconds(double seconds) {
  using Rep = std::chrono::nanoseconds::rep;
  if (std::isnan(seconds)) return std::chrono::nanoseconds(0);
  const double ns = seconds * 1e9;
  // 2^63 is exactly representable; anything at or past it saturates.
  constexpr double kLimit = 9223372036854775808.0;
  if (ns >= kLimit) return std::chrono::nanoseconds::max();
  if (ns <= -kLimit) return std::chrono::nanoseconds::min();
  return std::chrono::nanoseconds(static_cast<Rep>(ns));
}

std::string ExactNumber(double v) {
  for (int precision = 6; precision < 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(text.c_str(), nullptr) == v) return text;
  }
  return absl::StrFormat("%.17g", v);
}

absl::Status PolicyConfig::Validate() const {
  // Every numeric field against its range in the table.
  for (const PolicyField& f : PolicyFields()) {
    absl::Status s = std::visit(
        [&](auto member) -> absl::Status {
          using T = std::remove_cvref_t<decltype(this->*member)>;
          if constexpr (std::is_same_v<T, uint32_t> || std::is_same_v<T, double>) {
            const double v = static_cast<double>(this->*member);
            if (!InRange(f, v)) return OutOfRange(f, v);
          }
          return absl::OkStatus();
        },
        f.member);
    if (!s.ok()) return s;
  }
  // Rules across fields.
  if (rejoin_mark >= limit)
    return absl::InvalidArgumentError(absl::StrCat("rejoin_mark=", rejoin_mark,
                                                   " must be below limit=", limit));
  if (kind == PolicyKind::kStatic && static_threshold_seconds <= 0)
    return Bad("static_threshold_seconds", static_threshold_seconds,
               "must be > 0 for the static policy");
  return absl::OkStatus();
}

uint32_t PolicyConfig::EffectiveLimit(uint64_t iterations_per_epoch) const {
  if (limit_fraction <= 0 || iterations_per_epoch == 0) return limit;
  double l = std::ceil(limit_fraction * static_cast<double>(iterations_per_epoch) - 1e-9);
  if (l < 2) l = 2;
  if (l > 100000) l = 100000;
  return static_cast<uint32_t>(l);
}

namespace {

// The kMax* bounds policy_table.inc's rows name (with policy.h's
// kMaxPolicySeconds).
constexpr double kMaxIterations = 10'000'000;
constexpr double kMaxRanks = 10'000'000;
constexpr double kMaxFactor = 1000;

const PolicyField kPolicyFields[] = {
#define STRAGGLER_POLICY_FIELD(type, name, default_value, ...) \
  {#name, &PolicyConfig::name __VA_OPT__(, ) __VA_ARGS__},
#include "straggler/engine/policy_table.inc"
};

}  // namespace

std::span<const PolicyField> PolicyFields() { return kPolicyFields; }

namespace {

std::string ValueText(uint32_t v) { return absl::StrCat(v); }
std::string ValueText(double v) { return ExactNumber(v); }
std::string ValueText(bool v) { return v ? "true" : "false"; }
std::string ValueText(PolicyKind v) { return std::string(PolicyKindName(v)); }
std::string ValueText(RecoveryMode v) { return std::string(RecoveryModeName(v)); }

}  // namespace

std::string PolicyChanges(const PolicyConfig& before, const PolicyConfig& after) {
  std::string out;
  for (const PolicyField& f : kPolicyFields) {
    std::visit(
        [&](auto member) {
          if (before.*member == after.*member) return;
          absl::StrAppend(&out, out.empty() ? "" : ", ", f.name, " ", ValueText(before.*member),
                          " -> ", ValueText(after.*member));
        },
        f.member);
  }
  return out;
}

}  // namespace straggler::engine
