// The membership log of one job: the published versions, newest last,
// bounded by JobEngine::kMembershipHistory (docs/membership.md). It keeps,
// per version, how many of its excluded ranks rows would otherwise wait for,
// so "how many reports complete the row of iteration i" is O(1). What goes
// into a version (the gate, take-over, restore) is the engine's decision
// (engine_membership.cc). Plain data, one thread at a time (the engine's).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include "straggler/engine/job_engine.h"

namespace straggler::engine::internal {

// Membership::IsExcluded, inline for the per-report path (a call into
// another file per report cost a measurable share of Ingest).
inline bool Excludes(const Membership& m, uint32_t rank) {
  auto it = std::lower_bound(m.excluded.begin(), m.excluded.end(), rank,
                             [](const ExcludedRank& e, uint32_t r) { return e.rank < r; });
  return it != m.excluded.end() && it->rank == rank;
}

struct Version {
  Membership m;
  uint32_t excluded_counted = 0;  // excluded ranks that rows count (see SetCounted)
};

class MembershipLog {
 public:
  // Version 0: nobody excluded, in force from iteration 0.
  MembershipLog(uint32_t world_size, uint32_t lead_iterations, Time now);

  const Membership& Newest() const { return versions_.back().m; }
  // The version in force at `iteration`: the newest with effective <= it.
  const Version& InForce(uint64_t iteration) const {
    for (auto it = versions_.rbegin(); it != versions_.rend(); ++it)
      if (it->m.effective_iteration <= iteration) return *it;
    return versions_.front();
  }
  // Ascending by version; the last element is Newest().
  const std::deque<Membership>& history() const { return history_; }
  // The newest version with effective_iteration <= iteration, and every later one.
  std::vector<Membership> From(uint64_t iteration) const;

  // Appends `v` (above Newest()), dropping the oldest beyond the bound.
  void Push(Version v);
  // Drops the versions that take effect after `limit`; when even the oldest
  // does, it is kept in force from iteration 0 (a history started over).
  void DropBeyond(uint64_t limit);
  // Replaces the log with one version (JobEngine::StartOver).
  void ResetTo(Membership m);

  // `rank` is now (delta 1) or no longer (-1) counted by rows.
  void CountExcluded(uint32_t rank, int delta);
  // No rank is counted (JobEngine::Reset).
  void ClearCounts();

 private:
  std::deque<Version> versions_;   // bounded by kMembershipHistory
  std::deque<Membership> history_;  // mirror of versions_[].m for the public API
};

}  // namespace straggler::engine::internal
