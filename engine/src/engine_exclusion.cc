// The excluded set (docs/detection.md, "Exclusion and its guards"):
// Evaluate takes a snapshot of the ranks, plans the set with the guards
// (exclusion_planner.h, pure), emits one guard event per withheld episode,
// and hands a changed set to the membership gate (engine_membership.cc).
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine_impl.h"
#include "events.h"

namespace straggler::engine::internal {

// Decides the excluded set now, or at EndBatch while a batch is open: a
// batch (an agent's replayed backlog after a daemon restart) may walk a rank
// through recovery and relapse in one go, and the job must see one version
// for where it ended, not one per state it passed through.
void EngineImpl::Evaluate(Time now) {
  if (sliced.active) {  // planned once the row's verdicts are all in (ContinueRow)
    sliced.evaluate = true;
    return;
  }
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
  // The declared replica makes the exclusion unit (docs/topology.md). The
  // replicas, group names and their layout change only with the topology:
  // copied and laid out again only then, not at every plan.
  const bool relayout = !plan_topology || *plan_topology != topology_version || in.ranks.size() != world_size;
  in.ranks.resize(world_size);
  for (uint32_t i = 0; i < world_size; ++i) {
    const RankState& r = ranks[i];
    RankSnapshot& s = in.ranks[i];
    s.state = r.state;
    s.override = r.override;
    s.on_probation = r.on_probation;
    s.probation_failed = r.probation_failed;
    s.ewma = r.ewma;
    s.counter = r.counter;
    s.monitor_only = monitor_only[i];
    if (relayout) {
      s.replica = topology.Replica(i);
      s.peer_group = topology.PeerGroup(i);
    }
  }
  if (relayout) {
    plan_layout = LayoutReplicas(in.ranks);
    plan_topology = topology_version;
  }
  in.layout = &plan_layout;
  in.current = Newest().excluded;
  in.iteration = highest_active;
  in.baseline = baseline;
  in.limit = Limit();
  return in;
}

// One kGuardBlocked event per rank and episode (until it is no longer
// withheld by a guard). Not for an unresponsive rank while no rank with a
// stream is training: then the whole job is silent (killed, or a restarted
// daemon that no stream has reached yet), leaving it out would help no rank,
// and a job of N killed ranks would log up to N events and fire
// ExclusionGuardReached for a job that is simply gone (issue 28). Its
// event comes at the first evaluation once some rank trains again.
void EngineImpl::EmitGuardEvents(const ExclusionPlan& plan, Time now) {
  blocked = static_cast<uint32_t>(plan.blocked.size());
  // Asked only when a blocked rank is unresponsive (a pass over the ranks).
  std::optional<bool> training;
  auto any_training = [&] {
    if (!training) {
      training = std::any_of(ranks.begin(), ranks.end(), [](const RankState& r) {
        return r.attached &&
               (r.state == WorkerState::kHealthy || r.state == WorkerState::kMild ||
                r.state == WorkerState::kStraggler);
      });
    }
    return *training;
  };
  size_t next = 0;  // plan.blocked is ascending
  for (uint32_t i = 0; i < world_size; ++i) {
    RankState& r = ranks[i];
    bool blocked_now = next < plan.blocked.size() && plan.blocked[next] == i;
    if (blocked_now) next++;
    if (blocked_now && r.state == WorkerState::kUnresponsive && !any_training())
      blocked_now = false;
    if (!blocked_now) {
      r.guard_blocked = false;
      continue;
    }
    if (r.guard_blocked) continue;
    r.guard_blocked = true;
    guard_blocks_total++;
    // In a hybrid job the culprit's whole replica is what was withheld.
    const RankSnapshot& snap = plan_input.ranks[i];
    std::string what = absl::StrCat("rank ", i);
    if (snap.replica) {
      what = absl::StrCat("replica ", *snap.replica, " for rank ", i,
                          snap.peer_group.empty() ? "" : " (group " + snap.peer_group + ")");
    }
    Emit(RankEvent(EventKind::kGuardBlocked, now, i, r.state, r.state, r.last_iteration,
                   Newest().version,
                   absl::StrCat("exclusion of ", what, " withheld: ", plan.blocked_why)))
        .evidence = MakeEvidence(r, r.last_compute);
  }
}

}  // namespace straggler::engine::internal
