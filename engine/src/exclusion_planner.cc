#include "exclusion_planner.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace straggler::engine::internal {

Capacity::Capacity(const PolicyConfig& policy, uint32_t world)
    : world_size(world),
      max_excluded(static_cast<uint32_t>(
          std::floor(policy.max_excluded_fraction * static_cast<double>(world) + 1e-9))),
      min_active(policy.min_active_ranks) {}

bool Capacity::Room(uint32_t excluded) const {
  return excluded + 1 <= max_excluded && world_size - excluded - 1 >= min_active;
}

std::string Capacity::Why(uint32_t excluded) const {
  if (excluded + 1 > max_excluded)
    return absl::StrCat("max_excluded_fraction allows ", max_excluded);
  if (world_size - excluded - 1 < min_active)
    return absl::StrCat("min_active_ranks is ", min_active);
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

// Throughput guard: how many of the `fit` slowest candidates to exclude, the
// largest number for which the job is predicted to go faster without them:
// ((A-k)/T_without) / (A/T_with) - 1 >= min_throughput_gain, A the active
// ranks, T the largest ewma among them with and without the k.
size_t ThroughputTake(const PolicyConfig& policy, const PlanInput& in,
                      const std::vector<std::optional<ExcludedRank>>& want,
                      const std::vector<uint32_t>& candidates, size_t fit) {
  if (fit == 0) return 0;
  std::vector<bool> is_candidate(in.ranks.size(), false);
  for (size_t k = 0; k < fit; ++k) is_candidate[candidates[k]] = true;
  double t_with = 0, t_rest = 0;
  uint32_t active = 0;
  for (uint32_t i = 0; i < in.ranks.size(); ++i) {
    if (want[i] || !Live(in.ranks[i])) continue;
    active++;
    t_with = std::max(t_with, in.ranks[i].ewma);
    if (!is_candidate[i]) t_rest = std::max(t_rest, in.ranks[i].ewma);
  }
  for (size_t k = fit; k > 0; --k) {
    // Without the k slowest candidates the slowest remaining is either the
    // (k+1)-th candidate or the slowest non-candidate.
    double t_without = t_rest;
    if (k < fit) t_without = std::max(t_without, in.ranks[candidates[k]].ewma);
    if (active <= k || t_without <= 0 || t_with <= 0) continue;
    const double gain = ((active - k) / t_without) / (active / t_with) - 1.0;
    if (gain >= policy.min_throughput_gain) return k;
  }
  return 0;
}

}  // namespace

ExclusionPlan PlanExclusion(const PolicyConfig& policy, const PlanInput& in) {
  const uint32_t world = static_cast<uint32_t>(in.ranks.size());
  std::vector<const ExcludedRank*> current(world, nullptr);
  for (const auto& e : in.current)
    if (e.rank < world) current[e.rank] = &e;

  std::vector<std::optional<ExcludedRank>> want(world);
  std::vector<uint32_t> unresponsive, stragglers;
  uint32_t excluded = 0;
  auto exclude = [&](uint32_t rank, ExclusionReason reason, std::string detail, uint64_t since) {
    want[rank] = ExcludedRank{rank, reason, std::move(detail), since};
    excluded++;
  };
  auto keep = [&](uint32_t rank) { want[rank] = *current[rank], excluded++; };

  for (uint32_t i = 0; i < world; ++i) {
    const RankSnapshot& r = in.ranks[i];
    const ExcludedRank* ce = current[i];
    if (r.override == RankOverride::kForceExclude) {
      if (ce && ce->reason == ExclusionReason::kForced) keep(i);
      else exclude(i, ExclusionReason::kForced, "forced out by an operator", in.iteration);
      continue;
    }
    if (r.override == RankOverride::kForceInclude || !policy.exclusion_enabled) continue;
    if (ce && ce->reason == ExclusionReason::kForced) continue;  // override was cleared
    if (r.state == WorkerState::kFinished) {
      // A job that is ending changes no membership: its ranks are leaving.
      if (ce) keep(i);
      continue;
    }
    if (r.state == WorkerState::kUnresponsive) {
      if (ce) keep(i);
      else unresponsive.push_back(i);
    } else if (r.state == WorkerState::kStraggler && !r.on_probation) {
      if (ce && ce->reason != ExclusionReason::kUnresponsive) keep(i);
      else stragglers.push_back(i);
    }
  }

  const Capacity cap(policy, world);
  ExclusionPlan plan;
  for (uint32_t i : unresponsive) {
    if (cap.Room(excluded)) {
      exclude(i, ExclusionReason::kUnresponsive,
              absl::StrFormat("no report for %.3gs", policy.unresponsive_after_seconds),
              in.iteration);
    } else {
      plan.blocked.push_back(i);
    }
  }

  // Slowest first: when only some fit, leave out the ones that hurt most.
  std::sort(stragglers.begin(), stragglers.end(),
            [&](uint32_t a, uint32_t b) { return in.ranks[a].ewma > in.ranks[b].ewma; });
  size_t fit = 0;
  while (fit < stragglers.size() && cap.Room(excluded + static_cast<uint32_t>(fit))) fit++;
  const size_t take = ThroughputTake(policy, in, want, stragglers, fit);
  for (size_t k = 0; k < stragglers.size(); ++k) {
    const uint32_t i = stragglers[k];
    if (k < take) {
      exclude(i, in.ranks[i].probation_failed ? ExclusionReason::kProbationEnd
                                              : ExclusionReason::kStraggler,
              StragglerDetail(in.ranks[i], in), in.iteration);
    } else {
      plan.blocked.push_back(i);
    }
  }

  std::sort(plan.blocked.begin(), plan.blocked.end());
  if (!plan.blocked.empty()) {
    plan.blocked_why = cap.Why(excluded);
    if (plan.blocked_why.empty())
      plan.blocked_why =
          absl::StrFormat("predicted throughput gain below %g", policy.min_throughput_gain);
  }
  for (auto& w : want)
    if (w) plan.excluded.push_back(std::move(*w));
  return plan;
}

}  // namespace straggler::engine::internal
