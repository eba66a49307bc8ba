#include "report.h"

#include <iostream>
#include <utility>

#include "absl/strings/str_format.h"

namespace straggler::replay {
namespace {

using namespace straggler::quality;

nlohmann::json Opt(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
nlohmann::json Opt(const std::optional<uint64_t>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json ScoreJson(const Score& s) {
  return {{"precision", Opt(s.precision)},
          {"recall", Opt(s.recall)},
          {"f1", Opt(s.f1)},
          {"true_positives", s.tp},
          {"false_positives", s.fp},
          {"false_negatives", s.fn},
          {"true_negatives", s.tn},
          {"scored_rank_iterations", s.scored},
          {"false_positives_per_1000", s.fp_per_1000},
          {"false_alarms", s.false_alarms},
          {"flaps", s.flaps},
          {"episodes", s.episodes},
          {"detected", s.detected},
          {"missed", s.missed},
          {"detection_latency",
           {{"mean", Opt(s.detection_latency_mean)},
            {"max", Opt(s.detection_latency_max)},
            {"per_episode", s.detection_latencies}}},
          {"recovery_latency",
           {{"mean", Opt(s.recovery_latency_mean)},
            {"max", Opt(s.recovery_latency_max)},
            {"recoverable", s.recoverable},
            {"recovered", s.recovered},
            {"not_recovered", s.not_recovered}}}};
}

std::string Fmt(const std::optional<double>& v, int digits) {
  return v ? absl::StrFormat("%.*f", digits, *v) : std::string("-");
}


nlohmann::json CriteriaJson(const Criteria& c) {
  nlohmann::json j = {{"pass", c.pass()},         {"summary", c.Summary()},
                      {"episodes", c.episodes},   {"in_time", c.in_time},
                      {"late", c.late},           {"missed", c.missed},
                      {"false_alarms", c.false_alarms}, {"flaps", c.flaps},
                      {"stuck", c.stuck},         {"failures", c.failures}};
  if (c.cause_checked) j["wrong_cause"] = c.wrong_cause;  // the scenario names a cause
  return j;
}

// A trace without ground truth has no scores to tabulate: its markdown row
// lists where each rank was flagged and unflagged instead, as
// "rank@iteration" ordered by iteration, at most kMaxListed of them.
constexpr size_t kMaxListed = 100;
std::string RankAtList(const std::vector<std::vector<uint64_t>>& per_rank) {
  std::vector<std::pair<uint64_t, uint32_t>> at;  // (iteration, rank)
  for (uint32_t r = 0; r < per_rank.size(); ++r)
    for (uint64_t i : per_rank[r]) at.emplace_back(i, r);
  if (at.empty()) return "-";
  std::sort(at.begin(), at.end());
  std::string text;
  for (size_t k = 0; k < at.size() && k < kMaxListed; ++k)
    text += (k ? ", " : "") + std::to_string(at[k].second) + "@" + std::to_string(at[k].first);
  if (at.size() > kMaxListed) text += absl::StrFormat(", ... (%d more)", at.size() - kMaxListed);
  return text;
}

// The criteria cell: "pass", or the counts that failed ("late 1, alarms 2").
std::string MarkdownCriteria(const Criteria& c) {
  if (c.pass()) return "pass";
  std::string out = "**fail**:";
  auto add = [&](uint64_t n, const char* what) {
    if (n) out += absl::StrFormat(" %s %d", what, n);
  };
  add(c.late, "late");
  add(c.missed, "missed");
  add(c.false_alarms, "alarms");
  add(c.flaps, "flaps");
  add(c.stuck, "stuck");
  add(c.wrong_cause, "wrong cause");
  return out;
}


// The truth's episodes as {rank, from, to} (absolute iterations), and
// `cells`, the straggler rank-iterations they hold.
nlohmann::json TruthJson(const Trace& trace, uint64_t* cells) {
  nlohmann::json truth = nlohmann::json::array();
  if (trace.has_truth) {
    for (const auto& iv : Intervals(trace.truth)) {
      truth.push_back({{"rank", iv.rank},
                       {"from", trace.Iteration(iv.from)},
                       {"to", trace.Iteration(iv.to)}});
      *cells += iv.to - iv.from;
    }
  }
  return truth;
}

}  // namespace

nlohmann::json ReportJson(const std::string& input, const Trace& trace,
                          const std::optional<Scenario>& scenario,
                          const std::vector<Result>& results) {
  uint64_t truth_cells = 0;
  const nlohmann::json truth = TruthJson(trace, &truth_cells);
  nlohmann::json policies_json = nlohmann::json::array();
  for (const auto& res : results) {
    nlohmann::json ranks = nlohmann::json::array();
    for (uint32_t r = 0; r < trace.ranks; ++r) {
      ranks.push_back({{"rank", r},
                       {"detected_at", res.run.detected_at[r]},
                       {"recovered_at", res.run.recovered_at[r]},
                       {"unresponsive_at", res.run.unresponsive_at[r]}});
      if (!res.run.detected_cause.empty())
        ranks.back()["detected_cause"] = res.run.detected_cause[r];
      // The topology the trace declares for the rank (docs/topology.md): for
      // an engine policy, what the engine holds after the replay
      // (JobEngine::Topology), so the report shows what it judged by.
      const bool engine = !res.run.topology.empty();
      if (!trace.peer_group.empty()) {  // trace.replica is then per rank too
        const std::optional<uint32_t>& replica =
            engine ? res.run.topology[r].replica : trace.replica[r];
        ranks.back()["peer_group"] = engine ? res.run.topology[r].peer_group : trace.peer_group[r];
        ranks.back()["replica"] = nullptr;
        if (replica.has_value()) ranks.back()["replica"] = replica.value();
      }
      if (!trace.gpu_model.empty())
        ranks.back()["gpu_model"] = engine ? res.run.topology[r].gpu_model : trace.gpu_model[r];
    }
    nlohmann::json p = {{"policy", res.run.policy}, {"ranks", ranks}};
    if (res.score) p["scores"] = ScoreJson(*res.score);
    if (res.criteria) p["criteria"] = CriteriaJson(*res.criteria);
    if (!res.settings.is_null()) p["settings"] = res.settings;
    policies_json.push_back(std::move(p));
  }
  nlohmann::json doc = {{"input", input},
                        {"name", trace.name},
                        {"ranks_count", trace.ranks},
                        {"first_iteration", trace.first_iteration},
                        {"iterations", trace.iterations},
                        {"base_seconds", trace.base_seconds},
                        {"policy", policies_json[0]["policy"]},
                        {"ranks", policies_json[0]["ranks"]}};
  if (policies_json[0].contains("scores")) doc["scores"] = policies_json[0]["scores"];
  if (policies_json[0].contains("criteria")) doc["criteria"] = policies_json[0]["criteria"];
  if (policies_json[0].contains("settings")) doc["settings"] = policies_json[0]["settings"];
  if (trace.has_truth) {
    doc["truth"] = truth;
    doc["truth_min_factor"] = scenario->truth_min_factor;
    if (!scenario->topology_text.empty()) doc["topology"] = scenario->topology_text;
  }
  doc["policies"] = policies_json;
  return doc;
}

void PrintMarkdown(const Trace& trace, const std::vector<Result>& results) {
  if (!trace.has_truth) {
    std::cout << "| trace | policy | detections (rank@iteration) | recoveries (rank@iteration) |\n"
              << "|---|---|---|---|\n";
    for (const auto& res : results)
      std::cout << "| " << trace.name << " | " << res.run.policy << " | "
                << RankAtList(res.run.detected_at) << " | " << RankAtList(res.run.recovered_at)
                << " |\n";
    return;
  }
  std::cout << "| scenario | policy | precision | recall | F1 | det. latency mean / max | "
               "rec. latency mean | FP/1k | detected | false alarms | flaps | criteria |\n"
            << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& res : results) {
    std::cout << "| " << trace.name << " | " << res.run.policy << " | ";
    if (!res.score) {
      std::cout << "- | - | - | - | - | - | - | - | - | - |\n";
      continue;
    }
    const Score& s = *res.score;
    std::optional<double> dmax;
    if (s.detection_latency_max) dmax = static_cast<double>(*s.detection_latency_max);
    std::cout << Fmt(s.precision, 3) << " | " << Fmt(s.recall, 3) << " | " << Fmt(s.f1, 3)
              << " | " << Fmt(s.detection_latency_mean, 1) << " / " << Fmt(dmax, 0) << " | "
              << Fmt(s.recovery_latency_mean, 1) << " | " << absl::StrFormat("%.2f", s.fp_per_1000)
              << " | " << s.detected << "/" << s.episodes << " | " << s.false_alarms << " | "
              << s.flaps << " | " << MarkdownCriteria(*res.criteria) << " |\n";
  }
}

void PrintTable(const Trace& trace, const std::optional<Scenario>& scenario,
                const std::vector<Result>& results) {
  uint64_t truth_cells = 0;
  const nlohmann::json truth = TruthJson(trace, &truth_cells);
  std::cout << trace.name << ": " << trace.ranks << " ranks x " << trace.iterations
            << " iterations";
  if (scenario && !scenario->topology_text.empty())
    std::cout << " (topology: " << scenario->topology_text << ")";
  if (trace.has_truth)
    std::cout << ", " << truth_cells << " straggler rank-iterations in " << truth.size()
              << " episode(s) (truth_min_factor " << scenario->truth_min_factor << ")";
  else
    std::cout << ", no ground truth (CSV): detections only";
  std::cout << '\n';
  if (trace.has_truth)
    std::cout << absl::StrFormat("%-10s %9s %7s %6s %9s %8s %9s %8s %9s %7s %5s  %s\n", "policy",
                               "precision", "recall", "F1", "det.mean", "det.max", "rec.mean",
                               "FP/1k", "detected", "alarms", "flaps", "criteria");
  for (const auto& res : results) {
    if (!res.score) {
      uint64_t d = 0, rcv = 0;
      for (uint32_t r = 0; r < trace.ranks; ++r) {
        d += res.run.detected_at[r].size();
        rcv += res.run.recovered_at[r].size();
      }
      std::cout << absl::StrFormat("%-10s detections %llu, recoveries %llu\n", res.run.policy,
                                   static_cast<unsigned long long>(d),
                                   static_cast<unsigned long long>(rcv));
      continue;
    }
    const Score& s = *res.score;
    std::optional<double> dmax;
    if (s.detection_latency_max) dmax = static_cast<double>(*s.detection_latency_max);
    std::cout << absl::StrFormat(
        "%-10s %9s %7s %6s %9s %8s %9s %8.2f %9s %7llu %5llu  %s\n", res.run.policy,
        Fmt(s.precision, 3), Fmt(s.recall, 3), Fmt(s.f1, 3), Fmt(s.detection_latency_mean, 1),
        Fmt(dmax, 0), Fmt(s.recovery_latency_mean, 1), s.fp_per_1000,
        std::to_string(s.detected) + "/" + std::to_string(s.episodes),
        static_cast<unsigned long long>(s.false_alarms), static_cast<unsigned long long>(s.flaps),
        res.criteria->Summary());
    const auto& failures = res.criteria->failures;
    for (size_t k = 0; k < failures.size() && k < 5; ++k) std::cout << "    " << failures[k] << '\n';
    if (failures.size() > 5) std::cout << "    ... (" << failures.size() - 5 << " more)\n";
  }
}

}  // namespace straggler::replay
