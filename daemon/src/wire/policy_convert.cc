#include "wire/policy_convert.h"

#include "absl/strings/str_cat.h"

namespace straggler::daemon {

v1::PolicyKind ToProto(engine::PolicyKind k) {
  switch (k) {
    case engine::PolicyKind::kDynamic: return v1::POLICY_KIND_DYNAMIC;
    case engine::PolicyKind::kEwma: return v1::POLICY_KIND_EWMA;
    case engine::PolicyKind::kStatic: return v1::POLICY_KIND_STATIC;
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

void ToProto(const engine::PolicyConfig& p, v1::PolicyConfig* out) {
  out->set_kind(ToProto(p.kind));
  out->set_limit(p.limit);
  out->set_limit_fraction(p.limit_fraction);
  out->set_rejoin_mark(p.rejoin_mark);
  out->set_profile_iterations(p.profile_iterations);
  out->set_threshold_factor(p.threshold_factor);
  out->set_window_iterations(p.window_iterations);
  out->set_recovery(ToProto(p.recovery));
  out->set_ewma_alpha(p.ewma_alpha);
  out->set_ewma_ratio(p.ewma_ratio);
  out->set_ewma_min_samples(p.ewma_min_samples);
  out->set_static_threshold_seconds(p.static_threshold_seconds);
  out->set_max_excluded_fraction(p.max_excluded_fraction);
  out->set_min_active_ranks(p.min_active_ranks);
  out->set_min_active_replicas(p.min_active_replicas);
  out->set_cooldown_iterations(p.cooldown_iterations);
  out->set_min_throughput_gain(p.min_throughput_gain);
  out->set_lead_iterations(p.lead_iterations);
  out->set_unresponsive_after_seconds(p.unresponsive_after_seconds);
  out->set_exclusion_enabled(p.exclusion_enabled);
  out->set_global_shift_fraction(p.global_shift_fraction);
  out->set_max_compute_seconds(p.max_compute_seconds);
}

absl::StatusOr<engine::PolicyConfig> MergePolicy(const v1::PolicyConfig& u,
                                                 engine::PolicyConfig p) {
  switch (u.kind()) {
    case v1::POLICY_KIND_UNSPECIFIED: break;
    case v1::POLICY_KIND_DYNAMIC: p.kind = engine::PolicyKind::kDynamic; break;
    case v1::POLICY_KIND_EWMA: p.kind = engine::PolicyKind::kEwma; break;
    case v1::POLICY_KIND_STATIC: p.kind = engine::PolicyKind::kStatic; break;
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
#define STRAGGLER_MERGE(field) \
  if (u.has_##field()) p.field = u.field()
  STRAGGLER_MERGE(limit);
  STRAGGLER_MERGE(limit_fraction);
  STRAGGLER_MERGE(rejoin_mark);
  STRAGGLER_MERGE(profile_iterations);
  STRAGGLER_MERGE(threshold_factor);
  STRAGGLER_MERGE(window_iterations);
  STRAGGLER_MERGE(ewma_alpha);
  STRAGGLER_MERGE(ewma_ratio);
  STRAGGLER_MERGE(ewma_min_samples);
  STRAGGLER_MERGE(static_threshold_seconds);
  STRAGGLER_MERGE(max_excluded_fraction);
  STRAGGLER_MERGE(min_active_ranks);
  STRAGGLER_MERGE(min_active_replicas);
  STRAGGLER_MERGE(cooldown_iterations);
  STRAGGLER_MERGE(min_throughput_gain);
  STRAGGLER_MERGE(lead_iterations);
  STRAGGLER_MERGE(unresponsive_after_seconds);
  STRAGGLER_MERGE(exclusion_enabled);
  STRAGGLER_MERGE(global_shift_fraction);
  STRAGGLER_MERGE(max_compute_seconds);
#undef STRAGGLER_MERGE
  if (absl::Status s = p.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  return p;
}

}  // namespace straggler::daemon
