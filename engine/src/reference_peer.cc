// The peer reference (docs/detection.md, "peer"): each step's log ratio to
// the median of the rank's peer group in the same row - or, in a group too
// small to compare within, to the rank's own baseline, normalised by the
// median change of every rank's own ratio - judged over a window with spikes
// left out, a noise-scaled threshold, persistence and hysteresis.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "absl/strings/str_format.h"
#include "engine_impl.h"
#include "peer_groups.h"
#include "peer_state.h"
#include "peer_steps.h"
#include "reference.h"
#include "sliced_median.h"

namespace straggler::engine::internal {
namespace {

// A straggler is healthy again when its trimmed mean is below this share of
// the threshold (in log ratio), and below kExitRatio, for peer_exit_rows
// rows: hysteresis wide enough that a rank slow near the threshold (a ramp
// passing it, a 1.3x rank in noisy steps) stays flagged.
constexpr double kExitShare = 0.5;
constexpr double kExitRatio = 1.04;
const double kLogExitRatio = std::log(kExitRatio);
// How often a group's median rate of severe steps is taken again, in rows.
constexpr uint64_t kRateRows = 16;
// (Or sooner after a clear episode: PeerSteps::RecentlyFast.)

class PeerReference final : public Reference {
 public:
  using Reference::Reference;

  void OnRow(Row& row, Time now) override {
    BeginRow(row, now);
    JudgeSlice(std::numeric_limits<size_t>::max());
    EndRow(row, now);
  }

  // Plans the row: its buckets, which groups are judged, which ranks still
  // profile their own baselines. The work itself is JudgeSlice's.
  size_t BeginRow(Row& row, Time now) override {
    Sync();
    const PolicyConfig& p = e_.policy;
    RefreshLogs();
    groups_.Bucketize(row);
    row_ = &row;
    row_iteration_ = row.iteration;
    row_now_ = now;
    have_level_ = false;
    own_.clear();
    candidates_.clear();
    prepared_.clear();
    for (uint32_t g = 0; g < groups_.size(); ++g) {
      const auto& bucket = groups_.Bucket(g);
      if (bucket.empty()) continue;
      if (groups_.Members(g) < p.peer_min_group) {
        own_.insert(own_.end(), bucket.begin(), bucket.end());
        continue;
      }
      candidates_.push_back(g);
    }
    next_candidate_ = 0;
    pos_ = 0;
    // Own baselines first (every rank's, while some have none): the row's
    // first work, against the job's level in the row.
    if (based_ranks_ >= ranks_.size()) {
      stage_ = Stage::kGroupStart;
    } else if (row.values.size() >= kSlicedMedianMin) {
      level_median_.Begin(have_prev_level_ ? level_ : SafeLog(row.values.front().second),
                          kLevelScale);
      stage_ = Stage::kLevelCount;
    } else {
      stage_ = Stage::kOwn;
    }
    return stage_ == Stage::kDone ? 0 : 1;
  }

  // The row's work in order, `budget` units at a time (docs/detection.md,
  // "Large rows"): the job's level and the own baselines' steps, then per
  // group its log ratios, median, noise and thresholds, its steps where the
  // whole group must hold them first (the rate median, the generation
  // check), and its verdicts. A unit is one rank's step or verdict, or a few
  // values of a cheaper pass. Groups, buckets and states are looked up
  // again each time (a split adds a group). Returns nonzero while work is
  // left.
  size_t JudgeSlice(size_t budget) override {
    while (budget > 0 && stage_ != Stage::kDone) Step(budget);
    return stage_ == Stage::kDone ? 0 : 1;
  }

  // Ranks too small to compare within, then the views.
  void EndRow(Row& row, Time now) override {
    if (!own_.empty()) JudgeOwn(row, Level(row), now);
    ReleaseFreedProfiles();
    // Views show one reference: the largest judged group's.
    size_t shown = kNone;
    for (uint32_t g : prepared_)
      if (states_[g].judged &&
          (shown == kNone || groups_.Members(g) > groups_.Members(static_cast<uint32_t>(shown))))
        shown = g;
    if (shown != kNone) {
      const GroupState& gs = states_[shown];
      e_.baseline = gs.median;
      e_.threshold = gs.median * std::exp(gs.threshold);
      e_.have_threshold = true;
    } else if (own_state_.profiled) {
      e_.baseline = own_state_.median;
      e_.threshold = own_state_.median * std::exp(own_state_.threshold);
      e_.have_threshold = true;
    }
  }

  // A report judged alone (shadow recovery, a late report): against the
  // reference its rank had in the newest row, one step at a time.
  Verdict Single(uint32_t rank, double compute_seconds) const override {
    const double ref = BaselineOf(rank);
    if (ref <= 0.0) return Verdict::kNone;
    const PeerRank& pr = ranks_[rank];
    const double thr =
        pr.source == Source::kGroup ? states_[pr.group].threshold : own_state_.threshold;
    const double x = SafeLog(compute_seconds) - SafeLog(ref);
    if (x >= thr) return Verdict::kSlow;
    if (x < kExitShare * thr) return Verdict::kFast;
    return Verdict::kNone;
  }

  double BaselineOf(uint32_t rank) const override {
    if (rank >= ranks_.size()) return 0.0;
    const PeerRank& pr = ranks_[rank];
    if (pr.source == Source::kGroup && pr.group < states_.size() && states_[pr.group].profiled)
      return states_[pr.group].median;
    if (pr.source == Source::kOwn && have_base_[rank] && own_state_.profiled)
      return std::exp(own_level_ + pr.base);
    return 0.0;
  }

  // An excluded rank's report (shadow recovery) or a late one: into its
  // window against its group's steady median (its own baseline at the job's
  // newest speed), judged by the same rule as in a row, so that one step
  // does not decide - except for the quick way back (Judge's `alone`): its
  // steps ran at other times than the rows it is compared with.
  bool JudgeAlone(uint32_t rank, const Report& rep, Time now) override {
    if (rank >= ranks_.size()) return false;
    Sync();
    RefreshLogs();
    PeerRank& pr = ranks_[rank];
    if (pr.source == Source::kNone && groups_.synced()) {
      // Never judged in a row yet (a late joiner, a rank back from silence,
      // a straggler restored by a restarted daemon): its group's reference
      // judges it from its first report, so a joiner slow from its start is
      // not given the readmission delay for free.
      const uint32_t g = groups_.Of(rank);
      // A rank taking part: only a report of the group's current stretch
      // (old reports sent again after a reconnect are not judged against a
      // median of other times). An excluded rank's shadow steps lag the
      // group's rows by design (it is paced by the job, never ahead of it),
      // so for it the iteration says nothing about when the step ran: it is
      // judged from its first report - restored after a restart, it would
      // otherwise never be placed in its group, never readmitted.
      if (g < states_.size() && states_[g].profiled &&
          groups_.Members(g) >= e_.policy.peer_min_group &&
          (rep.iteration + JobEngine::kRowGraceIterations >= states_[g].iteration ||
           Excludes(e_.Newest(), rank)))
        pr.Restart(Source::kGroup, g);
    }
    const double x = SafeLog(rep.compute_seconds);
    if (pr.source == Source::kGroup && pr.group < states_.size() && states_[pr.group].profiled) {
      const GroupState& gs = states_[pr.group];
      const double steady = gs.steady_log;
      pr.steps.Push(logs_p_, x - steady);
      const uint32_t g = pr.group;
      Judge(rank, rep.compute_seconds, rep.iteration, now, gs, /*alone=*/true,
            [&](bool to_straggler, double ratio) {
              return absl::StrFormat("rank %u (%s) %s %.3g× its group's recent median %.3gs, "
                                     "judged alone",
                                     rank, groups_.Label(g), to_straggler ? "at" : "back to",
                                     ratio, std::exp(steady));
            });
      return true;
    }
    if (pr.source == Source::kOwn && have_base_[rank] && own_state_.profiled) {
      const double ref = own_level_ + pr.base;
      pr.steps.Push(logs_p_, x - ref);
      Judge(rank, rep.compute_seconds, rep.iteration, now, own_state_, /*alone=*/true,
            [&](bool to_straggler, double ratio) {
              return absl::StrFormat("rank %u (%s) %s %.3g× its own baseline %.3gs, judged alone",
                                     rank, groups_.Label(groups_.Of(rank)),
                                     to_straggler ? "at" : "back to", ratio, std::exp(ref));
            });
      return true;
    }
    return false;
  }

  void OnRuleChanged(uint64_t, Time) override {
    // Another policy judged meanwhile: start every window over.
    for (PeerRank& pr : ranks_) pr.Restart(Source::kNone, 0);
  }

 private:
  static constexpr size_t kNone = std::numeric_limits<size_t>::max();

  static double SafeLog(double t) { return std::log(std::max(t, 1e-9)); }

  // Every rank's profiles are freed in the same few rows: in a large job
  // that leaves hundreds of megabytes free inside the heap, which the
  // allocator keeps resident; hand them back (once per job start, not per
  // row: malloc_trim walks the heap).
  void ReleaseFreedProfiles() {
    static constexpr size_t kTrimAfter = 65536;
    if (freed_profiles_ < kTrimAfter) return;
    freed_profiles_ = 0;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
  }

  void RefreshLogs() {
    if (!logs_p_.Refresh(e_.policy)) return;
    for (PeerRank& pr : ranks_) pr.steps.Recount(logs_p_);  // a new peer_severe_ratio
  }

  void Sync() {
    if (ranks_.size() != e_.world_size) {
      ranks_.resize(e_.world_size);
      have_base_.resize(e_.world_size);
    }
    if (!groups_.Sync(e_.topology, e_.topology_version)) return;
    // A new group profiles from scratch; a rank that moved starts its window
    // over in its new group; everyone else goes on.
    states_.resize(groups_.size());
    for (uint32_t r = 0; r < ranks_.size(); ++r) {
      if (!groups_.Moved(r)) continue;
      ranks_[r].Restart(Source::kNone, 0);
      if (ranks_[r].profiles) {
        ranks_[r].profiles->gen.clear();
        ranks_[r].Tidy();
      }
    }
  }

  // The thresholds (log ratio) for `gs`'s noise variance, once per row:
  // the short window's, and the long window's - the noise term shrunk by
  // the square root of how many more steps it averages.
  void SetThresholds(GroupState& gs) const {
    const PolicyConfig& p = e_.policy;
    gs.threshold = std::max(std::log(p.peer_enter_ratio), p.peer_noise_z * std::sqrt(gs.noise2));
    gs.threshold_long = std::max(
        logs_p_.enter, p.peer_noise_z * std::sqrt(gs.noise2) *
                           std::sqrt(static_cast<double>(std::max<size_t>(p.peer_window, 2) - 1) /
                                     static_cast<double>(kLong - kLongTrim)));
  }

  // The job's level in `row`: own baselines are taken against it. A median
  // over the whole row, so only computed where needed (while some rank
  // still profiles its own baseline, or some group is too small to compare
  // within), once per row.
  double Level(const Row& row) {
    if (!have_level_) {
      logs_.clear();
      for (auto& [rank, t] : row.values) logs_.push_back(SafeLog(t));
      level_ = Median(logs_);
      have_level_ = have_prev_level_ = true;
    }
    return level_;
  }

  // A rank's step into its own baseline's profile, against the row's level.
  void ProfileOwn(uint32_t rank, double t) {
    if (have_base_[rank]) return;  // dense: no visit to a cold PeerRank
    const uint32_t iterations = e_.policy.peer_profile_iterations;
    PeerRank& pr = ranks_[rank];
    std::vector<double>& own = pr.Profiling(iterations).own;
    own.push_back(SafeLog(t) - Level(*row_));
    if (own.size() < iterations) return;
    pr.base = Median(own);
    have_base_[rank] = 1;
    ++based_ranks_;
    own.clear();
    own.shrink_to_fit();
    freed_profiles_ += pr.Tidy();
  }

  // The stages of a row's work (JudgeSlice), in order: the job's level (a
  // large row: two passes), the own baselines' steps, then for each judged
  // group from kGroupStart: its log ratios (and a large group's median in
  // two passes), its noise, its steps where the whole group needs them
  // first, the generation check at the end of its profile, its verdicts.
  enum class Stage : uint8_t {
    kLevelCount,
    kLevelGather,
    kOwn,
    kGroupStart,
    kGroupCount,
    kGroupGather,
    kGroupNoise,
    kGroupPush,
    kGroupGenerations,
    kGroupMembers,
    kDone,
  };
  // A row or group at least this large takes its median in two passes
  // (SlicedMedian); a smaller one at once.
  static constexpr size_t kSlicedMedianMin = 4096;
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
  bool Pass(size_t n, size_t per_unit, size_t& budget, F&& f) {
    if (pos_ < n) {
      const size_t todo = n - pos_;
      const size_t units = (todo + per_unit - 1) / per_unit;
      const size_t end = budget >= units ? n : pos_ + budget * per_unit;
      budget -= std::min(budget, units);
      for (; pos_ < end; ++pos_) f(pos_);
      if (pos_ < n) return false;
    }
    pos_ = 0;
    return true;
  }

  // One stage's work, or as much of it as `budget` allows.
  void Step(size_t& budget) {
    const auto& values = row_->values;
    switch (stage_) {
      case Stage::kLevelCount:
        if (!Pass(values.size(), kLogsPerUnit, budget,
                  [&](size_t i) { level_median_.Count(SafeLog(values[i].second)); }))
          return;
        level_median_.Plan();
        stage_ = Stage::kLevelGather;
        return;
      case Stage::kLevelGather:
        if (!Pass(values.size(), kLogsPerUnit, budget,
                  [&](size_t i) { level_median_.Gather(SafeLog(values[i].second)); }))
          return;
        level_ = level_median_.Take();
        have_level_ = have_prev_level_ = true;
        stage_ = Stage::kOwn;
        return;
      case Stage::kOwn:
        if (!Pass(values.size(), 1, budget,
                  [&](size_t i) { ProfileOwn(values[i].first, values[i].second); }))
          return;
        stage_ = Stage::kGroupStart;
        return;
      case Stage::kGroupStart:
        StartGroup();
        return;
      default:
        GroupStep(budget);
        return;
    }
  }

  // The next candidate group with enough reports in the row, or kDone.
  void StartGroup() {
    while (next_candidate_ < candidates_.size()) {
      const uint32_t g = candidates_[next_candidate_];
      const size_t n = groups_.Bucket(g).size();
      if (n < e_.policy.peer_min_group) {  // too few of them reported
        ++next_candidate_;
        continue;
      }
      GroupXs(g).resize(n);
      large_ = n >= kSlicedMedianMin;
      if (large_) {
        // Around its last row's median; before it has one, the first step.
        const GroupState& gs = states_[g];
        const double sigma = gs.have_noise ? std::sqrt(gs.noise2) : 0.0;
        group_median_.Begin(gs.rows > 0 ? gs.median_log : SafeLog(groups_.Bucket(g)[0].second),
                            std::max(sigma, kMinScale));
      }
      stage_ = Stage::kGroupCount;
      return;
    }
    stage_ = Stage::kDone;
  }

  // A group's stages (kGroupCount .. kGroupMembers).
  void GroupStep(size_t& budget) {
    const uint32_t g = candidates_[next_candidate_];
    const auto& bucket = groups_.Bucket(g);
    std::vector<double>& xs = GroupXs(g);
    const size_t n = bucket.size();
    switch (stage_) {
      case Stage::kGroupCount:  // one log per report
        if (!Pass(n, kLogsPerUnit, budget, [&](size_t i) {
              xs[i] = SafeLog(bucket[i].second);
              if (large_) group_median_.Count(xs[i]);
            }))
          return;
        if (large_) {
          group_median_.Plan();
          stage_ = Stage::kGroupGather;
          return;
        }
        logs_.assign(xs.begin(), xs.end());  // Median reorders
        StartNoise(g, Median(logs_));
        return;
      case Stage::kGroupGather:
        if (!Pass(n, kCheapPerUnit, budget, [&](size_t i) { group_median_.Gather(xs[i]); }))
          return;
        StartNoise(g, group_median_.Take());
        return;
      case Stage::kGroupNoise:
        if (!Pass(n, kCheapPerUnit, budget, [&](size_t i) {
              xs[i] -= median_;
              noise_sum_ += GroupState::NoiseTerm(xs[i], logs_p_.spike, noise_cap_);
            }))
          return;
        EndGroupRowWide(g);
        return;
      case Stage::kGroupPush:
        if (!Pass(n, 1, budget, [&](size_t i) { PushStep(g, bucket[i].first, xs[i]); }))
          return;
        states_[g].slow_rate = MedianRate(bucket);
        AfterPush(g);
        return;
      case Stage::kGroupGenerations:
        if (!Pass(n, 1, budget, [&](size_t i) { ProfileMedian(bucket[i].first); })) return;
        if (SplitGenerations(g)) {
          ++next_candidate_;  // both parts profile again: no verdicts now
          stage_ = Stage::kGroupStart;
          return;
        }
        prepared_.push_back(g);
        stage_ = Stage::kGroupMembers;
        return;
      case Stage::kGroupMembers:
        if (!Pass(n, 1, budget, [&](size_t i) { JudgeMember(g, i); })) return;
        ++next_candidate_;
        stage_ = Stage::kGroupStart;
        return;
      default:
        return;
    }
  }

  void StartNoise(uint32_t g, double m) {
    median_ = m;
    noise_cap_ = states_[g].NoiseCap();
    noise_sum_ = 0.0;
    stage_ = Stage::kGroupNoise;
  }

  // The group's row-wide state from its median and noise: steady median,
  // thresholds, whether it still profiles. Steps go into the windows with
  // each rank's verdict (JudgeMember; GroupXs keeps them) unless the whole
  // group must hold them first: the rate median every kRateRows rows, the
  // generation check at the end of the profile (kGroupPush).
  void EndGroupRowWide(uint32_t g) {
    const PolicyConfig& p = e_.policy;
    GroupState& gs = states_[g];
    gs.AddNoise(noise_sum_, GroupXs(g).size());
    gs.median = std::exp(median_);
    gs.median_log = median_;
    gs.UpdateSteady(median_, steady_);
    gs.iteration = row_iteration_;
    gs.rows++;
    SetThresholds(gs);
    // Still profiling: steps only (the rate median would not be read before
    // the profile's last row takes it again).
    const bool profiling = !gs.profiled && gs.rows < p.peer_profile_iterations;
    // The rates move over hundreds of steps: a fresh median every
    // kRateRows rows is enough, and saves a pass over the group.
    gs.pushed = !profiling && (!gs.profiled || gs.rows % kRateRows == 0);
    gs.judged = !profiling;
    if (gs.pushed) {
      stage_ = Stage::kGroupPush;
      return;
    }
    AfterPush(g);
  }

  void AfterPush(uint32_t g) {
    GroupState& gs = states_[g];
    if (gs.judged && !gs.profiled) {  // the profile's end
      gs.profiled = true;
      if (!groups_.Split(g)) {
        meds_.clear();
        stage_ = Stage::kGroupGenerations;
        return;
      }
    }
    prepared_.push_back(g);
    stage_ = Stage::kGroupMembers;
  }

  // A rank's step into its group's windows (and the group's profile).
  void PushStep(uint32_t g, uint32_t rank, double x) {
    const GroupState& gs = states_[g];
    PeerRank& pr = ranks_[rank];
    if (pr.source != Source::kGroup || pr.group != g) pr.Restart(Source::kGroup, g);
    pr.steps.Push(logs_p_, x);
    if (!gs.profiled) pr.Profiling(e_.policy.peer_profile_iterations).gen.push_back(x);
  }

  // The verdict on member `i` of group `g`'s bucket in this row.
  void JudgeMember(uint32_t g, size_t i) {
    const GroupState& gs = states_[g];
    const auto& bucket = groups_.Bucket(g);
    // Not a structured binding: clang-14 (the fuzz build) cannot capture one.
    const uint32_t rank = bucket[i].first;
    const double t = bucket[i].second;
    if (!gs.pushed) PushStep(g, rank, GroupXs(g)[i]);
    if (!gs.judged) return;
    Judge(rank, t, row_iteration_, row_now_, gs, /*alone=*/false,
          [&](bool to_straggler, double ratio) {
            return to_straggler
                       ? absl::StrFormat("rank %u (%s) %.3g× its group's median %.3gs over its "
                                         "last steps (threshold %.3g×)",
                                         rank, groups_.Label(g), ratio, gs.median,
                                         std::exp(gs.threshold))
                       : absl::StrFormat("rank %u (%s) back to %.3g× its group's median %.3gs",
                                         rank, groups_.Label(g), ratio, gs.median);
          });
  }

  // Group g's log ratios in this row (kept until its verdicts are given).
  std::vector<double>& GroupXs(uint32_t g) {
    if (group_xs_.size() <= g) group_xs_.resize(g + 1);
    return group_xs_[g];
  }

  // The two-generation rule (docs/detection.md, "peer"): at the end of a
  // group's profile, when more than max_excluded_fraction of its ranks were
  // above the threshold throughout, they are another GPU generation, not
  // stragglers: they become a group of their own. ProfileMedian takes each
  // member's profile median (and frees its profile), SplitGenerations
  // decides; returns whether it split.
  void ProfileMedian(uint32_t rank) {
    PeerRank& pr = ranks_[rank];
    if (!pr.profiles) return;
    if (!pr.profiles->gen.empty()) meds_.emplace_back(Median(pr.profiles->gen), rank);
    pr.profiles->gen.clear();
    pr.profiles->gen.shrink_to_fit();
    freed_profiles_ += pr.Tidy();
  }

  bool SplitGenerations(uint32_t g) {
    // Slower than peers by the policy's smallest ratio (not the noise-scaled
    // threshold: two generations in one group inflate the measured noise).
    const double thr = std::log(e_.policy.peer_enter_ratio);
    size_t slow = 0;
    for (auto& [med, rank] : meds_) slow += med >= thr;
    if (slow < 2 || static_cast<double>(slow) <=
                        e_.policy.max_excluded_fraction * static_cast<double>(meds_.size()))
      return false;
    // Split at the widest gap between neighbouring profile medians.
    std::sort(meds_.begin(), meds_.end());
    size_t cut = 1;
    for (size_t i = 1; i < meds_.size(); ++i)
      if (meds_[i].first - meds_[i - 1].first > meds_[cut].first - meds_[cut - 1].first) cut = i;
    std::vector<uint32_t> slower;
    for (size_t i = cut; i < meds_.size(); ++i) slower.push_back(meds_[i].second);
    // Both parts profile again (the bucket dies with SplitOff: restart first).
    for (auto& [rank, t] : groups_.Bucket(g)) ranks_[rank].Restart(Source::kNone, 0);
    const uint32_t added = groups_.SplitOff(g, slower);
    states_.resize(groups_.size());
    states_[g] = GroupState{};
    states_[added] = GroupState{};
    return true;
  }

  // Ranks in groups too small to compare within: each against its own
  // baseline, normalised by the median change of every rank's own ratio in
  // the row (so a job-wide slowdown moves nobody).
  void JudgeOwn(const Row& row, double level, Time now) {
    logs_.clear();
    for (auto& [rank, t] : row.values)
      if (have_base_[rank]) logs_.push_back(SafeLog(t) - level - ranks_[rank].base);
    if (logs_.size() < 2) return;
    xs_ = logs_;
    const double norm = Median(logs_);
    own_level_ = level + norm;
    for (double& v : xs_) v -= norm;
    own_state_.UpdateNoise(xs_, logs_p_.spike);
    if (own_state_.rows % kRateRows == 0) own_state_.slow_rate = MedianRate(own_);
    SetThresholds(own_state_);
    own_state_.profiled = true;
    own_state_.rows++;
    for (auto& entry : own_) {
      // Not a structured binding: clang before 16 cannot capture one in the
      // lambda below (the fuzz build uses clang-14).
      const auto rank = entry.first;
      auto& t = entry.second;
      PeerRank& pr = ranks_[rank];
      if (!have_base_[rank]) continue;
      if (pr.source != Source::kOwn) pr.Restart(Source::kOwn, 0);
      own_state_.median = std::exp(own_level_ + pr.base);
      const double base_seconds = own_state_.median;
      pr.steps.Push(logs_p_, SafeLog(t) - level - pr.base - norm);
      Judge(rank, t, row.iteration, now, own_state_, /*alone=*/false,
            [&](bool to_straggler, double ratio) {
              return to_straggler
                         ? absl::StrFormat(
                               "rank %u (%s, too small to compare within) %.3g× its own "
                               "baseline %.3gs at the job's current speed (threshold %.3g×)",
                               rank, groups_.Label(groups_.Of(rank)), ratio, base_seconds,
                               std::exp(own_state_.threshold))
                         : absl::StrFormat("rank %u (%s) back to %.3g× its own baseline %.3gs",
                                           rank, groups_.Label(groups_.Of(rank)), ratio,
                                           base_seconds);
            });
    }
  }

  // The median rate of severe steps over `ranks` (robust to the few ranks
  // that are slow now).
  template <typename Pairs>
  double MedianRate(const Pairs& ranks) {
    rates_.clear();
    for (auto& entry : ranks) rates_.push_back(ranks_[entry.first].steps.Rate());
    return rates_.empty() ? PeerSteps{}.Rate() : Median(rates_);
  }

  // `alone`: the step was judged alone (JudgeAlone). A straggler's quick way
  // back (RecentlyFast) then counts the group's drift between rows as noise
  // too: an excluded rank's steps and its reference come from different
  // times, so a 3x rank looked 1.7x for three steps while its group ran
  // slower under a CPU hog, and was readmitted while still slow (issue 28,
  // item 2). In a steady job the drift is small and the way back as quick.
  template <typename Why>
  void Judge(uint32_t rank, double compute, uint64_t iteration, Time now, const GroupState& gs,
             bool alone, Why why) {
    const PolicyConfig& p = e_.policy;
    const double thr = gs.threshold;
    PeerRank& pr = ranks_[rank];
    const bool straggler = e_.ranks[rank].state == WorkerState::kStraggler;
    const PeerLogs& logs = logs_p_;
    if (pr.was_straggler && !straggler) {
      // It stopped being a straggler without this rule (it fell silent,
      // an operator reset the job).
      pr.StartOver(logs);
    }
    pr.was_straggler = straggler;
    const bool have_window = pr.steps.HaveWindow(logs);
    size_t recent = 0;
    const bool severe = pr.steps.Severe(gs.slow_rate, &recent);
    const double thr_long = gs.threshold_long;
    // A healthy rank's windows sit far below both thresholds: the running
    // sums say so without a pass over them (same verdicts, PeerSteps).
    const bool above =
        (have_window && pr.steps.TrimmedMayReach(thr) && pr.steps.Trimmed() >= thr) ||
        (pr.steps.LongMayReach(thr_long) && pr.steps.LongTrimmed() >= thr_long);
    pr.above_rows = above ? pr.above_rows + 1 : 0;
    const uint32_t lim = e_.Limit();
    const WorkerState state = e_.ranks[rank].state;
    // Taken only where a rule reads them: most ranks are healthy and skip
    // the passes over their windows (TrimmedMayReach above).
    auto trimmed = [&] {
      return have_window ? pr.steps.Trimmed() : -std::numeric_limits<double>::infinity();
    };
    // Below this a straggler's window is back at its peers' level (the slow way back).
    const double level_back = std::min(kExitShare * thr, kLogExitRatio);
    // The gray zone and the exit for good (docs/detection.md, "peer", "States"):
    // `calm` is where a rank that is no straggler belongs; `error()` one
    // standard error of the window's mean (the group's noise over sqrt(window - 1)).
    WorkerState calm = state == WorkerState::kMild ? WorkerState::kMild : WorkerState::kHealthy;
    auto error = [&] {
      return std::sqrt(gs.noise2 / static_cast<double>(std::max<uint32_t>(logs.window, 2) - 1));
    };
    uint32_t counter;
    if (state == WorkerState::kStraggler) {
      const double tm = trimmed();
      pr.below_rows = tm < level_back && recent <= 1 ? pr.below_rows + 1 : 0;
      // Out for good: both windows below the straggler ratio by three
      // standard errors (a 1.3x rank in noisy steps is not let go and
      // flagged again) and at most one severe step of 5 (a 3x rank's steps
      // are spikes, left out of its windows).
      const bool gray = recent <= 1 && std::max(tm, pr.steps.LongTrimmed()) <
                                           logs.straggler - 3 * error();
      pr.gray_rows = gray ? pr.gray_rows + 1 : 0;
      pr.steps.AddToEpisode(logs);
      // Alone, the step and its reference come from different times: their
      // difference also holds how far the group's level moves between rows.
      const double noise2 = alone ? gs.noise2 + gs.drift2 : gs.noise2;
      const bool back = pr.below_rows >= p.peer_exit_rows ||
                        pr.steps.RecentlyFast(logs, std::sqrt(noise2));
      const bool out = !back && pr.gray_rows >= p.peer_exit_rows;
      counter = back || out ? 0 : lim;
      if (out && above) calm = WorkerState::kMild;
    } else {
      const bool enter = pr.above_rows >= p.peer_enter_rows || severe;
      // A straggler only at the straggler ratio. A young episode's window
      // lags its onset: it need only come within two standard errors (one
      // past half a window), so a 1.3x rank in noise is found in time; later
      // the long window must reach it. A rank that left the straggler state
      // (gray_rows marks it until back at its peers' level) restarted its
      // windows at its own level: nothing lags, no allowance.
      bool straggling = severe;
      if (enter && !straggling) {
        const bool young = pr.above_rows <= logs.window && pr.gray_rows == 0;
        const double level = young ? trimmed() : pr.steps.LongTrimmed();
        const double allowance =
            !young ? 0.0 : (2 * pr.above_rows <= logs.window ? 2 : 1) * error();
        straggling = level >= logs.straggler - allowance;
      }
      if (state == WorkerState::kMild) {
        pr.below_rows = have_window && !above ? pr.below_rows + 1 : 0;
        if (pr.below_rows >= p.peer_exit_rows) calm = WorkerState::kHealthy;
      } else {
        pr.below_rows =
            pr.gray_rows > 0 && have_window && trimmed() < level_back ? pr.below_rows + 1 : 0;
        if (pr.below_rows >= p.peer_exit_rows) pr.gray_rows = pr.below_rows = 0;
        // Mild once persistently so: a detection is not preceded by a mild event.
        if (enter && pr.above_rows > logs.window) calm = WorkerState::kMild;
      }
      counter = straggling ? lim : std::min(lim - 1, pr.above_rows);
    }
    // What a message shows: the median ratio of its last steps.
    e_.SetCounter(
        rank, counter, iteration, compute, now,
        [&](bool to_straggler) {
          const double ratio = pr.steps.RecentRatio();
          if (to_straggler || calm != WorkerState::kMild || state == WorkerState::kStraggler)
            return why(to_straggler, ratio);
          return absl::StrFormat("rank %u mild: %.3g× its reference over its last steps, "
                                 "below the straggler ratio %.3g×",
                                 rank, ratio, p.peer_straggler_ratio);
        },
        calm);
    const WorkerState now_state = e_.ranks[rank].state;
    const bool now_straggler = now_state == WorkerState::kStraggler;
    if (straggler && !now_straggler) {
      pr.StartOver(logs);
      pr.gray_rows = 1;  // its windows restart at its own level (above)
    }
    if (state == WorkerState::kMild && now_state == WorkerState::kHealthy) pr.below_rows = 0;
    if (now_straggler && !straggler) {
      pr.steps.StartEpisode();
      pr.below_rows = pr.gray_rows = 0;
    }
    pr.was_straggler = now_straggler;
  }

  PeerGroups groups_;
  std::vector<GroupState> states_;
  GroupState own_state_;
  PeerLogs logs_p_;  // the policy's ratios as logs (refreshed per row and per lone report)
  double own_level_ = 0.0;  // log seconds: the job's level + the own-ratio median, newest row
  std::vector<PeerRank> ranks_;
  size_t freed_profiles_ = 0;  // since the last ReleaseFreedProfiles
  std::vector<uint8_t> have_base_;  // per rank: its own baseline is taken (PeerRank::base)
  size_t based_ranks_ = 0;          // how many have one
  std::vector<std::pair<uint32_t, double>> own_;
  std::vector<double> logs_, xs_, rates_, steady_;
  // The row being judged (BeginRow .. EndRow; the engine keeps it in place)
  // and where JudgeSlice is in it.
  const Row* row_ = nullptr;
  uint64_t row_iteration_ = 0;
  Time row_now_{};
  Stage stage_ = Stage::kDone;
  size_t pos_ = 0;  // the stage's next value
  bool have_level_ = false;
  bool have_prev_level_ = false;  // level_ holds an earlier row's (SlicedMedian's guess)
  double level_ = 0.0;
  SlicedMedian level_median_;
  std::vector<uint32_t> candidates_;  // groups large enough to compare within, in order
  size_t next_candidate_ = 0;         // the one being worked on
  std::vector<uint32_t> prepared_;    // those whose ranks got steps or verdicts
  bool large_ = false;                // its median in two passes (group_median_)
  SlicedMedian group_median_;
  double median_ = 0.0;  // its log median in the row
  double noise_cap_ = 0.0, noise_sum_ = 0.0;
  std::vector<std::vector<double>> group_xs_;  // per group: its log ratios in the row
  std::vector<std::pair<double, uint32_t>> meds_;
};

}  // namespace

std::unique_ptr<Reference> MakePeerReference(EngineImpl& e) {
  return std::make_unique<PeerReference>(e);
}

}  // namespace straggler::engine::internal
