// The public JobEngine: forwarding to its EngineImpl (engine_impl.h lists
// which file holds which concern), the operator's calls and the views.
#include "straggler/engine/job_engine.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "engine_impl.h"
#include "events.h"

namespace straggler::engine {

namespace internal {

EngineImpl::EngineImpl(uint32_t world, PolicyConfig p, Time now)
    : world_size(world),
      policy(std::move(p)),
      ranks(world),
      topology(world),
      monitor_only(world, false),
      created_at(now),
      reference(MakeReference(*this)),
      log(world, policy.lead_iterations, now) {}

}  // namespace internal

JobEngine::JobEngine(uint32_t world_size, PolicyConfig policy, Time now) {
  assert(world_size > 0);
  assert(policy.Validate().ok());
  impl_ = std::make_unique<Impl>(world_size, std::move(policy), now);
}

JobEngine::~JobEngine() = default;

IngestResult JobEngine::Ingest(const Report& report, Time now) {
  return impl_->Ingest(report, now);
}

void JobEngine::Tick(Time now) { impl_->TickOrWait(now); }

void JobEngine::Announce(uint32_t rank, Time now) {
  impl_->FinishRow();
  impl_->Announce(rank, now);
}

void JobEngine::BeginBatch() {
  assert(!impl_->batch_open && "batches do not nest");
  impl_->batch_open = true;
}

void JobEngine::EndBatch(Time now) {
  Impl& d = *impl_;
  d.batch_open = false;
  if (d.batch_evaluate) {
    d.batch_evaluate = false;
    d.Evaluate(now);  // not while a sliced row is judged: then at its end
  }
}

void JobEngine::Restart(uint32_t rank) {
  Impl& d = *impl_;
  d.FinishRow();
  if (rank >= d.world_size) return;
  auto& r = d.ranks[rank];
  r.has_progress = false;
  r.last_iteration = 0;
  d.top_stale = true;
}

void JobEngine::Finish(uint32_t rank, Time now) {
  impl_->FinishRow();
  impl_->Finish(rank, now);
}

bool JobEngine::Finished() const { return impl_->Finished(); }

void JobEngine::Lose(Time now, std::string why) {
  Impl& d = *impl_;
  d.FinishRow();
  if (d.lost || d.Finished()) return;
  d.lost = true;
  d.Emit(internal::JobEvent(EventKind::kJobLost, now, d.Highest(), d.Newest().version,
                            std::move(why)));
}

bool JobEngine::Lost() const { return impl_->lost; }

bool JobEngine::Ended() const { return impl_->lost || impl_->Finished(); }

void JobEngine::StartOver(uint64_t first_version, Time now) {
  Impl& old = *impl_;
  old.FinishRow();
  auto fresh = std::make_unique<Impl>(old.world_size, old.policy, now);
  fresh->iterations_per_epoch = old.iterations_per_epoch;
  fresh->epoch_length_announced = old.epoch_length_announced;
  fresh->topology = old.topology;  // the job's shape, not state
  fresh->topology_version = old.topology_version + 1;
  fresh->monitor_only = old.monitor_only;  // the clients', as the topology
  Membership m = fresh->Newest();
  m.version = first_version;
  m.lead_iterations = static_cast<uint32_t>(old.Lead());
  for (uint32_t i = 0; i < old.world_size; ++i) {
    fresh->ranks[i].override = old.ranks[i].override;
    if (old.ranks[i].override == RankOverride::kForceExclude)
      m.excluded.push_back({i, ExclusionReason::kForced, "forced out by an operator", 0});
  }
  fresh->log.ResetTo(std::move(m));
  for (uint32_t i = 0; i < old.world_size; ++i) {
    if (!old.ranks[i].attached) continue;
    fresh->ranks[i].attached = true;
    fresh->ranks[i].announced_at = now;
    fresh->SetCounted(i, true);
  }
  impl_ = std::move(fresh);
}

void JobEngine::Detach(uint32_t rank) {
  Impl& d = *impl_;
  d.FinishRow();
  if (rank < d.world_size) d.ranks[rank].attached = false;
}

absl::Status JobEngine::SetPolicy(const PolicyConfig& policy, Time now) {
  if (auto s = policy.Validate(); !s.ok()) return s;
  Impl& d = *impl_;
  d.FinishRow();
  const PolicyConfig old = d.policy;
  d.policy = policy;
  d.ClampCounters();
  const bool rule_changed = old.kind != policy.kind ||
                            old.profile_iterations != policy.profile_iterations ||
                            old.threshold_factor != policy.threshold_factor;
  // Name what changed: "policy dynamic -> dynamic" told an operator nothing.
  const std::string changes = PolicyChanges(old, policy);
  d.Emit(internal::JobEvent(EventKind::kPolicyChanged, now, d.Highest(), d.Newest().version,
                            changes.empty() ? "policy set again, no field changed"
                                            : absl::StrCat("policy changed: ", changes)));
  if (rule_changed) {
    d.have_threshold = false;
    d.threshold = 0;
    d.baseline = 0;
    d.reference = internal::MakeReference(d);
    d.reference->OnRuleChanged(d.have_highest ? d.highest_active + 1 : 0, now);
  }
  d.dirty = true;
  d.Evaluate(now);
  return absl::OkStatus();
}

const PolicyConfig& JobEngine::policy() const { return impl_->policy; }

absl::Status JobEngine::SetOverride(uint32_t rank, RankOverride override, std::string reason,
                                    Time now) {
  Impl& d = *impl_;
  d.FinishRow();
  if (rank >= d.world_size)
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of range for world_size ", d.world_size));
  d.ranks[rank].override = override;
  const WorkerState state = d.ranks[rank].state;
  d.Emit(internal::RankEvent(
      EventKind::kOverride, now, rank, state, state, d.Highest(), d.Newest().version,
      absl::StrCat(override == RankOverride::kForceExclude   ? "force exclude"
                   : override == RankOverride::kForceInclude ? "force include"
                                                             : "override cleared",
                   reason.empty() ? "" : ": ", reason)));
  d.dirty = true;
  d.Evaluate(now);
  return absl::OkStatus();
}

void JobEngine::Reset(Time now) {
  impl_->FinishRow();
  impl_->Reset(now);
}

bool JobEngine::SetIterationsPerEpoch(uint64_t iterations) {
  Impl& d = *impl_;
  d.FinishRow();
  if (iterations == 0) return true;
  if (d.epoch_length_announced) return d.iterations_per_epoch == iterations;
  d.iterations_per_epoch = iterations;
  d.epoch_length_announced = true;
  d.ClampCounters();
  return true;
}

void JobEngine::SetTopology(uint32_t rank, const RankTopology& topology) {
  assert(rank < impl_->world_size);
  impl_->FinishRow();
  if (impl_->topology.Set(rank, topology)) impl_->topology_version++;
}

RankTopology JobEngine::Topology(uint32_t rank) const {
  assert(rank < impl_->world_size);
  return impl_->topology.Get(rank);
}

void JobEngine::SetMonitorOnly(uint32_t rank, bool monitor_only, Time now) {
  Impl& d = *impl_;
  d.FinishRow();
  assert(rank < d.world_size);
  if (d.monitor_only[rank] == monitor_only) return;
  d.monitor_only[rank] = monitor_only;
  // Either way the excluded set may change: a rank that now keeps taking
  // part leaves it, one whose client now acts on membership may enter it.
  d.dirty = true;
  d.Evaluate(now);
}

void JobEngine::SetRowSlicing(uint32_t min_values, uint32_t per_report) {
  impl_->FinishRow();
  impl_->slice_min_values = per_report == 0 ? UINT32_MAX : min_values;
  impl_->slice_per_report = per_report;
}

std::optional<uint64_t> JobEngine::Progress(uint32_t rank) const {
  if (rank >= impl_->world_size) return std::nullopt;
  return impl_->ranks[rank].Progress();
}

std::vector<Event> JobEngine::TakeEvents() {
  std::vector<Event> out;
  out.swap(impl_->events);
  return out;
}

uint32_t JobEngine::world_size() const { return impl_->world_size; }

WorkerView JobEngine::Worker(uint32_t rank) const {
  const Impl& d = *impl_;
  WorkerView w;
  if (rank >= d.world_size) return w;
  const auto& r = d.ranks[rank];
  w.rank = rank;
  w.state = r.state;
  const auto& ex = d.Newest().excluded;
  auto it = std::lower_bound(ex.begin(), ex.end(), rank,
                             [](const ExcludedRank& e, uint32_t r) { return e.rank < r; });
  if (it != ex.end() && it->rank == rank && !Ended()) {
    w.excluded = true;
    w.exclusion_reason = it->reason;
  }
  w.override = r.override;
  w.monitor_only = d.monitor_only[rank];
  w.counter = r.counter;
  w.limit = d.Limit();
  w.epoch = r.epoch;
  w.last_iteration = r.last_iteration;
  w.last_compute_seconds = r.last_compute;
  w.ewma_compute_seconds = r.ewma;
  const double own = d.reference ? d.reference->BaselineOf(rank) : 0.0;
  const double baseline = own > 0 ? own : d.baseline;
  w.slowdown_ratio = baseline > 0 && r.samples > 0 ? r.ewma / baseline : 0.0;
  w.reports_total = r.reports_total;
  w.last_report_time = r.last_report_time;
  if (d.reference && r.state == WorkerState::kHealthy) w.data = d.reference->DataNoteOf(rank);
  return w;
}

double JobEngine::baseline_seconds() const { return impl_->baseline; }
double JobEngine::step_seconds() const { return impl_->step_seconds; }

JobView JobEngine::View() const {
  const Impl& d = *impl_;
  JobView v;
  v.world_size = d.world_size;
  v.epoch = d.epoch;
  v.highest_iteration = d.Highest();
  v.threshold_seconds = d.have_threshold ? d.threshold : 0.0;
  v.baseline_seconds = d.baseline;
  v.step_seconds = d.step_seconds;
  const bool ended = Ended();
  v.excluded_ranks = ended ? 0 : static_cast<uint32_t>(d.Newest().excluded.size());
  v.active_ranks = d.world_size - v.excluded_ranks;
  for (const auto& r : d.ranks) {
    v.straggler_ranks += r.state == WorkerState::kStraggler;
    v.mild_ranks += r.state == WorkerState::kMild;
    v.unresponsive_ranks += r.state == WorkerState::kUnresponsive;
    v.detached_ranks += !r.attached;
    v.finished_ranks += r.state == WorkerState::kFinished;
  }
  v.membership_withheld = d.withheld && !ended;
  v.lost = d.lost;
  v.detections_total = d.detections_total;
  v.recoveries_total = d.recoveries_total;
  v.reports_total = d.reports_total;
  v.reports_late_total = d.reports_late_total;
  v.guard_blocks_total = d.guard_blocks_total;
  v.iterations_per_epoch = d.iterations_per_epoch;
  v.last_report_time = d.last_report_time;
  return v;
}

}  // namespace straggler::engine
