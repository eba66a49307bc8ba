// The dynamic reference (docs/detection.md, "dynamic"): per peer group
// (peer_groups.h), a profile of the group's row minima sets baseline and
// threshold; epochs, windows, a global shift and a sustained speed-up start
// a new profile; the majority fallback handles groups whose fastest ranks
// are a minority. The rules run on one group at a time: its baseline and
// threshold are swapped into the engine's while it is judged.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine_impl.h"
#include "events.h"
#include "peer_groups.h"
#include "reference.h"

namespace straggler::engine::internal {

class DynamicReference final : public Reference {
 public:
  using Reference::Reference;

  void OnEpoch(const Row& row, Time now) override {
    Sync();
    for (uint32_t g = 0; g < groups_.size(); ++g)
      WithGroup(g, [&] {
        StartProfile(row.iteration, now, absl::StrCat("epoch ", row.epoch, " started", Where()));
      });
    Publish();
  }

  void OnRuleChanged(uint64_t next_iteration, Time now) override {
    Sync();
    for (uint32_t g = 0; g < groups_.size(); ++g)
      WithGroup(g, [&] { StartProfile(next_iteration, now, "policy changed" + Where()); });
    Publish();
  }

  Verdict Single(uint32_t rank, const Report& report) const override {
    // (`rank` < world size: the engine checked it at Ingest.)
    const double t = report.OwnSeconds();
    if (groups_state_.empty()) return e_.VerdictFor(t);
    const GroupDyn& st = groups_state_[groups_.Of(rank)];
    if (!st.have_threshold) return Verdict::kNone;
    if (t > st.threshold) return Verdict::kSlow;
    if (t < st.threshold) return Verdict::kFast;
    return Verdict::kNone;
  }

  void OnRow(Row& row, Time now) override {
    Sync();
    if (groups_.size() == 1) {
      // One group (a job without peer groups): the row is its own part.
      WithGroup(0, [&] { OnGroupRow(row, now); });
      Publish();
      return;
    }
    groups_.Bucketize(row);
    for (uint32_t g = 0; g < groups_.size(); ++g) {
      const auto& bucket = groups_.Bucket(g);
      if (bucket.empty()) continue;
      sub_.iteration = row.iteration;
      sub_.epoch = row.epoch;
      sub_.step_max = row.step_max;
      sub_.values.assign(bucket.begin(), bucket.end());
      sub_.min = std::numeric_limits<double>::infinity();
      for (auto& [rank, t] : sub_.values) sub_.min = std::min(sub_.min, t);
      WithGroup(g, [&] { OnGroupRow(sub_, now); });
    }
    Publish();
  }

 private:
  // Views show the largest group's reference (the only one, usually).
  void Publish() {
    const GroupDyn* best = nullptr;
    uint32_t members = 0;
    for (uint32_t g = 0; g < groups_.size(); ++g) {
      if (!groups_state_[g].have_threshold) continue;
      if (best == nullptr || groups_.Members(g) > members) {
        best = &groups_state_[g];
        members = groups_.Members(g);
      }
    }
    e_.have_threshold = best != nullptr;
    e_.threshold = best != nullptr ? best->threshold : 0.0;
    e_.baseline = best != nullptr ? best->baseline : 0.0;
  }

  void OnGroupRow(Row& row, Time now) {
    cur_->rows_since_profile++;
    const PolicyConfig& p = e_.policy;
    if (p.window_iterations > 0 && !cur_->profiling && cur_->rows_since_profile > p.window_iterations)
      StartProfile(row.iteration, now,
                   absl::StrCat("window of ", p.window_iterations, " iterations elapsed", Where()));
    if (cur_->profiling) {
      Profile(row, now);
      return;
    }
    // A faster system makes the profiled threshold too lenient.
    const double reference = cur_->from_majority ? MajorityTime(row) : row.min;
    if (reference < e_.baseline / JobEngine::kSpeedupRatio) {
      if (++cur_->speedup_rows >= JobEngine::kSpeedupRows) {
        StartProfile(row.iteration + 1, now,
                     absl::StrFormat("%s rank at %.6gs, below baseline %.6gs / %.2g%s",
                                     cur_->from_majority ? "majority" : "fastest", reference,
                                     e_.baseline, JobEngine::kSpeedupRatio, Where()));
        return;
      }
    } else {
      cur_->speedup_rows = 0;
    }
    if (const size_t slow = e_.JudgeRow(row, now, /*global_shift_guard=*/true); slow > 0)
      StartProfile(row.iteration + 1, now,
                   absl::StrCat(slow, " of ", row.values.size(),
                                " ranks above the threshold at iteration ", row.iteration,
                                ": the whole ", groups_.size() > 1 ? "group" : "job",
                                " slowed down", Where()));
  }

  // A row inside a profile: collected; the row that completes the profile is
  // judged against the new threshold at once, earlier ones against the
  // previous threshold (none before the first).
  void Profile(Row& row, Time now) {
    cur_->profile_sum += row.min;
    cur_->profile_majority_sum += MajorityTime(row);
    cur_->profile_collected++;
    bool completed = false;
    if (cur_->profile_collected >= e_.policy.profile_iterations) {
      cur_->profiling = false;
      completed = true;
      SetBaseline(cur_->profile_sum / cur_->profile_collected, /*from_majority=*/false);
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
    cur_->profiling = true;
    cur_->profile_collected = 0;
    cur_->profile_sum = 0.0;
    cur_->profile_majority_sum = 0.0;
    cur_->rows_since_profile = 0;
    cur_->speedup_rows = 0;
    Event& e = e_.Emit(JobEvent(EventKind::kReprofile, now, iteration, e_.Newest().version,
                                std::move(why)));
    e.evidence.threshold_seconds = e_.have_threshold ? e_.threshold : 0.0;
    e.evidence.baseline_seconds = e_.baseline;
  }

  void FallBackToMajority(Row& row, size_t slow, Time now) {
    SetBaseline(cur_->profile_majority_sum / cur_->profile_collected, /*from_majority=*/true);
    Event& e = e_.Emit(JobEvent(
        EventKind::kReprofile, now, row.iteration, e_.Newest().version,
        absl::StrCat(slow, " of ", row.values.size(),
                     " ranks above k x the fastest after profiling: baseline taken from "
                     "the speed most ranks reach instead",
                     Where())));
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
    cur_->from_majority = from_majority;
    e_.threshold = e_.policy.threshold_factor * b;
    e_.have_threshold = true;
    cur_->speedup_rows = 0;
    cur_->rows_since_profile = 0;
  }

  // One peer group's profile and threshold.
  struct GroupDyn {
    bool profiling = true;
    uint32_t profile_collected = 0;
    double profile_sum = 0.0;           // of the row minima
    double profile_majority_sum = 0.0;  // of the row MajorityTimes
    bool from_majority = false;         // the baseline is a majority time
    uint64_t rows_since_profile = 0;
    int speedup_rows = 0;
    bool have_threshold = false;
    double threshold = 0.0;
    double baseline = 0.0;
  };

  // Files ranks under their groups; a new group profiles from scratch.
  void Sync() {
    if (!groups_.Sync(e_.topology, e_.topology_version)) return;
    groups_state_.resize(groups_.size());
  }

  // Runs `f` with group g's reference swapped into the engine.
  template <typename F>
  void WithGroup(uint32_t g, F f) {
    GroupDyn& st = groups_state_[g];
    cur_ = &st;
    group_ = g;
    e_.have_threshold = st.have_threshold;
    e_.threshold = st.threshold;
    e_.baseline = st.baseline;
    f();
    st.have_threshold = e_.have_threshold;
    st.threshold = e_.threshold;
    st.baseline = e_.baseline;
  }

  // Where a reprofile event names its group (jobs with more than one).
  std::string Where() const {
    return groups_.size() > 1 ? absl::StrCat(" (", groups_.Label(group_), ")") : std::string();
  }

  PeerGroups groups_;
  std::vector<GroupDyn> groups_state_;
  GroupDyn* cur_ = nullptr;
  uint32_t group_ = 0;
  Row sub_;  // the current group's part of the row
};

std::unique_ptr<Reference> MakeDynamicReference(EngineImpl& e) {
  return std::make_unique<DynamicReference>(e);
}

}  // namespace straggler::engine::internal
