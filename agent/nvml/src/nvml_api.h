// The few NVML declarations the sampler uses, written out here because the
// build hosts have no nvml.h (and must not need one: NVML is dlopen()ed).
// Values and signatures are those of NVIDIA's NVML API reference (nvml.h).
#pragma once

#include <cstdint>

namespace straggler::nvml::detail {

using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;

inline constexpr nvmlReturn_t NVML_SUCCESS = 0;
inline constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
inline constexpr nvmlReturn_t NVML_ERROR_FUNCTION_NOT_FOUND = 13;

// nvmlClockType_t
inline constexpr int NVML_CLOCK_SM = 1;
inline constexpr int NVML_CLOCK_MEM = 2;
// nvmlTemperatureSensors_t
inline constexpr int NVML_TEMPERATURE_GPU = 0;
// nvmlMemoryErrorType_t
inline constexpr int NVML_MEMORY_ERROR_TYPE_CORRECTED = 0;
inline constexpr int NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1;
// nvmlEccCounterType_t
inline constexpr int NVML_VOLATILE_ECC = 0;

// NVML_DEVICE_UUID_V2_BUFFER_SIZE
inline constexpr unsigned kUuidBufferSize = 96;

struct nvmlUtilization_t {
  unsigned int gpu;     // percent
  unsigned int memory;  // percent
};

// Every entry point used, resolved by name. The enums are passed as int:
// NVML's are C enums, int-sized on every supported ABI.
struct NvmlApi {
  nvmlReturn_t (*Init_v2)();
  nvmlReturn_t (*Shutdown)();
  const char* (*ErrorString)(nvmlReturn_t);
  nvmlReturn_t (*DeviceGetCount_v2)(unsigned int*);
  nvmlReturn_t (*DeviceGetHandleByIndex_v2)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*DeviceGetUUID)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*DeviceGetClockInfo)(nvmlDevice_t, int, unsigned int*);     // MHz
  nvmlReturn_t (*DeviceGetMaxClockInfo)(nvmlDevice_t, int, unsigned int*);  // MHz
  nvmlReturn_t (*DeviceGetTemperature)(nvmlDevice_t, int, unsigned int*);   // degrees C
  nvmlReturn_t (*DeviceGetPowerUsage)(nvmlDevice_t, unsigned int*);         // mW
  nvmlReturn_t (*DeviceGetEnforcedPowerLimit)(nvmlDevice_t, unsigned int*); // mW
  nvmlReturn_t (*DeviceGetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t*);
  // nvmlDeviceGetCurrentClocksEventReasons (NVML 12.2+), else the older
  // nvmlDeviceGetCurrentClocksThrottleReasons: same signature and bits.
  nvmlReturn_t (*DeviceGetCurrentClocksEventReasons)(nvmlDevice_t, unsigned long long*);
  nvmlReturn_t (*DeviceGetTotalEccErrors)(nvmlDevice_t, int, int, unsigned long long*);
};

}  // namespace straggler::nvml::detail
