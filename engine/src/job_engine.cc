#include "straggler/engine/job_engine.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace straggler::engine {

std::string_view WorkerStateName(WorkerState s) {
  switch (s) {
    case WorkerState::kPending: return "pending";
    case WorkerState::kHealthy: return "healthy";
    case WorkerState::kStraggler: return "straggler";
    case WorkerState::kUnresponsive: return "unresponsive";
    case WorkerState::kFinished: return "finished";
  }
  return "unknown";
}

std::string_view ExclusionReasonName(ExclusionReason r) {
  switch (r) {
    case ExclusionReason::kNone: return "none";
    case ExclusionReason::kStraggler: return "straggler";
    case ExclusionReason::kUnresponsive: return "unresponsive";
    case ExclusionReason::kForced: return "forced";
    case ExclusionReason::kProbationEnd: return "probation_end";
  }
  return "unknown";
}

std::string_view EventKindName(EventKind k) {
  switch (k) {
    case EventKind::kStateChange: return "state_change";
    case EventKind::kMembership: return "membership";
    case EventKind::kGuardBlocked: return "guard_blocked";
    case EventKind::kPolicyChanged: return "policy_changed";
    case EventKind::kOverride: return "override";
    case EventKind::kReset: return "reset";
    case EventKind::kReprofile: return "reprofile";
    case EventKind::kMembershipWithheld: return "membership_withheld";
  }
  return "unknown";
}

bool EventNamesRank(EventKind k) {
  return k == EventKind::kStateChange || k == EventKind::kGuardBlocked ||
         k == EventKind::kOverride || k == EventKind::kMembershipWithheld;
}

std::string_view RejectReasonName(RejectReason r) {
  switch (r) {
    case RejectReason::kNone: return "none";
    case RejectReason::kInvalidValue: return "invalid_value";
    case RejectReason::kRankOutOfRange: return "rank_out_of_range";
    case RejectReason::kDuplicate: return "duplicate";
    case RejectReason::kStale: return "stale";
    case RejectReason::kTooFarAhead: return "too_far_ahead";
  }
  return "unknown";
}

bool Membership::IsExcluded(uint32_t rank) const {
  auto it = std::lower_bound(excluded.begin(), excluded.end(), rank,
                             [](const ExcludedRank& e, uint32_t r) { return e.rank < r; });
  return it != excluded.end() && it->rank == rank;
}

namespace {

// Largest gap between a row and the next iteration reported before the
// engine gives up waiting for the rows in between (a rank that jumps ahead
// by more is a client bug, not a reason to hold memory).
constexpr uint64_t kMaxRowSpan = 1024;

// Below this many ranks in a row, "most ranks are slower than the fastest"
// cannot be told from "a straggler is present", so no majority fallback.
constexpr size_t kMinRanksForMajority = 4;

enum class Verdict { kNone, kSlow, kFast };

double Seconds(Time t) { return std::chrono::duration<double>(t).count(); }

}  // namespace

struct JobEngine::Impl {
  struct RankState {
    WorkerState state = WorkerState::kPending;
    bool has_progress = false;
    uint64_t last_iteration = 0;
    uint64_t epoch = 0;
    double last_compute = 0.0;
    double ewma = 0.0;
    uint32_t samples = 0;
    uint32_t counter = 0;
    bool flipped = false;
    uint64_t last_flip_iteration = 0;
    uint64_t reports_total = 0;
    Time last_report_time{0};
    RankOverride override = RankOverride::kNone;
    bool guard_blocked = false;
    bool on_probation = false;
    bool probation_failed = false;  // still slow when its probation ended
    bool counted = false;           // rows wait for this rank (see counted_ranks)
    // A stream speaks for this rank, so it hears new versions (Announce and
    // reports set it, Detach clears it). See the membership gate in Evaluate.
    bool attached = false;
    uint64_t episode_start = 0;     // iteration at which the counter left 0
    bool ahead = false;             // last report was far ahead of the job
    uint64_t before_ahead = 0;      // its newest iteration before it went ahead
    // It was a straggler when it fell silent: reporting again does not clear
    // that (only its reports, judged as always, show recovery).
    bool straggler_when_silent = false;
    Time announced_at{0};
  };

  struct Row {
    uint64_t iteration = 0;
    uint64_t epoch = 0;
    double min = std::numeric_limits<double>::infinity();
    // The slowest reported step of the row (step_seconds, else compute):
    // what the synchronous step of this iteration cost the job.
    double step_max = 0.0;
    std::vector<std::pair<uint32_t, double>> values;
  };

  // Membership plus bookkeeping the engine needs to know how many ranks a
  // row of an iteration in force under this version waits for.
  struct Version {
    Membership m;
    uint32_t excluded_counted = 0;  // excluded ranks that are not unresponsive
  };

  Impl(uint32_t world, PolicyConfig p, Time now)
      : world_size(world), policy(std::move(p)), ranks(world),
        created_at(now) {
    Version v0;
    v0.m.world_size = world;
    v0.m.lead_iterations = policy.lead_iterations;
    v0.m.created_at = now;
    versions.push_back(std::move(v0));
    history.push_back(versions.back().m);
  }

  // ---- configuration -------------------------------------------------------
  uint32_t world_size;
  PolicyConfig policy;
  uint64_t iterations_per_epoch = 0;
  bool epoch_length_announced = false;

  // ---- per rank ------------------------------------------------------------
  std::vector<RankState> ranks;
  // Ranks a row waits for, before exclusions: announced or reporting, and not
  // unresponsive.
  uint32_t counted_ranks = 0;
  Time created_at;

  // ---- rows ----------------------------------------------------------------
  std::deque<Row> rows;
  std::vector<Row> spare_rows;
  bool have_completed = false;
  uint32_t ahead_ranks = 0;  // ranks whose last report was far ahead
  uint64_t last_completed = 0;  // reports at or below it are judged alone
  bool have_highest = false;
  uint64_t highest_active = 0;  // highest iteration reported through a row
  // The highest iteration a stream's hello said its ranks reported
  // (NoteReportedIteration); versions take effect after it too.
  std::optional<uint64_t> hello_reported;

  // ---- epoch and reference -------------------------------------------------
  bool have_epoch = false;
  uint64_t epoch = 0;
  uint64_t epoch_start_iteration = 0;
  bool profiling = true;
  uint32_t profile_collected = 0;
  double profile_sum = 0.0;         // of the row minima
  double profile_majority_sum = 0.0;  // of the row MajorityTimes
  bool baseline_from_majority = false;
  uint64_t rows_since_profile = 0;
  int speedup_rows = 0;
  bool have_threshold = false;
  double threshold = 0.0;
  double baseline = 0.0;
  double step_seconds = 0.0;  // step_max of the newest judged row
  std::vector<double> scratch;

  // ---- probation -----------------------------------------------------------
  bool probation_active = false;
  uint64_t probation_until = 0;

  // ---- membership ----------------------------------------------------------
  std::deque<Version> versions;   // bounded by kMembershipHistory
  std::deque<Membership> history;  // mirror of versions[].m for the public API
  bool dirty = false;              // something exclusion depends on changed
  bool batch_open = false;         // BeginBatch..EndBatch: Evaluate waits for EndBatch
  bool batch_evaluate = false;     // an Evaluate was put off to EndBatch
  // A changed excluded set waits for ranks no stream speaks for (Evaluate).
  bool withheld = false;
  uint32_t blocked = 0;            // candidates currently withheld by a guard

  // ---- totals and events ---------------------------------------------------
  uint64_t detections_total = 0;
  uint64_t recoveries_total = 0;
  uint64_t reports_total = 0;
  uint64_t guard_blocks_total = 0;
  Time last_report_time{0};
  std::vector<Event> events;

  // ==========================================================================

  uint32_t Limit() const { return policy.EffectiveLimit(iterations_per_epoch); }
  uint32_t Mark() const { return std::min(policy.rejoin_mark, Limit() - 1); }
  const Membership& Newest() const { return versions.back().m; }

  // Membership version in force at `iteration`: newest with E <= iteration.
  const Version& InForce(uint64_t iteration) const {
    for (auto it = versions.rbegin(); it != versions.rend(); ++it)
      if (it->m.effective_iteration <= iteration) return *it;
    return versions.front();
  }

  // The job's progress as a forger of a minority of ranks cannot move it:
  // the upper median of the newest iterations of the ranks that reported
  // (the highest, then the rest only when it is far past the row progress,
  // so the common case costs one comparison). nullopt before any report.
  std::optional<uint64_t> ReferenceIteration() const {
    uint64_t top = 0;
    bool any = false;
    for (const auto& r : ranks) {
      if (!r.has_progress) continue;
      any = true;
      top = std::max(top, r.ahead ? r.before_ahead : r.last_iteration);
    }
    if (!any) return std::nullopt;
    if (!have_highest || top <= highest_active + kMaxRowSpan) return top;
    std::vector<uint64_t> its;
    for (const auto& r : ranks)
      if (r.has_progress) its.push_back(r.ahead ? r.before_ahead : r.last_iteration);
    std::nth_element(its.begin(), its.begin() + its.size() / 2, its.end());
    return its[its.size() / 2];
  }

  // The latest iteration a version may plausibly take effect at: the job's
  // progress (or `floor`) + lead + the collective's agreement interval.
  uint64_t PlausibleEffective(uint64_t floor) const {
    const uint64_t base = std::max(ReferenceIteration().value_or(0), floor);
    return base + Lead() + JobEngine::kMaxAgreementInterval;
  }

  // Drops the versions that take effect beyond PlausibleEffective (a floor
  // a hello or a damaged database put there) and publishes the newest
  // excluded set again above every version, in force from the ranks'
  // progress + lead. Returns whether it did.
  bool Rebase(Time now, const std::string& why) {
    // A hello's reported_iteration far past the reports: nobody is there.
    if (const auto ref = ReferenceIteration();
        ref && hello_reported && *hello_reported > *ref + JobEngine::kMaxIterationJump) {
      hello_reported.reset();
    }
    const uint64_t limit = PlausibleEffective(0);
    if (Newest().effective_iteration <= limit) return false;
    const uint64_t top = Newest().version;
    std::vector<ExcludedRank> excluded = Newest().excluded;
    while (versions.size() > 1 && versions.back().m.effective_iteration > limit) {
      versions.pop_back();
      history.pop_back();
    }
    if (Newest().effective_iteration > limit) {
      // Every kept version is implausible: start the history over.
      versions.front().m.effective_iteration = 0;
      history.front().effective_iteration = 0;
    }
    Publish(std::move(excluded), now, why, 0, top + 1);
    return true;
  }

  bool Live(const RankState& r) const {
    return r.state != WorkerState::kPending && r.state != WorkerState::kUnresponsive &&
           r.state != WorkerState::kFinished;
  }

  // Rows start (true) or stop (false) waiting for `rank`; keeps the
  // per-version counts of excluded counted ranks right.
  void SetCounted(uint32_t rank, bool counted) {
    RankState& r = ranks[rank];
    if (r.counted == counted) return;
    r.counted = counted;
    const int delta = counted ? 1 : -1;
    counted_ranks += delta;
    for (auto& v : versions)
      if (v.m.IsExcluded(rank)) v.excluded_counted += delta;
  }

  void Emit(Event e) { events.push_back(std::move(e)); }

  // The rank can hear new versions again; a change withheld for it may go.
  void Attach(RankState& r) {
    if (r.attached) return;
    r.attached = true;
    if (withheld) dirty = true;
  }

  Evidence MakeEvidence(const RankState& r, double compute) const {
    Evidence ev;
    ev.compute_seconds = compute;
    ev.threshold_seconds = have_threshold ? threshold : 0.0;
    ev.counter = r.counter;
    ev.limit = Limit();
    ev.baseline_seconds = baseline;
    return ev;
  }

  void ChangeState(uint32_t rank, WorkerState to, uint64_t iteration, double compute, Time now,
                   std::string message) {
    RankState& r = ranks[rank];
    Event e;
    e.time = now;
    e.kind = EventKind::kStateChange;
    e.rank = rank;
    e.from = r.state;
    e.to = to;
    e.iteration = iteration;
    r.state = to;
    e.evidence = MakeEvidence(r, compute);
    e.membership_version = Newest().version;
    e.message = std::move(message);
    Emit(std::move(e));
    dirty = true;
  }

  // ---- ingest --------------------------------------------------------------

  IngestResult Validate(const Report& rep) const {
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
      if (auto m = check("step_seconds", *rep.step_seconds, step_bound,
                         "10 x max_compute_seconds"))
        return bad(*m);
    if (rep.collective_wait_seconds)
      if (auto m = check("collective_wait_seconds", *rep.collective_wait_seconds, step_bound,
                         "10 x max_compute_seconds"))
        return bad(*m);
    const RankState& r = ranks[rep.rank];
    // The O(ranks) reference only for a report that is far past the rows
    // (rare); the common case is one comparison.
    const uint64_t rows_at = have_highest ? highest_active : 0;
    const bool maybe_far = rep.iteration > rows_at &&
                           rep.iteration - rows_at > JobEngine::kMaxIterationJump;
    if (const auto ref = maybe_far ? ReferenceIteration() : std::nullopt;
        ref && rep.iteration > *ref && rep.iteration - *ref > JobEngine::kMaxIterationJump) {
      res.reason = RejectReason::kTooFarAhead;
      res.message = absl::StrCat("rank ", rep.rank, " iteration ", rep.iteration, " is more than ",
                                 JobEngine::kMaxIterationJump,
                                 " past the job's progress (iteration ", *ref, ")");
      return res;
    }
    // A rank whose last report was far ahead of the job (judged alone, see
    // TooFarAhead) and which now reports below it again: that jump was the
    // anomaly (a forged or corrupt report), not where the rank is.
    const bool back_from_ahead = r.ahead && rep.iteration > r.before_ahead;
    if (r.has_progress && rep.iteration <= r.last_iteration && !back_from_ahead) {
      res.reason = rep.iteration == r.last_iteration ? RejectReason::kDuplicate
                                                     : RejectReason::kStale;
      res.message = absl::StrCat("rank ", rep.rank, " iteration ", rep.iteration,
                                 rep.iteration == r.last_iteration ? " was already reported"
                                                                   : " is older than iteration ",
                                 rep.iteration == r.last_iteration
                                     ? std::string()
                                     : absl::StrCat(r.last_iteration, " already reported"));
      return res;
    }
    res.accepted = true;
    return res;
  }

  IngestResult Ingest(const Report& rep, Time now) {
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
    }
    r.has_progress = true;
    r.last_iteration = rep.iteration;
    r.epoch = rep.epoch;
    r.last_compute = rep.compute_seconds;
    r.ewma = r.samples == 0 ? rep.compute_seconds
                            : policy.ewma_alpha * rep.compute_seconds +
                                  (1 - policy.ewma_alpha) * r.ewma;
    r.samples++;
    r.reports_total++;
    r.last_report_time = now;
    reports_total++;
    last_report_time = now;

    const bool excluded_now = InForce(rep.iteration).m.IsExcluded(rep.rank);
    if (excluded_now) {
      // Shadow: an excluded rank runs on its own clock; judge it alone.
      if (policy.recovery == RecoveryMode::kShadow) JudgeSingle(rep.rank, rep, now);
    } else {
      AddToRow(rep, now);
    }
    if (dirty) Evaluate(now);
    return res;
  }

  // A rank more than kMaxRowSpan iterations ahead of the job is judged alone
  // and moves nothing (one bad client must not drag the rows, the highest
  // iteration and so every effective_iteration with it) - unless most ranks
  // have made the same jump, which means the job itself moved (a restart from
  // a later checkpoint): then the rows start over from there.
  bool TooFarAhead(uint32_t rank, uint64_t it, Time now) {
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
      }
    ahead_ranks = 0;
    have_highest = false;
    have_completed = false;
    return false;
  }

  void AddToRow(const Report& rep, Time now) {
    const uint64_t it = rep.iteration;
    if (TooFarAhead(rep.rank, it, now)) {
      JudgeSingle(rep.rank, rep, now);
      return;
    }
    if ((have_completed && it <= last_completed) ||
        (!rows.empty() && it < rows.front().iteration)) {
      // The row was judged already without this rank: judge it alone.
      JudgeSingle(rep.rank, rep, now);
      return;
    }
    if (rows.empty()) rows.push_back(NewRow(it));
    while (rows.back().iteration < it) rows.push_back(NewRow(rows.back().iteration + 1));
    Row& row = rows[it - rows.front().iteration];
    row.values.emplace_back(rep.rank, rep.compute_seconds);
    row.min = std::min(row.min, rep.compute_seconds);
    row.step_max = std::max(row.step_max, rep.step_seconds.value_or(rep.compute_seconds));
    row.epoch = std::max(row.epoch, rep.epoch);
    if (!have_highest || it > highest_active) {
      highest_active = it;
      have_highest = true;
    }
    DrainRows(now);
  }

  Row NewRow(uint64_t iteration) {
    Row row;
    if (!spare_rows.empty()) {
      row = std::move(spare_rows.back());
      spare_rows.pop_back();
      row.values.clear();
    }
    row.iteration = iteration;
    row.epoch = 0;
    row.min = std::numeric_limits<double>::infinity();
    row.step_max = 0.0;
    return row;
  }

  uint32_t Expected(uint64_t iteration) const {
    const Version& v = InForce(iteration);
    return counted_ranks - std::min(counted_ranks, v.excluded_counted);
  }

  void DrainRows(Time now) {
    while (!rows.empty()) {
      const Row& f = rows.front();
      const bool full = !f.values.empty() && f.values.size() >= Expected(f.iteration);
      const bool overtaken = have_highest && highest_active >= f.iteration + kRowGraceIterations;
      if (!full && !overtaken) break;
      CompleteFront(now);
    }
  }

  void CompleteFront(Time now) {
    Row row = std::move(rows.front());
    rows.pop_front();
    have_completed = true;
    last_completed = row.iteration;
    if (!row.values.empty()) ProcessRow(row, now);
    spare_rows.push_back(std::move(row));
  }

  // ---- judging -------------------------------------------------------------

  void StartProfile(uint64_t iteration, Time now, std::string why) {
    profiling = true;
    profile_collected = 0;
    profile_sum = 0.0;
    profile_majority_sum = 0.0;
    rows_since_profile = 0;
    speedup_rows = 0;
    Event e;
    e.time = now;
    e.kind = EventKind::kReprofile;
    e.iteration = iteration;
    e.membership_version = Newest().version;
    e.evidence.threshold_seconds = have_threshold ? threshold : 0.0;
    e.evidence.baseline_seconds = baseline;
    e.message = std::move(why);
    Emit(std::move(e));
  }

  void OnNewEpoch(const Row& row, Time now) {
    if (have_epoch && !epoch_length_announced && row.iteration > epoch_start_iteration &&
        row.epoch == epoch + 1) {
      iterations_per_epoch = row.iteration - epoch_start_iteration;
      ClampCounters();
    }
    const bool first = !have_epoch;
    have_epoch = true;
    epoch = row.epoch;
    epoch_start_iteration = row.iteration;
    if (policy.kind == PolicyKind::kDynamic && !first)
      StartProfile(row.iteration, now, absl::StrCat("epoch ", row.epoch, " started"));
    if (!first && policy.recovery == RecoveryMode::kProbation) BeginProbation(now);
  }

  void ProcessRow(Row& row, Time now) {
    if (!have_epoch || row.epoch > epoch) OnNewEpoch(row, now);
    rows_since_profile++;
    step_seconds = row.step_max;
    switch (policy.kind) {
      case PolicyKind::kDynamic: ProcessDynamicRow(row, now); break;
      case PolicyKind::kStatic:
        threshold = policy.static_threshold_seconds;
        have_threshold = true;
        baseline = LowerMedian(row, /*use_ewma=*/false);
        JudgeRow(row, now, /*global_shift_guard=*/false);
        break;
      case PolicyKind::kEwma: ProcessEwmaRow(row, now); break;
    }
    if (probation_active && row.iteration >= probation_until) EndProbation(now);
    if (dirty || blocked > 0) Evaluate(now);
  }

  void ProcessDynamicRow(Row& row, Time now) {
    if (policy.window_iterations > 0 && !profiling && rows_since_profile > policy.window_iterations)
      StartProfile(row.iteration, now,
                   absl::StrCat("window of ", policy.window_iterations, " iterations elapsed"));
    if (profiling) {
      profile_sum += row.min;
      profile_majority_sum += MajorityTime(row);
      profile_collected++;
      bool completed = false;
      if (profile_collected >= policy.profile_iterations) {
        profiling = false;
        completed = true;
        SetBaseline(profile_sum / profile_collected, /*from_majority=*/false);
      }
      if (!have_threshold) return;
      if (completed && row.values.size() >= kMinRanksForMajority) {
        size_t slow = 0;
        for (auto& [rank, t] : row.values) slow += t > threshold;
        // More ranks sit above k x the fastest right after profiling than
        // could ever be left out: the fastest ranks are a minority (a newer
        // GPU generation, ranks with less work), not the job's speed. Judge
        // against the speed most ranks reach instead.
        if (static_cast<double>(slow) >
            policy.max_excluded_fraction * static_cast<double>(row.values.size())) {
          FallBackToMajority(row, slow, now);
          return;
        }
      }
      JudgeRow(row, now, /*global_shift_guard=*/true);
      return;
    }
    // A faster system makes the profiled threshold too lenient.
    const double reference = baseline_from_majority ? MajorityTime(row) : row.min;
    if (reference < baseline / kSpeedupRatio) {
      if (++speedup_rows >= kSpeedupRows) {
        StartProfile(row.iteration + 1, now,
                     absl::StrFormat("%s rank at %.6gs, below baseline %.6gs / %.2g",
                                     baseline_from_majority ? "majority" : "fastest", reference,
                                     baseline, kSpeedupRatio));
        return;
      }
    } else {
      speedup_rows = 0;
    }
    if (const size_t slow = JudgeRow(row, now, /*global_shift_guard=*/true); slow > 0)
      StartProfile(row.iteration + 1, now,
                   absl::StrCat(slow, " of ", row.values.size(),
                                " ranks above the threshold at iteration ", row.iteration,
                                ": the whole job slowed down"));
  }

  void FallBackToMajority(Row& row, size_t slow, Time now) {
    SetBaseline(profile_majority_sum / profile_collected, /*from_majority=*/true);
    Event e;
    e.time = now;
    e.kind = EventKind::kReprofile;
    e.iteration = row.iteration;
    e.membership_version = Newest().version;
    e.evidence.threshold_seconds = threshold;
    e.evidence.baseline_seconds = baseline;
    e.message = absl::StrCat(slow, " of ", row.values.size(),
                             " ranks above k x the fastest after profiling: baseline taken from "
                             "the speed most ranks reach instead");
    Emit(std::move(e));
    JudgeRow(row, now, /*global_shift_guard=*/false);
  }

  // The time that all but max_excluded_fraction of the row's ranks reach (at
  // least the median): the speed of the ranks that could never all be left
  // out, hence the job's real speed.
  double MajorityTime(const Row& row) {
    scratch.clear();
    for (auto& [rank, t] : row.values) scratch.push_back(t);
    if (scratch.empty()) return 0.0;
    const double q = std::max(0.5, 1.0 - policy.max_excluded_fraction);
    const size_t k = std::min(scratch.size() - 1,
                              static_cast<size_t>(std::ceil(q * scratch.size())) - 1);
    std::nth_element(scratch.begin(), scratch.begin() + k, scratch.end());
    return scratch[k];
  }

  void SetBaseline(double b, bool from_majority) {
    baseline = b;
    baseline_from_majority = from_majority;
    threshold = policy.threshold_factor * baseline;
    have_threshold = true;
    speedup_rows = 0;
    rows_since_profile = 0;
  }

  void ProcessEwmaRow(Row& row, Time now) {
    scratch.clear();
    for (auto& [rank, t] : row.values)
      if (ranks[rank].samples >= policy.ewma_min_samples) scratch.push_back(ranks[rank].ewma);
    if (scratch.size() < 2) return;
    auto mid = scratch.begin() + (scratch.size() - 1) / 2;
    std::nth_element(scratch.begin(), mid, scratch.end());
    baseline = *mid;
    threshold = policy.ewma_ratio * baseline;
    have_threshold = true;
    for (auto& [rank, t] : row.values) {
      RankState& r = ranks[rank];
      if (r.samples < policy.ewma_min_samples) continue;
      ApplyVerdict(rank, VerdictFor(r.ewma), row.iteration, t, now);
    }
  }

  double LowerMedian(const Row& row, bool use_ewma) {
    scratch.clear();
    for (auto& [rank, t] : row.values) scratch.push_back(use_ewma ? ranks[rank].ewma : t);
    if (scratch.empty()) return 0.0;
    auto mid = scratch.begin() + (scratch.size() - 1) / 2;
    std::nth_element(scratch.begin(), mid, scratch.end());
    return *mid;
  }

  Verdict VerdictFor(double value) const {
    if (!have_threshold) return Verdict::kNone;
    if (value > threshold) return Verdict::kSlow;
    if (value < threshold) return Verdict::kFast;
    return Verdict::kNone;
  }

  // Applies the row's verdicts. With the guard, a row where more than
  // global_shift_fraction of the ranks are slow moves no counter (a job-wide
  // slowdown is not a straggler) and the count of slow ranks is returned for
  // the caller to re-profile; 0 otherwise.
  size_t JudgeRow(Row& row, Time now, bool global_shift_guard) {
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
  void JudgeSingle(uint32_t rank, const Report& rep, Time now) {
    const RankState& r = ranks[rank];
    Verdict v = Verdict::kNone;
    if (policy.kind == PolicyKind::kEwma) {
      if (r.samples >= policy.ewma_min_samples) v = VerdictFor(r.ewma);
    } else if (policy.kind == PolicyKind::kStatic) {
      v = rep.compute_seconds > policy.static_threshold_seconds ? Verdict::kSlow
          : rep.compute_seconds < policy.static_threshold_seconds ? Verdict::kFast
                                                                   : Verdict::kNone;
    } else {
      v = VerdictFor(rep.compute_seconds);
    }
    ApplyVerdict(rank, v, rep.iteration, rep.compute_seconds, now);
  }

  bool CooledDown(const RankState& r, uint64_t iteration) const {
    return !r.flipped || iteration >= r.last_flip_iteration + policy.cooldown_iterations;
  }

  void ApplyVerdict(uint32_t rank, Verdict v, uint64_t iteration, double compute, Time now) {
    RankState& r = ranks[rank];
    const uint32_t lim = Limit();
    if (v == Verdict::kSlow) {
      if (r.counter == 0) r.episode_start = iteration;
      if (r.counter < lim) r.counter++;
    } else if (v == Verdict::kFast) {
      if (r.counter > 0) r.counter--;
    }
    if (r.state == WorkerState::kHealthy && r.counter >= lim && CooledDown(r, iteration)) {
      r.flipped = true;
      r.last_flip_iteration = iteration;
      detections_total++;
      ChangeState(rank, WorkerState::kStraggler, iteration, compute, now,
                  absl::StrFormat("compute %.6gs above threshold %.6gs; counter %u/%u", compute,
                                  threshold, r.counter, lim));
      events.back().evidence.latency_iterations =
          iteration >= r.episode_start ? iteration - r.episode_start + 1 : 0;
    } else if (r.state == WorkerState::kStraggler && r.counter <= Mark() &&
               CooledDown(r, iteration)) {
      r.flipped = true;
      r.last_flip_iteration = iteration;
      recoveries_total++;
      r.probation_failed = false;
      ChangeState(rank, WorkerState::kHealthy, iteration, compute, now,
                  absl::StrFormat("compute %.6gs below threshold %.6gs; counter %u, rejoin mark %u",
                                  compute, threshold, r.counter, Mark()));
    }
  }

  void ClampCounters() {
    const uint32_t lim = Limit();
    for (auto& r : ranks) r.counter = std::min(r.counter, lim);
  }

  // ---- probation -----------------------------------------------------------

  void BeginProbation(Time now) {
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

  void EndProbation(Time now) {
    probation_active = false;
    for (auto& r : ranks) {
      if (r.on_probation && r.state == WorkerState::kStraggler) r.probation_failed = true;
      r.on_probation = false;
    }
    dirty = true;
    Evaluate(now);
  }

  // ---- exclusion -----------------------------------------------------------

  struct Want {
    ExclusionReason reason = ExclusionReason::kNone;
    std::string detail;
    uint64_t since = 0;
  };

  std::string StragglerDetail(uint32_t rank) const {
    const RankState& r = ranks[rank];
    if (baseline > 0)
      return absl::StrFormat("ewma %.6gs = %.2fx baseline %.6gs; counter %u/%u", r.ewma,
                             r.ewma / baseline, baseline, r.counter, Limit());
    return absl::StrFormat("ewma %.6gs; counter %u/%u", r.ewma, r.counter, Limit());
  }

  // Decides the excluded set now, or at EndBatch while a batch is open: a
  // batch (an agent's replayed backlog after a daemon restart) may walk a
  // rank through recovery and relapse in one go, and the job must see one
  // version for where it ended, not one per state it passed through.
  void Evaluate(Time now) {
    if (batch_open) {
      batch_evaluate = true;
      return;
    }
    EvaluateNow(now);
  }

  void EvaluateNow(Time now) {
    dirty = false;
    // A version put implausibly far ahead (a hostile hello before the
    // bounds, a damaged database) must not hold every later change there.
    if (have_highest) Rebase(now, "the newest version took effect implausibly far ahead");
    const Membership& cur = Newest();
    std::vector<Want> want(world_size);
    std::vector<uint32_t> unresponsive_candidates, straggler_candidates;
    uint32_t excluded = 0;
    auto keep = [&](uint32_t rank, const ExcludedRank& e) {
      want[rank] = {e.reason, e.detail, e.since_iteration};
      excluded++;
    };
    std::vector<const ExcludedRank*> cur_excl(world_size, nullptr);
    for (const auto& e : cur.excluded) cur_excl[e.rank] = &e;

    for (uint32_t i = 0; i < world_size; ++i) {
      const RankState& r = ranks[i];
      const ExcludedRank* ce = cur_excl[i];
      if (r.override == RankOverride::kForceExclude) {
        if (ce && ce->reason == ExclusionReason::kForced) keep(i, *ce);
        else {
          want[i] = {ExclusionReason::kForced, "forced out by an operator", highest_active};
          excluded++;
        }
        continue;
      }
      if (r.override == RankOverride::kForceInclude || !policy.exclusion_enabled) continue;
      if (ce && ce->reason == ExclusionReason::kForced) continue;  // override was cleared
      if (r.state == WorkerState::kFinished) {
        // A job that is ending changes no membership: its ranks are leaving.
        if (ce) keep(i, *ce);
        continue;
      }
      if (r.state == WorkerState::kUnresponsive) {
        if (ce) keep(i, *ce);
        else unresponsive_candidates.push_back(i);
      } else if (r.state == WorkerState::kStraggler && !r.on_probation) {
        if (ce && ce->reason != ExclusionReason::kUnresponsive) keep(i, *ce);
        else straggler_candidates.push_back(i);
      }
    }

    const uint32_t max_excluded = static_cast<uint32_t>(
        std::floor(policy.max_excluded_fraction * static_cast<double>(world_size) + 1e-9));
    auto room = [&]() {
      return excluded + 1 <= max_excluded && world_size - excluded - 1 >= policy.min_active_ranks;
    };
    std::vector<bool> blocked_now(world_size, false);

    for (uint32_t i : unresponsive_candidates) {
      if (room()) {
        want[i] = {ExclusionReason::kUnresponsive,
                   absl::StrFormat("no report for %.3gs", policy.unresponsive_after_seconds),
                   highest_active};
        excluded++;
      } else {
        blocked_now[i] = true;
      }
    }

    // Slowest first: when only some fit, leave out the ones that hurt most.
    std::sort(straggler_candidates.begin(), straggler_candidates.end(),
              [&](uint32_t a, uint32_t b) { return ranks[a].ewma > ranks[b].ewma; });
    size_t fit = 0;
    {
      uint32_t e = excluded;
      for (; fit < straggler_candidates.size(); ++fit) {
        if (!(e + 1 <= max_excluded && world_size - e - 1 >= policy.min_active_ranks)) break;
        e++;
      }
    }
    // Throughput guard: exclude the `take` slowest candidates only if the job
    // is predicted to go faster without them. Try the largest set first.
    size_t take = 0;
    if (fit > 0) {
      std::vector<double> active_times;
      std::vector<bool> is_candidate(world_size, false);
      for (size_t k = 0; k < fit; ++k) is_candidate[straggler_candidates[k]] = true;
      double t_with = 0;
      uint32_t active = 0;
      for (uint32_t i = 0; i < world_size; ++i) {
        if (want[i].reason != ExclusionReason::kNone || !Live(ranks[i])) continue;
        active++;
        t_with = std::max(t_with, ranks[i].ewma);
        if (!is_candidate[i]) active_times.push_back(ranks[i].ewma);
      }
      const double t_rest = active_times.empty()
                                ? 0.0
                                : *std::max_element(active_times.begin(), active_times.end());
      for (size_t k = fit; k > 0; --k) {
        // Without the k slowest candidates the slowest remaining is either the
        // (k+1)-th candidate or the slowest non-candidate.
        double t_without = t_rest;
        if (k < fit) t_without = std::max(t_without, ranks[straggler_candidates[k]].ewma);
        if (active <= k || t_without <= 0 || t_with <= 0) continue;
        const double gain = ((active - k) / t_without) / (active / t_with) - 1.0;
        if (gain >= policy.min_throughput_gain) {
          take = k;
          break;
        }
      }
    }
    for (size_t k = 0; k < straggler_candidates.size(); ++k) {
      const uint32_t i = straggler_candidates[k];
      if (k < take) {
        want[i] = {ranks[i].probation_failed ? ExclusionReason::kProbationEnd
                                             : ExclusionReason::kStraggler,
                   StragglerDetail(i), highest_active};
        excluded++;
      } else {
        blocked_now[i] = true;
      }
    }

    // Guard events, once per episode.
    blocked = 0;
    for (uint32_t i = 0; i < world_size; ++i) {
      RankState& r = ranks[i];
      if (blocked_now[i]) {
        blocked++;
        if (!r.guard_blocked) {
          r.guard_blocked = true;
          guard_blocks_total++;
          Event e;
          e.time = now;
          e.kind = EventKind::kGuardBlocked;
          e.rank = i;
          e.from = e.to = r.state;
          e.iteration = r.last_iteration;
          e.evidence = MakeEvidence(r, r.last_compute);
          e.membership_version = cur.version;
          e.message = absl::StrCat("exclusion of rank ", i, " withheld: ",
                                   excluded + 1 > max_excluded
                                       ? absl::StrCat("max_excluded_fraction allows ", max_excluded)
                                   : world_size - excluded - 1 < policy.min_active_ranks
                                       ? absl::StrCat("min_active_ranks is ",
                                                      policy.min_active_ranks)
                                       : absl::StrFormat("predicted throughput gain below %g",
                                                         policy.min_throughput_gain));
          Emit(std::move(e));
        }
      } else {
        r.guard_blocked = false;
      }
    }

    // Publish if the excluded set changed - and only once every rank that
    // must act on the change can hear of it (the membership gate):
    //   * every rank active in the new version (it must take part from the
    //     switch iteration on, and a readmitted one must stop its shadow
    //     steps there);
    //   * every rank the change excludes, unless it is unresponsive (it would
    //     otherwise keep issuing collectives on the old membership).
    // A rank no stream speaks for cannot fetch the version before its
    // collective; when it reaches the switch iteration it keeps the last
    // membership it applied while the others would switch (a daemon
    // restarted while a rank is still in its reconnect backoff). The
    // collective layer's in-band agreement then holds the whole group on the
    // old membership until that rank is certain again; a consumer of the
    // switch rule without it (straggler-sim's model, a trainer's own
    // collective) would split. So the change waits: until the rank is back (Announce or a report), or
    // until Tick marks it unresponsive, when the change may exclude it too.
    // Unresponsive ranks are exempt as leavers only: a silent rank is the
    // one case where waiting cannot help.
    bool changed = false;
    uint64_t min_effective = 0;
    std::vector<ExcludedRank> next;
    std::vector<uint32_t> unreachable;  // ranks the change must wait for
    for (uint32_t i = 0; i < world_size; ++i) {
      const bool was = cur_excl[i] != nullptr;
      const bool is = want[i].reason != ExclusionReason::kNone;
      if (was != is || (was && is && cur_excl[i]->reason != want[i].reason)) changed = true;
      if (!ranks[i].attached &&
          (!is || (!was && ranks[i].state != WorkerState::kUnresponsive)))
        unreachable.push_back(i);
      // A rank coming back may have run ahead of the group while excluded
      // (it waits on no collective). It must not be expected at an iteration
      // it has passed, nor at one it may already be certain of under the old
      // version: a rank is certain of iteration i once its report of
      // i - lead + 1 is acknowledged (IsCertain in membership_history.h).
      if (was && !is && ranks[i].has_progress)
        min_effective = std::max(min_effective, ranks[i].last_iteration + Lead());
      if (is) next.push_back({i, want[i].reason, std::move(want[i].detail), want[i].since});
    }
    if (!changed) {
      withheld = false;
      return;
    }
    if (!unreachable.empty()) {
      if (!withheld) Emit(WithheldEvent(unreachable, next, now));
      withheld = true;
      return;
    }
    withheld = false;
    Publish(std::move(next), now, "exclusion set changed", min_effective);
  }

  // One event per withheld change (until it is published or no longer
  // wanted), naming the ranks it waits for and what it would exclude.
  Event WithheldEvent(const std::vector<uint32_t>& unreachable,
                      const std::vector<ExcludedRank>& next, Time now) const {
    constexpr size_t kNamed = 8;
    std::string waiting;
    for (size_t k = 0; k < unreachable.size() && k < kNamed; ++k)
      absl::StrAppend(&waiting, k ? ", " : "", unreachable[k]);
    if (unreachable.size() > kNamed)
      absl::StrAppend(&waiting, " and ", unreachable.size() - kNamed, " more");
    std::string list;
    for (size_t k = 0; k < next.size() && k < kNamed; ++k)
      absl::StrAppend(&list, k ? ", " : "", next[k].rank);
    if (next.size() > kNamed) absl::StrAppend(&list, " and ", next.size() - kNamed, " more");
    Event e;
    e.time = now;
    e.kind = EventKind::kMembershipWithheld;
    e.rank = unreachable.front();
    e.from = e.to = ranks[e.rank].state;
    e.iteration = have_highest ? highest_active : 0;
    e.membership_version = Newest().version;
    e.message = absl::StrCat("membership change withheld (would exclude [", list,
                             "]): no stream speaks for rank", unreachable.size() > 1 ? "s " : " ",
                             waiting, "; it goes out when they reconnect or turn unresponsive");
    return e;
  }

  // An earlier daemon's excluded set, taken over by a new engine: ranks out
  // as stragglers (or at probation's end) become stragglers with a full
  // counter and unresponsive ones unresponsive, so they stay out until their
  // own reports show recovery. A forced one stays forced only when its
  // ForceExclude override is already set (restored from the state database
  // by RestoreMembership); otherwise it is held like a straggler. The set
  // may come from a hello, which any ingest client can send without a
  // token: creating an override from it would let such a client force a
  // rank out for good, an operator's power. Ranks >= world_size are
  // dropped. Returns the set, ascending by rank, one entry per rank.
  // Their unresponsive clock starts at `now` (they have not reported to this
  // engine; without it they would be silent since 1970 at the first Tick).
  std::vector<ExcludedRank> TakeOverExcluded(const std::vector<ExcludedRank>& held, Time now) {
    std::vector<ExcludedRank> excluded;
    for (const ExcludedRank& e : held) {
      if (e.rank >= world_size) continue;
      RankState& r = ranks[e.rank];
      ExcludedRank kept = e;
      switch (e.reason) {
        case ExclusionReason::kForced:
          if (r.override == RankOverride::kForceExclude) break;
          // No override here to keep it forced (Evaluate would release a
          // forced entry without one at once): still out, so the ranks that
          // apply the held set keep agreeing, but as a straggler, released
          // when its own (shadow) reports show recovery. Overrides survive
          // a restart only through the state database.
          kept.reason = ExclusionReason::kStraggler;
          kept.detail = "forced out under an earlier daemon, no override restored: held as a "
                        "straggler until its reports show recovery";
          [[fallthrough]];
        case ExclusionReason::kStraggler:
        case ExclusionReason::kProbationEnd:
          r.state = WorkerState::kStraggler;
          r.counter = Limit();
          if (r.last_report_time < now) r.last_report_time = now;
          break;
        case ExclusionReason::kUnresponsive:
          r.state = WorkerState::kUnresponsive;
          break;
        default:
          break;
      }
      excluded.push_back(std::move(kept));
    }
    std::sort(excluded.begin(), excluded.end(),
              [](const ExcludedRank& a, const ExcludedRank& b) { return a.rank < b.rank; });
    excluded.erase(std::unique(excluded.begin(), excluded.end(),
                               [](const ExcludedRank& a, const ExcludedRank& b) {
                                 return a.rank == b.rank;
                               }),
                   excluded.end());
    return excluded;
  }

  // The lead the next version must keep. Clients judge certainty with the
  // lead of the newest version they hold: a lowered lead may only be used
  // once a version carrying it is out.
  uint64_t Lead() const {
    return std::max<uint64_t>(policy.lead_iterations, Newest().lead_iterations);
  }

  // `min_effective`: the new version may not take effect before this
  // iteration (a re-included rank that ran ahead; a floor from a client).
  void Publish(std::vector<ExcludedRank> excluded, Time now, std::string why,
               uint64_t min_effective = 0, uint64_t min_version = 0) {
    const Membership& cur = Newest();
    Version v;
    v.m.version = std::max(cur.version + 1, min_version);
    const uint64_t lead = Lead();
    uint64_t progress = have_highest ? highest_active : 0;
    // A hello speaks for its own ranks only; a rank of the job not heard from
    // yet may have reported one iteration more (a synchronous job's ranks are
    // at most one step apart) and, from an earlier daemon, hold certainty up
    // to lead iterations beyond that.
    if (hello_reported) progress = std::max(progress, *hello_reported + 1);
    const uint64_t by_progress = progress + lead;
    v.m.effective_iteration =
        std::max({by_progress, cur.effective_iteration + 1, min_effective});
    v.m.excluded = std::move(excluded);
    v.m.world_size = world_size;
    v.m.lead_iterations = policy.lead_iterations;
    v.m.created_at = now;
    for (const auto& e : v.m.excluded)
      if (ranks[e.rank].counted) v.excluded_counted++;
    versions.push_back(v);
    history.push_back(v.m);
    while (versions.size() > kMembershipHistory) {
      versions.pop_front();
      history.pop_front();
    }
    Event e;
    e.time = now;
    e.kind = EventKind::kMembership;
    e.iteration = v.m.effective_iteration;
    e.membership_version = v.m.version;
    std::string list;
    for (const auto& x : v.m.excluded)
      absl::StrAppend(&list, list.empty() ? "" : ", ", x.rank, " (",
                      std::string(ExclusionReasonName(x.reason)), ")");
    e.message = absl::StrCat(why, ": excluded [", list, "] from iteration ",
                             v.m.effective_iteration);
    Emit(std::move(e));
  }

  // ---- liveness ------------------------------------------------------------

  void Tick(Time now) {
    const Time timeout = SaturatingNanoseconds(policy.unresponsive_after_seconds);
    bool any = false;
    for (uint32_t i = 0; i < world_size; ++i) {
      RankState& r = ranks[i];
      if (r.state == WorkerState::kUnresponsive || r.state == WorkerState::kFinished) continue;
      const bool pending = r.state == WorkerState::kPending;
      const Time last = pending ? std::max(created_at, r.announced_at) : r.last_report_time;
      if (now - last <= timeout) continue;
      r.straggler_when_silent = r.state == WorkerState::kStraggler;
      ChangeState(i, WorkerState::kUnresponsive, r.last_iteration, r.last_compute, now,
                  pending ? absl::StrFormat("no report %.3gs after the job started",
                                            Seconds(now - last))
                          : absl::StrFormat("no report for %.3gs (last at iteration %u)",
                                            Seconds(now - last), r.last_iteration));
      SetCounted(i, false);
      any = true;
    }
    if (any) {
      DrainRows(now);
      Evaluate(now);
    }
  }
};

JobEngine::JobEngine(uint32_t world_size, PolicyConfig policy, Time now) {
  assert(world_size > 0);
  assert(policy.Validate().ok());
  impl_ = std::make_unique<Impl>(world_size, std::move(policy), now);
}

JobEngine::~JobEngine() = default;

IngestResult JobEngine::Ingest(const Report& report, Time now) { return impl_->Ingest(report, now); }

void JobEngine::Tick(Time now) { impl_->Tick(now); }

void JobEngine::Announce(uint32_t rank, Time now) {
  Impl& d = *impl_;
  if (rank >= d.world_size) return;
  auto& r = d.ranks[rank];
  d.Attach(r);
  if (r.state == WorkerState::kPending) {
    r.announced_at = now;
    d.SetCounted(rank, true);
  }
  if (d.dirty) d.Evaluate(now);
}

void JobEngine::BeginBatch() { impl_->batch_open = true; }

void JobEngine::EndBatch(Time now) {
  Impl& d = *impl_;
  d.batch_open = false;
  if (d.batch_evaluate) {
    d.batch_evaluate = false;
    d.EvaluateNow(now);
  }
}

void JobEngine::Restart(uint32_t rank) {
  Impl& d = *impl_;
  if (rank >= d.world_size) return;
  auto& r = d.ranks[rank];
  r.has_progress = false;
  r.last_iteration = 0;
}

void JobEngine::Finish(uint32_t rank, Time now) {
  Impl& d = *impl_;
  if (rank >= d.world_size) return;
  auto& r = d.ranks[rank];
  if (r.state == WorkerState::kPending || r.state == WorkerState::kFinished) return;
  d.ChangeState(rank, WorkerState::kFinished, r.last_iteration, r.last_compute, now,
                "its trainer closed cleanly");
  d.SetCounted(rank, false);
  d.DrainRows(now);
  d.Evaluate(now);
}

bool JobEngine::Finished() const {
  const Impl& d = *impl_;
  for (const auto& r : d.ranks)
    if (r.state != WorkerState::kFinished) return false;
  return true;
}

void JobEngine::StartOver(uint64_t first_version, Time now) {
  Impl& old = *impl_;
  auto fresh = std::make_unique<Impl>(old.world_size, old.policy, now);
  fresh->iterations_per_epoch = old.iterations_per_epoch;
  fresh->epoch_length_announced = old.epoch_length_announced;
  Membership& m = fresh->versions.front().m;
  m.version = first_version;
  m.lead_iterations = std::max(old.policy.lead_iterations, old.Newest().lead_iterations);
  for (uint32_t i = 0; i < old.world_size; ++i) {
    const auto& r = old.ranks[i];
    auto& n = fresh->ranks[i];
    n.override = r.override;
    if (r.override == RankOverride::kForceExclude)
      m.excluded.push_back({i, ExclusionReason::kForced, "forced out by an operator", 0});
    if (r.attached) {
      n.attached = true;
      n.announced_at = now;
      fresh->SetCounted(i, true);
    }
  }
  fresh->history.front() = m;
  impl_ = std::move(fresh);
}

void JobEngine::Detach(uint32_t rank) {
  Impl& d = *impl_;
  if (rank < d.world_size) d.ranks[rank].attached = false;
}

absl::Status JobEngine::SetPolicy(const PolicyConfig& policy, Time now) {
  if (auto s = policy.Validate(); !s.ok()) return s;
  Impl& d = *impl_;
  const PolicyConfig old = d.policy;
  d.policy = policy;
  d.ClampCounters();
  const bool rule_changed = old.kind != policy.kind ||
                            old.profile_iterations != policy.profile_iterations ||
                            old.threshold_factor != policy.threshold_factor;
  Event e;
  e.time = now;
  e.kind = EventKind::kPolicyChanged;
  e.iteration = d.have_highest ? d.highest_active : 0;
  e.membership_version = d.Newest().version;
  // Name what changed: "policy dynamic -> dynamic" told an operator nothing.
  const std::string changes = PolicyChanges(old, policy);
  e.message = changes.empty() ? "policy set again, no field changed"
                              : absl::StrCat("policy changed: ", changes);
  d.Emit(std::move(e));
  if (rule_changed) {
    d.have_threshold = false;
    d.threshold = 0;
    d.baseline = 0;
    if (policy.kind == PolicyKind::kDynamic)
      d.StartProfile(d.have_highest ? d.highest_active + 1 : 0, now, "policy changed");
  }
  d.dirty = true;
  d.Evaluate(now);
  return absl::OkStatus();
}

const PolicyConfig& JobEngine::policy() const { return impl_->policy; }

absl::Status JobEngine::SetOverride(uint32_t rank, RankOverride override, std::string reason,
                                    Time now) {
  Impl& d = *impl_;
  if (rank >= d.world_size)
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of range for world_size ", d.world_size));
  d.ranks[rank].override = override;
  Event e;
  e.time = now;
  e.kind = EventKind::kOverride;
  e.rank = rank;
  e.from = e.to = d.ranks[rank].state;
  e.iteration = d.have_highest ? d.highest_active : 0;
  e.membership_version = d.Newest().version;
  e.message = absl::StrCat(override == RankOverride::kForceExclude   ? "force exclude"
                           : override == RankOverride::kForceInclude ? "force include"
                                                                     : "override cleared",
                           reason.empty() ? "" : ": ", reason);
  d.Emit(std::move(e));
  d.dirty = true;
  d.Evaluate(now);
  return absl::OkStatus();
}

void JobEngine::Reset(Time now) {
  Impl& d = *impl_;
  for (auto& r : d.ranks) {
    const bool has = r.has_progress;
    const uint64_t last = r.last_iteration;
    const bool attached = r.attached;
    r = Impl::RankState{};
    r.has_progress = has;  // keep deduplication across the reset
    r.last_iteration = last;
    r.attached = attached;  // streams are not part of the forgotten state
  }
  d.counted_ranks = 0;
  d.created_at = now;
  for (auto& v : d.versions) v.excluded_counted = 0;
  for (auto& row : d.rows) d.spare_rows.push_back(std::move(row));
  d.rows.clear();
  d.have_epoch = false;
  d.profiling = true;
  d.profile_collected = 0;
  d.profile_sum = 0;
  d.profile_majority_sum = 0;
  d.baseline_from_majority = false;
  d.have_completed = false;  // rows start afresh with the next reports
  d.ahead_ranks = 0;
  d.have_threshold = false;
  d.threshold = d.baseline = 0;
  d.probation_active = false;
  d.blocked = 0;
  Event e;
  e.time = now;
  e.kind = EventKind::kReset;
  e.iteration = d.have_highest ? d.highest_active : 0;
  e.membership_version = d.Newest().version;
  e.message = "job reset: every rank included, state forgotten";
  d.Emit(std::move(e));
  // A working lineage: no floor a hello claimed, no version far ahead.
  d.hello_reported.reset();
  d.Rebase(now, "reset: the newest version took effect implausibly far ahead");
  // Through the membership gate like every change (Evaluate): with a rank
  // no stream speaks for, the release of the excluded ranks waits for it.
  const bool all_attached = std::all_of(d.ranks.begin(), d.ranks.end(),
                                        [](const Impl::RankState& r) { return r.attached; });
  if (all_attached) {
    d.withheld = false;
    d.Publish({}, now, "reset");
  } else {
    d.dirty = true;
    d.Evaluate(now);
  }
}

absl::Status JobEngine::CheckClaims(const Membership& held,
                                    std::optional<uint64_t> reported) const {
  const Impl& d = *impl_;
  const std::optional<uint64_t> ref = d.ReferenceIteration();
  if (reported && ref && *reported > *ref && *reported - *ref > kMaxIterationJump) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.reported_iteration=", *reported, " is more than ", kMaxIterationJump,
        " past the job's progress (iteration ", *ref, ")"));
  }
  if (held.version == 0) return absl::OkStatus();
  if (held.version > d.Newest().version && held.version - d.Newest().version > kMaxVersionJump) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.known_membership_version=", held.version, " is more than ", kMaxVersionJump,
        " past the job's newest version ", d.Newest().version));
  }
  // Overflow-safe: every term is far below 2^63 (reported and ref are
  // bounded above, or refused), the claim is compared, not added to.
  const uint64_t floor = reported ? std::min(*reported, uint64_t{1} << 62) : 0;
  if (const uint64_t limit = d.PlausibleEffective(floor); held.effective_iteration > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.known_effective_iteration=", held.effective_iteration, " is more than lead ",
        d.Lead(), " + agreement interval ", kMaxAgreementInterval, " past iteration ",
        limit - d.Lead() - kMaxAgreementInterval,
        " (the job's progress or the hello's reported_iteration)"));
  }
  return absl::OkStatus();
}

bool JobEngine::DropClaims(Time now) {
  Impl& d = *impl_;
  const bool had = d.hello_reported.has_value();
  d.hello_reported.reset();
  const bool rebased = d.Rebase(now, "a hello's claims were false: rebased on the reports");
  return had || rebased;
}

void JobEngine::NoteReportedIteration(uint64_t iteration) {
  Impl& d = *impl_;
  constexpr uint64_t kAbsurd = uint64_t{1} << 62;  // as in AdoptVersionFloor
  if (iteration >= kAbsurd) return;
  if (!d.hello_reported || *d.hello_reported < iteration) d.hello_reported = iteration;
}

void JobEngine::AdoptVersionFloor(const Membership& held, Time now) {
  Impl& d = *impl_;
  if (held.version < d.Newest().version) return;
  // A client cannot hold a version or an iteration anywhere near 2^63; a
  // floor that high would freeze every later version (or overflow).
  constexpr uint64_t kAbsurd = uint64_t{1} << 62;
  if (held.version >= kAbsurd || held.effective_iteration >= kAbsurd) return;
  // Version 0 is the only one an engine has before it publishes anything:
  // then the held set is the one the ranks apply, and keeping it means a
  // rank that switches to the new version late still agrees with one that
  // switched early (the same content; see RestoreMembership). Otherwise this
  // engine's own newest set stands.
  std::vector<ExcludedRank> excluded =
      d.Newest().version == 0 ? d.TakeOverExcluded(held.excluded, now) : d.Newest().excluded;
  d.Publish(std::move(excluded), now,
            absl::StrCat("a client holds version ", held.version, " from an earlier daemon"),
            held.effective_iteration + 1, held.version + 1);
}

void JobEngine::RestoreMembership(
    const Membership& m, const std::vector<std::pair<uint32_t, RankOverride>>& overrides,
    Time now) {
  Impl& d = *impl_;
  constexpr uint64_t kAbsurd = uint64_t{1} << 62;  // as in AdoptVersionFloor
  if (m.version >= kAbsurd || m.effective_iteration >= kAbsurd) return;
  for (const auto& [rank, o] : overrides) {
    if (rank < d.world_size) d.ranks[rank].override = o;
  }
  std::vector<ExcludedRank> excluded = d.TakeOverExcluded(m.excluded, now);
  d.Publish(std::move(excluded), now,
            absl::StrCat("restored version ", m.version, " from the state database"),
            m.effective_iteration + 1, m.version + 1);
}

void JobEngine::SetIterationsPerEpoch(uint64_t iterations) {
  impl_->iterations_per_epoch = iterations;
  impl_->epoch_length_announced = iterations > 0;
  impl_->ClampCounters();
}

const Membership& JobEngine::membership() const { return impl_->Newest(); }

const std::deque<Membership>& JobEngine::membership_history() const { return impl_->history; }

std::vector<Membership> JobEngine::MembershipsFrom(uint64_t iteration) const {
  std::vector<Membership> out;
  const auto& h = impl_->history;
  size_t start = 0;
  for (size_t i = 0; i < h.size(); ++i)
    if (h[i].effective_iteration <= iteration) start = i;
  for (size_t i = start; i < h.size(); ++i) out.push_back(h[i]);
  return out;
}

std::optional<uint64_t> JobEngine::Progress(uint32_t rank) const {
  if (rank >= impl_->world_size || !impl_->ranks[rank].has_progress) return std::nullopt;
  return impl_->ranks[rank].last_iteration;
}

std::vector<Event> JobEngine::TakeEvents() {
  std::vector<Event> out;
  out.swap(impl_->events);
  return out;
}

uint32_t JobEngine::world_size() const { return impl_->world_size; }

WorkerView JobEngine::Worker(uint32_t rank) const {
  const Impl& d = *impl_;
  WorkerView w;
  if (rank >= d.world_size) return w;
  const auto& r = d.ranks[rank];
  w.rank = rank;
  w.state = r.state;
  const auto& ex = d.Newest().excluded;
  auto it = std::lower_bound(ex.begin(), ex.end(), rank,
                             [](const ExcludedRank& e, uint32_t r) { return e.rank < r; });
  if (it != ex.end() && it->rank == rank) {
    w.excluded = true;
    w.exclusion_reason = it->reason;
  }
  w.override = r.override;
  w.counter = r.counter;
  w.limit = d.Limit();
  w.epoch = r.epoch;
  w.last_iteration = r.last_iteration;
  w.last_compute_seconds = r.last_compute;
  w.ewma_compute_seconds = r.ewma;
  w.slowdown_ratio = d.baseline > 0 && r.samples > 0 ? r.ewma / d.baseline : 0.0;
  w.reports_total = r.reports_total;
  w.last_report_time = r.last_report_time;
  return w;
}

JobView JobEngine::View() const {
  const Impl& d = *impl_;
  JobView v;
  v.world_size = d.world_size;
  v.epoch = d.epoch;
  v.highest_iteration = d.have_highest ? d.highest_active : 0;
  v.threshold_seconds = d.have_threshold ? d.threshold : 0.0;
  v.baseline_seconds = d.baseline;
  v.step_seconds = d.step_seconds;
  v.excluded_ranks = static_cast<uint32_t>(d.Newest().excluded.size());
  v.active_ranks = d.world_size - v.excluded_ranks;
  for (const auto& r : d.ranks) {
    v.straggler_ranks += r.state == WorkerState::kStraggler;
    v.unresponsive_ranks += r.state == WorkerState::kUnresponsive;
    v.detached_ranks += !r.attached;
    v.finished_ranks += r.state == WorkerState::kFinished;
  }
  v.membership_withheld = d.withheld;
  v.detections_total = d.detections_total;
  v.recoveries_total = d.recoveries_total;
  v.reports_total = d.reports_total;
  v.guard_blocks_total = d.guard_blocks_total;
  v.iterations_per_epoch = d.iterations_per_epoch;
  v.last_report_time = d.last_report_time;
  return v;
}

}  // namespace straggler::engine
