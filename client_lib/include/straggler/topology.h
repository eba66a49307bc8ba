// straggler/topology.h — a rank's peer group and replica from a Megatron-style
// parallel layout, for ClientOptions::peer_group and ::replica
// (docs/topology.md).
//
//   straggler::ParallelLayout layout;   // 2 replicas x 4 stages x 2 tensor ranks
//   layout.data = 2; layout.pipeline = 4; layout.tensor = 2;   // order "tp-cp-ep-dp-pp"
//   std::string error;
//   auto t = straggler::TopologyFromLayout(layout, rank, &error);  // rank 13 -> "stage3", replica 0
//   if (!t) { ...error names the bad value... }
//   options.peer_group = t->peer_group;
//   options.replica = t->replica;
//
// The rank order is Megatron-LM's RankGenerator's (megatron/core/parallel_state.py):
// names joined by '-', the FIRST name varying fastest. A rank's coordinates
// are its digits in the mixed radix of the sizes in that order, so with
// "tp-cp-ep-dp-pp" rank = tp + T*(cp + C*(dp + D*pp)) (ep is 1 here: Megatron
// lays experts out with a second generator that does not change who does the
// same dense work). A size other than 1 must be named in the order; names
// left out (of size 1) go last, as Megatron appends them.
//
// Peers are the ranks that do the same work: one pipeline stage, all its
// tensor- and context-parallel ranks and every replica of it ("stage<p>").
// The replica is the data-parallel index: the ranks of one model copy.
//
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace straggler {

struct ParallelLayout {
  uint32_t data = 1;      // data-parallel size: replicas
  uint32_t pipeline = 1;  // pipeline stages
  uint32_t tensor = 1;    // tensor-parallel ranks per stage
  uint32_t context = 1;   // context-parallel ranks per stage
  // Megatron's rank order (initialize_model_parallel's `order`): the names
  // tp, cp, ep, dp, pp joined by '-', fastest-varying first; case-insensitive.
  std::string order = "tp-cp-ep-dp-pp";
};

struct RankTopology {
  std::string peer_group;     // "stage<p>"
  uint32_t replica = 0;       // dp index
  uint32_t stage = 0;         // pp index
  uint32_t tensor_rank = 0;   // tp index
  uint32_t context_rank = 0;  // cp index
};

// The topology of `rank` in `layout`; nullopt (and *error, when given) for a
// size of 0, an order with an unknown or repeated name or missing a size
// other than 1, a world (the product of the sizes) above 2^32 - 1, or a rank
// outside it, the message naming the value.
std::optional<RankTopology> TopologyFromLayout(const ParallelLayout& layout, uint32_t rank,
                                               std::string* error = nullptr);

}  // namespace straggler
