// The training thread's per-step cost of a hybrid job's data-parallel group
// plan (client_lib/src/collective/group_plan.h, issue 18): what a group's
// BeginIteration does after the job's agreement, i.e. detail::GroupPlanFor
// (the group's active members, root and parameter sync from the job's plan)
// and Agreement::Commit. The job's reducer is scripted: it hands out the same
// plan every iteration (a steady membership with one replica out), so no
// network or daemon is involved and the figure is the group layer's own.
// world = replicas x 8 (8 ranks per replica: rank / 8 is its replica), the
// group is position 0 of every replica (ranks 0, 8, 16, ...), replica 1 out.
//
//   collective_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agreement.h"
#include "group_plan.h"
#include "straggler/collective.h"

namespace {

using straggler::StepPlan;

class SteadyJob final : public straggler::PartialAllReduce {
 public:
  explicit SteadyJob(StepPlan plan) : plan_(std::move(plan)) {}
  StepPlan BeginIteration(uint64_t iteration) override {
    plan_.iteration = iteration;
    return plan_;
  }
  straggler::AllReduceResult AllReduceAverage(std::span<float>) override { return {}; }
  straggler::AllReduceResult AllReduceAverage(std::span<double>) override { return {}; }
  bool SyncParameters(const std::vector<straggler::ParameterBuffer>&) override { return false; }
  const StepPlan& Plan() const override { return plan_; }

 private:
  StepPlan plan_;
};

void BM_GroupPlanPerStep(benchmark::State& state) {
  const uint32_t world = static_cast<uint32_t>(state.range(0));
  constexpr uint32_t kPer = 8;
  const uint32_t rank = 0;
  StepPlan job;
  job.version = 3;
  job.certain = true;
  job.participating = true;
  std::vector<uint32_t> replica_of(world);
  for (uint32_t r = 0; r < world; ++r) {
    replica_of[r] = r / kPer;
    if (replica_of[r] != 1) job.active_ranks.push_back(r);
  }
  std::string error;
  auto sw = straggler::JobSwitch::Create(std::make_unique<SteadyJob>(job), replica_of, world, &error);
  if (!sw) {
    state.SkipWithError(error.c_str());
    return;
  }
  straggler::DataParallelGroup group;
  group.name = "stage0";
  for (uint32_t r = 0; r < world; r += kPer) {
    group.ranks.push_back(r);
    group.replicas.push_back(r / kPer);
  }
  straggler::detail::Agreement history(rank, "bench", {}, false);
  straggler::detail::GroupActiveCache cache;
  uint64_t iteration = 0;
  for (auto _ : state) {
    StepPlan plan = straggler::detail::GroupPlanFor(iteration++, history, *sw, group, rank, cache);
    benchmark::DoNotOptimize(plan.active_ranks.data());
    history.Commit(std::move(plan));
  }
  state.counters["group_active"] = static_cast<double>(history.plan().active_ranks.size());
  if (history.plan().active_ranks.size() + 1 != group.ranks.size())
    state.SkipWithError("the group's active set is not the group less replica 1");
}

BENCHMARK(BM_GroupPlanPerStep)->ArgName("world")->Arg(1000)->Arg(8000)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
