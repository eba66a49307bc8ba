#include "wire/convert.h"

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"

namespace straggler::daemon {

void ToProto(engine::Time t, google::protobuf::Timestamp* out) {
  const int64_t ns = t.count();
  int64_t seconds = ns / 1'000'000'000;
  int64_t nanos = ns % 1'000'000'000;
  if (nanos < 0) {  // Timestamp nanos must be in [0, 1e9)
    nanos += 1'000'000'000;
    --seconds;
  }
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(nanos));
}

v1::WorkerState ToProto(engine::WorkerState s) {
  switch (s) {
    case engine::WorkerState::kPending: return v1::WORKER_STATE_PENDING;
    case engine::WorkerState::kHealthy: return v1::WORKER_STATE_HEALTHY;
    case engine::WorkerState::kStraggler: return v1::WORKER_STATE_STRAGGLER;
    case engine::WorkerState::kUnresponsive: return v1::WORKER_STATE_UNRESPONSIVE;
    case engine::WorkerState::kFinished: return v1::WORKER_STATE_FINISHED;
  }
  return v1::WORKER_STATE_UNSPECIFIED;
}

v1::ExclusionReason ToProto(engine::ExclusionReason r) {
  switch (r) {
    case engine::ExclusionReason::kNone: return v1::EXCLUSION_REASON_UNSPECIFIED;
    case engine::ExclusionReason::kStraggler: return v1::EXCLUSION_REASON_STRAGGLER;
    case engine::ExclusionReason::kUnresponsive: return v1::EXCLUSION_REASON_UNRESPONSIVE;
    case engine::ExclusionReason::kForced: return v1::EXCLUSION_REASON_FORCED;
    case engine::ExclusionReason::kProbationEnd: return v1::EXCLUSION_REASON_PROBATION_END;
  }
  return v1::EXCLUSION_REASON_UNSPECIFIED;
}

v1::RankOverride ToProto(engine::RankOverride o) {
  switch (o) {
    case engine::RankOverride::kNone: return v1::RANK_OVERRIDE_UNSPECIFIED;  // automatic
    case engine::RankOverride::kForceInclude: return v1::RANK_OVERRIDE_FORCE_INCLUDE;
    case engine::RankOverride::kForceExclude: return v1::RANK_OVERRIDE_FORCE_EXCLUDE;
  }
  return v1::RANK_OVERRIDE_UNSPECIFIED;
}

absl::StatusOr<engine::RankOverride> FromProto(v1::RankOverride o) {
  switch (o) {
    case v1::RANK_OVERRIDE_NONE: return engine::RankOverride::kNone;
    case v1::RANK_OVERRIDE_FORCE_INCLUDE: return engine::RankOverride::kForceInclude;
    case v1::RANK_OVERRIDE_FORCE_EXCLUDE: return engine::RankOverride::kForceExclude;
    default:
      // An unknown number has no enum name: show the number itself.
      const std::string& name = v1::RankOverride_Name(o);
      return absl::InvalidArgumentError(absl::StrCat(
          "override=", name.empty() ? absl::StrCat(static_cast<int>(o)) : name,
          " is not RANK_OVERRIDE_NONE, RANK_OVERRIDE_FORCE_INCLUDE or RANK_OVERRIDE_FORCE_EXCLUDE"));
  }
}

v1::EventKind ToProto(engine::EventKind k) {
  switch (k) {
    case engine::EventKind::kStateChange: return v1::EVENT_KIND_STATE_CHANGE;
    case engine::EventKind::kMembership: return v1::EVENT_KIND_MEMBERSHIP;
    case engine::EventKind::kGuardBlocked: return v1::EVENT_KIND_GUARD_BLOCKED;
    case engine::EventKind::kPolicyChanged: return v1::EVENT_KIND_POLICY_CHANGED;
    case engine::EventKind::kOverride: return v1::EVENT_KIND_OVERRIDE;
    case engine::EventKind::kReset: return v1::EVENT_KIND_RESET;
    case engine::EventKind::kReprofile: return v1::EVENT_KIND_REPROFILE;
    case engine::EventKind::kMembershipWithheld: return v1::EVENT_KIND_MEMBERSHIP_WITHHELD;
  }
  return v1::EVENT_KIND_UNSPECIFIED;
}

absl::StatusOr<engine::EventKind> FromProto(v1::EventKind k) {
  for (engine::EventKind e :
       {engine::EventKind::kStateChange, engine::EventKind::kMembership,
        engine::EventKind::kGuardBlocked, engine::EventKind::kPolicyChanged,
        engine::EventKind::kOverride, engine::EventKind::kReset, engine::EventKind::kReprofile,
        engine::EventKind::kMembershipWithheld}) {
    if (ToProto(e) == k) return e;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("event kind ", static_cast<int>(k), " (", v1::EventKind_Name(k),
                   ") is not a kind of event"));
}

v1::LikelyCause ToProto(LikelyCause c) {
  switch (c) {
    case LikelyCause::kUnspecified: return v1::LIKELY_CAUSE_UNSPECIFIED;
    case LikelyCause::kNoneVisible: return v1::LIKELY_CAUSE_NONE_VISIBLE;
    case LikelyCause::kThermalThrottle: return v1::LIKELY_CAUSE_THERMAL_THROTTLE;
    case LikelyCause::kPowerThrottle: return v1::LIKELY_CAUSE_POWER_THROTTLE;
    case LikelyCause::kHwSlowdown: return v1::LIKELY_CAUSE_HW_SLOWDOWN;
    case LikelyCause::kClockDrop: return v1::LIKELY_CAUSE_CLOCK_DROP;
    case LikelyCause::kLowUtilization: return v1::LIKELY_CAUSE_LOW_UTILIZATION;
  }
  return v1::LIKELY_CAUSE_UNSPECIFIED;
}

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
  out->set_cooldown_iterations(p.cooldown_iterations);
  out->set_min_throughput_gain(p.min_throughput_gain);
  out->set_lead_iterations(p.lead_iterations);
  out->set_unresponsive_after_seconds(p.unresponsive_after_seconds);
  out->set_exclusion_enabled(p.exclusion_enabled);
  out->set_global_shift_fraction(p.global_shift_fraction);
  out->set_max_compute_seconds(p.max_compute_seconds);
  out->set_peer_enter_ratio(p.peer_enter_ratio);
  out->set_peer_noise_z(p.peer_noise_z);
  out->set_peer_window(p.peer_window);
  out->set_peer_enter_rows(p.peer_enter_rows);
  out->set_peer_severe_ratio(p.peer_severe_ratio);
  out->set_peer_spike_ratio(p.peer_spike_ratio);
  out->set_peer_exit_rows(p.peer_exit_rows);
  out->set_peer_min_group(p.peer_min_group);
  out->set_peer_profile_iterations(p.peer_profile_iterations);
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
  STRAGGLER_MERGE(cooldown_iterations);
  STRAGGLER_MERGE(min_throughput_gain);
  STRAGGLER_MERGE(lead_iterations);
  STRAGGLER_MERGE(unresponsive_after_seconds);
  STRAGGLER_MERGE(exclusion_enabled);
  STRAGGLER_MERGE(global_shift_fraction);
  STRAGGLER_MERGE(max_compute_seconds);
  STRAGGLER_MERGE(peer_enter_ratio);
  STRAGGLER_MERGE(peer_noise_z);
  STRAGGLER_MERGE(peer_window);
  STRAGGLER_MERGE(peer_enter_rows);
  STRAGGLER_MERGE(peer_severe_ratio);
  STRAGGLER_MERGE(peer_spike_ratio);
  STRAGGLER_MERGE(peer_exit_rows);
  STRAGGLER_MERGE(peer_min_group);
  STRAGGLER_MERGE(peer_profile_iterations);
#undef STRAGGLER_MERGE
  if (absl::Status s = p.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  return p;
}

}  // namespace straggler::daemon
