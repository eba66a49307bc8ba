#include "pipeline_model.h"

#include <algorithm>

namespace straggler_sim {

PipelineModel::PipelineModel(const SimOptions& options) : o_(options) {}

uint32_t PipelineModel::ReplicaOf(uint32_t rank) const {
  return (rank / o_.topology.tensor) % o_.topology.replicas;
}

double PipelineModel::ReplicaSeconds(uint32_t replica, uint64_t iteration) const {
  const Topology& t = o_.topology;
  const double m = static_cast<double>(o_.microbatches);
  double slowest = 0;  // per-microbatch time of the replica's slowest stage
  for (uint32_t s = 0; s < t.stages; ++s) {
    for (uint32_t k = 0; k < t.tensor; ++k) {
      const uint32_t rank = k + t.tensor * (replica + t.replicas * s);
      slowest = std::max(slowest, o_.iteration_ms / 1000.0 * SlowFactor(o_, rank, iteration) / m);
    }
  }
  return (m + t.stages - 1) * slowest;
}

double PipelineModel::StepSeconds(uint64_t iteration, const std::vector<bool>& active) const {
  double step = 0;
  for (uint32_t r = 0; r < o_.topology.replicas; ++r)
    if (active[r]) step = std::max(step, ReplicaSeconds(r, iteration));
  return step;
}

void PipelineModel::Record(uint64_t iteration, const std::vector<uint32_t>& members) {
  std::vector<bool> active(o_.topology.replicas, false);
  for (uint32_t rank : members) active[ReplicaOf(rank)] = true;
  Step step;
  step.done = true;
  step.replicas = static_cast<uint32_t>(std::count(active.begin(), active.end(), true));
  step.seconds = StepSeconds(iteration, active);
  step.all_seconds = StepSeconds(iteration, std::vector<bool>(o_.topology.replicas, true));
  absl::MutexLock lock(&mu_);
  if (steps_.size() <= iteration) steps_.resize(iteration + 1);
  steps_[iteration] = step;
}

StretchThroughput PipelineModel::Stretch(uint64_t from, uint64_t to) const {
  StretchThroughput out;
  out.from = from;
  out.to = to;
  double work = 0, seconds = 0, all_work = 0, all_seconds = 0;
  for (uint64_t i = from; i < to && i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    if (!s.done) continue;
    out.iterations++;
    work += static_cast<double>(s.replicas) * o_.microbatches;
    seconds += s.seconds;
    all_work += static_cast<double>(o_.topology.replicas) * o_.microbatches;
    all_seconds += s.all_seconds;
  }
  if (seconds > 0) out.with_exclusion = work / seconds;
  if (all_seconds > 0) out.without_exclusion = all_work / all_seconds;
  return out;
}

PipelineSummary PipelineModel::Summarize() const {
  absl::MutexLock lock(&mu_);
  PipelineSummary out;
  out.microbatches = o_.microbatches;
  const Topology& t = o_.topology;
  // The slowest stage by design sets a healthy replica's pace.
  const double cost = o_.stage_cost.empty()
                          ? 1.0
                          : *std::max_element(o_.stage_cost.begin(), o_.stage_cost.end());
  const double m = static_cast<double>(o_.microbatches);
  const double healthy_step = (m + t.stages - 1) * o_.iteration_ms / 1000.0 * cost / m;
  if (healthy_step > 0) out.healthy = t.replicas * m / healthy_step;
  out.run = Stretch(0, steps_.size());
  for (const SlowSpec& s : o_.slow) out.slow.push_back(Stretch(s.from, s.to));
  double work = 0, seconds = 0;
  for (const Step& s : steps_) {
    if (!s.done || s.replicas == t.replicas) continue;
    out.reduced_iterations++;
    work += static_cast<double>(s.replicas) * m;
    seconds += s.seconds;
  }
  if (seconds > 0) out.reduced = work / seconds;
  return out;
}

}  // namespace straggler_sim
