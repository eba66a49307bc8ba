// straggler-replay's output: the JSON report (--report, --format json), the
// markdown rows BENCHMARKS.md and scenarios/README.md carry, and the
// table. Each policy's Result is made by main.cc's Run; these only write.
// Pure functions of their arguments (and std::cout); one thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "replay.h"
#include "straggler/quality/criteria.h"
#include "straggler/quality/scenario.h"
#include "straggler/quality/scoring.h"
#include "straggler/quality/trace.h"

namespace straggler::replay {

struct Result {
  PolicyRun run;
  std::optional<quality::Score> score;
  std::optional<quality::Criteria> criteria;  // issue 17's criteria (criteria.h), with truth
  nlohmann::json settings;           // engine policies: every PolicyConfig field it ran with
};


// The whole report: the input, the trace's shape and truth, and per policy
// its detections, recoveries, scores, criteria and settings (the first
// policy's also at the top level, as before --policy all existed).
nlohmann::json ReportJson(const std::string& input, const quality::Trace& trace,
                          const std::optional<quality::Scenario>& scenario,
                          const std::vector<Result>& results);

// --format markdown: one row per policy (a trace without truth: where each
// rank was flagged and unflagged instead of scores).
void PrintMarkdown(const quality::Trace& trace, const std::vector<Result>& results);

// --format table: the trace's shape, then one line per policy.
void PrintTable(const quality::Trace& trace, const std::optional<quality::Scenario>& scenario,
                const std::vector<Result>& results);

}  // namespace straggler::replay
