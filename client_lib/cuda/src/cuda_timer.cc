// CudaComputeTimer over the CUDA runtime: the EventBackend that owns the
// event pool, and the C ABI. Everything that is not a CUDA call is in
// event_timer_core.cc.
#include "straggler/cuda_timer.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "c_api_internal.h"
#include "event_timer_core.h"
#include "straggler/straggler_cuda_c.h"

namespace straggler {
namespace {

// "cudaEventRecord: invalid resource handle (cudaErrorInvalidResourceHandle)"
std::string CudaError(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
}

// Evaluates a CUDA runtime call; on failure stores the call, its error name
// and string in *error and returns `fail` from the enclosing function.
#define STRAGGLER_CUDA_CHECK(call, error, fail)        \
  do {                                                 \
    const cudaError_t e_ = (call);                     \
    if (e_ != cudaSuccess) {                           \
      if ((error) != nullptr) *(error) = CudaError(#call, e_); \
      return fail;                                     \
    }                                                  \
  } while (0)

class CudaEventBackend final : public detail::EventBackend {
 public:
  ~CudaEventBackend() override {
    // An event still pending on a stream is released by the driver once it
    // completes (cudaEventDestroy does not block), so nothing waits here.
    int previous = -1;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (switched) cudaSetDevice(previous);
  }

  // Creates 2 * slots timing events on `device` (-1: current device).
  static std::unique_ptr<CudaEventBackend> Create(int device, size_t slots, std::string* error) {
    auto b = std::unique_ptr<CudaEventBackend>(new CudaEventBackend());
    int current = 0;
    STRAGGLER_CUDA_CHECK(cudaGetDevice(&current), error, nullptr);
    b->device_ = device < 0 ? current : device;
    if (b->device_ != current) STRAGGLER_CUDA_CHECK(cudaSetDevice(b->device_), error, nullptr);
    std::string failure;
    b->events_.reserve(2 * slots);
    for (size_t i = 0; i < 2 * slots && failure.empty(); ++i) {
      cudaEvent_t e = nullptr;
      // Timing enabled (no cudaEventDisableTiming); BlockingSync is moot:
      // nobody synchronises on these events, the resolver only queries.
      const cudaError_t rc = cudaEventCreateWithFlags(&e, cudaEventDefault);
      if (rc != cudaSuccess) {
        failure = CudaError("cudaEventCreateWithFlags", rc);
      } else {
        b->events_.push_back(e);
      }
    }
    if (b->device_ != current) cudaSetDevice(current);
    if (!failure.empty()) {
      if (error != nullptr) *error = failure;
      return nullptr;  // the destructor frees the events created so far
    }
    b->slots_ = slots;
    return b;
  }

  size_t Slots() const override { return slots_; }

  Result RecordStart(size_t slot, void* stream, std::string* error) override {
    STRAGGLER_CUDA_CHECK(cudaEventRecord(events_[2 * slot], static_cast<cudaStream_t>(stream)),
                         error, Result::kError);
    return Result::kOk;
  }

  Result RecordEnd(size_t slot, void* stream, std::string* error) override {
    STRAGGLER_CUDA_CHECK(
        cudaEventRecord(events_[2 * slot + 1], static_cast<cudaStream_t>(stream)), error,
        Result::kError);
    return Result::kOk;
  }

  void BindResolverThread() override { cudaSetDevice(device_); }

  Result Elapsed(size_t slot, double* seconds, std::string* error) override {
    // cudaEventQuery is the documented way to poll for completion (and to
    // see errors of the pending work); cudaEventElapsedTime is only read
    // once the end event is done.
    const cudaError_t q = cudaEventQuery(events_[2 * slot + 1]);
    if (q == cudaErrorNotReady) return Result::kNotReady;
    if (q != cudaSuccess) {
      *error = CudaError("cudaEventQuery", q);
      return Result::kError;
    }
    float ms = 0;
    const cudaError_t t = cudaEventElapsedTime(&ms, events_[2 * slot], events_[2 * slot + 1]);
    // End recorded on another stream than Begin: the start may still run.
    if (t == cudaErrorNotReady) return Result::kNotReady;
    if (t != cudaSuccess) {
      *error = CudaError("cudaEventElapsedTime", t);
      return Result::kError;
    }
    *seconds = static_cast<double>(ms) / 1000.0;
    return Result::kOk;
  }

 private:
  CudaEventBackend() = default;
  int device_ = 0;
  size_t slots_ = 0;
  std::vector<cudaEvent_t> events_;  // slot i: start 2i, end 2i+1
};

}  // namespace

class CudaComputeTimer::Impl {
 public:
  Impl(Client& client, std::unique_ptr<detail::EventBackend> backend,
       detail::EventTimerCoreOptions options)
      : core(client, std::move(backend), options) {}
  detail::EventTimerCore core;
};

CudaComputeTimer::CudaComputeTimer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaComputeTimer::~CudaComputeTimer() = default;

std::unique_ptr<CudaComputeTimer> CudaComputeTimer::Create(Client& client,
                                                           const CudaTimerOptions& options,
                                                           std::string* error) {
  if (options.max_pending == 0) {
    if (error != nullptr) *error = "max_pending=0 must be >= 1";
    return nullptr;
  }
  if (options.poll_interval.count() <= 0) {
    if (error != nullptr)
      *error = "poll_interval=" + std::to_string(options.poll_interval.count()) +
               "us must be > 0";
    return nullptr;
  }
  auto backend = CudaEventBackend::Create(options.device, options.max_pending, error);
  if (!backend) return nullptr;
  detail::EventTimerCoreOptions core;
  core.rank = options.rank.value_or(client.FirstRank());
  core.poll_interval = options.poll_interval;
  core.drain_timeout = options.drain_timeout;
  return std::unique_ptr<CudaComputeTimer>(
      new CudaComputeTimer(std::make_unique<Impl>(client, std::move(backend), core)));
}

bool CudaComputeTimer::Begin(void* stream, uint64_t epoch, uint64_t iteration) {
  return impl_->core.Begin(stream, epoch, iteration);
}

bool CudaComputeTimer::End(void* stream) { return impl_->core.End(stream); }

CudaTimerStats CudaComputeTimer::Stats() const {
  const auto c = impl_->core.Stats();
  CudaTimerStats s;
  s.begun = c.begun;
  s.reported = c.reported;
  s.report_dropped = c.report_dropped;
  s.dropped_full = c.dropped_full;
  s.unmatched = c.unmatched;
  s.errors = c.errors;
  s.abandoned = c.abandoned;
  s.last_error = c.last_error;
  return s;
}

}  // namespace straggler

// ---- C ABI: every entry point catches everything (no exception into C). ----

struct straggler_cuda_timer {
  std::unique_ptr<straggler::CudaComputeTimer> timer;
};

namespace {
using straggler::c_api::WriteError;
}  // namespace

extern "C" {

void straggler_cuda_timer_options_init(straggler_cuda_timer_options_t* options) {
  if (options == nullptr) return;
  *options = straggler_cuda_timer_options_t{};
  options->device = -1;
}

straggler_cuda_timer_t* straggler_cuda_timer_create(straggler_client_t* client,
                                                    const straggler_cuda_timer_options_t* options,
                                                    char* err, size_t errlen) {
  if (client == nullptr || !client->client) {
    WriteError(err, errlen, "client is NULL");
    return nullptr;
  }
  return straggler::c_api::CreateHandle<straggler_cuda_timer>(
      "straggler_cuda_timer_create", err, errlen, [&](std::string* error) {
        straggler::CudaTimerOptions o;
        if (options != nullptr) {
          if (options->has_rank) o.rank = options->rank;
          o.device = options->device;
          if (options->max_pending != 0) o.max_pending = options->max_pending;
          if (options->poll_interval_us != 0)
            o.poll_interval = std::chrono::microseconds(options->poll_interval_us);
          if (options->drain_timeout_ms != 0)
            o.drain_timeout = std::chrono::milliseconds(options->drain_timeout_ms);
        }
        return straggler::CudaComputeTimer::Create(*client->client, o, error);
      });
}

void straggler_cuda_timer_destroy(straggler_cuda_timer_t* timer) {
  try {
    delete timer;
  } catch (...) {
  }
}

int straggler_cuda_timer_begin(straggler_cuda_timer_t* timer, void* stream, uint64_t epoch,
                               uint64_t iteration) {
  if (timer == nullptr) return STRAGGLER_EINVAL;
  try {
    return timer->timer->Begin(stream, epoch, iteration) ? STRAGGLER_OK : STRAGGLER_INCOMPLETE;
  } catch (...) {
    return STRAGGLER_INCOMPLETE;
  }
}

int straggler_cuda_timer_end(straggler_cuda_timer_t* timer, void* stream) {
  if (timer == nullptr) return STRAGGLER_EINVAL;
  try {
    return timer->timer->End(stream) ? STRAGGLER_OK : STRAGGLER_INCOMPLETE;
  } catch (...) {
    return STRAGGLER_INCOMPLETE;
  }
}

int straggler_cuda_timer_stats(const straggler_cuda_timer_t* timer,
                               straggler_cuda_timer_stats_t* out) {
  if (timer == nullptr || out == nullptr) return STRAGGLER_EINVAL;
  try {
    const straggler::CudaTimerStats s = timer->timer->Stats();
    out->begun = s.begun;
    out->reported = s.reported;
    out->report_dropped = s.report_dropped;
    out->dropped_full = s.dropped_full;
    out->unmatched = s.unmatched;
    out->errors = s.errors;
    out->abandoned = s.abandoned;
    std::snprintf(out->last_error, sizeof out->last_error, "%s", s.last_error.c_str());
    return STRAGGLER_OK;
  } catch (...) {
    return STRAGGLER_EINVAL;
  }
}

}  // extern "C"
