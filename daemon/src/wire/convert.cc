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
    case engine::WorkerState::kMild: return v1::WORKER_STATE_MILD;
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
    case engine::ExclusionReason::kReplica: return v1::EXCLUSION_REASON_REPLICA;
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
    case engine::EventKind::kJobLost: return v1::EVENT_KIND_JOB_LOST;
  }
  return v1::EVENT_KIND_UNSPECIFIED;
}

absl::StatusOr<engine::EventKind> FromProto(v1::EventKind k) {
  for (engine::EventKind e :
       {engine::EventKind::kStateChange, engine::EventKind::kMembership,
        engine::EventKind::kGuardBlocked, engine::EventKind::kPolicyChanged,
        engine::EventKind::kOverride, engine::EventKind::kReset, engine::EventKind::kReprofile,
        engine::EventKind::kMembershipWithheld, engine::EventKind::kJobLost}) {
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
    case LikelyCause::kInputPipeline: return v1::LIKELY_CAUSE_INPUT_PIPELINE;
    case LikelyCause::kCompute: return v1::LIKELY_CAUSE_COMPUTE;
    case LikelyCause::kHost: return v1::LIKELY_CAUSE_HOST;
    case LikelyCause::kData: return v1::LIKELY_CAUSE_DATA;
  }
  return v1::LIKELY_CAUSE_UNSPECIFIED;
}

}  // namespace straggler::daemon
