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
    const size_t left = BeginRow(row, now);
    if (left > 0) JudgeSlice(left);
    EndRow(row, now);
  }

  // The row-wide work: buckets, profiles, each group's median, noise and
  // thresholds (and its steps, where a rate median or the profile needs
  // them all first); the verdicts are JudgeSlice's.
  size_t BeginRow(Row& row, Time now) override {
    Sync();
    const PolicyConfig& p = e_.policy;
    RefreshLogs();
    groups_.Bucketize(row);
    row_ = &row;
    row_iteration_ = row.iteration;
    row_now_ = now;
    have_level_ = false;
    // Own baselines first (every rank's, while some have none): the row's
    // first work items.
    next_own_ = based_ranks_ < ranks_.size() ? 0 : row.values.size();
    size_t left = row.values.size() - next_own_;
    own_.clear();
    shown_ = kNone;
    judging_.clear();
    for (uint32_t g = 0; g < groups_.size(); ++g) {
      const auto& bucket = groups_.Bucket(g);
      if (bucket.empty()) continue;
      if (groups_.Members(g) < p.peer_min_group) {
        own_.insert(own_.end(), bucket.begin(), bucket.end());
        continue;
      }
      if (!PrepareGroup(g, bucket, row.iteration)) continue;
      judging_.push_back(g);
      left += groups_.Bucket(g).size();
      if (states_[g].judged &&
          (shown_ == kNone || groups_.Members(g) > groups_.Members(static_cast<uint32_t>(shown_))))
        shown_ = g;
    }
    next_group_ = 0;
    next_member_ = 0;
    return left;
  }

  // The row's work in order, `budget` items at a time: own baselines, then
  // each group's steps and verdicts. Groups and buckets are looked up again
  // each time (a split adds a group).
  size_t JudgeSlice(size_t budget) override {
    const std::vector<std::pair<uint32_t, double>>& values = row_->values;
    while (next_own_ < values.size() && budget > 0) {
      ProfileOwn(values[next_own_].first, values[next_own_].second);
      ++next_own_;
      --budget;
    }
    size_t left = values.size() - next_own_;
    while (next_group_ < judging_.size()) {
      const uint32_t g = judging_[next_group_];
      const size_t n = groups_.Bucket(g).size();
      while (next_member_ < n && budget > 0) {
        JudgeMember(g, next_member_++);
        --budget;
      }
      if (next_member_ < n) {
        left += n - next_member_;
        for (size_t k = next_group_ + 1; k < judging_.size(); ++k)
          left += groups_.Bucket(judging_[k]).size();
        return left;
      }
      ++next_group_;
      next_member_ = 0;
    }
    return left;
  }

  // Ranks too small to compare within, then the views.
  void EndRow(Row& row, Time now) override {
    if (!own_.empty()) JudgeOwn(row, Level(row), now);
    ReleaseFreedProfiles();
    // Views show one reference: the largest judged group's.
    if (shown_ != kNone) {
      const GroupState& gs = states_[shown_];
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
      have_level_ = true;
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

  // A group's row-wide work (median, noise, steady median, thresholds);
  // returns whether its ranks have work in this row (JudgeMember): their
  // steps, and verdicts unless the group still profiles (GroupState::judged).
  // Steps go into the windows here when the whole group must hold them first
  // (the rate median every kRateRows rows, the generation check at the end
  // of the profile), else with each rank's verdict (GroupXs keeps them).
  bool PrepareGroup(uint32_t g, const std::vector<std::pair<uint32_t, double>>& bucket,
                    uint64_t iteration) {
    const PolicyConfig& p = e_.policy;
    if (bucket.size() < p.peer_min_group) return false;  // too few of them reported
    GroupState& gs = states_[g];
    // One log per report: the group's xs holds them, logs_ a copy Median reorders.
    std::vector<double>& xs = GroupXs(g);
    xs.clear();
    for (auto& [rank, t] : bucket) xs.push_back(SafeLog(t));
    logs_.assign(xs.begin(), xs.end());
    const double m = Median(logs_);
    for (double& x : xs) x -= m;
    gs.UpdateNoise(xs, logs_p_.spike);
    gs.median = std::exp(m);
    gs.UpdateSteady(m, steady_);
    gs.iteration = iteration;
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
      for (size_t i = 0; i < bucket.size(); ++i) PushStep(g, gs, bucket[i].first, xs[i]);
      gs.slow_rate = MedianRate(bucket);
    }
    if (!gs.profiled && !profiling) {
      gs.profiled = true;
      if (CheckGenerations(g, bucket)) return false;
    }
    return true;
  }

  // A rank's step into its group's windows (and the group's profile).
  void PushStep(uint32_t g, const GroupState& gs, uint32_t rank, double x) {
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
    if (!gs.pushed) PushStep(g, gs, rank, GroupXs(g)[i]);
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
  // stragglers: they become a group of their own. Returns whether it split.
  bool CheckGenerations(uint32_t g, const std::vector<std::pair<uint32_t, double>>& bucket) {
    if (groups_.Split(g)) return false;
    meds_.clear();
    for (auto& [rank, t] : bucket) {
      PeerRank& pr = ranks_[rank];
      if (!pr.profiles || pr.profiles->gen.empty()) continue;
      meds_.emplace_back(Median(pr.profiles->gen), rank);
    }
    for (auto& [rank, t] : bucket) {
      PeerRank& pr = ranks_[rank];
      if (!pr.profiles) continue;
      pr.profiles->gen.clear();
      pr.profiles->gen.shrink_to_fit();
      freed_profiles_ += pr.Tidy();
    }
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
    // Both parts profile again (`bucket` dies with SplitOff: restart first).
    for (auto& [rank, t] : bucket) ranks_[rank].Restart(Source::kNone, 0);
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
  // The row being judged (BeginRow .. EndRow; the engine keeps it in place).
  const Row* row_ = nullptr;
  size_t next_own_ = 0;  // JudgeSlice's place in row_->values (own baselines)
  uint64_t row_iteration_ = 0;
  Time row_now_{};
  bool have_level_ = false;
  double level_ = 0.0;
  size_t shown_ = kNone;
  std::vector<uint32_t> judging_;  // groups whose ranks get verdicts, in order
  size_t next_group_ = 0;          // JudgeSlice's place in judging_
  size_t next_member_ = 0;         // and in that group's bucket
  std::vector<std::vector<double>> group_xs_;  // per group: its log ratios in the row
  std::vector<std::pair<double, uint32_t>> meds_;
};

}  // namespace

std::unique_ptr<Reference> MakePeerReference(EngineImpl& e) {
  return std::make_unique<PeerReference>(e);
}

}  // namespace straggler::engine::internal
