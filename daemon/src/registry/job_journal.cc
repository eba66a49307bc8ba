// JobRegistry's commit and event journal: what an engine decided goes to
// the log, the journal (and the state database's queue) and, when the
// membership moved, to every subscriber; ListEvents reads the journal.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "registry/job_proto.h"
#include "registry/job_registry.h"
#include "spdlog/spdlog.h"
#include "wire/convert.h"

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

// The states a rank is slow in: a transition to one gets a likely cause.
bool SlowState(engine::WorkerState s) {
  return s == engine::WorkerState::kStraggler || s == engine::WorkerState::kMild;
}

// One line per event, the operator's view of what the engine decided.
std::string DescribeEvent(const Job::Locked& job, const engine::Event& e,
                          const Attribution& cause) {
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
      if (SlowState(e.to)) {
        absl::StrAppend(&line, "; likely cause ", std::string(LikelyCauseName(cause.cause)),
                        cause.detail.empty() ? absl::string_view(" (no telemetry, no phases)")
                                             : absl::string_view(": "),
                        cause.detail);
      }
      return line;
    }
    case engine::EventKind::kMembership: {
      for (const auto& m : job->engine.membership_history()) {
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

void JobRegistry::CommitLocked(Job::Locked& job, const JobSubscriber* skip) {
  std::vector<engine::Event> events = job->engine.TakeEvents();
  if (!events.empty()) JournalLocked(job, std::move(events));

  const uint64_t version = job->engine.membership().version;
  if (version == job->pushed_version) return;
  if (store_ != nullptr) {
    // Durable before anyone sees it (the ack built after this call, a push,
    // a query): a client can then never hold a version that a restarted
    // daemon does not know of and would hand out again with other content.
    for (const engine::Membership& m : job->engine.membership_history()) {
      if (m.version <= job->pushed_version) continue;
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
  if (shared_ != nullptr) {
    // A daemon that takes the job over starts above this version
    // (docs/cluster.md): written before anyone sees it, as to the store.
    v1::Job state;
    state.set_job_id(job.id);
    state.set_run_id(job.run_id);
    state.set_world_size(job.world_size);
    ToProto(job->engine.membership(), job, state.mutable_membership());
    if (absl::Status s = shared_->SaveMembership(state); !s.ok()) {
      // Another daemon may own the job now: nothing more is published here.
      spdlog::error("job={} membership v{} not published: {}; this daemon stops serving the job",
                    job.id, version, std::string(s.message()));
      job.MarkRemoved();
      for (const auto& sub : job->subscribers) sub->CloseLocked(s);
      job->subscribers.clear();
      return;
    }
  }
  job->pushed_version = version;
  for (const auto& sub : job->subscribers) {
    if (sub.get() != skip) sub->OnMembershipChangedLocked(job);
  }
}

RankEvidence JobState::EvidenceOf(uint32_t rank, engine::Time now) const {
  RankEvidence e;
  e.gpu = FreshTelemetry(rank, now);
  if (rank < phases.size()) e.phases = &phases[rank];
  if (rank < host.size()) {
    const RankHost& h = host[rank];
    if (h.process && now - h.process_received <= kTelemetryStaleAfter) e.process = &*h.process;
    if (h.node && now - h.node_received <= kTelemetryStaleAfter) e.host = h.node.get();
  }
  e.node = nodes[rank];
  return e;
}

Attribution JobState::Attribute(uint32_t rank, engine::Time now) const {
  std::vector<RankEvidence> others;
  if (!gpu.empty() || !phases.empty() || !host.empty()) {
    others.reserve(nodes.size());
    for (uint32_t r = 0; r < nodes.size(); ++r) {
      if (r == rank) continue;
      // Only ranks something is known of: a job without telemetry pays nothing.
      const RankEvidence e = EvidenceOf(r, now);
      if (e.gpu || (e.phases && e.phases->reports > 0) || e.process || e.host) others.push_back(e);
    }
  }
  return AttributeLikelyCause(EvidenceOf(rank, now), others);
}

void JobRegistry::JournalLocked(Job::Locked& job, std::vector<engine::Event> events) {
  std::vector<Attribution> causes(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    const engine::Event& e = events[i];
    if (e.kind != engine::EventKind::kStateChange) continue;
    if (SlowState(e.to)) {
      // Judged at the daemon's clock now, not the event's: the telemetry's
      // freshness is measured on the daemon's receive clock too.
      causes[i] = job->Attribute(e.rank, WallNow());
    }
    if (e.to == engine::WorkerState::kStraggler) {
      job->straggler_causes[e.rank] = causes[i];
      stats_.detections_by_cause[static_cast<size_t>(causes[i].cause)].fetch_add(
          1, std::memory_order_relaxed);
    } else if (e.from == engine::WorkerState::kStraggler) {
      job->straggler_causes.erase(e.rank);
    }
  }
  for (size_t i = 0; i < events.size(); ++i) {
    const engine::Event& e = events[i];
    spdlog::log(stats_.event_log.Level(std::chrono::steady_clock::now()), "{}",
                DescribeEvent(job, e, causes[i]));
    stats_.events_by_kind[static_cast<size_t>(e.kind)].fetch_add(1, std::memory_order_relaxed);
    if (e.kind == engine::EventKind::kStateChange && e.from == engine::WorkerState::kHealthy &&
        e.to == engine::WorkerState::kStraggler) {
      job->detection_latency.Observe(static_cast<double>(e.evidence.latency_iterations));
    }
  }
  stats_.events_total.fetch_add(events.size(), std::memory_order_relaxed);
  absl::MutexLock lock(&events_mu_);
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

EventPage JobRegistry::Events(const EventQuery& query) const {
  uint32_t limit = query.limit == 0 ? kDefaultEventLimit : query.limit;
  limit = std::min(limit, common::kMaxEventLimit);
  EventPage page;
  absl::MutexLock lock(&events_mu_);
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
  absl::MutexLock lock(&events_mu_);
  return next_sequence_ - 1;
}

}  // namespace straggler::daemon
