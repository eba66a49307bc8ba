// Scenario YAML -> Scenario (scenario.h): the parser, whose errors name the
// file, line and key or value. Generation and ground truth: scenario.cc.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "scenario_yaml.h"
#include "straggler/quality/scenario.h"
#include "straggler/topology.h"
#include "straggler/v1/wire_rules.h"
#include "yaml-cpp/yaml.h"

namespace straggler::quality {
namespace {

class Parser : public internal::YamlReader {
 public:
  using YamlReader::YamlReader;

  // `ranks: all`, `ranks: [1, 3, "8-15"]`, or `rank: 3`.
  absl::StatusOr<std::vector<uint32_t>> Ranks(const YAML::Node& n, absl::string_view key,
                                              uint32_t world) const {
    std::vector<uint32_t> out;
    auto add_text = [&](const YAML::Node& item) -> absl::Status {
      auto s = Scalar(item, key);
      if (!s.ok()) return s.status();
      if (*s == "all") {
        for (uint32_t r = 0; r < world; ++r) out.push_back(r);
        return absl::OkStatus();
      }
      std::vector<std::string> parts = absl::StrSplit(*s, '-');
      uint64_t a = 0, b = 0;
      if (parts.size() == 1 && absl::SimpleAtoi(parts[0], &a)) {
        b = a;
      } else if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &a) ||
                 !absl::SimpleAtoi(parts[1], &b) || b < a) {
        return Error(item, absl::StrCat(key, " entry '", *s, "' is not a rank, A-B or all"));
      }
      if (b >= world)
        return Error(item, absl::StrCat(key, " entry '", *s, "' is out of range for ", world,
                                        " ranks"));
      for (uint64_t r = a; r <= b; ++r) out.push_back(static_cast<uint32_t>(r));
      return absl::OkStatus();
    };
    if (n.IsSequence()) {
      for (const auto& item : n)
        if (auto st = add_text(item); !st.ok()) return st;
    } else if (auto st = add_text(n); !st.ok()) {
      return st;
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    if (out.empty()) return Error(n, absl::StrCat(key, " names no rank"));
    return out;
  }

  // The effect's kind from its `type`, and the keys that kind allows and requires.
  absl::Status EffectKind(const YAML::Node& n, const std::string& ctx, const std::string& t,
                          Effect* e, std::set<std::string>* allowed_keys,
                          std::set<std::string>* required_keys) const {
    std::set<std::string>& allowed = *allowed_keys;
    std::set<std::string>& required = *required_keys;
    if (t == "slow") {
      e->type = EffectType::kSlow;
      allowed = {"ranks", "rank", "factor", "from", "to", "pattern", "truth", "phase"};
      required = {"factor"};
    } else if (t == "spike") {
      e->type = EffectType::kSpike;
      allowed = {"ranks", "rank", "factor", "max_factor", "probability", "every", "offset",
                 "phase"};
      required = {"factor"};
    } else if (t == "ramp") {
      e->type = EffectType::kRamp;
      allowed = {"ranks", "rank", "from", "to", "start_factor", "end_factor", "hold_until",
                 "phase"};
      required = {"from", "to", "end_factor"};
    } else if (t == "global") {
      e->type = EffectType::kGlobal;
      allowed = {"factor", "from", "to", "pattern"};
      required = {"factor"};
    } else if (t == "generation") {
      e->type = EffectType::kGeneration;
      allowed = {"ranks", "rank", "factor"};
      required = {"factor"};
    } else if (t == "silent") {
      e->type = EffectType::kSilent;
      allowed = {"ranks", "rank", "from"};
      required = {"from"};
    } else if (t == "join") {
      e->type = EffectType::kJoin;
      allowed = {"ranks", "rank", "at"};
      required = {"at"};
    } else if (t == "warmup") {
      e->type = EffectType::kWarmup;
      allowed = {"iterations", "factor", "shape"};
      required = {"iterations", "factor"};
    } else {
      return Error(n["type"], absl::StrCat(ctx, ".type=", t,
                                           " is not slow, spike, ramp, global, generation, "
                                           "silent, join or warmup"));
    }
    return absl::OkStatus();
  }

  // Each kind's own rules, then the ranges every effect shares; the error
  // names the key and the value.
  absl::Status CheckEffect(const YAML::Node& n, const Scenario& s, const std::string& ctx,
                           Effect& e) const {
    if (e.type == EffectType::kSpike) {
      if (!n["probability"] == !n["every"])
        return Error(n, absl::StrCat(ctx, " (spike) needs exactly one of `probability` "
                                          "(random) and `every` (periodic)"));
      if (n["every"] && e.every == 0)
        return Error(n["every"], absl::StrCat(ctx, ".every=0 must be >= 1"));
      if (n["offset"] && !n["every"])
        return Error(n["offset"], absl::StrCat(ctx, ".offset needs `every`"));
      if (n["max_factor"] && e.max_factor < e.factor)
        return Error(n["max_factor"], absl::StrCat(ctx, ".max_factor=", e.max_factor,
                                                   " must be >= factor=", e.factor));
    }
    if (e.type == EffectType::kJoin && e.from >= s.iterations)
      return Error(n["at"], absl::StrCat(ctx, ".at=", e.from, " must be below iterations=",
                                         s.iterations));
    if (e.type == EffectType::kWarmup) {
      if (e.to == 0)
        return Error(n["iterations"], absl::StrCat(ctx, ".iterations=0 must be >= 1"));
      e.from = 0;
      if (n["shape"]) {
        auto shape = Scalar(n["shape"], ctx + ".shape");
        if (!shape.ok()) return shape.status();
        if (*shape != "constant" && *shape != "linear")
          return Error(n["shape"], absl::StrCat(ctx, ".shape=", *shape,
                                                " is not constant or linear"));
        e.linear = *shape == "linear";
      }
    }
    if (e.type == EffectType::kRamp && !n["hold_until"]) e.hold_until = e.to;
    if (n["phase"]) {  // compute (the default) or input (the input model's wait)
      auto phase = Scalar(n["phase"], ctx + ".phase");
      if (!phase.ok()) return phase.status();
      if (*phase != "compute" && *phase != "input" && *phase != "host")
        return Error(n["phase"],
                     absl::StrCat(ctx, ".phase=", *phase, " is not compute, input or host"));
      e.input = *phase == "input";
      e.host = *phase == "host";
      if (e.input && !s.input.enabled)
        return Error(n["phase"], absl::StrCat(ctx, ".phase=input needs the scenario's `input:`"));
      if (e.host && !s.host.enabled)
        return Error(n["phase"], absl::StrCat(ctx, ".phase=host needs the scenario's `host:`"));
    }
    if (e.factor <= 0)
      return Error(n["factor"], absl::StrCat(ctx, ".factor=", e.factor, " must be > 0"));
    if (e.start_factor <= 0)
      return Error(n["start_factor"], absl::StrCat(ctx, ".start_factor=", e.start_factor, " must be > 0"));
    if (e.end_factor <= 0)
      return Error(n["end_factor"], absl::StrCat(ctx, ".end_factor=", e.end_factor, " must be > 0"));
    if (e.probability < 0 || e.probability > 1)
      return Error(n["probability"],
                   absl::StrCat(ctx, ".probability=", e.probability, " must be in [0, 1]"));
    if ((e.type == EffectType::kSlow || e.type == EffectType::kGlobal ||
         e.type == EffectType::kRamp) &&
        e.from >= e.to)
      return Error(n, absl::StrCat(ctx, ": from=", e.from, " must be below to=", e.to));
    if (e.type == EffectType::kRamp && e.hold_until < e.to)
      return Error(n, absl::StrCat(ctx, ": hold_until=", e.hold_until, " must be >= to=", e.to));
    return absl::OkStatus();
  }

  // `pattern` ("every" or K/N: slow on K of every N steps) and `truth`
  // (average or steps; by default average for short periods).
  absl::Status ParsePattern(const YAML::Node& n, const std::string& ctx, Effect& e) const {
    if (n["pattern"]) {
      // "every" or "K/N": slow on K of every N steps, counted from `from`.
      auto p = Scalar(n["pattern"], ctx + ".pattern");
      if (!p.ok()) return p.status();
      if (*p != "every") {
        std::vector<std::string> parts = absl::StrSplit(*p, '/');
        uint32_t k = 0, every = 0;
        if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &k) ||
            !absl::SimpleAtoi(parts[1], &every) || k == 0 || every == 0 || k > every)
          return Error(n["pattern"], absl::StrCat(ctx, ".pattern='", *p,
                                                  "' is not `every` or K/N with 0 < K <= N"));
        e.pattern_slow = k;
        e.pattern_every = every;
      }
    }
    e.truth_average = e.pattern_every <= kAveragePatternMaxPeriod;
    if (n["truth"]) {
      auto tv = Scalar(n["truth"], ctx + ".truth");
      if (!tv.ok()) return tv.status();
      if (*tv == "average") {
        e.truth_average = true;
      } else if (*tv == "steps") {
        e.truth_average = false;
      } else {
        return Error(n["truth"], absl::StrCat(ctx, ".truth=", *tv, " is not average or steps"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Effect> ParseEffect(const YAML::Node& n, const Scenario& s, size_t index) const {
    const std::string ctx = absl::StrCat("effects[", index, "]");
    if (!n.IsMap()) return Error(n, absl::StrCat(ctx, " must be a map with a `type`"));
    if (!n["type"]) return Error(n, absl::StrCat(ctx, " has no `type`"));
    auto type_text = Scalar(n["type"], ctx + ".type");
    if (!type_text.ok()) return type_text.status();
    Effect e;
    std::set<std::string> allowed;
    std::set<std::string> required;
    const std::string& t = *type_text;
    if (absl::Status st = EffectKind(n, ctx, t, &e, &allowed, &required); !st.ok()) return st;
    for (const auto& kv : n) {
      const std::string key = kv.first.Scalar();
      if (key == "type") continue;
      if (!allowed.count(key))
        return Error(kv.first, absl::StrCat("unknown key '", key, "' in ", ctx, " (", t, ")"));
    }
    for (const auto& key : required)
      if (!n[key]) return Error(n, absl::StrCat(ctx, " (", t, ") needs `", key, "`"));
    const bool needs_ranks = e.type != EffectType::kGlobal && e.type != EffectType::kWarmup;
    if (needs_ranks) {
      if (n["rank"] && n["ranks"])
        return Error(n, absl::StrCat(ctx, " has both `rank` and `ranks`"));
      if (!n["rank"] && !n["ranks"]) return Error(n, absl::StrCat(ctx, " needs `rank` or `ranks`"));
      const YAML::Node rn = n["rank"] ? n["rank"] : n["ranks"];
      auto ranks = Ranks(rn, ctx + (n["rank"] ? ".rank" : ".ranks"), s.ranks);
      if (!ranks.ok()) return ranks.status();
      e.ranks = *ranks;
    }
    auto get_double = [&](const char* key, double& out) -> absl::Status {
      if (!n[key]) return absl::OkStatus();
      auto v = Double(n[key], absl::StrCat(ctx, ".", key));
      if (!v.ok()) return v.status();
      out = *v;
      return absl::OkStatus();
    };
    auto get_uint = [&](const char* key, uint64_t& out) -> absl::Status {
      if (!n[key]) return absl::OkStatus();
      auto v = Uint(n[key], absl::StrCat(ctx, ".", key));
      if (!v.ok()) return v.status();
      out = *v;
      return absl::OkStatus();
    };
    e.to = s.iterations;
    e.hold_until = 0;
    for (auto st : {get_double("factor", e.factor), get_double("probability", e.probability),
                    get_double("start_factor", e.start_factor),
                    get_double("end_factor", e.end_factor), get_uint("from", e.from),
                    get_uint("to", e.to), get_uint("hold_until", e.hold_until),
                    get_double("max_factor", e.max_factor), get_uint("every", e.every),
                    get_uint("offset", e.offset), get_uint("at", e.from),
                    get_uint("iterations", e.to)})
      if (!st.ok()) return st;
    if (absl::Status st = CheckEffect(n, s, ctx, e); !st.ok()) return st;
    if (absl::Status st = ParsePattern(n, ctx, e); !st.ok()) return st;
    return e;
  }

  // `topology: {replicas: R, stages: S, tensor: T[, context: C][, order: O]
  // [, stage_cost: [c0, ...]][, gpu_model: M]}` (a Megatron-style layout,
  // straggler::TopologyFromLayout) or a list of `{ranks, peer_group, replica,
  // gpu_model, cost}` entries (ranks not listed keep the defaults).
  absl::Status ParseTopology(const YAML::Node& n, Scenario& s) const {
    s.topology.assign(s.ranks, RankPlace{});
    if (n.IsSequence()) return ParseTopologyEntries(n, s);
    if (!n.IsMap()) return Error(n, "topology must be a map (a layout) or a list of entries");
    const std::set<std::string> allowed = {"replicas", "stages", "tensor", "context",
                                           "order", "stage_cost", "gpu_model"};
    for (const auto& kv : n)
      if (!allowed.count(kv.first.Scalar()))
        return Error(kv.first, absl::StrCat("unknown key '", kv.first.Scalar(),
                                            "' in topology (a layout: replicas, stages, tensor, "
                                            "context, order, stage_cost, gpu_model)"));
    ParallelLayout layout;
    auto size = [&](const char* key, uint32_t& out) -> absl::Status {
      if (!n[key]) return absl::OkStatus();
      auto v = Uint(n[key], absl::StrCat("topology.", key));
      if (!v.ok()) return v.status();
      if (*v < 1 || *v > s.ranks)
        return Error(n[key], absl::StrCat("topology.", key, "=", *v, " must be in [1, ", s.ranks,
                                          "]"));
      out = static_cast<uint32_t>(*v);
      return absl::OkStatus();
    };
    for (auto st : {size("replicas", layout.data), size("stages", layout.pipeline),
                    size("tensor", layout.tensor), size("context", layout.context)})
      if (!st.ok()) return st;
    if (n["order"]) {
      auto o = Scalar(n["order"], "topology.order");
      if (!o.ok()) return o.status();
      layout.order = *o;
    }
    const uint64_t world = uint64_t{layout.data} * layout.pipeline * layout.tensor * layout.context;
    s.topology_text = absl::StrCat(layout.data, " replicas x ", layout.pipeline, " stages x ",
                                   layout.tensor, " tensor");
    if (layout.context > 1) absl::StrAppend(&s.topology_text, " x ", layout.context, " context");
    if (world != s.ranks)
      return Error(n, absl::StrCat("topology ", s.topology_text, " is ", world,
                                   " ranks, but ranks=", s.ranks));
    std::vector<double> cost(layout.pipeline, 1.0);
    if (n["stage_cost"]) {
      const YAML::Node c = n["stage_cost"];
      if (!c.IsSequence() || c.size() != layout.pipeline)
        return Error(c, absl::StrCat("topology.stage_cost must list one factor per stage (",
                                     layout.pipeline, ")"));
      for (size_t i = 0; i < c.size(); ++i) {
        auto v = Double(c[i], absl::StrCat("topology.stage_cost[", i, "]"));
        if (!v.ok()) return v.status();
        if (*v <= 0)
          return Error(c[i], absl::StrCat("topology.stage_cost[", i, "]=", *v, " must be > 0"));
        cost[i] = *v;
      }
    }
    std::string gpu;
    if (n["gpu_model"]) {
      auto g = Scalar(n["gpu_model"], "topology.gpu_model");
      if (!g.ok()) return g.status();
      gpu = *g;
    }
    for (uint32_t r = 0; r < s.ranks; ++r) {
      std::string error;
      const auto t = TopologyFromLayout(layout, r, &error);
      if (!t) return Error(n, absl::StrCat("topology: ", error));
      s.topology[r] = {t->peer_group, t->replica, gpu, cost[t->stage]};
    }
    return absl::OkStatus();
  }

  absl::Status ParseTopologyEntries(const YAML::Node& list, Scenario& s) const {
    s.topology_text = "per-rank entries";
    const std::set<std::string> allowed = {"ranks", "rank", "peer_group", "replica",
                                           "gpu_model", "cost"};
    size_t index = 0;
    for (const auto& n : list) {
      const std::string ctx = absl::StrCat("topology[", index++, "]");
      if (!n.IsMap()) return Error(n, absl::StrCat(ctx, " must be a map"));
      for (const auto& kv : n)
        if (!allowed.count(kv.first.Scalar()))
          return Error(kv.first, absl::StrCat("unknown key '", kv.first.Scalar(), "' in ", ctx));
      if (!n["rank"] == !n["ranks"])
        return Error(n, absl::StrCat(ctx, " needs one of `rank` and `ranks`"));
      auto ranks = Ranks(n["rank"] ? n["rank"] : n["ranks"], ctx + ".ranks", s.ranks);
      if (!ranks.ok()) return ranks.status();
      RankPlace place;
      if (n["peer_group"]) {
        auto g = Scalar(n["peer_group"], ctx + ".peer_group");
        if (!g.ok()) return g.status();
        // The daemon's rule (straggler/v1/wire_rules.h), length first as it checks.
        const auto fault = v1::rules::FindTextFault(*g, v1::rules::kMaxPeerGroupBytes,
                                                    v1::rules::IsJobIdChar);
        if (fault.too_long)
          return Error(n["peer_group"],
                       absl::StrCat(ctx, ".peer_group '", *g, "' is longer than ",
                                    v1::rules::kMaxPeerGroupBytes, " bytes"));
        if (fault.bad_byte != std::string_view::npos)
          return Error(n["peer_group"],
                       absl::StrCat(ctx, ".peer_group '", *g, "' has '",
                                    g->substr(fault.bad_byte, 1), "' at byte ", fault.bad_byte,
                                    "; allowed: ", std::string(v1::rules::kJobIdAllowed)));
        place.peer_group = *g;
      }
      if (n["replica"]) {
        auto v = Uint(n["replica"], ctx + ".replica");
        if (!v.ok()) return v.status();
        if (*v >= s.ranks)
          return Error(n["replica"], absl::StrCat(ctx, ".replica=", *v, " must be below ranks=",
                                                  s.ranks));
        place.replica = static_cast<uint32_t>(*v);
      }
      if (n["gpu_model"]) {
        auto g = Scalar(n["gpu_model"], ctx + ".gpu_model");
        if (!g.ok()) return g.status();
        place.gpu_model = *g;
      }
      if (n["cost"]) {
        auto v = Double(n["cost"], ctx + ".cost");
        if (!v.ok()) return v.status();
        if (*v <= 0) return Error(n["cost"], absl::StrCat(ctx, ".cost=", *v, " must be > 0"));
        place.cost = *v;
      }
      for (uint32_t r : *ranks) s.topology[r] = place;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Scenario> Parse(const YAML::Node& root) const {
    if (!root.IsMap()) return Error(root, "a scenario must be a map");
    Scenario s;
    s.source = source();
    const std::set<std::string> known = {"name",   "description", "ranks", "iterations",
                                         "iterations_per_epoch", "base_seconds", "noise",
                                         "variation", "seed", "truth_min_factor", "topology",
                                         "effects", "work", "input", "host", "cause"};
    for (const auto& kv : root) {
      const std::string key = kv.first.Scalar();
      if (!known.count(key)) return Error(kv.first, absl::StrCat("unknown key '", key, "'"));
    }
    for (const char* key : {"name", "ranks", "iterations", "base_seconds", "noise", "seed"})
      if (!root[key]) return Error(root, absl::StrCat("missing `", key, "`"));
    auto name = Scalar(root["name"], "name");
    if (!name.ok()) return name.status();
    s.name = *name;
    if (root["description"]) {
      auto d = Scalar(root["description"], "description");
      if (!d.ok()) return d.status();
      s.description = *d;
    }
    auto ranks = Uint(root["ranks"], "ranks");
    if (!ranks.ok()) return ranks.status();
    if (*ranks < 2 || *ranks > 100000)
      return Error(root["ranks"], absl::StrCat("ranks=", *ranks, " must be in [2, 100000]"));
    s.ranks = static_cast<uint32_t>(*ranks);
    auto its = Uint(root["iterations"], "iterations");
    if (!its.ok()) return its.status();
    if (*its < 1 || *its > 10'000'000)
      return Error(root["iterations"], absl::StrCat("iterations=", *its, " must be in [1, 1e7]"));
    s.iterations = *its;
    if (root["iterations_per_epoch"]) {
      auto v = Uint(root["iterations_per_epoch"], "iterations_per_epoch");
      if (!v.ok()) return v.status();
      s.iterations_per_epoch = *v;
    }
    auto base = Double(root["base_seconds"], "base_seconds");
    if (!base.ok()) return base.status();
    if (*base <= 0)
      return Error(root["base_seconds"], absl::StrCat("base_seconds=", *base, " must be > 0"));
    s.base_seconds = *base;
    auto noise = Double(root["noise"], "noise");
    if (!noise.ok()) return noise.status();
    if (*noise < 0 || *noise > 1)
      return Error(root["noise"], absl::StrCat("noise=", *noise, " must be in [0, 1]"));
    s.noise = *noise;
    if (root["variation"]) {
      auto v = Double(root["variation"], "variation");
      if (!v.ok()) return v.status();
      if (*v < 0 || *v >= 1)
        return Error(root["variation"], absl::StrCat("variation=", *v, " must be in [0, 1)"));
      s.variation = *v;
    }
    auto seed = Uint(root["seed"], "seed");
    if (!seed.ok()) return seed.status();
    s.seed = *seed;
    if (root["truth_min_factor"]) {
      auto v = Double(root["truth_min_factor"], "truth_min_factor");
      if (!v.ok()) return v.status();
      if (*v <= 1)
        return Error(root["truth_min_factor"],
                     absl::StrCat("truth_min_factor=", *v, " must be > 1"));
      s.truth_min_factor = *v;
    }
    if (root["topology"])
      if (auto st = ParseTopology(root["topology"], s); !st.ok()) return st;
    if (root["work"])
      if (auto st = internal::ParseWork(*this, root["work"], s.work); !st.ok()) return st;
    if (root["input"])
      if (auto st = internal::ParseInput(*this, root["input"], s.input); !st.ok()) return st;
    if (root["host"])
      if (auto st = internal::ParseHost(*this, root["host"], s.host); !st.ok()) return st;
    if (root["cause"]) {  // what a trace's phases and run delays can show (no GPU telemetry)
      auto c = Scalar(root["cause"], "cause");
      if (!c.ok()) return c.status();
      if (*c != "input_pipeline" && *c != "compute" && *c != "host" && *c != "none_visible")
        return Error(root["cause"],
                     absl::StrCat("cause=", *c, " is not input_pipeline, compute, host or none_visible"));
      s.cause = *c;
    }
    if (root["effects"]) {
      const YAML::Node effects = root["effects"];
      if (!effects.IsSequence() && !effects.IsNull())
        return Error(effects, "effects must be a list");
      size_t i = 0;
      for (const auto& n : effects) {
        auto e = ParseEffect(n, s, i++);
        if (!e.ok()) return e.status();
        s.effects.push_back(*e);
      }
    }
    return s;
  }
};

}  // namespace

absl::StatusOr<Scenario> ParseScenario(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ": ", e.msg));
  }
  return Parser(source).Parse(root);
}

absl::StatusOr<Scenario> LoadScenario(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseScenario(ss.str(), path);
}

}  // namespace straggler::quality
