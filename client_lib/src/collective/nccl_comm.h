// The CUDA and NCCL steps under the NCCL backend of PartialAllReduce
// (nccl_partial_allreduce.cc): a communicator of one active set, and the
// operations on it that do not decide anything - issue an init or a grow
// (ids through the rendezvous store), wait with a bound, warm up, revoke,
// release. The decisions (which of these, for which set) are nccl_plan.h's.
//
//   CommOps ops(rank, device, timeout, store);
//   ops.StartInit(c, key, deadline, /*blocking_get=*/true);
//   ops.Finish(c, iteration, deadline, "ncclCommInitRankConfig");
//
// Not thread-safe: used by the one thread that drives a PartialAllReduce.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nccl_calls.h"

namespace straggler::detail {

// Every CUDA and NCCL call is checked where it is made; the error names the
// call, the file and line and the library's own message (STYLE.md).
[[noreturn]] void ThrowCall(const std::string& call, const char* file, int line, const std::string& why);
#define STRAGGLER_CUDA_CHECK(expr)                                                      \
  do {                                                                                  \
    cudaError_t e_ = (expr);                                                            \
    if (e_ != cudaSuccess)                                                              \
      ::straggler::detail::ThrowCall(#expr, __FILE__, __LINE__, cudaGetErrorString(e_)); \
  } while (0)
// Non-blocking communicators answer ncclInProgress: the call was accepted and
// completes in the background (polled with ncclCommGetAsyncError).
#define STRAGGLER_NCCL_START(expr)                                                        \
  do {                                                                                    \
    ncclResult_t r_ = (expr);                                                             \
    if (r_ != ncclSuccess && r_ != ncclInProgress)                                        \
      ::straggler::detail::ThrowCall(#expr, __FILE__, __LINE__,                           \
                std::string(ncclGetErrorString(r_)) + " (" + ncclGetLastError(nullptr) + ")"); \
  } while (0)

using Clock = std::chrono::steady_clock;

// A communicator of one active set (a set of one rank too: NCCL's one-rank
// path, so one GPU runs the code many do).
struct Comm {
  ncclComm_t comm = nullptr;
  std::vector<uint32_t> ranks;  // the active set, ascending
  // Communicator rank -> job rank: ascending, except after ncclCommGrow,
  // which appends the joiners (and shrinks of such a communicator).
  std::vector<uint32_t> order;
  uint64_t version = 0;
  bool started = false;  // init/shrink/grow issued (a pending build may wait for its id)
  bool ready = false;    // built and warmed up
  // A shrink whose asynchronous job may still write `comm` (see Shrink).
  bool child_of_async_job = false;
  // Stopped by ncclCommRevoke after a failed collective: quiescent, refuses
  // collectives, may still be shrunk or destroyed (never finalized).
  bool revoked = false;
};
using CommPtr = std::unique_ptr<Comm>;

ncclConfig_t NonBlockingConfig();

class CommOps {
 public:
  // `store` must outlive this. `timeout`: collective_timeout, the bound of
  // each wait.
  CommOps(uint32_t rank, int device, std::chrono::milliseconds timeout, gloo::rendezvous::Store& store);
  ~CommOps();
  CommOps(const CommOps&) = delete;
  CommOps& operator=(const CommOps&) = delete;

  cudaStream_t stream() const { return stream_; }
  void set_stream(cudaStream_t stream) { stream_ = stream; }
  int device() const { return device_; }

  // Waits until `c`'s pending init/shrink/grow/finalize/revoke has completed,
  // polling ncclCommGetAsyncError (the non-blocking contract), up to `deadline`.
  void WaitComm(Comm& c, Clock::time_point deadline, const std::string& what) const;
  // Waits for the stream while watching `c` for asynchronous errors (a peer
  // that died makes NCCL report ncclRemoteError/SystemError).
  void WaitStream(Comm& c, Clock::time_point deadline) const;

  // Issues the build of `c` (non-blocking) from the record under `key`. The
  // lowest rank of the set makes an ncclUniqueId and publishes an init
  // record; the others read the record - with blocking_get, waiting up to
  // `deadline`; without, only if it is already there (a build ahead of the
  // switch must not stall this iteration) - and init, or, for a grow record
  // (ReadmissionRecord), enter the grown communicator as joiners. Returns
  // whether the build was issued.
  bool StartInit(Comm& c, const std::string& key, Clock::time_point deadline, bool blocking_get);
  // A member of the previous set grows its communicator `parent` to `c.ranks`
  // (NcclCalls::features().grow). The lowest rank coordinates: it takes the
  // id from ncclCommGetUniqueId(parent) and publishes a grow record under
  // `key` for the joiners.
  void StartGrow(Comm& c, Comm& parent, const std::string& key);
  // Completes a started build and warms it up with a one-element
  // all-reduce, so the first real collective pays no connection setup and a
  // missing member is noticed here, naming the build.
  void Finish(Comm& c, uint64_t iteration, Clock::time_point deadline, const std::string& what);
  // After a failed collective: stops `c` with ncclCommRevoke where the
  // loaded NCCL has it and marks it revoked (it stays usable for a shrink).
  // False when there is no revoke, or it did not settle in time: the caller
  // aborts instead.
  bool Revoke(Comm& c);
  // Healthy and built: finalize (flushes its operations), bounded, then
  // destroy. Revoked: destroy. Otherwise - after an error, a build that
  // never finished, or a finalize that does not finish in time - abort,
  // which never waits on peers.
  void Release(CommPtr& c, bool healthy);

  // A device buffer of at least `bytes` (host buffers are staged through it).
  void* Scratch(size_t bytes);
  static bool IsDevicePointer(const void* p);

 private:
  const uint32_t rank_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  gloo::rendezvous::Store& store_;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace straggler::detail
