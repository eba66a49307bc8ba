// One ingest stream's work on its job, without gRPC: the hello that attaches
// the stream, each ReportBatch applied at a given time (rate limit,
// telemetry, rank filter, engine, report ring, rejections, commit) and the
// Directive that acknowledges it, and the directives pushed when the job's
// membership changes. The gRPC reactor (ingest_service.cc) only reads,
// calls this, and writes what it hands back. docs/code-map.md follows a
// report through it.
//
//   IngestSession session(registry, stats, "peer", link, limits, steady_now);
//   if (absl::Status s = session.Open(first_batch, WallNow()); !s.ok()) ...;  // refuse
//   session.Apply(batch, WallNow(), steady_now,
//                 [&](v1::Directive&& ack) { slot.Offer(std::move(ack), ...); });
//
// Not thread-safe, with one exception: the stream's read chain calls Open
// and Apply one at a time; PushLocked runs on any thread with the job's mutex
// held (registry pushes), and shares state with Apply only under that mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "config/config.h"
#include "metrics/stats.h"
#include "registry/job_registry.h"
#include "straggler/common/rate_limit.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::daemon {

class IngestSession {
 public:
  using SteadyTime = std::chrono::steady_clock::time_point;

  // `link` is what the registry pushes membership changes to (subscribed by
  // Open); `limits` are the stream's as of its opening (a reload applies to
  // later streams); `peer` names the stream in logs. `registry` and `stats`
  // must outlive the session.
  IngestSession(JobRegistry& registry, DaemonStats& stats, std::string peer,
                std::shared_ptr<JobSubscriber> link, const Limits& limits, SteadyTime now);

  // The stream's first batch: its hello attaches the stream to the job
  // (JobRegistry::Attach, which creates the job on first sight). An error
  // refuses the stream: INVALID_ARGUMENT (a bad or missing hello),
  // RESOURCE_EXHAUSTED (too many jobs), UNAVAILABLE (shutting down),
  // FAILED_PRECONDITION (another run is live). The batch's reports are
  // applied by the Apply that follows, as for any batch.
  absl::Status Open(const v1::ReportBatch& first, engine::Time now);

  // Applies `batch` (after a successful Open) at wall time `now`; `steady_now`
  // drives the stream's rate limit. A later hello adds ranks (refused ones are
  // named in the rejections, reason invalid_hello). The acknowledgement
  // (accepted, rejected, duplicates, at most kMaxDirectiveRejections
  // rejections, the progress of the ranks the batch touched and the
  // memberships not carried yet) goes to `deliver` while the job's mutex is
  // still held, so directives reach the write slot in the order their
  // memberships were taken. `batch` is consumed (its telemetry is moved out).
  // `spare` is built into (WriteSlot::TakeSpare: a cleared earlier one).
  void Apply(v1::ReportBatch& batch, engine::Time now, SteadyTime steady_now,
             absl::FunctionRef<void(v1::Directive&&)> deliver, v1::Directive spare = {});

  // Under the job's lock: the directive a membership change pushes to the
  // stream (the memberships it has not carried yet, no progress).
  v1::Directive PushLocked(const Job::Locked& job) { return DirectiveLocked(job, nullptr); }

  // Null before a successful Open.
  const std::shared_ptr<Job>& job() const { return job_; }
  // Ascending, unique; fixed by Open, grown by later hellos (under the
  // job's lock).
  const std::vector<uint32_t>& ranks() const { return ranks_; }

 private:
  // `rank`'s index in ranks_, or nullopt when the stream does not speak for
  // it. A stream's ranks are usually one range (a node's GPUs, loadgen's
  // slices): the index is then a subtraction, inline, not a binary search
  // (which was 60% of Apply's own time at 4 M reports/s).
  std::optional<size_t> IndexOf(uint32_t rank) const {
    if (ranks_.empty()) return std::nullopt;
    const uint32_t first = ranks_.front(), last = ranks_.back();
    if (last - first + 1 != ranks_.size()) return SearchIndex(rank);
    if (rank < first || rank > last) return std::nullopt;
    return rank - first;
  }
  std::optional<size_t> SearchIndex(uint32_t rank) const;
  // The *Locked methods run under the job's lock: the handle proves it.
  void RecheckClaimLocked(Job::Locked& job, std::optional<uint64_t> max_accepted,
                          engine::Time now);
  void MarkReplaysLocked(const Job::Locked& job);
  absl::Status AddRanksLocked(Job::Locked& job, const v1::ReportBatch& batch, engine::Time now);
  v1::Directive DirectiveLocked(const Job::Locked& job, const std::vector<uint32_t>* touched,
                                v1::Directive d = {});
  // What one batch's acknowledgement counts (Apply and the steps it takes).
  struct BatchTally {
    uint32_t accepted = 0, rejected = 0, duplicates = 0;
    std::vector<v1::ReportRejection> rejections;  // at most kMaxDirectiveRejections
    // A rejection entry (and, when it counts a report, one more rejected).
    void Reject(uint32_t rank, uint64_t iteration, absl::string_view reason, std::string message,
                bool counts_a_report = true);
  };
  // Apply's steps, in its order: a later hello's ranks and refused claims,
  // the telemetry, the reports through the engine.
  void ApplyHelloLocked(Job::Locked& job, const v1::ReportBatch& batch, engine::Time now,
                        BatchTally& tally);
  void StoreTelemetryLocked(Job::Locked& job, v1::ReportBatch& batch, engine::Time now);
  std::optional<uint64_t> IngestReportsLocked(Job::Locked& job, const v1::ReportBatch& batch,
                                              int granted, engine::Time now, BatchTally& tally);

  JobRegistry& registry_;
  DaemonStats& stats_;
  const std::string peer_;
  const std::shared_ptr<JobSubscriber> link_;
  const Limits limits_;
  common::TokenBucket bucket_;  // Apply's only

  // Written by Open and Apply (the read chain); ranks_ is fixed before Open
  // subscribes the link, later changes happen under the job's lock.
  std::shared_ptr<Job> job_;
  std::vector<uint32_t> ranks_;  // ascending, unique
  // The last hello's refused topology claims, until its batch is acknowledged.
  std::vector<TopologyRefusal> topology_refused_;
  // Per ranks_ index: progress + 1 at hello (MarkReplaysLocked); empty
  // when every one is 0.
  std::vector<uint64_t> replay_mark_;
  std::optional<uint64_t> claimed_reported_;  // the hello's, until RecheckClaimLocked
  // Per batch: indices into ranks_ of the ranks with a report (touched_),
  // found through touched_mark_[index] (a bit, not a 4-byte stamp per rank).
  std::vector<uint32_t> touched_;
  std::vector<bool> touched_mark_;
  bool first_batch_ = true;           // the batch that carried the opening hello
  // Written and read only by the *Locked methods, i.e. under the job's lock.
  uint64_t last_acked_sequence_ = 0;
  // Newest membership version already offered; nullopt before the first
  // directive. Under the job's lock (pushes arrive with it held, possibly
  // from Attach before job_ is set).
  std::optional<uint64_t> offered_version_;
};

}  // namespace straggler::daemon
