// Each rank's declared place in a hybrid-parallel job (docs/topology.md):
// its peer group, data-parallel replica and GPU model, from RankDevice in the stream's
// hello. Checked (charset, length, replica < world size) and kept per rank;
// one client incarnation cannot change it, a new one may.
//
//   RankTopologies table(engine, world_size);
//   for (const TopologyRefusal& r : table.Apply(hello.topologies, hello.ranks))
//     ...tell the client r.message, count r.reason...
//   table.Of(rank).peer_group;
//
// Not thread-safe: a Job's table is JobState, behind the job's lock (registry/job.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "straggler/common/validate.h"  // DeclaredTopology, TopologyClaim
#include "straggler/engine/job_engine.h"

namespace straggler::daemon {

using common::DeclaredTopology;
using common::TopologyClaim;

enum class TopologyRefuseReason {
  kInvalidPeerGroup,
  kReplicaOutOfRange,
  kChanged,
  kInvalidGpuModel
};
inline constexpr size_t kTopologyRefuseReasons = 4;
// "invalid_peer_group", "replica_out_of_range", "changed_without_new_incarnation",
// "invalid_gpu_model".
const char* TopologyRefuseReasonName(TopologyRefuseReason r);

struct TopologyRefusal {
  uint32_t rank = 0;
  TopologyRefuseReason reason = TopologyRefuseReason::kInvalidPeerGroup;
  std::string message;  // names the rank and the value
};

class RankTopologies {
 public:
  // The topologies themselves live in `engine` (JobEngine::SetTopology,
  // JobEngine::Topology), which detection groups ranks by: a second copy here
  // was 8 bytes more of every rank (88 as two strings each). This table adds
  // which client incarnation declared them. `engine` must outlive it.
  RankTopologies(engine::JobEngine& engine, uint32_t world_size)
      : engine_(engine), incarnation_(world_size, 0), claimed_(world_size, false) {}

  // Takes the claims of the ranks in `ranks` (others are ignored,
  // as are ranks >= world size): a valid claim of a rank's first or a new
  // incarnation replaces what the rank had (in the engine); a claim that is
  // invalid, or that differs from what the same incarnation declared
  // before, is refused and the rank keeps its topology.
  std::vector<TopologyRefusal> Apply(const std::vector<TopologyClaim>& claims,
                                     const std::vector<uint32_t>& ranks);

  // What `rank` declared (the default before any claim). `rank` < world size.
  DeclaredTopology Of(uint32_t rank) const;

 private:
  engine::JobEngine& engine_;
  std::vector<uint64_t> incarnation_;  // of the client that claimed it
  std::vector<bool> claimed_;
};

}  // namespace straggler::daemon
