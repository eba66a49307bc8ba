// Peer groups (docs/detection.md, "Peer groups"): ranks that declared the
// same peer_group and the same gpu_model (JobEngine::SetTopology) do the same
// work on the same hardware, so they are judged against each other. A
// PeerGroups maps every rank to its group and splits a row into one bucket
// per group. A reference may split a group further (the peer policy's
// inferred GPU generations). Plain data, one thread at a time (the engine's).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "rows.h"
#include "straggler/engine/job_engine.h"
#include "topology_table.h"

namespace straggler::engine::internal {

class PeerGroups {
 public:
  // Files every rank under its group again when the topology changed since
  // the last call (`version`: EngineImpl::topology_version); returns whether
  // any rank moved (Moved() says which). A group keeps its index for good
  // (new groups are appended), and a rank whose topology did not change keeps
  // its group, a split-off one included: a late joiner's hello moves nobody
  // else.
  bool Sync(const TopologyTable& topology, uint64_t version);
  // Whether Sync would find nothing to do (asked for every report judged
  // alone: inline, the call was a few percent of such a report).
  bool Current(const TopologyTable& topology, uint64_t version) const {
    return synced_ && version == version_ && of_.size() == topology.size();
  }
  // Whether the last Sync that returned true moved `rank`.
  bool Moved(uint32_t rank) const { return moved_[rank]; }

  // Whether Sync has filed the ranks at least once (Of() is valid).
  bool synced() const { return synced_; }
  uint32_t Of(uint32_t rank) const { return of_[rank]; }
  size_t size() const { return groups_.size(); }
  // Ranks filed under the group (reporting or not).
  uint32_t Members(uint32_t group) const { return groups_[group].members; }
  // For messages: "group stage2", "the default group", "group stage2 on
  // NVIDIA A100", "... (a slower generation)".
  const std::string& Label(uint32_t group) const { return groups_[group].label; }
  bool Split(uint32_t group) const { return groups_[group].split; }

  // Moves `ranks` (all of `group`) into a new group, labelled as a slower
  // generation of it; both are marked split. Returns the new group's index.
  uint32_t SplitOff(uint32_t group, const std::vector<uint32_t>& ranks);

  // The row's (rank, compute) pairs per group, in row order; valid until the
  // next Bucketize, while `row` lives. Every rank in one group (a job
  // without peer groups): the row's own values, not a copy (a million-rank
  // row's was 16 MB written per row); a split later in the row leaves
  // group 0 the whole row, the new group none, until the next Bucketize.
  // Else buckets reused from row to row.
  void Bucketize(const Row& row);
  const std::vector<std::pair<uint32_t, double>>& Bucket(uint32_t group) const {
    return whole_ != nullptr && group == 0 ? whole_->values : buckets_[group];
  }
  // Each bucket value's work, in step with Bucket(group) (Row::work: empty
  // when the row has no work); the row's own column in a job of one group.
  const std::vector<double>& BucketWork(uint32_t group) const {
    return whole_ != nullptr && group == 0 ? whole_->work : work_buckets_[group];
  }

 private:
  struct Group {
    std::string label;
    uint32_t members = 0;
    bool split = false;
  };
  bool synced_ = false;
  uint64_t version_ = 0;
  // The group of a (peer group, GPU model) pair, found once per pair per
  // Sync (the table's pairs), not by two strings per rank.
  uint32_t GroupOf(const TopologyTable::Key& key);
  std::vector<uint32_t> key_group_;  // per pair of the table: its group, for the Sync
  std::map<TopologyTable::Key, uint32_t> index_;  // (group, model) -> group
  std::vector<uint32_t> base_;   // per rank: the group its topology names
  std::vector<bool> moved_;      // per rank, by the last Sync
  std::vector<uint32_t> of_;
  std::vector<Group> groups_;
  std::vector<std::vector<std::pair<uint32_t, double>>> buckets_;
  std::vector<std::vector<double>> work_buckets_;  // filled only for a row with work
  const Row* whole_ = nullptr;  // the row, when group 0 holds every rank
};

}  // namespace straggler::engine::internal
