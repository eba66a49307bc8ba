// The private state of one JobEngine and the methods that work on it, split
// by concern over these files (docs/detection.md, "Where each rule lives in the code"):
//   engine_ingest.cc     a report in: validation, rows, far-ahead reports
//   engine_judge.cc      completed rows and single reports -> verdicts ->
//                        counters -> states; epochs and probation
//   engine_exclusion.cc  the excluded set: snapshot, plan (exclusion_planner.h),
//                        guard events
//   engine_membership.cc versions: the gate, publish, rebase, take-over,
//                        restore, hello claims
//   engine_ranks.cc      liveness, the rank lifecycle (Tick, Announce, ...), Reset
//   job_engine.cc        the public JobEngine: forwarding, views, policy, overrides
// and the pieces with their own state: rows.h, membership_log.h,
// reference*.{h,cc} (one per policy), events.h.
// Not thread-safe, as JobEngine: one thread at a time.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "exclusion_planner.h"
#include "membership_log.h"
#include "reference.h"
#include "rows.h"
#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"
#include "topology_table.h"

namespace straggler::engine::internal {

// Largest gap between a row and the next iteration reported before the
// engine gives up waiting for the rows in between (a rank that jumps ahead
// by more is a client bug, not a reason to hold memory).
inline constexpr uint64_t kMaxRowSpan = 1024;

// Below this many ranks in a row, "most ranks are slower than the fastest"
// cannot be told from "a straggler is present", so no majority fallback.
inline constexpr size_t kMinRanksForMajority = 4;

// A client cannot hold a version or an iteration anywhere near 2^63; a floor
// that high would freeze every later version (or overflow).
inline constexpr uint64_t kAbsurd = uint64_t{1} << 62;

struct RankState {
  // Eight-byte fields first, then the narrow ones, the flags and counts as
  // bits: a million-rank job keeps one of these per rank (136 bytes when
  // interleaved, 104 packed, 88 with the bit-fields).
  uint64_t last_iteration = 0;
  uint64_t epoch = 0;
  double last_compute = 0.0;
  double ewma = 0.0;
  uint64_t last_flip_iteration = 0;
  uint64_t reports_total = 0;
  Time last_report_time{0};
  uint64_t episode_start = 0;     // iteration at which the counter left 0
  uint64_t before_ahead = 0;      // its newest iteration before it went ahead
  Time announced_at{0};
  // Bit-fields with the flags below: `samples` is held at kMaxSamples (far
  // above ewma_min_samples, at most 100 000, the only value it is compared
  // with besides 0); `counter` is at most the limit (<= 100 000 < 2^17).
  static constexpr uint32_t kMaxSamples = (1u << 21) - 1;
  uint64_t samples : 21 = 0;
  uint64_t counter : 17 = 0;
  bool has_progress : 1 = false;
  bool flipped : 1 = false;
  bool guard_blocked : 1 = false;
  bool on_probation : 1 = false;
  bool probation_failed : 1 = false;  // still slow when its probation ended
  bool counted : 1 = false;           // rows wait for this rank (see counted_ranks)
  // A stream speaks for this rank, so it hears new versions (Announce and
  // reports set it, Detach clears it). See the membership gate.
  bool attached : 1 = false;
  bool ahead : 1 = false;             // last report was far ahead of the job
  bool progress_before_ahead : 1 = false;  // it had reported before it went ahead
  // It was a straggler when it fell silent: reporting again does not clear
  // that (only its reports, judged as always, show recovery).
  bool straggler_when_silent : 1 = false;
  WorkerState state = WorkerState::kPending;
  RankOverride override = RankOverride::kNone;

  // The iteration the rank has really reached: a far-ahead report (judged
  // alone, see TooFarAhead) does not count until the rank's reports catch up.
  uint64_t Reached() const { return ahead ? before_ahead : last_iteration; }
  // Reached(), as JobEngine::Progress publishes it: nullopt before the
  // rank's first report, and while its only reports are far ahead.
  std::optional<uint64_t> Progress() const {
    if (!has_progress || (ahead && !progress_before_ahead)) return std::nullopt;
    return Reached();
  }
};
static_assert(sizeof(RankState) <= 88, "a million-rank job keeps one per rank");

struct EngineImpl {
  EngineImpl(uint32_t world, PolicyConfig p, Time now);
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;

  // ---- configuration -------------------------------------------------------
  uint32_t world_size;
  PolicyConfig policy;
  uint64_t iterations_per_epoch = 0;
  bool epoch_length_announced = false;

  // ---- per rank ------------------------------------------------------------
  std::vector<RankState> ranks;
  // Each rank's declared place (SetTopology); the references group ranks by
  // it and rebuild their groups when topology_version moves.
  TopologyTable topology;
  uint64_t topology_version = 0;
  // Ranks whose client does not act on membership (SetMonitorOnly); kept
  // apart from RankState, which Reset forgets.
  std::vector<bool> monitor_only;
  // Ranks a row waits for, before exclusions: announced or reporting, and not
  // unresponsive.
  uint32_t counted_ranks = 0;
  Time created_at;
  // At most the last report (or announcement) time of every rank that may
  // still become unresponsive: a Tick before it + the timeout has nothing to
  // find and skips its pass over every rank (a million-rank job's took
  // 15-30 ms a second under the job's lock). Lowered wherever such a time is
  // set, taken again by each pass.
  Time tick_earliest = created_at;  // every rank pending, timed from it
  void NoteSeen(Time t) { tick_earliest = std::min(tick_earliest, t); }

  // ---- rows ----------------------------------------------------------------
  RowQueue rows;
  uint32_t ahead_ranks = 0;     // ranks whose last report was far ahead
  // The highest Reached() of the ranks with progress (ReferenceIteration's
  // common case), kept as reports raise it; a Restart or Reset, which may
  // lower it, marks it stale and the next read takes it again over every
  // rank (a million-rank job's hellos each took that pass: 20-30 ms).
  // Mutable: a cache read by const calls, one thread at a time (the job's).
  mutable uint64_t top_reached = 0;
  mutable bool top_any = false;
  mutable bool top_stale = false;
  void NoteReached(const RankState& r) {
    if (top_stale) return;
    top_reached = top_any ? std::max(top_reached, r.Reached()) : r.Reached();
    top_any = true;
  }
  bool have_highest = false;
  uint64_t highest_active = 0;  // highest iteration reported through a row
  // The highest iteration a stream's hello said its ranks reported
  // (NoteReportedIteration); versions take effect after it too.
  std::optional<uint64_t> hello_reported;

  // A large row judged in slices (docs/detection.md, "Large rows"): the
  // ingest call that completes it does the row-wide work, every later
  // Ingest judges up to slice_per_report of its ranks, and anything else
  // that reads or changes judging finishes it first (FinishRow).
  struct SlicedRow {
    bool active = false;
    Row row;
    Time now{};
    size_t left = 0;        // nonzero while the reference has work left (JudgeSlice)
    size_t pace = 0;        // units per report (ProcessRow)
    bool evaluate = false;  // an Evaluate waits for the row's end
    // A Tick came while the row was judged: it runs when the row ends
    // (Ingest), or at once with a later Tick if no slice of the row was
    // judged since (no reports come to end it).
    std::optional<Time> tick;
    uint64_t slices = 0;       // slices judged (ContinueRow)
    uint64_t tick_slices = 0;  // `slices` when the tick was put off
  };
  SlicedRow sliced;
  uint32_t slice_min_values = JobEngine::kSliceMinValues;
  uint32_t slice_per_report = JobEngine::kSlicePerReport;

  // ---- epoch and reference -------------------------------------------------
  bool have_epoch = false;
  uint64_t epoch = 0;
  uint64_t epoch_start_iteration = 0;
  // Published by the policy's reference (reference.h).
  bool have_threshold = false;
  double threshold = 0.0;
  double baseline = 0.0;
  double step_seconds = 0.0;  // step_max of the newest judged row
  std::vector<double> scratch;  // the references' sort buffer
  std::unique_ptr<Reference> reference;

  // ---- probation -----------------------------------------------------------
  bool probation_active = false;
  uint64_t probation_until = 0;

  // ---- membership ----------------------------------------------------------
  MembershipLog log;
  bool dirty = false;           // something exclusion depends on changed
  bool batch_open = false;      // BeginBatch..EndBatch: Evaluate waits for EndBatch
  bool batch_evaluate = false;  // an Evaluate was put off to EndBatch
  // A changed excluded set waits for ranks no stream speaks for (Gate).
  bool withheld = false;
  // The run ended unexpectedly (JobEngine::Lose) until a rank is announced.
  bool lost = false;
  uint32_t blocked = 0;         // candidates currently withheld by a guard
  PlanInput plan_input;         // reused by Evaluate
  // plan_input's replica layout, and the topology_version its ranks'
  // replicas and peer groups were copied at (Snapshot).
  ReplicaLayout plan_layout;
  std::optional<uint64_t> plan_topology;

  // ---- totals and events ---------------------------------------------------
  uint64_t detections_total = 0;
  uint64_t recoveries_total = 0;
  uint64_t reports_total = 0;
  uint64_t reports_late_total = 0;
  uint64_t guard_blocks_total = 0;
  Time last_report_time{0};
  std::vector<Event> events;

  // ---- small helpers -------------------------------------------------------
  uint32_t Limit() const { return policy.EffectiveLimit(iterations_per_epoch); }
  uint32_t Mark() const { return std::min(policy.rejoin_mark, Limit() - 1); }
  const Membership& Newest() const { return log.Newest(); }
  uint64_t Highest() const { return have_highest ? highest_active : 0; }
  Event& Emit(Event e) {
    events.push_back(std::move(e));
    return events.back();
  }
  Evidence MakeEvidence(const RankState& r, double compute) const;
  // Rows start (true) or stop (false) waiting for `rank`.
  void SetCounted(uint32_t rank, bool counted);
  // The rank can hear new versions again; a change withheld for it may go.
  void Attach(RankState& r);
  void ChangeState(uint32_t rank, WorkerState to, uint64_t iteration, double compute, Time now,
                   std::string message);

  // ---- ingest (engine_ingest.cc) -------------------------------------------
  IngestResult Validate(const Report& rep) const;
  std::optional<std::string> ImplausibleEpoch(const Report& rep) const;
  IngestResult Ingest(const Report& rep, Time now);
  bool TooFarAhead(uint32_t rank, uint64_t iteration, Time now);
  void AddToRow(const Report& rep, Time now);
  uint32_t Expected(uint64_t iteration) const;
  void DrainRows(Time now);
  void CompleteFront(Time now);

  // ---- judging (engine_judge.cc) -------------------------------------------
  void OnNewEpoch(const Row& row, Time now);
  // Judges `row`; false when it was moved into `sliced` (recycled at its end).
  bool ProcessRow(Row& row, Time now);
  void EndRow(Row& row, Time now, bool evaluate);
  // Up to `budget` more verdicts of the sliced row; finishes it when none
  // are left. FinishRow: all of them now.
  void ContinueRow(size_t budget);
  void FinishRow() { ContinueRow(std::numeric_limits<size_t>::max()); }
  Verdict VerdictFor(double value) const {
    if (!have_threshold) return Verdict::kNone;
    if (value > threshold) return Verdict::kSlow;
    if (value < threshold) return Verdict::kFast;
    return Verdict::kNone;
  }
  size_t JudgeRow(Row& row, Time now, bool global_shift_guard);
  void JudgeSingle(uint32_t rank, const Report& rep, Time now);
  void ApplyVerdict(uint32_t rank, Verdict v, uint64_t iteration, double compute, Time now);
  // For a reference with its own evidence (peer): sets the rank's counter
  // (at most the limit) and applies the state rule of the counter, as
  // ApplyVerdict does. `why(to_straggler)` is the message of a state change.
  // Returns whether the state changed (the event is events.back()).
  // `calm`: the state a rank that is no straggler is in, kHealthy or kMild
  // (peer's gray zone): a straggler leaving goes to it, and a healthy or
  // mild rank moves to it (without the cooldown: neither is a flag, and a
  // mild rank must become a straggler as soon as a healthy one would).
  bool SetCounter(uint32_t rank, uint32_t counter, uint64_t iteration, double compute, Time now,
                  absl::FunctionRef<std::string(bool)> why,
                  WorkerState calm = WorkerState::kHealthy);
  bool Transition(uint32_t rank, uint64_t iteration, double compute, Time now,
                  absl::FunctionRef<std::string(bool)> why,
                  WorkerState calm = WorkerState::kHealthy);
  bool CooledDown(const RankState& r, uint64_t iteration) const;
  void ClampCounters();
  void BeginProbation(Time now);
  void EndProbation(Time now);

  // ---- exclusion (engine_exclusion.cc) -------------------------------------
  void Evaluate(Time now);
  void EvaluateNow(Time now);
  const PlanInput& Snapshot();
  void EmitGuardEvents(const ExclusionPlan& plan, Time now);

  // ---- membership (engine_membership.cc) -----------------------------------
  void GateAndPublish(std::vector<ExcludedRank> next, Time now);
  Event WithheldEvent(const std::vector<uint32_t>& unreachable,
                      const std::vector<ExcludedRank>& next, Time now) const;
  uint64_t Lead() const;
  std::optional<uint64_t> ReferenceIteration() const;
  uint64_t PlausibleEffective(uint64_t floor) const;
  std::optional<uint64_t> ReportedBound() const;
  bool Rebase(Time now, const std::string& why);
  void Publish(std::vector<ExcludedRank> excluded, Time now, std::string why,
               uint64_t min_effective = 0, uint64_t min_version = 0);
  std::vector<ExcludedRank> TakeOverExcluded(const std::vector<ExcludedRank>& held, Time now);

  // ---- ranks (engine_ranks.cc) ---------------------------------------------
  void Tick(Time now);
  // A Tick: put off while a row is judged in slices (once), else now.
  void TickOrWait(Time now);
  void Announce(uint32_t rank, Time now);
  void Finish(uint32_t rank, Time now);
  bool Finished() const;
  void Reset(Time now);
};

}  // namespace straggler::engine::internal

namespace straggler::engine {

// The pimpl of JobEngine is the EngineImpl above (a named type, so the
// references and the planner can be handed it).
struct JobEngine::Impl final : internal::EngineImpl {
  using EngineImpl::EngineImpl;
};

}  // namespace straggler::engine
