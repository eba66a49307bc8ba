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

void ToProto(const engine::Membership& m, const Job& job, v1::Membership* out) {
  out->set_job_id(job.id);
  out->set_incarnation(job.incarnation);
  out->set_version(m.version);
  out->set_effective_iteration(m.effective_iteration);
  for (const auto& e : m.excluded) {
    v1::ExcludedRank* x = out->add_excluded();
    x->set_rank(e.rank);
    x->set_reason(ToProto(e.reason));
    x->set_detail(e.detail);
    x->set_since_iteration(e.since_iteration);
  }
  out->set_world_size(m.world_size);
  out->set_lead_iterations(m.lead_iterations);
  if (m.created_at.count() > 0) ToProto(m.created_at, out->mutable_created_at());
}

void ToProto(const engine::WorkerView& w, const Job& job, v1::Worker* out) {
  out->set_job_id(job.id);
  out->set_rank(w.rank);
  if (w.rank < job.nodes.size()) out->set_node(job.nodes[w.rank]);
  out->set_state(ToProto(w.state));
  out->set_excluded(w.excluded);
  out->set_exclusion_reason(ToProto(w.exclusion_reason));
  out->set_counter(w.counter);
  out->set_limit(w.limit);
  out->set_epoch(w.epoch);
  out->set_last_iteration(w.last_iteration);
  out->set_last_compute_seconds(w.last_compute_seconds);
  out->set_ewma_compute_seconds(w.ewma_compute_seconds);
  out->set_slowdown_ratio(w.slowdown_ratio);
  out->set_reports_total(w.reports_total);
  if (w.last_report_time.count() > 0) ToProto(w.last_report_time, out->mutable_last_report_time());
  out->set_override(ToProto(w.override));
  if (w.rank < job.gpu.size() && job.gpu[w.rank]) {
    *out->mutable_gpu() = job.gpu[w.rank]->telemetry;
    out->set_gpu_stale(!job.gpu[w.rank]->Fresh(WallNow()));
  }
}

void ToProto(const Job& job, v1::Job* out) {
  const engine::JobView v = job.engine.View();
  out->set_job_id(job.id);
  out->set_world_size(job.world_size);
  ToProto(job.engine.policy(), out->mutable_policy());
  out->set_epoch(v.epoch);
  out->set_highest_iteration(v.highest_iteration);
  out->set_threshold_seconds(v.threshold_seconds);
  out->set_baseline_seconds(v.baseline_seconds);
  out->set_step_seconds(v.step_seconds);
  ToProto(job.engine.membership(), job, out->mutable_membership());
  out->set_active_ranks(v.active_ranks);
  out->set_excluded_ranks(v.excluded_ranks);
  out->set_straggler_ranks(v.straggler_ranks);
  out->set_unresponsive_ranks(v.unresponsive_ranks);
  out->set_streams(job.streams);
  out->set_detections_total(v.detections_total);
  out->set_recoveries_total(v.recoveries_total);
  out->set_reports_total(v.reports_total);
  ToProto(job.created_at, out->mutable_created_at());
  if (v.last_report_time.count() > 0) ToProto(v.last_report_time, out->mutable_last_report_time());
  out->set_guard_blocks_total(v.guard_blocks_total);
  out->set_detached_ranks(v.detached_ranks);
  out->set_membership_withheld(v.membership_withheld);
  out->set_run_id(job.run_id);
  out->set_finished(v.finished_ranks == v.world_size);
}

void ToProto(const JournalEntry& e, v1::Event* out) {
  out->set_sequence(e.sequence);
  ToProto(e.event.time, out->mutable_time());
  out->set_job_id(e.job_id);
  out->set_kind(ToProto(e.event.kind));
  // A job-wide event has no rank: rank 0 and PENDING -> PENDING would read
  // as a claim about rank 0.
  if (engine::EventNamesRank(e.event.kind)) {
    out->set_rank(e.event.rank);
    out->set_from(ToProto(e.event.from));
    out->set_to(ToProto(e.event.to));
  }
  out->set_iteration(e.event.iteration);
  v1::Evidence* ev = out->mutable_evidence();
  ev->set_compute_seconds(e.event.evidence.compute_seconds);
  ev->set_threshold_seconds(e.event.evidence.threshold_seconds);
  ev->set_counter(e.event.evidence.counter);
  ev->set_limit(e.event.evidence.limit);
  ev->set_baseline_seconds(e.event.evidence.baseline_seconds);
  ev->set_latency_iterations(e.event.evidence.latency_iterations);
  ev->set_likely_cause(ToProto(e.likely_cause));
  ev->set_likely_cause_detail(e.likely_cause_detail);
  out->set_membership_version(e.event.membership_version);
  out->set_message(e.event.message);
  out->set_run_id(e.run_id);
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

void MergeDirective(v1::Directive& pending, v1::Directive&& newer) {
  // Runs under the job's lock whenever a peer reads slower than we write, and
  // nearly every newer directive is a plain acknowledgement: no membership,
  // a few ranks of progress. Both lists are ascending (by version, by rank),
  // so merge them linearly instead of rebuilding them through maps.
  if (newer.memberships_size() > 0) {
    auto* mine = pending.mutable_memberships();
    google::protobuf::RepeatedPtrField<v1::Membership> merged;
    int i = 0, j = 0;
    auto* theirs = newer.mutable_memberships();
    while (i < mine->size() || j < theirs->size()) {
      if (j == theirs->size() ||
          (i < mine->size() && mine->Get(i).version() < theirs->Get(j).version())) {
        *merged.Add() = std::move(*mine->Mutable(i++));
      } else {
        if (i < mine->size() && mine->Get(i).version() == theirs->Get(j).version()) ++i;
        *merged.Add() = std::move(*theirs->Mutable(j++));  // the newer copy wins
      }
    }
    const int excess = merged.size() - static_cast<int>(engine::JobEngine::kMembershipHistory);
    if (excess > 0) merged.DeleteSubrange(0, excess);
    mine->Swap(&merged);
  }

  pending.set_acked_sequence(newer.acked_sequence());
  if (pending.progress_size() == 0) {
    *pending.mutable_progress() = std::move(*newer.mutable_progress());
  } else if (newer.progress_size() > 0) {
    const auto& a = pending.progress();
    const auto& b = newer.progress();
    google::protobuf::RepeatedPtrField<v1::RankProgress> merged;
    int i = 0, j = 0;
    while (i < a.size() || j < b.size()) {
      v1::RankProgress* rp = merged.Add();
      if (j == b.size() || (i < a.size() && a.Get(i).rank() < b.Get(j).rank())) {
        *rp = a.Get(i++);
      } else if (i == a.size() || b.Get(j).rank() < a.Get(i).rank()) {
        *rp = b.Get(j++);
      } else {  // same rank: the higher iteration
        rp->set_rank(a.Get(i).rank());
        rp->set_iteration(std::max(a.Get(i++).iteration(), b.Get(j++).iteration()));
      }
    }
    pending.mutable_progress()->Swap(&merged);
  }
  pending.set_accepted(pending.accepted() + newer.accepted());
  pending.set_rejected(pending.rejected() + newer.rejected());
  pending.set_duplicates(pending.duplicates() + newer.duplicates());
  for (auto& r : *newer.mutable_rejections()) {
    if (pending.rejections_size() >= kMaxDirectiveRejections) break;
    *pending.add_rejections() = std::move(r);
  }
  // The agent's upstream state: the newer word is the current one.
  if (newer.has_upstream_unavailable()) {
    pending.set_upstream_unavailable(newer.upstream_unavailable());
  }
}

}  // namespace straggler::daemon
