// straggler-replay — runs a scenario (scenarios/*.yaml) or a recorded trace
// (CSV: iteration,rank,compute_seconds[,epoch][,peer_group][,replica]
// [,gpu_model]) through the detection engine
// offline and deterministically, and through two reference rules, and
// scores each against the scenario's ground truth.
//
//   straggler-replay scenarios/slowdown-3x.yaml --policy all
//   straggler-replay job.csv --policy ewma --set ewma_ratio=1.3 --report out.json
//
// Exit status: 0 done; 1 every report of the trace was rejected by the
// engine (e.g. --set max_compute_seconds below the trace's compute times: the
// run scores nothing); 2 bad usage, bad --set, unreadable, invalid or too
// large input (out of memory included).
// No network, no sleeps, no threads: the same input gives the same output.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <new>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "replay.h"
#include "straggler/engine/policy.h"
#include "straggler/quality/criteria.h"
#include "straggler/quality/csv_trace.h"
#include "straggler/quality/reference_rules.h"
#include "straggler/quality/scenario.h"
#include "straggler/quality/scoring.h"

namespace {

using straggler::engine::PolicyConfig;
using straggler::engine::PolicyKind;
using straggler::engine::RecoveryMode;
using namespace straggler::quality;
using straggler::replay::PolicyRun;

constexpr int kExitOk = 0;
constexpr int kExitAllRejected = 1;
constexpr int kExitUsage = 2;
constexpr const char* kExitHelp =
    "Exit status: 0 done; 1 every report of the trace was rejected by the engine (e.g. --set "
    "max_compute_seconds below its compute times); 2 bad usage, bad --set, unreadable, invalid "
    "or too large input.";

// --set keys: PolicyConfig fields by their YAML names (engine::PolicyFields(),
// as in deploy/stragglerd.yaml) and the reference rules' options (kFields).
using Member = std::variant<uint32_t PolicyConfig::*, double PolicyConfig::*,
                            bool PolicyConfig::*, RecoveryMode PolicyConfig::*,
                            uint32_t NvrxOptions::*, double NvrxOptions::*,
                            uint32_t GreyhoundOptions::*, double GreyhoundOptions::*>;
struct Field {
  const char* name;
  Member member;
};
const Field kFields[] = {
    {"nvrx_window", &NvrxOptions::window},
    {"nvrx_threshold", &NvrxOptions::threshold},
    {"nvrx_min_samples", &NvrxOptions::min_samples},
    {"greyhound_window", &GreyhoundOptions::window},
    {"greyhound_ratio", &GreyhoundOptions::ratio},
    {"greyhound_persistence", &GreyhoundOptions::persistence},
    {"greyhound_min_samples", &GreyhoundOptions::min_samples},
};

struct Settings {
  PolicyConfig policy;
  NvrxOptions nvrx;
  GreyhoundOptions greyhound;
  bool static_threshold_set = false;
  std::set<std::string> given;  // keys --set gave (the others are defaults)
};

// "key=value", and " (the default)" when --set did not give it: a range error
// can involve a default (nvrx_min_samples against a smaller nvrx_window).
template <typename T>
std::string Named(const Settings& s, const std::string& key, T value) {
  std::string text = key + "=";
  if constexpr (std::is_floating_point_v<T>)
    text += absl::StrFormat("%g", value);
  else
    text += std::to_string(value);
  return s.given.count(key) ? text : text + " (the default)";
}

// Applies one KEY=VALUE; the error names the key or the value.
std::string ApplySet(const std::string& text, Settings& s) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    return "--set '" + text + "' is not KEY=VALUE";
  const std::string key = text.substr(0, eq), value = text.substr(eq + 1);
  if (key == "kind") return "--set kind: choose the policy with --policy";
  std::optional<Member> member;
  for (const auto& f : straggler::engine::PolicyFields())
    if (key == f.name)
      member = std::visit(
          [](auto m) -> std::optional<Member> {
            if constexpr (std::is_same_v<decltype(m), straggler::engine::PolicyKind PolicyConfig::*>)
              return std::nullopt;  // --policy chooses the kind
            else
              return Member{m};
          },
          f.member);
  for (const auto& f : kFields)
    if (key == f.name) member = f.member;
  if (!member) {
    std::string known;
    for (const auto& f : straggler::engine::PolicyFields())
      if (std::string_view(f.name) != "kind") known += std::string(known.empty() ? "" : ", ") + f.name;
    for (const auto& f : kFields) known += std::string(", ") + f.name;
    return "--set: unknown key '" + key + "' (known: " + known + ")";
  }
  if (key == "static_threshold_seconds") s.static_threshold_set = true;
  s.given.insert(key);
  const std::string bad = "--set " + key + "=" + value + ": ";
  return std::visit(
      [&](auto member) -> std::string {
        using M = decltype(member);
        auto target = [&]() -> auto& {
          if constexpr (std::is_same_v<M, uint32_t NvrxOptions::*> ||
                        std::is_same_v<M, double NvrxOptions::*>)
            return s.nvrx.*member;
          else if constexpr (std::is_same_v<M, uint32_t GreyhoundOptions::*> ||
                             std::is_same_v<M, double GreyhoundOptions::*>)
            return s.greyhound.*member;
          else
            return s.policy.*member;
        };
        auto& out = target();
        using T = std::remove_reference_t<decltype(out)>;
        if constexpr (std::is_same_v<T, uint32_t>) {
          uint32_t v = 0;
          if (!absl::SimpleAtoi(value, &v)) return bad + "not an unsigned 32-bit integer";
          out = v;
        } else if constexpr (std::is_same_v<T, double>) {
          double v = 0;
          if (!absl::SimpleAtod(value, &v) || !std::isfinite(v)) return bad + "not a number";
          out = v;
        } else if constexpr (std::is_same_v<T, bool>) {
          const std::string v = absl::AsciiStrToLower(value);
          if (v == "true" || v == "yes" || v == "on") out = true;
          else if (v == "false" || v == "no" || v == "off") out = false;
          else return bad + "not true or false";
        } else {
          auto v = straggler::engine::ParseRecoveryMode(value);
          if (!v.ok()) return bad + "not " + straggler::engine::RecoveryModeChoices();
          out = *v;
        }
        return "";
      },
      *member);
}

// Each error names the value it refuses, e.g. "--set nvrx_threshold=2 must be in (0, 1]".
std::string CheckRuleOptions(const Settings& s) {
  const NvrxOptions& n = s.nvrx;
  const GreyhoundOptions& g = s.greyhound;
  if (n.window < 1) return "--set " + Named(s, "nvrx_window", n.window) + " must be >= 1";
  if (!(n.threshold > 0 && n.threshold <= 1))
    return "--set " + Named(s, "nvrx_threshold", n.threshold) + " must be in (0, 1]";
  if (n.min_samples < 1 || n.min_samples > n.window)
    return "--set " + Named(s, "nvrx_min_samples", n.min_samples) + " must be in [1, " +
           Named(s, "nvrx_window", n.window) + "]";
  if (g.window < 1) return "--set " + Named(s, "greyhound_window", g.window) + " must be >= 1";
  if (!(g.ratio > 1)) return "--set " + Named(s, "greyhound_ratio", g.ratio) + " must be > 1";
  if (g.persistence < 1)
    return "--set " + Named(s, "greyhound_persistence", g.persistence) + " must be >= 1";
  if (g.min_samples < 1 || g.min_samples > g.window)
    return "--set " + Named(s, "greyhound_min_samples", g.min_samples) + " must be in [1, " +
           Named(s, "greyhound_window", g.window) + "]";
  return "";
}

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

struct Result {
  PolicyRun run;
  std::optional<Score> score;
  std::optional<Criteria> criteria;  // issue 17's criteria (criteria.h), with truth
  nlohmann::json settings;           // engine policies: every PolicyConfig field it ran with
};

// {field: value} by the YAML names of deploy/stragglerd.yaml's `policy:`.
nlohmann::json SettingsJson(const PolicyConfig& p) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& f : straggler::engine::PolicyFields())
    std::visit(
        [&](auto m) {
          using T = std::remove_cvref_t<decltype(p.*m)>;
          if constexpr (std::is_same_v<T, PolicyKind>)
            out[f.name] = std::string(straggler::engine::PolicyKindName(p.*m));
          else if constexpr (std::is_same_v<T, RecoveryMode>)
            out[f.name] = std::string(straggler::engine::RecoveryModeName(p.*m));
          else
            out[f.name] = p.*m;
        },
        f.member);
  return out;
}

nlohmann::json CriteriaJson(const Criteria& c) {
  return {{"pass", c.pass()},         {"summary", c.Summary()},
          {"episodes", c.episodes},   {"in_time", c.in_time},
          {"late", c.late},           {"missed", c.missed},
          {"false_alarms", c.false_alarms}, {"flaps", c.flaps},
          {"stuck", c.stuck},         {"failures", c.failures}};
}

// The engine policies `--policy all` runs: every kind this engine knows, the
// daemon's default (PolicyConfig{}, = deploy/stragglerd.yaml) first.
std::vector<std::string> EnginePolicies() {
  std::vector<std::string> out = {std::string(PolicyKindName(PolicyConfig{}.kind))};
  for (PolicyKind kind : straggler::engine::kPolicyKinds)
    if (out[0] != PolicyKindName(kind)) out.push_back(std::string(PolicyKindName(kind)));
  return out;
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
  return out;
}

int Run(int argc, char** argv) {
  // No --policy: exactly the daemon's default settings, PolicyConfig{} (the
  // one table of defaults deploy/stragglerd.yaml shows; tested to agree).
  std::string input, policy_name, report_path, format = "table";
  std::vector<std::string> sets;
  CLI::App app{
      "straggler-replay: run a scenario (YAML) or a recorded trace (CSV) through the detection "
      "engine and reference rules, offline, and score the result"};
  app.add_option("input", input,
                 "scenario .yaml or trace .csv "
                 "(iteration,rank,compute_seconds[,epoch][,peer_group][,replica][,gpu_model])")
      ->required();
  app.add_option("--policy", policy_name,
                 absl::StrJoin(EnginePolicies(), "|") +
                     "|nvrx|greyhound|all (default: the daemon's default policy, " +
                     std::string(straggler::engine::PolicyKindName(PolicyConfig{}.kind)) +
                     ", with the daemon's default settings)");
  app.add_option("--set", sets,
                 "KEY=VALUE: a PolicyConfig field by its YAML name (limit, threshold_factor, "
                 "ewma_ratio, ...) or nvrx_*/greyhound_* rule options; repeatable");
  app.add_option("--report", report_path, "write the per-rank JSON report to this file");
  app.add_option("--format", format, "table|json|markdown")->capture_default_str();
  app.footer(kExitHelp);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  auto fail = [](const std::string& msg) {
    std::cerr << "straggler-replay: " << msg << '\n';
    return kExitUsage;
  };
  if (format != "table" && format != "json" && format != "markdown")
    return fail("--format " + format + " is not table, json or markdown");
  std::vector<std::string> policies;
  const std::vector<std::string> engine_policies = EnginePolicies();
  std::string known;
  for (const auto& p : engine_policies) known += p + ", ";
  if (policy_name.empty()) policy_name = engine_policies[0];
  if (policy_name == "all") {
    policies = engine_policies;
    policies.insert(policies.end(), {"nvrx", "greyhound"});
  } else if (std::count(engine_policies.begin(), engine_policies.end(), policy_name) ||
             policy_name == "nvrx" || policy_name == "greyhound") {
    policies = {policy_name};
  } else {
    return fail("--policy " + policy_name + " is not " + known + "nvrx, greyhound or all");
  }

  Settings settings;
  for (const auto& s : sets)
    if (std::string err = ApplySet(s, settings); !err.empty()) return fail(err);
  if (std::string err = CheckRuleOptions(settings); !err.empty()) return fail(err);

  // Input.
  Trace trace;
  std::optional<Scenario> scenario;
  const std::string lower = absl::AsciiStrToLower(input);
  if (absl::EndsWith(lower, ".csv")) {
    auto t = LoadCsvTrace(input);
    if (!t.ok()) return fail(std::string(t.status().message()));
    trace = std::move(*t);
  } else if (absl::EndsWith(lower, ".yaml") || absl::EndsWith(lower, ".yml")) {
    auto s = LoadScenario(input);
    if (!s.ok()) return fail(std::string(s.status().message()));
    scenario = *s;
    trace = Generate(*s);
  } else {
    return fail(input + ": not a .yaml scenario or a .csv trace");
  }


  const RankMatrix scored = trace.ReportedMatrix();
  int rc = kExitOk;
  std::vector<Result> results;
  for (const auto& name : policies) {
    Result res;
    if (name == "nvrx") {
      res.run = straggler::replay::FromFlags(trace, RunNvrx(trace, settings.nvrx), name);
    } else if (name == "greyhound") {
      res.run = straggler::replay::FromFlags(trace, RunGreyhound(trace, settings.greyhound), name);
    } else {
      PolicyConfig p = settings.policy;
      p.kind = *straggler::engine::ParsePolicyKind(name);
      // static needs a threshold: unless --set, threshold_factor x base_seconds
      // (for a CSV trace: x the median compute time). The other kinds run
      // with exactly the settings given (the daemon's defaults without --set).
      if (p.kind == PolicyKind::kStatic && !settings.static_threshold_set)
        p.static_threshold_seconds = p.threshold_factor * trace.base_seconds;
      res.settings = SettingsJson(p);
      if (auto st = p.Validate(); !st.ok())
        return fail("policy " + name + ": " + std::string(st.message()));
      res.run = straggler::replay::ReplayEngine(trace, p, name);
      if (res.run.rejected > 0 && res.run.rejected == res.run.reports) {
        // Nothing reached the detector: the output is empty, not a result.
        std::cerr << "straggler-replay: " << name << ": every one of the trace's "
                  << res.run.reports << " reports was rejected by the engine (max_compute_seconds="
                  << absl::StrFormat("%g", p.max_compute_seconds)
                  << "), first: " << res.run.first_rejection << '\n';
        rc = kExitAllRejected;
      } else if (res.run.rejected > 0) {
        std::cerr << "straggler-replay: " << name << ": " << res.run.rejected << " of "
                  << res.run.reports << " reports rejected by the engine, first: "
                  << res.run.first_rejection << '\n';
      }
    }
    if (trace.has_truth) {
      res.score = ScoreFlags(trace.truth, res.run.flagged, scored);
      // Onsets count from the end of the job's first profile (the engine's
      // profile_iterations, peer's peer_profile_iterations; profile_iterations
      // for the reference rules).
      const uint32_t first_profile = name == "peer" ? settings.policy.peer_profile_iterations
                                                    : settings.policy.profile_iterations;
      res.criteria = CheckCriteria(trace, res.run.flagged, first_profile);
    }
    results.push_back(std::move(res));
  }

  // JSON document: the report file and --format json.
  nlohmann::json truth = nlohmann::json::array();
  uint64_t truth_cells = 0;
  if (trace.has_truth) {
    for (const auto& iv : Intervals(trace.truth)) {
      truth.push_back({{"rank", iv.rank},
                       {"from", trace.Iteration(iv.from)},
                       {"to", trace.Iteration(iv.to)}});
      truth_cells += iv.to - iv.from;
    }
  }
  nlohmann::json policies_json = nlohmann::json::array();
  for (const auto& res : results) {
    nlohmann::json ranks = nlohmann::json::array();
    for (uint32_t r = 0; r < trace.ranks; ++r) {
      ranks.push_back({{"rank", r},
                       {"detected_at", res.run.detected_at[r]},
                       {"recovered_at", res.run.recovered_at[r]},
                       {"unresponsive_at", res.run.unresponsive_at[r]}});
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
  if (!report_path.empty()) {
    std::ofstream out(report_path);
    out << doc.dump(2) << '\n';
    if (!out) return fail("cannot write --report " + report_path);
  }

  if (format == "json") {
    std::cout << doc.dump(2) << '\n';
    return rc;
  }
  if (format == "markdown" && !trace.has_truth) {
    std::cout << "| trace | policy | detections (rank@iteration) | recoveries (rank@iteration) |\n"
              << "|---|---|---|---|\n";
    for (const auto& res : results)
      std::cout << "| " << trace.name << " | " << res.run.policy << " | "
                << RankAtList(res.run.detected_at) << " | " << RankAtList(res.run.recovered_at)
                << " |\n";
    return rc;
  }
  if (format == "markdown") {
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
    return rc;
  }

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
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  // A trace's matrices are ranks x iterations: one too large for memory
  // throws here rather than aborting the process with no word of why.
  try {
    return Run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::cerr << "straggler-replay: out of memory (std::bad_alloc): the input's ranks x "
                 "iterations matrices do not fit; replay fewer ranks or iterations\n";
  } catch (const std::exception& e) {
    std::cerr << "straggler-replay: " << e.what() << '\n';
  }
  return kExitUsage;
}
