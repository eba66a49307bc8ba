// Scenarios of the detection-quality suite (scenarios/*.yaml, documented in
// scenarios/README.md): a job's size and healthy speed, relative gaussian
// noise and uniform data-dependent variation, a seed, each rank's declared
// topology (peer group, replica, GPU model; a Megatron-style layout or
// explicit entries) with by-design cost factors, and effects (slow, spike,
// ramp, global, generation, silent, join, warmup). Generate() turns one into
// a Trace with ground truth relative to each rank's peers, deterministically:
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
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "straggler/quality/trace.h"

namespace straggler::quality {

enum class EffectType { kSlow, kSpike, kRamp, kGlobal, kGeneration, kSilent, kJoin, kWarmup };

// Patterns with a period at most this long count as one sustained slowdown
// of their mean factor in the ground truth (truth: average); longer ones mark
// only their slow steps (truth: steps).
inline constexpr uint32_t kAveragePatternMaxPeriod = 10;

struct Effect {
  EffectType type = EffectType::kSlow;
  std::vector<uint32_t> ranks;   // slow, spike, ramp, generation, silent
  double factor = 1.0;           // slow, spike, global, generation
  uint64_t from = 0;             // slow, ramp, global, silent; join: first iteration reported
  uint64_t to = 0;               // slow, global, warmup: end (exclusive); ramp: end of the ramp
  uint64_t hold_until = 0;       // ramp: end_factor holds until here (exclusive)
  uint32_t pattern_slow = 1;     // slow: slow on `pattern_slow` of every `pattern_every`
  uint32_t pattern_every = 1;
  bool truth_average = true;     // slow with a pattern: truth from the mean factor
  double probability = 0.0;      // spike (random)
  uint64_t every = 0;            // spike: periodic, on iterations i with (i - offset) mod every == 0
  uint64_t offset = 0;           // spike
  double max_factor = 0.0;       // spike: factor uniform in [factor, max_factor]; 0 = fixed
  bool linear = false;           // warmup: factor decays linearly to 1 at `to` (else constant)
  double start_factor = 1.0;     // ramp
  double end_factor = 1.0;       // ramp
  bool input = false;            // slow, spike, ramp with `phase: input`: on the input wait
  bool host = false;             // with `phase: host`: on the compute, as CPU contention (HostModel)
};

// A rank's declared place in the job (docs/topology.md) and its by-design
// cost factor. Peers, for the ground truth, are the ranks with the same
// peer_group and gpu_model.
struct RankPlace {
  std::string peer_group;           // "" = the default group
  std::optional<uint32_t> replica;  // unset = a replica of its own
  std::string gpu_model;            // "" = not declared
  double cost = 1.0;                // x every step (a stage slower by design): never truth
};

// Data-dependent work per step (issue 31): each rank's step holds
// `sequences` sequences of log-normal length (median-free mean 512 tokens,
// sigma `sigma`), its cost = tokens + attention * sum(s^2) / 512, and it
// takes base_seconds * (overhead + (1 - overhead) * cost / mean cost) before
// the effects and noise: a fixed part and a part in proportion to the work.
// `report` says what the trace reports as the step's work: the cost, the
// tokens (a unit that misses the attention term), or nothing.
struct WorkModel {
  enum class Reported { kCost, kTokens, kNone };
  bool enabled = false;
  uint32_t sequences = 8;
  double sigma = 0.6;
  double attention = 0.0;
  double overhead = 0.2;
  Reported report = Reported::kCost;
};

// The input phase (issue 31): a healthy step's own time is base_seconds,
// `share` of it the input wait (IterationReport.input_wait_seconds, blocked
// on the data loader) and the rest compute. The input wait has its own
// relative gaussian noise; effects with `phase: input` multiply it instead
// of the compute (a slow loader: compute normal, own time 1 + share x
// (factor - 1) of a healthy step's). Global, warmup, generation, cost,
// variation and work apply to the compute only.
struct InputModel {
  bool enabled = false;
  double share = 0.05;
  double noise = 0.2;
};

// Host contention (issue 31): every rank's process has a run delay (time
// runnable but not running, s/s, as the agent reads /proc/PID/schedstat) of
// `run_delay`; effects with `phase: host` slow the rank's compute by their
// factor h, the CPU it waits for, and add 1 - 1/h to its run delay (the
// share of the step it waited). The trace carries the run delay
// (Trace::run_delay), so the replay attributes the cause as the daemon does
// from the agent's telemetry.
struct HostModel {
  bool enabled = false;
  double run_delay = 0.005;
};

// Peer groups smaller than this are judged against the rank's own earlier
// steps in the ground truth (its own slow/ramp factor), not against a peer
// median (issue 17: groups of 1 and 2).
inline constexpr uint32_t kMinPeersForMedian = 3;

struct Scenario {
  std::string name;
  std::string description;
  std::string source;  // file it came from
  uint32_t ranks = 0;
  uint64_t iterations = 0;
  uint64_t iterations_per_epoch = 0;  // 0 = one epoch
  double base_seconds = 0.0;
  double noise = 0.0;      // relative sigma of every step's time
  double variation = 0.0;  // every step x uniform(1 - variation, 1 + variation)
  WorkModel work;          // `work:` (none: every step the same work)
  InputModel input;        // `input:` (none: no input wait reported)
  HostModel host;          // `host:` (none: no run delay in the trace)
  // `cause`: the likely cause each detection of a true episode must have
  // (Trace::expected_cause); "" = not checked.
  std::string cause;
  uint64_t seed = 0;
  double truth_min_factor = 1.5;
  std::vector<Effect> effects;
  // Per rank when the file has a `topology`; empty = none declared (one
  // group, every rank a replica of its own, cost 1).
  std::vector<RankPlace> topology;
  std::string topology_text;  // "4 replicas x 2 stages x 2 tensor" or "per-rank entries"
};

absl::StatusOr<Scenario> ParseScenario(const std::string& yaml_text, const std::string& source);
absl::StatusOr<Scenario> LoadScenario(const std::string& path);

// The rank's own slowdown at `iteration`: the product of its slow
// (pattern-averaged where truth_average) and ramp effects. Global,
// generation, warmup, spike, cost, variation and noise are not in it. With
// an input model, (1 - share) x that of the compute effects + share x that
// of the `phase: input` ones: how much longer its own time is.
double OwnFactor(const Scenario& s, uint32_t rank, uint64_t iteration);
// Whether a ramp of the rank is still rising at `iteration` (a gradual
// slowdown: its criterion is "flagged by the time it is 1.5x").
bool Ramping(const Scenario& s, uint32_t rank, uint64_t iteration);
// Whether the rank reports `iteration` (join and silent effects).
bool Reports(const Scenario& s, uint32_t rank, uint64_t iteration);
// The rank's first reported iteration (join effects; 0 without one).
uint64_t JoinIteration(const Scenario& s, uint32_t rank);

// The trace: times, reports, topology and the ground truth. A rank is a
// true straggler at i when it reports i and its truth factor, OwnFactor
// divided by the median OwnFactor of its reporting peers (its own factor in
// a peer group smaller than kMinPeersForMedian), is >= truth_min_factor.
Trace Generate(const Scenario& s);

// splitmix64: the seed mixer, and a uniform double in [0, 1) from 53 bits.
uint64_t SplitMix64(uint64_t& state);
double UnitUniform(uint64_t& state);
// Standard normal by Box-Muller from UnitUniform.
double StandardNormal(uint64_t& state);

}  // namespace straggler::quality
