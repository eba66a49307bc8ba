// The agent's GPU telemetry decorator: puts each rank's latest GPU sample on
// an upstream ReportBatch (ReportBatch.telemetry), once per sample and
// upstream stream.
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
#include "straggler/nvml/telemetry.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::agent {

// For every rank in context.devices whose GPU (nvml::MapRankToGpu) has a
// sample whose sequence differs from context.marks[rank]: appends it to
// batch.telemetry and records its sequence. Returns how many it appended.
size_t AttachTelemetry(const nvml::TelemetrySource& source, const BatchContext& context,
                       v1::ReportBatch& batch);

}  // namespace straggler::agent
