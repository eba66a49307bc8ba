// Scenario -> Trace: times, reports, topology and the ground truth
// (scenario.h). The parser is scenario_parse.cc.
#include "straggler/quality/scenario.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <utility>

namespace straggler::quality {
namespace {

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

double WarmupFactor(const Effect& e, uint64_t i) {
  if (i >= e.to) return 1.0;
  if (!e.linear) return e.factor;
  const double x = static_cast<double>(i) / static_cast<double>(e.to);
  return e.factor + x * (1.0 - e.factor);
}

}  // namespace

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

double OwnFactor(const Scenario& s, uint32_t rank, uint64_t i) {
  double f = 1.0, input = 1.0;  // of the compute, of the input wait
  for (const auto& e : s.effects) {
    if (!Has(e, rank)) continue;
    double& x = e.input ? input : f;
    if (e.type == EffectType::kSlow) {
      if (i < e.from || i >= e.to) continue;
      if (e.truth_average) {
        const double k = e.pattern_slow, n = e.pattern_every;
        x *= (k * e.factor + (n - k)) / n;
      } else if (InPattern(e, i)) {
        x *= e.factor;
      }
    } else if (e.type == EffectType::kRamp) {
      x *= RampFactor(e, i);
    }
  }
  if (!s.input.enabled) return f;
  return (1.0 - s.input.share) * f + s.input.share * input;
}

bool Ramping(const Scenario& s, uint32_t rank, uint64_t i) {
  for (const auto& e : s.effects)
    if (e.type == EffectType::kRamp && Has(e, rank) && i >= e.from && i < e.to &&
        e.end_factor > e.start_factor)
      return true;
  return false;
}

uint64_t JoinIteration(const Scenario& s, uint32_t rank) {
  uint64_t at = 0;
  for (const auto& e : s.effects)
    if (e.type == EffectType::kJoin && Has(e, rank)) at = std::max(at, e.from);
  return at;
}

bool Reports(const Scenario& s, uint32_t rank, uint64_t i) {
  for (const auto& e : s.effects) {
    if (e.type == EffectType::kSilent && Has(e, rank) && i >= e.from) return false;
    if (e.type == EffectType::kJoin && Has(e, rank) && i < e.from) return false;
  }
  return true;
}

namespace {

// A work model's mean sequence length (WorkModel).
constexpr double kMeanSequence = 512.0;

// The times of one rank, and its own factor (OwnFactor) where it reports.
void GenerateRank(const Scenario& s, uint32_t r, Trace& t, std::vector<double>& own) {
  // Independent streams per rank, so adding a spike effect does not change
  // the noise of the other steps (and variation, added later, neither).
  uint64_t mix = s.seed ^ (0x5851f42d4c957f2dULL * (r + 1));
  uint64_t noise_state = SplitMix64(mix);
  uint64_t spike_state = SplitMix64(mix);
  uint64_t variation_state = SplitMix64(mix);
  // Drawn only with a work model: scenarios without one keep their times.
  uint64_t work_state = s.work.enabled ? SplitMix64(mix) : 0;
  // Likewise with an input model only.
  uint64_t input_state = s.input.enabled ? SplitMix64(mix) : 0;
  const WorkModel& wm = s.work;
  const double mean_cost = kMeanSequence * (1.0 + wm.attention * std::exp(wm.sigma * wm.sigma));
  double fixed = s.topology.empty() ? 1.0 : s.topology[r].cost;
  for (const auto& e : s.effects)
    if (e.type == EffectType::kGeneration && Has(e, r)) fixed *= e.factor;
  for (uint64_t i = 0; i < s.iterations; ++i) {
    const double z = StandardNormal(noise_state);
    double f = fixed;
    double input = 1.0;  // the input wait's factor (`phase: input` effects)
    double host = 1.0;   // the CPU contention's (`phase: host`), in f too
    for (const auto& e : s.effects) {
      double& x = e.input ? input : f;
      auto apply = [&](double m) {
        x *= m;
        if (e.host) host *= m;
      };
      switch (e.type) {
        case EffectType::kSlow:
          if (Has(e, r) && i >= e.from && i < e.to && InPattern(e, i)) apply(e.factor);
          break;
        case EffectType::kSpike: {
          if (!Has(e, r)) break;
          const bool hit = e.every > 0 ? i >= e.offset && (i - e.offset) % e.every == 0
                                       : UnitUniform(spike_state) < e.probability;
          if (hit)
            apply(e.max_factor > 0
                      ? e.factor + UnitUniform(spike_state) * (e.max_factor - e.factor)
                      : e.factor);
          break;
        }
        case EffectType::kRamp:
          if (Has(e, r)) apply(RampFactor(e, i));
          break;
        case EffectType::kGlobal:
          if (i >= e.from && i < e.to && InPattern(e, i)) f *= e.factor;
          break;
        case EffectType::kWarmup:
          f *= WarmupFactor(e, i);
          break;
        case EffectType::kGeneration:
        case EffectType::kSilent:
        case EffectType::kJoin:
          break;
      }
    }
    if (s.variation > 0) f *= 1.0 + s.variation * (2.0 * UnitUniform(variation_state) - 1.0);
    double tokens = 0.0, cost = 0.0;
    if (wm.enabled) {
      for (uint32_t q = 0; q < wm.sequences; ++q) {
        const double len = kMeanSequence * std::exp(wm.sigma * StandardNormal(work_state) -
                                                    wm.sigma * wm.sigma / 2);
        tokens += len;
        cost += len + wm.attention * len * len / kMeanSequence;
      }
      f *= wm.overhead + (1.0 - wm.overhead) * cost / (mean_cost * wm.sequences);
    }
    const double input_jitter =
        s.input.enabled ? std::max(0.05, 1.0 + s.input.noise * StandardNormal(input_state)) : 0.0;
    if (!Reports(s, r, i)) continue;
    const size_t cell = static_cast<size_t>(i) * s.ranks + r;
    if (!t.work.empty()) t.work[cell] = wm.report == WorkModel::Reported::kCost ? cost : tokens;
    if (s.host.enabled) t.run_delay[cell] = s.host.run_delay + (1.0 - 1.0 / host);
    const double jitter = std::max(0.05, 1.0 + s.noise * z);
    if (s.input.enabled) {
      t.compute[cell] = s.base_seconds * (1.0 - s.input.share) * f * jitter;
      t.input_wait[cell] = s.base_seconds * s.input.share * input * input_jitter;
    } else {
      t.compute[cell] = s.base_seconds * f * jitter;
    }
    own[cell] = OwnFactor(s, r, i);
    if (Ramping(s, r, i)) t.ramping.set(r, i, true);
  }
}

}  // namespace

Trace Generate(const Scenario& s) {
  Trace t;
  t.name = s.name;
  t.description = s.description;
  t.ranks = s.ranks;
  t.iterations = s.iterations;
  t.iterations_per_epoch = s.iterations_per_epoch;
  t.base_seconds = s.base_seconds;
  t.expected_cause = s.cause;
  const size_t cells = static_cast<size_t>(s.iterations) * s.ranks;
  t.compute.assign(cells, Trace::kNoReport);
  if (s.work.enabled && s.work.report != WorkModel::Reported::kNone)
    t.work.assign(cells, Trace::kNoReport);
  if (s.input.enabled) t.input_wait.assign(cells, Trace::kNoReport);
  if (s.host.enabled) t.run_delay.assign(cells, Trace::kNoReport);
  t.epoch.resize(s.iterations);
  t.has_truth = true;
  t.truth = RankMatrix(s.ranks, s.iterations);
  t.ramping = RankMatrix(s.ranks, s.iterations);
  t.truth_factor.assign(cells, 1.0f);
  for (uint64_t i = 0; i < s.iterations; ++i)
    t.epoch[i] = s.iterations_per_epoch ? i / s.iterations_per_epoch : 0;
  if (!s.topology.empty()) {
    for (const auto& p : s.topology) {
      t.peer_group.push_back(p.peer_group);
      t.replica.push_back(p.replica);
      t.gpu_model.push_back(p.gpu_model);
    }
  }
  for (uint32_t r = 0; r < s.ranks; ++r)
    if (const uint64_t j = JoinIteration(s, r); j > 0) {
      t.join_row.resize(s.ranks, 0);
      t.join_row[r] = j;
    }

  std::vector<double> own(cells, 1.0);
  for (uint32_t r = 0; r < s.ranks; ++r) GenerateRank(s, r, t, own);

  // Peers: the same peer group and GPU model. A rank is judged against the
  // lower median of its reporting peers' own factors (a job slowed as a whole
  // group is not a straggler; the lower median keeps half a group slowed
  // stragglers), or against its own earlier steps in a group too small for a
  // median.
  std::map<std::pair<std::string, std::string>, std::vector<uint32_t>> groups;
  for (uint32_t r = 0; r < s.ranks; ++r)
    groups[s.topology.empty() ? std::pair<std::string, std::string>{}
                              : std::pair{s.topology[r].peer_group, s.topology[r].gpu_model}]
        .push_back(r);
  std::vector<double> peer;
  for (const auto& [key, members] : groups) {
    for (uint64_t i = 0; i < s.iterations; ++i) {
      const size_t row = static_cast<size_t>(i) * s.ranks;
      double reference = 1.0;
      if (members.size() >= kMinPeersForMedian) {
        peer.clear();
        bool all_one = true;
        for (uint32_t r : members)
          if (t.Reported(i, r)) {
            peer.push_back(own[row + r]);
            all_one = all_one && own[row + r] == 1.0;
          }
        if (!all_one && !peer.empty()) {
          std::nth_element(peer.begin(), peer.begin() + (peer.size() - 1) / 2, peer.end());
          reference = peer[(peer.size() - 1) / 2];
        }
      }
      for (uint32_t r : members) {
        if (!t.Reported(i, r)) continue;
        const double factor = own[row + r] / reference;
        t.truth_factor[row + r] = static_cast<float>(factor);
        t.truth.set(r, i, factor >= s.truth_min_factor - 1e-12);
      }
    }
  }
  return t;
}

}  // namespace straggler::quality
