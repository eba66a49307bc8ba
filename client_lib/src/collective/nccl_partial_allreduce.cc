// The NCCL backend of PartialAllReduce (see straggler/collective_nccl.h for
// the design): shrink among survivors, fresh init on readmission (built ahead
// of the switch), warm-up, a bounded LRU of communicators, bounded waits.
// Decisions that need no GPU live in nccl_plan.h and are unit-tested there.
#include <cuda_runtime.h>
#include <nccl.h>

#include <gloo/common/error.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>

#include "agreement.h"
#include "nccl_plan.h"
#include "straggler/collective_nccl.h"
#include "store_transport.h"
#include "straggler/gloo_store.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
#error "the NCCL backend needs NCCL >= 2.27 (ncclCommShrink)"
#endif

namespace straggler {
namespace {

using detail::CommPlan;
using detail::SetText;
using Clock = std::chrono::steady_clock;

// Every CUDA and NCCL call is checked where it is made; the error names the
// call, the file and line and the library's own message (STYLE.md).
[[noreturn]] void ThrowCall(const std::string& call, const char* file, int line, const std::string& why) {
  throw CollectiveError(call + " failed at " + file + ":" + std::to_string(line) + ": " + why);
}
#define STRAGGLER_CUDA_CHECK(expr)                                                      \
  do {                                                                                  \
    cudaError_t e_ = (expr);                                                            \
    if (e_ != cudaSuccess) ThrowCall(#expr, __FILE__, __LINE__, cudaGetErrorString(e_)); \
  } while (0)
// Non-blocking communicators answer ncclInProgress: the call was accepted and
// completes in the background (polled with ncclCommGetAsyncError).
#define STRAGGLER_NCCL_START(expr)                                                        \
  do {                                                                                    \
    ncclResult_t r_ = (expr);                                                             \
    if (r_ != ncclSuccess && r_ != ncclInProgress)                                        \
      ThrowCall(#expr, __FILE__, __LINE__,                                                \
                std::string(ncclGetErrorString(r_)) + " (" + ncclGetLastError(nullptr) + ")"); \
  } while (0)

// A communicator of one active set. A set of one rank has none (comm null):
// its average is its own buffer.
struct Comm {
  ncclComm_t comm = nullptr;
  std::vector<uint32_t> ranks;
  uint64_t version = 0;
  bool started = false;  // init/shrink issued (a pending build may wait for its id)
  bool ready = false;    // built and warmed up
  // A shrink whose asynchronous job may still write `comm` (see Shrink).
  bool child_of_async_job = false;
};
using CommPtr = std::unique_ptr<Comm>;

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait of ours is a bounded poll, never a block inside NCCL
  return config;
}

std::vector<uint32_t> AllRanks(uint32_t world_size) {
  std::vector<uint32_t> all(world_size);
  for (uint32_t r = 0; r < world_size; ++r) all[r] = r;
  return all;
}

class NcclPartialAllReduce final : public PartialAllReduce {
 public:
  NcclPartialAllReduce(Client& client, NcclOptions options, int device, cudaStream_t stream,
                       bool own_stream)
      : client_(client),
        options_(std::move(options)),
        device_(device),
        stream_(stream),
        own_stream_(own_stream),
        store_(options_.rendezvous_endpoint, options_.job_id, options_.key_ttl,
               options_.collective_timeout),
        cache_(std::make_unique<detail::CommCache<CommPtr>>(
            std::max<size_t>(1, options_.max_cached_communicators),
            [this](CommPtr& c, bool healthy) { Release(c, healthy); })),
        agreement_(options_.rank, options_.run_id, AllRanks(options_.world_size),
                   /*previously_participating=*/true) {
    world_ = AllRanks(options_.world_size);
  }

  ~NcclPartialAllReduce() override {
    cudaSetDevice(device_);
    cache_.reset();  // releases every communicator while the stream still exists
    for (CommPtr& o : orphans_) {
      // Its job has finished or was ended by aborting the parent above.
      if (ncclComm_t comm = __atomic_load_n(&o->comm, __ATOMIC_ACQUIRE); comm != nullptr) ncclCommAbort(comm);
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (own_stream_) cudaStreamDestroy(stream_);
  }

  // Every rank builds the full communicator at creation, when all are there.
  void BuildFull() {
    auto c = std::make_unique<Comm>();
    c->ranks = world_;
    if (world_.size() > 1) {
      StartInit(*c, detail::FullCommIdKey(options_.run_id, options_.world_size),
                Clock::now() + options_.collective_timeout, /*blocking_get=*/true);
      Finish(*c, 0, Clock::now() + options_.collective_timeout, "building the full communicator");
    }
    c->ready = true;
    auto* e = cache_->Insert(world_, 0, std::move(c));
    cache_->SetCurrent(e);
    current_ = e->handle.get();
    // Every rank now holds the full communicator with the same (empty)
    // history: agreement_ starts from "took part with the whole world", so
    // a first set without some rank is a shrink of it.
  }

  StepPlan BeginIteration(uint64_t iteration) override {
    STRAGGLER_CUDA_CHECK(cudaSetDevice(device_));
    // Until this iteration has its communicator, no collective may use the
    // last one (RequireCommunicator), whatever throws below.
    current_ = nullptr;
    StepPlan plan = agreement_.Decide(
        iteration, client_,
        {options_.membership_timeout, options_.collective_timeout, options_.agreement_interval},
        transport_);
    const MembershipView& m = agreement_.membership();
    const std::vector<uint32_t>& active = plan.active_ranks;
    const bool participating = plan.participating;
    const std::vector<uint32_t>& prev_active = agreement_.previous_active();

    // (At the first iteration "previous" is the whole world on the full
    // communicator: see BuildFull.)
    const CommPlan how = detail::PlanCommunicator(agreement_.previously_participating(),
                                                  prev_active, participating, active);
    const auto deadline = Clock::now() + options_.collective_timeout;
    // A build at the version's first slot may have started ahead
    // (PrepareNext) under the plain key; one at a later slot is a retry (the
    // switch was put off, or the first build failed) under a key naming the
    // iteration, which every member of the set applies at alike.
    std::optional<uint64_t> retry;
    if (iteration != detail::FirstSlotFrom(m.effective_iteration, options_.agreement_interval)) retry = iteration;
    Comm* next = nullptr;
    switch (how.how) {
      case CommPlan::How::kNone:
        break;
      case CommPlan::How::kReuse: {
        auto* e = cache_->Find(active);
        if (e == nullptr || e->handle == nullptr) {
          throw CollectiveError("iteration " + std::to_string(iteration) + ": the communicator of ranks " +
                                SetText(active) + " (membership version " + std::to_string(m.version) +
                                ") was aborted after an earlier error; it is rebuilt only when the "
                                "membership changes");
        }
        next = e->handle.get();
        break;
      }
      case CommPlan::How::kShrink:
        // The parent is gone only after it was aborted on an error; then a
        // fresh communicator is the one way left (members that still hold the
        // parent shrink it instead, and both sides fail within the timeout
        // with errors naming the build - never a hang).
        if (const auto* parent = cache_->Find(prev_active); parent != nullptr && parent->handle) {
          next = Shrink(iteration, m.version, active, how.exclude, deadline);
        } else {
          next = Init(iteration, m.version, active, retry, deadline);
        }
        break;
      case CommPlan::How::kInit:
        next = Init(iteration, m.version, active, retry, deadline);
        break;
    }
    current_ = next;
    if (next != nullptr) {
      auto* e = cache_->Find(active);
      cache_->Touch(e);
      cache_->SetCurrent(e);
    }

    agreement_.Commit(std::move(plan));
    PrepareNext(iteration);
    return agreement_.plan();
  }

  AllReduceResult AllReduceAverage(std::span<float> data) override {
    return Average(data.data(), data.size(), sizeof(float), ncclFloat32);
  }
  AllReduceResult AllReduceAverage(std::span<double> data) override {
    return Average(data.data(), data.size(), sizeof(double), ncclFloat64);
  }

  bool SyncParameters(const std::vector<ParameterBuffer>& buffers) override {
    RequireBegun("SyncParameters");
    if (!agreement_.plan().participating || !agreement_.plan().sync_parameters) return false;
    RequireCommunicator("SyncParameters");
    if (current_->comm == nullptr) return true;  // a set of one
    STRAGGLER_CUDA_CHECK(cudaSetDevice(device_));
    // The root is the lowest active rank: rank 0 of the communicator, whose
    // ranks are the active set in ascending order (ncclCommShrink keeps the
    // order when it closes the gaps; Init uses the position in the set).
    for (const ParameterBuffer& b : buffers) {
      if (b.bytes == 0) continue;
      Collective("broadcast of parameters from rank " + std::to_string(agreement_.plan().root), b.data, b.bytes,
                 [&](void* dev) {
                   return ncclBroadcast(dev, dev, b.bytes, ncclUint8, 0, current_->comm, stream_);
                 });
    }
    return true;
  }

  const StepPlan& Plan() const override { return agreement_.plan(); }

 private:
  AllReduceResult Average(void* data, size_t count, size_t elem, ncclDataType_t type) {
    RequireBegun("AllReduceAverage");
    AllReduceResult r;
    r.version = agreement_.plan().version;
    r.active_ranks = static_cast<uint32_t>(agreement_.plan().active_ranks.size());
    if (!agreement_.plan().participating) return r;  // excluded: no collective on any communicator
    RequireCommunicator("AllReduceAverage");
    r.participated = true;
    if (current_->comm == nullptr || count == 0) return r;  // a set of one: its own average
    STRAGGLER_CUDA_CHECK(cudaSetDevice(device_));
    // ncclAvg divides by the communicator's size, which is the active set's.
    Collective("allreduce", data, count * elem, [&](void* dev) {
      return ncclAllReduce(dev, dev, count, type, ncclAvg, current_->comm, stream_);
    });
    return r;
  }

  // Runs `op` on device memory (`data` itself, or a staging copy of host
  // memory) and waits for it, bounded by collective_timeout. On failure the
  // communicator is aborted (it cannot be trusted after a partial collective).
  template <class Op>
  // `agreement_of`: this is the in-band agreement of that iteration, and a
  // failure says so (AgreementFailureText) rather than naming the plan.
  void Collective(const std::string& what, void* data, size_t bytes, Op op,
                  std::optional<uint64_t> agreement_of = std::nullopt) {
    void* dev = data;
    const bool host = !IsDevicePointer(data);
    try {
      if (host) {
        dev = Scratch(bytes);
        STRAGGLER_CUDA_CHECK(cudaMemcpyAsync(dev, data, bytes, cudaMemcpyHostToDevice, stream_));
      }
      STRAGGLER_NCCL_START(op(dev));
      WaitStream(*current_, Clock::now() + options_.collective_timeout);
      if (host) {
        STRAGGLER_CUDA_CHECK(cudaMemcpyAsync(data, dev, bytes, cudaMemcpyDeviceToHost, stream_));
        STRAGGLER_CUDA_CHECK(cudaStreamSynchronize(stream_));
      }
    } catch (const std::exception& e) {
      const std::vector<uint32_t> set = current_->ranks;
      current_ = nullptr;
      cache_->Erase(set, /*healthy=*/false);
      throw CollectiveError(
          (agreement_of ? agreement_.AgreementFailureText("NCCL", *agreement_of, options_.collective_timeout)
                        : agreement_.FailureText("NCCL", what, options_.collective_timeout)) +
          "; the communicator was aborted: " + e.what());
    }
  }

  bool IsDevicePointer(const void* p) const {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error of an unknown pointer
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  void* Scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_ != nullptr) STRAGGLER_CUDA_CHECK(cudaFree(scratch_));
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      STRAGGLER_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  // Waits until `c`'s pending init/shrink/finalize has completed, polling
  // ncclCommGetAsyncError (the non-blocking contract), up to `deadline`.
  void WaitComm(Comm& c, Clock::time_point deadline, const std::string& what) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      STRAGGLER_NCCL_START(ncclCommGetAsyncError(c.comm, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        throw CollectiveError(what + ": " + ncclGetErrorString(state) + " (" + ncclGetLastError(c.comm) + ")");
      }
      if (Clock::now() >= deadline) {
        throw CollectiveError(what + ": not finished within " +
                              std::to_string(options_.collective_timeout.count()) +
                              " ms (a member of " + SetText(c.ranks) + " did not take part)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // Waits for the stream while watching the communicator for asynchronous
  // errors (a peer that died makes NCCL report ncclRemoteError/SystemError).
  void WaitStream(Comm& c, Clock::time_point deadline) {
    WaitComm(c, deadline, "enqueueing the collective");
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) ThrowCall("cudaStreamQuery(stream)", __FILE__, __LINE__, cudaGetErrorString(q));
      ncclResult_t state = ncclSuccess;
      STRAGGLER_NCCL_START(ncclCommGetAsyncError(c.comm, &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        throw CollectiveError(std::string("asynchronous NCCL error ") + ncclGetErrorString(state) + " (" +
                              ncclGetLastError(c.comm) + ")");
      }
      if (Clock::now() >= deadline) throw CollectiveError("the collective did not complete");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Issues ncclCommInitRankConfig for `c` (non-blocking). The lowest rank of
  // the set makes the id and publishes it; the others read it - with
  // blocking_get, waiting up to `deadline`; without, only if it is already
  // there (a build ahead of the switch must not stall this iteration).
  // Returns whether the init was issued.
  bool StartInit(Comm& c, const std::string& key, Clock::time_point deadline, bool blocking_get) {
    const auto index = static_cast<int>(std::find(c.ranks.begin(), c.ranks.end(), options_.rank) - c.ranks.begin());
    ncclUniqueId id;
    if (index == 0) {
      STRAGGLER_NCCL_START(ncclGetUniqueId(&id));
      store_.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      try {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        store_.wait({key}, blocking_get ? std::max(left, std::chrono::milliseconds(1)) : std::chrono::milliseconds(1));
      } catch (const gloo::IoException& e) {
        if (!blocking_get) return false;  // not published yet: try again next iteration
        throw CollectiveError("the id of the communicator of ranks " + SetText(c.ranks) + " (key '" + key +
                              "') did not arrive: " + e.what());
      }
      const std::vector<char> bytes = store_.get(key);
      if (bytes.size() != sizeof(id.internal)) {
        throw CollectiveError("rendezvous key '" + key + "' holds " + std::to_string(bytes.size()) +
                              " bytes, an ncclUniqueId has " + std::to_string(sizeof(id.internal)));
      }
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    ncclConfig_t config = NonBlockingConfig();
    STRAGGLER_NCCL_START(ncclCommInitRankConfig(&c.comm, static_cast<int>(c.ranks.size()), id, index, &config));
    c.started = true;
    return true;
  }

  // Completes a started build and warms it up with a one-element all-reduce,
  // so the first real collective pays no connection setup and a member that
  // is missing is noticed here, naming the build.
  void Finish(Comm& c, uint64_t iteration, Clock::time_point deadline, const std::string& what) {
    const std::string label = "iteration " + std::to_string(iteration) + ": " + what + " of ranks " +
                              SetText(c.ranks) + " (membership version " + std::to_string(c.version) + ")";
    try {
      WaitComm(c, deadline, label);
      float* one = static_cast<float*>(Scratch(sizeof(float)));
      STRAGGLER_CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof(float), stream_));
      STRAGGLER_NCCL_START(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, c.comm, stream_));
      WaitStream(c, deadline);
    } catch (const CollectiveError& e) {
      throw CollectiveError(label + " failed: " + e.what());
    }
    c.ready = true;
  }

  Comm* Shrink(uint64_t iteration, uint64_t version, const std::vector<uint32_t>& active,
               const std::vector<int>& exclude, Clock::time_point deadline) {
    auto* parent = cache_->Find(agreement_.previous_active());
    if (parent == nullptr || !parent->handle) {
      throw CollectiveError("iteration " + std::to_string(iteration) + ": cannot shrink to ranks " +
                            SetText(active) + ": the communicator of ranks " + SetText(agreement_.previous_active()) +
                            " was aborted after an earlier error");
    }
    Comm& from = *parent->handle;
    try {
      return BuildAndCache(version, active, [&](Comm& c) {
        ncclConfig_t config = NonBlockingConfig();
        // Called by the survivors only; the excluded ranks are never waited on.
        STRAGGLER_NCCL_START(ncclCommShrink(from.comm, const_cast<int*>(exclude.data()),
                                            static_cast<int>(exclude.size()), &c.comm, &config,
                                            NCCL_SHRINK_DEFAULT));
        c.started = true;
        c.child_of_async_job = true;
        // Unlike an init, a shrink (like a split) leaves the new handle NULL
        // until its asynchronous job has finished: NCCL's own thread stores
        // the child into c.comm later and reports progress on the parent. So
        // wait on the parent first, then for the handle, then on the child.
        WaitComm(from, deadline, "iteration " + std::to_string(iteration) + ": ncclCommShrink of ranks " +
                                     SetText(from.ranks) + " to " + SetText(active));
        while (__atomic_load_n(&c.comm, __ATOMIC_ACQUIRE) == nullptr) {
          if (Clock::now() >= deadline) throw CollectiveError("ncclCommShrink finished but stored no communicator");
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        c.child_of_async_job = false;
        Finish(c, iteration, deadline, "ncclCommShrink");
      });
    } catch (...) {
      // A shrink that failed leaves its parent with the failed job's error
      // (ncclCommGetAsyncError answers it from now on): it cannot be used
      // again, so it is aborted rather than kept for a later shrink.
      cache_->Erase(agreement_.previous_active(), /*healthy=*/false);
      throw;
    }
  }

  // A new communicator of `active` for `version`, made ready by `build` (not
  // called for a set of one: it needs no communicator) and then cached. A
  // failed build releases what it started (aborting the communicator) and
  // rethrows: nothing half-built enters the cache.
  template <class Build>
  Comm* BuildAndCache(uint64_t version, const std::vector<uint32_t>& active, Build&& build) {
    auto c = std::make_unique<Comm>();
    c->ranks = active;
    c->version = version;
    if (active.size() > 1) {
      try {
        build(*c);
      } catch (...) {
        CommPtr broken = std::move(c);
        if (broken->child_of_async_job) {
          // NCCL's thread may still store the shrunk handle into
          // broken->comm: keep the struct alive until destruction (it is
          // small, and this happens once per failed shrink).
          orphans_.push_back(std::move(broken));
        } else {
          Release(broken, false);
        }
        throw;
      }
    }
    c->ready = true;
    return cache_->Insert(active, version, std::move(c))->handle.get();
  }

  Comm* Init(uint64_t iteration, uint64_t version, const std::vector<uint32_t>& active,
             std::optional<uint64_t> retry, Clock::time_point deadline) {
    if (auto* p = cache_->Pending(); retry && p != nullptr && p->ranks == active) {
      // A build ahead under the first slot's key: a retry never uses it (its
      // peers may hold the failed attempt's id), and every member drops it.
      cache_->Erase(active, false);
    }
    // Built ahead of the switch (PrepareNext) for this very version and set?
    if (auto* e = cache_->Find(active); e != nullptr && e->handle && e->version == version &&
                                        cache_->Pending() == e) {
      Comm& c = *e->handle;
      cache_->SetPending(nullptr);
      try {
        if (!c.started) StartInit(c, detail::CommIdKey(options_.run_id, version, active), deadline, true);
        if (!c.ready && c.comm != nullptr) Finish(c, iteration, deadline, "ncclCommInitRankConfig");
      } catch (...) {
        cache_->Erase(active, false);
        throw;
      }
      c.ready = true;
      return &c;
    }
    return BuildAndCache(version, active, [&](Comm& c) {
      StartInit(c, detail::CommIdKey(options_.run_id, version, active, retry), deadline, true);
      Finish(c, iteration, deadline, "ncclCommInitRankConfig");
    });
  }

  // Looks ahead: when the newest membership received takes effect later and
  // readmits ranks into this rank's set, start building its communicator now
  // (non-blocking init in NCCL's own thread), so the switch iteration finds
  // it built. Shrinks are not built ahead: a shrink is an operation on the
  // current communicator and must sit at the same place in its sequence on
  // every survivor, which only the switch iteration guarantees.
  void PrepareNext(uint64_t iteration) {
    // A build ahead of a version that is now applied (or superseded by it)
    // and was not used by Init is dead: release it.
    if (auto* p = cache_->Pending(); p != nullptr && p->version <= agreement_.plan().version) {
      cache_->Erase(p->ranks, false);
    }
    const MembershipView next = client_.CurrentMembership();
    if (next.version > agreement_.plan().version && next.effective_iteration > iteration) {
      const std::vector<uint32_t> set = next.ActiveRanks();
      const bool in = !next.IsExcluded(options_.rank);
      const CommPlan how = detail::PlanCommunicator(agreement_.plan().participating, agreement_.plan().active_ranks, in, set);
      auto* pending = cache_->Pending();
      if (how.how == CommPlan::How::kInit && set.size() > 1 &&
          (pending == nullptr || pending->version != next.version || pending->ranks != set)) {
        if (pending != nullptr) cache_->Erase(pending->ranks, false);  // superseded
        auto c = std::make_unique<Comm>();
        c->ranks = set;
        c->version = next.version;
        cache_->SetPending(cache_->Insert(set, next.version, std::move(c)));
      }
    }
    // Progress a pending build whose id was not published yet. Errors here
    // are not this iteration's: the switch iteration retries with a bounded
    // wait and reports them.
    if (auto* e = cache_->Pending();
        e != nullptr && e->handle && !e->handle->started) {
      try {
        StartInit(*e->handle, detail::CommIdKey(options_.run_id, e->version, e->ranks),
                  Clock::now() + options_.collective_timeout, /*blocking_get=*/false);
      } catch (const std::exception&) {
        cache_->Erase(e->ranks, false);
      }
    }
  }

  // Healthy and built: finalize (flushes its operations), bounded, then
  // destroy. Otherwise - after an error, a build that never finished, or a
  // finalize that does not finish in time - abort, which never waits on peers.
  void Release(CommPtr& c, bool healthy) {
    if (!c || c->comm == nullptr) return;
    cudaSetDevice(device_);
    bool destroyed = false;
    if (healthy && c->ready) {
      const ncclResult_t r = ncclCommFinalize(c->comm);
      if (r == ncclSuccess || r == ncclInProgress) {
        try {
          WaitComm(*c, Clock::now() + options_.collective_timeout, "ncclCommFinalize");
          destroyed = ncclCommDestroy(c->comm) == ncclSuccess;
        } catch (const std::exception&) {
        }
      }
    }
    if (!destroyed) ncclCommAbort(c->comm);
    c->comm = nullptr;
  }

  // A participating rank without a communicator: a collective failed earlier
  // in this iteration and its communicator was aborted. Never pretend to
  // average.
  void RequireCommunicator(const char* what) const {
    if (current_ == nullptr) {
      throw CollectiveError(std::string(what) + " at iteration " + std::to_string(agreement_.plan().iteration) +
                            ": the communicator of ranks " + SetText(agreement_.plan().active_ranks) +
                            " was aborted after an earlier error in this iteration");
    }
  }

  void RequireBegun(const char* what) const { agreement_.RequireBegun(what); }

  // The in-band agreement (agreement.h) on the communicator of the previous
  // set: every member used it at its previous iteration (at the first, the
  // full communicator), so this 40-byte all-reduce sits at the same place in
  // each member's sequence - also before a shrink of it.
  bool MinOverPrevious(uint64_t iteration, std::span<uint64_t> words) {
    auto* e = cache_->Find(agreement_.previous_active());
    // Aborted after an earlier error: no channel left (agreement.h).
    if (e == nullptr || !e->handle || e->handle->comm == nullptr) return false;
    current_ = e->handle.get();  // Collective() runs on, and on failure aborts, current_
    Collective(
        "agreement on the membership", words.data(), words.size_bytes(),
        [&](void* dev) { return ncclAllReduce(dev, dev, words.size(), ncclUint64, ncclMin, e->handle->comm, stream_); },
        iteration);
    // Not this iteration's communicator yet: a build that throws after this
    // must leave none (RequireCommunicator), and a shrink may free this one.
    current_ = nullptr;
    return true;
  }

  Client& client_;
  const NcclOptions options_;
  const int device_;
  cudaStream_t stream_;
  const bool own_stream_;
  DaemonStore store_;
  // After store_ (it holds a reference to it).
  detail::StoreAgreementTransport transport_{
      store_, [this](uint64_t it, std::span<uint64_t> words) { return MinOverPrevious(it, words); }};
  std::vector<uint32_t> world_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::unique_ptr<detail::CommCache<CommPtr>> cache_;
  Comm* current_ = nullptr;  // the communicator of the current iteration
  std::vector<CommPtr> orphans_;  // failed shrinks NCCL may still write into

  detail::Agreement agreement_;
};

}  // namespace

std::string NcclOptions::Validate() const {
  std::string common = detail::ValidateCommonOptions(*this);
  if (!common.empty()) return common;
  if (device < -1) return "device=" + std::to_string(device) + " must be >= 0, or -1 for the current device";
  if (max_cached_communicators == 0) return "max_cached_communicators=0 must be >= 1";
  return "";
}

int NcclVisibleDevices(std::string* error) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (error) *error = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && error) *error = "no CUDA device visible";
  return n;
}

std::unique_ptr<PartialAllReduce> CreateNcclPartialAllReduce(Client& client, const NcclOptions& options,
                                                             std::string* error) {
  auto fail = [&](const std::string& why) -> std::unique_ptr<PartialAllReduce> {
    if (error) *error = why;
    return nullptr;
  };
  if (std::string why = options.Validate(); !why.empty()) return fail(why);
  std::string why;
  const int devices = NcclVisibleDevices(&why);
  if (devices == 0) return fail("rank " + std::to_string(options.rank) + ": " + why);
  int device = options.device;
  if (device >= devices) {
    return fail("device=" + std::to_string(device) + " but only " + std::to_string(devices) +
                " CUDA devices are visible");
  }
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) return fail("cudaGetDevice failed");
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return fail("cudaSetDevice(" + std::to_string(device) + "): " + cudaGetErrorString(e));
  }
  cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  const bool own = stream == nullptr;
  if (own) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      return fail(std::string("cudaStreamCreateWithFlags: ") + cudaGetErrorString(e));
    }
  }
  auto r = std::make_unique<NcclPartialAllReduce>(client, options, device, stream, own);
  try {
    r->BuildFull();
  } catch (const std::exception& e) {
    return fail("rank " + std::to_string(options.rank) + ": " + e.what());
  }
  return r;
}

}  // namespace straggler
