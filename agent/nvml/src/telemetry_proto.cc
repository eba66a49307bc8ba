#include "straggler/nvml/telemetry_proto.h"

namespace straggler::nvml {

void ToProto(const GpuSample& s, v1::GpuTelemetry* out) {
  out->set_gpu_index(s.gpu_index);
  out->set_uuid(s.uuid);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      s.sample_time.time_since_epoch())
                      .count();
  out->mutable_sample_time()->set_seconds(ns / 1'000'000'000);
  out->mutable_sample_time()->set_nanos(static_cast<int32_t>(ns % 1'000'000'000));
  if (s.sm_clock_hertz) out->set_sm_clock_hertz(*s.sm_clock_hertz);
  if (s.max_sm_clock_hertz) out->set_max_sm_clock_hertz(*s.max_sm_clock_hertz);
  if (s.memory_clock_hertz) out->set_memory_clock_hertz(*s.memory_clock_hertz);
  if (s.temperature_celsius) out->set_temperature_celsius(*s.temperature_celsius);
  if (s.power_watts) out->set_power_watts(*s.power_watts);
  if (s.power_limit_watts) out->set_power_limit_watts(*s.power_limit_watts);
  if (s.gpu_utilization) out->set_gpu_utilization(*s.gpu_utilization);
  if (s.memory_utilization) out->set_memory_utilization(*s.memory_utilization);
  if (s.clock_event_reasons) out->set_clock_event_reasons(*s.clock_event_reasons);
  if (s.ecc_corrected_errors) out->set_ecc_corrected_errors(*s.ecc_corrected_errors);
  if (s.ecc_uncorrected_errors) out->set_ecc_uncorrected_errors(*s.ecc_uncorrected_errors);
}

void ToProto(const GpuSample& s, v1::RankTelemetry* out, uint32_t rank) {
  out->set_rank(rank);
  ToProto(s, out->mutable_gpu());
}

RankDevice FromProto(const v1::RankDevice& d) {
  RankDevice out;
  out.rank = d.rank();
  out.local_rank = d.local_rank();
  out.cuda_visible_devices = d.cuda_visible_devices();
  out.gpu_uuid = d.gpu_uuid();
  out.incarnation = d.incarnation();
  out.peer_group = d.peer_group();
  if (d.has_replica()) out.replica = d.replica();
  out.gpu_model = d.gpu_model();
  return out;
}

void ToProto(const RankDevice& d, v1::RankDevice* out) {
  out->set_rank(d.rank);
  out->set_local_rank(d.local_rank);
  out->set_cuda_visible_devices(d.cuda_visible_devices);
  out->set_gpu_uuid(d.gpu_uuid);
  out->set_incarnation(d.incarnation);
  out->set_peer_group(d.peer_group);
  if (d.replica) out->set_replica(*d.replica);
  out->set_gpu_model(d.gpu_model);
}

std::vector<RankDevice> DevicesOf(const v1::StreamHello& hello) {
  std::vector<RankDevice> out;
  out.reserve(hello.devices_size());
  for (const auto& d : hello.devices()) out.push_back(FromProto(d));
  return out;
}

}  // namespace straggler::nvml
