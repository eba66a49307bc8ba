// JobRegistry: its jobs, the streams and watchers attached to them, the
// tick, the reload and the shutdown. The rest: see job_registry.h.
#include "registry/job_registry.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "wire/convert.h"

namespace straggler::daemon {

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

// A warning about a hello (a claim bounded, a setting ignored, a topology
// refused), rate-limited by `log` (DaemonStats::hello_log): any ingest
// client can send hellos, and they must not flood the log. `message()` is
// built only for a line that is written.
template <typename Message>
void WarnHello(common::FloodLog& log, Message message) {
  const spdlog::level::level_enum level = log.Level(std::chrono::steady_clock::now());
  if (spdlog::should_log(level)) spdlog::log(level, "{}", message());
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
  absl::MutexLock lock(&config_mu_);
  return config_;
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Attach(
    const common::StreamHello& hello, std::shared_ptr<JobSubscriber> stream, engine::Time now,
    std::vector<TopologyRefusal>* topology_refused) {
  const auto config = this->config();
  if (absl::Status s = common::ValidateHello(hello, config->limits.max_ranks_per_job); !s.ok()) {
    return s;
  }

  // Retried only when the idle sweep removed the job between the lookup and
  // locking it; the next lookup then creates a fresh one.
  for (;;) {
    std::shared_ptr<Job> job;
    bool created = false;
    {
      absl::ReaderMutexLock lock(&jobs_mu_);
      if (closed_.load()) return absl::UnavailableError("stragglerd is shutting down");
      if (auto it = jobs_.find(hello.job_id); it != jobs_.end() && !it->second->removed()) {
        job = it->second;
      }
    }
    if (!job) {
      absl::MutexLock lock(&jobs_mu_);
      if (closed_.load()) return absl::UnavailableError("stragglerd is shutting down");
      auto it = jobs_.find(hello.job_id);
      if (it != jobs_.end() && !it->second->removed()) {
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
        job = MakeJob(hello.job_id, hello.world_size, hello.run_id, *config, now,
                      hello.reported_iteration);
        jobs_.emplace(hello.job_id, job);
        created = true;
      }
    }

    Job::Locked locked(*job);
    if (created) {
      spdlog::info("job={} run='{}' created: world_size={} policy={}", hello.job_id,
                   hello.run_id, hello.world_size,
                   engine::PolicyKindName(locked->engine.policy().kind));
    }
    if (job->removed()) continue;
    // Checked again under the job's lock: CloseAll sets closed_ before it
    // locks any job, so either this sees it, or CloseAll closes `stream`
    // after it was subscribed below.
    if (closed_.load()) return absl::UnavailableError("stragglerd is shutting down");
    if (job->run_id != hello.run_id) {
      // Another launch of the job id. It must not reset a live job (a stray
      // or hostile hello could), so it waits until every rank of the current
      // run has finished, gone unresponsive or lost its stream; the client
      // retries meanwhile and trains without the daemon (docs/runs.md).
      if (RunLiveLocked(locked)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job '", job->id, "' is running run ", common::Quoted(job->run_id), " (",
            locked->streams,
            " streams, ranks still reporting); run ", common::Quoted(hello.run_id),
            " starts once every rank of it has finished or stopped reporting"));
      }
      RetireRunLocked(locked, hello.run_id);
      continue;  // the lookup now creates the new run's job
    }
    if (job->world_size != hello.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "world_size=", hello.world_size, " differs from job '", job->id,
          "' world_size=", job->world_size));
    }
    if (absl::Status s = CheckClaimsLocked(locked, hello); !s.ok()) return s;
    std::vector<TopologyRefusal> refused = AdmitLocked(locked, stream.get(), hello, now);
    if (topology_refused != nullptr) *topology_refused = std::move(refused);
    locked->subscribers.push_back(std::move(stream));
    ++locked->streams;
    CommitLocked(locked);
    return job;
  }
}

// Under the job's lock, after validation: what a hello tells the job about
// its ranks (nodes, announced ranks, epoch length, version floor).
std::vector<TopologyRefusal> JobRegistry::AdmitLocked(Job::Locked& job,
                                                      const JobSubscriber* stream,
                                                      const common::StreamHello& hello,
                                                      engine::Time now) {
  std::vector<uint32_t>& mine = job->stream_ranks[stream];
  // Rows wait for ranks a stream speaks for, so the first iterations are
  // judged with every rank in them. A lost job resumes (docs/runs.md).
  if (job->engine.Lost()) {
    spdlog::info("job={} run='{}' resumes: node '{}' speaks for {} of its ranks again after the "
                 "job was lost",
                 job.id, job.run_id, hello.node, hello.ranks.size());
  }
  for (uint32_t r : hello.ranks) {
    job->nodes.Set(r, hello.node);
    if (auto at = std::lower_bound(mine.begin(), mine.end(), r); at == mine.end() || *at != r) {
      mine.insert(at, r);
      ++job->rank_streams[r];
    }
    job->engine.Announce(r, now);
  }
  // A job-level setting: the run's first announcement decides (a hello
  // needs no token; docs/security.md), a later different one is ignored.
  if (!job->engine.SetIterationsPerEpoch(hello.iterations_per_epoch)) {
    stats_.hello_settings_ignored.fetch_add(1, std::memory_order_relaxed);
    WarnHello(stats_.hello_log, [&] {
      return absl::StrCat("job=", job.id, " node='", hello.node, "': hello iterations_per_epoch=",
                          hello.iterations_per_epoch, " ignored: the run's is ",
                          job->engine.View().iterations_per_epoch, " (its first hello decides)");
    });
  }
  NoteIncarnationsLocked(job, hello, now);
  // After the incarnations: a rank's new client process may declare anew.
  std::vector<TopologyRefusal> refused = job->topology.Apply(hello.topologies, hello.ranks);
  for (const TopologyRefusal& r : refused) {
    stats_.CountRefused(r.reason);
    WarnHello(stats_.hello_log, [&] {
      return absl::StrCat("job=", job.id, " node='", hello.node, "' topology refused (",
                          TopologyRefuseReasonName(r.reason), "): ", r.message);
    });
  }
  // (The accepted topologies are the engine's now: detection judges each
  // rank against its peers, docs/detection.md "Peer groups".)
  // One batch: a changed monitor-only mark re-plans the excluded set, once
  // for the hello, not once per rank (an agent's hello names hundreds).
  job->engine.BeginBatch();
  for (uint32_t r : hello.ranks) {
    if (r >= job.world_size) continue;
    // Whether its client acts on membership: each hello says so for each of
    // its ranks, so a client that starts asking for membership clears the
    // mark with its next hello (docs/membership.md, "Monitoring only").
    job->engine.SetMonitorOnly(r,
                               std::binary_search(hello.monitor_only_ranks.begin(),
                                                  hello.monitor_only_ranks.end(), r),
                               now);
  }
  job->engine.EndBatch(now);
  // Before the floor below: its version must take effect after the
  // iterations the ranks have already reached, or ranks could apply it at
  // different iterations (one certain of it, one that timed out meanwhile).
  // In a live job it is bounded by the job's progress (docs/runs.md, "What a
  // hello may claim").
  if (hello.reported_iteration) {
    const uint64_t claim = *hello.reported_iteration;
    const std::optional<uint64_t> taken = job->engine.NoteReportedIteration(claim);
    if (taken != claim) {
      stats_.hello_claims_dropped.fetch_add(1, std::memory_order_relaxed);
      WarnHello(stats_.hello_log, [&] {
        return absl::StrCat("job=", job.id, " node='", hello.node,
                            "': hello reported_iteration=", claim,
                            taken ? absl::StrCat(" taken as ", *taken,
                                                 " (the job's progress + 1023)")
                                  : std::string(" ignored (2^62 or more)"));
      });
    }
  }
  // Only versions of another daemon run need a floor: a plain reconnect to
  // this run (known_incarnation == ours) holds versions we made.
  if (hello.known_membership_version > 0 && hello.known_incarnation != job.incarnation) {
    // The client holds a version from an earlier daemon incarnation: publish
    // one above it, in force after its effective iteration, so every rank
    // switches to this daemon's memberships together. The caller commits it
    // (CommitLocked), which pushes it to every subscriber.
    const uint64_t before = job->engine.membership().version;
    engine::Membership held;
    held.version = hello.known_membership_version;
    held.effective_iteration = hello.known_effective_iteration;
    held.excluded = hello.known_excluded;
    job->engine.AdoptVersionFloor(held, now);
    if (job->engine.membership().version != before) {
      spdlog::info("job={} node='{}' holds membership v{} (effective at iteration {}) from an "
                   "earlier daemon: now at v{}",
                   job.id, hello.node, hello.known_membership_version,
                   hello.known_effective_iteration, job->engine.membership().version);
    }
  }
  return refused;
}

absl::Status JobRegistry::AddRanksLocked(Job::Locked& job, const JobSubscriber* stream,
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

absl::Status JobRegistry::CheckClaimsLocked(const Job::Locked& job,
                                            const common::StreamHello& hello) {
  engine::Membership held;
  held.version = hello.known_membership_version;
  held.effective_iteration = hello.known_effective_iteration;
  absl::Status s = job->engine.CheckClaims(held, hello.reported_iteration);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(
      absl::StrCat("job '", job.id, "': ", s.message(), " (docs/runs.md, \"What a hello may claim\")"));
}

absl::Status JobRegistry::Watch(Job& job, std::shared_ptr<JobSubscriber> watcher) {
  Job::Locked locked(job);
  // Under the job's lock, as in Attach: a watcher is either refused here or
  // closed by CloseAll.
  if (closed_.load()) return absl::UnavailableError("stragglerd is shutting down");
  if (job.removed()) return absl::NotFoundError(absl::StrCat("job '", job.id, "' not found"));
  watcher->OnMembershipChangedLocked(locked);
  locked->subscribers.push_back(std::move(watcher));
  return absl::OkStatus();
}

void JobRegistry::Unsubscribe(Job& job, const JobSubscriber* subscriber, bool is_stream) {
  Job::Locked locked(job);
  JobState& st = *locked;
  auto& subs = st.subscribers;
  auto it = std::find_if(subs.begin(), subs.end(),
                         [&](const auto& s) { return s.get() == subscriber; });
  if (it == subs.end()) return;
  subs.erase(it);
  if (is_stream) {
    if (auto mine = st.stream_ranks.find(subscriber); mine != st.stream_ranks.end()) {
      for (uint32_t r : mine->second)
        if (--st.rank_streams[r] == 0) st.engine.Detach(r);
      st.stream_ranks.erase(mine);
    }
    if (st.streams > 0) --st.streams;
    st.last_activity = std::max(st.last_activity, WallNow());
  }
}

std::shared_ptr<Job> JobRegistry::Find(absl::string_view job_id) const {
  absl::ReaderMutexLock lock(&jobs_mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() || it->second->removed() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Job>> JobRegistry::Jobs() const {
  absl::ReaderMutexLock lock(&jobs_mu_);
  std::vector<std::shared_ptr<Job>> out;
  out.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) {
    if (!job->removed()) out.push_back(job);
  }
  return out;
}

absl::Status JobRegistry::Read(absl::string_view job_id,
                               absl::FunctionRef<void(const Job::Locked&)> fn) const {
  auto job = Find(job_id);
  if (!job) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  const Job::Locked locked(*job);
  if (job->removed()) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  fn(locked);
  return absl::OkStatus();
}

absl::Status JobRegistry::Mutate(absl::string_view job_id,
                                 absl::FunctionRef<absl::Status(Job::Locked&, engine::Time)> fn) {
  auto job = Find(job_id);
  if (!job) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  absl::Status status;
  {
    Job::Locked locked(*job);
    if (job->removed()) {
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
    }
    const engine::Time now = WallNow();
    status = fn(locked, now);
    if (shared_ != nullptr && status.ok()) {
      // Before the membership it may change is published: a replica that
      // takes the job over keeps the operator's settings (docs/cluster.md).
      // A refusal means this replica no longer owns the job; the commit
      // below then fails the same way and stops serving it.
      status = shared_->SaveAdmin(locked.id, AdminStateLocked(locked));
      if (!status.ok()) {
        spdlog::error("job={} policy/overrides not written to the cluster: {}", locked.id,
                      std::string(status.message()));
      }
    }
    CommitLocked(locked);
    if (store_ != nullptr) SaveOverridesLocked(locked, now);
  }
  // An admin change is on disk, events included, when the call returns; the
  // wait is outside the job's lock so ingest of the job goes on meanwhile.
  if (store_ != nullptr) store_->Flush();
  return status;
}

void JobRegistry::TickAll(engine::Time now) {
  if (store_ != nullptr) ApplyRetention(now);
  const auto config = this->config();
  const std::chrono::seconds ttl(config->limits.job_idle_ttl_seconds);
  const std::chrono::seconds lost_after(config->limits.job_lost_after_seconds);
  std::vector<std::shared_ptr<Job>> idle;
  for (const auto& job : Jobs()) {
    Job::Locked locked(*job);
    if (locked->streams == 0) {
      // Once nobody has used a job without streams for the TTL it is
      // forgotten; marking it removed under its lock keeps Attach and Watch
      // from subscribing to it.
      if (locked->subscribers.empty() && now - locked->last_activity > ttl) {
        locked.MarkRemoved();
        idle.push_back(job);
        spdlog::info("job={} removed: no stream or watcher and idle for {}s "
                     "(limits.job_idle_ttl_seconds={})",
                     job->id,
                     std::chrono::duration_cast<std::chrono::seconds>(now - locked->last_activity)
                         .count(),
                     ttl.count());
        continue;
      }
      // Every rank closed cleanly, or the job was lost: it ended, nothing
      // can turn unresponsive. Ranks whose streams broke without a clean
      // close (killed trainers) do turn unresponsive, so the end of a
      // crashed job is seen and alerted; the exclusions that follow are
      // withheld by the membership gate (no stream to hear them), not
      // published. Once nothing came for lost_after the job is lost.
      if (locked->engine.Ended()) continue;
      if (now - locked->last_activity > lost_after) {
        LoseLocked(locked, now, lost_after);
        continue;
      }
    }
    locked->engine.Tick(now);
    CommitLocked(locked);
  }
  if (idle.empty()) return;
  absl::MutexLock lock(&jobs_mu_);
  for (const auto& job : idle) {
    // Attach may already have replaced it with a fresh job of the same id.
    if (auto it = jobs_.find(job->id); it != jobs_.end() && it->second == job) jobs_.erase(it);
  }
}

void JobRegistry::ApplyConfig(std::shared_ptr<const DaemonConfig> config) {
  {
    absl::MutexLock lock(&config_mu_);
    config_ = config;
  }
  max_batch_reports_.store(config->limits.max_batch_reports, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&events_mu_);
    events_retained_ = config->limits.events_retained;
    while (events_.size() > events_retained_) events_.pop_front();
  }
  const engine::Time now = WallNow();
  for (const auto& job : Jobs()) {
    Job::Locked locked(*job);
    if (locked->policy_overridden) {
      spdlog::info("job={} keeps its admin-set policy across the reload", job->id);
      continue;
    }
    const engine::PolicyConfig& wanted = config->PolicyFor(job->id);
    if (SamePolicy(locked->engine.policy(), wanted)) continue;
    if (absl::Status s = locked->engine.SetPolicy(wanted, now); !s.ok()) {
      // The config was validated on load; an engine that still refuses is
      // worth a loud line but must not stop the reload of the other jobs.
      spdlog::error("job={} rejected the reloaded policy: {}", job->id, std::string(s.message()));
    } else {
      spdlog::info("job={} policy reloaded from {}", job->id,
                   config->config_file.empty() ? "defaults" : config->config_file);
    }
    CommitLocked(locked);
  }
}

void JobRegistry::CloseAll(const absl::Status& status) {
  {
    absl::MutexLock lock(&jobs_mu_);
    closed_.store(true);
  }
  for (const auto& job : Jobs()) {
    Job::Locked locked(*job);
    for (const auto& sub : locked->subscribers) sub->CloseLocked(status);
  }
}

void JobRegistry::Drop(absl::string_view job_id, const absl::Status& status) {
  std::shared_ptr<Job> job;
  {
    // Out of the map first (also a job already removed, e.g. one whose
    // membership could not be shared): nothing finds it from now on.
    absl::MutexLock lock(&jobs_mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    job = std::move(it->second);
    jobs_.erase(it);
  }
  // Removed under its lock, as the idle sweep does: an Attach or Watch that
  // found it before is refused or closed here.
  Job::Locked locked(*job);
  locked.MarkRemoved();
  for (const auto& sub : locked->subscribers) sub->CloseLocked(status);
  locked->subscribers.clear();
}

}  // namespace straggler::daemon
