// The rule that turns the job's plan into a data-parallel group's plan
// (group_plan.h, docs/hybrid.md) and the JobSwitch that runs the job's
// agreement once per iteration for all of a process's groups. The job's
// plans are inputs here (a scripted job reducer); the multi-process tests
// (integration:hybrid_*) run the real agreement.
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>

#include "group_plan.h"
#include "straggler/collective.h"

using straggler::CollectiveError;
using straggler::DataParallelGroup;
using straggler::JobSwitch;
using straggler::StepPlan;

namespace {

// A job reducer that hands out the plans a test scripts, and counts calls.
class ScriptedJob : public straggler::PartialAllReduce {
 public:
  ScriptedJob(std::deque<StepPlan>* plans, int* calls) : plans_(plans), calls_(calls) {}
  StepPlan BeginIteration(uint64_t iteration) override {
    ++*calls_;
    if (plans_->empty()) throw CollectiveError("iteration " + std::to_string(iteration) + ": agreement failed");
    plan_ = plans_->front();
    plans_->pop_front();
    plan_.iteration = iteration;
    return plan_;
  }
  straggler::AllReduceResult AllReduceAverage(std::span<float>) override { return {}; }
  straggler::AllReduceResult AllReduceAverage(std::span<double>) override { return {}; }
  bool SyncParameters(const std::vector<straggler::ParameterBuffer>&) override { return false; }
  const StepPlan& Plan() const override { return plan_; }

 private:
  std::deque<StepPlan>* plans_;
  int* calls_;
  StepPlan plan_;
};

// A GroupHistory over `previous` (which it views: keep it alive).
straggler::detail::GroupHistory History(bool participating, const std::vector<uint32_t>& previous) {
  return {true, participating, previous};
}

// 4 replicas x 2 stages, Megatron's order: rank = replica + 4 * stage.
std::vector<uint32_t> ReplicaMap() { return {0, 1, 2, 3, 0, 1, 2, 3}; }

DataParallelGroup Stage(uint32_t s) {
  DataParallelGroup g;
  g.name = "stage" + std::to_string(s);
  for (uint32_t r = 0; r < 4; ++r) {
    g.ranks.push_back(r + 4 * s);
    g.replicas.push_back(r);
  }
  return g;
}

StepPlan JobPlan(std::vector<uint32_t> active, uint32_t rank, uint64_t version = 1) {
  StepPlan p;
  p.version = version;
  p.active_ranks = std::move(active);
  p.participating = std::binary_search(p.active_ranks.begin(), p.active_ranks.end(), rank);
  return p;
}

std::shared_ptr<JobSwitch> Switch(std::deque<StepPlan>* plans, int* calls, std::vector<uint32_t> map = ReplicaMap()) {
  std::string error;
  auto sw = JobSwitch::Create(std::make_unique<ScriptedJob>(plans, calls), std::move(map), 8, &error);
  REQUIRE(sw);
  return sw;
}

}  // namespace

TEST_CASE("hybrid: one excluded rank takes its whole replica out of every group", "[hybrid]") {
  std::deque<StepPlan> none;
  int calls = 0;
  auto sw = Switch(&none, &calls);
  // Rank 1 (replica 1, stage 0) excluded: rank 5 (replica 1, stage 1) is
  // active in the job but leaves stage 1's group too.
  const StepPlan job = JobPlan({0, 2, 3, 4, 5, 6, 7}, 5);
  const std::vector<uint32_t> stage1_before{4, 5, 6, 7}, stage0_before{0, 1, 2, 3};
  const StepPlan g1 = straggler::detail::GroupStepPlan(job, Stage(1), *sw, 5, History(true, stage1_before));
  CHECK(g1.active_ranks == std::vector<uint32_t>{4, 6, 7});
  CHECK_FALSE(g1.participating);
  const StepPlan g0 = straggler::detail::GroupStepPlan(JobPlan({0, 2, 3, 4, 5, 6, 7}, 0), Stage(0), *sw, 0,
                                                       History(true, stage0_before));
  CHECK(g0.active_ranks == std::vector<uint32_t>{0, 2, 3});
  CHECK(g0.participating);
  CHECK_FALSE(g0.sync_parameters);  // a shrink: nobody new
  CHECK(g0.root == 0);
  CHECK(g0.version == 1);
}

TEST_CASE("hybrid: without a replica map a group leaves out only excluded ranks", "[hybrid]") {
  std::deque<StepPlan> none;
  int calls = 0;
  auto sw = Switch(&none, &calls, {});
  const std::vector<uint32_t> stage1_before{4, 5, 6, 7};
  const StepPlan g = straggler::detail::GroupStepPlan(JobPlan({0, 2, 3, 4, 5, 6, 7}, 5), Stage(1), *sw, 5,
                                                      History(true, stage1_before));
  CHECK(g.active_ranks == std::vector<uint32_t>{4, 5, 6, 7});
  CHECK(g.participating);
}

TEST_CASE("hybrid: a replica's return synchronises every member from the lowest active replica", "[hybrid]") {
  std::deque<StepPlan> none;
  int calls = 0;
  auto sw = Switch(&none, &calls);
  // Replica 0 is out; replica 1 comes back: root is replica 1's member (the
  // lowest active replica), and every member syncs, the old ones too.
  const StepPlan job = JobPlan({1, 2, 3, 5, 6, 7}, 6, 4);
  const std::vector<uint32_t> before{6, 7};
  for (uint32_t rank : {5u, 6u, 7u}) {
    const bool was_in = rank != 5;
    const StepPlan g = straggler::detail::GroupStepPlan(JobPlan(job.active_ranks, rank, 4), Stage(1), *sw, rank,
                                                        History(was_in, before));
    CHECK(g.active_ranks == std::vector<uint32_t>{5, 6, 7});
    CHECK(g.participating);
    CHECK(g.sync_parameters);
    CHECK(g.root == 5);
  }
  // The replica numbers, not the rank numbers, choose the root.
  DataParallelGroup reversed = Stage(1);
  reversed.replicas = {3, 2, 1, 0};
  std::deque<StepPlan> none2;
  auto sw2 = Switch(&none2, &calls, {});
  const StepPlan g = straggler::detail::GroupStepPlan(JobPlan({0, 1, 2, 3, 4, 5, 6, 7}, 4), reversed, *sw2, 4, {});
  CHECK(g.root == 7);
  CHECK(g.sync_parameters);  // the first iteration
}

TEST_CASE("hybrid: JobSwitch runs the job's agreement once per iteration for all groups", "[hybrid]") {
  std::deque<StepPlan> plans{JobPlan({0, 1, 2, 3, 4, 5, 6, 7}, 0, 0), JobPlan({0, 2, 3, 4, 6, 7}, 0, 2)};
  int calls = 0;
  auto sw = Switch(&plans, &calls);
  CHECK(sw->Begin(0).version == 0);
  CHECK(sw->Begin(0).version == 0);  // a second group of the process, same iteration
  CHECK(calls == 1);
  CHECK(sw->Begin(1).version == 2);
  CHECK(calls == 2);
  CHECK_THROWS_AS(sw->Begin(0), CollectiveError);  // going back
  // A failed agreement fails every group of that iteration, waiting once.
  CHECK_THROWS_AS(sw->Begin(2), CollectiveError);
  CHECK_THROWS_WITH(sw->Begin(2), Catch::Contains("iteration 2: agreement failed"));
  CHECK(calls == 3);
}

TEST_CASE("hybrid: a bad group or replica map is refused naming the value", "[hybrid]") {
  DataParallelGroup g = Stage(0);
  CHECK(g.Validate(0, 8).empty());
  CHECK_THAT(g.Validate(4, 8), Catch::Contains("does not contain this process's rank 4"));
  g.replicas[3] = 0;
  CHECK_THAT(g.Validate(0, 8), Catch::Contains("replica 0 appears twice"));
  g = Stage(1);
  CHECK_THAT(g.Validate(4, 6), Catch::Contains("rank 6 >= world_size=6"));
  g.name = "stage 1";
  CHECK_THAT(g.Validate(4, 8), Catch::Contains("' ' at byte 5"));
  // A control byte is named C-escaped, never raw (the message goes to logs).
  g.name = "stage\n1";
  CHECK_THAT(g.Validate(4, 8), Catch::Contains("group 'stage\\n1' has '\\n' at byte 5"));
  CHECK(g.Validate(4, 8).find('\n') == std::string::npos);
  CHECK(straggler::detail::ValidateGroupFor(g, nullptr, 4, 8).find('\n') == std::string::npos);
  g.name = std::string(65, 'x');
  CHECK_THAT(g.Validate(4, 8), Catch::Contains("the name must be 1 to 64 bytes, it has 65"));
  g = Stage(0);
  g.replicas.pop_back();
  CHECK_THAT(g.Validate(0, 8), Catch::Contains("4 ranks but 3 replicas"));
  std::deque<StepPlan> none;
  int calls = 0;
  std::string error;
  CHECK_FALSE(JobSwitch::Create(std::make_unique<ScriptedJob>(&none, &calls), {0, 1, 2}, 8, &error));
  CHECK_THAT(error, Catch::Contains("replica_of has 3 entries, world_size=8"));
}

TEST_CASE("hybrid: the group's active set is derived again for a version number seen before with "
          "another set (a restarted daemon)",
          "[hybrid]") {
  std::deque<StepPlan> none;
  int calls = 0;
  auto sw = Switch(&none, &calls);
  straggler::detail::GroupActiveCache cache;
  const auto& all = cache.Get(JobPlan({0, 1, 2, 3, 4, 5, 6, 7}, 4, 3), Stage(1), *sw);
  CHECK(all.ranks == std::vector<uint32_t>{4, 5, 6, 7});
  CHECK(all.root == 4);
  // The same version 3, published again with replica 0 out: the cache must
  // not answer from the set it holds.
  const auto& shrunk = cache.Get(JobPlan({1, 2, 3, 5, 6, 7}, 5, 3), Stage(1), *sw);
  CHECK(shrunk.ranks == std::vector<uint32_t>{5, 6, 7});
  CHECK(shrunk.root == 5);
  // And the same plan again: the same answer.
  CHECK(cache.Get(JobPlan({1, 2, 3, 5, 6, 7}, 5, 3), Stage(1), *sw).ranks ==
        std::vector<uint32_t>{5, 6, 7});
}
