// Issue 17's detection criteria, per scenario and policy: what the
// BENCHMARKS.md detection table's "criteria" column and the
// quality:default_policy_criteria gate check (scenarios/README.md,
// "Criteria").
//
//  * Onset of an episode (a maximal run of truth of one rank): its first
//    true row, but not before the job's first profile (`first_profile_rows`
//    rows from the start: nothing can be judged before a reference exists).
//  * Deadline: an episode must be flagged within 5 rows of the onset when its
//    truth factor there is >= 2, within 10 when >= 1.3; a gradual episode
//    (its rank ramping at the onset) by the first row where its truth factor
//    reaches 1.5 (10 rows after the ramp stops, when it never does), but not
//    sooner than the step rule; an episode below 1.3 that never reaches 1.5
//    has no deadline. Flagged means the first flagged row of the episode is
//    <= the deadline.
//  * No false alarm (a flag run that touches no truth: a healthy rank
//    flagged; a flag outlasting an episode is recovery latency, not this).
//  * No flap (scoring.h): flagged, unflagged and flagged again inside one
//    episode.
//  * The likely cause (issue 31), where the scenario names one (`cause`):
//    every detection inside a true episode has it (CheckCauses).
//  * No stuck rank (issue 33): no rank below kStuckFactor is flagged for
//    more than its stretch plus the exit window. A flagged row of a rank
//    whose truth factor there is below kStuckFactor is stuck when more than
//    kExitWindowRows rows passed since the later of the flag's start and
//    the rank's last row at kStretchFactor or above (its stretch: a 3x
//    episode, a 1.2x stretch, a ramp; a rank held at 1.2x is in its stretch
//    throughout). One per flag run that gets stuck.
//
//   Criteria c = CheckCriteria(trace, run.flagged, 5);
//   if (!c.pass()) for (auto& f : c.failures) puts(f.c_str());
//
// Pure function of its arguments; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "straggler/quality/trace.h"

namespace straggler::quality {

inline constexpr double kMildFactor = 1.3;      // >= this: flagged within kMildRows
inline constexpr uint64_t kMildRows = 10;
inline constexpr double kSevereFactor = 2.0;    // >= this: flagged within kSevereRows
inline constexpr uint64_t kSevereRows = 5;
inline constexpr double kRampFactor = 1.5;      // a ramp: flagged by the time it is this slow
inline constexpr double kStuckFactor = 1.25;    // below this, flagged only for ...
inline constexpr double kStretchFactor = 1.15;  // ... a stretch at this or above ...
// ... plus the exit window: the peer policy's long window (20 steps) to
// forget the stretch, then peer_exit_rows (10) rows below the straggler ratio.
inline constexpr uint64_t kExitWindowRows = 30;

struct Criteria {
  uint64_t episodes = 0;       // episodes with a deadline
  uint64_t in_time = 0;        // of those, flagged by their deadline
  uint64_t late = 0;           // flagged, after the deadline
  uint64_t missed = 0;         // never flagged inside the episode
  uint64_t false_alarms = 0;
  uint64_t flaps = 0;
  uint64_t stuck = 0;          // flag runs held past a stretch plus the exit window
  bool cause_checked = false;  // the scenario names a cause and the run has causes
  uint64_t wrong_cause = 0;    // detections of a true episode with another cause
  // One line per failure, e.g. "rank 3 [800, 1800) 1.30x: flagged at 815, deadline 810".
  std::vector<std::string> failures;
  bool pass() const {
    return late == 0 && missed == 0 && false_alarms == 0 && flaps == 0 && stuck == 0 &&
           wrong_cause == 0;
  }
  // "pass", or what failed: "late 1, missed 0, false alarms 2, flaps 0, stuck 0"
  // (+ ", wrong cause N" where the cause was checked).
  std::string Summary() const;
};

// `flagged` is per (rank, row) of `t`; t must have truth (Generate()).
Criteria CheckCriteria(const Trace& t, const RankMatrix& flagged, uint64_t first_profile_rows);

// Where t.expected_cause is set and `causes` is not empty (per rank,
// parallel to `detected_at`, absolute iterations): each detection at a row
// where its rank is a true straggler must have that cause; each one that
// has another counts in c.wrong_cause, with a failure line.
void CheckCauses(const Trace& t, const std::vector<std::vector<uint64_t>>& detected_at,
                 const std::vector<std::vector<std::string>>& causes, Criteria& c);

}  // namespace straggler::quality
