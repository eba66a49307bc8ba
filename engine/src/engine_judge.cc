// Judging (docs/detection.md): a completed row goes to the policy's
// reference (reference_*.cc), which gives verdicts; a verdict moves the
// rank's bounded counter, and the counter its state. Epochs and probation
// recovery live here too.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine_impl.h"
#include "events.h"

namespace straggler::engine::internal {

std::unique_ptr<Reference> MakeReference(EngineImpl& engine) {
  switch (engine.policy.kind) {
#define STRAGGLER_POLICY_KIND(Name, name) \
  case PolicyKind::k##Name:               \
    return Make##Name##Reference(engine);
#include "straggler/engine/policy_table.inc"
  }
  return MakeDynamicReference(engine);
}

Evidence EngineImpl::MakeEvidence(const RankState& r, double compute) const {
  Evidence ev;
  ev.compute_seconds = compute;
  ev.threshold_seconds = have_threshold ? threshold : 0.0;
  ev.counter = r.counter;
  ev.limit = Limit();
  ev.baseline_seconds = baseline;
  return ev;
}

void EngineImpl::ChangeState(uint32_t rank, WorkerState to, uint64_t iteration, double compute,
                             Time now, std::string message) {
  RankState& r = ranks[rank];
  const WorkerState from = r.state;
  r.state = to;
  Emit(RankEvent(EventKind::kStateChange, now, rank, from, to, iteration, Newest().version,
                 std::move(message)))
      .evidence = MakeEvidence(r, compute);
  dirty = true;
}

void EngineImpl::OnNewEpoch(const Row& row, Time now) {
  if (have_epoch && !epoch_length_announced && row.iteration > epoch_start_iteration &&
      row.epoch == epoch + 1) {
    iterations_per_epoch = row.iteration - epoch_start_iteration;
    ClampCounters();
  }
  const bool first = !have_epoch;
  have_epoch = true;
  epoch = row.epoch;
  epoch_start_iteration = row.iteration;
  if (first) return;
  reference->OnEpoch(row, now);
  if (policy.recovery == RecoveryMode::kProbation) BeginProbation(now);
}

bool EngineImpl::ProcessRow(Row& row, Time now) {
  if (!have_epoch || row.epoch > epoch) OnNewEpoch(row, now);
  step_seconds = row.step_max;
  if (row.values.size() < slice_min_values) {
    reference->OnRow(row, now);
    EndRow(row, now, false);
    return true;
  }
  // The reference keeps pointing at the row until its EndRow: it stays in
  // `sliced` until then.
  sliced.row = std::move(row);
  sliced.now = now;
  sliced.evaluate = false;
  sliced.left = reference->BeginRow(sliced.row, now);
  // slice_per_report units per report, or as many times that as it takes to
  // be done within three quarters of a row's reports (the next row's), so
  // that the next row does not have to finish it at once (the end of a
  // profile takes about four units a rank).
  const size_t per_report = std::max<size_t>(slice_per_report, 1);
  const size_t reports = std::max<size_t>(sliced.row.values.size() * 3 / 4, 1);
  sliced.pace = per_report * std::max<size_t>(1, (sliced.left + per_report * reports - 1) /
                                                     (per_report * reports));
  sliced.active = true;
  ContinueRow(0);  // nothing left: ends it now
  return false;
}

// What follows a row's verdicts; `evaluate`: an Evaluate was put off.
void EngineImpl::EndRow(Row& row, Time now, bool evaluate) {
  if (probation_active && row.iteration >= probation_until) EndProbation(now);
  if (dirty || blocked > 0 || evaluate) Evaluate(now);
}

void EngineImpl::ContinueRow(size_t budget) {
  if (!sliced.active) return;
  if (sliced.left > 0 && budget > 0) {
    sliced.left = reference->JudgeSlice(budget);
    ++sliced.slices;
  }
  if (sliced.left > 0) return;
  sliced.active = false;
  Row row = std::move(sliced.row);
  reference->EndRow(row, sliced.now);
  EndRow(row, sliced.now, sliced.evaluate);
  rows.Recycle(std::move(row));
}

// Applies the row's verdicts against the threshold. With the guard, a row
// where more than global_shift_fraction of the ranks are slow moves no
// counter (a job-wide slowdown is not a straggler) and the count of slow
// ranks is returned for the reference to re-profile; 0 otherwise.
size_t EngineImpl::JudgeRow(Row& row, Time now, bool global_shift_guard) {
  if (global_shift_guard && row.values.size() >= 2) {
    size_t slow = 0;
    for (auto& [rank, t] : row.values) slow += t > threshold;
    if (static_cast<double>(slow) >
        policy.global_shift_fraction * static_cast<double>(row.values.size()))
      return slow;
  }
  for (auto& [rank, t] : row.values) ApplyVerdict(rank, VerdictFor(t), row.iteration, t, now);
  return 0;
}

// A report judged on its own: excluded ranks (shadow recovery) and reports
// that arrived after their row was judged.
void EngineImpl::JudgeSingle(uint32_t rank, const Report& rep, Time now) {
  if (reference->JudgeAlone(rank, rep, now)) return;
  const double own = rep.OwnSeconds();
  ApplyVerdict(rank, reference->Single(rank, rep), rep.iteration, own, now);
}

bool EngineImpl::CooledDown(const RankState& r, uint64_t iteration) const {
  return !r.flipped || iteration >= r.last_flip_iteration + policy.cooldown_iterations;
}

// The counter rule (docs/detection.md, "Counter").
void EngineImpl::ApplyVerdict(uint32_t rank, Verdict v, uint64_t iteration, double compute,
                              Time now) {
  RankState& r = ranks[rank];
  const uint32_t lim = Limit();
  if (v == Verdict::kSlow) {
    if (r.counter == 0) r.episode_start = iteration;
    if (r.counter < lim) r.counter++;
  } else if (v == Verdict::kFast) {
    if (r.counter > 0) r.counter--;
  }
  Transition(rank, iteration, compute, now, [&](bool to_straggler) {
    return to_straggler
               ? absl::StrFormat("compute %.6gs above threshold %.6gs; counter %u/%u", compute,
                                 threshold, r.counter, lim)
               : absl::StrFormat("compute %.6gs below threshold %.6gs; counter %u, rejoin mark %u",
                                 compute, threshold, r.counter, Mark());
  });
}

bool EngineImpl::SetCounter(uint32_t rank, uint32_t counter, uint64_t iteration, double compute,
                            Time now, absl::FunctionRef<std::string(bool)> why,
                            WorkerState calm) {
  RankState& r = ranks[rank];
  counter = std::min(counter, Limit());
  if (r.counter == 0 && counter > 0) r.episode_start = iteration;
  r.counter = counter;
  return Transition(rank, iteration, compute, now, why, calm);
}

bool EngineImpl::Transition(uint32_t rank, uint64_t iteration, double compute, Time now,
                            absl::FunctionRef<std::string(bool)> why, WorkerState calm) {
  RankState& r = ranks[rank];
  const bool calm_now = r.state == WorkerState::kHealthy || r.state == WorkerState::kMild;
  if (calm_now && r.counter >= Limit() && CooledDown(r, iteration)) {
    r.flipped = true;
    r.last_flip_iteration = iteration;
    detections_total++;
    ChangeState(rank, WorkerState::kStraggler, iteration, compute, now, why(true));
    events.back().evidence.latency_iterations =
        iteration >= r.episode_start ? iteration - r.episode_start + 1 : 0;
    return true;
  }
  if (r.state == WorkerState::kStraggler && r.counter <= Mark() && CooledDown(r, iteration)) {
    r.flipped = true;
    r.last_flip_iteration = iteration;
    recoveries_total++;
    r.probation_failed = false;
    ChangeState(rank, calm, iteration, compute, now, why(false));
    return true;
  }
  if (calm_now && r.state != calm) {
    ChangeState(rank, calm, iteration, compute, now, why(false));
    return true;
  }
  return false;
}

void EngineImpl::ClampCounters() {
  const uint32_t lim = Limit();
  for (auto& r : ranks) r.counter = std::min<uint32_t>(r.counter, lim);
}

// Probation recovery: at each new epoch, straggler-excluded ranks are
// re-included for profile_iterations iterations.
void EngineImpl::BeginProbation(Time now) {
  bool any = false;
  for (uint32_t i = 0; i < world_size; ++i) {
    RankState& r = ranks[i];
    if (r.state == WorkerState::kStraggler && Newest().IsExcluded(i)) {
      r.on_probation = true;
      any = true;
    }
  }
  if (!any) return;
  probation_active = true;
  dirty = true;
  EvaluateNow(now);  // re-includes them; sets the version's effective iteration
  probation_until = Newest().effective_iteration + policy.profile_iterations;
}

// Those still stragglers when probation ends are excluded again
// (kProbationEnd).
void EngineImpl::EndProbation(Time now) {
  probation_active = false;
  for (auto& r : ranks) {
    if (r.on_probation && r.state == WorkerState::kStraggler) r.probation_failed = true;
    r.on_probation = false;
  }
  dirty = true;
  Evaluate(now);
}

}  // namespace straggler::engine::internal
