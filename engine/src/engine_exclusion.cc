// The excluded set (docs/detection.md, "Exclusion" and "Membership gate"):
// Evaluate takes a snapshot of the ranks, plans the set with the guards
// (exclusion_planner.h, pure), emits one guard event per withheld episode,
// and publishes a changed set through the membership gate.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine_impl.h"
#include "events.h"

namespace straggler::engine::internal {

// Decides the excluded set now, or at EndBatch while a batch is open: a
// batch (an agent's replayed backlog after a daemon restart) may walk a rank
// through recovery and relapse in one go, and the job must see one version
// for where it ended, not one per state it passed through.
void EngineImpl::Evaluate(Time now) {
  if (batch_open) {
    batch_evaluate = true;
    return;
  }
  EvaluateNow(now);
}

void EngineImpl::EvaluateNow(Time now) {
  dirty = false;
  // A version put implausibly far ahead (a hostile hello before the bounds,
  // a damaged database) must not hold every later change there.
  if (have_highest) Rebase(now, "the newest version took effect implausibly far ahead");
  ExclusionPlan plan = PlanExclusion(policy, Snapshot());
  EmitGuardEvents(plan, now);
  GateAndPublish(std::move(plan.excluded), now);
}

const PlanInput& EngineImpl::Snapshot() {
  PlanInput& in = plan_input;
  in.ranks.resize(world_size);
  for (uint32_t i = 0; i < world_size; ++i) {
    const RankState& r = ranks[i];
    in.ranks[i] = {r.state, r.override, r.on_probation, r.probation_failed, r.ewma, r.counter};
  }
  in.current = Newest().excluded;
  in.iteration = highest_active;
  in.baseline = baseline;
  in.limit = Limit();
  return in;
}

// One kGuardBlocked event per rank and episode (until it is no longer
// withheld by a guard).
void EngineImpl::EmitGuardEvents(const ExclusionPlan& plan, Time now) {
  blocked = static_cast<uint32_t>(plan.blocked.size());
  size_t next = 0;  // plan.blocked is ascending
  for (uint32_t i = 0; i < world_size; ++i) {
    RankState& r = ranks[i];
    const bool blocked_now = next < plan.blocked.size() && plan.blocked[next] == i;
    if (!blocked_now) {
      r.guard_blocked = false;
      continue;
    }
    next++;
    if (r.guard_blocked) continue;
    r.guard_blocked = true;
    guard_blocks_total++;
    Emit(RankEvent(EventKind::kGuardBlocked, now, i, r.state, r.state, r.last_iteration,
                   Newest().version,
                   absl::StrCat("exclusion of rank ", i, " withheld: ", plan.blocked_why)))
        .evidence = MakeEvidence(r, r.last_compute);
  }
}

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

}  // namespace straggler::engine::internal
