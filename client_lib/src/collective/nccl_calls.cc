#include "nccl_calls.h"

#include <dlfcn.h>

// The ctest collective:nccl_grow_syntax compiles this file against a stub
// nccl.h of 2.29 (tests/collective/nccl_2_29_stub/) with this defined: the
// grow branch must then really be compiled.
#if defined(STRAGGLER_REQUIRE_GROW_BRANCH) && NCCL_VERSION_CODE < NCCL_VERSION(2, 29, 0)
#error "STRAGGLER_REQUIRE_GROW_BRANCH: the nccl.h found is older than 2.29, the grow branch is compiled out"
#endif

namespace straggler::detail {
namespace {

// The libnccl this library's own NCCL calls resolved to (a PyTorch process
// may have loaded torch's before us: the dynamic linker then binds ours to
// it), found from the address of one of its functions. RTLD_DEFAULT alone
// would miss it inside a Python extension, whose dependencies are not global.
void* LoadedNccl() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) != 0 && info.dli_fname != nullptr) {
    if (void* h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) return h;
  }
  return RTLD_DEFAULT;
}

void* Symbol(void* lib, const char* name) {
  void* s = dlsym(lib, name);
  return s != nullptr ? s : dlsym(RTLD_DEFAULT, name);
}

}  // namespace

const NcclCalls& NcclCalls::Get() {
  static const NcclCalls calls;
  return calls;
}

NcclCalls::NcclCalls() {
  int runtime = 0;
  if (ncclGetVersion(&runtime) != ncclSuccess) runtime = 0;
  void* lib = LoadedNccl();
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
  revoke_ = Symbol(lib, "ncclCommRevoke");
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  grow_ = Symbol(lib, "ncclCommGrow");
  grow_unique_id_ = Symbol(lib, "ncclCommGetUniqueId");
#endif
  (void)lib;
  (void)Symbol;
  features_ = ChooseNcclFeatures(NCCL_VERSION_CODE, runtime, revoke_ != nullptr,
                                 grow_ != nullptr && grow_unique_id_ != nullptr);
}

ncclResult_t NcclCalls::Revoke(ncclComm_t comm) const {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
  // The pointer's type is the header's own declaration: a signature change
  // in a later NCCL fails to compile here rather than at run time.
  if (features_.revoke) return reinterpret_cast<decltype(&ncclCommRevoke)>(revoke_)(comm, NCCL_REVOKE_DEFAULT);
#endif
  (void)comm;
  return ncclInvalidUsage;
}

ncclResult_t NcclCalls::GrowUniqueId(ncclComm_t parent, ncclUniqueId* id) const {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  if (features_.grow) return reinterpret_cast<decltype(&ncclCommGetUniqueId)>(grow_unique_id_)(parent, id);
#endif
  (void)parent;
  (void)id;
  return ncclInvalidUsage;
}

ncclResult_t NcclCalls::Grow(ncclComm_t parent, int nranks, const ncclUniqueId* id, int rank, ncclComm_t* out,
                             ncclConfig_t* config) const {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  if (features_.grow) {
    return reinterpret_cast<decltype(&ncclCommGrow)>(grow_)(parent, nranks, id, rank, out, config);
  }
#endif
  (void)parent;
  (void)nranks;
  (void)id;
  (void)rank;
  (void)out;
  (void)config;
  return ncclInvalidUsage;
}

}  // namespace straggler::detail
