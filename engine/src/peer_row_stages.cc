// The peer reference's row in stages (docs/detection.md, "Large rows"):
// JudgeSlice's work - the job's level, the own baselines' steps, each group's
// logs, median, noise and thresholds, the steps its whole group needs first,
// the generation check, the verdicts - a budget at a time.
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "engine_impl.h"
#include "peer_quiet.h"
#include "reference_peer.h"

namespace straggler::engine::internal {

template <typename F>
bool PeerReference::Pass(size_t n, size_t per_unit, size_t& budget, F&& f) {
  if (pos_ < n) {
    const size_t todo = n - pos_;
    const size_t units = (todo + per_unit - 1) / per_unit;
    const size_t end = budget >= units ? n : pos_ + budget * per_unit;
    budget -= std::min(budget, units);
    // A local index: the member, stored each step, kept every other member
    // the step reads or sums from staying in a register.
    size_t i = pos_;
    for (; i < end; ++i) f(i);
    pos_ = i;
    if (pos_ < n) return false;
  }
  pos_ = 0;
  return true;
}

template <typename V>
bool PeerReference::MedianPasses(SlicedMedian& m, size_t n, size_t per_unit, size_t& budget,
                                 V&& value) {
  if (!gathering_) {
    if (!Pass(n, per_unit, budget, [&](size_t i) { m.Count(value(i)); })) return false;
    m.Plan();
    gathering_ = true;
  }
  if (!Pass(n, per_unit, budget, [&](size_t i) { m.Gather(value(i)); })) return false;
  gathering_ = false;
  return true;
}

void PeerReference::Step(size_t& budget) {
  const auto& values = row_->values;
  switch (stage_) {
    case Stage::kLevel:
      if (!MedianPasses(level_median_, values.size(), kLogsPerUnit, budget,
                        [&](size_t i) { return SafeLog(values[i].second); }))
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

void PeerReference::StartGroup() {
  while (next_candidate_ < candidates_.size()) {
    const uint32_t g = candidates_[next_candidate_];
    const size_t n = groups_.Bucket(g).size();
    if (n < e_.policy.peer_min_group) {  // too few of them reported
      ++next_candidate_;
      continue;
    }
    GroupXs(g).resize(n);
    if (row_work_) FitWork(g);
    cost_sum_ = 0.0;
    large_ = n >= kSlicedMedianMin;
    const GroupState& gs = states_[g];
    if (large_) {
      // Around its last row's median; before it has one, the first step.
      const double sigma = gs.have_noise ? std::sqrt(gs.noise2) : 0.0;
      group_median_.Begin(gs.rows > 0 ? gs.median_log : SafeLog(groups_.Bucket(g)[0].second),
                          std::max(sigma, kMinScale));
    } else {
      band_median_.Begin(gs.rows > 0 ? gs.median_log : std::numeric_limits<double>::quiet_NaN(),
                         gs.median_band, n);
    }
    stage_ = Stage::kGroupCount;
    return;
  }
  stage_ = Stage::kDone;
}

void PeerReference::GroupStep(size_t& budget) {
  const uint32_t g = candidates_[next_candidate_];
  const auto& bucket = groups_.Bucket(g);
  std::vector<double>& xs = GroupXs(g);
  const size_t n = bucket.size();
  switch (stage_) {
    case Stage::kGroupCount:  // one log per report
      if (!Pass(n, kLogsPerUnit, budget, [&](size_t i) {
            xs[i] = SafeLog(bucket[i].second);
            if (row_work_) {
              const double cost = WorkLog(g, i);
              xs[i] -= cost;
              cost_sum_ += cost;
            }
            if (large_)
              group_median_.Count(xs[i]);
            else
              band_median_.Add(xs[i]);
          }))
        return;
      if (large_) {
        group_median_.Plan();
        stage_ = Stage::kGroupGather;
        return;
      }
      {
        GroupState& gs = states_[g];
        const double m = band_median_.Take(xs, logs_);
        gs.median_band = band_median_.NextWidth(gs.have_noise ? std::sqrt(gs.noise2) : 0.0);
        StartNoise(g, m);
      }
      return;
    case Stage::kGroupGather:
      if (!Pass(n, kCheapPerUnit, budget, [&](size_t i) { group_median_.Gather(xs[i]); }))
        return;
      StartNoise(g, group_median_.Take());
      return;
    case Stage::kGroupNoise: {
      // The sums in locals (the same additions in the same order): summed
      // into members, each step waited on the last one's store (a double
      // member may alias xs), half of this pass's time.
      double noise = noise_sum_, upper = upper_sum_;
      const double m = median_, spike = logs_p_.spike, cap = noise_cap_;
      const bool per_work = per_work_;
      const bool done = Pass(n, kCheapPerUnit, budget, [&](size_t i) {
        const double x = xs[i] - m;
        xs[i] = x;
        const double term = GroupState::NoiseTerm(x, spike, cap);
        noise += term;
        if (per_work && x > 0) upper += 2 * term;
      });
      noise_sum_ = noise;
      upper_sum_ = upper;
      if (done) EndGroupRowWide(g);
      return;
    }
    case Stage::kGroupPush:
      if (!Pass(n, 1, budget, [&](size_t i) { PushStep(g, bucket[i].first, xs[i]); }))
        return;
      if (!large_) {
        states_[g].slow_rate = MedianRate(bucket);
        AfterPush(g);
        return;
      }
      // Around the last median rate (rates move over hundreds of steps), or
      // the prior before there is one.
      {
        const double last = states_[g].slow_rate > 0.0 ? states_[g].slow_rate : PeerSteps{}.Rate();
        rate_median_.Begin(last, last / 8);
      }
      stage_ = Stage::kGroupRates;
      return;
    case Stage::kGroupRates:
      if (!MedianPasses(rate_median_, n, kCheapPerUnit, budget,
                        [&](size_t i) { return ranks_[bucket[i].first].steps.Rate(); }))
        return;
      states_[g].slow_rate = rate_median_.Take();
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
      if (!Pass(n, 1, budget, [&](size_t i) { JudgeMember(g, i, xs[i]); })) return;
      if (per_work_) states_[g].AddTime(time2_sum_, n);
      ++next_candidate_;
      stage_ = Stage::kGroupStart;
      return;
    default:
      return;
  }
}

void PeerReference::StartNoise(uint32_t g, double m) {
  median_ = m;
  // Judged per unit of work: what the work does not explain (a unit that
  // misses part of the cost) has a heavy tail, which is the group's noise,
  // not a spike to winsorize (docs/detection.md, "Own time and work").
  per_work_ = row_work_ && states_[g].work.active();
  noise_cap_ = per_work_ ? std::numeric_limits<double>::infinity() : states_[g].NoiseCap();
  noise_sum_ = upper_sum_ = time2_sum_ = 0.0;
  stage_ = Stage::kGroupNoise;
}

void PeerReference::EndGroupRowWide(uint32_t g) {
  const PolicyConfig& p = e_.policy;
  GroupState& gs = states_[g];
  gs.AddNoise(noise_sum_, GroupXs(g).size());
  if (per_work_) gs.AddUpper(upper_sum_, GroupXs(g).size());
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

void PeerReference::AfterPush(uint32_t g) {
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

void PeerReference::PushStep(uint32_t g, uint32_t rank, double x) {
  const GroupState& gs = states_[g];
  PeerRank& pr = ranks_[rank];
  if (pr.source != Source::kGroup || pr.group != g) {
    pr.Restart(Source::kGroup, g);
    data_.Clear(rank);
  }
  pr.steps.Push(logs_p_, x);
  if (!gs.profiled) profiles_.Push(PeerProfiles::kGen, rank, x, ProfileRoom());
}

void PeerReference::JudgeMember(uint32_t g, size_t i, double x) {
  const GroupState& gs = states_[g];
  const auto& bucket = groups_.Bucket(g);
  // Not a structured binding: clang-14 (the fuzz build) cannot capture one.
  const uint32_t rank = bucket[i].first;
  const double t = bucket[i].second;
  if (!gs.pushed) PushStep(g, rank, x);
  if (per_work_) {
    // On time alone: from the row's per-work median at its mean work.
    const double n = static_cast<double>(bucket.size());
    const double y = SafeLog(t) - median_ - cost_sum_ / n;
    time2_sum_ += GroupState::NoiseTerm(y, logs_p_.spike, std::numeric_limits<double>::infinity());
    const double clip = logs_p_.spike;
    data_.Step(rank, e_.world_size, std::clamp(x, -clip, clip), std::clamp(y, -clip, clip),
               2.0 / (static_cast<double>(kLong) + 1.0));
  }
  if (!gs.judged) return;
  Judge(rank, t, row_iteration_, row_now_, gs, /*alone=*/false,
        [&](bool to_straggler, double ratio) {
          return to_straggler
                     ? absl::StrFormat("rank %u (%s) %.3g× its group's median %s over its "
                                       "last steps (threshold %.3g×)",
                                       rank, groups_.Label(g), ratio, MedianText(gs),
                                       std::exp(gs.threshold))
                     : absl::StrFormat("rank %u (%s) back to %.3g× its group's median %s",
                                       rank, groups_.Label(g), ratio, MedianText(gs));
        });
  if (per_work_) data_.Decide(rank, e_.ranks[rank].state == WorkerState::kHealthy, gs.threshold_time);
}

std::vector<double>& PeerReference::GroupXs(uint32_t g) {
  if (group_xs_.size() <= g) group_xs_.resize(g + 1);
  return group_xs_[g];
}

void PeerReference::ProfileMedian(uint32_t rank) {
  profiles_.CopyTo(PeerProfiles::kGen, rank, scratch_);
  if (scratch_.empty()) return;
  meds_.emplace_back(Median(scratch_), rank);
  profiles_.Clear(PeerProfiles::kGen, rank);
}

bool PeerReference::SplitGenerations(uint32_t g) {
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

}  // namespace straggler::engine::internal
