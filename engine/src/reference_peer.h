// The peer reference (docs/detection.md, "peer"): each step's log ratio to
// the median of the rank's peer group in the same row - or, in a group too
// small to compare within, to the rank's own baseline, normalised by the
// median change of every rank's own ratio - judged over a window with spikes
// left out, a noise-scaled threshold, persistence and hysteresis.
// reference_peer.cc holds the rule and the reports judged alone,
// peer_row_stages.cc a row's work in stages (docs/detection.md, "Large
// rows"). Not thread-safe: the engine's thread only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "peer_data.h"
#include "peer_groups.h"
#include "peer_profiles.h"
#include "peer_state.h"
#include "peer_steps.h"
#include "rank_chunks.h"
#include "reference.h"
#include "sliced_median.h"

namespace straggler::engine::internal {

class PeerReference final : public Reference {
 public:
  using Reference::Reference;

  void OnRow(Row& row, Time now) override;

  // Plans the row: its buckets, which groups are judged, which ranks still
  // profile their own baselines. The work itself is JudgeSlice's; returns
  // at most how many units it takes (RowUnits).
  size_t BeginRow(Row& row, Time now) override;

  // The row's work in order, `budget` units at a time (docs/detection.md,
  // "Large rows"): the job's level and the own baselines' steps, then per
  // group its log ratios, median, noise and thresholds, its steps where the
  // whole group must hold them first (the rate median, the generation
  // check), and its verdicts. A unit is one rank's step or verdict, or a few
  // values of a cheaper pass. Groups, buckets and states are looked up
  // again each time (a split adds a group). Returns nonzero while work is
  // left.
  size_t JudgeSlice(size_t budget) override;

  // Ranks too small to compare within, then the views.
  void EndRow(Row& row, Time now) override;

  // A report judged alone (shadow recovery, a late report): against the
  // reference its rank had in the newest row, one step at a time.
  Verdict Single(uint32_t rank, const Report& rep) const override;

  double BaselineOf(uint32_t rank) const override;
  std::optional<DataNote> DataNoteOf(uint32_t rank) const override { return data_.Of(rank); }

  // An excluded rank's report (shadow recovery) or a late one: into its
  // window against its group's steady median (its own baseline at the job's
  // newest speed), judged by the same rule as in a row, so that one step
  // does not decide - except for the quick way back (Judge's `alone`): its
  // steps ran at other times than the rows it is compared with.
  bool JudgeAlone(uint32_t rank, const Report& rep, Time now) override;

  void OnRuleChanged(uint64_t, Time) override;

 private:
  // How often a group's median rate of severe steps is taken again, in rows
  // (or sooner after a clear episode: PeerSteps::RecentlyFast).
  static constexpr uint64_t kRateRows = 16;
  static constexpr size_t kNone = std::numeric_limits<size_t>::max();

  static double SafeLog(double t) { return std::log(std::max(t, 1e-9)); }

  // logs_p_ as the policy says: a check inline, the recount after a change
  // out of line.
  void RefreshLogs();
  [[gnu::noinline]] void Recount();

  // Values per rank and kind a new profile block holds: the policy's
  // profile length, at most 64 (a longer profile grows its block).
  size_t ProfileRoom() const;

  // The ranks and groups as the engine's world size and topology say: a
  // check inline, the work (SyncChanged) out of line.
  void Sync();
  [[gnu::noinline]] void SyncChanged();

  // The thresholds (log ratio) for `gs`'s noise variance, once per row:
  // the short window's, and the long window's - the noise term shrunk by
  // the square root of how many more steps it averages.
  void SetThresholds(GroupState& gs) const;

  // The job's level in `row`: own baselines are taken against it. A median
  // over the whole row, so only computed where needed (while some rank
  // still profiles its own baseline, or some group is too small to compare
  // within), once per row.
  double Level(const Row& row);

  // A rank's step into its own baseline's profile, against the row's level.
  void ProfileOwn(uint32_t rank, double t);

  // The stages of a row's work (JudgeSlice), in order: the job's level (a
  // large row: two passes), the own baselines' steps, then for each judged
  // group from kGroupStart: its log ratios (and a large group's median in
  // two passes), its noise, its steps where the whole group needs them
  // first, the generation check at the end of its profile, its verdicts.
  enum class Stage : uint8_t {
    kLevel,
    kOwn,
    kGroupStart,
    kGroupCount,
    kGroupGather,
    kGroupNoise,
    kGroupPush,
    kGroupRates,
    kGroupGenerations,
    kGroupMembers,
    kDone,
  };
  // A row or group at least this large takes its median in two passes
  // (SlicedMedian); a smaller one at once (a group: BandMedian, in the pass
  // that takes its logs; at this size a fallback over every value is still
  // ~0.2 ms).
  static constexpr size_t kSlicedMedianMin = 16384;
  // The spread (log) of every rank's step around the job's level: groups may
  // differ, so wider than one group's noise.
  static constexpr double kLevelScale = 0.25;
  // A group's spread for SlicedMedian's bins: its noise sigma, at least this
  // (a group of equal steps would put every value in one bin).
  static constexpr double kMinScale = 0.01;
  // Values per unit of budget in the cheap passes (a log, a count or a
  // comparison per value, against a rank's step and verdict).
  static constexpr size_t kLogsPerUnit = 2;
  static constexpr size_t kCheapPerUnit = 8;

  // Runs f(i) for the stage's next values, from pos_ up to n, `per_unit` per
  // unit of `budget`; true when it reached n (pos_ starts over).
  template <typename F>
  bool Pass(size_t n, size_t per_unit, size_t& budget, F&& f);

  // Both passes of `m` (SlicedMedian) over value(i) for i < n, a Pass each;
  // true once m.Take() may be called.
  template <typename V>
  bool MedianPasses(SlicedMedian& m, size_t n, size_t per_unit, size_t& budget, V&& value);

  // One stage's work, or as much of it as `budget` allows.
  void Step(size_t& budget);

  // An upper bound of the planned row's units of work (0: none).
  size_t RowUnits() const;

  // The next candidate group with enough reports in the row, or kDone.
  void StartGroup();

  // Group g's WorkFit takes the row (at most WorkFit::kMaxPoints of its
  // steps, evenly spread) before its steps are judged with it.
  void FitWork(uint32_t g);
  // What is taken off the log time of the i-th step of group g's bucket for
  // its work (0 in a row without work).
  double WorkLog(uint32_t g, size_t i) const {
    return row_work_ ? states_[g].work.LogCost(groups_.BucketWork(g)[i]) : 0.0;
  }
  // How a message names group g's median: "0.41s", or "0.41s at 5e+03
  // units of work" where it judges per unit of work.
  std::string MedianText(const GroupState& gs) const;

  // A group's stages (kGroupCount .. kGroupMembers).
  void GroupStep(size_t& budget);

  void StartNoise(uint32_t g, double m);

  // The group's row-wide state from its median and noise: steady median,
  // thresholds, whether it still profiles. Steps go into the windows with
  // each rank's verdict (JudgeMember; GroupXs keeps them) unless the whole
  // group must hold them first: the rate median every kRateRows rows, the
  // generation check at the end of the profile (kGroupPush).
  void EndGroupRowWide(uint32_t g);

  void AfterPush(uint32_t g);

  // A rank's step into its group's windows (and the group's profile).
  void PushStep(uint32_t g, uint32_t rank, double x);

  // The verdict on member `i` of group `g`'s bucket in this row, whose log
  // ratio is `x` (GroupXs(g)[i]).
  void JudgeMember(uint32_t g, size_t i, double x);

  // Group g's log ratios in this row (kept until its verdicts are given).
  std::vector<double>& GroupXs(uint32_t g);

  // The two-generation rule (docs/detection.md, "peer"): at the end of a
  // group's profile, when more than max_excluded_fraction of its ranks were
  // above the threshold throughout, they are another GPU generation, not
  // stragglers: they become a group of their own. ProfileMedian takes each
  // member's profile median (and frees its profile), SplitGenerations
  // decides; returns whether it split.
  void ProfileMedian(uint32_t rank);

  bool SplitGenerations(uint32_t g);

  // Ranks in groups too small to compare within: each against its own
  // baseline, normalised by the median change of every rank's own ratio in
  // the row (so a job-wide slowdown moves nobody).
  void JudgeOwn(const Row& row, double level, Time now);

  // The median rate of severe steps over `ranks` (robust to the few ranks
  // that are slow now).
  double MedianRate(const std::vector<std::pair<uint32_t, double>>& ranks);

  // `alone`: the step was judged alone (JudgeAlone). A straggler's quick way
  // back (RecentlyFast) then counts the group's drift between rows as noise
  // too: an excluded rank's steps and its reference come from different
  // times, so a 3x rank looked 1.7x for three steps while its group ran
  // slower under a CPU hog, and was readmitted while still slow (issue 28,
  // item 2). In a steady job the drift is small and the way back as quick.
  // Inline (peer_quiet.h): a rank Quiet() says nothing can change for is
  // done here, the others go through JudgeRule - most ranks, most rows,
  // skip the call.
  void Judge(uint32_t rank, double compute, uint64_t iteration, Time now, const GroupState& gs,
             bool alone, absl::FunctionRef<std::string(bool, double)> why);
  void JudgeRule(uint32_t rank, double compute, uint64_t iteration, Time now,
                 const GroupState& gs, bool alone,
                 absl::FunctionRef<std::string(bool, double)> why);
  // Whether JudgeRule would change nothing for `rank` (its step already in
  // the windows) against `gs`: healthy, nothing counted, no severe step,
  // windows surely below both thresholds.
  bool Quiet(uint32_t rank, const GroupState& gs) const;

  PeerGroups groups_;
  std::vector<GroupState> states_;
  GroupState own_state_;
  PeerLogs logs_p_;  // the policy's ratios as logs (refreshed per row and per lone report)
  double own_level_ = 0.0;  // log seconds: the job's level + the own-ratio median, newest row
  RankChunks<PeerRank> ranks_;
  PeerProfiles profiles_;
  // Own baseline: log(compute) minus the row's job level, over the rank's
  // first peer_profile_iterations rows (PeerProfiles::kOwn); its base = their
  // median. Apart from PeerRank, in chunks built on first use: a job whose
  // groups are all large enough takes none (8 bytes a rank less).
  RankChunks<double> bases_;
  std::vector<bool> have_base_;  // per rank: its own baseline is taken (bases_)
  size_t based_ranks_ = 0;          // how many have one
  std::vector<std::pair<uint32_t, double>> own_;
  std::vector<double> logs_, xs_, rates_, steady_, scratch_;
  // The row being judged (BeginRow .. EndRow; the engine keeps it in place)
  // and where JudgeSlice is in it.
  const Row* row_ = nullptr;
  uint64_t row_iteration_ = 0;
  Time row_now_{};
  Stage stage_ = Stage::kDone;
  size_t pos_ = 0;  // the stage's next value
  bool gathering_ = false;  // MedianPasses is in its second pass
  bool have_level_ = false;
  bool have_prev_level_ = false;  // level_ holds an earlier row's (SlicedMedian's guess)
  double level_ = 0.0;
  SlicedMedian level_median_;
  std::vector<uint32_t> candidates_;  // groups large enough to compare within, in order
  size_t next_candidate_ = 0;         // the one being worked on
  std::vector<uint32_t> prepared_;    // those whose ranks got steps or verdicts
  bool large_ = false;                // its medians in two passes (group_median_, rate_median_)
  SlicedMedian group_median_;
  BandMedian band_median_;  // a smaller group's median, in its logs' pass
  SlicedMedian rate_median_;  // a large group's median rate of severe steps
  double median_ = 0.0;  // its log median in the row
  double noise_cap_ = 0.0, noise_sum_ = 0.0;
  // The row's slow-side sum (GroupState::AddUpper), taken only where the
  // group judges per unit of work.
  double upper_sum_ = 0.0;
  bool per_work_ = false;
  // Judged per unit of work: the sum of the row's members' log costs (their
  // mean is the row's typical work, what time alone is measured from) and of
  // their squared log ratios on time alone (GroupState::AddTime).
  double cost_sum_ = 0.0, time2_sum_ = 0.0;
  DataNotes data_;
  std::vector<std::vector<double>> group_xs_;  // per group: its log ratios in the row
  std::vector<std::pair<double, uint32_t>> meds_;
  bool row_work_ = false;  // the row being judged has work (Row::work)
  std::vector<std::pair<double, double>> fit_points_;
};

}  // namespace straggler::engine::internal
