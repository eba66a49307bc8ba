#include "straggler/engine/policy.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace straggler::engine {

std::string_view PolicyKindName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kDynamic: return "dynamic";
    case PolicyKind::kEwma: return "ewma";
    case PolicyKind::kStatic: return "static";
  }
  return "unknown";
}

absl::StatusOr<PolicyKind> ParsePolicyKind(std::string_view name) {
  if (name == "dynamic") return PolicyKind::kDynamic;
  if (name == "ewma") return PolicyKind::kEwma;
  if (name == "static") return PolicyKind::kStatic;
  return absl::InvalidArgumentError(
      absl::StrCat("policy kind '", std::string(name), "' is not one of dynamic, ewma, static"));
}

std::string_view RecoveryModeName(RecoveryMode mode) {
  switch (mode) {
    case RecoveryMode::kShadow: return "shadow";
    case RecoveryMode::kProbation: return "probation";
  }
  return "unknown";
}

absl::StatusOr<RecoveryMode> ParseRecoveryMode(std::string_view name) {
  if (name == "shadow") return RecoveryMode::kShadow;
  if (name == "probation") return RecoveryMode::kProbation;
  return absl::InvalidArgumentError(
      absl::StrCat("recovery '", std::string(name), "' is not one of shadow, probation"));
}

namespace {

absl::Status Bad(std::string_view field, double value, std::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(field), "=", value, " ", std::string(rule)));
}

bool Finite(double v) { return std::isfinite(v); }

}  // namespace

absl::Status PolicyConfig::Validate() const {
  if (limit < 1) return Bad("limit", limit, "must be >= 1");
  if (limit > 100000) return Bad("limit", limit, "must be <= 100000");
  if (!Finite(limit_fraction) || limit_fraction < 0 || limit_fraction > 1)
    return Bad("limit_fraction", limit_fraction, "must be in [0, 1] (0 = use limit)");
  if (rejoin_mark >= limit)
    return absl::InvalidArgumentError(absl::StrCat("rejoin_mark=", rejoin_mark,
                                                   " must be below limit=", limit));
  if (profile_iterations < 1 || profile_iterations > 100000)
    return Bad("profile_iterations", profile_iterations, "must be in [1, 100000]");
  if (!Finite(threshold_factor) || threshold_factor <= 1.0)
    return Bad("threshold_factor", threshold_factor, "must be > 1");
  if (!Finite(global_shift_fraction) || global_shift_fraction <= 0 || global_shift_fraction > 1)
    return Bad("global_shift_fraction", global_shift_fraction, "must be in (0, 1]");
  if (!Finite(ewma_alpha) || ewma_alpha <= 0 || ewma_alpha > 1)
    return Bad("ewma_alpha", ewma_alpha, "must be in (0, 1]");
  if (!Finite(ewma_ratio) || ewma_ratio <= 1.0) return Bad("ewma_ratio", ewma_ratio, "must be > 1");
  if (ewma_min_samples < 1) return Bad("ewma_min_samples", ewma_min_samples, "must be >= 1");
  if (!Finite(static_threshold_seconds) || static_threshold_seconds < 0)
    return Bad("static_threshold_seconds", static_threshold_seconds, "must be >= 0");
  if (kind == PolicyKind::kStatic && static_threshold_seconds <= 0)
    return Bad("static_threshold_seconds", static_threshold_seconds,
               "must be > 0 for the static policy");
  if (!Finite(max_excluded_fraction) || max_excluded_fraction < 0 || max_excluded_fraction > 1)
    return Bad("max_excluded_fraction", max_excluded_fraction, "must be in [0, 1]");
  if (min_active_ranks < 1) return Bad("min_active_ranks", min_active_ranks, "must be >= 1");
  if (!Finite(min_throughput_gain) || min_throughput_gain < -1 || min_throughput_gain > 10)
    return Bad("min_throughput_gain", min_throughput_gain, "must be in [-1, 10]");
  if (lead_iterations < 1 || lead_iterations > 1000)
    return Bad("lead_iterations", lead_iterations, "must be in [1, 1000]");
  if (!Finite(unresponsive_after_seconds) || unresponsive_after_seconds <= 0)
    return Bad("unresponsive_after_seconds", unresponsive_after_seconds, "must be > 0");
  if (!Finite(max_compute_seconds) || max_compute_seconds <= 0)
    return Bad("max_compute_seconds", max_compute_seconds, "must be > 0");
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

const PolicyField kPolicyFields[] = {
    {"kind", &PolicyConfig::kind},
    {"limit", &PolicyConfig::limit},
    {"limit_fraction", &PolicyConfig::limit_fraction},
    {"rejoin_mark", &PolicyConfig::rejoin_mark},
    {"profile_iterations", &PolicyConfig::profile_iterations},
    {"threshold_factor", &PolicyConfig::threshold_factor},
    {"window_iterations", &PolicyConfig::window_iterations},
    {"recovery", &PolicyConfig::recovery},
    {"global_shift_fraction", &PolicyConfig::global_shift_fraction},
    {"ewma_alpha", &PolicyConfig::ewma_alpha},
    {"ewma_ratio", &PolicyConfig::ewma_ratio},
    {"ewma_min_samples", &PolicyConfig::ewma_min_samples},
    {"static_threshold_seconds", &PolicyConfig::static_threshold_seconds},
    {"max_excluded_fraction", &PolicyConfig::max_excluded_fraction},
    {"min_active_ranks", &PolicyConfig::min_active_ranks},
    {"cooldown_iterations", &PolicyConfig::cooldown_iterations},
    {"min_throughput_gain", &PolicyConfig::min_throughput_gain},
    {"lead_iterations", &PolicyConfig::lead_iterations},
    {"unresponsive_after_seconds", &PolicyConfig::unresponsive_after_seconds},
    {"exclusion_enabled", &PolicyConfig::exclusion_enabled},
    {"max_compute_seconds", &PolicyConfig::max_compute_seconds},
};

}  // namespace

std::span<const PolicyField> PolicyFields() { return kPolicyFields; }

namespace {

std::string ValueText(uint32_t v) { return absl::StrCat(v); }
std::string ValueText(double v) { return absl::StrCat(v); }
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
