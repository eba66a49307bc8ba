#include "nccl_comm.h"

#include <gloo/common/error.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "straggler/collective.h"

namespace straggler::detail {

void ThrowCall(const std::string& call, const char* file, int line, const std::string& why) {
  throw CollectiveError(call + " failed at " + file + ":" + std::to_string(line) + ": " + why);
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait of ours is a bounded poll, never a block inside NCCL
  return config;
}

CommOps::CommOps(uint32_t rank, int device, std::chrono::milliseconds timeout, gloo::rendezvous::Store& store)
    : rank_(rank), device_(device), timeout_(timeout), store_(store) {}

CommOps::~CommOps() {
  if (scratch_ != nullptr) cudaFree(scratch_);
}

void CommOps::WaitComm(Comm& c, Clock::time_point deadline, const std::string& what) const {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    STRAGGLER_NCCL_START(ncclCommGetAsyncError(c.comm, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      throw CollectiveError(what + ": " + ncclGetErrorString(state) + " (" + ncclGetLastError(c.comm) + ")");
    }
    if (Clock::now() >= deadline) {
      throw CollectiveError(what + ": not finished within " + std::to_string(timeout_.count()) +
                            " ms (a member of " + SetText(c.ranks) + " did not take part)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void CommOps::WaitStream(Comm& c, Clock::time_point deadline) const {
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

bool CommOps::StartInit(Comm& c, const std::string& key, Clock::time_point deadline, bool blocking_get) {
  const int index = CommRankOf(c.ranks, rank_);
  ncclUniqueId id;
  ReadmissionRecord record;
  if (index == 0) {
    STRAGGLER_NCCL_START(ncclGetUniqueId(&id));
    record.id.assign(id.internal, sizeof(id.internal));
    // A set of one needs nobody to read it (and no daemon to start alone).
    if (c.ranks.size() > 1) {
      const std::string bytes = EncodeRecord(record);
      store_.set(key, std::vector<char>(bytes.begin(), bytes.end()));
    }
  } else {
    try {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      store_.wait({key}, blocking_get ? std::max(left, std::chrono::milliseconds(1)) : std::chrono::milliseconds(1));
    } catch (const gloo::IoException& e) {
      if (!blocking_get) return false;  // not published yet: try again next iteration
      throw CollectiveError("the id of the communicator of ranks " + SetText(c.ranks) + " (key '" + key +
                            "') did not arrive: " + e.what());
    }
    const std::vector<char> raw = store_.get(key);
    std::string why;
    std::optional<ReadmissionRecord> got =
        DecodeRecord(std::string(raw.begin(), raw.end()), sizeof(id.internal), &why);
    if (!got) throw CollectiveError("rendezvous key '" + key + "' " + why);
    record = std::move(*got);
    std::memcpy(id.internal, record.id.data(), sizeof(id.internal));
  }
  ncclConfig_t config = NonBlockingConfig();
  if (record.how == CommPlan::How::kGrow) {
    // A joiner: the members keep their numbers, the joiners are appended.
    c.order = OrderAfterGrow(record.parent_order, c.ranks);
    const int rank = CommRankOf(c.order, rank_);
    if (c.order.size() != c.ranks.size() || rank < 0) {
      throw CollectiveError("rendezvous key '" + key + "' grows ranks " + SetText(record.parent_order) +
                            " into a set other than " + SetText(c.ranks));
    }
    if (!NcclCalls::Get().features().grow) {
      throw CollectiveError("rendezvous key '" + key + "' asks rank " + std::to_string(rank_) +
                            " to join by ncclCommGrow, which this process cannot call: " +
                            NcclCalls::Get().features().Describe());
    }
    STRAGGLER_NCCL_START(NcclCalls::Get().Grow(nullptr, static_cast<int>(c.order.size()), &id, rank, &c.comm, &config));
  } else {
    c.order = c.ranks;
    STRAGGLER_NCCL_START(ncclCommInitRankConfig(&c.comm, static_cast<int>(c.ranks.size()), id, index, &config));
  }
  c.started = true;
  return true;
}

void CommOps::StartGrow(Comm& c, Comm& parent, const std::string& key) {
  c.order = OrderAfterGrow(parent.order, c.ranks);
  ncclUniqueId id;
  const bool coordinator = c.ranks.front() == rank_;
  if (coordinator) {
    STRAGGLER_NCCL_START(NcclCalls::Get().GrowUniqueId(parent.comm, &id));
    ReadmissionRecord record{CommPlan::How::kGrow, std::string(id.internal, sizeof(id.internal)), parent.order};
    const std::string bytes = EncodeRecord(record);
    store_.set(key, std::vector<char>(bytes.begin(), bytes.end()));
  }
  ncclConfig_t config = NonBlockingConfig();
  // Existing ranks pass rank -1 and keep their number; NCCL hands the id to
  // the parent's boundary ranks itself (src/init.cc), so only the
  // coordinator passes it.
  STRAGGLER_NCCL_START(NcclCalls::Get().Grow(parent.comm, static_cast<int>(c.ranks.size()),
                                             coordinator ? &id : nullptr, -1, &c.comm, &config));
  c.started = true;
}

void CommOps::Finish(Comm& c, uint64_t iteration, Clock::time_point deadline, const std::string& what) {
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

bool CommOps::Revoke(Comm& c) {
  if (c.comm == nullptr || c.revoked || !NcclCalls::Get().features().revoke) return false;
  const ncclResult_t r = NcclCalls::Get().Revoke(c.comm);
  if (r != ncclSuccess && r != ncclInProgress) return false;
  c.revoked = true;
  try {
    // Quiescent once the revoke's job has stopped what was in flight.
    WaitComm(c, Clock::now() + timeout_, "ncclCommRevoke");
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

void CommOps::Release(CommPtr& c, bool healthy) {
  if (!c || c->comm == nullptr) return;
  cudaSetDevice(device_);
  bool destroyed = false;
  if (c->revoked) {
    // NCCL refuses ncclCommFinalize after a revoke; a destroy is local then.
    destroyed = ncclCommDestroy(c->comm) == ncclSuccess;
  } else if (healthy && c->ready) {
    const ncclResult_t r = ncclCommFinalize(c->comm);
    if (r == ncclSuccess || r == ncclInProgress) {
      try {
        WaitComm(*c, Clock::now() + timeout_, "ncclCommFinalize");
        destroyed = ncclCommDestroy(c->comm) == ncclSuccess;
      } catch (const std::exception&) {
      }
    }
  }
  if (!destroyed) ncclCommAbort(c->comm);
  c->comm = nullptr;
}

void* CommOps::Scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_ != nullptr) STRAGGLER_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    STRAGGLER_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

bool CommOps::IsDevicePointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error of an unknown pointer
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

}  // namespace straggler::detail
