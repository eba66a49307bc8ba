#include "straggler/quality/scenario.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "yaml-cpp/yaml.h"

namespace straggler::quality {
namespace {

class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  absl::Status Error(const YAML::Node& node, absl::string_view message) const {
    const YAML::Mark m = node.Mark();
    if (m.line < 0) return absl::InvalidArgumentError(absl::StrCat(source_, ": ", message));
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", m.line + 1, ": ", message));
  }

  absl::StatusOr<std::string> Scalar(const YAML::Node& n, absl::string_view key) const {
    if (!n.IsScalar()) return Error(n, absl::StrCat(key, " must be a single value"));
    return n.Scalar();
  }
  absl::StatusOr<uint64_t> Uint(const YAML::Node& n, absl::string_view key) const {
    auto s = Scalar(n, key);
    if (!s.ok()) return s.status();
    uint64_t v = 0;
    if (!absl::SimpleAtoi(*s, &v))
      return Error(n, absl::StrCat(key, "=", *s, " is not a non-negative integer"));
    return v;
  }
  absl::StatusOr<double> Double(const YAML::Node& n, absl::string_view key) const {
    auto s = Scalar(n, key);
    if (!s.ok()) return s.status();
    double v = 0;
    if (!absl::SimpleAtod(*s, &v) || !std::isfinite(v))
      return Error(n, absl::StrCat(key, "=", *s, " is not a number"));
    return v;
  }

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
    if (t == "slow") {
      e.type = EffectType::kSlow;
      allowed = {"ranks", "rank", "factor", "from", "to", "pattern", "truth"};
      required = {"factor"};
    } else if (t == "spike") {
      e.type = EffectType::kSpike;
      allowed = {"ranks", "rank", "factor", "probability"};
      required = {"factor", "probability"};
    } else if (t == "ramp") {
      e.type = EffectType::kRamp;
      allowed = {"ranks", "rank", "from", "to", "start_factor", "end_factor", "hold_until"};
      required = {"from", "to", "end_factor"};
    } else if (t == "global") {
      e.type = EffectType::kGlobal;
      allowed = {"factor", "from", "to"};
      required = {"factor"};
    } else if (t == "generation") {
      e.type = EffectType::kGeneration;
      allowed = {"ranks", "rank", "factor"};
      required = {"factor"};
    } else if (t == "silent") {
      e.type = EffectType::kSilent;
      allowed = {"ranks", "rank", "from"};
      required = {"from"};
    } else {
      return Error(n["type"], absl::StrCat(ctx, ".type=", t,
                                           " is not slow, spike, ramp, global, generation or "
                                           "silent"));
    }
    for (const auto& kv : n) {
      const std::string key = kv.first.Scalar();
      if (key == "type") continue;
      if (!allowed.count(key))
        return Error(kv.first, absl::StrCat("unknown key '", key, "' in ", ctx, " (", t, ")"));
    }
    for (const auto& key : required)
      if (!n[key]) return Error(n, absl::StrCat(ctx, " (", t, ") needs `", key, "`"));
    const bool needs_ranks = e.type != EffectType::kGlobal;
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
                    get_uint("to", e.to), get_uint("hold_until", e.hold_until)})
      if (!st.ok()) return st;
    if (e.type == EffectType::kRamp && !n["hold_until"]) e.hold_until = e.to;
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
    return e;
  }

  absl::StatusOr<Scenario> Parse(const YAML::Node& root) const {
    if (!root.IsMap()) return Error(root, "a scenario must be a map");
    Scenario s;
    s.source = source_;
    const std::set<std::string> known = {"name",   "description", "ranks", "iterations",
                                         "iterations_per_epoch", "base_seconds", "noise",
                                         "seed",   "truth_min_factor", "effects"};
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

 private:
  std::string source_;
};

bool InPattern(const Effect& e, uint64_t iteration) {
  return (iteration - e.from) % e.pattern_every < e.pattern_slow;
}

bool Has(const Effect& e, uint32_t rank) {
  return std::binary_search(e.ranks.begin(), e.ranks.end(), rank);
}

double RampFactor(const Effect& e, uint64_t i) {
  if (i < e.from || i >= e.hold_until) return 1.0;
  if (i >= e.to) return e.end_factor;
  const double x = static_cast<double>(i - e.from) / static_cast<double>(e.to - e.from);
  return e.start_factor + x * (e.end_factor - e.start_factor);
}

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

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double UnitUniform(uint64_t& state) {
  return static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;
}

double StandardNormal(uint64_t& state) {
  double u1 = UnitUniform(state);
  const double u2 = UnitUniform(state);
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double TruthFactor(const Scenario& s, uint32_t rank, uint64_t i) {
  double f = 1.0;
  for (const auto& e : s.effects) {
    if (!Has(e, rank)) continue;
    if (e.type == EffectType::kSlow) {
      if (i < e.from || i >= e.to) continue;
      if (e.truth_average) {
        const double k = e.pattern_slow, n = e.pattern_every;
        f *= (k * e.factor + (n - k)) / n;
      } else if (InPattern(e, i)) {
        f *= e.factor;
      }
    } else if (e.type == EffectType::kRamp) {
      f *= RampFactor(e, i);
    }
  }
  return f;
}

bool Reports(const Scenario& s, uint32_t rank, uint64_t i) {
  for (const auto& e : s.effects)
    if (e.type == EffectType::kSilent && Has(e, rank) && i >= e.from) return false;
  return true;
}

Trace Generate(const Scenario& s) {
  Trace t;
  t.name = s.name;
  t.description = s.description;
  t.ranks = s.ranks;
  t.iterations = s.iterations;
  t.iterations_per_epoch = s.iterations_per_epoch;
  t.base_seconds = s.base_seconds;
  t.compute.assign(static_cast<size_t>(s.iterations) * s.ranks, Trace::kNoReport);
  t.epoch.resize(s.iterations);
  t.has_truth = true;
  t.truth = RankMatrix(s.ranks, s.iterations);
  for (uint64_t i = 0; i < s.iterations; ++i)
    t.epoch[i] = s.iterations_per_epoch ? i / s.iterations_per_epoch : 0;

  for (uint32_t r = 0; r < s.ranks; ++r) {
    // Two independent streams per rank, so adding a spike effect does not
    // change the noise of the other steps.
    uint64_t mix = s.seed ^ (0x5851f42d4c957f2dULL * (r + 1));
    uint64_t noise_state = SplitMix64(mix);
    uint64_t spike_state = SplitMix64(mix);
    double gen = 1.0;
    for (const auto& e : s.effects)
      if (e.type == EffectType::kGeneration && Has(e, r)) gen *= e.factor;
    for (uint64_t i = 0; i < s.iterations; ++i) {
      const double z = StandardNormal(noise_state);
      double f = gen;
      for (const auto& e : s.effects) {
        switch (e.type) {
          case EffectType::kSlow:
            if (Has(e, r) && i >= e.from && i < e.to && InPattern(e, i)) f *= e.factor;
            break;
          case EffectType::kSpike:
            if (Has(e, r) && UnitUniform(spike_state) < e.probability) f *= e.factor;
            break;
          case EffectType::kRamp:
            if (Has(e, r)) f *= RampFactor(e, i);
            break;
          case EffectType::kGlobal:
            if (i >= e.from && i < e.to) f *= e.factor;
            break;
          case EffectType::kGeneration:
          case EffectType::kSilent:
            break;
        }
      }
      if (!Reports(s, r, i)) continue;
      const double jitter = std::max(0.05, 1.0 + s.noise * z);
      t.compute[static_cast<size_t>(i) * s.ranks + r] = s.base_seconds * f * jitter;
      t.truth.set(r, i, TruthFactor(s, r, i) >= s.truth_min_factor - 1e-12);
    }
  }
  return t;
}

}  // namespace straggler::quality
