// Names of the engine's enums and the event helpers (events.h).
#include "events.h"

#include <algorithm>
#include <utility>

namespace straggler::engine {

std::string_view WorkerStateName(WorkerState s) {
  switch (s) {
    case WorkerState::kPending: return "pending";
    case WorkerState::kHealthy: return "healthy";
    case WorkerState::kStraggler: return "straggler";
    case WorkerState::kUnresponsive: return "unresponsive";
    case WorkerState::kFinished: return "finished";
    case WorkerState::kMild: return "mild";
  }
  return "unknown";
}

std::string_view ExclusionReasonName(ExclusionReason r) {
  switch (r) {
    case ExclusionReason::kNone: return "none";
    case ExclusionReason::kStraggler: return "straggler";
    case ExclusionReason::kUnresponsive: return "unresponsive";
    case ExclusionReason::kForced: return "forced";
    case ExclusionReason::kProbationEnd: return "probation_end";
    case ExclusionReason::kReplica: return "replica";
  }
  return "unknown";
}

std::string_view EventKindName(EventKind k) {
  switch (k) {
    case EventKind::kStateChange: return "state_change";
    case EventKind::kMembership: return "membership";
    case EventKind::kGuardBlocked: return "guard_blocked";
    case EventKind::kPolicyChanged: return "policy_changed";
    case EventKind::kOverride: return "override";
    case EventKind::kReset: return "reset";
    case EventKind::kReprofile: return "reprofile";
    case EventKind::kMembershipWithheld: return "membership_withheld";
    case EventKind::kJobLost: return "job_lost";
  }
  return "unknown";
}

bool EventNamesRank(EventKind k) {
  return k == EventKind::kStateChange || k == EventKind::kGuardBlocked ||
         k == EventKind::kOverride || k == EventKind::kMembershipWithheld;
}

std::string_view RejectReasonName(RejectReason r) {
  switch (r) {
    case RejectReason::kNone: return "none";
    case RejectReason::kInvalidValue: return "invalid_value";
    case RejectReason::kRankOutOfRange: return "rank_out_of_range";
    case RejectReason::kDuplicate: return "duplicate";
    case RejectReason::kStale: return "stale";
    case RejectReason::kTooFarAhead: return "too_far_ahead";
  }
  return "unknown";
}

namespace internal {

Event JobEvent(EventKind kind, Time now, uint64_t iteration, uint64_t membership_version,
               std::string message) {
  Event e;
  e.time = now;
  e.kind = kind;
  e.iteration = iteration;
  e.membership_version = membership_version;
  e.message = std::move(message);
  return e;
}

Event RankEvent(EventKind kind, Time now, uint32_t rank, WorkerState from, WorkerState to,
                uint64_t iteration, uint64_t membership_version, std::string message) {
  Event e = JobEvent(kind, now, iteration, membership_version, std::move(message));
  e.rank = rank;
  e.from = from;
  e.to = to;
  return e;
}

}  // namespace internal
}  // namespace straggler::engine
