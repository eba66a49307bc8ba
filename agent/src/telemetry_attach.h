// The agent's telemetry decorators: put each rank's latest GPU sample on an
// upstream ReportBatch (ReportBatch.telemetry), and the node's and each
// rank's process's latest host sample (ReportBatch.host, .processes), once
// per sample and upstream stream.
//
//   agent.SetBatchDecorator([&](const BatchContext& ctx, v1::ReportBatch& b) {
//     AttachTelemetry(*sampler, ctx, b);
//   });
//
// A pure function of its arguments (the source is thread-safe); the per-rank
// "already sent" sequence lives in BatchContext::marks, which the agent
// clears for every new upstream stream.
#pragma once

#include <cstddef>

#include "agent.h"
#include "host_sampler.h"
#include "straggler/nvml/telemetry.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::agent {

// For every rank in context.devices whose GPU (nvml::MapRankToGpu) has a
// sample whose sequence differs from context.marks[rank]: appends it to
// batch.telemetry and records its sequence. Returns how many it appended.
size_t AttachTelemetry(const nvml::TelemetrySource& source, const BatchContext& context,
                       v1::ReportBatch& batch);

// The node's latest sample when its sequence differs from
// context.host_mark (into batch.host), and for every rank in context.pids
// its process's latest sample when new to context.process_marks (into
// batch.processes; the first ask starts the sampler reading that process).
// Returns how many samples it attached.
size_t AttachHostTelemetry(HostSampler& sampler, const BatchContext& context,
                           v1::ReportBatch& batch);

// Host samples -> straggler.v1 wire messages.
void ToProto(const NodeSample& s, v1::HostTelemetry* out);
void ToProto(const ProcessSample& s, uint32_t rank, v1::ProcessTelemetry* out);

}  // namespace straggler::agent
