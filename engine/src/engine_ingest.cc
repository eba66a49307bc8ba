// A report in: validation (docs/runs.md, "The iteration rule"), the rank's
// bookkeeping, and rows - how reports of the ranks taking part in the
// collective are grouped by iteration and when a row is complete
// (docs/detection.md, "Rows" and "Far ahead").
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine_impl.h"

namespace straggler::engine::internal {

IngestResult EngineImpl::Validate(const Report& rep) const {
  IngestResult res;
  auto bad = [&](std::string msg) {
    res.reason = RejectReason::kInvalidValue;
    res.message = std::move(msg);
    return res;
  };
  if (rep.rank >= world_size) {
    res.reason = RejectReason::kRankOutOfRange;
    res.message = absl::StrCat("rank ", rep.rank, " is out of range for world_size ", world_size);
    return res;
  }
  // Each duration must be finite, >= 0 and at most its bound; the message
  // names the rule that failed and shows the value exactly (3600.0001 is
  // not 3600).
  auto check = [&](const char* field, double v, double bound,
                   const char* bound_name) -> std::optional<std::string> {
    if (std::isfinite(v) && v >= 0 && v <= bound) return std::nullopt;
    return absl::StrCat("rank ", rep.rank, " iteration ", rep.iteration, " reported ", field,
                        "=", ExactNumber(v),
                        std::isfinite(v) && v >= 0
                            ? absl::StrCat(" (above ", bound_name, "=", ExactNumber(bound), ")")
                            : std::string(" (must be a finite number >= 0)"));
  };
  const double step_bound = policy.max_compute_seconds * 10;
  if (auto m = check("compute_seconds", rep.compute_seconds, policy.max_compute_seconds,
                     "max_compute_seconds"))
    return bad(*m);
  if (rep.step_seconds)
    if (auto m = check("step_seconds", *rep.step_seconds, step_bound, "10 x max_compute_seconds"))
      return bad(*m);
  if (rep.collective_wait_seconds)
    if (auto m = check("collective_wait_seconds", *rep.collective_wait_seconds, step_bound,
                       "10 x max_compute_seconds"))
      return bad(*m);
  // The phases bounded as step times are (issue 31).
  if (rep.input_wait_seconds)
    if (auto m = check("input_wait_seconds", *rep.input_wait_seconds, step_bound,
                       "10 x max_compute_seconds"))
      return bad(*m);
  if (rep.optimizer_seconds)
    if (auto m = check("optimizer_seconds", *rep.optimizer_seconds, step_bound,
                       "10 x max_compute_seconds"))
      return bad(*m);
  // Work in the job's own unit: no bound, but a step of no work has no time
  // per unit of work (the wire's rule, straggler/v1/wire_rules.h IsValidWork).
  if (rep.work && !(*rep.work > 0 && std::isfinite(*rep.work)))
    return bad(absl::StrCat("rank ", rep.rank, " iteration ", rep.iteration, " reported work=",
                            ExactNumber(*rep.work), " (must be a finite number > 0)"));
  const RankState& r = ranks[rep.rank];
  // The O(ranks) reference only for a report that is far past the rows
  // (rare); the common case is one comparison.
  const uint64_t rows_at = Highest();
  const bool maybe_far =
      rep.iteration > rows_at && rep.iteration - rows_at > JobEngine::kMaxIterationJump;
  if (const auto ref = maybe_far ? ReferenceIteration() : std::nullopt;
      ref && rep.iteration > *ref && rep.iteration - *ref > JobEngine::kMaxIterationJump) {
    res.reason = RejectReason::kTooFarAhead;
    res.message = absl::StrCat("rank ", rep.rank, " iteration ", rep.iteration, " is more than ",
                               JobEngine::kMaxIterationJump, " past the job's progress (iteration ",
                               *ref, ")");
    return res;
  }
  // A rank whose last report was far ahead of the job (judged alone, see
  // TooFarAhead) and which now reports below it again: that jump was the
  // anomaly (a forged or corrupt report), not where the rank is. The same
  // far-ahead report again (a replay after a reconnect) is a duplicate.
  const bool back_from_ahead =
      r.ahead && rep.iteration > r.before_ahead && rep.iteration != r.last_iteration;
  if (r.has_progress && rep.iteration <= r.last_iteration && !back_from_ahead) {
    const bool dup = rep.iteration == r.last_iteration;
    res.reason = dup ? RejectReason::kDuplicate : RejectReason::kStale;
    res.message =
        dup ? absl::StrCat("rank ", rep.rank, " iteration ", rep.iteration, " was already reported")
            : absl::StrCat("rank ", rep.rank, " iteration ", rep.iteration,
                           " is older than iteration ", r.last_iteration, " already reported");
    return res;
  }
  if (auto m = ImplausibleEpoch(rep)) {
    res.reason = RejectReason::kTooFarAhead;
    res.message = std::move(*m);
    return res;
  }
  res.accepted = true;
  return res;
}

// A row takes its reports' highest epoch and a new epoch starts only above
// the job's: one report with epoch 2^64-1 would pin the job's epoch there
// (no epoch, probation round or re-profile after it). An epoch has at least
// one iteration, so since the job's epoch was first seen (at
// epoch_start_iteration) a report may be at most one epoch ahead per
// iteration, plus one; before the job has an epoch, below 2^62.
std::optional<std::string> EngineImpl::ImplausibleEpoch(const Report& rep) const {
  if (rep.epoch >= kAbsurd) {
    return absl::StrCat("rank ", rep.rank, " iteration ", rep.iteration, " epoch ", rep.epoch,
                        " is no epoch a job reaches (2^62 or more)");
  }
  if (!have_epoch || rep.epoch <= epoch) return std::nullopt;
  const uint64_t iterations =
      rep.iteration > epoch_start_iteration ? rep.iteration - epoch_start_iteration : 0;
  if (rep.epoch - epoch <= iterations + 1) return std::nullopt;
  return absl::StrCat("rank ", rep.rank, " iteration ", rep.iteration, " epoch ", rep.epoch,
                      " is more than ", iterations + 1, " epochs past the job's epoch ", epoch,
                      " (first seen at iteration ", epoch_start_iteration,
                      "): an epoch has at least one iteration");
}

IngestResult EngineImpl::Ingest(const Report& rep, Time now) {
  IngestResult res = Validate(rep);
  if (!res.accepted) return res;

  RankState& r = ranks[rep.rank];
  Attach(r);
  if (r.state == WorkerState::kPending) {
    r.state = WorkerState::kHealthy;
  } else if (r.straggler_when_silent && r.state == WorkerState::kUnresponsive) {
    r.straggler_when_silent = false;
    r.counter = Limit();
    ChangeState(rep.rank, WorkerState::kStraggler, rep.iteration, rep.compute_seconds, now,
                "reporting again; still a straggler until its reports show recovery");
  } else if (r.state == WorkerState::kUnresponsive || r.state == WorkerState::kFinished) {
    r.counter = 0;
    ChangeState(rep.rank, WorkerState::kHealthy, rep.iteration, rep.compute_seconds, now,
                "reporting again");
  }
  if (!r.ahead) {
    SetCounted(rep.rank, true);
    r.before_ahead = r.last_iteration;
    r.progress_before_ahead = r.has_progress;
  }
  r.has_progress = true;
  r.last_iteration = rep.iteration;
  r.epoch = rep.epoch;
  r.last_compute = rep.compute_seconds;
  const double own = rep.OwnSeconds();
  r.ewma = r.samples == 0 ? own : policy.ewma_alpha * own + (1 - policy.ewma_alpha) * r.ewma;
  if (r.samples < RankState::kMaxSamples) r.samples++;
  r.reports_total++;
  r.last_report_time = now;
  NoteSeen(now);
  reports_total++;
  last_report_time = now;

  if (Excludes(log.InForce(rep.iteration).m, rep.rank)) {
    // Shadow: an excluded rank runs on its own clock; judge it alone.
    if (policy.recovery == RecoveryMode::kShadow) JudgeSingle(rep.rank, rep, now);
  } else {
    AddToRow(rep, now);
  }
  NoteReached(r);  // after AddToRow: a rank found far ahead counts where it was
  if (dirty) Evaluate(now);
  ContinueRow(sliced.pace);
  if (sliced.tick && !sliced.active) {
    const Time at = *sliced.tick;
    sliced.tick.reset();
    Tick(at);
  }
  return res;
}

// A rank more than kMaxRowSpan iterations ahead of the job is judged alone
// and moves nothing (one bad client must not drag the rows, the highest
// iteration and so every effective_iteration with it) - unless most ranks
// have made the same jump, which means the job itself moved (a restart from
// a later checkpoint): then the rows start over from there.
bool EngineImpl::TooFarAhead(uint32_t rank, uint64_t it, Time now) {
  RankState& r = ranks[rank];
  const bool far = have_highest && it > highest_active + kMaxRowSpan;
  if (far != r.ahead) {
    r.ahead = far;
    ahead_ranks += far ? 1 : -1;
    SetCounted(rank, !far);  // rows do not wait for a rank that is elsewhere
  }
  if (!far) return false;
  if (2 * ahead_ranks <= counted_ranks + ahead_ranks) return true;
  while (!rows.empty()) CompleteFront(now);
  for (uint32_t i = 0; i < world_size; ++i)
    if (ranks[i].ahead) {
      ranks[i].ahead = false;
      SetCounted(i, true);
      NoteReached(ranks[i]);  // the job moved there
    }
  ahead_ranks = 0;
  have_highest = false;
  rows.ForgetCompleted();
  return false;
}

void EngineImpl::AddToRow(const Report& rep, Time now) {
  const uint64_t it = rep.iteration;
  if (TooFarAhead(rep.rank, it, now)) {
    JudgeSingle(rep.rank, rep, now);
    return;
  }
  if (rows.Judged(it)) {  // judged already without this rank: alone
    ++reports_late_total;
    JudgeSingle(rep.rank, rep, now);
    return;
  }
  rows.At(it, [&] { return Expected(it); }).Add(rep);
  if (!have_highest || it > highest_active) {
    highest_active = it;
    have_highest = true;
  }
  DrainRows(now);
}

// How many reports complete the row of `iteration`: the counted ranks not
// excluded by the version in force there.
uint32_t EngineImpl::Expected(uint64_t iteration) const {
  const Version& v = log.InForce(iteration);
  return counted_ranks - std::min(counted_ranks, v.excluded_counted);
}

// Completes rows in order while the oldest is full or overtaken by
// kRowGraceIterations.
void EngineImpl::DrainRows(Time now) {
  while (!rows.empty()) {
    const Row& f = rows.front();
    const bool full = !f.values.empty() && f.values.size() >= Expected(f.iteration);
    const bool overtaken =
        have_highest && highest_active >= f.iteration + JobEngine::kRowGraceIterations;
    if (!full && !overtaken) break;
    CompleteFront(now);
  }
}

void EngineImpl::CompleteFront(Time now) {
  FinishRow();  // rows are judged in order
  Row row = rows.PopFront();
  if (!row.values.empty() && !ProcessRow(row, now)) return;  // sliced: recycled at its end
  rows.Recycle(std::move(row));
}

}  // namespace straggler::engine::internal
