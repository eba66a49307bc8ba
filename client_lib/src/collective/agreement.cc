#include "agreement.h"

#include <algorithm>

#include "nccl_plan.h"  // SetText

namespace straggler::detail {

Agreement::Agreement(uint32_t rank, std::vector<uint32_t> previous_active,
                     bool previously_participating)
    : rank_(rank),
      previous_active_(std::move(previous_active)),
      previously_participating_(previously_participating) {}

StepPlan Agreement::Decide(uint64_t iteration, Client& client, std::chrono::milliseconds timeout) {
  if (begun_ && iteration <= plan_.iteration) {
    throw CollectiveError("BeginIteration(" + std::to_string(iteration) + ") after iteration " +
                          std::to_string(plan_.iteration) + ": iterations must increase");
  }
  MembershipView m = client.MembershipFor(iteration, timeout, rank_);
  const bool certain = m.ok;
  if (!certain && applied_) {
    // Never guess: a version this rank has received but cannot prove final
    // may not have reached the other ranks (the daemon may have died while
    // pushing it). The last applied membership is the one every rank that
    // was in step at the previous iteration holds.
    m = *applied_;
  }
  // (No applied membership and no answer: the first iteration of a rank
  // whose daemon is down. MembershipFor then returns the best known, which
  // is version 0 - everyone - unless a directive arrived: the same choice
  // every other rank in that position makes.)
  StepPlan plan;
  plan.iteration = iteration;
  plan.version = m.version;
  plan.effective_iteration = m.effective_iteration;
  plan.certain = certain;
  plan.participating = !m.IsExcluded(rank_);
  plan.active_ranks = m.ActiveRanks();
  plan.root = plan.active_ranks.empty() ? 0 : plan.active_ranks.front();
  // Ranks that were not active at this rank's previous iteration need the
  // parameters. Every active rank computes the same answer: those active
  // before all applied the same previous membership, and a rejoiner was
  // not active in its previous one.
  for (uint32_t r : plan.active_ranks) {
    if (!begun_ || !previously_participating_ ||
        !std::binary_search(previous_active_.begin(), previous_active_.end(), r)) {
      plan.sync_parameters = plan.participating;
      break;
    }
  }
  if (!plan.participating) {
    if (std::optional<MembershipView> back = client.ReadmissionAfter(iteration, rank_))
      plan.rejoin_iteration = back->effective_iteration;
  }
  decided_ = std::move(m);
  return plan;
}

void Agreement::Commit(StepPlan plan) {
  applied_ = decided_;
  previous_active_ = plan.active_ranks;
  previously_participating_ = plan.participating;
  plan_ = std::move(plan);
  begun_ = true;
}

void Agreement::RequireBegun(const char* what) const {
  if (!begun_) throw CollectiveError(std::string(what) + " before the first BeginIteration");
}

std::string Agreement::FailureText(std::string_view backend, std::string_view op,
                                   std::chrono::milliseconds timeout) const {
  return "iteration " + std::to_string(plan_.iteration) + ": " + std::string(backend) + " " +
         std::string(op) + " among ranks " + SetText(plan_.active_ranks) +
         " (membership version " + std::to_string(plan_.version) +
         (plan_.certain ? ", certain" : ", kept after MembershipFor timed out") +
         ") failed within " + std::to_string(timeout.count()) +
         " ms; a peer is gone or applied another membership";
}

std::string ValidateCommonOptions(const std::string& job_id, uint32_t rank, uint32_t world_size,
                                  const std::string& rendezvous_endpoint,
                                  std::chrono::milliseconds collective_timeout,
                                  std::chrono::milliseconds membership_timeout) {
  if (job_id.empty()) return "job_id is empty";
  if (world_size == 0) return "world_size=0 must be > 0";
  if (rank >= world_size) {
    return "rank=" + std::to_string(rank) + " must be < world_size=" + std::to_string(world_size);
  }
  if (rendezvous_endpoint.empty()) {
    return "rendezvous_endpoint is empty: name stragglerd's gRPC address (the rendezvous store "
           "is served by the daemon, not by the node agent), e.g. with "
           "STRAGGLER_RENDEZVOUS_ENDPOINT";
  }
  if (collective_timeout.count() <= 0) {
    return "collective_timeout=" + std::to_string(collective_timeout.count()) + "ms must be > 0";
  }
  if (membership_timeout.count() < 0) {
    return "membership_timeout=" + std::to_string(membership_timeout.count()) + "ms must be >= 0";
  }
  return "";
}

}  // namespace straggler::detail
