// Peer groups in the engine (docs/detection.md, "Peer groups"): each rank's
// declared topology (SetTopology), and detection judging a rank against its
// peers - the ranks of the same peer group and GPU model - or, where it has
// too few, against its own earlier profile.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using testutil::Harness;
using testutil::Uniform;

TEST_CASE("groups: SetTopology files a rank; Reset and StartOver keep it", "[groups]") {
  Harness h(4);
  JobEngine& e = h.engine();
  CHECK(e.Topology(2) == RankTopology{});  // the default group, its own replica, model unknown
  e.SetTopology(2, RankTopology{"stage1", 0, "NVIDIA H100 80GB HBM3"});
  e.SetTopology(3, RankTopology{"stage1", 1, ""});
  CHECK(e.Topology(2).peer_group == "stage1");
  REQUIRE(e.Topology(2).replica);
  CHECK(*e.Topology(2).replica == 0);
  CHECK(e.Topology(2).gpu_model == "NVIDIA H100 80GB HBM3");
  CHECK(e.Topology(0) == RankTopology{});
  h.Rows(0, 3, 0, Uniform(4, 1.0));
  e.Reset(h.now());
  CHECK(e.Topology(3) == (RankTopology{"stage1", 1, ""}));
  e.StartOver(1000, h.now());
  CHECK(e.Topology(2).gpu_model == "NVIDIA H100 80GB HBM3");
  // A new incarnation may move the rank.
  e.SetTopology(2, RankTopology{"stage0", 0, "NVIDIA H100 80GB HBM3"});
  CHECK(e.Topology(2).peer_group == "stage0");
}

}  // namespace
}  // namespace straggler::engine
