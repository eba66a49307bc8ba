// The detection engine of one job: feed it iteration reports, read worker
// state, events and the versioned membership. It owns no sockets, threads or
// clocks: callers pass `now` in, so tests and offline replay are exact.
//
//   JobEngine job(/*world_size=*/8, PolicyConfig{}, now);
//   Report rep;
//   rep.rank = 3;
//   rep.iteration = 17;
//   rep.compute_seconds = 0.12;
//   IngestResult r = job.Ingest(rep, now);
//   if (!r.accepted) log(r.message);
//   for (const Event& e : job.TakeEvents()) ...  // state changes, memberships
//   const Membership& m = job.membership();      // who takes part, from when
//
// (tests/engine/header_example_test.cc compiles and runs this example.)
//
// The contract: the engine implements exactly the rules of
// docs/detection.md (rows, policies, the counter, states, recovery, the
// exclusion guards, input), docs/membership.md (versions, effective
// iterations, the membership gate) and docs/runs.md (the iteration rule,
// what a hello may claim, runs and restarts). Those pages are the one
// specification; the comments below say what each call does, not why.
//
// Thread safety: none. A JobEngine is used by one thread at a time; the
// daemon keeps one mutex per job.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "straggler/engine/policy.h"

namespace straggler::engine {

// Nanoseconds since the Unix epoch; the engine never reads a clock.
using Time = std::chrono::nanoseconds;

// kMild (the peer policy's gray zone, docs/detection.md "States"): persistently
// above its peers' threshold, below peer_straggler_ratio. Not a straggler:
// never an exclusion candidate, treated as healthy everywhere else. Last, so
// the values stored and sent before it keep their meaning.
enum class WorkerState : uint8_t { kPending, kHealthy, kStraggler, kUnresponsive, kFinished, kMild };
// kReplica: out with its data-parallel replica, whose culprit is another rank
// (ExcludedRank::culprit; docs/topology.md, "Exclusion by replica").
enum class ExclusionReason { kNone, kStraggler, kUnresponsive, kForced, kProbationEnd, kReplica };
enum class RankOverride : uint8_t { kNone, kForceInclude, kForceExclude };
enum class EventKind {
  kStateChange,
  kMembership,
  kGuardBlocked,
  kPolicyChanged,
  kOverride,
  kReset,
  kReprofile,
  kMembershipWithheld,
  // The run ended unexpectedly: every stream gone, every rank silent for the
  // daemon's bound (JobEngine::Lose, docs/runs.md "Job end"). Job-wide.
  kJobLost
};

std::string_view WorkerStateName(WorkerState s);
std::string_view ExclusionReasonName(ExclusionReason r);
std::string_view EventKindName(EventKind k);
// Whether an event of kind `k` is about one rank (state_change, guard_blocked,
// override, membership_withheld): only then do Event::rank, from and to mean
// anything. The other kinds are about the whole job and leave them default.
bool EventNamesRank(EventKind k);

// A rank's place in the job, from its hello (docs/topology.md): who it is
// judged against (docs/detection.md, "Peer groups"). Ranks are peers when
// they name the same peer_group and the same gpu_model.
struct RankTopology {
  std::string peer_group;           // "" = the default group
  std::optional<uint32_t> replica;  // unset = a replica of its own
  std::string gpu_model;            // "" = unknown; different models are never peers
  bool operator==(const RankTopology&) const = default;
};

struct Report {
  uint32_t rank = 0;
  uint64_t epoch = 0;
  uint64_t iteration = 0;
  double compute_seconds = 0.0;
  std::optional<double> step_seconds;
  std::optional<double> collective_wait_seconds;
  Time start_time{0};
  // The step's work (job's unit, > 0) and its input-wait and optimizer
  // phases (>= 0), where the trainer reports them (docs/client.md, "Work and
  // phases"). Ingest refuses a non-finite or negative phase, one above 10 x
  // max_compute_seconds, and work that is not > 0 (kInvalidValue). Every
  // policy judges OwnSeconds(); the peer policy judges it per unit of work
  // where the job reports work (docs/detection.md, "Own time and work").
  std::optional<double> work;
  std::optional<double> input_wait_seconds;
  std::optional<double> optimizer_seconds;

  // The rank's own time: everything but the collective wait - input wait +
  // compute + optimizer, a phase not reported counting as zero (so exactly
  // compute_seconds without phases).
  double OwnSeconds() const {
    return compute_seconds + input_wait_seconds.value_or(0.0) + optimizer_seconds.value_or(0.0);
  }
};

// Why a report was not taken. kDuplicate and kStale are not errors of the
// sender (replays after a reconnect produce them) but are still counted.
enum class RejectReason {
  kNone,
  kInvalidValue,     // NaN, infinite, negative or absurd time; bad optional field
  kRankOutOfRange,   // rank >= world size
  kDuplicate,        // this (rank, iteration) was already taken
  kStale,            // older than the rank's newest iteration: out of order
  kTooFarAhead,      // more than kMaxIterationJump past the job's progress, or an
                     // epoch further ahead than its iteration allows
};
std::string_view RejectReasonName(RejectReason r);

struct IngestResult {
  bool accepted = false;
  RejectReason reason = RejectReason::kNone;
  std::string message;  // names the offending value when rejected
};

struct ExcludedRank {
  uint32_t rank = 0;
  ExclusionReason reason = ExclusionReason::kNone;
  std::string detail;
  uint64_t since_iteration = 0;
  // For a rank that declared a replica (docs/topology.md): the rank whose
  // state took the replica out (this rank itself unless reason is kReplica),
  // that rank's peer group, and the replica. Unset in a pure data-parallel
  // job, where every rank is excluded for itself.
  std::optional<uint32_t> culprit = std::nullopt;
  std::string culprit_group = {};
  std::optional<uint32_t> replica = std::nullopt;
};

// A version of the job's membership. Versions only grow; effective_iteration
// strictly grows with version, so "the newest version whose
// effective_iteration <= i" names exactly one membership for iteration i.
struct Membership {
  uint64_t version = 0;
  uint64_t effective_iteration = 0;
  std::vector<ExcludedRank> excluded;  // ascending by rank
  uint32_t world_size = 0;
  uint32_t lead_iterations = 0;
  Time created_at{0};

  bool IsExcluded(uint32_t rank) const;
};

struct Evidence {
  double compute_seconds = 0.0;
  double threshold_seconds = 0.0;
  uint32_t counter = 0;
  uint32_t limit = 0;
  double baseline_seconds = 0.0;
  // On a healthy -> straggler transition: iterations from the first slow step
  // of the episode (the counter leaving 0) to the detection, both included.
  uint64_t latency_iterations = 0;
};

struct Event {
  Time time{0};
  EventKind kind = EventKind::kStateChange;
  uint32_t rank = 0;
  WorkerState from = WorkerState::kPending;
  WorkerState to = WorkerState::kPending;
  uint64_t iteration = 0;
  Evidence evidence;
  uint64_t membership_version = 0;
  std::string message;
};

// Where the peer policy judges a rank per unit of work (docs/detection.md,
// "Own time and work"): healthy per unit of work, but slow on time alone -
// its steps drew more work than its group's. Not a straggler; the daemon's
// likely cause `data`. Ratios of its recent steps (weighted over about
// peer_window steps) to its group's in the same rows.
struct DataNote {
  double time_ratio = 0.0;       // its time against its group's, on time alone
  double threshold_ratio = 0.0;  // the threshold on time alone (its group's noise there)
  double per_work_ratio = 0.0;   // its time per unit of work against its group's
  double work_ratio = 0.0;       // time_ratio / per_work_ratio: what its work explains
};

struct WorkerView {
  uint32_t rank = 0;
  WorkerState state = WorkerState::kPending;
  bool excluded = false;
  ExclusionReason exclusion_reason = ExclusionReason::kNone;
  RankOverride override = RankOverride::kNone;
  // Its client does not act on membership (SetMonitorOnly): never excluded
  // for its state, judged with its peers.
  bool monitor_only = false;
  uint32_t counter = 0;
  uint32_t limit = 0;
  uint64_t epoch = 0;
  uint64_t last_iteration = 0;
  double last_compute_seconds = 0.0;
  double ewma_compute_seconds = 0.0;
  double slowdown_ratio = 0.0;  // ewma / the baseline it is judged against (peer: its group's
                                // median or own baseline; else the job's); 0 before one exists
  uint64_t reports_total = 0;
  Time last_report_time{0};
  std::optional<DataNote> data;  // only while healthy (the peer policy, work reported)
};

struct JobView {
  uint32_t world_size = 0;
  uint64_t epoch = 0;
  uint64_t highest_iteration = 0;       // highest reported by an active rank
  double threshold_seconds = 0.0;       // 0 when no threshold is in force
  double baseline_seconds = 0.0;
  // The step time of the newest judged iteration: its slowest active rank's
  // step_seconds, or compute_seconds where a rank reports no step time. A
  // synchronous job steps at that speed; 0 before the first judged iteration.
  double step_seconds = 0.0;
  // The current excluded set: the newest membership's, and none once the job
  // ended (JobEngine::Ended: the versions stay in the history, but nobody is
  // left out of a job that no longer runs).
  uint32_t active_ranks = 0;            // not excluded (pending ranks count)
  uint32_t excluded_ranks = 0;
  uint32_t straggler_ranks = 0;
  uint32_t mild_ranks = 0;              // in the gray zone (WorkerState::kMild)
  uint32_t unresponsive_ranks = 0;
  uint32_t detached_ranks = 0;          // no stream speaks for them (see Detach)
  uint32_t finished_ranks = 0;          // their trainer closed cleanly (Finish)
  bool membership_withheld = false;     // a changed excluded set waits for them (not once ended)
  bool lost = false;                    // the run ended unexpectedly (JobEngine::Lose)
  uint64_t detections_total = 0;
  uint64_t recoveries_total = 0;
  uint64_t reports_total = 0;
  // Reports that came after their iteration's row was judged without them
  // (the job had moved kRowGraceIterations past it): judged alone, against
  // the reference's recent level, not within their row. Many mean streams
  // far apart - batches spanning several iterations, a slow agent.
  uint64_t reports_late_total = 0;
  uint64_t guard_blocks_total = 0;
  uint64_t iterations_per_epoch = 0;    // announced or learned; 0 = unknown
  Time last_report_time{0};
};

class JobEngine {
 public:
  // How far (in iterations) the job may move past an iteration before it is
  // judged without the ranks that have not reported it.
  static constexpr uint64_t kRowGraceIterations = 3;
  // A row of at least kSliceMinValues reports is judged in slices: each
  // Ingest() from the one that completes it on does kSlicePerReport units of
  // the row's work (a unit: about one rank's step or verdict, or a few values
  // of a pass for a group's median and noise), or a multiple of it that ends
  // the row within three quarters of a row's reports, and any other call that reads
  // or changes judging does the rest first. A stream of a million-rank job
  // then never waits for a whole row under the job's lock (docs/detection.md,
  // "Large rows"). The verdicts, their order and their events are those of
  // the whole row at once; a membership change they cause is planned once
  // all are in.
  static constexpr uint32_t kSliceMinValues = 4096;
  static constexpr uint32_t kSlicePerReport = 4;
  // Membership versions kept for clients that are behind.
  static constexpr size_t kMembershipHistory = 32;
  // Speed-up re-profiling: row minimum below baseline / kSpeedupRatio for
  // kSpeedupRows consecutive rows.
  static constexpr double kSpeedupRatio = 1.5;
  static constexpr int kSpeedupRows = 3;
  // How far a report (or a hello's reported_iteration) may be past the job's
  // reference progress (the median of the ranks' newest iterations) once
  // there is one: one forged report must not move a rank or the job out of
  // reach. A whole job resuming from a later checkpoint stays within it.
  static constexpr uint64_t kMaxIterationJump = 1'000'000;
  // How far a hello's claimed membership version may be past the newest
  // version here (a daemon restarted without its state database knows none).
  static constexpr uint64_t kMaxVersionJump = uint64_t{1} << 20;
  // The collective layer's largest agreement_interval (straggler::
  // kMaxAgreementInterval in client_lib's collective.h): a version may take
  // effect up to lead + this past where the ranks are.
  static constexpr uint64_t kMaxAgreementInterval = 1024;

  // world_size must be > 0 and policy valid (checked by the caller with
  // PolicyConfig::Validate; the constructor asserts).
  JobEngine(uint32_t world_size, PolicyConfig policy, Time now);
  ~JobEngine();
  JobEngine(const JobEngine&) = delete;
  JobEngine& operator=(const JobEngine&) = delete;

  // Takes one report. Idempotent: a (rank, iteration) already taken is
  // rejected as kDuplicate and changes nothing.
  IngestResult Ingest(const Report& report, Time now);

  // Between BeginBatch and EndBatch (one ReportBatch), the excluded set is
  // decided once, at EndBatch, from the state after every report of the
  // batch: a replayed backlog may take a rank through recovery and relapse
  // within one batch, and publishing a version for each of those states
  // would make the job switch sets back and forth for nothing. Other calls
  // (Tick, SetOverride, ...) must not come in between.
  void BeginBatch();
  void EndBatch(Time now);

  // Marks ranks that have not reported for unresponsive_after_seconds
  // (ranks that never reported: since the job started or they were announced).
  void Tick(Time now);

  // A stream says it speaks for `rank`: rows wait for its reports from now
  // on, and the rank can hear new versions (docs/membership.md, "The
  // membership gate"). A lost job (Lose) resumes.
  void Announce(uint32_t rank, Time now);

  // No stream speaks for `rank` any more (its last one ended): a change of
  // the excluded set now waits for it (docs/membership.md, "The membership
  // gate"). Its next Announce or report ends that.
  void Detach(uint32_t rank);

  // A new client incarnation speaks for `rank` (a restarted trainer,
  // typically from a checkpoint): its iterations start over, so its next
  // report may be below the ones it sent before. Nothing else changes.
  void Restart(uint32_t rank);

  // The rank's trainer closed cleanly (docs/detection.md, "Finished"): rows
  // stop waiting for it, it never turns unresponsive. Emits a state change.
  // No effect on a rank that never reported or already finished.
  void Finish(uint32_t rank, Time now);

  // Every rank finished (JobView.finished).
  bool Finished() const;

  // The daemon saw no stream and no report of the job for its bound
  // (limits.job_lost_after_seconds): the run ended unexpectedly (docs/runs.md,
  // "Job end"). Emits one kJobLost event carrying `why`; from then on Tick
  // changes nothing and the job counts as ended. The next Announce (a stream
  // speaks for a rank again) resumes it: the same run and lineage, its ranks
  // healthy again as they report. No effect on a job that already ended.
  void Lose(Time now, std::string why);
  bool Lost() const;
  // Finished() or Lost(): the run ended. An ended job has no current
  // exclusion: View() counts nobody excluded and nothing withheld, Worker()
  // shows no rank excluded. membership() and its history keep the versions
  // published (what the ranks held when they ended).
  bool Ended() const;

  // Starts the job over as a new engine would (no progress, no states, no
  // rows, no threshold), keeping the policy, the epoch length, the rank
  // overrides and which ranks are attached: a whole job restarted from a
  // checkpoint (docs/runs.md). The membership history is replaced by one
  // version, `first_version`, in force from iteration 0 with only the forced
  // ranks excluded; `first_version` must be above every version published,
  // so no client mistakes it for one it holds.
  void StartOver(uint64_t first_version, Time now);

  // Replaces the policy (validated). Counters and states are kept; the
  // threshold is re-profiled when the judging rule changed.
  absl::Status SetPolicy(const PolicyConfig& policy, Time now);
  const PolicyConfig& policy() const;

  absl::Status SetOverride(uint32_t rank, RankOverride override, std::string reason, Time now);

  // Forgets all per-rank state (which streams speak for which ranks is not
  // state) and publishes a membership with every rank included (as a new,
  // higher version, in force from the ranks' progress + lead even when an
  // earlier version was put implausibly far ahead: those are dropped) -
  // through the membership gate: while a rank no stream speaks for would
  // have to hear of it, the release is withheld instead.
  void Reset(Time now);

  // A client already holds membership `held` (from an earlier daemon
  // incarnation; version, effective_iteration and excluded are read). When
  // that is not below the newest version here, publishes a new version above
  // it taking effect after held.effective_iteration (and after what
  // NoteReportedIteration said), so versions keep growing across daemon
  // restarts and clients do not ignore this daemon's versions. Its excluded
  // set: this engine's newest one, or, while the engine has published
  // nothing (version 0: a restart without a state database), held.excluded,
  // taken over as RestoreMembership takes a stored set - the set the ranks
  // apply, so a rank that switches to the new version at another moment than
  // its peers still agrees with them on who takes part. `held` comes from a
  // client (no token needed), so it never sets an override: a rank it names
  // as forced out is held as a straggler and released by its reports.
  void AdoptVersionFloor(const Membership& held, Time now);

  // Whether a hello's claims are plausible against what this engine has
  // seen (docs/runs.md, "What a hello may claim"): `reported` at most
  // kMaxIterationJump past the reference progress once reports exist;
  // `held` (version 0 = none) at most kMaxVersionJump past the newest
  // version and taking effect at most lead + kMaxAgreementInterval past
  // max(reference progress, reported as NoteReportedIteration takes it).
  // INVALID_ARGUMENT names the value.
  absl::Status CheckClaims(const Membership& held, std::optional<uint64_t> reported) const;

  // A stream's claimed reported_iteration turned out false (its first
  // reports are more than kMaxIterationJump below it): forgets every hello's
  // reported_iteration and, when the newest version takes effect beyond
  // plausibility, rebases (see Reset). Returns whether anything changed.
  bool DropClaims(Time now);

  // A stream's hello says its ranks have reported up to `iteration`. Every
  // version published from now on takes effect after iteration + 1 + lead: a
  // rank not heard from yet may be one step further (ranks of a synchronous
  // job are at most one step apart) and hold certainty from an earlier
  // daemon up to lead iterations beyond that. Once the job has reports, the
  // floor is taken only up to the reference progress + kMaxAgreementInterval
  // - 1 (so no version takes effect more than lead + kMaxAgreementInterval
  // past where the ranks are); before any, as said (a daemon restarted
  // without its state database takes the job over from the hellos). Returns
  // the iteration taken: `iteration`, less when it was bounded, nullopt when
  // ignored (2^62 and above). Call before AdoptVersionFloor.
  std::optional<uint64_t> NoteReportedIteration(uint64_t iteration);

  // A daemon restarting from its state database: `m` is the newest version
  // an earlier daemon published, `overrides` the operators' rank overrides.
  // Call on a new engine, before any report. Sets the overrides and publishes
  // version m.version + 1 with m's excluded set, in force from
  // m.effective_iteration + 1: the same ranks clients already leave out, so
  // where a client is when it applies it cannot matter. Ranks m excluded as
  // stragglers (or at probation's end) become stragglers with a full counter
  // and unresponsive ones unresponsive, so they stay out until their own
  // reports show recovery, and are released, as always, by a version in force
  // after the progress the engine has then seen. Forced ones stay forced
  // when `overrides` force them out; a forced one without that override
  // (cleared while its release was withheld) is held as a straggler.
  // Excluded ranks >= world_size are dropped.
  void RestoreMembership(const Membership& m,
                         const std::vector<std::pair<uint32_t, RankOverride>>& overrides,
                         Time now);

  // The epoch length, when the trainer announces it (a hello). The first
  // announcement decides, for the engine's life (StartOver keeps it): a
  // hello needs no token, and a later one must not change how the job is
  // judged (2^64-1 would raise a limit_fraction limit out of reach). Returns
  // false, changing nothing, for a later announcement that differs; 0 is
  // none.
  bool SetIterationsPerEpoch(uint64_t iterations);

  // The rank's place in the job, from its hello (docs/topology.md). Changes
  // only with a new incarnation; the engine re-files the rank under its new
  // group (its own-baseline profile starts over). Every rank starts in the
  // default group, a replica of its own, model unknown. Reset and StartOver
  // keep it (it is the job's shape, not state). `rank` < world_size; a
  // replica is < world_size too (2^32 - 1 reads back as none).
  void SetTopology(uint32_t rank, const RankTopology& topology);
  RankTopology Topology(uint32_t rank) const;

  // Whether `rank`'s client acts on membership, from its hello
  // (StreamHello.monitor_only_ranks; docs/membership.md, "Monitoring only").
  // A monitor-only rank keeps taking part in the job's collectives whatever
  // a version says, so it is never put in an excluded set for its state
  // (an operator's force-exclude still applies), no guard is reported for
  // it, and its reports are judged in the rows with its peers. A rank that
  // becomes monitor-only while excluded is released by the next version;
  // one whose client starts acting on membership is judged for exclusion
  // as any rank from then on. Every rank starts acting on membership;
  // Reset and StartOver keep the flag (it is the client's, not state).
  // `rank` < world_size.
  void SetMonitorOnly(uint32_t rank, bool monitor_only, Time now);

  // Newest membership, and the kept history (ascending by version; the last
  // element is membership()).
  const Membership& membership() const;
  const std::deque<Membership>& membership_history() const;
  // Versions a rank that has reached `iteration` may still need: the newest
  // one with effective_iteration <= iteration, and every later one.
  std::vector<Membership> MembershipsFrom(uint64_t iteration) const;

  // Highest iteration of `rank` that was processed (accepted or rejected as
  // duplicate/stale); nullopt before its first report. A report far ahead
  // of the job (docs/detection.md, "Far ahead") does not count until the
  // rank's reports catch up: clients judge certainty by this progress, so a
  // forged one must not give it to them early (docs/runs.md).
  std::optional<uint64_t> Progress(uint32_t rank) const;

  // Events since the last call, oldest first.
  std::vector<Event> TakeEvents();

  // Tests and benchmarks: rows of at least `min_values` reports are judged
  // in slices of `per_report` verdicts per later report (0: never sliced).
  void SetRowSlicing(uint32_t min_values, uint32_t per_report);

  uint32_t world_size() const;
  WorkerView Worker(uint32_t rank) const;  // rank < world_size
  // O(world_size): counts ranks by state.
  JobView View() const;
  // View()'s baseline_seconds and step_seconds, in O(1): what the ingest
  // path's report ring records with each report (View() per batch walked a
  // million-rank job's ranks sixteen times a second and took half the
  // daemon's time).
  double baseline_seconds() const;
  double step_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace straggler::engine
