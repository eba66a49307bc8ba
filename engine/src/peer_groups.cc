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
  const RankTopology* prev = nullptr;
  uint32_t prev_group = 0;
  for (size_t r = 0; r < topology.size(); ++r) {
    const RankTopology& t = topology[r];
    // Neighbouring ranks mostly share a group (a node, a stage).
    if (prev == nullptr || t.peer_group != prev->peer_group || t.gpu_model != prev->gpu_model)
      prev_group = GroupOf(t);
    prev = &t;
    if (first || base_[r] != prev_group) {
      base_[r] = of_[r] = prev_group;
      moved_[r] = 1;
      any = true;
    }
  }
  for (Group& g : groups_) g.members = 0;
  for (uint32_t g : of_) groups_[g].members++;
  buckets_.resize(groups_.size());
  return any;
}

uint32_t PeerGroups::GroupOf(const RankTopology& t) {
  const KeyLess::View key{t.peer_group, t.gpu_model};
  if (auto it = index_.find(key); it != index_.end()) return it->second;
  const auto index = static_cast<uint32_t>(groups_.size());
  index_.emplace(std::pair{t.peer_group, t.gpu_model}, index);
  Group& g = groups_.emplace_back();
  g.label = t.peer_group.empty() ? "the default group" : absl::StrCat("group ", t.peer_group);
  if (!t.gpu_model.empty()) absl::StrAppend(&g.label, " on ", t.gpu_model);
  return index;
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
  whole_ = groups_.size() == 1 ? &row : nullptr;
  if (whole_ != nullptr) return;
  // Sized for every member at once: no copies while a large bucket grows.
  for (uint32_t g = 0; g < groups_.size(); ++g) buckets_[g].reserve(groups_[g].members);
  for (const auto& [rank, t] : row.values) buckets_[of_[rank]].emplace_back(rank, t);
}

}  // namespace straggler::engine::internal
