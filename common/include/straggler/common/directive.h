// The coalescing of Directives, shared by every directive write slot: the
// daemon's ingest streams and straggler-agent's downstream streams.
//
//   slot.Offer(std::move(directive), &MergeDirective);  // write_slot.h
//
// Pure functions; no shared state.
#pragma once

#include "straggler/v1/straggler.pb.h"

namespace straggler::common {

namespace v1 = ::straggler::v1;

// Directives carry at most this many rejections; the counts carry the rest.
inline constexpr int kMaxDirectiveRejections = 8;

// A newer directive folded into a pending one: memberships are the union
// (ascending by version) capped to the newest kMembershipHistory versions (the
// engine keeps no more either, and a peer that stopped reading must cost
// bounded memory), acknowledgement is the newer one, progress is the union
// per rank (the higher iteration: a directive carries only the ranks its batch
// touched), counts add up over the batches the merged directive acknowledges.
// Used by every coalescing directive write slot (daemon streams, agent
// downstream streams).
void MergeDirective(v1::Directive& pending, v1::Directive&& newer);

}  // namespace straggler::common
