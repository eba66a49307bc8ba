// GPU telemetry as the per-node agent sees it: one sample per GPU, the device
// identity a rank reports in its hello, the rule that maps one to the other,
// and the interface the agent calls when it forwards a rank's reports.
//
//   std::unique_ptr<TelemetrySource> gpus = NvmlSampler::Start({});   // nvml_sampler.h
//   RankDevice dev = FromProto(hello.devices(i));                     // telemetry_proto.h
//   if (std::optional<GpuSample> s = gpus->ForRank(dev); s && s->sequence != last_sent[rank]) {
//     ToProto(*s, batch.add_telemetry(), dev.rank);
//     last_sent[rank] = s->sequence;
//   }
//
// Plain types, no NVML, protobuf or gRPC in this header.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace straggler::nvml {

// NVML clocks event ("throttle") reasons, values of NVIDIA's nvml.h
// (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*).
inline constexpr uint64_t kReasonGpuIdle = 0x1;
inline constexpr uint64_t kReasonApplicationsClocksSetting = 0x2;
inline constexpr uint64_t kReasonSwPowerCap = 0x4;
inline constexpr uint64_t kReasonHwSlowdown = 0x8;
inline constexpr uint64_t kReasonSyncBoost = 0x10;
inline constexpr uint64_t kReasonSwThermalSlowdown = 0x20;
inline constexpr uint64_t kReasonHwThermalSlowdown = 0x40;
inline constexpr uint64_t kReasonHwPowerBrakeSlowdown = 0x80;
inline constexpr uint64_t kReasonsThermal = kReasonSwThermalSlowdown | kReasonHwThermalSlowdown;
inline constexpr uint64_t kReasonsPower = kReasonSwPowerCap | kReasonHwPowerBrakeSlowdown;

// One reading of one GPU. A field the GPU or driver does not measure stays
// nullopt (never 0, which would read as a real value).
struct GpuSample {
  uint32_t gpu_index = 0;
  std::string uuid;
  std::chrono::system_clock::time_point sample_time{};
  // Grows by one per sample the sampler takes of this GPU: lets the agent
  // send a sample only when it is new.
  uint64_t sequence = 0;
  std::optional<double> sm_clock_hertz;
  std::optional<double> max_sm_clock_hertz;
  std::optional<double> memory_clock_hertz;
  std::optional<double> temperature_celsius;
  std::optional<double> power_watts;
  std::optional<double> power_limit_watts;
  std::optional<double> gpu_utilization;     // 0..1
  std::optional<double> memory_utilization;  // 0..1
  std::optional<uint64_t> clock_event_reasons;
  std::optional<uint64_t> ecc_corrected_errors;
  std::optional<uint64_t> ecc_uncorrected_errors;
};

// Which GPU a rank computes on, as its process reported it (StreamHello.devices).
struct RankDevice {
  uint32_t rank = 0;
  uint32_t local_rank = 0;
  std::string cuda_visible_devices;  // verbatim; "" = unset
  std::string gpu_uuid;              // "" = unknown
  uint64_t incarnation = 0;          // the rank's client process (0 = unknown; docs/runs.md)
  // Relayed to the daemon as the trainer declared them (docs/topology.md).
  std::string peer_group{};          // "" = the default group
  std::optional<uint32_t> replica{}; // nullopt = a replica of its own
  std::string gpu_model{};           // "" = unknown
};

// What the mapper knows about a node's GPU.
struct GpuIdentity {
  uint32_t index = 0;
  std::string uuid;
};

// The NVML index of the GPU `device` computes on, among `gpus`:
//  1. gpu_uuid, when set: the GPU with that UUID (exact, case-insensitive).
//  2. else CUDA_VISIBLE_DEVICES, when set: its entries are NVML indices or
//     UUIDs / unique UUID prefixes ("GPU-8f3a"); a single entry is the GPU, with
//     several the local_rank-th entry is (a rank per GPU, each process seeing
//     all of the node's GPUs, as torchrun does). An empty or "-1"-led list
//     means no GPU.
//  3. else local_rank as the NVML index.
// nullopt when the rule names no GPU of `gpus` (unknown UUID, index out of
// range, local_rank beyond the list). Limits: CUDA and NVML enumerate alike
// only with CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA's default is "fastest first");
// MIG instances ("MIG-..." UUIDs) are matched only by a reported UUID equal to
// a listed one, and the sampler lists whole GPUs, so a MIG rank maps to
// nothing unless its trainer reports the parent GPU's UUID.
std::optional<uint32_t> MapRankToGpu(const RankDevice& device, const std::vector<GpuIdentity>& gpus);

// The latest telemetry per rank. Implementations are thread-safe: ForRank
// may be called from any thread, concurrently with sampling.
class TelemetrySource {
 public:
  virtual ~TelemetrySource() = default;
  // The latest sample of the GPU that `device` maps to (MapRankToGpu);
  // nullopt when telemetry is off, the rank maps to no GPU, or that GPU has
  // not been sampled yet.
  virtual std::optional<GpuSample> ForRank(const RankDevice& device) const = 0;
};

}  // namespace straggler::nvml
