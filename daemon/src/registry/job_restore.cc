// JobRegistry and the state database (persist/store.h, docs/persistence.md):
// a job made from what the database knows of it, the restore at start-up,
// the admin overrides saved, and retention.
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "registry/job_registry.h"
#include "spdlog/spdlog.h"
#include "wire/convert.h"

namespace straggler::daemon {

SharedAdminState JobRegistry::AdminStateLocked(const Job::Locked& job) const {
  SharedAdminState state;
  state.run_id = job.run_id;
  if (job->policy_overridden) {
    v1::PolicyConfig p;
    ToProto(job->engine.policy(), &p);
    (void)google::protobuf::util::MessageToJsonString(p, &state.policy_json);
  }
  for (uint32_t r = 0; r < job.world_size; ++r) {
    const engine::RankOverride o = job->engine.Worker(r).override;
    if (o == engine::RankOverride::kNone) continue;
    auto it = job->override_reasons.find(r);
    state.overrides.push_back({r, o, it == job->override_reasons.end() ? "" : it->second});
  }
  return state;
}

void JobRegistry::SaveOverridesLocked(const Job::Locked& job, engine::Time now) {
  const SharedAdminState state = AdminStateLocked(job);
  if (absl::Status s = store_->SaveOverrides(job.id, job.world_size, job.incarnation,
                                             state.policy_json, state.overrides, now);
      !s.ok()) {
    stats_.state_db_errors.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("job={} policy/overrides not persisted: {}", job.id, std::string(s.message()));
  }
}

bool JobRegistry::ApplyStoredPolicyLocked(Job::Locked& locked, const std::string& policy_json,
                                          engine::Time now) {
  // Merged over the config's policy, so a field a newer build added keeps
  // its configured value; the engine validates it.
  v1::PolicyConfig p;
  absl::Status s = google::protobuf::util::JsonStringToMessage(policy_json, &p).ok()
                       ? absl::OkStatus()
                       : absl::InvalidArgumentError("not a PolicyConfig in JSON");
  absl::StatusOr<engine::PolicyConfig> merged = MergePolicy(p, locked->engine.policy());
  if (s.ok() && merged.ok()) s = locked->engine.SetPolicy(*merged, now);
  if (!s.ok() || !merged.ok()) {
    spdlog::error("job={} stored policy {} not restored: {}", locked.id, policy_json,
                  std::string((s.ok() ? merged.status() : s).message()));
    return false;
  }
  locked->policy_overridden = true;
  return true;
}

std::shared_ptr<Job> JobRegistry::MakeJob(const std::string& job_id, uint32_t world_size,
                                          const std::string& run_id, const DaemonConfig& config,
                                          engine::Time now, std::optional<uint64_t> reported) {
  auto job = std::make_shared<Job>(job_id, world_size, config.PolicyFor(job_id), now,
                                   incarnation_, config.limits.recent_reports_per_job, run_id);
  if (store_ == nullptr && shared_ == nullptr) return job;
  // Not in the map yet, so nobody else can hold its lock (the caller may
  // hold jobs_mu_): restoring it cannot wait on anyone.
  Job::Locked locked(*job);
  // A job taken over mid-run (a restart, another replica's job): without
  // the hello's progress its restored version would take effect at the
  // saved effective iteration + 1, long past for the ranks, which would
  // then apply it each at its own later iteration (straggler-sim counts
  // those as version splits; issue 30's test A saw 3).
  if (reported) (void)locked->engine.NoteReportedIteration(*reported);
  const bool restored = store_ != nullptr && RestoreStoredLocked(locked, now);
  if (!restored && shared_ != nullptr) RestoreSharedLocked(locked, now);
  return job;
}

bool JobRegistry::RestoreStoredLocked(Job::Locked& locked, engine::Time now) {
  const std::string& job_id = locked.id;
  const std::string& run_id = locked.run_id;
  const uint32_t world_size = locked.world_size;
  auto loaded = store_->LoadJob(job_id);
  if (!loaded.ok()) {
    stats_.state_db_errors.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("job={} not restored: {}", job_id, std::string(loaded.status().message()));
    return false;
  }
  if (loaded->has_value() && (*loaded)->run_id == run_id) {
    // The same run after a daemon restart: restored below.
  } else {
    // A run the database has not seen: nothing of an earlier run carries over.
    if (absl::Status s = store_->StartRun(job_id, world_size, incarnation_, run_id, now); !s.ok()) {
      stats_.state_db_errors.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("job={} run='{}' not recorded: {}", job_id, run_id, std::string(s.message()));
    }
    return false;
  }
  const StoredJob& stored = **loaded;
  if (!stored.policy_json.empty()) ApplyStoredPolicyLocked(locked, stored.policy_json, now);
  if (!stored.membership) return false;
  const engine::Membership& m = *stored.membership;
  if (stored.world_size != world_size) {
    // Another run of the job at another scale: the excluded ranks mean
    // nothing to it, but versions must still grow.
    spdlog::warn("job={} world_size={} differs from the stored world_size={}: exclusions not "
                 "restored, versions continue above v{}",
                 job_id, world_size, stored.world_size, m.version);
    engine::Membership floor = m;
    floor.excluded.clear();
    locked->engine.AdoptVersionFloor(floor, now);
    return true;
  }
  std::vector<std::pair<uint32_t, engine::RankOverride>> overrides;
  for (const StoredOverride& o : stored.overrides) {
    overrides.emplace_back(o.rank, o.override);
    locked->override_reasons[o.rank] = o.reason;
  }
  locked->engine.RestoreMembership(m, overrides, now);
  spdlog::info("job={} restored from {}: membership v{} -> v{}, {} excluded, {} overrides{}",
               job_id, store_->path(), m.version, locked->engine.membership().version,
               m.excluded.size(), overrides.size(),
               locked->policy_overridden ? ", admin policy" : "");
  return true;
}

void JobRegistry::RestoreSharedLocked(Job::Locked& locked, engine::Time now) {
  absl::StatusOr<std::optional<v1::Job>> loaded = shared_->LoadMembership(locked.id);
  if (!loaded.ok()) {
    // The hellos' held versions still keep versions growing (AdoptVersionFloor).
    spdlog::error("job={} starts afresh: its last owner's state could not be read: {}",
                  locked.id, std::string(loaded.status().message()));
    return;
  }
  // The operators' settings of this run: the admin policy first (the
  // membership restored below is judged under it), the overrides with the
  // membership.
  absl::StatusOr<std::optional<SharedAdminState>> admin = shared_->LoadAdmin(locked.id);
  if (!admin.ok()) {
    spdlog::error("job={} its last owner's policy and overrides could not be read: {}",
                  locked.id, std::string(admin.status().message()));
  }
  const SharedAdminState* settings =
      admin.ok() && admin->has_value() && (*admin)->run_id == locked.run_id ? &**admin : nullptr;
  if (settings != nullptr && !settings->policy_json.empty()) {
    ApplyStoredPolicyLocked(locked, settings->policy_json, now);
  }
  std::vector<std::pair<uint32_t, engine::RankOverride>> overrides;
  if (settings != nullptr) {
    for (const StoredOverride& o : settings->overrides) {
      if (o.rank >= locked.world_size) continue;
      overrides.emplace_back(o.rank, o.override);
      locked->override_reasons[o.rank] = o.reason;
    }
  }
  if (!loaded->has_value() || (*loaded)->run_id() != locked.run_id) {
    // No membership of this run yet (an override whose change was withheld,
    // a policy alone): the overrides are set as the operator set them.
    for (const auto& [rank, o] : overrides) {
      (void)locked->engine.SetOverride(rank, o, locked->override_reasons[rank], now);
    }
    return;
  }
  const v1::Job& state = **loaded;
  engine::Membership m;
  m.version = state.membership().version();
  m.effective_iteration = state.membership().effective_iteration();
  m.world_size = state.membership().world_size();
  m.lead_iterations = state.membership().lead_iterations();
  m.created_at = common::FromProto(state.membership().created_at());
  for (const v1::ExcludedRank& e : state.membership().excluded()) {
    m.excluded.push_back(common::FromProto(e));
  }
  if (state.world_size() != locked.world_size) {
    // As for the store above: versions grow, exclusions do not carry over.
    m.excluded.clear();
    locked->engine.AdoptVersionFloor(m, now);
    return;
  }
  locked->engine.RestoreMembership(m, overrides, now);
  spdlog::info("job={} taken over from its last owner's state: membership v{} -> v{}, {} "
               "excluded, {} overrides{}",
               locked.id, m.version, locked->engine.membership().version, m.excluded.size(),
               overrides.size(), locked->policy_overridden ? ", admin policy" : "");
}

absl::Status JobRegistry::Restore(engine::Time now) {
  if (store_ == nullptr) return absl::OkStatus();
  const auto config = this->config();
  auto max_sequence = store_->MaxSequence();
  if (!max_sequence.ok()) return max_sequence.status();
  auto events = store_->LoadEvents(config->limits.events_retained);
  if (!events.ok()) return events.status();
  {
    absl::MutexLock lock(&events_mu_);
    events_.assign(std::make_move_iterator(events->begin()), std::make_move_iterator(events->end()));
    next_sequence_ = *max_sequence + 1;
    reserved_sequence_ = *max_sequence;  // the first event reserves a block
  }
  // In a cluster a job is this replica's only once it takes it (a hello):
  // MakeJob restores it then.
  if (shared_ != nullptr) return absl::OkStatus();
  auto jobs = store_->LoadJobs(now - std::chrono::seconds(config->limits.job_idle_ttl_seconds));
  if (!jobs.ok()) return jobs.status();
  for (const StoredJob& stored : *jobs) {
    if (stored.world_size == 0 || stored.world_size > config->limits.max_ranks_per_job) continue;
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&jobs_mu_);
      if (jobs_.size() >= config->limits.max_jobs) break;
      job = MakeJob(stored.job_id, stored.world_size, stored.run_id, *config, now);
      jobs_.emplace(stored.job_id, job);
    }
    Job::Locked locked(*job);
    CommitLocked(locked);  // journals and persists the restored version
    // After it: the restored transitions it journals know no cause.
    RestoreCausesLocked(locked, *max_sequence);
  }
  spdlog::info("state database {}: {} events (next sequence {}), {} jobs restored",
               store_->path(), events->size(), *max_sequence + 1, jobs->size());
  return absl::OkStatus();
}

void JobRegistry::RestoreCausesLocked(Job::Locked& job, uint64_t upto) {
  absl::MutexLock lock(&events_mu_);
  for (const JournalEntry& e : events_) {  // oldest first: the newest transition wins
    if (e.sequence > upto) break;
    if (e.job_id != job.id || e.run_id != job.run_id ||
        e.event.kind != engine::EventKind::kStateChange || e.event.rank >= job.world_size)
      continue;
    if (e.event.to == engine::WorkerState::kStraggler) {
      job->straggler_causes[e.event.rank] = Attribution{e.likely_cause, e.likely_cause_detail};
    } else if (e.event.from == engine::WorkerState::kStraggler) {
      job->straggler_causes.erase(e.event.rank);
    }
  }
}

void JobRegistry::ApplyRetention(engine::Time now) {
  const PersistenceConfig p = config()->persistence;
  if (now - last_retention_ < std::chrono::seconds(p.retention_interval_seconds)) return;
  last_retention_ = now;
  auto deleted = store_->ApplyRetention(now, std::chrono::seconds(p.events_max_age_seconds),
                                        p.events_max_rows, p.membership_versions_kept);
  if (!deleted.ok()) {
    stats_.state_db_errors.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("state database retention failed: {}", std::string(deleted.status().message()));
  } else if (*deleted > 0) {
    spdlog::info("state database retention deleted {} rows", *deleted);
  }
}

}  // namespace straggler::daemon
