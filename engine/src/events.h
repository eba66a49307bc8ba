// The one place an engine Event is made. Every event kind is about the whole
// job or about one rank (EventNamesRank); these two helpers fill exactly the
// fields that kind means, so no caller builds an Event field by field.
// Stateless: safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "straggler/engine/job_engine.h"

namespace straggler::engine::internal {

// An event about the whole job (membership, policy_changed, reset, reprofile).
Event JobEvent(EventKind kind, Time now, uint64_t iteration, uint64_t membership_version,
               std::string message);

// An event about `rank` (state_change, guard_blocked, override,
// membership_withheld), with its state before and after (equal when the
// event changes no state).
Event RankEvent(EventKind kind, Time now, uint32_t rank, WorkerState from, WorkerState to,
                uint64_t iteration, uint64_t membership_version, std::string message);

}  // namespace straggler::engine::internal
