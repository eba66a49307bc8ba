// Scenarios of the detection-quality suite (scenarios/*.yaml, documented in
// scenarios/README.md): a job's size and healthy speed, relative gaussian
// noise, a seed, and effects (slow, spike, ramp, global, generation, silent).
// Generate() turns one into a Trace with ground truth, deterministically:
// the same file gives the same times on every platform (own RNG and normal
// sampler, no std:: distributions).
//
//   auto s = LoadScenario("scenarios/slowdown-3x.yaml");
//   if (!s.ok()) die(s.status().message());   // names the file, line and key
//   Trace t = Generate(*s);
//
// Plain value types; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "straggler/quality/trace.h"

namespace straggler::quality {

enum class EffectType { kSlow, kSpike, kRamp, kGlobal, kGeneration, kSilent };

// Patterns with a period at most this long count as one sustained slowdown
// of their mean factor in the ground truth (truth: average); longer ones mark
// only their slow steps (truth: steps).
inline constexpr uint32_t kAveragePatternMaxPeriod = 10;

struct Effect {
  EffectType type = EffectType::kSlow;
  std::vector<uint32_t> ranks;   // slow, spike, ramp, generation, silent
  double factor = 1.0;           // slow, spike, global, generation
  uint64_t from = 0;             // slow, ramp, global, silent
  uint64_t to = 0;               // slow, global: end (exclusive); ramp: end of the ramp
  uint64_t hold_until = 0;       // ramp: end_factor holds until here (exclusive)
  uint32_t pattern_slow = 1;     // slow: slow on `pattern_slow` of every `pattern_every`
  uint32_t pattern_every = 1;
  bool truth_average = true;     // slow with a pattern: truth from the mean factor
  double probability = 0.0;      // spike
  double start_factor = 1.0;     // ramp
  double end_factor = 1.0;       // ramp
};

struct Scenario {
  std::string name;
  std::string description;
  std::string source;  // file it came from
  uint32_t ranks = 0;
  uint64_t iterations = 0;
  uint64_t iterations_per_epoch = 0;  // 0 = one epoch
  double base_seconds = 0.0;
  double noise = 0.0;  // relative sigma of every step's time
  uint64_t seed = 0;
  double truth_min_factor = 1.5;
  std::vector<Effect> effects;
};

absl::StatusOr<Scenario> ParseScenario(const std::string& yaml_text, const std::string& source);
absl::StatusOr<Scenario> LoadScenario(const std::string& path);

// The factor that the ground truth judges for `rank` at `iteration`: the
// product of its slow (pattern-averaged where truth_average) and ramp
// effects. Global, generation, spike and noise are not in it.
double TruthFactor(const Scenario& s, uint32_t rank, uint64_t iteration);
// Whether the rank reports `iteration` (silent effects).
bool Reports(const Scenario& s, uint32_t rank, uint64_t iteration);

Trace Generate(const Scenario& s);

// splitmix64: the seed mixer, and a uniform double in [0, 1) from 53 bits.
uint64_t SplitMix64(uint64_t& state);
double UnitUniform(uint64_t& state);
// Standard normal by Box-Muller from UnitUniform.
double StandardNormal(uint64_t& state);

}  // namespace straggler::quality
