// The NCCL backend of PartialAllReduce (see straggler/collective_nccl.h for
// the design): shrink among survivors, grow or fresh init on readmission,
// revoke after a failed collective, warm-up, a bounded LRU of communicators,
// bounded waits. Decisions that need no GPU live in nccl_plan.h and are
// unit-tested there; the CUDA/NCCL steps are nccl_comm.h's.
#include <cuda_runtime.h>
#include <nccl.h>

#include <gloo/common/error.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>

#include "agreement.h"
#include "group_plan.h"
#include "nccl_calls.h"
#include "nccl_comm.h"
#include "nccl_plan.h"
#include "straggler/collective_nccl.h"
#include "store_transport.h"
#include "straggler/gloo_store.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
#error "the NCCL backend needs NCCL >= 2.27 (ncclCommShrink)"
#endif

namespace straggler {
namespace {

// The group's ranks, sorted, as SetKey writes them: the same text on every
// member whatever order each was given them in.
std::string GroupMembersKey(const DataParallelGroup& group) {
  std::vector<uint32_t> ranks = group.ranks;
  std::sort(ranks.begin(), ranks.end());
  return detail::SetKey(ranks);
}

using detail::Clock;
using detail::Comm;
using detail::CommOps;
using detail::CommPlan;
using detail::CommPtr;
using detail::SetText;

// Every rank of the communicator built at creation: the job's, or a data-
// parallel group's (ascending).
std::vector<uint32_t> AllRanks(uint32_t world_size, const std::optional<DataParallelGroup>& group) {
  if (group) {
    std::vector<uint32_t> ranks = group->ranks;
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  }
  std::vector<uint32_t> all(world_size);
  for (uint32_t r = 0; r < world_size; ++r) all[r] = r;
  return all;
}

class NcclPartialAllReduceImpl final : public NcclPartialAllReduce {
 public:
  // `job_switch` and `group`: one data-parallel group of a hybrid job
  // (docs/hybrid.md): its full communicator is the group's, and its plan
  // comes from the job's switch; null: the flat backend.
  NcclPartialAllReduceImpl(Client& client, NcclOptions options, int device, cudaStream_t stream, bool own_stream,
                           std::shared_ptr<JobSwitch> job_switch = nullptr,
                           std::optional<DataParallelGroup> group = std::nullopt)
      : client_(client),
        options_(std::move(options)),
        switch_(std::move(job_switch)),
        group_(std::move(group)),
        // A group's keys name the group. A version's key names its active
        // global ranks already, which no two groups share; the full
        // communicator's key names only the size, which several groups
        // share, and groups may share a name (Python's default "dp"), so
        // that one also names the members (BuildFull; SetKey bounds it).
        key_run_(group_ ? options_.run_id + "/g" + group_->name : options_.run_id),
        device_(device),
        initial_stream_(stream),
        own_stream_(own_stream ? stream : nullptr),
        store_(detail::RendezvousStoreFor(options_)),
        ops_(options_.rank, device, options_.collective_timeout, *store_),
        cache_(std::make_unique<detail::CommCache<CommPtr>>(
            std::max<size_t>(1, options_.max_cached_communicators),
            [this](CommPtr& c, bool healthy) { ops_.Release(c, healthy); })),
        agreement_(options_.rank, options_.run_id, AllRanks(options_.world_size, group_),
                   /*previously_participating=*/true) {
    world_ = AllRanks(options_.world_size, group_);
    ops_.set_stream(stream);
  }

  ~NcclPartialAllReduceImpl() override {
    cudaSetDevice(device_);
    cache_.reset();  // releases every communicator while the stream still exists
    for (CommPtr& o : orphans_) {
      // Its job has finished or was ended by aborting the parent above.
      if (ncclComm_t comm = __atomic_load_n(&o->comm, __ATOMIC_ACQUIRE); comm != nullptr) ncclCommAbort(comm);
    }
    if (own_stream_ != nullptr) cudaStreamDestroy(own_stream_);
  }

  int Device() const override { return device_; }

  void SetStream(void* stream) override {
    ops_.set_stream(stream != nullptr ? static_cast<cudaStream_t>(stream) : initial_stream_);
  }

  // Every rank builds the full communicator at creation, when all are there.
  void BuildFull() {
    auto c = std::make_unique<Comm>();
    c->ranks = world_;
    // A world of one gets a communicator too (NCCL's one-rank path, built
    // without the store): a one-GPU job runs the same code as a large one.
    const std::string run = group_ ? key_run_ + "/" + GroupMembersKey(*group_) : key_run_;
    ops_.StartInit(*c, detail::FullCommIdKey(run, static_cast<uint32_t>(world_.size())),
                   Clock::now() + options_.collective_timeout, /*blocking_get=*/true);
    ops_.Finish(*c, 0, Clock::now() + options_.collective_timeout, "building the full communicator");
    c->order = world_;
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
    StepPlan plan = detail::PlanOf(iteration, agreement_, client_, options_, transport_, switch_.get(), group_,
                                   group_active_);
    const struct { uint64_t version, effective_iteration; } m{plan.version, plan.effective_iteration};
    const std::vector<uint32_t>& active = plan.active_ranks;
    const bool participating = plan.participating;
    const std::vector<uint32_t>& prev_active = agreement_.previous_active();

    // (At the first iteration "previous" is the whole world on the full
    // communicator: see BuildFull.)
    // The previous set in its communicator's order: a shrink names positions in it.
    const auto* prev_entry = cache_->Find(prev_active);
    const bool prev_usable = prev_entry != nullptr && prev_entry->handle && prev_entry->handle->comm != nullptr;
    const std::vector<uint32_t>& prev_order = prev_usable ? prev_entry->handle->order : prev_active;
    // Grow only from a communicator that still works: a revoked one refuses it.
    const bool can_grow = features_.grow && prev_usable && !prev_entry->handle->revoked;
    const CommPlan how = detail::PlanCommunicator(agreement_.previously_participating(), prev_order,
                                                  participating, active, can_grow);
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
        if (e == nullptr || e->handle == nullptr || e->handle->revoked) {
          throw CollectiveError("iteration " + std::to_string(iteration) + ": the communicator of ranks " +
                                SetText(active) + " (membership version " + std::to_string(m.version) +
                                ") was " + (e != nullptr && e->handle ? "revoked" : "aborted") +
                                " after an earlier error; it is rebuilt only when the membership changes");
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
      case CommPlan::How::kGrow:
        next = Grow(iteration, m.version, active, retry, deadline);
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
    if (current_->comm == nullptr) return true;  // (every set has one; defensive)
    STRAGGLER_CUDA_CHECK(cudaSetDevice(device_));
    // The root is the lowest active rank; its number in the communicator is
    // its position in the communicator's order (ascending, unless grown:
    // ncclCommGrow appends the joiners).
    const int root = detail::CommRankOf(current_->order, agreement_.plan().root);
    for (const ParameterBuffer& b : buffers) {
      if (b.bytes == 0) continue;
      Collective("broadcast of parameters from rank " + std::to_string(agreement_.plan().root), b.data, b.bytes,
                 [&](void* dev) {
                   return ncclBroadcast(dev, dev, b.bytes, ncclUint8, root, current_->comm, ops_.stream());
                 });
    }
    return true;
  }

  const StepPlan& Plan() const override { return agreement_.plan(); }

 private:
  AllReduceResult Average(void* data, size_t count, size_t elem, ncclDataType_t type) {
    AllReduceResult r = agreement_.AverageResult();
    if (!agreement_.plan().participating) return r;  // excluded: no collective on any communicator
    RequireCommunicator("AllReduceAverage");
    r.participated = true;
    if (current_->comm == nullptr || count == 0) return r;
    STRAGGLER_CUDA_CHECK(cudaSetDevice(device_));
    // ncclAvg divides by the communicator's size, which is the active set's.
    Collective("allreduce", data, count * elem, [&](void* dev) {
      return ncclAllReduce(dev, dev, count, type, ncclAvg, current_->comm, ops_.stream());
    });
    return r;
  }

  // Runs `op` on device memory (`data` itself, or a staging copy of host
  // memory) and waits for it, bounded by collective_timeout. On failure the
  // communicator cannot be trusted after a partial collective: it is revoked
  // where NCCL has ncclCommRevoke (stopping what is in flight, kept so the
  // survivors can still shrink it), else aborted.
  template <class Op>
  // `agreement_of`: this is the in-band agreement of that iteration, and a
  // failure says so (AgreementFailureText) rather than naming the plan.
  void Collective(const std::string& what, void* data, size_t bytes, Op op,
                  std::optional<uint64_t> agreement_of = std::nullopt) {
    void* dev = data;
    const bool host = !CommOps::IsDevicePointer(data);
    const cudaStream_t stream = ops_.stream();
    try {
      if (host) {
        dev = ops_.Scratch(bytes);
        STRAGGLER_CUDA_CHECK(cudaMemcpyAsync(dev, data, bytes, cudaMemcpyHostToDevice, stream));
      }
      STRAGGLER_NCCL_START(op(dev));
      ops_.WaitStream(*current_, Clock::now() + options_.collective_timeout);
      if (host) {
        STRAGGLER_CUDA_CHECK(cudaMemcpyAsync(data, dev, bytes, cudaMemcpyDeviceToHost, stream));
        STRAGGLER_CUDA_CHECK(cudaStreamSynchronize(stream));
      }
    } catch (const std::exception& e) {
      const std::vector<uint32_t> set = current_->ranks;
      const bool revoked = ops_.Revoke(*current_);
      current_ = nullptr;
      if (!revoked) cache_->Erase(set, /*healthy=*/false);
      throw CollectiveError(
          (agreement_of ? agreement_.AgreementFailureText("NCCL", *agreement_of, options_.collective_timeout)
                        : agreement_.FailureText("NCCL", what, options_.collective_timeout)) +
          (revoked ? "; the communicator was revoked (kept for the survivors' shrink): "
                   : "; the communicator was aborted: ") +
          e.what());
    }
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
        ncclConfig_t config = detail::NonBlockingConfig();
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
        ops_.WaitComm(from, deadline, "iteration " + std::to_string(iteration) + ": ncclCommShrink of ranks " +
                                     SetText(from.ranks) + " to " + SetText(active));
        while (__atomic_load_n(&c.comm, __ATOMIC_ACQUIRE) == nullptr) {
          if (Clock::now() >= deadline) throw CollectiveError("ncclCommShrink finished but stored no communicator");
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        c.child_of_async_job = false;
        c.order = detail::OrderAfterShrink(from.order, active);
        ops_.Finish(c, iteration, deadline, "ncclCommShrink");
      });
    } catch (...) {
      // A shrink that failed leaves its parent with the failed job's error
      // (ncclCommGetAsyncError answers it from now on): it cannot be used
      // again, so it is aborted rather than kept for a later shrink.
      cache_->Erase(agreement_.previous_active(), /*healthy=*/false);
      throw;
    }
  }

  // A new communicator of `active` for `version`, made ready by `build` (a
  // set of one too: ncclCommShrink to one survivor, or a local init) and then cached. A
  // failed build releases what it started (aborting the communicator) and
  // rethrows: nothing half-built enters the cache.
  template <class Build>
  Comm* BuildAndCache(uint64_t version, const std::vector<uint32_t>& active, Build&& build) {
    auto c = std::make_unique<Comm>();
    c->ranks = active;
    c->order = active;  // a grow appends its joiners instead, a shrink keeps the parent's order
    c->version = version;
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
        ops_.Release(broken, false);
      }
      throw;
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
        if (!c.started) ops_.StartInit(c, detail::CommIdKey(key_run_, version, active), deadline, true);
        if (!c.ready && c.comm != nullptr) ops_.Finish(c, iteration, deadline, "ncclCommInitRankConfig");
      } catch (...) {
        cache_->Erase(active, false);
        throw;
      }
      c.ready = true;
      return &c;
    }
    return BuildAndCache(version, active, [&](Comm& c) {
      ops_.StartInit(c, detail::CommIdKey(key_run_, version, active, retry), deadline, true);
      ops_.Finish(c, iteration, deadline, "ncclCommInitRankConfig");
    });
  }

  // Readmission by ncclCommGrow (PlanCommunicator chose it: the loaded NCCL
  // has it, the previous set's communicator works, the set only gained
  // ranks): its members grow that communicator, keeping their numbers; the
  // joiners, which planned an init, read the coordinator's grow record
  // under the same key (CommOps::StartInit). Not built ahead: a grow is an
  // operation on the communicator in use, like a shrink.
  Comm* Grow(uint64_t iteration, uint64_t version, const std::vector<uint32_t>& active,
             std::optional<uint64_t> retry, Clock::time_point deadline) {
    if (auto* p = cache_->Pending(); p != nullptr && p->ranks == active) cache_->Erase(active, false);
    Comm& from = *cache_->Find(agreement_.previous_active())->handle;
    try {
      return BuildAndCache(version, active, [&](Comm& c) {
        ops_.StartGrow(c, from, detail::CommIdKey(key_run_, version, active, retry));
        ops_.Finish(c, iteration, deadline, "ncclCommGrow");
      });
    } catch (...) {
      // A failed grow leaves the members' parents at different grow counts
      // (NCCL checks them at the next grow): it is aborted, not reused.
      cache_->Erase(agreement_.previous_active(), /*healthy=*/false);
      throw;
    }
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
      std::vector<uint32_t> set = next.ActiveRanks();
      bool in = !next.IsExcluded(options_.rank);
      if (switch_) {
        // A group: the members of that version's complete replicas.
        set = detail::GroupActiveRanks(set, *group_, *switch_);
        in = in && std::binary_search(set.begin(), set.end(), options_.rank);
      }
      const auto* cur = cache_->Find(agreement_.plan().active_ranks);
      const bool usable = cur != nullptr && cur->handle && cur->handle->comm != nullptr && !cur->handle->revoked;
      const CommPlan how = detail::PlanCommunicator(agreement_.plan().participating,
                                                    usable ? cur->handle->order : agreement_.plan().active_ranks,
                                                    in, set, features_.grow && usable);
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
        ops_.StartInit(*e->handle, detail::CommIdKey(key_run_, e->version, e->ranks),
                  Clock::now() + options_.collective_timeout, /*blocking_get=*/false);
      } catch (const std::exception&) {
        cache_->Erase(e->ranks, false);
      }
    }
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
    // Aborted or revoked after an earlier error: no channel left (agreement.h).
    if (e == nullptr || !e->handle || e->handle->comm == nullptr || e->handle->revoked) return false;
    current_ = e->handle.get();  // Collective() runs on, and on failure aborts, current_
    Collective(
        "agreement on the membership", words.data(), words.size_bytes(),
        [&](void* dev) { return ncclAllReduce(dev, dev, words.size(), ncclUint64, ncclMin, e->handle->comm, ops_.stream()); },
        iteration);
    // Not this iteration's communicator yet: a build that throws after this
    // must leave none (RequireCommunicator), and a shrink may free this one.
    current_ = nullptr;
    return true;
  }

  Client& client_;
  const NcclOptions options_;
  const std::shared_ptr<JobSwitch> switch_;  // null: the flat backend
  const std::optional<DataParallelGroup> group_;
  const std::string key_run_;  // run_id, and the group's name for a group
  const int device_;
  const cudaStream_t initial_stream_;  // NcclOptions::stream, or own_stream_
  const cudaStream_t own_stream_;      // nullptr: the stream is the caller's
  // The trainer's own store (NcclOptions::rendezvous_store) or stragglerd's.
  std::shared_ptr<gloo::rendezvous::Store> store_;
  // After store_ (they hold references to it); ops_ before cache_, whose
  // release calls it.
  CommOps ops_;
  detail::StoreAgreementTransport transport_{
      *store_, [this](uint64_t it, std::span<uint64_t> words) { return MinOverPrevious(it, words); }};
  std::vector<uint32_t> world_;
  const detail::NcclFeatures features_ = detail::NcclCalls::Get().features();
  std::unique_ptr<detail::CommCache<CommPtr>> cache_;
  Comm* current_ = nullptr;  // the communicator of the current iteration
  std::vector<CommPtr> orphans_;  // failed shrinks NCCL may still write into
  detail::GroupActiveCache group_active_;  // a group's active members per job plan

  detail::Agreement agreement_;
};

}  // namespace

std::string NcclOptions::Validate() const {
  // With a store of the trainer's own, no daemon address is needed.
  std::string common = detail::ValidateCommonOptions(*this, /*uses_endpoint=*/!rendezvous_store);
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

std::string NcclRuntimeDescription() { return detail::NcclCalls::Get().features().Describe(); }

namespace {

std::unique_ptr<NcclPartialAllReduce> CreateNccl(Client& client, const NcclOptions& options,
                                                 std::shared_ptr<JobSwitch> job_switch,
                                                 std::optional<DataParallelGroup> group, std::string* error) {
  auto fail = [&](std::string why) { return detail::Refuse<NcclPartialAllReduce>(error, std::move(why)); };
  if (std::string why = detail::ValidateFactoryInput(options, job_switch.get(), group); !why.empty()) return fail(why);
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
  auto r = std::make_unique<NcclPartialAllReduceImpl>(client, options, device, stream, own, std::move(job_switch),
                                                      std::move(group));
  try {
    r->BuildFull();
  } catch (const std::exception& e) {
    return fail("rank " + std::to_string(options.rank) + ": " + e.what());
  }
  return r;
}

}  // namespace

std::unique_ptr<NcclPartialAllReduce> CreateNcclPartialAllReduce(Client& client, const NcclOptions& options,
                                                                 std::string* error) {
  return CreateNccl(client, options, nullptr, std::nullopt, error);
}

std::unique_ptr<NcclPartialAllReduce> CreateNcclGroupPartialAllReduce(Client& client,
                                                                      std::shared_ptr<JobSwitch> job_switch,
                                                                      const DataParallelGroup& group,
                                                                      const NcclOptions& options,
                                                                      std::string* error) {
  return CreateNccl(client, options, std::move(job_switch), group, error);
}

}  // namespace straggler
