// Recorded traces as CSV (what `stragglerctl export JOB --format csv` writes):
// a header naming the columns `iteration`, `rank`, `compute_seconds` and
// optionally `epoch`, `peer_group`, `replica` and `gpu_model` (a rank's
// declared topology, docs/topology.md: the same on every row of a rank; an
// empty cell = not declared) and `work`, `input_wait_seconds`,
// `optimizer_seconds` (a report's work and phases, docs/client.md "Work and
// phases"; an empty cell = not given; Trace::work etc. stay empty without the
// column), in any order (other columns are ignored), then one row per
// report. Blank lines and lines starting with '#' are skipped.
//
//   std::ifstream in("job.csv");
//   auto t = ParseCsvTrace(in, "job.csv");
//   // error: "job.csv:7: compute_seconds 'fast' is not a number"
//
// The trace spans the lowest to the highest iteration seen; ranks are
// 0 .. highest rank; cells without a row are "no report". No ground truth.
#pragma once

#include <istream>
#include <string>

#include "absl/status/statusor.h"
#include "straggler/quality/trace.h"

namespace straggler::quality {

absl::StatusOr<Trace> ParseCsvTrace(std::istream& in, const std::string& source);
absl::StatusOr<Trace> LoadCsvTrace(const std::string& path);

}  // namespace straggler::quality
