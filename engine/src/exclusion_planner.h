// Exclusion planning: which ranks the job should leave out, given a snapshot
// of its ranks and the policy - the guards of docs/detection.md
// ("Exclusion"): overrides, capacity (max_excluded_fraction,
// min_active_ranks, min_active_replicas) and the predicted throughput gain.
// The unit of exclusion is the data-parallel replica (docs/topology.md): a
// partial all-reduce can only leave out whole replicas, so when any rank of
// a replica is a candidate (the culprit) the plan takes out every rank of it,
// and the guards count replicas. A rank that declared no replica is a
// replica of its own, so a pure data-parallel job plans exactly per rank;
// until it declares one, a rank in the current set belongs to the replica its
// entry names (a set restored by a restarted daemon, docs/hybrid.md).
// A pure function: no engine, no events, no clock; the engine turns the plan
// into guard events and, through the membership gate, into a version
// (engine_exclusion.cc).
// Thread safety: stateless; safe to call from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"

namespace straggler::engine::internal {

// What the planner needs to know of one rank.
struct RankSnapshot {
  WorkerState state = WorkerState::kPending;
  RankOverride override = RankOverride::kNone;
  bool on_probation = false;     // re-included for probation: not a candidate
  bool probation_failed = false;  // still slow when its probation ended
  double ewma = 0.0;
  uint32_t counter = 0;
  // Its client does not act on membership: it takes part whatever a
  // version says, so neither it nor its replica is a candidate.
  bool monitor_only = false;
  std::optional<uint32_t> replica = std::nullopt;  // declared; unset = a replica of its own
  std::string peer_group = {};  // declared, for naming a culprit
};

// How the ranks group into replicas, the units of exclusion: it depends on
// the declared replicas only, so the engine keeps one until the topology
// changes instead of grouping the world at every plan.
struct ReplicaLayout {
  // Every rank, grouped by replica (ascending within one); replica u holds
  // members[begin[u], begin[u + 1]). Replicas in order of their lowest rank.
  std::vector<uint32_t> members;
  std::vector<uint32_t> begin;
  bool hybrid = false;  // some replica has several ranks
  size_t size() const { return begin.empty() ? 0 : begin.size() - 1; }
};
// `current` (per rank, its entry in the newest excluded set or null): a rank
// with no declared replica is grouped by its entry's replica (restored after
// a daemon restart, before its hello).
ReplicaLayout LayoutReplicas(std::span<const RankSnapshot> ranks,
                             const std::vector<const ExcludedRank*>* current = nullptr);

struct PlanInput {
  std::vector<RankSnapshot> ranks;    // one per rank, index = rank
  // LayoutReplicas(ranks), when the caller keeps one (it must outlive the
  // PlanExclusion call); null: PlanExclusion lays the replicas out itself.
  const ReplicaLayout* layout = nullptr;
  // The newest version's excluded set, ascending; a view (it must outlive
  // the PlanExclusion call).
  std::span<const ExcludedRank> current;
  uint64_t iteration = 0;             // "since" of a newly excluded rank
  double baseline = 0.0;              // for the straggler detail; 0 = none yet
  uint32_t limit = 0;                 // the counter limit in force
};

// How many replicas (and ranks) may be out at once (docs/detection.md,
// "Exclusion"). In a pure data-parallel job replicas are ranks.
struct Capacity {
  uint32_t world_size = 0;
  uint32_t replicas = 0;
  uint32_t max_excluded = 0;  // floor(max_excluded_fraction x replicas)
  uint32_t min_active = 0;    // ranks
  uint32_t min_active_replicas = 0;
  bool hybrid = false;        // some replica has several ranks: messages say "replicas"

  // A pure data-parallel job: replicas = world_size, hybrid false.
  Capacity(const PolicyConfig& policy, uint32_t world_size, uint32_t replicas, bool hybrid);
  // Whether one more replica of `size` ranks may be excluded when
  // `excluded` replicas of `excluded_ranks` ranks in all already are.
  bool Room(uint32_t excluded, uint32_t excluded_ranks, uint32_t size) const;
  // Why not, for a guard event ("" when there is room).
  std::string Why(uint32_t excluded, uint32_t excluded_ranks, uint32_t size) const;
};

struct ExclusionPlan {
  std::vector<ExcludedRank> excluded;  // the wanted set, ascending by rank
  // Culprits a guard keeps in (with their replicas), ascending by rank, and
  // why (one reason for the whole plan: the capacity left once every
  // admitted replica is out, else the throughput guard).
  std::vector<uint32_t> blocked;
  std::string blocked_why;
};

// Per replica: one with a forced-out rank is always out (a forced-in mate
// cannot keep it in: the collective cannot split it), one with a forced-in
// or a monitor-only rank otherwise never (a rank whose client does not act
// on membership keeps taking part, and its replica with it: no guard event
// either); with exclusion disabled only forced ones are.
// Otherwise unresponsive and straggler ranks are culprits, and their
// replicas candidates; an excluded replica with a culprit stays out (keeping
// its entries) and one without is readmitted. New unresponsive candidates go
// first while capacity allows, then the largest slowest-first set of
// straggler candidates that fits and is predicted to raise throughput by
// min_throughput_gain. A culprit gets its own reason; its mates
// kReplica naming it. Entries of ranks that declared a replica carry
// culprit, culprit_group and replica.
ExclusionPlan PlanExclusion(const PolicyConfig& policy, const PlanInput& in);

}  // namespace straggler::engine::internal
