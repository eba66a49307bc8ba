#include "telemetry_attach.h"

#include "straggler/nvml/telemetry_proto.h"

namespace straggler::agent {
namespace {

v1::HostReading ToProto(Reading r) {
  switch (r) {
    case Reading::kAvailable:
      return v1::HOST_READING_AVAILABLE;
    case Reading::kNotAvailable:
      return v1::HOST_READING_NOT_AVAILABLE;
    case Reading::kError:
      return v1::HOST_READING_ERROR;
  }
  return v1::HOST_READING_UNSPECIFIED;
}

void ToProto(std::chrono::system_clock::time_point t, google::protobuf::Timestamp* out) {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  out->set_seconds(ns / 1'000'000'000);
  out->set_nanos(static_cast<int32_t>(ns % 1'000'000'000));
}

void ToProto(const PressureReading& p, v1::HostPressure* out) {
  out->set_reading(ToProto(p.reading));
  if (p.some_avg10) out->set_some_avg10(*p.some_avg10);
  if (p.some_share) out->set_some_share(*p.some_share);
  out->set_detail(p.detail);
}

}  // namespace

void ToProto(const NodeSample& s, v1::HostTelemetry* out) {
  ToProto(s.sample_time, out->mutable_sample_time());
  out->set_period_seconds(s.period_seconds);
  ToProto(s.cpu, out->mutable_cpu_pressure());
  ToProto(s.memory, out->mutable_memory_pressure());
  ToProto(s.io, out->mutable_io_pressure());
  out->set_steal_reading(ToProto(s.steal_reading));
  if (s.cpu_steal_share) out->set_cpu_steal_share(*s.cpu_steal_share);
  out->set_steal_detail(s.steal_detail);
}

void ToProto(const ProcessSample& s, uint32_t rank, v1::ProcessTelemetry* out) {
  out->set_rank(rank);
  out->set_pid(static_cast<uint32_t>(s.pid));
  ToProto(s.sample_time, out->mutable_sample_time());
  out->set_period_seconds(s.period_seconds);
  out->set_reading(ToProto(s.reading));
  if (s.run_delay_seconds_per_second) {
    out->set_run_delay_seconds_per_second(*s.run_delay_seconds_per_second);
  }
  if (s.involuntary_switches_per_second) {
    out->set_involuntary_switches_per_second(*s.involuntary_switches_per_second);
  }
  out->set_detail(s.detail);
}

size_t AttachHostTelemetry(HostSampler& sampler, const BatchContext& context,
                           v1::ReportBatch& batch) {
  size_t added = 0;
  // Sequences start at 1, so a mark of 0 (none sent) never matches.
  if (std::optional<NodeSample> n = sampler.Node(); n && n->sequence != context.host_mark) {
    ToProto(*n, batch.mutable_host());
    context.host_mark = n->sequence;
    ++added;
  }
  for (const auto& [rank, pid] : context.pids) {
    std::optional<ProcessSample> s = sampler.ForPid(pid);
    if (!s) continue;
    uint64_t& mark = context.process_marks[rank];
    if (mark == s->sequence) continue;
    ToProto(*s, rank, batch.add_processes());
    mark = s->sequence;
    ++added;
  }
  return added;
}

size_t AttachTelemetry(const nvml::TelemetrySource& source, const BatchContext& context,
                       v1::ReportBatch& batch) {
  size_t added = 0;
  for (const auto& [rank, device] : context.devices) {
    std::optional<nvml::GpuSample> s = source.ForRank(device);
    if (!s) continue;
    // Sequences start at 1 per GPU, so an absent mark (0) never matches.
    auto [mark, fresh] = context.marks.try_emplace(rank, 0);
    if (!fresh && mark->second == s->sequence) continue;
    nvml::ToProto(*s, batch.add_telemetry(), rank);
    mark->second = s->sequence;
    ++added;
  }
  return added;
}

}  // namespace straggler::agent
