#include "exclusion_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace straggler::engine::internal {

Capacity::Capacity(const PolicyConfig& policy, uint32_t world, uint32_t replica_count,
                   bool is_hybrid)
    : world_size(world),
      replicas(replica_count),
      max_excluded(static_cast<uint32_t>(
          std::floor(policy.max_excluded_fraction * static_cast<double>(replica_count) + 1e-9))),
      min_active(policy.min_active_ranks),
      min_active_replicas(policy.min_active_replicas),
      hybrid(is_hybrid) {}

bool Capacity::Room(uint32_t excluded, uint32_t excluded_ranks, uint32_t size) const {
  return excluded + 1 <= max_excluded && world_size - excluded_ranks >= size &&
         world_size - excluded_ranks - size >= min_active &&
         replicas - excluded - 1 >= min_active_replicas;
}

std::string Capacity::Why(uint32_t excluded, uint32_t excluded_ranks, uint32_t size) const {
  if (excluded + 1 > max_excluded) {
    if (hybrid)
      return absl::StrCat("max_excluded_fraction allows ", max_excluded, " of ", replicas,
                          " replicas");
    return absl::StrCat("max_excluded_fraction allows ", max_excluded);
  }
  if (world_size - excluded_ranks < size || world_size - excluded_ranks - size < min_active)
    return absl::StrCat("min_active_ranks is ", min_active);
  if (replicas - excluded - 1 < min_active_replicas)
    return absl::StrCat("min_active_replicas is ", min_active_replicas);
  return "";
}

namespace {

bool Live(const RankSnapshot& r) {
  return r.state != WorkerState::kPending && r.state != WorkerState::kUnresponsive &&
         r.state != WorkerState::kFinished;
}

std::string StragglerDetail(const RankSnapshot& r, const PlanInput& in) {
  if (in.baseline > 0)
    return absl::StrFormat("ewma %.6gs = %.2fx baseline %.6gs; counter %u/%u", r.ewma,
                           r.ewma / in.baseline, in.baseline, r.counter, in.limit);
  return absl::StrFormat("ewma %.6gs; counter %u/%u", r.ewma, r.counter, in.limit);
}

// One data-parallel replica: the ranks that leave the collective together.
struct Unit {
  std::span<const uint32_t> ranks;  // ascending; a view into ReplicaLayout::members
  std::vector<uint32_t> forced;     // forced out
  std::vector<uint32_t> culprits;   // unresponsive, then stragglers slowest first
  uint32_t unresponsive = 0;        // culprits[0, unresponsive) are unresponsive
  bool forced_in = false;
  bool monitor_only = false;        // a rank of it does not act on membership
  bool finished = false;            // a rank of it finished: the job is ending
  bool out_now = false;             // some rank of it is in the current set
  bool released = false;            // its current forced entry lost its override
  double slowest = 0;               // largest ewma among its straggler culprits
};

}  // namespace

namespace {

// A rank's replica: the declared one, or, for a rank that has not declared
// its replica (yet: a restarted daemon before its hello), the one its
// current entry names, so a restored culprit and its mates stay one unit
// until the hellos are in.
std::optional<uint32_t> ReplicaOf(std::span<const RankSnapshot> ranks,
                                  const std::vector<const ExcludedRank*>* current, uint32_t i) {
  if (ranks[i].replica || current == nullptr || (*current)[i] == nullptr) return ranks[i].replica;
  return (*current)[i]->replica;
}

}  // namespace

ReplicaLayout LayoutReplicas(std::span<const RankSnapshot> ranks,
                             const std::vector<const ExcludedRank*>* current) {
  const uint32_t world = static_cast<uint32_t>(ranks.size());
  ReplicaLayout out;
  out.begin.resize(world + 1);
  out.members.resize(world);
  bool any = false;
  for (uint32_t i = 0; i < world && !any; ++i) any = ReplicaOf(ranks, current, i).has_value();
  if (!any) {
    // Pure data parallelism: every rank a replica of its own.
    for (uint32_t i = 0; i <= world; ++i) out.begin[i] = i;
    for (uint32_t i = 0; i < world; ++i) out.members[i] = i;
    return out;
  }
  constexpr uint32_t kNone = UINT32_MAX;
  std::vector<uint32_t> unit_of(world), by_replica, size;
  for (uint32_t i = 0; i < world; ++i) {
    const std::optional<uint32_t> replica = ReplicaOf(ranks, current, i);
    if (replica) {
      // Declared replicas are below the world size (checked at the hello);
      // a larger one still groups correctly, only less cheaply.
      if (*replica >= by_replica.size()) by_replica.resize(std::max(*replica + 1, world), kNone);
      if (by_replica[*replica] == kNone) {
        by_replica[*replica] = static_cast<uint32_t>(size.size());
        size.push_back(0);
      }
      unit_of[i] = by_replica[*replica];
    } else {
      unit_of[i] = static_cast<uint32_t>(size.size());
      size.push_back(0);
    }
    size[unit_of[i]]++;
  }
  out.begin.resize(size.size() + 1);
  out.begin[0] = 0;
  for (size_t u = 0; u < size.size(); ++u) {
    out.begin[u + 1] = out.begin[u] + size[u];
    out.hybrid = out.hybrid || size[u] > 1;
  }
  std::vector<uint32_t> fill(out.begin.begin(), out.begin.end() - 1);
  for (uint32_t i = 0; i < world; ++i) out.members[fill[unit_of[i]]++] = i;
  return out;
}

namespace {

// The replicas of `layout` with this plan's facts about their ranks.
void Group(const PolicyConfig& policy, const PlanInput& in, const ReplicaLayout& layout,
           const std::vector<const ExcludedRank*>& current, std::vector<Unit>& units) {
  units.resize(layout.size());
  for (size_t u = 0; u < units.size(); ++u)
    units[u].ranks = std::span<const uint32_t>(layout.members.data() + layout.begin[u],
                                               layout.begin[u + 1] - layout.begin[u]);

  for (Unit& unit : units) {
    for (uint32_t i : unit.ranks) {
      const RankSnapshot& r = in.ranks[i];
      const ExcludedRank* ce = current[i];
      if (ce) unit.out_now = true;
      if (r.override == RankOverride::kForceExclude) {
        unit.forced.push_back(i);
        continue;
      }
      if (r.override == RankOverride::kForceInclude) {
        unit.forced_in = true;
        continue;
      }
      if (r.monitor_only) unit.monitor_only = true;
      if (ce && ce->reason == ExclusionReason::kForced) unit.released = true;
      if (r.state == WorkerState::kFinished) unit.finished = true;
      if (!policy.exclusion_enabled) continue;
      if (r.state == WorkerState::kUnresponsive) {
        unit.culprits.insert(unit.culprits.begin() + unit.unresponsive++, i);
      } else if (r.state == WorkerState::kStraggler && !r.on_probation) {
        unit.culprits.push_back(i);
        unit.slowest = std::max(unit.slowest, r.ewma);
      }
    }
    std::stable_sort(unit.culprits.begin() + unit.unresponsive, unit.culprits.end(),
                     [&](uint32_t a, uint32_t b) { return in.ranks[a].ewma > in.ranks[b].ewma; });
  }
}

// Throughput guard: how many of the `fit` slowest candidate replicas to
// exclude, the largest number for which the job is predicted to go faster
// without them: ((A-k)/T_without) / (A/T_with) - 1 >= min_throughput_gain,
// A the active replicas, T the largest ewma of a live rank among them with
// and without the k. A replica steps at its slowest rank's pace (a pipeline
// waits for its slowest stage), and the data-parallel all-reduce at the
// slowest replica's, so the job's step follows the slowest live rank.
size_t ThroughputTake(const PolicyConfig& policy, const PlanInput& in,
                      const std::vector<Unit>& units, const std::vector<bool>& out,
                      const std::vector<size_t>& candidates, size_t fit) {
  if (fit == 0) return 0;
  std::vector<bool> is_candidate(units.size(), false);
  for (size_t k = 0; k < fit; ++k) is_candidate[candidates[k]] = true;
  double t_with = 0, t_rest = 0;
  uint32_t active = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (out[u]) continue;
    bool live = false;
    for (uint32_t i : units[u].ranks) {
      if (!Live(in.ranks[i])) continue;
      live = true;
      t_with = std::max(t_with, in.ranks[i].ewma);
      if (!is_candidate[u]) t_rest = std::max(t_rest, in.ranks[i].ewma);
    }
    if (live) active++;
  }
  auto slowest_live = [&](size_t u) {
    double t = 0;
    for (uint32_t i : units[u].ranks)
      if (Live(in.ranks[i])) t = std::max(t, in.ranks[i].ewma);
    return t;
  };
  for (size_t k = fit; k > 0; --k) {
    // Without the k slowest candidates the slowest remaining is either in
    // the (k+1)-th candidate or the slowest non-candidate.
    double t_without = t_rest;
    if (k < fit) t_without = std::max(t_without, slowest_live(candidates[k]));
    if (active <= k || t_without <= 0 || t_with <= 0) continue;
    const double gain = ((active - k) / t_without) / (active / t_with) - 1.0;
    if (gain >= policy.min_throughput_gain) return k;
  }
  return 0;
}

// The units PlanExclusion decides on: the ranks grouped by replica, by the
// caller's layout, or by one of its own when a restored entry names a
// replica the caller's layout lacks, kept in `own` (the units' spans point
// into the layout: `own` must outlive them); *hybrid: whether the layout is.
std::vector<Unit> PlanUnits(const PolicyConfig& policy, const PlanInput& in,
                            std::vector<const ExcludedRank*>& current, ReplicaLayout& own,
                            bool* hybrid) {
  const uint32_t world = static_cast<uint32_t>(in.ranks.size());
  // The caller's layout holds declared replicas only; a restored entry of a
  // rank not declared yet (a restarted daemon) needs one of its own.
  bool restored = false;
  for (const auto& e : in.current)
    if (e.rank < world && e.replica && !in.ranks[e.rank].replica) restored = true;
  if (in.layout == nullptr || restored) own = LayoutReplicas(in.ranks, &current);
  const ReplicaLayout& layout = in.layout != nullptr && !restored ? *in.layout : own;
  std::vector<Unit> grouped;
  Group(policy, in, layout, current, grouped);
  *hybrid = layout.hybrid;
  return grouped;
}

// The entry of rank `i` of a unit forced out by an operator: a forced rank's
// own (kept while it stays forced), a mate's own reason when it is out for
// one, else none (the caller makes it a mate of the forced rank).
std::optional<ExcludedRank> ForcedEntry(const PlanInput& in, const Unit& unit,
                                        const std::vector<const ExcludedRank*>& current,
                                        uint32_t i) {
  if (std::find(unit.forced.begin(), unit.forced.end(), i) != unit.forced.end()) {
    if (current[i] && current[i]->reason == ExclusionReason::kForced) return *current[i];
    return ExcludedRank{i, ExclusionReason::kForced, "forced out by an operator", in.iteration};
  }
  // A mate still out for a reason of its own keeps it.
  if (current[i] && current[i]->reason != ExclusionReason::kForced &&
      current[i]->reason != ExclusionReason::kReplica)
    return *current[i];
  return std::nullopt;
}

// The entry of rank `i` of a unit taken out for its culprits: unresponsive,
// or a straggler (the end of probation for a rank that failed it); none for
// a rank that is not a culprit (a mate).
std::optional<ExcludedRank> CulpritEntry(const PolicyConfig& policy, const PlanInput& in,
                                         const Unit& unit, uint32_t i) {
  const auto at = std::find(unit.culprits.begin(), unit.culprits.end(), i);
  if (at == unit.culprits.end()) return std::nullopt;
  if (at - unit.culprits.begin() < unit.unresponsive)
    return ExcludedRank{i, ExclusionReason::kUnresponsive,
                        absl::StrFormat("no report for %.3gs", policy.unresponsive_after_seconds),
                        in.iteration};
  return ExcludedRank{i, in.ranks[i].probation_failed ? ExclusionReason::kProbationEnd
                                                      : ExclusionReason::kStraggler,
                      StragglerDetail(in.ranks[i], in), in.iteration};
}

}  // namespace

ExclusionPlan PlanExclusion(const PolicyConfig& policy, const PlanInput& in) {
  const uint32_t world = static_cast<uint32_t>(in.ranks.size());
  std::vector<const ExcludedRank*> current(world, nullptr);
  for (const auto& e : in.current)
    if (e.rank < world) current[e.rank] = &e;
  bool hybrid = false;
  ReplicaLayout own;
  const std::vector<Unit> units = PlanUnits(policy, in, current, own, &hybrid);

  // The entries of the ranks taken out (each rank once: a replica is taken
  // out at most once), sorted by rank at the end.
  std::vector<ExcludedRank> want;
  std::vector<bool> out(units.size(), false);
  uint32_t excluded = 0, excluded_ranks = 0;
  // Takes unit `u` out: each rank with the entry own_entry(i) gives (its
  // own reason: a culprit, a forced rank), the rest as mates of `culprit`.
  // `keep`: reuse the current entries first (a replica that stays out keeps
  // its since_iteration and detail).
  auto take_out = [&](size_t u, uint32_t culprit, bool keep, auto&& own_entry) {
    const Unit& unit = units[u];
    const RankSnapshot& c = in.ranks[culprit];
    for (uint32_t i : unit.ranks) {
      ExcludedRank e;
      if (keep && current[i]) {
        e = *current[i];
      } else if (auto own = own_entry(i)) {
        e = std::move(*own);
      } else {
        e = ExcludedRank{i, ExclusionReason::kReplica,
                         absl::StrCat("replica ", c.replica ? absl::StrCat(*c.replica) : "-",
                                      " with rank ", culprit,
                                      c.peer_group.empty() ? "" : " (group " + c.peer_group + ")"),
                         in.iteration};
      }
      if (in.ranks[i].replica) {
        const bool mate = e.reason == ExclusionReason::kReplica;
        e.culprit = mate ? culprit : i;
        e.culprit_group = mate ? c.peer_group : in.ranks[i].peer_group;
        e.replica = in.ranks[i].replica;
      }
      want.push_back(std::move(e));
    }
    out[u] = true;
    excluded++;
    excluded_ranks += static_cast<uint32_t>(unit.ranks.size());
  };
  const auto none = [](uint32_t) -> std::optional<ExcludedRank> { return std::nullopt; };

  std::vector<size_t> unresponsive, stragglers;
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& unit = units[u];
    if (!unit.forced.empty()) {
      take_out(u, unit.forced.front(), false,
               [&](uint32_t i) { return ForcedEntry(in, unit, current, i); });
      continue;
    }
    // A monitor-only rank takes part whatever a version says: excluding its
    // replica would only make the others wait for it outside the set.
    if (unit.forced_in || unit.monitor_only || !policy.exclusion_enabled || unit.released)
      continue;
    if (unit.finished) {
      // A job that is ending changes no membership: its ranks are leaving.
      if (unit.out_now) take_out(u, unit.ranks.front(), true, none);
      continue;
    }
    if (unit.culprits.empty()) continue;  // no culprit (any more): in
    if (unit.out_now) {
      // Stays out while it has a culprit. An unresponsive-only exclusion
      // whose culprit now reports slow is a new candidate, as for one rank.
      bool only_unresponsive = true;
      for (uint32_t i : unit.ranks)
        if (current[i] && current[i]->reason != ExclusionReason::kUnresponsive)
          only_unresponsive = false;
      if (unit.unresponsive > 0 || !only_unresponsive) {
        take_out(u, unit.culprits.front(), true, none);
        continue;
      }
    }
    (unit.unresponsive > 0 ? unresponsive : stragglers).push_back(u);
  }

  const Capacity cap(policy, world, static_cast<uint32_t>(units.size()), hybrid);
  const auto size_of = [&](size_t u) { return static_cast<uint32_t>(units[u].ranks.size()); };
  ExclusionPlan plan;
  uint32_t blocked_size = 1;
  auto culprit_entry = [&](size_t u) {
    return [&, u](uint32_t i) { return CulpritEntry(policy, in, units[u], i); };
  };
  for (size_t u : unresponsive) {
    if (cap.Room(excluded, excluded_ranks, size_of(u))) {
      take_out(u, units[u].culprits.front(), false, culprit_entry(u));
    } else {
      plan.blocked.insert(plan.blocked.end(), units[u].culprits.begin(), units[u].culprits.end());
      blocked_size = size_of(u);
    }
  }

  // Slowest first: when only some fit, leave out the ones that hurt most.
  std::stable_sort(stragglers.begin(), stragglers.end(),
                   [&](size_t a, size_t b) { return units[a].slowest > units[b].slowest; });
  size_t fit = 0;
  uint32_t fit_ranks = 0;
  while (fit < stragglers.size() &&
         cap.Room(excluded + static_cast<uint32_t>(fit), excluded_ranks + fit_ranks,
                  size_of(stragglers[fit])))
    fit_ranks += size_of(stragglers[fit++]);
  const size_t take = ThroughputTake(policy, in, units, out, stragglers, fit);
  for (size_t k = 0; k < stragglers.size(); ++k) {
    const size_t u = stragglers[k];
    if (k < take) {
      take_out(u, units[u].culprits.front(), false, culprit_entry(u));
    } else {
      plan.blocked.insert(plan.blocked.end(), units[u].culprits.begin(), units[u].culprits.end());
      if (k == take) blocked_size = size_of(u);
    }
  }

  std::sort(plan.blocked.begin(), plan.blocked.end());
  if (!plan.blocked.empty()) {
    plan.blocked_why = cap.Why(excluded, excluded_ranks, blocked_size);
    if (plan.blocked_why.empty())
      plan.blocked_why =
          absl::StrFormat("predicted throughput gain below %g", policy.min_throughput_gain);
  }
  std::sort(want.begin(), want.end(),
            [](const ExcludedRank& a, const ExcludedRank& b) { return a.rank < b.rank; });
  plan.excluded = std::move(want);
  return plan;
}

}  // namespace straggler::engine::internal
