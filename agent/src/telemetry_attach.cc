#include "telemetry_attach.h"

#include "straggler/nvml/telemetry_proto.h"

namespace straggler::agent {

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
