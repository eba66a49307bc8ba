/* A stand-in for NCCL 2.29's nccl.h, for the -fsyntax-only ctest
 * collective:nccl_grow_syntax: the installed NCCL (2.28.9) has no
 * ncclCommGrow, so the grow branch of client_lib/src/collective/nccl_calls.cc
 * is compiled out in the real build. This header takes the installed one and
 * adds the 2.29 declarations (NCCL's src/nccl.h.in), raising the version, so
 * that branch is compiled - and type-checked against these signatures. */
#pragma once
#include_next <nccl.h>

#undef NCCL_MINOR
#undef NCCL_PATCH
#undef NCCL_VERSION_CODE
#define NCCL_MINOR 29
#define NCCL_PATCH 0
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#ifdef __cplusplus
extern "C" {
#endif
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                          ncclComm_t* newcomm, ncclConfig_t* config);
#ifdef __cplusplus
}
#endif
