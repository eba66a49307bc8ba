// GpuSample / RankDevice <-> straggler.v1 wire messages, for the agent (it
// reads StreamHello.devices and fills ReportBatch.telemetry).
//
//   nvml::RankDevice dev = nvml::FromProto(hello.devices(0));
//   nvml::ToProto(sample, batch.add_telemetry(), dev.rank);
//
// Pure functions.
#pragma once

#include <vector>

#include "straggler/nvml/telemetry.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::nvml {

void ToProto(const GpuSample& s, v1::GpuTelemetry* out);
void ToProto(const GpuSample& s, v1::RankTelemetry* out, uint32_t rank);
RankDevice FromProto(const v1::RankDevice& d);
void ToProto(const RankDevice& d, v1::RankDevice* out);
// The devices of a hello, by rank.
std::vector<RankDevice> DevicesOf(const v1::StreamHello& hello);

}  // namespace straggler::nvml
