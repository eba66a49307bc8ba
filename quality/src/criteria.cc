#include "straggler/quality/criteria.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace straggler::quality {

std::string Criteria::Summary() const {
  if (pass()) return "pass";
  return absl::StrCat("FAIL: late ", late, ", missed ", missed, ", false alarms ", false_alarms,
                      ", flaps ", flaps, ", stuck ", stuck,
                      cause_checked ? absl::StrCat(", wrong cause ", wrong_cause) : "");
}

void CheckCauses(const Trace& t, const std::vector<std::vector<uint64_t>>& detected_at,
                 const std::vector<std::vector<std::string>>& causes, Criteria& c) {
  if (t.expected_cause.empty() || causes.empty()) return;
  c.cause_checked = true;
  for (uint32_t r = 0; r < t.ranks && r < detected_at.size(); ++r)
    for (size_t k = 0; k < detected_at[r].size() && k < causes[r].size(); ++k) {
      const uint64_t i = detected_at[r][k];
      if (i < t.first_iteration || i - t.first_iteration >= t.iterations ||
          !t.truth.at(r, i - t.first_iteration) || causes[r][k] == t.expected_cause)
        continue;
      ++c.wrong_cause;
      c.failures.push_back(absl::StrFormat("rank %d detected at %d: likely cause %s, expected %s",
                                           r, i, causes[r][k], t.expected_cause));
    }
}

namespace {

constexpr uint64_t kMaxListedAlarms = 20;

// The last row by which the episode [from, to) of `rank` must be flagged;
// nullopt: no deadline.
std::optional<uint64_t> Deadline(const Trace& t, uint32_t rank, uint64_t onset, uint64_t to) {
  const double at_onset = t.TruthFactorAt(onset, rank);
  std::optional<uint64_t> step;  // the deadline of a step to the onset's factor
  if (at_onset >= kSevereFactor - 1e-6) step = onset + kSevereRows;
  else if (at_onset >= kMildFactor - 1e-6) step = onset + kMildRows;
  if (t.ramping.ranks() == 0 || !t.ramping.at(rank, onset)) return step;
  // A ramp: by the row it reaches 1.5x, but never sooner than a step of its
  // onset's factor would be due (an episode that starts at 1.5x, as with
  // truth_min_factor 1.5, would otherwise be due at its first row).
  std::optional<uint64_t> ramp;
  for (uint64_t i = onset; i < to && !ramp; ++i) {
    if (t.TruthFactorAt(i, rank) >= kRampFactor - 1e-6) ramp = i;
    else if (!t.ramping.at(rank, i)) ramp = i + kMildRows;  // held below 1.5
  }
  if (!ramp) return step;
  return step ? std::max(*step, *ramp) : *ramp;
}

// The stuck-rank check (criteria.h): per rank, each flag run is followed row
// by row with the later of its start and the rank's last stretch row.
void CheckStuck(const Trace& t, const RankMatrix& flagged, Criteria& c) {
  for (uint32_t r = 0; r < t.ranks; ++r) {
    std::optional<uint64_t> stretch;  // the rank's last row at kStretchFactor or above
    uint64_t run_from = 0;
    bool reported_stuck = false;
    for (uint64_t i = 0; i < t.iterations; ++i) {
      if (!t.Reported(i, r)) continue;
      const double factor = t.TruthFactorAt(i, r);
      if (factor >= kStretchFactor - 1e-6) stretch = i;
      if (!flagged.at(r, i)) continue;
      if (i == 0 || !flagged.at(r, i - 1)) {
        run_from = i;
        reported_stuck = false;
      }
      if (factor >= kStuckFactor - 1e-6 || reported_stuck) continue;
      const uint64_t anchor = stretch ? std::max(*stretch, run_from) : run_from;
      if (i - anchor <= kExitWindowRows) continue;
      reported_stuck = true;
      ++c.stuck;
      c.failures.push_back(absl::StrFormat(
          "rank %u still a straggler at %.2fx at %u, %u rows after %s %u (exit window %u)", r,
          factor, t.Iteration(i), i - anchor,
          stretch && *stretch >= run_from ? "its stretch at" : "its flag at", t.Iteration(anchor),
          kExitWindowRows));
    }
  }
}

}  // namespace

Criteria CheckCriteria(const Trace& t, const RankMatrix& flagged, uint64_t first_profile_rows) {
  Criteria c;
  RankMatrix scored_truth(t.ranks, t.iterations);
  for (uint32_t r = 0; r < t.ranks; ++r)
    for (uint64_t i = 0; i < t.iterations; ++i)
      scored_truth.set(r, i, t.truth.at(r, i) && t.Reported(i, r));
  for (const Interval& e : Intervals(scored_truth)) {
    std::optional<uint64_t> first;
    for (uint64_t i = e.from; i < e.to; ++i)
      if (flagged.at(e.rank, i)) {
        first = i;
        break;
      }
    if (first)
      for (uint64_t i = *first + 1; i < e.to; ++i)
        c.flaps += flagged.at(e.rank, i) && !flagged.at(e.rank, i - 1);
    const uint64_t onset = std::max(e.from, first_profile_rows);
    if (onset >= e.to) continue;  // over before anything could be judged
    const auto deadline = Deadline(t, e.rank, onset, e.to);
    if (!deadline) continue;
    ++c.episodes;
    const std::string what = absl::StrFormat(
        "rank %u [%u, %u) %.2fx", e.rank, t.Iteration(e.from), t.Iteration(e.to),
        t.TruthFactorAt(onset, e.rank));
    if (!first) {
      ++c.missed;
      c.failures.push_back(absl::StrCat(what, ": never flagged, deadline ",
                                        t.Iteration(*deadline)));
    } else if (*first > *deadline) {
      ++c.late;
      c.failures.push_back(absl::StrCat(what, ": flagged at ", t.Iteration(*first),
                                        ", deadline ", t.Iteration(*deadline)));
    } else {
      ++c.in_time;
    }
  }
  for (const Interval& run : Intervals(flagged)) {
    bool touches = false;
    for (uint64_t i = run.from; i < run.to && !touches; ++i) touches = scored_truth.at(run.rank, i);
    if (touches) continue;
    // The first few are enough to see what went wrong; all are counted.
    if (++c.false_alarms > kMaxListedAlarms) continue;
    c.failures.push_back(absl::StrCat("rank ", run.rank, " flagged over [", t.Iteration(run.from),
                                      ", ", t.Iteration(run.to), ") with no straggler there"));
  }
  if (c.flaps > 0) c.failures.push_back(absl::StrCat(c.flaps, " flap(s) inside episodes"));
  CheckStuck(t, flagged, c);
  return c;
}

}  // namespace straggler::quality
