// TopologyFromLayout (straggler/topology.h): Megatron-LM's RankGenerator
// rank decomposition for one rank.
#include "straggler/topology.h"

#include <array>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace straggler {

namespace {

struct Dimension {
  std::string_view name;
  uint32_t size = 1;
  uint32_t index = 0;  // the rank's coordinate, once decomposed
  bool named = false;  // seen in the order
};

void Fail(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
}

}  // namespace

std::optional<RankTopology> TopologyFromLayout(const ParallelLayout& layout, uint32_t rank,
                                               std::string* error) {
  // Expert parallelism is laid out by Megatron's second (expert) generator;
  // in the dense generator this one mirrors, ep is always 1.
  std::array<Dimension, 5> dims{{{"tp", layout.tensor},
                                 {"cp", layout.context},
                                 {"ep", 1},
                                 {"dp", layout.data},
                                 {"pp", layout.pipeline}}};
  for (const Dimension& d : dims) {
    if (d.size == 0) {
      Fail(error, "topology: " + std::string(d.name) + " size is 0; every size must be >= 1");
      return std::nullopt;
    }
  }
  std::string order;
  for (char c : layout.order) order += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // The order's names, fastest-varying first.
  std::vector<Dimension*> sequence;
  size_t start = 0;
  while (start <= order.size()) {
    size_t end = order.find('-', start);
    if (end == std::string::npos) end = order.size();
    const std::string_view token = std::string_view(order).substr(start, end - start);
    Dimension* found = nullptr;
    for (Dimension& d : dims)
      if (d.name == token) found = &d;
    if (found == nullptr) {
      Fail(error, "topology: order '" + layout.order + "' names '" + std::string(token) +
                      "'; allowed names: tp, cp, ep, dp, pp joined by '-'");
      return std::nullopt;
    }
    if (found->named) {
      Fail(error, "topology: order '" + layout.order + "' names '" + std::string(token) +
                      "' twice");
      return std::nullopt;
    }
    found->named = true;
    sequence.push_back(found);
    start = end + 1;
  }
  // As Megatron: a name left out must have size 1, and goes last.
  for (Dimension& d : dims) {
    if (d.named) continue;
    if (d.size != 1) {
      Fail(error, "topology: " + std::string(d.name) + " size is " + std::to_string(d.size) +
                      " but order '" + layout.order + "' does not name it");
      return std::nullopt;
    }
    sequence.push_back(&d);
  }
  uint64_t world = 1;
  for (const Dimension* d : sequence) {
    world *= d->size;
    if (world > UINT32_MAX) {
      Fail(error, "topology: the layout's world (the product of its sizes) exceeds 2^32 - 1");
      return std::nullopt;
    }
  }
  if (rank >= world) {
    Fail(error, "topology: rank " + std::to_string(rank) + " is outside the layout's world of " +
                    std::to_string(world) + " ranks (tp " + std::to_string(layout.tensor) +
                    " x cp " + std::to_string(layout.context) + " x dp " +
                    std::to_string(layout.data) + " x pp " + std::to_string(layout.pipeline) +
                    ")");
    return std::nullopt;
  }
  // Mixed radix, first name least significant (Megatron's prefix_product strides).
  uint32_t rest = rank;
  for (Dimension* d : sequence) {
    d->index = rest % d->size;
    rest /= d->size;
  }
  RankTopology t;
  t.tensor_rank = dims[0].index;
  t.context_rank = dims[1].index;
  t.replica = dims[3].index;
  t.stage = dims[4].index;
  t.peer_group = "stage" + std::to_string(t.stage);
  return t;
}

}  // namespace straggler
