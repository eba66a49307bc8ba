// The NCCL membership calls that depend on the NCCL version: ncclCommRevoke
// (>= 2.28.7) and ncclCommGrow/ncclCommGetUniqueId (>= 2.29). Chosen at
// compile time (NCCL_VERSION_CODE of the headers) AND at run time
// (ncclGetVersion of the libnccl.so.2 actually loaded - in a PyTorch process
// usually torch's bundled one), and resolved with dlsym, never linked: a
// backend built here against 2.28.9 loads against an older libnccl (no
// revoke) and a newer one alike. detail::ChooseNcclFeatures (nccl_plan.h)
// holds the rule; this file only asks the library.
//
//   const NcclCalls& calls = NcclCalls::Get();
//   if (calls.features().revoke) calls.Revoke(comm);
//
// Thread safety: Get() resolves once (a function-local static); the object
// is immutable afterwards and may be used from any thread.
#pragma once

#include <nccl.h>

#include "nccl_plan.h"

namespace straggler::detail {

class NcclCalls {
 public:
  static const NcclCalls& Get();

  const NcclFeatures& features() const { return features_; }

  // Each returns ncclInvalidUsage (and does nothing) when the feature is off.
  ncclResult_t Revoke(ncclComm_t comm) const;
  // ncclCommGetUniqueId on the parent (the grow coordinator only); `id` is
  // the buffer of an ncclUniqueId.
  ncclResult_t GrowUniqueId(ncclComm_t parent, ncclUniqueId* id) const;
  // Existing ranks: parent != nullptr, id nullptr, rank -1. Joiners: parent
  // nullptr, the coordinator's id, their rank in the grown communicator.
  ncclResult_t Grow(ncclComm_t parent, int nranks, const ncclUniqueId* id, int rank, ncclComm_t* out,
                    ncclConfig_t* config) const;

 private:
  NcclCalls();
  NcclFeatures features_;
  void* revoke_ = nullptr;
  void* grow_ = nullptr;
  void* grow_unique_id_ = nullptr;
};

}  // namespace straggler::detail
