// One job of the daemon: its identity, and the state its mutex guards (the
// detection engine, who listens to it, per-rank bookkeeping), reachable only
// through a Job::Locked, the scoped handle that holds the mutex.
//
//   Job::Locked job(*shared_job);          // takes the job's mutex
//   job->engine.Ingest(report, now);       // JobState, guarded
//   spdlog::info("job={}", job.id);        // identity, also readable unlocked
//   registry.CommitLocked(job);            // *Locked functions take the handle
//
// Every function that needs the mutex held takes a `Job::Locked&`, so the
// compiler, not a comment, says which code runs under it; clang's
// -Wthread-safety pass (ctest layout:thread_safety, docs/development.md)
// checks the mutex's annotations. The locking rules of the registry as a
// whole: job_registry.h.
//
// Thread safety: the identity fields are const; removed() is atomic; the
// rest is JobState, reached only through a Locked (one thread at a time).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ingest/rank_topology.h"
#include "metrics/buckets.h"
#include "prometheus/histogram.h"
#include "registry/attribution.h"
#include "straggler/engine/intern_table.h"
#include "straggler/engine/job_engine.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::daemon {

class Job;
class JobSubscriber;

// The latest GPU telemetry of a rank, as the agent sent it, and when the
// daemon received it (its own clock: staleness must not depend on the
// agent's clock being right).
struct RankGpu {
  v1::GpuTelemetry telemetry;
  engine::Time received{0};
  bool Fresh(engine::Time now) const { return now - received <= kTelemetryStaleAfter; }
};

// A rank's latest host telemetry (ReportBatch.host, .processes): the node
// sample is shared by the ranks of the stream it came with.
struct RankHost {
  std::shared_ptr<const v1::HostTelemetry> node;
  engine::Time node_received{0};
  std::optional<v1::ProcessTelemetry> process;
  engine::Time process_received{0};
  bool Fresh(engine::Time now) const {
    return (node && now - node_received <= kTelemetryStaleAfter) ||
           (process && now - process_received <= kTelemetryStaleAfter);
  }
};

// One accepted report as ExportReports returns it.
struct RecentReport {
  uint64_t epoch = 0;
  uint64_t iteration = 0;
  double compute_seconds = 0;
  uint32_t rank = 0;
  // The job's baseline and step time when it was accepted (JobView); floats
  // keep an entry small, and a heatmap colour needs no more precision.
  float reference_seconds = 0;
  float job_step_seconds = 0;
  // The report's work and phases (issue 31), NaN where it has none: floats,
  // 7 digits, enough for a trace (stragglerctl export); 48 bytes an entry.
  static constexpr float kAbsent = std::numeric_limits<float>::quiet_NaN();
  float work = kAbsent;
  float input_wait_seconds = kAbsent;
  float optimizer_seconds = kAbsent;
};
static_assert(sizeof(RecentReport) == 48, "limits.recent_reports_per_job's cost, docs/configuration.md");

// A job's most recent accepted reports, oldest overwritten first: a vector
// used as a ring. It grows (amortized) to `capacity` on first use and is then
// reused, so a report costs a copy, never an allocation. capacity 0 keeps
// nothing (limits.recent_reports_per_job=0). Not thread-safe (a JobState
// member: the job's mutex).
class RecentReports {
 public:
  explicit RecentReports(uint32_t capacity) : capacity_(capacity) {}

  void Add(const RecentReport& r) {
    if (capacity_ == 0) return;
    if (ring_.size() < capacity_) {
      ring_.push_back(r);
    } else {
      RecentReport& slot = ring_[next_];
      dropped_max_iteration_ = std::max(dropped_max_iteration_, slot.iteration);
      slot = r;
      ++dropped_;
    }
    if (++next_ == capacity_) next_ = 0;
  }
  // Every kept report, oldest first.
  template <class Fn>
  void ForEach(Fn&& fn) const {
    const size_t start = ring_.size() < capacity_ ? 0 : next_;
    for (size_t i = 0; i < ring_.size(); ++i) fn(ring_[(start + i) % ring_.size()]);
  }
  size_t size() const { return ring_.size(); }
  uint32_t capacity() const { return capacity_; }
  // Reports overwritten so far, and the highest iteration among them.
  uint64_t dropped() const { return dropped_; }
  uint64_t dropped_max_iteration() const { return dropped_max_iteration_; }

 private:
  uint32_t capacity_;
  std::vector<RecentReport> ring_;
  size_t next_ = 0;  // slot the next report goes to once the ring is full
  uint64_t dropped_ = 0;
  uint64_t dropped_max_iteration_ = 0;
};

// The node that last spoke for each rank: an index per rank into the job's
// distinct names (a std::string per rank was 32 bytes of every rank of a
// million-rank job, more for a name past the small-string buffer). Not
// thread-safe (a JobState member: the job's mutex).
class RankNodes {
 public:
  explicit RankNodes(uint32_t world) : of_(world, 0) {}
  size_t size() const { return of_.size(); }
  // "" before a hello named the rank; valid until the next Set.
  const std::string& operator[](uint32_t rank) const { return names_[of_[rank]]; }
  void Set(uint32_t rank, const std::string& node) {
    of_[rank] = names_.Intern(node);
    names_.CompactIfBloated(of_);
  }

 private:
  engine::InternTable<std::string> names_;
  std::vector<uint32_t> of_;
};

// What a job's mutex guards. Reached only through Job::Locked.
struct JobState {
  JobState(uint32_t world, engine::PolicyConfig policy, engine::Time now,
           uint32_t recent_reports_capacity)
      : engine(world, std::move(policy), now),
        nodes(world),
        rank_streams(world, 0),
        lineage_incarnation(world, 0),
        restarted(world, false),
        topology(engine, world),
        last_activity(now),
        recent(recent_reports_capacity) {}

  engine::JobEngine engine;
  RankNodes nodes;  // node that last spoke for each rank
  std::vector<std::shared_ptr<JobSubscriber>> subscribers;
  uint32_t streams = 0;
  // Open streams speaking for each rank, and the ranks of each stream: a
  // rank is detached from the engine when its count drops to 0 (a reconnect
  // attaches the new stream before the old one ends, hence a count).
  std::vector<uint32_t> rank_streams;
  std::unordered_map<const JobSubscriber*, std::vector<uint32_t>> stream_ranks;
  // The client incarnation speaking for each rank since the engine's current
  // lineage began (0 = none yet), and which ranks another incarnation took
  // over since: see JobRegistry::NoteIncarnationsLocked.
  std::vector<uint64_t> lineage_incarnation;
  std::vector<bool> restarted;
  uint32_t restarted_count = 0;
  // Each rank's declared peer group and replica (docs/topology.md).
  RankTopologies topology;
  // Reports refused as stale (older than the rank's newest iteration within
  // one incarnation) and when one was last logged: logged at most every 10 s.
  uint64_t stale_reports = 0;
  engine::Time stale_logged{0};
  // Set by AdminService.SetPolicy: a SIGHUP reload then leaves the policy
  // alone, so an operator's runtime decision is not silently undone.
  bool policy_overridden = false;
  uint64_t pushed_version = 0;  // newest membership version pushed
  // The reason given with each rank's current SetRankOverride (what the
  // state database keeps with the override; the engine keeps only the kind).
  std::map<uint32_t, std::string> override_reasons;
  // Iterations from an episode's first slow step to its detection, one
  // observation per healthy -> straggler event journaled (CommitLocked).
  // Kept across Reset, like every cumulative metric.
  prometheus::Histogram detection_latency{DetectionLatencyBuckets()};
  // Creation, last report, last stream detach: what the idle sweep measures.
  engine::Time last_activity;
  // The newest accepted reports (ingest appends, ExportReports reads);
  // capacity limits.recent_reports_per_job as of the job's creation.
  RecentReports recent;
  // Latest GPU telemetry per rank (ReportBatch.telemetry): empty until the
  // first sample arrives, then world_size slots, so bounded by the job.
  std::vector<std::optional<RankGpu>> gpu;
  // Latest host telemetry per rank, likewise: empty until the first sample.
  std::vector<RankHost> host;
  // Each rank's recent phase levels (attribution.h): empty until the first
  // report with input_wait_seconds or optimizer_seconds, then world_size x
  // 16 bytes; a job that reports no phases pays nothing.
  std::vector<RankPhases> phases;
  // The likely cause found when each rank now a straggler was detected
  // (shown on its Worker and as straggler_rank_likely_cause); an entry
  // leaves when its rank leaves the straggler state.
  std::unordered_map<uint32_t, Attribution> straggler_causes;

  // `rank` < the job's world_size.
  void StoreTelemetry(uint32_t rank, v1::GpuTelemetry telemetry, engine::Time now) {
    if (gpu.empty()) gpu.resize(nodes.size());  // nodes: one per rank
    gpu[rank] = RankGpu{std::move(telemetry), now};
  }
  // `rank` < the job's world_size.
  void StoreHostNode(uint32_t rank, std::shared_ptr<const v1::HostTelemetry> node,
                     engine::Time now) {
    if (host.empty()) host.resize(nodes.size());
    host[rank].node = std::move(node);
    host[rank].node_received = now;
  }
  void StoreProcess(uint32_t rank, v1::ProcessTelemetry process, engine::Time now) {
    if (host.empty()) host.resize(nodes.size());
    host[rank].process = std::move(process);
    host[rank].process_received = now;
  }
  // An accepted report's phases; `rank` < the job's world_size.
  void NotePhases(uint32_t rank, std::optional<double> input_wait, double compute,
                  std::optional<double> optimizer) {
    straggler::daemon::NotePhases(phases, nodes.size(), rank, input_wait, compute, optimizer);
  }
  // The rank's telemetry if it is fresh at `now`, else null.
  const v1::GpuTelemetry* FreshTelemetry(uint32_t rank, engine::Time now) const {
    if (rank >= gpu.size() || !gpu[rank] || !gpu[rank]->Fresh(now)) return nullptr;
    return &gpu[rank]->telemetry;
  }
  // What is known of `rank` at `now`: fresh telemetry only (attribution.h).
  RankEvidence EvidenceOf(uint32_t rank, engine::Time now) const;
  // The likely cause of `rank` being slow, from what is known of it against
  // the other ranks (attribution.h).
  Attribution Attribute(uint32_t rank, engine::Time now) const;
};

class Job {
 public:
  class Locked;

  Job(std::string job_id, uint32_t world, engine::PolicyConfig policy, engine::Time now,
      uint64_t daemon_incarnation, uint32_t recent_reports_capacity = 0,
      std::string run = std::string())
      : id(std::move(job_id)),
        run_id(std::move(run)),
        world_size(world),
        created_at(now),
        incarnation(daemon_incarnation),
        state_(world, std::move(policy), now, recent_reports_capacity) {}
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const std::string id;
  // The launch of the job this object tracks (StreamHello.run_id; "" = the
  // default run). Another run gets another Job (docs/runs.md).
  const std::string run_id;
  const uint32_t world_size;
  const engine::Time created_at;
  // Random per daemon run, stamped on every membership: a client that
  // reconnects holding this run's versions needs no version floor.
  const uint64_t incarnation;

  // Set (through Locked::MarkRemoved, under the mutex) when the job leaves
  // the registry: idle, or its run retired. Lock-free, so a map lookup may
  // skip a removed job; whoever then locks it checks again.
  bool removed() const { return removed_.load(); }

 private:
  mutable absl::Mutex mu_;
  JobState state_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> removed_{false};
};

// Holds a job's mutex from construction to destruction, and is the only way
// to its JobState. Also carries the job's identity by reference, so code
// under the lock reads `job.id` and `job->engine` alike. Not copyable or
// movable: the lock lives exactly as long as the scope that names it.
class ABSL_SCOPED_LOCKABLE Job::Locked {
 public:
  explicit Locked(Job& job) ABSL_EXCLUSIVE_LOCK_FUNCTION(job.mu_)
      : id(job.id),
        run_id(job.run_id),
        world_size(job.world_size),
        created_at(job.created_at),
        incarnation(job.incarnation),
        job_(job) {
    job.mu_.Lock();
  }
  ~Locked() ABSL_UNLOCK_FUNCTION() { job_.mu_.Unlock(); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

  const std::string& id;
  const std::string& run_id;
  const uint32_t world_size;
  const engine::Time created_at;
  const uint64_t incarnation;

  // The guarded state. The analysis cannot tie a handle's lifetime to the
  // mutex it holds, hence no analysis here: a Locked exists only while its
  // constructor's lock is held, which the analysis does check.
  JobState* operator->() ABSL_NO_THREAD_SAFETY_ANALYSIS { return &job_.state_; }
  const JobState* operator->() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return &job_.state_; }
  JobState& operator*() ABSL_NO_THREAD_SAFETY_ANALYSIS { return job_.state_; }
  const JobState& operator*() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return job_.state_; }

  // The job itself (identity, removed()), e.g. to keep a pointer to it.
  const Job& job() const { return job_; }
  // The job leaves the registry: finders skip it, lockers treat it as absent.
  void MarkRemoved() { job_.removed_.store(true); }

 private:
  Job& job_;
};

// Something that wants a job's membership changes: an ingest stream (to push
// directives) or a WatchMembership call. The registry holds it by
// shared_ptr; the RPC behind it may already be gone, which the implementation
// must tolerate (see ingest_service.cc). Both calls come with the job's
// mutex held (the handle proves it): they must not block and must not call
// back into the registry.
class JobSubscriber {
 public:
  virtual ~JobSubscriber() = default;
  // The job's membership version changed.
  virtual void OnMembershipChangedLocked(const Job::Locked& job) = 0;
  // The daemon is shutting down: end the RPC with `status`.
  virtual void CloseLocked(const absl::Status& status) = 0;
};

}  // namespace straggler::daemon
