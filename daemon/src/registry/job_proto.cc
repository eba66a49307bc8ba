#include "registry/job_proto.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "wire/convert.h"

namespace straggler::daemon {

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
    if (e.culprit) x->set_culprit_rank(*e.culprit);
    x->set_culprit_peer_group(e.culprit_group);
    if (e.replica) x->set_replica(*e.replica);
  }
  out->set_world_size(m.world_size);
  out->set_lead_iterations(m.lead_iterations);
  if (m.created_at.count() > 0) ToProto(m.created_at, out->mutable_created_at());
}

void ToProto(const engine::WorkerView& w, const Job::Locked& job, v1::Worker* out) {
  out->set_job_id(job.id);
  out->set_rank(w.rank);
  if (w.rank < job->nodes.size()) out->set_node(job->nodes[w.rank]);
  out->set_state(ToProto(w.state));
  out->set_excluded(w.excluded);
  out->set_exclusion_reason(ToProto(w.exclusion_reason));
  out->set_monitor_only(w.monitor_only);
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
  if (w.rank < job->gpu.size() && job->gpu[w.rank]) {
    *out->mutable_gpu() = job->gpu[w.rank]->telemetry;
    out->set_gpu_stale(!job->gpu[w.rank]->Fresh(WallNow()));
  }
  if (w.rank < job->host.size()) {
    const RankHost& h = job->host[w.rank];
    if (h.node) *out->mutable_host() = *h.node;
    if (h.process) *out->mutable_process() = *h.process;
    if (h.node || h.process) out->set_host_stale(!h.Fresh(WallNow()));
  }
  if (w.state == engine::WorkerState::kStraggler) {
    if (auto it = job->straggler_causes.find(w.rank); it != job->straggler_causes.end()) {
      out->set_likely_cause(ToProto(it->second.cause));
      out->set_likely_cause_detail(it->second.detail);
    }
  } else if (w.data) {
    const Attribution a = AttributeData(w.data->time_ratio, w.data->threshold_ratio,
                                        w.data->per_work_ratio, w.data->work_ratio);
    out->set_likely_cause(ToProto(a.cause));
    out->set_likely_cause_detail(a.detail);
  }
  if (w.rank < job.world_size) {
    const DeclaredTopology& t = job->topology.Of(w.rank);
    out->set_peer_group(t.peer_group);
    if (t.replica) out->set_replica(*t.replica);
    out->set_gpu_model(t.gpu_model);
  }
}

void ToProto(const Job::Locked& job, v1::Job* out) {
  const engine::JobView v = job->engine.View();
  out->set_job_id(job.id);
  out->set_world_size(job.world_size);
  ToProto(job->engine.policy(), out->mutable_policy());
  out->set_epoch(v.epoch);
  out->set_highest_iteration(v.highest_iteration);
  out->set_threshold_seconds(v.threshold_seconds);
  out->set_baseline_seconds(v.baseline_seconds);
  out->set_step_seconds(v.step_seconds);
  ToProto(job->engine.membership(), job, out->mutable_membership());
  out->set_active_ranks(v.active_ranks);
  out->set_excluded_ranks(v.excluded_ranks);
  out->set_straggler_ranks(v.straggler_ranks);
  out->set_mild_ranks(v.mild_ranks);
  out->set_unresponsive_ranks(v.unresponsive_ranks);
  out->set_streams(job->streams);
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
  out->set_lost(v.lost);
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

}  // namespace straggler::daemon
