/* A stand-in for libnvidia-ml.so.1 with only the entry points stragglerd's
 * sampler uses, so tests exercise the real dlopen/dlsym path on hosts with
 * no GPU. Every call re-reads the state file named by $FAKE_NVML_STATE, so a
 * test changes what the "GPUs" report while the sampler runs:
 *
 *   init 0              nvmlInit_v2's return code (default 0 = success)
 *   count 2             nvmlDeviceGetCount_v2
 *   0 uuid GPU-aaaa     per GPU (index first): uuid, sm, max_sm, mem (MHz),
 *   0 sm 1770           temp (C), power_mw, limit_mw, util_gpu, util_mem (%),
 *   0 reasons 0x20      reasons (bitmask), ecc_corr, ecc_uncorr
 *
 * A per-GPU key that is absent makes its query return NVML_ERROR_NOT_SUPPORTED.
 * Built three ways (tests/CMakeLists.txt): as is; FAKE_NVML_LEGACY (only the
 * pre-12.2 nvmlDeviceGetCurrentClocksThrottleReasons); FAKE_NVML_NO_POWER
 * (no nvmlDeviceGetPowerUsage: a library the sampler must refuse). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

enum { kSuccess = 0, kInvalidArgument = 2, kNotSupported = 3, kNotFound = 6, kInsufficientSize = 7 };

/* Finds `key` for `gpu` (-1: a global key) in the state file; 1 when found. */
static int Lookup(int gpu, const char* key, char* value, size_t cap) {
  const char* path = getenv("FAKE_NVML_STATE");
  if (path == NULL) return 0;
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0;
  char line[256];
  int found = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    char k[64], v[128];
    int index = -1;
    if (gpu >= 0) {
      if (sscanf(line, "%d %63s %127s", &index, k, v) != 3 || index != gpu) continue;
    } else if (sscanf(line, "%63s %127s", k, v) != 2) {
      continue;
    }
    if (strcmp(k, key) == 0) {
      snprintf(value, cap, "%s", v);
      found = 1; /* the last line wins */
    }
  }
  fclose(f);
  return found;
}

static int Number(int gpu, const char* key, unsigned long long* out) {
  char v[128];
  if (!Lookup(gpu, key, v, sizeof v)) return 0;
  *out = strtoull(v, NULL, 0);
  return 1;
}

static int Count(void) {
  unsigned long long n = 0;
  return Number(-1, "count", &n) ? (int)n : 0;
}

/* Handles are index + 1, so that no valid handle is NULL. */
static int IndexOf(nvmlDevice_t d) {
  long i = (long)(size_t)d - 1;
  return i >= 0 && i < Count() ? (int)i : -1;
}

static nvmlReturn_t Unsigned(nvmlDevice_t d, const char* key, unsigned int* out) {
  int i = IndexOf(d);
  unsigned long long v = 0;
  if (i < 0 || out == NULL) return kInvalidArgument;
  if (!Number(i, key, &v)) return kNotSupported;
  *out = (unsigned int)v;
  return kSuccess;
}

nvmlReturn_t nvmlInit_v2(void) {
  unsigned long long rc = 0;
  return Number(-1, "init", &rc) ? (nvmlReturn_t)rc : kSuccess;
}

nvmlReturn_t nvmlShutdown(void) { return kSuccess; }

const char* nvmlErrorString(nvmlReturn_t rc) {
  switch (rc) {
    case 0: return "Success";
    case 3: return "Not Supported";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (count == NULL) return kInvalidArgument;
  *count = (unsigned int)Count();
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (device == NULL || (int)index >= Count()) return kInvalidArgument;
  *device = (nvmlDevice_t)(size_t)(index + 1);
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char* uuid, unsigned int length) {
  int i = IndexOf(d);
  char v[128];
  if (i < 0 || uuid == NULL) return kInvalidArgument;
  if (!Lookup(i, "uuid", v, sizeof v)) return kNotSupported;
  if (strlen(v) + 1 > length) return kInsufficientSize;
  strcpy(uuid, v);
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int* clock) {
  return Unsigned(d, type == 1 ? "sm" : type == 2 ? "mem" : "graphics", clock);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int* clock) {
  return Unsigned(d, type == 1 ? "max_sm" : type == 2 ? "max_mem" : "max_graphics", clock);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int* temp) {
  return sensor == 0 ? Unsigned(d, "temp", temp) : kInvalidArgument;
}

#ifndef FAKE_NVML_NO_POWER
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int* power) {
  return Unsigned(d, "power_mw", power);
}
#endif

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int* limit) {
  return Unsigned(d, "limit_mw", limit);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
  if (u == NULL) return kInvalidArgument;
  nvmlReturn_t rc = Unsigned(d, "util_gpu", &u->gpu);
  return rc != kSuccess ? rc : Unsigned(d, "util_mem", &u->memory);
}

static nvmlReturn_t Reasons(nvmlDevice_t d, unsigned long long* reasons) {
  int i = IndexOf(d);
  if (i < 0 || reasons == NULL) return kInvalidArgument;
  return Number(i, "reasons", reasons) ? kSuccess : kNotSupported;
}

#ifdef FAKE_NVML_LEGACY
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long* r) {
  return Reasons(d, r);
}
#else
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long* r) {
  return Reasons(d, r);
}
#endif

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int error_type, int counter_type,
                                         unsigned long long* count) {
  int i = IndexOf(d);
  if (i < 0 || count == NULL || counter_type != 0) return kInvalidArgument;
  return Number(i, error_type == 0 ? "ecc_corr" : "ecc_uncorr", count) ? kSuccess : kNotSupported;
}
