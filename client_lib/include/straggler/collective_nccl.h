// straggler::CreateNcclPartialAllReduce — the GPU (NCCL) backend of
// PartialAllReduce (straggler/collective.h), in libstraggler_collective_nccl,
// built only where CUDA and NCCL (>= 2.27, for ncclCommShrink) were found.
// This header carries no CUDA or NCCL type: the stream is a void*.
//
//   straggler::NcclOptions o;  // rendezvous_endpoint, job_id, rank, world_size, device
//   auto reducer = straggler::CreateNcclPartialAllReduce(*client, o, &error);
//   // ... the same loop as the Gloo backend; buffers may be device memory.
//
// How the active set acts on communicators (docs/collective.md):
//  * One full communicator over all ranks, built at creation (every rank is
//    there then); it serves while everyone is active.
//  * The in-band agreement of collective.h runs on the communicator the
//    previous set used (the full one at the first iteration): a 5-element
//    ncclUint64 ncclMin all-reduce and one stream synchronisation per
//    iteration (per agreement_interval iterations).
//  * Exclusion: the surviving ranks - and only they - call ncclCommShrink on
//    the communicator they all used at the previous iteration; the excluded
//    rank is never waited on (never ncclCommSplit, which it would have to enter).
//  * Readmission (the set gained ranks): a fresh communicator through
//    ncclCommInitRankConfig, its ncclUniqueId published by the lowest rank of
//    the set under a key naming run, version and set. It is built, non-blocking,
//    as soon as a rank knows the next version (CurrentMembership, ~lead
//    iterations ahead), so the switch iteration only waits for what is left.
//  * Every new communicator is warmed up by a one-element all-reduce before
//    its first real collective. Communicators are cached per active set (LRU,
//    max_cached_communicators) and released with finalize + destroy, or
//    ncclCommAbort after an error or when finalizing does not finish in time.
//  * Averages use ncclAvg on a communicator whose ranks are exactly the active
//    set, so they divide by the number of active ranks.
//  * Every wait is bounded by collective_timeout: communicators are
//    non-blocking and polled with ncclCommGetAsyncError; a dead or diverged
//    peer turns into a CollectiveError naming iteration, set and version (the
//    communicator is then aborted), never a hang.
//
// Buffers: AllReduceAverage and SyncParameters accept device memory (used in
// place) or host memory (staged through a device buffer). Both return after
// the result is in the buffer: they synchronise with `stream`.
//
// Thread safety: as PartialAllReduce - one thread (the training loop) uses it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "straggler/client.h"
#include "straggler/collective.h"

namespace straggler {

// The shared fields (rendezvous_endpoint: the daemon serving RendezvousService,
// which publishes the ids of new communicators; timeouts; agreement_interval;
// run_id; key_ttl) are CollectiveOptions' (straggler/collective.h).
struct NcclOptions : CollectiveOptions {
  // The CUDA device of this rank (made current by the backend's calls);
  // -1: the device current when CreateNcclPartialAllReduce is called. NCCL
  // refuses two ranks of one communicator on the same GPU.
  int device = -1;
  // A cudaStream_t for the collectives; nullptr: a stream of the backend's own.
  void* stream = nullptr;
  // Communicators kept at once besides the full one (each holds GPU memory).
  // The one in use and one built ahead of a switch are never evicted.
  size_t max_cached_communicators = 3;

  // Empty when usable, else what is wrong, naming the value.
  std::string Validate() const;
};

// Builds the full communicator (every rank must call this within
// collective_timeout). `client` reports for options.rank and must outlive the
// result. Fails (nullptr + *error) on invalid options, a CUDA error, or when
// the full communicator cannot be built in time (the error names the step).
std::unique_ptr<PartialAllReduce> CreateNcclPartialAllReduce(Client& client,
                                                             const NcclOptions& options,
                                                             std::string* error = nullptr);

// The number of CUDA devices visible to this process; 0 with *error set when
// there is no driver or no device (so a test can skip with the reason).
int NcclVisibleDevices(std::string* error = nullptr);

}  // namespace straggler
