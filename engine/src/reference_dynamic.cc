// The dynamic reference (docs/detection.md, "dynamic"): a profile of the
// row minima sets baseline and threshold; epochs, windows, a global shift
// and a sustained speed-up start a new profile; the majority fallback
// handles jobs whose fastest ranks are a minority.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine_impl.h"
#include "events.h"
#include "reference.h"

namespace straggler::engine::internal {

class DynamicReference final : public Reference {
 public:
  using Reference::Reference;

  void OnEpoch(const Row& row, Time now) override {
    StartProfile(row.iteration, now, absl::StrCat("epoch ", row.epoch, " started"));
  }

  void OnRuleChanged(uint64_t next_iteration, Time now) override {
    StartProfile(next_iteration, now, "policy changed");
  }

  Verdict Single(uint32_t, double compute_seconds) const override {
    return e_.VerdictFor(compute_seconds);
  }

  void OnRow(Row& row, Time now) override {
    rows_since_profile_++;
    const PolicyConfig& p = e_.policy;
    if (p.window_iterations > 0 && !profiling_ && rows_since_profile_ > p.window_iterations)
      StartProfile(row.iteration, now,
                   absl::StrCat("window of ", p.window_iterations, " iterations elapsed"));
    if (profiling_) {
      Profile(row, now);
      return;
    }
    // A faster system makes the profiled threshold too lenient.
    const double reference = from_majority_ ? MajorityTime(row) : row.min;
    if (reference < e_.baseline / JobEngine::kSpeedupRatio) {
      if (++speedup_rows_ >= JobEngine::kSpeedupRows) {
        StartProfile(row.iteration + 1, now,
                     absl::StrFormat("%s rank at %.6gs, below baseline %.6gs / %.2g",
                                     from_majority_ ? "majority" : "fastest", reference,
                                     e_.baseline, JobEngine::kSpeedupRatio));
        return;
      }
    } else {
      speedup_rows_ = 0;
    }
    if (const size_t slow = e_.JudgeRow(row, now, /*global_shift_guard=*/true); slow > 0)
      StartProfile(row.iteration + 1, now,
                   absl::StrCat(slow, " of ", row.values.size(),
                                " ranks above the threshold at iteration ", row.iteration,
                                ": the whole job slowed down"));
  }

 private:
  // A row inside a profile: collected; the row that completes the profile is
  // judged against the new threshold at once, earlier ones against the
  // previous threshold (none before the first).
  void Profile(Row& row, Time now) {
    profile_sum_ += row.min;
    profile_majority_sum_ += MajorityTime(row);
    profile_collected_++;
    bool completed = false;
    if (profile_collected_ >= e_.policy.profile_iterations) {
      profiling_ = false;
      completed = true;
      SetBaseline(profile_sum_ / profile_collected_, /*from_majority=*/false);
    }
    if (!e_.have_threshold) return;
    if (completed && row.values.size() >= kMinRanksForMajority) {
      size_t slow = 0;
      for (auto& [rank, t] : row.values) slow += t > e_.threshold;
      // More ranks sit above k x the fastest right after profiling than
      // could ever be left out: the fastest ranks are a minority (a newer
      // GPU generation, ranks with less work), not the job's speed. Judge
      // against the speed most ranks reach instead.
      if (static_cast<double>(slow) >
          e_.policy.max_excluded_fraction * static_cast<double>(row.values.size())) {
        FallBackToMajority(row, slow, now);
        return;
      }
    }
    e_.JudgeRow(row, now, /*global_shift_guard=*/true);
  }

  void StartProfile(uint64_t iteration, Time now, std::string why) {
    profiling_ = true;
    profile_collected_ = 0;
    profile_sum_ = 0.0;
    profile_majority_sum_ = 0.0;
    rows_since_profile_ = 0;
    speedup_rows_ = 0;
    Event& e = e_.Emit(JobEvent(EventKind::kReprofile, now, iteration, e_.Newest().version,
                                std::move(why)));
    e.evidence.threshold_seconds = e_.have_threshold ? e_.threshold : 0.0;
    e.evidence.baseline_seconds = e_.baseline;
  }

  void FallBackToMajority(Row& row, size_t slow, Time now) {
    SetBaseline(profile_majority_sum_ / profile_collected_, /*from_majority=*/true);
    Event& e = e_.Emit(JobEvent(
        EventKind::kReprofile, now, row.iteration, e_.Newest().version,
        absl::StrCat(slow, " of ", row.values.size(),
                     " ranks above k x the fastest after profiling: baseline taken from "
                     "the speed most ranks reach instead")));
    e.evidence.threshold_seconds = e_.threshold;
    e.evidence.baseline_seconds = e_.baseline;
    e_.JudgeRow(row, now, /*global_shift_guard=*/false);
  }

  // The time that all but max_excluded_fraction of the row's ranks reach (at
  // least the median): the speed of the ranks that could never all be left
  // out, hence the job's real speed.
  double MajorityTime(const Row& row) {
    std::vector<double>& s = e_.scratch;
    s.clear();
    for (auto& [rank, t] : row.values) s.push_back(t);
    if (s.empty()) return 0.0;
    const double q = std::max(0.5, 1.0 - e_.policy.max_excluded_fraction);
    const size_t k =
        std::min(s.size() - 1, static_cast<size_t>(std::ceil(q * s.size())) - 1);
    std::nth_element(s.begin(), s.begin() + k, s.end());
    return s[k];
  }

  void SetBaseline(double b, bool from_majority) {
    e_.baseline = b;
    from_majority_ = from_majority;
    e_.threshold = e_.policy.threshold_factor * b;
    e_.have_threshold = true;
    speedup_rows_ = 0;
    rows_since_profile_ = 0;
  }

  bool profiling_ = true;
  uint32_t profile_collected_ = 0;
  double profile_sum_ = 0.0;           // of the row minima
  double profile_majority_sum_ = 0.0;  // of the row MajorityTimes
  bool from_majority_ = false;         // the baseline is a majority time
  uint64_t rows_since_profile_ = 0;
  int speedup_rows_ = 0;
};

std::unique_ptr<Reference> MakeDynamicReference(EngineImpl& e) {
  return std::make_unique<DynamicReference>(e);
}

}  // namespace straggler::engine::internal
