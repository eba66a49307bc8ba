#include "peer_groups.h"

#include "absl/strings/str_cat.h"

namespace straggler::engine::internal {

bool PeerGroups::Sync(const std::vector<RankTopology>& topology, uint64_t version) {
  if (synced_ && version == version_ && of_.size() == topology.size()) return false;
  const bool first = !synced_ || of_.size() != topology.size();
  synced_ = true;
  version_ = version;
  if (first) {
    index_.clear();
    groups_.clear();
    base_.assign(topology.size(), 0);
    of_.assign(topology.size(), 0);
  }
  moved_.assign(topology.size(), 0);
  bool any = first;
  for (size_t r = 0; r < topology.size(); ++r) {
    auto [it, added] =
        index_.emplace(std::pair{topology[r].peer_group, topology[r].gpu_model}, 0);
    if (added) {
      it->second = static_cast<uint32_t>(groups_.size());
      Group& g = groups_.emplace_back();
      g.label = it->first.first.empty() ? "the default group"
                                        : absl::StrCat("group ", it->first.first);
      if (!it->first.second.empty()) absl::StrAppend(&g.label, " on ", it->first.second);
    }
    if (first || base_[r] != it->second) {
      base_[r] = of_[r] = it->second;
      moved_[r] = 1;
      any = true;
    }
  }
  for (Group& g : groups_) g.members = 0;
  for (uint32_t g : of_) groups_[g].members++;
  buckets_.resize(groups_.size());
  return any;
}

uint32_t PeerGroups::SplitOff(uint32_t group, const std::vector<uint32_t>& ranks) {
  const uint32_t added = static_cast<uint32_t>(groups_.size());
  Group g;
  g.label = absl::StrCat(groups_[group].label, " (a slower generation)");
  g.split = true;
  groups_.push_back(std::move(g));
  groups_[group].split = true;
  for (uint32_t r : ranks) {
    if (of_[r] != group) continue;
    of_[r] = added;
    groups_[group].members--;
    groups_[added].members++;
  }
  buckets_.resize(groups_.size());
  return added;
}

void PeerGroups::Bucketize(const Row& row) {
  for (auto& b : buckets_) b.clear();
  for (const auto& [rank, t] : row.values) buckets_[of_[rank]].emplace_back(rank, t);
}

}  // namespace straggler::engine::internal
