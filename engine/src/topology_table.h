// Every rank's RankTopology, kept as its replica and an index into the job's
// distinct (peer group, GPU model) pairs: ranks share a handful of them, and
// two strings per rank were 72 bytes of every rank of a million-rank job.
// Plain data, one thread at a time (the engine's).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "straggler/engine/job_engine.h"

namespace straggler::engine::internal {

class TopologyTable {
 public:
  // (peer_group, gpu_model)
  using Key = std::pair<std::string, std::string>;

  explicit TopologyTable(size_t ranks) : replica_(ranks), key_(ranks, 0), keys_{Key{}} {
    index_.emplace(Key{}, 0);
  }

  size_t size() const { return key_.size(); }

  // Sets the rank's topology; false when it was that already.
  bool Set(uint32_t rank, const RankTopology& t) {
    const uint32_t key = KeyOf(t.peer_group, t.gpu_model);
    if (key_[rank] == key && replica_[rank] == t.replica) return false;
    key_[rank] = key;
    replica_[rank] = t.replica;
    // Pairs no rank names any more stay in Keys(): past twice the ranks
    // (clients renaming groups over and over), keep only the named ones.
    if (keys_.size() > 2 * key_.size() + 64) Compact();
    return true;
  }

  RankTopology Get(uint32_t rank) const {
    const Key& k = keys_[key_[rank]];
    return RankTopology{k.first, replica_[rank], k.second};
  }

  const std::optional<uint32_t>& Replica(uint32_t rank) const { return replica_[rank]; }
  const std::string& PeerGroup(uint32_t rank) const { return keys_[key_[rank]].first; }

  // The rank's (peer group, GPU model) pair: an index into Keys(), the same
  // for every rank with equal strings.
  uint32_t KeyIndex(uint32_t rank) const { return key_[rank]; }
  const std::vector<Key>& Keys() const { return keys_; }

 private:
  uint32_t KeyOf(const std::string& group, const std::string& model) {
    if (const Key& k = keys_[last_]; k.first == group && k.second == model) return last_;
    auto [it, added] = index_.emplace(Key{group, model}, static_cast<uint32_t>(keys_.size()));
    if (added) keys_.push_back(it->first);
    last_ = it->second;
    return last_;
  }

  void Compact() {
    std::vector<Key> old = std::move(keys_);
    keys_ = {Key{}};
    index_.clear();
    index_.emplace(Key{}, 0);
    last_ = 0;
    for (uint32_t& k : key_) k = KeyOf(old[k].first, old[k].second);
  }

  std::vector<std::optional<uint32_t>> replica_;
  std::vector<uint32_t> key_;
  std::vector<Key> keys_;  // distinct pairs, in the order first seen; 0 = ("", "")
  std::map<Key, uint32_t> index_;
  uint32_t last_ = 0;  // the last pair set (ranks of a hello mostly share one)
};

}  // namespace straggler::engine::internal
