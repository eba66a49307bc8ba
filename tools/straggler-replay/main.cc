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
#include "report.h"
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
using straggler::replay::Result;

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


// The engine policies `--policy all` runs: every kind this engine knows, the
// daemon's default (PolicyConfig{}, = deploy/stragglerd.yaml) first.
std::vector<std::string> EnginePolicies() {
  std::vector<std::string> out = {std::string(PolicyKindName(PolicyConfig{}.kind))};
  for (PolicyKind kind : straggler::engine::kPolicyKinds)
    if (out[0] != PolicyKindName(kind)) out.push_back(std::string(PolicyKindName(kind)));
  return out;
}


// The policies --policy NAME runs (all: every engine policy, the daemon's
// default first, then the reference rules); "" or the error naming NAME.
std::string ChoosePolicies(std::string policy_name, std::vector<std::string>* out) {
  std::vector<std::string>& policies = *out;
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
    return "--policy " + policy_name + " is not " + known + "nvrx, greyhound or all";
  }
  return "";
}

// The trace of `input`: a scenario (.yaml, generated) or a recorded trace
// (.csv); "" or the error naming the file.
std::string LoadInput(const std::string& input, Trace* trace, std::optional<Scenario>* scenario) {
  const std::string lower = absl::AsciiStrToLower(input);
  if (absl::EndsWith(lower, ".csv")) {
    auto t = LoadCsvTrace(input);
    if (!t.ok()) return std::string(t.status().message());
    *trace = std::move(*t);
  } else if (absl::EndsWith(lower, ".yaml") || absl::EndsWith(lower, ".yml")) {
    auto s = LoadScenario(input);
    if (!s.ok()) return std::string(s.status().message());
    *scenario = *s;
    *trace = Generate(*s);
  } else {
    return input + ": not a .yaml scenario or a .csv trace";
  }
  return "";
}

// One policy (an engine kind or a reference rule) over the trace, scored
// against its truth when it has one. Rejected reports are reported on
// stderr; all of them rejected sets *rc to kExitAllRejected. "" or the
// error naming the policy's bad setting.
std::string RunPolicy(const std::string& name, const Trace& trace, const Settings& settings,
                      const RankMatrix& scored, Result* res, int* rc) {
  if (name == "nvrx") {
    res->run = straggler::replay::FromFlags(trace, RunNvrx(trace, settings.nvrx), name);
  } else if (name == "greyhound") {
    res->run = straggler::replay::FromFlags(trace, RunGreyhound(trace, settings.greyhound), name);
  } else {
    PolicyConfig p = settings.policy;
    p.kind = *straggler::engine::ParsePolicyKind(name);
    // static needs a threshold: unless --set, threshold_factor x base_seconds
    // (for a CSV trace: x the median compute time). The other kinds run
    // with exactly the settings given (the daemon's defaults without --set).
    if (p.kind == PolicyKind::kStatic && !settings.static_threshold_set)
      p.static_threshold_seconds = p.threshold_factor * trace.base_seconds;
    res->settings = SettingsJson(p);
    if (auto st = p.Validate(); !st.ok())
      return "policy " + name + ": " + std::string(st.message());
    res->run = straggler::replay::ReplayEngine(trace, p, name);
    if (res->run.rejected > 0 && res->run.rejected == res->run.reports) {
      // Nothing reached the detector: the output is empty, not a result.
      std::cerr << "straggler-replay: " << name << ": every one of the trace's "
                << res->run.reports << " reports was rejected by the engine (max_compute_seconds="
                << absl::StrFormat("%g", p.max_compute_seconds)
                << "), first: " << res->run.first_rejection << '\n';
      *rc = kExitAllRejected;
    } else if (res->run.rejected > 0) {
      std::cerr << "straggler-replay: " << name << ": " << res->run.rejected << " of "
                << res->run.reports << " reports rejected by the engine, first: "
                << res->run.first_rejection << '\n';
    }
  }
  if (trace.has_truth) {
    res->score = ScoreFlags(trace.truth, res->run.flagged, scored);
    // Onsets count from the end of the job's first profile (the engine's
    // profile_iterations, peer's peer_profile_iterations; profile_iterations
    // for the reference rules).
    const uint32_t first_profile = name == "peer" ? settings.policy.peer_profile_iterations
                                                  : settings.policy.profile_iterations;
    res->criteria = CheckCriteria(trace, res->run.flagged, first_profile);
    CheckCauses(trace, res->run.detected_at, res->run.detected_cause, *res->criteria);
  }
  return "";
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
  if (std::string err = ChoosePolicies(policy_name, &policies); !err.empty()) return fail(err);
  Settings settings;
  for (const auto& s : sets)
    if (std::string err = ApplySet(s, settings); !err.empty()) return fail(err);
  if (std::string err = CheckRuleOptions(settings); !err.empty()) return fail(err);

  Trace trace;
  std::optional<Scenario> scenario;
  if (std::string err = LoadInput(input, &trace, &scenario); !err.empty()) return fail(err);

  const RankMatrix scored = trace.ReportedMatrix();
  int rc = kExitOk;
  std::vector<Result> results;
  for (const auto& name : policies) {
    Result res;
    if (std::string err = RunPolicy(name, trace, settings, scored, &res, &rc); !err.empty())
      return fail(err);
    results.push_back(std::move(res));
  }

  const nlohmann::json doc = ReportJson(input, trace, scenario, results);
  if (!report_path.empty()) {
    std::ofstream out(report_path);
    out << doc.dump(2) << '\n';
    if (!out) return fail("cannot write --report " + report_path);
  }
  if (format == "json") std::cout << doc.dump(2) << '\n';
  else if (format == "markdown") PrintMarkdown(trace, results);
  else PrintTable(trace, scenario, results);
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
