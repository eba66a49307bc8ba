// straggler::CudaComputeTimer — measures each iteration's compute time on the
// GPU (CUDA events on the trainer's stream) and reports it through a
// straggler::Client, without ever synchronising the training step.
//
//   auto client = straggler::Client::Create(straggler::ClientOptions::FromEnv());
//   cudaSetDevice(local_rank);                       // before Create: events live there
//   auto timer = straggler::CudaComputeTimer::Create(*client);
//   for (uint64_t it = 0; ...; ++it) {
//     timer->Begin(stream, epoch, it);   // cudaEventRecord(start, stream); returns at once
//     forward_backward(stream);          // kernels queued on `stream`
//     timer->End(stream);                // cudaEventRecord(end, stream); returns at once
//     allreduce(...);                    // not timed: collective waits stay out
//   }
//
// Begin/End only record events taken from a pool created up front (no
// cudaEventCreate per iteration). A resolver thread polls the oldest pending
// end event (cudaEventQuery), reads cudaEventElapsedTime once it completed and
// calls Client::Report(rank, epoch, iteration, seconds). At most `max_pending`
// iterations may be in flight; Begin on a full pool drops that iteration and
// counts it (Stats().dropped_full) instead of waiting for the GPU.
//
// The measured interval is GPU time between the two events, so it includes
// whatever else the stream (or, for the legacy default stream, the device)
// ran in between - on a stream of its own that is the step's compute.
//
// The stream is a cudaStream_t passed as void* (nullptr = the legacy default
// stream), so this header needs no CUDA include. The library links the CUDA
// runtime statically; a trainer needs only the NVIDIA driver at run time.
//
// Thread safety: Begin and End are for one thread at a time (the training
// thread); Stats may be called from any thread concurrently with them. The
// destructor must not run concurrently with Begin/End; the Client must
// outlive the timer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <straggler/client.h>

namespace straggler {

struct CudaTimerOptions {
  std::optional<uint32_t> rank;  // reported rank; default: client.FirstRank()
  int device = -1;               // -1: the creating thread's current CUDA device
  size_t max_pending = 64;       // iterations recorded but not yet resolved (>= 1)
  // How often the resolver re-queries an end event that has not completed.
  // A report reaches the client at most this much after the GPU finished.
  std::chrono::microseconds poll_interval{500};
  // On destruction, how long to wait for in-flight iterations to complete
  // before abandoning them (Stats().abandoned).
  std::chrono::milliseconds drain_timeout{1000};
};

struct CudaTimerStats {
  uint64_t begun = 0;            // Begin calls that recorded a start event
  uint64_t reported = 0;         // resolved and accepted by Client::Report
  uint64_t report_dropped = 0;   // resolved, but Client::Report refused it (its queue full)
  uint64_t dropped_full = 0;     // Begin found max_pending iterations in flight
  uint64_t unmatched = 0;        // End without Begin, or Begin twice without End
  uint64_t errors = 0;           // CUDA calls that failed (see last_error)
  uint64_t abandoned = 0;        // still in flight when the drain timeout passed
  std::string last_error;        // "cudaEventRecord: invalid resource handle (cudaErrorInvalidResourceHandle)"
};

class CudaComputeTimer {
 public:
  // Creates the event pool on the device and starts the resolver thread.
  // Fails (nullptr + *error naming the CUDA call and error) when there is no
  // usable CUDA device or the options are invalid.
  static std::unique_ptr<CudaComputeTimer> Create(Client& client,
                                                  const CudaTimerOptions& options = {},
                                                  std::string* error = nullptr);
  // Waits up to drain_timeout for in-flight iterations, reports them, stops
  // the resolver and releases the events (a still-pending event is released
  // by the driver once it completes).
  ~CudaComputeTimer();

  // Records the start event of (epoch, iteration) on `stream`. Never blocks.
  // false: not timed (pool full, a CUDA error, see Stats()).
  bool Begin(void* stream, uint64_t epoch, uint64_t iteration);
  // Records the end event on `stream` (normally the Begin stream) and hands
  // the iteration to the resolver. Never blocks. false: nothing to end, or a
  // CUDA error.
  bool End(void* stream);

  CudaTimerStats Stats() const;

  CudaComputeTimer(const CudaComputeTimer&) = delete;
  CudaComputeTimer& operator=(const CudaComputeTimer&) = delete;

  class Impl;

 private:
  explicit CudaComputeTimer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace straggler
