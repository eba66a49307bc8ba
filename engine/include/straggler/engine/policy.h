// Policy configuration of one job's detection engine.
//
// A PolicyConfig is plain data with the defaults of deploy/stragglerd.yaml.
// Validate() names the first bad value:
//
//   straggler::engine::PolicyConfig p;
//   p.kind = straggler::engine::PolicyKind::kDynamic;
//   p.threshold_factor = 0.5;
//   p.Validate();  // InvalidArgument: "threshold_factor=0.5 must be > 1"
//
// Every numeric field has a documented range in one place, the PolicyFields()
// table (bounds below); Validate() checks each field against it, so config
// files, SIGHUP, REST, gRPC and straggler-replay all refuse the same values.
// The upper bounds keep everything derived from a field (a duration in int64
// nanoseconds, an iteration sum) far from overflow.
//
// Plain value type; no shared state.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace straggler::engine {

enum class PolicyKind { kDynamic, kEwma, kStatic, kPeer };
enum class RecoveryMode { kShadow, kProbation };

// Every kind and mode, in the order messages list them (the default first).
inline constexpr PolicyKind kPolicyKinds[] = {PolicyKind::kPeer, PolicyKind::kDynamic,
                                              PolicyKind::kEwma, PolicyKind::kStatic};
inline constexpr RecoveryMode kRecoveryModes[] = {RecoveryMode::kShadow,
                                                  RecoveryMode::kProbation};

std::string_view PolicyKindName(PolicyKind kind);
absl::StatusOr<PolicyKind> ParsePolicyKind(std::string_view name);
std::string_view RecoveryModeName(RecoveryMode mode);
absl::StatusOr<RecoveryMode> ParseRecoveryMode(std::string_view name);
// The names in kPolicyKinds / kRecoveryModes order as a sentence: "peer,
// dynamic, ewma or static", "shadow or probation".
std::string PolicyKindChoices();
std::string RecoveryModeChoices();

struct PolicyConfig {
  // The daemon's default is peer (issue 17: peer groups, mild stragglers at
  // zero false positives); dynamic keeps the paper's parameters.
  PolicyKind kind = PolicyKind::kPeer;

  // Counter shared by every policy: +1 on a slow step, -1 on a fast one,
  // bounded to [0, limit]; a rank whose counter reaches `limit` is a straggler
  // and a straggler whose counter falls to `rejoin_mark` is healthy again.
  uint32_t limit = 5;
  // When > 0, limit = ceil(limit_fraction * iterations per epoch) once the
  // epoch length is known (announced by the client or seen), never below 2;
  // `limit` is used until then.
  double limit_fraction = 0.0;
  uint32_t rejoin_mark = 0;

  // dynamic: threshold = threshold_factor * mean over the first
  // profile_iterations iterations of an epoch of the fastest rank's time.
  uint32_t profile_iterations = 5;
  double threshold_factor = 2.0;
  uint32_t window_iterations = 0;  // also re-profile every W iterations; 0 = off
  RecoveryMode recovery = RecoveryMode::kShadow;
  // When more than this fraction of the active ranks is slow at the same
  // iteration, the whole job slowed down: nobody's counter moves and the
  // threshold is re-profiled.
  double global_shift_fraction = 0.5;

  // ewma: straggler-slow when the rank's EWMA exceeds ewma_ratio x the median
  // EWMA of the active ranks, after ewma_min_samples samples.
  double ewma_alpha = 0.3;
  double ewma_ratio = 1.5;
  uint32_t ewma_min_samples = 5;

  // static: a step is slow when compute_seconds > static_threshold_seconds.
  double static_threshold_seconds = 0.0;

  // peer (docs/detection.md, "peer"): each step's ratio to the median of the
  // rank's peer group in the same row (its own baseline in groups below
  // peer_min_group), spikes left out, over a window of peer_window steps.
  // Straggler when the window's trimmed mean ratio is >= the group's
  // threshold for peer_enter_rows rows (the threshold: peer_enter_ratio, or
  // peer_noise_z x the group's noise when that is higher; a 20-step window
  // against that noise term shrunk by its length), or when 5 of its last 6
  // steps (8 of its last 10) are >= peer_severe_ratio and that many are
  // improbable at the group's own rate of such steps; healthy again after
  // peer_exit_rows rows below half the threshold and below 1.04x.
  // A rank flagged by those rules whose window stays below
  // peer_straggler_ratio is `mild` (the gray zone), not a straggler; a
  // straggler whose window stayed below it for peer_exit_rows rows leaves
  // the straggler state, to mild or healthy (docs/detection.md, "States").
  double peer_enter_ratio = 1.12;
  double peer_noise_z = 1.5;
  uint32_t peer_window = 10;
  uint32_t peer_enter_rows = 2;
  double peer_severe_ratio = 1.35;
  double peer_spike_ratio = 2.5;
  uint32_t peer_exit_rows = 10;
  double peer_straggler_ratio = 1.25;
  uint32_t peer_min_group = 3;
  uint32_t peer_profile_iterations = 10;

  // Guards, applied to every policy.
  double max_excluded_fraction = 0.25;
  uint32_t min_active_ranks = 1;
  // Never fewer data-parallel replicas active than this (docs/topology.md);
  // in a pure data-parallel job a replica is a rank.
  uint32_t min_active_replicas = 1;
  uint32_t cooldown_iterations = 5;
  double min_throughput_gain = 0.05;

  // Membership.
  uint32_t lead_iterations = 3;
  double unresponsive_after_seconds = 30.0;
  bool exclusion_enabled = true;

  // Largest compute time accepted, in seconds; larger values are rejected as
  // absurd (a unit error, a clock jump).
  double max_compute_seconds = 3600.0;

  absl::Status Validate() const;
  // The limit in force for an epoch of `iterations_per_epoch` iterations
  // (0 = unknown).
  uint32_t EffectiveLimit(uint64_t iterations_per_epoch) const;
};

// Every PolicyConfig field by its YAML name (deploy/stragglerd.yaml), in
// declaration order: one table for the config loader, `straggler-replay
// --set` and anything else that sets fields by name.
using PolicyMember =
    std::variant<uint32_t PolicyConfig::*, double PolicyConfig::*, bool PolicyConfig::*,
                 PolicyKind PolicyConfig::*, RecoveryMode PolicyConfig::*>;
//
// Numeric fields carry their accepted range: min (exclusive when
// min_exclusive) to max, inclusive. Enums and bools ignore the bounds.
struct PolicyField {
  const char* name;
  PolicyMember member;
  double min = 0;
  double max = 0;
  bool min_exclusive = false;
};
std::span<const PolicyField> PolicyFields();

// The longest duration any policy field may hold: 7 days. Far below the
// ~292 years int64 nanoseconds can hold, so `now + duration` cannot wrap.
inline constexpr double kMaxPolicySeconds = 7 * 24 * 3600.0;

// `seconds` as nanoseconds, saturating at the int64 limits (NaN -> 0): a
// conversion that can never overflow, whatever Validate let through.
std::chrono::nanoseconds SaturatingNanoseconds(double seconds);

// The shortest text that reads back as exactly `v` ("3600.0001", "1e+300",
// "0.1"): messages that compare a value with a bound must show the
// difference.
std::string ExactNumber(double v);

// What a policy change changed, for its event and log line: every field
// whose value differs, in PolicyFields() order, as
// "limit 5 -> 7, threshold_factor 2 -> 2.5" (enums by their YAML words);
// "" when no field differs.
std::string PolicyChanges(const PolicyConfig& before, const PolicyConfig& after);

}  // namespace straggler::engine
