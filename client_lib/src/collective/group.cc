// Hybrid parallel jobs: DataParallelGroup's checks, the JobSwitch that runs
// the job's agreement once per iteration for every group of a process, and
// the derivation of a group's plan from it (group_plan.h; docs/hybrid.md).
#include <algorithm>
#include <cstdint>
#include <set>  // Validate
#include <string_view>

#include "absl/strings/escaping.h"
#include "group_plan.h"
#include "nccl_plan.h"  // SetText
#include "straggler/v1/wire_rules.h"

namespace straggler {

namespace {

constexpr size_t kMaxGroupNameBytes = 64;

// "data-parallel group 'NAME'" for errors, the name C-escaped (and cut when
// too long to be one): a control byte in it would otherwise reach the logs
// raw, and every error names the group, before or after its name is checked.
std::string GroupWhat(const std::string& name) {
  if (name.size() > kMaxGroupNameBytes)
    return "data-parallel group '" + absl::CHexEscape(name.substr(0, 32)) + "...'";
  return "data-parallel group '" + absl::CHexEscape(name) + "'";
}

}  // namespace

std::string DataParallelGroup::Validate(uint32_t rank, uint32_t world_size) const {
  const std::string what = GroupWhat(name);
  // The job-id characters (straggler/v1/wire_rules.h): safe in keys and logs.
  const v1::rules::TextFault fault =
      v1::rules::FindTextFault(name, kMaxGroupNameBytes, v1::rules::IsJobIdChar);
  if (name.empty() || fault.too_long) {
    return what + ": the name must be 1 to " + std::to_string(kMaxGroupNameBytes) +
           " bytes, it has " + std::to_string(name.size());
  }
  if (fault.bad_byte != std::string_view::npos) {
    return what + " has '" + absl::CHexEscape(name.substr(fault.bad_byte, 1)) + "' at byte " +
           std::to_string(fault.bad_byte) + "; allowed: " + std::string(v1::rules::kJobIdAllowed);
  }
  if (ranks.empty()) return what + " has no ranks";
  if (replicas.size() != ranks.size()) {
    return what + " has " + std::to_string(ranks.size()) + " ranks but " + std::to_string(replicas.size()) +
           " replicas (one per rank)";
  }
  std::set<uint32_t> seen_ranks, seen_replicas;
  for (size_t k = 0; k < ranks.size(); ++k) {
    if (ranks[k] >= world_size) {
      return what + ": rank " + std::to_string(ranks[k]) + " >= world_size=" + std::to_string(world_size);
    }
    if (!seen_ranks.insert(ranks[k]).second) return what + ": rank " + std::to_string(ranks[k]) + " appears twice";
    if (!seen_replicas.insert(replicas[k]).second) {
      return what + ": replica " + std::to_string(replicas[k]) +
             " appears twice (a data-parallel group has one rank per replica)";
    }
  }
  if (!seen_ranks.count(rank)) {
    return what + " " + detail::SetText(std::vector<uint32_t>(seen_ranks.begin(), seen_ranks.end())) +
           " does not contain this process's rank " + std::to_string(rank);
  }
  return "";
}

JobSwitch::JobSwitch(std::unique_ptr<PartialAllReduce> job, std::vector<uint32_t> replica_of,
                     uint32_t world_size)
    : job_(std::move(job)), replica_of_(std::move(replica_of)), world_size_(world_size) {}

std::shared_ptr<JobSwitch> JobSwitch::Create(std::unique_ptr<PartialAllReduce> job,
                                             std::vector<uint32_t> replica_of, uint32_t world_size,
                                             std::string* error) {
  auto fail = [&](const std::string& why) -> std::shared_ptr<JobSwitch> {
    if (error) *error = why;
    return nullptr;
  };
  if (!job) return fail("JobSwitch: no job-wide PartialAllReduce given");
  if (world_size == 0) return fail("JobSwitch: world_size=0 must be > 0");
  if (!replica_of.empty() && replica_of.size() != world_size) {
    return fail("JobSwitch: replica_of has " + std::to_string(replica_of.size()) +
                " entries, world_size=" + std::to_string(world_size) + " (one per rank, or none)");
  }
  return std::shared_ptr<JobSwitch>(new JobSwitch(std::move(job), std::move(replica_of), world_size));
}

const StepPlan& JobSwitch::Begin(uint64_t iteration) {
  if (last_ && iteration == *last_) {
    // Another group of this process already ran this iteration's agreement.
    if (!failure_.empty()) throw CollectiveError(failure_);
    return job_->Plan();
  }
  if (last_ && iteration < *last_) {
    throw CollectiveError("BeginIteration(" + std::to_string(iteration) + ") of a data-parallel group after the job " +
                          "moved on to iteration " + std::to_string(*last_) + ": iterations must not go back");
  }
  last_ = iteration;
  failure_.clear();
  try {
    job_->BeginIteration(iteration);
    return job_->Plan();
  } catch (const CollectiveError& e) {
    // The other groups of this iteration fail at once with the same error
    // instead of waiting out the timeout again; the next iteration retries.
    failure_ = e.what();
    throw;
  }
}

uint32_t JobSwitch::ReplicaOf(uint32_t rank) const {
  return replica_of_.empty() || rank >= replica_of_.size() ? rank : replica_of_[rank];
}

namespace detail {

std::string ValidateGroupFor(const DataParallelGroup& group, const JobSwitch* sw, uint32_t rank,
                             uint32_t world_size) {
  const std::string what = GroupWhat(group.name);
  if (sw == nullptr) return what + ": no JobSwitch given";
  if (sw->world_size() != world_size) {
    return what + ": options.world_size=" + std::to_string(world_size) + " but the JobSwitch's job has " +
           std::to_string(sw->world_size()) + " ranks";
  }
  if (std::string why = group.Validate(rank, world_size); !why.empty()) return why;
  for (size_t k = 0; k < group.ranks.size(); ++k) {
    const uint32_t in_map = sw->ReplicaOf(group.ranks[k]);
    if (in_map != group.replicas[k] && in_map != group.ranks[k]) {
      return what + ": rank " + std::to_string(group.ranks[k]) + " is replica " + std::to_string(group.replicas[k]) +
             " here but replica " + std::to_string(in_map) + " in the JobSwitch's map";
    }
  }
  return "";
}

std::vector<uint32_t> GroupActiveRanks(const std::vector<uint32_t>& job_active, const DataParallelGroup& group,
                                       const JobSwitch& sw) {
  // A replica is out when any of its ranks is (the data-parallel all-reduce
  // can only leave out whole model copies). The ranks outside the job's set,
  // walked alongside it (both ascending): usually few, so their replicas
  // are a short sorted list rather than a set or a world-sized table.
  std::vector<uint32_t> out;
  auto next = job_active.begin();
  for (uint32_t r = 0; r < sw.world_size(); ++r) {
    while (next != job_active.end() && *next < r) ++next;
    if (next == job_active.end() || *next != r) out.push_back(sw.ReplicaOf(r));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  std::vector<uint32_t> active;
  active.reserve(group.ranks.size());
  for (uint32_t r : group.ranks) {
    if (!std::binary_search(out.begin(), out.end(), sw.ReplicaOf(r))) active.push_back(r);
  }
  std::sort(active.begin(), active.end());
  return active;
}

uint32_t GroupRoot(const DataParallelGroup& group, const std::vector<uint32_t>& active) {
  // The active member of the lowest replica (the group's own replica
  // numbers; the same position in the model on every group). 0: none.
  uint32_t root = 0;
  uint32_t lowest = UINT32_MAX;
  for (size_t k = 0; k < group.ranks.size(); ++k) {
    if (group.replicas[k] < lowest && std::binary_search(active.begin(), active.end(), group.ranks[k])) {
      lowest = group.replicas[k];
      root = group.ranks[k];
    }
  }
  return root;
}

const GroupActive& GroupActiveCache::Get(const StepPlan& job, const DataParallelGroup& group, const JobSwitch& sw) {
  if (!valid_ || job.version != version_ || job.active_ranks != job_active_) {
    value_.ranks = GroupActiveRanks(job.active_ranks, group, sw);
    value_.root = GroupRoot(group, value_.ranks);
    job_active_ = job.active_ranks;
    version_ = job.version;
    valid_ = true;
  }
  return value_;
}

StepPlan GroupStepPlan(const StepPlan& job, const DataParallelGroup& group, const JobSwitch& sw, uint32_t rank,
                       const GroupHistory& history) {
  GroupActive active;
  active.ranks = GroupActiveRanks(job.active_ranks, group, sw);
  active.root = GroupRoot(group, active.ranks);
  return GroupStepPlan(job, active, rank, history);
}

StepPlan GroupStepPlan(const StepPlan& job, const GroupActive& active, uint32_t rank, const GroupHistory& history) {
  StepPlan plan;
  plan.iteration = job.iteration;
  plan.version = job.version;
  plan.effective_iteration = job.effective_iteration;
  plan.certain = job.certain;
  plan.deferred_version = job.deferred_version;
  plan.active_ranks = active.ranks;
  plan.participating =
      job.participating && std::binary_search(plan.active_ranks.begin(), plan.active_ranks.end(), rank);
  plan.root = active.root;
  if (plan.participating && history.begun && history.previously_participating &&
      std::ranges::equal(history.previous_active, plan.active_ranks)) {
    // The steady state: the same set as at the previous iteration, nobody new.
  } else if (plan.participating) {
    for (uint32_t r : plan.active_ranks) {
      if (!history.begun || !history.previously_participating ||
          !std::binary_search(history.previous_active.begin(), history.previous_active.end(), r)) {
        plan.sync_parameters = true;
        break;
      }
    }
  } else {
    plan.rejoin_iteration = job.rejoin_iteration;
  }
  return plan;
}

StepPlan GroupPlanFor(uint64_t iteration, const Agreement& history, JobSwitch& sw, const DataParallelGroup& group,
                      uint32_t rank, GroupActiveCache& cache) {
  if (history.begun() && iteration <= history.plan().iteration) {
    throw CollectiveError("BeginIteration(" + std::to_string(iteration) + ") of " + GroupWhat(group.name) +
                          " after iteration " + std::to_string(history.plan().iteration) +
                          ": iterations must increase");
  }
  const StepPlan& job = sw.Begin(iteration);
  return GroupStepPlan(job, cache.Get(job, group, sw), rank,
                       {history.begun(), history.previously_participating(), history.previous_active()});
}

StepPlan PlanOf(uint64_t iteration, Agreement& agreement, Client& client, const CollectiveOptions& options,
                AgreementTransport& transport, JobSwitch* sw, const std::optional<DataParallelGroup>& group,
                GroupActiveCache& cache) {
  if (sw != nullptr && group) return GroupPlanFor(iteration, agreement, *sw, *group, options.rank, cache);
  return agreement.Decide(iteration, client,
                          {options.membership_timeout, options.collective_timeout, options.agreement_interval},
                          transport);
}

}  // namespace detail
}  // namespace straggler
