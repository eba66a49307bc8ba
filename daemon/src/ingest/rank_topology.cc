#include "ingest/rank_topology.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "straggler/v1/wire_rules.h"
#include "straggler/common/validate.h"

namespace straggler::daemon {

using common::Quoted;

namespace rules = ::straggler::v1::rules;

const char* TopologyRefuseReasonName(TopologyRefuseReason r) {
  switch (r) {
    case TopologyRefuseReason::kInvalidPeerGroup: return "invalid_peer_group";
    case TopologyRefuseReason::kReplicaOutOfRange: return "replica_out_of_range";
    case TopologyRefuseReason::kChanged: return "changed_without_new_incarnation";
    case TopologyRefuseReason::kInvalidGpuModel: return "invalid_gpu_model";
  }
  return "unknown";
}

namespace {

// The refusal `t` earns as a claim of `rank`, if any.
std::optional<TopologyRefusal> Check(uint32_t rank, const DeclaredTopology& t,
                                     uint32_t world_size) {
  // The wire's rules (common/validate.h), worded as the daemon words them.
  if (absl::Status s = common::CheckIdText(absl::StrCat("rank ", rank, ": peer_group"), t.peer_group,
                                           rules::kMaxPeerGroupBytes);
      !s.ok()) {
    return TopologyRefusal{rank, TopologyRefuseReason::kInvalidPeerGroup, std::string(s.message())};
  }
  if (t.replica && *t.replica >= world_size) {
    return TopologyRefusal{rank, TopologyRefuseReason::kReplicaOutOfRange,
                           absl::StrCat("rank ", rank, ": replica=", *t.replica,
                                        " >= world_size=", world_size)};
  }
  if (absl::Status s = common::CheckPrintable(absl::StrCat("rank ", rank, ": gpu_model"), t.gpu_model,
                                              rules::kMaxGpuModelBytes);
      !s.ok()) {
    return TopologyRefusal{rank, TopologyRefuseReason::kInvalidGpuModel, std::string(s.message())};
  }
  return std::nullopt;
}

std::string Describe(const DeclaredTopology& t) {
  return absl::StrCat("peer_group ", Quoted(t.peer_group), " replica ",
                      t.replica ? absl::StrCat(*t.replica) : std::string("(own)"),
                      t.gpu_model.empty() ? std::string() : absl::StrCat(" gpu_model ", Quoted(t.gpu_model)));
}

}  // namespace

std::vector<TopologyRefusal> RankTopologies::Apply(const std::vector<TopologyClaim>& claims,
                                                   const std::vector<uint32_t>& ranks) {
  std::vector<TopologyRefusal> refused;
  const uint32_t world = static_cast<uint32_t>(claimed_.size());
  std::vector<uint32_t> sorted = ranks;  // a later hello's are as sent
  std::sort(sorted.begin(), sorted.end());
  for (const TopologyClaim& c : claims) {
    if (c.rank >= world || !std::binary_search(sorted.begin(), sorted.end(), c.rank)) continue;
    if (std::optional<TopologyRefusal> r = Check(c.rank, c.topology, world)) {
      refused.push_back(*std::move(r));
      continue;
    }
    if (claimed_[c.rank] && incarnation_[c.rank] == c.incarnation && !(Of(c.rank) == c.topology)) {
      // One trainer process has one place in the job: a second answer is a
      // bug (or a forged hello), and detection must not regroup the rank.
      refused.push_back({c.rank, TopologyRefuseReason::kChanged,
                         absl::StrCat("rank ", c.rank, ": ", Describe(c.topology),
                                      " differs from the ", Describe(Of(c.rank)),
                                      " its client process declared before; a rank changes "
                                      "its topology only as a new trainer process")});
      continue;
    }
    engine_.SetTopology(c.rank, engine::RankTopology{c.topology.peer_group, c.topology.replica,
                                                     c.topology.gpu_model});
    incarnation_[c.rank] = c.incarnation;
    claimed_[c.rank] = true;
  }
  return refused;
}

DeclaredTopology RankTopologies::Of(uint32_t rank) const {
  engine::RankTopology t = engine_.Topology(rank);
  return DeclaredTopology{std::move(t.peer_group), t.replica, std::move(t.gpu_model)};
}

}  // namespace straggler::daemon
