#include "peer_groups.h"

#include "absl/strings/str_cat.h"

namespace straggler::engine::internal {

bool PeerGroups::Sync(const TopologyTable& topology, uint64_t version) {
  if (Current(topology, version)) return false;
  const bool first = !synced_ || of_.size() != topology.size();
  synced_ = true;
  version_ = version;
  if (first) {
    index_.clear();
    groups_.clear();
    base_.assign(topology.size(), 0);
    of_.assign(topology.size(), 0);
  }
  moved_.assign(topology.size(), false);
  bool any = first;
  constexpr uint32_t kUnseen = UINT32_MAX;
  key_group_.assign(topology.Keys().size(), kUnseen);
  for (uint32_t r = 0; r < topology.size(); ++r) {
    // Groups are numbered in the order of their first rank, as before.
    uint32_t& group = key_group_[topology.KeyIndex(r)];
    if (group == kUnseen) group = GroupOf(topology.Keys()[topology.KeyIndex(r)]);
    if (first || base_[r] != group) {
      base_[r] = of_[r] = group;
      moved_[r] = true;
      any = true;
    }
  }
  for (Group& g : groups_) g.members = 0;
  for (uint32_t g : of_) groups_[g].members++;
  buckets_.resize(groups_.size());
  work_buckets_.resize(groups_.size());
  return any;
}

uint32_t PeerGroups::GroupOf(const TopologyTable::Key& key) {
  if (auto it = index_.find(key); it != index_.end()) return it->second;
  const auto index = static_cast<uint32_t>(groups_.size());
  index_.emplace(key, index);
  Group& g = groups_.emplace_back();
  g.label = key.first.empty() ? "the default group" : absl::StrCat("group ", key.first);
  if (!key.second.empty()) absl::StrAppend(&g.label, " on ", key.second);
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
  work_buckets_.resize(groups_.size());
  return added;
}

void PeerGroups::Bucketize(const Row& row) {
  for (auto& b : buckets_) b.clear();
  for (auto& b : work_buckets_) b.clear();
  whole_ = groups_.size() == 1 ? &row : nullptr;
  if (whole_ != nullptr) return;
  // Sized for every member at once: no copies while a large bucket grows.
  for (uint32_t g = 0; g < groups_.size(); ++g) buckets_[g].reserve(groups_[g].members);
  for (const auto& [rank, t] : row.values) buckets_[of_[rank]].emplace_back(rank, t);
  if (row.work.empty()) return;
  for (size_t i = 0; i < row.values.size(); ++i)
    work_buckets_[of_[row.values[i].first]].push_back(row.work[i]);
}

}  // namespace straggler::engine::internal
