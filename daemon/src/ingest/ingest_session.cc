#include "ingest/ingest_session.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "registry/job_proto.h"
#include "spdlog/spdlog.h"
#include "straggler/common/directive.h"
#include "wire/convert.h"

namespace straggler::daemon {

IngestSession::IngestSession(JobRegistry& registry, DaemonStats& stats, std::string peer,
                             std::shared_ptr<JobSubscriber> link, const Limits& limits,
                             SteadyTime now)
    : registry_(registry),
      stats_(stats),
      peer_(std::move(peer)),
      link_(std::move(link)),
      limits_(limits),
      bucket_(limits_.stream_reports_per_second, limits_.stream_reports_burst, now) {}

absl::Status IngestSession::Open(const v1::ReportBatch& first, engine::Time now) {
  if (absl::Status s = common::RequireHello(first); !s.ok()) return s;
  common::StreamHello hello = FromProto(first.hello());
  // ranks_ must be in place before Attach subscribes the link: a push may
  // arrive from another thread right after.
  ranks_ = hello.ranks;
  touched_mark_.assign(ranks_.size(), false);
  auto job = registry_.Attach(hello, link_, now, &topology_refused_);
  if (!job.ok()) return job.status();
  job_ = *std::move(job);
  {
    const Job::Locked locked(*job_);
    MarkReplaysLocked(locked);
  }
  claimed_reported_ = hello.reported_iteration;
  // Rate-limited: 10 000 streams opening must not write 10 000 lines.
  spdlog::log(stats_.stream_log.Level(std::chrono::steady_clock::now()),
              "job={} run='{}' stream from {} node='{}' ranks={} world_size={}", job_->id,
              job_->run_id, peer_, hello.node, ranks_.size(), hello.world_size);
  return absl::OkStatus();
}

// Under the job's lock: the hello's reported_iteration against the stream's
// first accepted reports. A claim more than kMaxIterationJump above them
// was false (a hostile or broken client): the engine forgets the floors
// hellos set and rebases a version put out of reach (docs/runs.md, "What a
// hello may claim"). Checked once, on the first batch with a report taken.
void IngestSession::RecheckClaimLocked(Job::Locked& job, std::optional<uint64_t> max_accepted,
                                       engine::Time now) {
  if (!claimed_reported_ || !max_accepted) return;
  const uint64_t claim = *claimed_reported_;
  claimed_reported_.reset();
  if (claim <= *max_accepted || claim - *max_accepted <= engine::JobEngine::kMaxIterationJump) {
    return;
  }
  stats_.hello_claims_dropped.fetch_add(1, std::memory_order_relaxed);
  job->engine.DropClaims(now);
  spdlog::warn("job={} stream from {}: its hello claimed reported_iteration={} but its reports "
               "are at iteration {}: the claim is dropped",
               job_->id, peer_, claim, *max_accepted);
}

// Under the job's lock: what the daemon had processed of each rank of the
// stream when the stream said hello. A report at or below it is a replay
// (a resend after a reconnect, an agent's backlog): counted as a
// duplicate, not an error. One below the rank's newest iteration but above
// the mark came from a live client going backwards (docs/runs.md, "The
// iteration rule"): stale, logged and counted for alerting.
void IngestSession::MarkReplaysLocked(const Job::Locked& job) {
  // Sized at the first rank with progress: a new job's streams keep none
  // (8 bytes a rank of a million-rank job).
  std::vector<uint64_t>().swap(replay_mark_);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (auto p = job->engine.Progress(ranks_[i])) {
      if (replay_mark_.empty()) replay_mark_.assign(ranks_.size(), 0);
      replay_mark_[i] = *p + 1;
    }
  }
}

void IngestSession::BatchTally::Reject(uint32_t rank, uint64_t iteration,
                                       absl::string_view reason, std::string message,
                                       bool counts_a_report) {
  // `rejected` counts reports (Directive.rejected); a refused hello claim
  // keeps its rank's reports, so only its rejection entry is sent.
  if (counts_a_report) ++rejected;
  if (rejections.size() < common::kMaxDirectiveRejections) {
    v1::ReportRejection r;
    r.set_rank(rank);
    r.set_iteration(iteration);
    r.set_reason(std::string(reason));
    r.set_message(std::move(message));
    rejections.push_back(std::move(r));
  }
}

// A hello after the first adds ranks to the stream (a node agent whose
// ranks connect at different times). Taken under the job's lock, as
// pushes read ranks_ there. The next directive carries a full set again
// (every rank's progress, every version a rank of the stream may need),
// since a new rank may need versions older than those the stream carried
// so far.
void IngestSession::ApplyHelloLocked(Job::Locked& job, const v1::ReportBatch& batch,
                                     engine::Time now, BatchTally& tally) {
  if (batch.has_hello() && !first_batch_) {
    if (absl::Status s = AddRanksLocked(job, batch, now); !s.ok()) {
      // Not a report: the batch's reports are counted one by one (those of
      // the refused ranks as rank_not_in_stream).
      tally.Reject(0, 0, "invalid_hello", std::string(s.message()), /*counts_a_report=*/false);
    }
  }
  first_batch_ = false;
  // A hello's refused topology claims (docs/topology.md): the rank and its
  // reports stay, the client learns why in this batch's acknowledgement.
  if (batch.has_hello()) {  // only a hello refuses claims
    for (TopologyRefusal& r : topology_refused_) {
      tally.Reject(r.rank, 0, "invalid_topology", std::move(r.message),
                   /*counts_a_report=*/false);
    }
    topology_refused_.clear();
  }
}

void IngestSession::StoreTelemetryLocked(Job::Locked& job, v1::ReportBatch& batch,
                                         engine::Time now) {
  for (v1::RankTelemetry& t : *batch.mutable_telemetry()) {
    if (!IndexOf(t.rank())) {
      stats_.telemetry_rejected_rank.fetch_add(1, std::memory_order_relaxed);
      spdlog::debug("job={} telemetry for rank {} ignored: not a rank of the stream from {}",
                    job_->id, t.rank(), peer_);
      continue;
    }
    if (absl::Status s = common::ValidateTelemetry(t.gpu()); !s.ok()) {
      stats_.telemetry_rejected_invalid.fetch_add(1, std::memory_order_relaxed);
      if (spdlog::should_log(spdlog::level::debug))  // no string per rejection otherwise
        spdlog::debug("job={} rank={} {}", job_->id, t.rank(), std::string(s.message()));
      continue;
    }
    stats_.telemetry_accepted.fetch_add(1, std::memory_order_relaxed);
    job->StoreTelemetry(t.rank(), std::move(*t.mutable_gpu()), now);
  }
  // Host telemetry (docs/agent.md#host-telemetry): the node's sample is every
  // rank's of the stream, a process's its rank's. Counted with the GPU's.
  auto invalid = [&](const absl::Status& s) {
    stats_.telemetry_rejected_invalid.fetch_add(1, std::memory_order_relaxed);
    if (spdlog::should_log(spdlog::level::debug))
      spdlog::debug("job={} {}", job_->id, std::string(s.message()));
  };
  if (batch.has_host()) {
    if (absl::Status s = common::ValidateHostTelemetry(batch.host()); !s.ok()) {
      invalid(s);
    } else {
      stats_.telemetry_accepted.fetch_add(1, std::memory_order_relaxed);
      auto node = std::make_shared<const v1::HostTelemetry>(std::move(*batch.mutable_host()));
      for (uint32_t rank : ranks_) job->StoreHostNode(rank, node, now);
    }
  }
  for (v1::ProcessTelemetry& p : *batch.mutable_processes()) {
    if (!IndexOf(p.rank())) {
      stats_.telemetry_rejected_rank.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (absl::Status s = common::ValidateProcessTelemetry(p); !s.ok()) {
      invalid(s);
      continue;
    }
    stats_.telemetry_accepted.fetch_add(1, std::memory_order_relaxed);
    const uint32_t rank = p.rank();  // before the move: argument order is unspecified
    job->StoreProcess(rank, std::move(p), now);
  }
}

// The first `granted` reports through the engine (between its BeginBatch and
// EndBatch): each one accepted, a replay, stale or rejected; returns the
// highest iteration accepted.
std::optional<uint64_t> IngestSession::IngestReportsLocked(Job::Locked& job,
                                                           const v1::ReportBatch& batch,
                                                           int granted, engine::Time now,
                                                           BatchTally& tally) {
  std::optional<uint64_t> max_accepted;
  // The baseline and step time the ring records with each report (O(1)).
  const float scored_reference = static_cast<float>(job->engine.baseline_seconds());
  const float scored_step = static_cast<float>(job->engine.step_seconds());
  for (int i = 0; i < granted; ++i) {
    const v1::IterationReport& report = batch.reports(i);
    const std::optional<size_t> slot = IndexOf(report.rank());
    if (!slot) {
      stats_.CountRejected(StreamRejectReason::kRankNotInStream);
      tally.Reject(report.rank(), report.iteration(),
                   StreamRejectReasonName(StreamRejectReason::kRankNotInStream),
                   absl::StrCat("rank ", report.rank(), " is not among the ", ranks_.size(),
                                " ranks named in this stream's hello"));
      continue;
    }
    const size_t index = *slot;
    if (!touched_mark_[index]) {
      touched_mark_[index] = true;
      touched_.push_back(static_cast<uint32_t>(index));
    }
    engine::IngestResult result = job->engine.Ingest(FromProto(report), now);
    if (result.accepted) {
      ++tally.accepted;
      max_accepted = std::max(max_accepted, std::optional<uint64_t>(report.iteration()));
      auto kept = [](bool has, double v) {
        return has ? static_cast<float>(v) : RecentReport::kAbsent;
      };
      job->recent.Add({report.epoch(), report.iteration(), report.compute_seconds(),
                       report.rank(), scored_reference, scored_step,
                       kept(report.has_work(), report.work()),
                       kept(report.has_input_wait_seconds(), report.input_wait_seconds()),
                       kept(report.has_optimizer_seconds(), report.optimizer_seconds())});
      // The phase levels attribution reads (a branch for jobs without phases).
      job->NotePhases(report.rank(),
                      report.has_input_wait_seconds()
                          ? std::optional<double>(report.input_wait_seconds())
                          : std::nullopt,
                      report.compute_seconds(),
                      report.has_optimizer_seconds()
                          ? std::optional<double>(report.optimizer_seconds())
                          : std::nullopt);
    } else if (result.reason == engine::RejectReason::kDuplicate ||
               (result.reason == engine::RejectReason::kStale && index < replay_mark_.size() &&
                report.iteration() < replay_mark_[index])) {
      // A replay (reconnect, agent buffer): idempotent, not the sender's error.
      stats_.CountRejected(engine::RejectReason::kDuplicate);
      ++tally.duplicates;
    } else if (result.reason == engine::RejectReason::kStale) {
      stats_.CountRejected(result.reason);
      ++job->stale_reports;
      if (now - job->stale_logged >= std::chrono::seconds(10)) {
        job->stale_logged = now;
        spdlog::warn("job={} run='{}' stream from {}: {} ({} stale reports so far; a restarted "
                     "trainer must be a new client: docs/runs.md)",
                     job_->id, job_->run_id, peer_, result.message, job->stale_reports);
      }
      tally.Reject(report.rank(), report.iteration(),
                   std::string(engine::RejectReasonName(result.reason)), std::move(result.message));
    } else {
      stats_.CountRejected(result.reason);
      tally.Reject(report.rank(), report.iteration(),
                   std::string(engine::RejectReasonName(result.reason)), std::move(result.message));
    }
  }
  return max_accepted;
}

void IngestSession::Apply(v1::ReportBatch& batch, engine::Time now, SteadyTime steady_now,
                          absl::FunctionRef<void(v1::Directive&&)> deliver,
                          v1::Directive spare) {
  stats_.batches_total.fetch_add(1, std::memory_order_relaxed);
  // straggler_ingest_batch_duration_seconds: waiting for the job's lock
  // included, writing the acknowledgement excluded (that is gRPC's).
  const auto started = std::chrono::steady_clock::now();
  struct Timer {
    common::AtomicHistogram& h;
    std::chrono::steady_clock::time_point start;
    ~Timer() {
      h.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  } timer{stats_.ingest_batch_duration, started};
  const uint32_t max_reports = registry_.max_batch_reports();
  BatchTally tally;

  // Ranks (as indices into ranks_) with a report in this batch: the ack
  // carries their progress only. A bit per slot, the last batch's cleared
  // through its list.
  for (uint32_t index : touched_) touched_mark_[index] = false;
  touched_.clear();

  Job::Locked job(*job_);
  ApplyHelloLocked(job, batch, now, tally);
  // Telemetry before reports: a detection made by this batch's reports is
  // attributed with the telemetry that rode along with them.
  StoreTelemetryLocked(job, batch, now);
  const int n = batch.reports_size();
  // Reports past limits.max_batch_reports, then those the stream's rate
  // limit has no tokens for, are dropped (one rejection entry each).
  const int considered = static_cast<int>(std::min<uint64_t>(n, max_reports));
  const int granted = static_cast<int>(
      bucket_.Take(static_cast<uint64_t>(considered), steady_now));
  auto drop = [&](int from, int to, StreamRejectReason why, std::string message) {
    const uint32_t excess = static_cast<uint32_t>(to - from);
    stats_.CountRejected(why, excess);
    tally.Reject(batch.reports(from).rank(), batch.reports(from).iteration(),
                 StreamRejectReasonName(why), std::move(message));
    tally.rejected += excess - 1;
  };
  job->engine.BeginBatch();
  const std::optional<uint64_t> max_accepted = IngestReportsLocked(job, batch, granted, now, tally);
  job->engine.EndBatch(now);
  RecheckClaimLocked(job, max_accepted, now);
  if (batch.finished_ranks_size() > 0) {
    registry_.FinishRanksLocked(
        job, link_.get(),
        std::vector<uint32_t>(batch.finished_ranks().begin(), batch.finished_ranks().end()),
        now);
  }
  if (granted < considered) {
    drop(granted, considered, StreamRejectReason::kRateLimited,
         absl::StrCat(considered - granted, " reports of batch ", batch.sequence(),
                      " were dropped: over the stream's limits.stream_reports_per_second=",
                      limits_.stream_reports_per_second, " (burst ",
                      limits_.stream_reports_burst, ")"));
  }
  if (considered < n) {
    drop(considered, n, StreamRejectReason::kBatchTooLarge,
         absl::StrCat(n - considered, " reports beyond limits.max_batch_reports=", max_reports,
                      " in batch ", batch.sequence(), " were dropped"));
  }
  stats_.reports_accepted.fetch_add(tally.accepted, std::memory_order_relaxed);
  if (n > 0) job->last_activity = std::max(job->last_activity, now);
  last_acked_sequence_ = batch.sequence();
  // Other subscribers learn of a new version by push; this stream learns it
  // from the acknowledgement built below, under the same lock.
  registry_.CommitLocked(job, link_.get());

  std::sort(touched_.begin(), touched_.end());  // progress ascending by rank
  v1::Directive ack = DirectiveLocked(job, &touched_, std::move(spare));
  ack.set_accepted(tally.accepted);
  ack.set_rejected(tally.rejected);
  ack.set_duplicates(tally.duplicates);
  for (auto& r : tally.rejections) *ack.add_rejections() = std::move(r);
  // Delivered while the job's lock is still held so that directives enter the slot
  // in the order their memberships were snapshotted.
  deliver(std::move(ack));
}

std::optional<size_t> IngestSession::SearchIndex(uint32_t rank) const {
  const auto it = std::lower_bound(ranks_.begin(), ranks_.end(), rank);
  if (it == ranks_.end() || *it != rank) return std::nullopt;
  return static_cast<size_t>(it - ranks_.begin());
}

// Under the job's lock: merges the ranks of a later hello into ranks_. A bad
// hello is refused (named in the ack's rejections, reason invalid_hello)
// and the stream goes on with its ranks; reports of the refused ranks then
// fail rank_not_in_stream.
absl::Status IngestSession::AddRanksLocked(Job::Locked& job, const v1::ReportBatch& batch,
                                           engine::Time now) {
  common::StreamHello hello = FromProto(batch.hello());
  absl::Status s = registry_.AddRanksLocked(job, link_.get(), hello, now, &topology_refused_);
  if (!s.ok()) {
    // Rate-limited: a client may send a refused hello with every batch.
    spdlog::log(stats_.hello_log.Level(std::chrono::steady_clock::now()),
                "job={} stream from {}: later hello refused: {}", job_->id, peer_,
                std::string(s.message()));
    return s;
  }
  const size_t before = ranks_.size();
  ranks_.insert(ranks_.end(), hello.ranks.begin(), hello.ranks.end());
  std::sort(ranks_.begin(), ranks_.end());
  ranks_.erase(std::unique(ranks_.begin(), ranks_.end()), ranks_.end());
  if (ranks_.size() == before) return absl::OkStatus();
  // Indices into ranks_ moved: the marks restart with the new layout.
  touched_mark_.assign(ranks_.size(), false);
  MarkReplaysLocked(job);
  offered_version_.reset();
  spdlog::info("job={} stream from {} node='{}' now speaks for {} ranks", job_->id, peer_,
               hello.node, ranks_.size());
  return absl::OkStatus();
}

// Under the job's lock: rank progress and the memberships the stream has not
// carried yet. Progress: the stream's first directive carries every rank of
// the stream (that has any); later ones only the ranks in `touched`
// (indices into ranks_ of the ranks the acknowledged batch had reports for;
// null for a push), so an ack costs O(batch), not O(ranks of the stream).
// The client merges progress per rank. The first directive carries
// what the stream's slowest rank may still need; later ones only the
// versions above offered_version_. Directives enter the write slot in the
// order they are built here (under the job's lock), the slot merges rather than
// drops, and the stream delivers in order, so the client holds every
// version offered before it reads a later directive; a stream that dies
// takes the client to a new stream, which starts with a full set again.
// So an acknowledgement still reflects, together with the directives before
// it, every version that existed when it was built, at O(new versions) per
// directive instead of O(kept versions x excluded ranks).
v1::Directive IngestSession::DirectiveLocked(const Job::Locked& job,
                                             const std::vector<uint32_t>* touched,
                                             v1::Directive d) {
  auto add_progress = [&](uint32_t rank, uint64_t iteration) {
    v1::RankProgress* rp = d.add_progress();
    rp->set_rank(rank);
    rp->set_iteration(iteration);
  };
  if (!offered_version_) {
    uint64_t from = std::numeric_limits<uint64_t>::max();
    for (uint32_t rank : ranks_) {
      std::optional<uint64_t> p = job->engine.Progress(rank);
      if (p) add_progress(rank, *p);
      // A rank that never reported may start anywhere: give it everything.
      from = std::min<uint64_t>(from, p.value_or(0));
    }
    for (const engine::Membership& m : job->engine.MembershipsFrom(from)) {
      ToProto(m, job, d.add_memberships());
    }
  } else {
    if (touched != nullptr) {
      for (uint32_t index : *touched) {
        const uint32_t rank = ranks_[index];
        if (std::optional<uint64_t> p = job->engine.Progress(rank)) add_progress(rank, *p);
      }
    }
    const auto& history = job->engine.membership_history();  // ascending
    auto it = std::upper_bound(
        history.begin(), history.end(), *offered_version_,
        [](uint64_t v, const engine::Membership& m) { return v < m.version; });
    for (; it != history.end(); ++it) ToProto(*it, job, d.add_memberships());
  }
  offered_version_ = job->engine.membership().version;
  d.set_acked_sequence(last_acked_sequence_);
  return d;
}

}  // namespace straggler::daemon
