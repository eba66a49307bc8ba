// straggler/topology.h against Megatron-LM's RankGenerator, the topology
// options (FromEnv, Validate) and their C ABI (docs/topology.md).
#include "straggler/topology.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "straggler/client.h"
#include "straggler/straggler_c.h"

using straggler::ParallelLayout;
using straggler::RankTopology;
using straggler::TopologyFromLayout;

namespace {

// Megatron-LM's generate_masked_orthogonal_rank_groups (parallel_state.py),
// written out independently of TopologyFromLayout: the groups of the
// dimensions `mask` selects, each group's ranks in the order Megatron lists
// them. `sizes` in `order` order, fastest first.
std::vector<std::vector<uint32_t>> MegatronGroups(const std::vector<uint32_t>& sizes,
                                                  const std::vector<bool>& mask) {
  auto prefix = [](const std::vector<uint32_t>& a) {
    std::vector<uint32_t> r{1};
    for (uint32_t v : a) r.push_back(r.back() * v);
    return r;
  };
  auto decompose = [&](uint32_t index, const std::vector<uint32_t>& shape) {
    const std::vector<uint32_t> stride = prefix(shape);
    std::vector<uint32_t> idx;
    for (size_t i = 0; i < shape.size(); ++i) idx.push_back((index / stride[i]) % shape[i]);
    return idx;
  };
  const std::vector<uint32_t> global_stride = prefix(sizes);
  std::vector<uint32_t> masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  for (size_t i = 0; i < sizes.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(sizes[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  const uint32_t world = global_stride.back();
  const uint32_t group_size = prefix(masked_shape).back();
  std::vector<std::vector<uint32_t>> groups;
  for (uint32_t g = 0; g < world / group_size; ++g) {
    const std::vector<uint32_t> gi = decompose(g, unmasked_shape);
    std::vector<uint32_t> ranks;
    for (uint32_t r = 0; r < group_size; ++r) {
      const std::vector<uint32_t> ri = decompose(r, masked_shape);
      uint32_t rank = 0;
      for (size_t i = 0; i < ri.size(); ++i) rank += ri[i] * masked_stride[i];
      for (size_t i = 0; i < gi.size(); ++i) rank += gi[i] * unmasked_stride[i];
      ranks.push_back(rank);
    }
    groups.push_back(std::move(ranks));
  }
  return groups;
}

// Every rank's position in its pipeline group (its stage) and in its data
// group (its replica), as Megatron builds those groups for `order`.
void CheckAgainstMegatron(const ParallelLayout& layout) {
  const std::map<std::string, uint32_t> size_of{{"tp", layout.tensor}, {"cp", layout.context},
                                                {"ep", 1}, {"dp", layout.data},
                                                {"pp", layout.pipeline}};
  std::vector<std::string> names;
  for (size_t start = 0;;) {
    const size_t end = layout.order.find('-', start);
    names.push_back(layout.order.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  std::vector<uint32_t> sizes;
  for (const std::string& n : names) sizes.push_back(size_of.at(n));
  auto mask_of = [&](const std::string& name) {
    std::vector<bool> m;
    for (const std::string& n : names) m.push_back(n == name);
    return m;
  };
  std::map<uint32_t, uint32_t> stage, replica;
  for (const auto& group : MegatronGroups(sizes, mask_of("pp")))
    for (uint32_t i = 0; i < group.size(); ++i) stage[group[i]] = i;
  for (const auto& group : MegatronGroups(sizes, mask_of("dp")))
    for (uint32_t i = 0; i < group.size(); ++i) replica[group[i]] = i;
  const uint32_t world = layout.data * layout.pipeline * layout.tensor * layout.context;
  REQUIRE(stage.size() == world);
  for (uint32_t rank = 0; rank < world; ++rank) {
    INFO("order " << layout.order << " rank " << rank);
    std::string error;
    const auto t = TopologyFromLayout(layout, rank, &error);
    REQUIRE(t);
    CHECK(error.empty());
    CHECK(t->stage == stage[rank]);
    CHECK(t->replica == replica[rank]);
    CHECK(t->peer_group == "stage" + std::to_string(stage[rank]));
  }
}

const char* const kTopologyVars[] = {"STRAGGLER_PEER_GROUP", "STRAGGLER_REPLICA",
                                     "STRAGGLER_GPU_MODEL", "RANK",
                                     "WORLD_SIZE", "STRAGGLER_JOB_ID"};

struct CleanEnv {
  CleanEnv() { Clear(); }
  ~CleanEnv() { Clear(); }
  static void Clear() {
    for (const char* v : kTopologyVars) unsetenv(v);
  }
};

}  // namespace

TEST_CASE("topology: Megatron's default order tp-cp-ep-dp-pp, its docstring's 16 GPUs",
          "[topology]") {
  // parallel_state.initialize_model_parallel's example: 16 GPUs, tp 2, pp 4
  // (so dp 2): pipeline groups [g0 g4 g8 g12] [g1 g5 g9 g13] ..., data
  // groups [g0 g2] [g1 g3] [g4 g6] ... [g13 g15].
  ParallelLayout layout;
  layout.data = 2;
  layout.pipeline = 4;
  layout.tensor = 2;
  const auto t13 = TopologyFromLayout(layout, 13);
  REQUIRE(t13);
  CHECK(t13->peer_group == "stage3");  // [g1 g5 g9 g13]: fourth
  CHECK(t13->replica == 0);            // [g13 g15]: first
  CHECK(t13->tensor_rank == 1);
  const auto t6 = TopologyFromLayout(layout, 6);
  REQUIRE(t6);
  CHECK(t6->peer_group == "stage1");  // [g2 g6 g10 g14]
  CHECK(t6->replica == 1);            // [g4 g6]
  CheckAgainstMegatron(layout);
  layout.context = 2;  // 32 ranks: cp between tp and dp
  CheckAgainstMegatron(layout);
  const auto t = TopologyFromLayout(layout, 2 * 2 + 1);  // tp 1, cp 0, dp 1, pp 0
  REQUIRE(t);
  CHECK(t->context_rank == 0);
  CHECK(t->replica == 1);
  CHECK(t->stage == 0);
}

TEST_CASE("topology: other rank orders (tp-pp-dp, dp-pp-tp, tp-dp-pp)", "[topology]") {
  ParallelLayout layout;
  layout.data = 2;
  layout.pipeline = 2;
  layout.tensor = 2;
  layout.order = "tp-pp-dp";  // older Megatron: [[0,4],[1,5],[2,6],[3,7]] are the dp groups
  const auto t6 = TopologyFromLayout(layout, 6);
  REQUIRE(t6);
  CHECK(t6->tensor_rank == 0);
  CHECK(t6->peer_group == "stage1");
  CHECK(t6->replica == 1);
  CheckAgainstMegatron(layout);

  layout.data = 4;
  layout.pipeline = 3;
  layout.tensor = 2;
  for (const char* order : {"tp-pp-dp", "dp-pp-tp", "tp-dp-pp", "pp-tp-dp", "tp-cp-ep-dp-pp"}) {
    layout.order = order;
    CheckAgainstMegatron(layout);
  }
  // dp fastest: consecutive ranks are replicas of one stage.
  layout.order = "dp-pp-tp";
  const auto t1 = TopologyFromLayout(layout, 1);
  REQUIRE(t1);
  CHECK(t1->replica == 1);
  CHECK(t1->peer_group == "stage0");
  const auto t5 = TopologyFromLayout(layout, 5);  // dp 1, pp 1
  REQUIRE(t5);
  CHECK(t5->replica == 1);
  CHECK(t5->peer_group == "stage1");
  // Case does not matter; names of size 1 may be left out.
  layout.order = "DP-PP-TP";
  CHECK(TopologyFromLayout(layout, 5)->peer_group == "stage1");
}

TEST_CASE("topology: a bad layout is refused, naming the value", "[topology]") {
  ParallelLayout layout;
  layout.data = 2;
  layout.pipeline = 2;
  layout.tensor = 2;
  std::string error;
  CHECK_FALSE(TopologyFromLayout(layout, 8, &error));
  CHECK(error == "topology: rank 8 is outside the layout's world of 8 ranks (tp 2 x cp 1 x dp 2 "
                 "x pp 2)");
  layout.order = "tp-dp";
  CHECK_FALSE(TopologyFromLayout(layout, 0, &error));
  CHECK(error == "topology: pp size is 2 but order 'tp-dp' does not name it");
  layout.order = "tp-xp-dp-pp";
  CHECK_FALSE(TopologyFromLayout(layout, 0, &error));
  CHECK(error.find("names 'xp'") != std::string::npos);
  layout.order = "tp-dp-pp-dp";
  CHECK_FALSE(TopologyFromLayout(layout, 0, &error));
  CHECK(error.find("'dp' twice") != std::string::npos);
  layout.order = "tp-dp-pp";
  layout.pipeline = 0;
  CHECK_FALSE(TopologyFromLayout(layout, 0, &error));
  CHECK(error == "topology: pp size is 0; every size must be >= 1");
  layout.pipeline = 65536;
  layout.data = 65536;
  CHECK_FALSE(TopologyFromLayout(layout, 0, &error));
  CHECK(error.find("exceeds 2^32 - 1") != std::string::npos);
}

TEST_CASE("topology: straggler_topology_from_layout gives the same answer in C", "[topology]") {
  straggler_topology_t t{};
  char err[256] = "untouched";
  REQUIRE(straggler_topology_from_layout(2, 4, 2, 1, nullptr, 13, &t, err, sizeof err) ==
          STRAGGLER_OK);
  CHECK(std::string(t.peer_group) == "stage3");
  CHECK(t.replica == 0);
  CHECK(t.stage == 3);
  CHECK(t.tensor_rank == 1);
  CHECK(std::string(err).empty());
  REQUIRE(straggler_topology_from_layout(2, 2, 2, 1, "tp-pp-dp", 6, &t, err, sizeof err) ==
          STRAGGLER_OK);
  CHECK(std::string(t.peer_group) == "stage1");
  CHECK(t.replica == 1);
  CHECK(straggler_topology_from_layout(2, 2, 2, 1, "tp-pp", 0, &t, err, sizeof err) ==
        STRAGGLER_EINVAL);
  CHECK(std::string(err) == "topology: dp size is 2 but order 'tp-pp' does not name it");
  CHECK(straggler_topology_from_layout(1, 1, 1, 1, nullptr, 0, nullptr, nullptr, 0) ==
        STRAGGLER_EINVAL);
}

TEST_CASE("topology: FromEnv reads STRAGGLER_PEER_GROUP and STRAGGLER_REPLICA", "[topology]") {
  CleanEnv env;
  setenv("STRAGGLER_JOB_ID", "j", 1);
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  straggler::ClientOptions o = straggler::ClientOptions::FromEnv();
  CHECK(o.peer_group.empty());
  CHECK_FALSE(o.replica);
  setenv("STRAGGLER_PEER_GROUP", "stage2", 1);
  setenv("STRAGGLER_REPLICA", "0", 1);
  o = straggler::ClientOptions::FromEnv();
  CHECK(o.peer_group == "stage2");
  REQUIRE(o.replica);
  CHECK(*o.replica == 0);
  CHECK(o.Validate().empty());
  setenv("STRAGGLER_REPLICA", "", 1);  // left empty by a launcher template: unset
  CHECK_FALSE(straggler::ClientOptions::FromEnv().replica);
  setenv("STRAGGLER_REPLICA", "two", 1);
  CHECK(straggler::ClientOptions::FromEnv().Validate() ==
        "STRAGGLER_REPLICA='two' is not an unsigned integer (max 4294967295)");
  setenv("STRAGGLER_REPLICA", "8", 1);
  CHECK(straggler::ClientOptions::FromEnv().Validate() ==
        "replica=8 >= world_size=8: a replica is a data-parallel index (STRAGGLER_REPLICA)");
}

TEST_CASE("topology: FromEnv reads STRAGGLER_GPU_MODEL, and Validate refuses what the daemon refuses",
          "[topology]") {
  CleanEnv env;
  setenv("STRAGGLER_JOB_ID", "j", 1);
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  CHECK(straggler::ClientOptions::FromEnv().gpu_model.empty());
  setenv("STRAGGLER_GPU_MODEL", "NVIDIA H100 80GB HBM3", 1);
  straggler::ClientOptions o = straggler::ClientOptions::FromEnv();
  CHECK(o.gpu_model == "NVIDIA H100 80GB HBM3");
  CHECK(o.Validate().empty());
  o.gpu_model = "H100\tSXM";
  CHECK(o.Validate() ==
        "gpu_model 'H100\\tSXM' has '\\t' at byte 4; allowed: printable ASCII (STRAGGLER_GPU_MODEL)");
  o.gpu_model = std::string(96, 'm');
  CHECK(o.Validate().empty());
  o.gpu_model = std::string(97, 'm');
  CHECK(o.Validate() == "gpu_model '" + std::string(32, 'm') +
                            "...' is 97 bytes; at most 96 (STRAGGLER_GPU_MODEL)");
}

TEST_CASE("topology: Validate refuses the peer groups the daemon refuses", "[topology]") {
  straggler::ClientOptions o;
  o.job_id = "j";
  o.world_size = 4;
  o.ranks = {0};
  o.peer_group = "stage-1_a.b";
  CHECK(o.Validate().empty());
  o.peer_group = "stage 1";
  CHECK(o.Validate() == "peer_group 'stage 1' has ' ' at byte 5; allowed: A-Z a-z 0-9 . _ - "
                        "(STRAGGLER_PEER_GROUP)");
  o.peer_group = std::string(64, 'g');
  CHECK(o.Validate().empty());
  o.peer_group = std::string(65, 'g');
  CHECK(o.Validate() == "peer_group '" + std::string(32, 'g') +
                            "...' is 65 bytes; at most 64 (STRAGGLER_PEER_GROUP)");
  o.peer_group.clear();
  o.replica = 3;
  CHECK(o.Validate().empty());
  o.replica = 4;
  CHECK(o.Validate().find("replica=4 >= world_size=4") == 0);

  // The C ABI runs the same checks.
  const uint32_t ranks[] = {0};
  straggler_options_t c;
  straggler_options_init(&c);
  c.job_id = "j";
  c.ranks = ranks;
  c.num_ranks = 1;
  c.world_size = 4;
  c.peer_group = "bad group";
  char err[256] = {};
  CHECK(straggler_client_create(&c, err, sizeof err) == nullptr);
  CHECK(std::string(err).find("peer_group 'bad group' has ' '") == 0);
  c.peer_group = nullptr;
  c.has_replica = 1;
  c.replica = 9;
  CHECK(straggler_client_create(&c, err, sizeof err) == nullptr);
  CHECK(std::string(err).find("replica=9 >= world_size=4") == 0);
}
