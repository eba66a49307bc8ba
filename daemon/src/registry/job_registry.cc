#include "registry/job_registry.h"

#include <random>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "wire/convert.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace straggler::daemon {
namespace {

std::string DescribeMembership(const engine::Membership& m) {
  std::vector<std::string> parts;
  for (const auto& e : m.excluded) {
    parts.push_back(absl::StrCat(e.rank, " (", std::string(engine::ExclusionReasonName(e.reason)), ")"));
  }
  return absl::StrCat("v", m.version, " effective at iteration ", m.effective_iteration,
                      ": excluded [", absl::StrJoin(parts, ", "), "]");
}

// One line per event, the operator's view of what the engine decided.
std::string DescribeEvent(const Job& job, const engine::Event& e, const Attribution& cause) {
  switch (e.kind) {
    case engine::EventKind::kStateChange: {
      const auto& ev = e.evidence;
      std::string line = absl::StrFormat(
          "job=%s rank=%u %s->%s at iteration %u", job.id, e.rank,
          engine::WorkerStateName(e.from), engine::WorkerStateName(e.to), e.iteration);
      if (ev.threshold_seconds > 0) {
        absl::StrAppendFormat(&line, " (compute %.3fs %s threshold %.3fs, counter %u/%u)",
                              ev.compute_seconds,
                              ev.compute_seconds > ev.threshold_seconds ? ">" : "<=",
                              ev.threshold_seconds, ev.counter, ev.limit);
      }
      if (!e.message.empty()) absl::StrAppend(&line, ": ", e.message);
      if (e.to == engine::WorkerState::kStraggler) {
        absl::StrAppend(&line, "; likely cause ", std::string(LikelyCauseName(cause.cause)),
                        cause.detail.empty() ? absl::string_view(" (no GPU telemetry)")
                                             : absl::string_view(": "),
                        cause.detail);
      }
      return line;
    }
    case engine::EventKind::kMembership: {
      for (const auto& m : job.engine.membership_history()) {
        if (m.version == e.membership_version) {
          return absl::StrCat("job=", job.id, " membership ", DescribeMembership(m));
        }
      }
      return absl::StrCat("job=", job.id, " membership v", e.membership_version, " ", e.message);
    }
    default:
      return absl::StrCat("job=", job.id, " ", std::string(engine::EventKindName(e.kind)),
                          engine::EventNamesRank(e.kind) ? absl::StrCat(" rank=", e.rank) : "",
                          " iteration=", e.iteration, e.message.empty() ? "" : ": ", e.message);
  }
}

}  // namespace

engine::Time WallNow() {
  return std::chrono::duration_cast<engine::Time>(
      std::chrono::system_clock::now().time_since_epoch());
}

namespace {

uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v;
}

}  // namespace

JobRegistry::JobRegistry(std::shared_ptr<const DaemonConfig> config, DaemonStats& stats,
                         Store* store)
    : stats_(stats),
      store_(store),
      incarnation_(NewIncarnation()),
      config_(std::move(config)),
      max_batch_reports_(config_->limits.max_batch_reports),
      events_retained_(config_->limits.events_retained) {}

std::shared_ptr<const DaemonConfig> JobRegistry::config() const {
  std::lock_guard lock(config_mu_);
  return config_;
}

namespace {

}  // namespace

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Attach(
    const common::StreamHello& hello, std::shared_ptr<JobSubscriber> stream, engine::Time now,
    std::vector<TopologyRefusal>* topology_refused) {
  const auto config = this->config();
  if (absl::Status s = common::ValidateHello(hello, config->limits.max_ranks_per_job); !s.ok()) {
    return s;
  }

  // Retried only when the idle sweep removed the job between the lookup and
  // taking its mu; the next lookup then creates a fresh one.
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::shared_lock lock(jobs_mu_);
      if (closed_.load()) return absl::UnavailableError("stragglerd is shutting down");
      if (auto it = jobs_.find(hello.job_id); it != jobs_.end() && !it->second->removed.load()) {
        job = it->second;
      }
    }
    if (!job) {
      std::unique_lock lock(jobs_mu_);
      if (closed_.load()) return absl::UnavailableError("stragglerd is shutting down");
      auto it = jobs_.find(hello.job_id);
      if (it != jobs_.end() && !it->second->removed.load()) {
        job = it->second;
      } else {
        // Swept as idle but not yet erased by the sweep: replace it (the
        // sweep erases only the Job it removed).
        if (it != jobs_.end()) jobs_.erase(it);
        if (jobs_.size() >= config->limits.max_jobs) {
          return absl::ResourceExhaustedError(
              absl::StrCat("job '", hello.job_id, "' refused: limits.max_jobs=",
                           config->limits.max_jobs, " jobs already tracked"));
        }
        job = MakeJob(hello.job_id, hello.world_size, hello.run_id, *config, now);
        jobs_.emplace(hello.job_id, job);
        spdlog::info("job={} run='{}' created: world_size={} policy={}", hello.job_id,
                     hello.run_id, hello.world_size,
                     engine::PolicyKindName(job->engine.policy().kind));
      }
    }

    std::lock_guard lock(job->mu);
    if (job->removed.load()) continue;
    // Checked again under the job's mu: CloseAll sets closed_ before it takes
    // any job's mu, so either this sees it, or CloseAll closes `stream` after
    // it was subscribed below.
    if (closed_.load()) return absl::UnavailableError("stragglerd is shutting down");
    if (job->run_id != hello.run_id) {
      // Another launch of the job id. It must not reset a live job (a stray
      // or hostile hello could), so it waits until every rank of the current
      // run has finished, gone unresponsive or lost its stream; the client
      // retries meanwhile and trains without the daemon (docs/runs.md).
      if (RunLiveLocked(*job)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job '", job->id, "' is running run ", common::Quoted(job->run_id), " (", job->streams,
            " streams, ranks still reporting); run ", common::Quoted(hello.run_id),
            " starts once every rank of it has finished or stopped reporting"));
      }
      RetireRunLocked(*job, hello.run_id);
      continue;  // the lookup now creates the new run's job
    }
    if (job->world_size != hello.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "world_size=", hello.world_size, " differs from job '", job->id,
          "' world_size=", job->world_size));
    }
    if (absl::Status s = CheckClaimsLocked(*job, hello); !s.ok()) return s;
    std::vector<TopologyRefusal> refused = AdmitLocked(*job, stream.get(), hello, now);
    if (topology_refused != nullptr) *topology_refused = std::move(refused);
    job->subscribers.push_back(std::move(stream));
    ++job->streams;
    CommitLocked(*job);
    return job;
  }
}

// With job.mu held, after validation: what a hello tells the job about its
// ranks (nodes, announced ranks, epoch length, version floor).
std::vector<TopologyRefusal> JobRegistry::AdmitLocked(Job& job, const JobSubscriber* stream,
                                                      const common::StreamHello& hello,
                                                      engine::Time now) {
  std::vector<uint32_t>& mine = job.stream_ranks[stream];
  for (uint32_t r : hello.ranks) {
    job.nodes[r] = hello.node;
    if (auto at = std::lower_bound(mine.begin(), mine.end(), r); at == mine.end() || *at != r) {
      mine.insert(at, r);
      ++job.rank_streams[r];
    }
    // Rows wait for ranks a stream speaks for, so the first iterations are
    // judged with every rank in them.
    job.engine.Announce(r, now);
  }
  if (hello.iterations_per_epoch > 0) {
    job.engine.SetIterationsPerEpoch(hello.iterations_per_epoch);
  }
  NoteIncarnationsLocked(job, hello, now);
  // After the incarnations: a rank's new client process may declare anew.
  std::vector<TopologyRefusal> refused = job.topology.Apply(hello.topologies, hello.ranks);
  for (const TopologyRefusal& r : refused) {
    stats_.CountRefused(r.reason);
    spdlog::warn("job={} node='{}' topology refused ({}): {}", job.id, hello.node,
                 TopologyRefuseReasonName(r.reason), r.message);
  }
  // Detection judges each rank against its peers (docs/detection.md, "Peer
  // groups"): the engine learns what the table now holds for these ranks.
  for (uint32_t r : hello.ranks) {
    if (r >= job.world_size) continue;
    const DeclaredTopology& t = job.topology.Of(r);
    job.engine.SetTopology(r, engine::RankTopology{t.peer_group, t.replica, t.gpu_model});
  }
  // Before the floor below: its version must take effect after the
  // iterations the ranks have already reached, or ranks could apply it at
  // different iterations (one certain of it, one that timed out meanwhile).
  if (hello.reported_iteration) job.engine.NoteReportedIteration(*hello.reported_iteration);
  // Only versions of another daemon run need a floor: a plain reconnect to
  // this run (known_incarnation == ours) holds versions we made.
  if (hello.known_membership_version > 0 && hello.known_incarnation != job.incarnation) {
    // The client holds a version from an earlier daemon incarnation: publish
    // one above it, in force after its effective iteration, so every rank
    // switches to this daemon's memberships together. The caller commits it
    // (CommitLocked), which pushes it to every subscriber.
    const uint64_t before = job.engine.membership().version;
    engine::Membership held;
    held.version = hello.known_membership_version;
    held.effective_iteration = hello.known_effective_iteration;
    held.excluded = hello.known_excluded;
    job.engine.AdoptVersionFloor(held, now);
    if (job.engine.membership().version != before) {
      spdlog::info("job={} node='{}' holds membership v{} (effective at iteration {}) from an "
                   "earlier daemon: now at v{}",
                   job.id, hello.node, hello.known_membership_version,
                   hello.known_effective_iteration, job.engine.membership().version);
    }
  }
  return refused;
}

absl::Status JobRegistry::AddRanksLocked(Job& job, const JobSubscriber* stream,
                                         const common::StreamHello& hello, engine::Time now,
                                         std::vector<TopologyRefusal>* topology_refused) {
  if (absl::Status s = common::ValidateHello(hello, config()->limits.max_ranks_per_job); !s.ok()) {
    return s;
  }
  if (hello.job_id != job.id) {
    return absl::InvalidArgumentError(absl::StrCat("a later hello names job '", hello.job_id,
                                                   "' but the stream belongs to job '", job.id,
                                                   "'"));
  }
  if (hello.world_size != job.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("world_size=", hello.world_size,
                                                   " differs from job '", job.id,
                                                   "' world_size=", job.world_size));
  }
  if (absl::Status s = CheckClaimsLocked(job, hello); !s.ok()) return s;
  std::vector<TopologyRefusal> refused = AdmitLocked(job, stream, hello, now);
  if (topology_refused != nullptr) *topology_refused = std::move(refused);
  return absl::OkStatus();
}

absl::Status JobRegistry::CheckClaimsLocked(const Job& job, const common::StreamHello& hello) {
  engine::Membership held;
  held.version = hello.known_membership_version;
  held.effective_iteration = hello.known_effective_iteration;
  absl::Status s = job.engine.CheckClaims(held, hello.reported_iteration);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(
      absl::StrCat("job '", job.id, "': ", s.message(), " (docs/runs.md, \"What a hello may claim\")"));
}

absl::Status JobRegistry::Watch(Job& job, std::shared_ptr<JobSubscriber> watcher) {
  std::lock_guard lock(job.mu);
  // Under the job's mu, as in Attach: a watcher is either refused here or
  // closed by CloseAll.
  if (closed_.load()) return absl::UnavailableError("stragglerd is shutting down");
  if (job.removed.load()) return absl::NotFoundError(absl::StrCat("job '", job.id, "' not found"));
  watcher->OnMembershipChangedLocked(job);
  job.subscribers.push_back(std::move(watcher));
  return absl::OkStatus();
}

void JobRegistry::Unsubscribe(Job& job, const JobSubscriber* subscriber, bool is_stream) {
  std::lock_guard lock(job.mu);
  auto& subs = job.subscribers;
  auto it = std::find_if(subs.begin(), subs.end(),
                         [&](const auto& s) { return s.get() == subscriber; });
  if (it == subs.end()) return;
  subs.erase(it);
  if (is_stream) {
    if (auto mine = job.stream_ranks.find(subscriber); mine != job.stream_ranks.end()) {
      for (uint32_t r : mine->second)
        if (--job.rank_streams[r] == 0) job.engine.Detach(r);
      job.stream_ranks.erase(mine);
    }
    if (job.streams > 0) --job.streams;
    job.last_activity = std::max(job.last_activity, WallNow());
  }
}

std::shared_ptr<Job> JobRegistry::Find(absl::string_view job_id) const {
  std::shared_lock lock(jobs_mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() || it->second->removed.load() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Job>> JobRegistry::Jobs() const {
  std::shared_lock lock(jobs_mu_);
  std::vector<std::shared_ptr<Job>> out;
  out.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) {
    if (!job->removed.load()) out.push_back(job);
  }
  return out;
}

absl::Status JobRegistry::Read(absl::string_view job_id,
                               absl::FunctionRef<void(const Job&)> fn) const {
  auto job = Find(job_id);
  if (!job) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  std::lock_guard lock(job->mu);
  if (job->removed.load()) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  fn(*job);
  return absl::OkStatus();
}

absl::Status JobRegistry::Mutate(absl::string_view job_id,
                                 absl::FunctionRef<absl::Status(Job&, engine::Time)> fn) {
  auto job = Find(job_id);
  if (!job) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  absl::Status status;
  {
    std::lock_guard lock(job->mu);
    if (job->removed.load()) {
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
    }
    status = fn(*job, WallNow());
    CommitLocked(*job);
    if (store_ != nullptr) SaveOverridesLocked(*job);
  }
  // An admin change is on disk, events included, when the call returns; the
  // wait is outside the job's mu so ingest of the job goes on meanwhile.
  if (store_ != nullptr) store_->Flush();
  return status;
}

void JobRegistry::SaveOverridesLocked(const Job& job) {
  std::string policy_json;
  if (job.policy_overridden) {
    v1::PolicyConfig p;
    ToProto(job.engine.policy(), &p);
    (void)google::protobuf::util::MessageToJsonString(p, &policy_json);
  }
  std::vector<StoredOverride> overrides;
  for (uint32_t r = 0; r < job.world_size; ++r) {
    const engine::RankOverride o = job.engine.Worker(r).override;
    if (o == engine::RankOverride::kNone) continue;
    auto it = job.override_reasons.find(r);
    overrides.push_back({r, o, it == job.override_reasons.end() ? "" : it->second});
  }
  if (absl::Status s = store_->SaveOverrides(job.id, job.world_size, job.incarnation,
                                             policy_json, overrides);
      !s.ok()) {
    stats_.state_db_errors.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("job={} policy/overrides not persisted: {}", job.id, std::string(s.message()));
  }
}

std::shared_ptr<Job> JobRegistry::MakeJob(const std::string& job_id, uint32_t world_size,
                                          const std::string& run_id, const DaemonConfig& config,
                                          engine::Time now) {
  auto job = std::make_shared<Job>(job_id, world_size, config.PolicyFor(job_id), now,
                                   incarnation_, config.limits.recent_reports_per_job, run_id);
  if (store_ == nullptr) return job;
  auto loaded = store_->LoadJob(job_id);
  if (!loaded.ok()) {
    stats_.state_db_errors.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("job={} not restored: {}", job_id, std::string(loaded.status().message()));
    return job;
  }
  if (loaded->has_value() && (*loaded)->run_id == run_id) {
    // The same run after a daemon restart: restored below.
  } else {
    // A run the database has not seen: nothing of an earlier run carries over.
    if (absl::Status s = store_->StartRun(job_id, world_size, incarnation_, run_id); !s.ok()) {
      stats_.state_db_errors.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("job={} run='{}' not recorded: {}", job_id, run_id, std::string(s.message()));
    }
    return job;
  }
  const StoredJob& stored = **loaded;
  if (!stored.policy_json.empty()) {
    // Merged over the config's policy, so a field a newer build added keeps
    // its configured value; the engine validates it.
    v1::PolicyConfig p;
    absl::Status s = google::protobuf::util::JsonStringToMessage(stored.policy_json, &p).ok()
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("not a PolicyConfig in JSON");
    absl::StatusOr<engine::PolicyConfig> merged = MergePolicy(p, job->engine.policy());
    if (s.ok() && merged.ok()) s = job->engine.SetPolicy(*merged, now);
    if (!s.ok() || !merged.ok()) {
      spdlog::error("job={} stored policy {} not restored: {}", job_id, stored.policy_json,
                    std::string((s.ok() ? merged.status() : s).message()));
    } else {
      job->policy_overridden = true;
    }
  }
  if (!stored.membership) return job;
  const engine::Membership& m = *stored.membership;
  if (stored.world_size != world_size) {
    // Another run of the job at another scale: the excluded ranks mean
    // nothing to it, but versions must still grow.
    spdlog::warn("job={} world_size={} differs from the stored world_size={}: exclusions not "
                 "restored, versions continue above v{}",
                 job_id, world_size, stored.world_size, m.version);
    engine::Membership floor = m;
    floor.excluded.clear();
    job->engine.AdoptVersionFloor(floor, now);
    return job;
  }
  std::vector<std::pair<uint32_t, engine::RankOverride>> overrides;
  for (const StoredOverride& o : stored.overrides) {
    overrides.emplace_back(o.rank, o.override);
    job->override_reasons[o.rank] = o.reason;
  }
  job->engine.RestoreMembership(m, overrides, now);
  spdlog::info("job={} restored from {}: membership v{} -> v{}, {} excluded, {} overrides{}",
               job_id, store_->path(), m.version, job->engine.membership().version,
               m.excluded.size(), overrides.size(),
               job->policy_overridden ? ", admin policy" : "");
  return job;
}

absl::Status JobRegistry::Restore(engine::Time now) {
  if (store_ == nullptr) return absl::OkStatus();
  const auto config = this->config();
  auto max_sequence = store_->MaxSequence();
  if (!max_sequence.ok()) return max_sequence.status();
  auto events = store_->LoadEvents(config->limits.events_retained);
  if (!events.ok()) return events.status();
  {
    std::lock_guard lock(events_mu_);
    events_.assign(std::make_move_iterator(events->begin()), std::make_move_iterator(events->end()));
    next_sequence_ = *max_sequence + 1;
    reserved_sequence_ = *max_sequence;  // the first event reserves a block
  }
  auto jobs = store_->LoadJobs(now - std::chrono::seconds(config->limits.job_idle_ttl_seconds));
  if (!jobs.ok()) return jobs.status();
  for (const StoredJob& stored : *jobs) {
    if (stored.world_size == 0 || stored.world_size > config->limits.max_ranks_per_job) continue;
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(jobs_mu_);
      if (jobs_.size() >= config->limits.max_jobs) break;
      job = MakeJob(stored.job_id, stored.world_size, stored.run_id, *config, now);
      jobs_.emplace(stored.job_id, job);
    }
    std::lock_guard lock(job->mu);
    CommitLocked(*job);  // journals and persists the restored version
  }
  spdlog::info("state database {}: {} events (next sequence {}), {} jobs restored",
               store_->path(), events->size(), *max_sequence + 1, jobs->size());
  return absl::OkStatus();
}

void JobRegistry::CommitLocked(Job& job, const JobSubscriber* skip) {
  std::vector<engine::Event> events = job.engine.TakeEvents();
  if (!events.empty()) JournalLocked(job, std::move(events));

  const uint64_t version = job.engine.membership().version;
  if (version == job.pushed_version) return;
  if (store_ != nullptr) {
    // Durable before anyone sees it (the ack built after this call, a push,
    // a query): a client can then never hold a version that a restarted
    // daemon does not know of and would hand out again with other content.
    for (const engine::Membership& m : job.engine.membership_history()) {
      if (m.version <= job.pushed_version) continue;
      if (absl::Status s = store_->SaveMembership(job.id, job.world_size, job.incarnation, m);
          !s.ok()) {
        // Published anyway: the job needs the version now, and the hello
        // floor still protects clients that hold it across a restart.
        stats_.state_db_errors.fetch_add(1, std::memory_order_relaxed);
        spdlog::error("job={} membership v{} not persisted: {}", job.id, m.version,
                      std::string(s.message()));
      }
    }
  }
  job.pushed_version = version;
  for (const auto& sub : job.subscribers) {
    if (sub.get() != skip) sub->OnMembershipChangedLocked(job);
  }
}

Attribution Job::AttributeLocked(uint32_t rank, engine::Time now) const {
  std::vector<const v1::GpuTelemetry*> others;
  for (uint32_t r = 0; r < gpu.size(); ++r) {
    if (r == rank) continue;
    if (const v1::GpuTelemetry* t = FreshTelemetryLocked(r, now)) others.push_back(t);
  }
  return AttributeLikelyCause(FreshTelemetryLocked(rank, now), others);
}

void JobRegistry::JournalLocked(Job& job, std::vector<engine::Event> events) {
  std::vector<Attribution> causes(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    const engine::Event& e = events[i];
    if (e.kind == engine::EventKind::kStateChange && e.to == engine::WorkerState::kStraggler) {
      // Judged at the daemon's clock now, not the event's: the telemetry's
      // freshness is measured on the daemon's receive clock too.
      causes[i] = job.AttributeLocked(e.rank, WallNow());
    }
  }
  for (size_t i = 0; i < events.size(); ++i) {
    const engine::Event& e = events[i];
    spdlog::info("{}", DescribeEvent(job, e, causes[i]));
    stats_.events_by_kind[static_cast<size_t>(e.kind)].fetch_add(1, std::memory_order_relaxed);
    if (e.kind == engine::EventKind::kStateChange && e.from == engine::WorkerState::kHealthy &&
        e.to == engine::WorkerState::kStraggler) {
      job.detection_latency.Observe(static_cast<double>(e.evidence.latency_iterations));
    }
  }
  stats_.events_total.fetch_add(events.size(), std::memory_order_relaxed);
  std::lock_guard lock(events_mu_);
  const uint64_t last = next_sequence_ + events.size() - 1;
  if (store_ != nullptr && last > reserved_sequence_) {
    // Durable before any of these numbers can be seen: a restart after a
    // kill -9 that lost queued events then numbers above them (store.h).
    const uint64_t upto = last + kSequenceBlock;
    if (absl::Status s = store_->ReserveSequences(upto); s.ok()) {
      reserved_sequence_ = upto;
    } else {
      stats_.state_db_errors.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("event sequences {}..{} not reserved: {}", next_sequence_, last,
                    std::string(s.message()));
    }
  }
  for (size_t i = 0; i < events.size(); ++i) {
    events_.push_back(JournalEntry{next_sequence_++, job.id, std::move(events[i]),
                                   causes[i].cause, std::move(causes[i].detail), job.run_id});
    // A queue append, no I/O: ingest never waits on the disk (store.h).
    if (store_ != nullptr && !store_->EnqueueEvent(events_.back())) {
      stats_.state_db_events_dropped.fetch_add(1, std::memory_order_relaxed);
    }
  }
  while (events_.size() > events_retained_) events_.pop_front();
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

void JobRegistry::TickAll(engine::Time now) {
  if (store_ != nullptr) ApplyRetention(now);
  const std::chrono::seconds ttl(config()->limits.job_idle_ttl_seconds);
  std::vector<std::shared_ptr<Job>> idle;
  for (const auto& job : Jobs()) {
    std::lock_guard lock(job->mu);
    if (job->streams == 0) {
      // Once nobody has used a job without streams for the TTL it is
      // forgotten; marking it removed under mu keeps Attach and Watch from
      // subscribing to it.
      if (job->subscribers.empty() && now - job->last_activity > ttl) {
        job->removed.store(true);
        idle.push_back(job);
        spdlog::info("job={} removed: no stream or watcher and idle for {}s "
                     "(limits.job_idle_ttl_seconds={})",
                     job->id,
                     std::chrono::duration_cast<std::chrono::seconds>(now - job->last_activity)
                         .count(),
                     ttl.count());
        continue;
      }
      // Every rank closed cleanly: the job ended, nothing can turn
      // unresponsive. Ranks whose streams broke without that (killed
      // trainers) do turn unresponsive, so the end of a crashed job is seen
      // and alerted; the exclusions that follow are withheld by the
      // membership gate (no stream to hear them), not published.
      if (job->engine.Finished()) continue;
    }
    job->engine.Tick(now);
    CommitLocked(*job);
  }
  if (idle.empty()) return;
  std::unique_lock lock(jobs_mu_);
  for (const auto& job : idle) {
    // Attach may already have replaced it with a fresh job of the same id.
    if (auto it = jobs_.find(job->id); it != jobs_.end() && it->second == job) jobs_.erase(it);
  }
}

void JobRegistry::ApplyConfig(std::shared_ptr<const DaemonConfig> config) {
  {
    std::lock_guard lock(config_mu_);
    config_ = config;
  }
  max_batch_reports_.store(config->limits.max_batch_reports, std::memory_order_relaxed);
  {
    std::lock_guard lock(events_mu_);
    events_retained_ = config->limits.events_retained;
    while (events_.size() > events_retained_) events_.pop_front();
  }
  const engine::Time now = WallNow();
  for (const auto& job : Jobs()) {
    std::lock_guard lock(job->mu);
    if (job->policy_overridden) {
      spdlog::info("job={} keeps its admin-set policy across the reload", job->id);
      continue;
    }
    const engine::PolicyConfig& wanted = config->PolicyFor(job->id);
    if (SamePolicy(job->engine.policy(), wanted)) continue;
    if (absl::Status s = job->engine.SetPolicy(wanted, now); !s.ok()) {
      // The config was validated on load; an engine that still refuses is
      // worth a loud line but must not stop the reload of the other jobs.
      spdlog::error("job={} rejected the reloaded policy: {}", job->id, std::string(s.message()));
    } else {
      spdlog::info("job={} policy reloaded from {}", job->id,
                   config->config_file.empty() ? "defaults" : config->config_file);
    }
    CommitLocked(*job);
  }
}

void JobRegistry::CloseAll(const absl::Status& status) {
  {
    std::unique_lock lock(jobs_mu_);
    closed_.store(true);
  }
  for (const auto& job : Jobs()) {
    std::lock_guard lock(job->mu);
    for (const auto& sub : job->subscribers) sub->CloseLocked(status);
  }
}

EventPage JobRegistry::Events(const EventQuery& query) const {
  uint32_t limit = query.limit == 0 ? kDefaultEventLimit : query.limit;
  limit = std::min(limit, common::kMaxEventLimit);
  EventPage page;
  std::lock_guard lock(events_mu_);
  page.last_sequence = next_sequence_ - 1;
  if (events_.empty()) return page;
  // Ascending sequences, not always contiguous (events restored from the
  // state database may have gaps: a dropped write, retention).
  const size_t start = static_cast<size_t>(
      std::upper_bound(events_.begin(), events_.end(), query.since_sequence,
                       [](uint64_t seq, const JournalEntry& e) { return seq < e.sequence; }) -
      events_.begin());
  for (size_t i = start; i < events_.size(); ++i) {
    const JournalEntry& e = events_[i];
    if (!query.job_id.empty() && e.job_id != query.job_id) continue;
    if (query.run_id && e.run_id != *query.run_id) continue;
    if (e.event.time < query.since_time) continue;
    if (!query.kinds.empty() &&
        std::find(query.kinds.begin(), query.kinds.end(), e.event.kind) == query.kinds.end())
      continue;
    if (query.rank && !(engine::EventNamesRank(e.event.kind) && e.event.rank == *query.rank))
      continue;
    if (page.events.size() == limit) {
      page.last_sequence = page.events.back().sequence;
      return page;
    }
    page.events.push_back(e);
  }
  return page;
}

uint64_t JobRegistry::last_event_sequence() const {
  std::lock_guard lock(events_mu_);
  return next_sequence_ - 1;
}

}  // namespace straggler::daemon
