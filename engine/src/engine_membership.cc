// The membership log's rules (docs/membership.md, docs/runs.md "What a hello
// may claim"): the membership gate, publishing a version, rebasing a lineage
// put implausibly far ahead, taking over a set an earlier daemon published
// (a client's hello or the state database), and the bounds on a hello's
// claims.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine_impl.h"
#include "events.h"

namespace straggler::engine {
namespace internal {

// Publishes `next` if the excluded set changed - and only once every rank
// that must act on the change can hear of it (the membership gate):
//   * every rank active in the new version (it must take part from the
//     switch iteration on, and a readmitted one must stop its shadow steps
//     there);
//   * every rank the change excludes, unless it is unresponsive (it would
//     otherwise keep issuing collectives on the old membership).
// A rank no stream speaks for cannot fetch the version before its
// collective; when it reaches the switch iteration it keeps the last
// membership it applied while the others would switch (a daemon restarted
// while a rank is still in its reconnect backoff). The collective layer's
// in-band agreement then holds the whole group on the old membership until
// that rank is certain again; a consumer of the switch rule without it
// (straggler-sim's model, a trainer's own collective) would split. So the
// change waits: until the rank is back (Announce or a report), or until Tick
// marks it unresponsive, when the change may exclude it too. Unresponsive
// ranks are exempt as leavers only: a silent rank is the one case where
// waiting cannot help.
void EngineImpl::GateAndPublish(std::vector<ExcludedRank> next, Time now) {
  const Membership& cur = Newest();
  bool changed = cur.excluded.size() != next.size();
  uint64_t min_effective = 0;
  std::vector<uint32_t> unreachable;  // ranks the change must wait for
  // Both sets are ascending by rank: walk them together.
  auto was_it = cur.excluded.begin();
  auto is_it = next.begin();
  for (uint32_t i = 0; i < world_size; ++i) {
    const ExcludedRank* was =
        was_it != cur.excluded.end() && was_it->rank == i ? &*was_it++ : nullptr;
    const ExcludedRank* is = is_it != next.end() && is_it->rank == i ? &*is_it++ : nullptr;
    if ((was == nullptr) != (is == nullptr) || (was && is && was->reason != is->reason))
      changed = true;
    const RankState& r = ranks[i];
    if (!r.attached && (!is || (!was && r.state != WorkerState::kUnresponsive)))
      unreachable.push_back(i);
    // A rank coming back may have run ahead of the group while excluded (it
    // waits on no collective). It must not be expected at an iteration it has
    // passed, nor at one it may already be certain of under the old version:
    // a rank is certain of iteration i once its report of i - lead + 1 is
    // acknowledged (IsCertain in membership_history.h).
    if (was && !is && r.has_progress)
      min_effective = std::max(min_effective, r.last_iteration + Lead());
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
Event EngineImpl::WithheldEvent(const std::vector<uint32_t>& unreachable,
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
  const uint32_t rank = unreachable.front();
  return RankEvent(EventKind::kMembershipWithheld, now, rank, ranks[rank].state,
                   ranks[rank].state, Highest(), Newest().version,
                   absl::StrCat("membership change withheld (would exclude [", list,
                                "]): no stream speaks for rank",
                                unreachable.size() > 1 ? "s " : " ", waiting,
                                "; it goes out when they reconnect or turn unresponsive"));
}

// The lead the next version must keep. Clients judge certainty with the lead
// of the newest version they hold: a lowered lead may only be used once a
// version carrying it is out.
uint64_t EngineImpl::Lead() const {
  return std::max<uint64_t>(policy.lead_iterations, Newest().lead_iterations);
}

// The job's progress as a forger of a minority of ranks cannot move it: the
// upper median of the newest iterations of the ranks that reported (the
// highest, then the rest only when it is far past the row progress, so the
// common case costs one comparison). nullopt before any report.
std::optional<uint64_t> EngineImpl::ReferenceIteration() const {
  if (top_stale) {
    top_reached = 0;
    top_any = false;
    for (const auto& r : ranks) {
      if (!r.has_progress) continue;
      top_any = true;
      top_reached = std::max(top_reached, r.Reached());
    }
    top_stale = false;
  }
  if (!top_any) return std::nullopt;
  const uint64_t top = top_reached;
  if (!have_highest || top <= highest_active + kMaxRowSpan) return top;
  std::vector<uint64_t> its;
  for (const auto& r : ranks)
    if (r.has_progress) its.push_back(r.Reached());
  std::nth_element(its.begin(), its.begin() + its.size() / 2, its.end());
  return its[its.size() / 2];
}

// The latest iteration a version may plausibly take effect at: the job's
// progress (or `floor`) + lead + the collective's agreement interval.
uint64_t EngineImpl::PlausibleEffective(uint64_t floor) const {
  const uint64_t base = std::max(ReferenceIteration().value_or(0), floor);
  return base + Lead() + JobEngine::kMaxAgreementInterval;
}

// The highest reported_iteration a hello's floor may hold once the job has
// reports (a live job): versions then take effect at most lead +
// kMaxAgreementInterval past the job's progress (Publish puts them after the
// floor + 1 + lead), as far as a known_effective_iteration may put them and
// no further than Rebase keeps. A client of a live job reconnecting is where
// its peers are; a claim further ahead would hold every later version there
// (issue 28: progress + 10 000 froze a job's exclusions). nullopt before any
// report: a new job, or a daemon restarted without its state database,
// whose floor only hellos can tell.
std::optional<uint64_t> EngineImpl::ReportedBound() const {
  const std::optional<uint64_t> ref = ReferenceIteration();
  if (!ref) return std::nullopt;
  return *ref + JobEngine::kMaxAgreementInterval - 1;
}

// Drops the versions that take effect beyond PlausibleEffective (a floor a
// hello or a damaged database put there) and publishes the newest excluded
// set again above every version, in force from the ranks' progress + lead.
// Returns whether it did.
bool EngineImpl::Rebase(Time now, const std::string& why) {
  // A hello's reported_iteration far past the reports: nobody is there.
  if (const auto ref = ReferenceIteration();
      ref && hello_reported && *hello_reported > *ref + JobEngine::kMaxIterationJump) {
    hello_reported.reset();
  }
  const uint64_t limit = PlausibleEffective(0);
  if (Newest().effective_iteration <= limit) return false;
  const uint64_t top = Newest().version;
  std::vector<ExcludedRank> excluded = Newest().excluded;
  log.DropBeyond(limit);
  Publish(std::move(excluded), now, why, 0, top + 1);
  return true;
}

namespace {

// "3 (straggler), 9 (forced)"; a replica excluded whole (docs/topology.md)
// as "replica 1 [4, 5, 6, 7] for rank 6 (group stage2, straggler)".
std::string ExcludedList(const std::vector<ExcludedRank>& excluded) {
  std::string list;
  std::vector<bool> done(excluded.size(), false);
  for (size_t k = 0; k < excluded.size(); ++k) {
    if (done[k]) continue;
    const ExcludedRank& x = excluded[k];
    if (!list.empty()) list += ", ";
    if (!x.replica || !x.culprit) {
      absl::StrAppend(&list, x.rank, " (", std::string(ExclusionReasonName(x.reason)), ")");
      continue;
    }
    std::string ranks;
    std::string reason(ExclusionReasonName(x.reason));
    for (size_t j = k; j < excluded.size(); ++j) {
      const ExcludedRank& y = excluded[j];
      if (y.replica != x.replica) continue;
      done[j] = true;
      absl::StrAppend(&ranks, ranks.empty() ? "" : ", ", y.rank);
      if (y.culprit == y.rank && y.rank == *x.culprit)
        reason = std::string(ExclusionReasonName(y.reason));
    }
    absl::StrAppend(&list, "replica ", *x.replica, " [", ranks, "] for rank ", *x.culprit, " (",
                    x.culprit_group.empty() ? "" : absl::StrCat("group ", x.culprit_group, ", "),
                    reason, ")");
  }
  return list;
}

}  // namespace

// `min_effective`: the new version may not take effect before this
// iteration (a re-included rank that ran ahead; a floor from a client).
// `min_version`: nor be numbered below it.
void EngineImpl::Publish(std::vector<ExcludedRank> excluded, Time now, std::string why,
                         uint64_t min_effective, uint64_t min_version) {
  const Membership& cur = Newest();
  Version v;
  v.m.version = std::max(cur.version + 1, min_version);
  uint64_t progress = Highest();
  // A hello speaks for its own ranks only; a rank of the job not heard from
  // yet may have reported one iteration more (a synchronous job's ranks are
  // at most one step apart) and, from an earlier daemon, hold certainty up
  // to lead iterations beyond that.
  if (hello_reported) progress = std::max(progress, *hello_reported + 1);
  v.m.effective_iteration =
      std::max({progress + Lead(), cur.effective_iteration + 1, min_effective});
  v.m.excluded = std::move(excluded);
  v.m.world_size = world_size;
  v.m.lead_iterations = policy.lead_iterations;
  v.m.created_at = now;
  for (const auto& e : v.m.excluded)
    if (ranks[e.rank].counted) v.excluded_counted++;
  const std::string list = ExcludedList(v.m.excluded);
  const uint64_t version = v.m.version, effective = v.m.effective_iteration;
  log.Push(std::move(v));
  Emit(JobEvent(EventKind::kMembership, now, effective, version,
                absl::StrCat(why, ": excluded [", list, "] from iteration ", effective)));
}

// An earlier daemon's excluded set, taken over by a new engine: ranks out as
// stragglers (or at probation's end) become stragglers with a full counter
// and unresponsive ones unresponsive, so they stay out until their own
// reports show recovery. A forced one stays forced only when its
// ForceExclude override is already set (restored from the state database by
// RestoreMembership); otherwise it is held like a straggler. The set may
// come from a hello, which any ingest client can send without a token:
// creating an override from it would let such a client force a rank out for
// good, an operator's power. Ranks >= world_size are dropped. Returns the
// set, ascending by rank, one entry per rank. Their unresponsive clock
// starts at `now` (they have not reported to this engine; without it they
// would be silent since 1970 at the first Tick).
std::vector<ExcludedRank> EngineImpl::TakeOverExcluded(const std::vector<ExcludedRank>& held,
                                                       Time now) {
  std::vector<ExcludedRank> excluded;
  for (const ExcludedRank& e : held) {
    if (e.rank >= world_size) continue;
    RankState& r = ranks[e.rank];
    ExcludedRank kept = e;
    switch (e.reason) {
      case ExclusionReason::kForced:
        if (r.override == RankOverride::kForceExclude) break;
        // No override here to keep it forced (Evaluate would release a forced
        // entry without one at once): still out, so the ranks that apply the
        // held set keep agreeing, but as a straggler, released when its own
        // (shadow) reports show recovery. Overrides survive a restart only
        // through the state database.
        kept.reason = ExclusionReason::kStraggler;
        kept.detail = "forced out under an earlier daemon, no override restored: held as a "
                      "straggler until its reports show recovery";
        [[fallthrough]];
      case ExclusionReason::kStraggler:
      case ExclusionReason::kProbationEnd:
        r.state = WorkerState::kStraggler;
        r.counter = Limit();
        if (r.last_report_time < now) r.last_report_time = now;
        NoteSeen(r.last_report_time);
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

}  // namespace internal

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
  // bounded above, or refused), the claim is compared, not added to. The
  // floor as NoteReportedIteration will take it.
  uint64_t floor = reported ? std::min(*reported, internal::kAbsurd) : 0;
  if (const std::optional<uint64_t> bound = d.ReportedBound()) floor = std::min(floor, *bound);
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
  d.FinishRow();
  const bool had = d.hello_reported.has_value();
  d.hello_reported.reset();
  const bool rebased = d.Rebase(now, "a hello's claims were false: rebased on the reports");
  return had || rebased;
}

std::optional<uint64_t> JobEngine::NoteReportedIteration(uint64_t iteration) {
  Impl& d = *impl_;
  d.FinishRow();
  if (iteration >= internal::kAbsurd) return std::nullopt;
  if (const std::optional<uint64_t> bound = d.ReportedBound())
    iteration = std::min(iteration, *bound);
  if (!d.hello_reported || *d.hello_reported < iteration) d.hello_reported = iteration;
  return iteration;
}

void JobEngine::AdoptVersionFloor(const Membership& held, Time now) {
  Impl& d = *impl_;
  d.FinishRow();
  if (held.version < d.Newest().version) return;
  if (held.version >= internal::kAbsurd || held.effective_iteration >= internal::kAbsurd) return;
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
  d.FinishRow();
  if (m.version >= internal::kAbsurd || m.effective_iteration >= internal::kAbsurd) return;
  for (const auto& [rank, o] : overrides)
    if (rank < d.world_size) d.ranks[rank].override = o;
  std::vector<ExcludedRank> excluded = d.TakeOverExcluded(m.excluded, now);
  d.Publish(std::move(excluded), now,
            absl::StrCat("restored version ", m.version, " from the state database"),
            m.effective_iteration + 1, m.version + 1);
}

const Membership& JobEngine::membership() const { return impl_->Newest(); }

const std::deque<Membership>& JobEngine::membership_history() const {
  return impl_->log.history();
}

std::vector<Membership> JobEngine::MembershipsFrom(uint64_t iteration) const {
  return impl_->log.From(iteration);
}

}  // namespace straggler::engine
