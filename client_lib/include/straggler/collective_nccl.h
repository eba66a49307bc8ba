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
//    there then); it serves while everyone is active. Every active set has
//    a communicator, a set of one rank too (NCCL's one-rank path).
//  * The in-band agreement of collective.h runs on the communicator the
//    previous set used (the full one at the first iteration): a 5-element
//    ncclUint64 ncclMin all-reduce and one stream synchronisation per
//    iteration (per agreement_interval iterations).
//  * Exclusion: the surviving ranks - and only they - call ncclCommShrink on
//    the communicator they all used at the previous iteration; the excluded
//    rank is never waited on (never ncclCommSplit, which it would have to enter).
//  * Readmission (the set gained ranks): with NCCL >= 2.29 (ncclCommGrow),
//    the members grow the previous set's communicator, keeping their
//    numbers, and the joiners are appended; otherwise a fresh communicator
//    through ncclCommInitRankConfig, built, non-blocking, as soon as a rank
//    knows the next version (CurrentMembership, ~lead iterations ahead), so
//    the switch iteration only waits for what is left. Either way the
//    lowest rank of the set publishes the id, and how to use it, under a key
//    naming run, version and set.
//  * A failed collective: with NCCL >= 2.28.7 the communicator is stopped
//    with ncclCommRevoke and kept, so the survivors can still shrink it;
//    otherwise it is aborted and the next set is built fresh.
//  * Versions: both are chosen at compile time (the nccl.h built against)
//    and at run time (ncclGetVersion of the libnccl.so.2 loaded, in a
//    PyTorch process usually torch's own), and called through dlsym, so a
//    library built against one NCCL runs against an older or newer one
//    (docs/gpu.md, NcclRuntimeDescription).
//  * Every new communicator is warmed up by a one-element all-reduce before
//    its first real collective. Communicators are cached per active set (LRU,
//    max_cached_communicators) and released with finalize + destroy, or
//    ncclCommAbort after an error or when finalizing does not finish in time.
//  * Averages use ncclAvg on a communicator whose ranks are exactly the active
//    set, so they divide by the number of active ranks.
//  * Every wait is bounded by collective_timeout: communicators are
//    non-blocking and polled with ncclCommGetAsyncError; a dead or diverged
//    peer turns into a CollectiveError naming iteration, set and version (the
//    communicator is then revoked or aborted), never a hang.
//
// Buffers: AllReduceAverage and SyncParameters accept device memory (used in
// place) or host memory (staged through a device buffer). Both return after
// the result is in the buffer: they synchronise with the stream (NcclOptions::
// stream, or the one SetStream gave). On the caller's stream a collective
// is ordered after the work already queued there (the backward that
// produced the gradients) without a device-wide synchronisation.
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
  // A rendezvous store of the trainer's own, as GlooOptions::rendezvous_store
  // (straggler/collective_gloo.h; the same contract): straggler.torch passes torch.distributed's, so the
  // ids of the communicators and the agreement's keys need no daemon (under
  // torchrun the job starts and trains on the full group without one).
  // rendezvous_endpoint is then unused.
  std::shared_ptr<gloo::rendezvous::Store> rendezvous_store;

  // Empty when usable, else what is wrong, naming the value.
  std::string Validate() const;
};

// The NCCL backend's own additions to PartialAllReduce.
class NcclPartialAllReduce : public PartialAllReduce {
 public:
  // The cudaStream_t (a void*) the next collectives run on, until the next
  // call: a trainer passes its current stream (PyTorch's
  // torch.cuda.current_stream().cuda_stream) before each step's collectives.
  // nullptr: back to NcclOptions::stream (or the backend's own).
  virtual void SetStream(void* stream) = 0;
  // The CUDA device the collectives run on (NcclOptions::device, or the one
  // current at creation when that was -1).
  virtual int Device() const = 0;
};

// Builds the full communicator (every rank must call this within
// collective_timeout). `client` reports for options.rank and must outlive the
// result. Fails (nullptr + *error) on invalid options, a CUDA error, or when
// the full communicator cannot be built in time (the error names the step).
std::unique_ptr<NcclPartialAllReduce> CreateNcclPartialAllReduce(Client& client,
                                                                 const NcclOptions& options,
                                                                 std::string* error = nullptr);

// One data-parallel group of a hybrid job on NCCL (docs/hybrid.md): the same
// plan as the flat backend over the group's ranks - a full communicator of the
// group built here (every member must call this within collective_timeout),
// ncclCommShrink by the group's survivors when a replica leaves, a fresh (or
// grown) communicator when it comes back - with the plan taken from
// `job_switch` (CreateGlooGroupPartialAllReduce in straggler/collective_gloo.h has
// the contract). nullptr + *error as above, or on an invalid group.
std::unique_ptr<NcclPartialAllReduce> CreateNcclGroupPartialAllReduce(Client& client,
                                                                      std::shared_ptr<JobSwitch> job_switch,
                                                                      const DataParallelGroup& group,
                                                                      const NcclOptions& options,
                                                                      std::string* error = nullptr);

// "NCCL 2.28.9 (built against 2.28.9): ncclCommRevoke yes, ncclCommGrow no
// (...)": the loaded libnccl and which membership calls it allows.
std::string NcclRuntimeDescription();

// The number of CUDA devices visible to this process; 0 with *error set when
// there is no driver or no device (so a test can skip with the reason).
int NcclVisibleDevices(std::string* error = nullptr);

}  // namespace straggler
