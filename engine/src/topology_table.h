// Every rank's RankTopology, kept as its replica and an index into the job's
// distinct (peer group, GPU model) pairs: ranks share a handful of them, and
// two strings per rank were 72 bytes of every rank of a million-rank job.
// (The daemon's record of what each rank declared reads them through
// JobEngine::Topology: one copy.) Plain data, one thread at a time (the
// engine's).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "straggler/engine/intern_table.h"
#include "straggler/engine/job_engine.h"

namespace straggler::engine::internal {

class TopologyTable {
 public:
  // (peer_group, gpu_model)
  using Key = std::pair<std::string, std::string>;

  explicit TopologyTable(size_t ranks) : replica_(ranks, kOwnReplica), key_(ranks, 0) {}

  size_t size() const { return key_.size(); }

  // Sets the rank's topology; false when it was that already.
  bool Set(uint32_t rank, const RankTopology& t) {
    const uint32_t key = keys_.Intern(Key{t.peer_group, t.gpu_model});
    const uint32_t replica = t.replica.value_or(kOwnReplica);
    if (key_[rank] == key && replica_[rank] == replica) return false;
    key_[rank] = key;
    replica_[rank] = replica;
    keys_.CompactIfBloated(key_);
    return true;
  }

  RankTopology Get(uint32_t rank) const {
    const Key& k = keys_[key_[rank]];
    return RankTopology{k.first, Replica(rank), k.second};
  }

  std::optional<uint32_t> Replica(uint32_t rank) const {
    if (replica_[rank] == kOwnReplica) return std::nullopt;
    return replica_[rank];
  }
  const std::string& PeerGroup(uint32_t rank) const { return keys_[key_[rank]].first; }

  // The rank's (peer group, GPU model) pair: an index into Keys(), the same
  // for every rank with equal strings.
  uint32_t KeyIndex(uint32_t rank) const { return key_[rank]; }
  const std::vector<Key>& Keys() const { return keys_.keys(); }

 private:
  // A replica is below the world size: the largest uint32_t stands for "a
  // replica of its own" (4 bytes a rank, not an optional's 8).
  static constexpr uint32_t kOwnReplica = UINT32_MAX;
  std::vector<uint32_t> replica_;
  std::vector<uint32_t> key_;
  InternTable<Key> keys_;
};

}  // namespace straggler::engine::internal
