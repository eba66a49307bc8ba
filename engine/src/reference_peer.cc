// The peer reference's rule (docs/detection.md, "peer"), its reports judged
// alone and its own baselines; a row's work in stages is peer_row_stages.cc.
#include "reference_peer.h"

#include <memory>

#include "absl/strings/str_format.h"
#include "engine_impl.h"
#include "peer_quiet.h"

namespace straggler::engine::internal {
namespace {

// A straggler is healthy again when its trimmed mean is below this share of
// the threshold (in log ratio), and below kExitRatio, for peer_exit_rows
// rows: hysteresis wide enough that a rank slow near the threshold (a ramp
// passing it, a 1.3x rank in noisy steps) stays flagged.
constexpr double kExitShare = 0.5;
constexpr double kExitRatio = 1.04;
const double kLogExitRatio = std::log(kExitRatio);

// " at W units of work" where a group judges per unit of work (its
// median is then the time at the reference work W).
std::string PerWork(const WorkFit& fit) {
  return fit.active() ? absl::StrFormat(" at %.4g units of work", fit.reference_work())
                      : std::string();
}

}  // namespace

std::string PeerReference::MedianText(const GroupState& gs) const {
  return absl::StrFormat("%.3gs%s", gs.median, PerWork(gs.work));
}

void PeerReference::FitWork(uint32_t g) {
  WorkFit& fit = states_[g].work;
  if (!fit.WantsRow()) return fit.SkipRow();
  const auto& bucket = groups_.Bucket(g);
  const auto& work = groups_.BucketWork(g);
  const size_t stride = (bucket.size() + WorkFit::kMaxPoints - 1) / WorkFit::kMaxPoints;
  fit_points_.clear();
  for (size_t i = fit.Offset(stride); i < bucket.size(); i += stride)
    if (work[i] > 0 && std::isfinite(work[i]))
      fit_points_.emplace_back(SafeLog(bucket[i].second), work[i]);
  fit.AddRow(fit_points_);
}

void PeerReference::OnRow(Row& row, Time now) {
  BeginRow(row, now);
  JudgeSlice(std::numeric_limits<size_t>::max());
  EndRow(row, now);
}

size_t PeerReference::BeginRow(Row& row, Time now) {
  Sync();
  const PolicyConfig& p = e_.policy;
  RefreshLogs();
  groups_.Bucketize(row);
  row_ = &row;
  row_work_ = !row.work.empty();
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
    stage_ = Stage::kLevel;
  } else {
    stage_ = Stage::kOwn;
  }
  return RowUnits();
}

size_t PeerReference::RowUnits() const {
  if (stage_ == Stage::kDone) return 0;
  const size_t values = row_->values.size();
  size_t units = 1;
  if (stage_ == Stage::kLevel) units += 2 * (values / kLogsPerUnit);
  if (stage_ != Stage::kGroupStart) units += values;  // own baselines
  for (uint32_t g : candidates_) {
    const size_t n = groups_.Bucket(g).size();
    const GroupState& gs = states_[g];
    // Logs, median, noise and verdicts; at most (EndGroupRowWide decides)
    // steps first and a rate median, and the generation check.
    units += n / kLogsPerUnit + 2 * (n / kCheapPerUnit) + n + 1;
    if (!gs.profiled || (gs.rows + 1) % kRateRows == 0) units += n + 2 * (n / kCheapPerUnit);
    if (!gs.profiled) units += n;
  }
  return units;
}

size_t PeerReference::JudgeSlice(size_t budget) {
  while (budget > 0 && stage_ != Stage::kDone) Step(budget);
  return stage_ == Stage::kDone ? 0 : 1;
}

void PeerReference::EndRow(Row& row, Time now) {
  if (!own_.empty()) JudgeOwn(row, Level(row), now);
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

Verdict PeerReference::Single(uint32_t rank, const Report& rep) const {
  const double ref = BaselineOf(rank);
  if (ref <= 0.0) return Verdict::kNone;
  const PeerRank& pr = ranks_[rank];
  const bool in_group = pr.source == Source::kGroup && pr.group < states_.size();
  const double thr = in_group ? states_[pr.group].threshold : own_state_.threshold;
  const double cost = in_group ? states_[pr.group].work.LogCost(rep.work) : 0.0;
  const double x = SafeLog(rep.OwnSeconds()) - cost - SafeLog(ref);
  if (x >= thr) return Verdict::kSlow;
  if (x < kExitShare * thr) return Verdict::kFast;
  return Verdict::kNone;
}

double PeerReference::BaselineOf(uint32_t rank) const {
  if (rank >= ranks_.size()) return 0.0;
  const PeerRank& pr = ranks_[rank];
  if (pr.source == Source::kGroup && pr.group < states_.size() && states_[pr.group].profiled)
    return states_[pr.group].median;
  if (pr.source == Source::kOwn && have_base_[rank] && own_state_.profiled)
    return std::exp(own_level_ + bases_[rank]);
  return 0.0;
}

bool PeerReference::JudgeAlone(uint32_t rank, const Report& rep, Time now) {
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
  const double own = rep.OwnSeconds();
  const double x = SafeLog(own);
  if (pr.source == Source::kGroup && pr.group < states_.size() && states_[pr.group].profiled) {
    const GroupState& gs = states_[pr.group];
    const double steady = gs.steady_log;
    pr.steps.Push(logs_p_, x - gs.work.LogCost(rep.work) - steady);
    const uint32_t g = pr.group;
    Judge(rank, own, rep.iteration, now, gs, /*alone=*/true,
          [&](bool to_straggler, double ratio) {
            return absl::StrFormat("rank %u (%s) %s %.3g× its group's recent median %.3gs%s, "
                                   "judged alone",
                                   rank, groups_.Label(g), to_straggler ? "at" : "back to",
                                   ratio, std::exp(steady), PerWork(gs.work));
          });
    return true;
  }
  if (pr.source == Source::kOwn && have_base_[rank] && own_state_.profiled) {
    const double ref = own_level_ + bases_[rank];
    pr.steps.Push(logs_p_, x - ref);
    Judge(rank, own, rep.iteration, now, own_state_, /*alone=*/true,
          [&](bool to_straggler, double ratio) {
            return absl::StrFormat("rank %u (%s) %s %.3g× its own baseline %.3gs, judged alone",
                                   rank, groups_.Label(groups_.Of(rank)),
                                   to_straggler ? "at" : "back to", ratio, std::exp(ref));
          });
    return true;
  }
  return false;
}

void PeerReference::OnRuleChanged(uint64_t, Time) {
  // Another policy judged meanwhile: start every window over.
  ranks_.ForEachBuilt([](PeerRank& pr) { pr.Restart(Source::kNone, 0); });
}

size_t PeerReference::ProfileRoom() const {
  return std::min<size_t>(e_.policy.peer_profile_iterations, 64);
}

void PeerReference::RefreshLogs() {
  if (logs_p_.Refresh(e_.policy)) Recount();
}

void PeerReference::Recount() {
  // A new peer_severe_ratio (ranks never built have no steps to count).
  ranks_.ForEachBuilt([&](PeerRank& pr) { pr.steps.Recount(logs_p_); });
}

void PeerReference::Sync() {
  if (ranks_.size() == e_.world_size && groups_.Current(e_.topology, e_.topology_version)) return;
  SyncChanged();
}

void PeerReference::SyncChanged() {
  if (ranks_.size() != e_.world_size) {
    ranks_.resize(e_.world_size);
    bases_.resize(e_.world_size);
    have_base_.resize(e_.world_size);
    profiles_.Resize(e_.world_size);
  }
  if (!groups_.Sync(e_.topology, e_.topology_version)) return;
  // A new group profiles from scratch; a rank that moved starts its window
  // over in its new group; everyone else goes on.
  states_.resize(groups_.size());
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    if (!groups_.Moved(r)) continue;
    // A job's first Sync moves every rank: those never built are at the start.
    if (PeerRank* pr = ranks_.Find(r)) pr->Restart(Source::kNone, 0);
    profiles_.Clear(PeerProfiles::kGen, r);
  }
}

void PeerReference::SetThresholds(GroupState& gs) const {
  const PolicyConfig& p = e_.policy;
  const double sigma = gs.SigmaForThresholds();
  // The long window's threshold: the short one's, shrunk by the square root
  // of how many more steps it averages.
  const double longer = std::sqrt(static_cast<double>(std::max<size_t>(p.peer_window, 2) - 1) /
                                  static_cast<double>(kLong - kLongTrim));
  gs.threshold = std::max(std::log(p.peer_enter_ratio), p.peer_noise_z * sigma);
  gs.threshold_long = std::max(logs_p_.enter, p.peer_noise_z * sigma * longer);
  // On time alone, as the long window would judge it (DataNotes weighs
  // about kLong steps).
  gs.threshold_time =
      gs.have_time ? std::max(logs_p_.enter, p.peer_noise_z * std::sqrt(gs.time2) * longer) : 0.0;
}

double PeerReference::Level(const Row& row) {
  if (!have_level_) {
    logs_.clear();
    for (auto& [rank, t] : row.values) logs_.push_back(SafeLog(t));
    level_ = Median(logs_);
    have_level_ = have_prev_level_ = true;
  }
  return level_;
}

void PeerReference::ProfileOwn(uint32_t rank, double t) {
  if (have_base_[rank]) return;  // dense: no visit to a cold PeerRank
  const uint32_t iterations = e_.policy.peer_profile_iterations;
  profiles_.Push(PeerProfiles::kOwn, rank, SafeLog(t) - Level(*row_), ProfileRoom());
  if (profiles_.Count(PeerProfiles::kOwn, rank) < iterations) return;
  profiles_.CopyTo(PeerProfiles::kOwn, rank, scratch_);
  bases_[rank] = Median(scratch_);
  have_base_[rank] = true;
  ++based_ranks_;
  profiles_.Clear(PeerProfiles::kOwn, rank);
}

void PeerReference::JudgeOwn(const Row& row, double level, Time now) {
  logs_.clear();
  for (auto& [rank, t] : row.values)
    if (have_base_[rank]) logs_.push_back(SafeLog(t) - level - bases_[rank]);
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
    own_state_.median = std::exp(own_level_ + bases_[rank]);
    const double base_seconds = own_state_.median;
    pr.steps.Push(logs_p_, SafeLog(t) - level - bases_[rank] - norm);
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

double PeerReference::MedianRate(const std::vector<std::pair<uint32_t, double>>& ranks) {
  rates_.clear();
  for (auto& entry : ranks) rates_.push_back(ranks_[entry.first].steps.Rate());
  return rates_.empty() ? PeerSteps{}.Rate() : Median(rates_);
}

void PeerReference::JudgeRule(uint32_t rank, double compute, uint64_t iteration, Time now,
                              const GroupState& gs, bool alone,
                              absl::FunctionRef<std::string(bool, double)> why) {
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
  pr.SetAbove(above ? PeerRank::Bump(pr.above_rows) : 0);
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
    pr.SetBelow(tm < level_back && recent <= 1 ? PeerRank::Bump(pr.below_rows) : 0);
    // Out for good: both windows below the straggler ratio by three
    // standard errors (a 1.3x rank in noisy steps is not let go and
    // flagged again) and at most one severe step of 5 (a 3x rank's steps
    // are spikes, left out of its windows).
    const bool gray = recent <= 1 && std::max(tm, pr.steps.LongTrimmed()) <
                                         logs.straggler - 3 * error();
    pr.SetGray(gray ? PeerRank::Bump(pr.gray_rows) : 0);
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
      pr.SetBelow(have_window && !above ? PeerRank::Bump(pr.below_rows) : 0);
      if (pr.below_rows >= p.peer_exit_rows) calm = WorkerState::kHealthy;
    } else {
      const bool back_below = pr.gray_rows > 0 && have_window && trimmed() < level_back;
      pr.SetBelow(back_below ? PeerRank::Bump(pr.below_rows) : 0);
      if (pr.below_rows >= p.peer_exit_rows) pr.gray_rows = pr.below_rows = 0;
      // Mild once persistently so: a detection is not preceded by a mild event.
      if (enter && pr.above_rows > logs.window) calm = WorkerState::kMild;
    }
    counter = straggling ? lim : std::min<uint32_t>(lim - 1, pr.above_rows);
    // Most ranks, most rows: healthy and staying so, with nothing counted.
    // SetCounter would change nothing (a limit is >= 1) and neither would
    // what follows it.
    if (counter == 0 && state == WorkerState::kHealthy && calm == WorkerState::kHealthy &&
        e_.ranks[rank].counter == 0)
      return;
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

std::unique_ptr<Reference> MakePeerReference(EngineImpl& e) {
  return std::make_unique<PeerReference>(e);
}

}  // namespace straggler::engine::internal
