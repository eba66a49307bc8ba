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
    case PolicyKind::kDynamic: return "dynamic";
    case PolicyKind::kEwma: return "ewma";
    case PolicyKind::kStatic: return "static";
    case PolicyKind::kPeer: return "peer";
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

// The one place every field's range is written (docs/security.md#limits-and-input-validation and
// deploy/stragglerd.yaml quote it). Counts of iterations stay below 10^7 so
// that iteration + count never nears 2^64; durations below kMaxPolicySeconds.
constexpr double kMaxIterations = 10'000'000;
constexpr double kMaxRanks = 10'000'000;
constexpr double kMaxFactor = 1000;

const PolicyField kPolicyFields[] = {
    {"kind", &PolicyConfig::kind},
    {"limit", &PolicyConfig::limit, 1, 100000},
    // 0 = use limit.
    {"limit_fraction", &PolicyConfig::limit_fraction, 0, 1},
    // Also below limit (Validate).
    {"rejoin_mark", &PolicyConfig::rejoin_mark, 0, 99999},
    {"profile_iterations", &PolicyConfig::profile_iterations, 1, 100000},
    {"threshold_factor", &PolicyConfig::threshold_factor, 1, kMaxFactor, true},
    // 0 = off.
    {"window_iterations", &PolicyConfig::window_iterations, 0, kMaxIterations},
    {"recovery", &PolicyConfig::recovery},
    {"global_shift_fraction", &PolicyConfig::global_shift_fraction, 0, 1, true},
    {"ewma_alpha", &PolicyConfig::ewma_alpha, 0, 1, true},
    {"ewma_ratio", &PolicyConfig::ewma_ratio, 1, kMaxFactor, true},
    {"ewma_min_samples", &PolicyConfig::ewma_min_samples, 1, 100000},
    // Also > 0 for the static policy (Validate).
    {"static_threshold_seconds", &PolicyConfig::static_threshold_seconds, 0, kMaxPolicySeconds},
    {"peer_enter_ratio", &PolicyConfig::peer_enter_ratio, 1, kMaxFactor, true},
    {"peer_noise_z", &PolicyConfig::peer_noise_z, 0, 100},
    // At least 3: one step of the window is trimmed, two must remain.
    {"peer_window", &PolicyConfig::peer_window, 3, 1000},
    {"peer_enter_rows", &PolicyConfig::peer_enter_rows, 1, 1000},
    {"peer_severe_ratio", &PolicyConfig::peer_severe_ratio, 1, kMaxFactor, true},
    {"peer_spike_ratio", &PolicyConfig::peer_spike_ratio, 1, kMaxFactor, true},
    {"peer_exit_rows", &PolicyConfig::peer_exit_rows, 1, 1000},
    {"peer_straggler_ratio", &PolicyConfig::peer_straggler_ratio, 1, kMaxFactor, true},
    // A median needs 3 ranks to outvote one slow rank.
    {"peer_min_group", &PolicyConfig::peer_min_group, 3, kMaxRanks},
    {"peer_profile_iterations", &PolicyConfig::peer_profile_iterations, 1, 100000},
    {"max_excluded_fraction", &PolicyConfig::max_excluded_fraction, 0, 1},
    {"min_active_ranks", &PolicyConfig::min_active_ranks, 1, kMaxRanks},
    {"min_active_replicas", &PolicyConfig::min_active_replicas, 1, kMaxRanks},
    {"cooldown_iterations", &PolicyConfig::cooldown_iterations, 0, kMaxIterations},
    {"min_throughput_gain", &PolicyConfig::min_throughput_gain, -1, 10},
    {"lead_iterations", &PolicyConfig::lead_iterations, 1, 1000},
    {"unresponsive_after_seconds", &PolicyConfig::unresponsive_after_seconds, 0,
     kMaxPolicySeconds, true},
    {"exclusion_enabled", &PolicyConfig::exclusion_enabled},
    {"max_compute_seconds", &PolicyConfig::max_compute_seconds, 0, kMaxPolicySeconds, true},
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
