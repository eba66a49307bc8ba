#include "peer_groups.h"

#include <map>

#include "absl/strings/str_cat.h"

namespace straggler::engine::internal {

bool PeerGroups::Sync(const std::vector<RankTopology>& topology, uint64_t version) {
  if (synced_ && version == version_ && of_.size() == topology.size()) return false;
  synced_ = true;
  version_ = version;
  of_.assign(topology.size(), 0);
  groups_.clear();
  // Ordered by (group, model), so indices do not depend on rank order.
  std::map<std::pair<std::string, std::string>, uint32_t> index;
  for (const RankTopology& t : topology) index.emplace(std::pair{t.peer_group, t.gpu_model}, 0);
  for (auto& [key, i] : index) {
    i = static_cast<uint32_t>(groups_.size());
    Group& g = groups_.emplace_back();
    g.label = key.first.empty() ? "the default group" : absl::StrCat("group ", key.first);
    if (!key.second.empty()) absl::StrAppend(&g.label, " on ", key.second);
  }
  for (size_t r = 0; r < topology.size(); ++r) {
    of_[r] = index.at({topology[r].peer_group, topology[r].gpu_model});
    groups_[of_[r]].members++;
  }
  buckets_.resize(groups_.size());
  return true;
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
