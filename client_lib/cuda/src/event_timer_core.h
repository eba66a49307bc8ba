// The GPU-independent half of CudaComputeTimer: the fixed pool of event
// slots used as a single-producer/single-consumer ring, the resolver thread,
// the drop/error accounting and the shutdown drain. The CUDA calls sit behind
// EventBackend, so the tests drive all of this with a fake backend on
// machines without CUDA (tests/cuda/event_timer_core_test.cc).
//
//   EventTimerCore core(client, std::make_unique<MyBackend>(/*slots=*/64), options);
//   core.Begin(stream, epoch, it);  ...  core.End(stream);
//
// Thread safety: Begin/End from one thread at a time (the producer); Stats
// from any thread; Shutdown/the destructor not concurrently with Begin/End.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>  // std::once_flag
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "straggler/client.h"

namespace straggler::detail {

// A pool of `Slots()` start/end event pairs created up front. Slot i is
// recorded by the producer and read by the resolver, never both at once:
// the core hands a slot back to the producer only after the resolver is done
// with it.
class EventBackend {
 public:
  enum class Result { kOk, kNotReady, kError };
  virtual ~EventBackend() = default;
  virtual size_t Slots() const = 0;
  // Producer thread. On kError, *error names the call and the error.
  virtual Result RecordStart(size_t slot, void* stream, std::string* error) = 0;
  virtual Result RecordEnd(size_t slot, void* stream, std::string* error) = 0;
  // Resolver thread, once before anything else (e.g. select the device).
  virtual void BindResolverThread() {}
  // Resolver thread: kNotReady until the slot's end event completed, then
  // the seconds between its start and end events.
  virtual Result Elapsed(size_t slot, double* seconds, std::string* error) = 0;
};

struct EventTimerCoreOptions {
  uint32_t rank = 0;
  std::chrono::microseconds poll_interval{500};
  std::chrono::milliseconds drain_timeout{1000};
};

class EventTimerCore {
 public:
  struct Counters {
    uint64_t begun = 0, reported = 0, report_dropped = 0, dropped_full = 0, unmatched = 0,
             errors = 0, abandoned = 0;
    std::string last_error;
  };

  // Starts the resolver thread. backend->Slots() must be >= 1.
  EventTimerCore(Client& client, std::unique_ptr<EventBackend> backend,
                 EventTimerCoreOptions options);
  ~EventTimerCore();  // Shutdown()

  bool Begin(void* stream, uint64_t epoch, uint64_t iteration);
  bool End(void* stream);
  Counters Stats() const;
  // Resolves what completes within drain_timeout, abandons the rest, joins
  // the resolver. Idempotent.
  void Shutdown();

  EventTimerCore(const EventTimerCore&) = delete;
  EventTimerCore& operator=(const EventTimerCore&) = delete;

 private:
  struct Slot {
    uint64_t epoch = 0;
    uint64_t iteration = 0;
  };

  void ResolverLoop();
  void RecordError(const std::string& error) ABSL_LOCKS_EXCLUDED(error_mu_);

  Client& client_;
  std::unique_ptr<EventBackend> backend_;
  const EventTimerCoreOptions options_;
  const size_t capacity_;
  std::vector<Slot> slots_;

  // Ring positions (monotonic counts): [tail_, head_) are published and not
  // yet resolved. head_ is written by the producer only, tail_ by the
  // resolver only.
  std::atomic<uint64_t> head_{0};
  std::atomic<uint64_t> tail_{0};
  // Bumped after each publish and on shutdown; the resolver sleeps on it
  // (futex) when the ring is empty, so an idle timer costs no CPU.
  std::atomic<uint32_t> wake_{0};
  std::atomic<bool> stopping_{false};
  std::chrono::steady_clock::time_point drain_deadline_;  // written before stopping_

  // Producer-only state: an iteration between Begin and End.
  enum class Open { kNone, kRecorded, kDropped };
  Open open_ = Open::kNone;

  std::atomic<uint64_t> begun_{0}, reported_{0}, report_dropped_{0}, dropped_full_{0},
      unmatched_{0}, errors_{0}, abandoned_{0};
  mutable absl::Mutex error_mu_;  // taken only when a CUDA call failed (and by Stats)
  std::string last_error_ ABSL_GUARDED_BY(error_mu_);

  std::once_flag shutdown_once_;
  std::thread resolver_;
};

}  // namespace straggler::detail
