#include "ingest/ingest_service.h"

#include <chrono>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "api/rpc_util.h"
#include "ingest/ingest_session.h"
#include "spdlog/spdlog.h"
#include "straggler/common/directive.h"
#include "straggler/common/grpc_status.h"
#include "straggler/common/write_slot.h"

namespace straggler::daemon {
namespace {

// The gRPC side of a stream: admission (limits.max_streams), the read chain,
// the write slot. What a batch does to the job is IngestSession's.
class IngestReactor final
    : public grpc::ServerBidiReactor<v1::ReportBatch, v1::Directive> {
 public:
  IngestReactor(JobRegistry& registry, DaemonStats& stats, ClusterMember* cluster,
                grpc::CallbackServerContext* context, std::string peer)
      : registry_(registry),
        stats_(stats),
        cluster_(cluster),
        context_(context),
        peer_(std::move(peer)),
        link_(std::make_shared<ReactorLink<IngestReactor>>(this)),
        limits_(registry.config()->limits),
        session_(registry, stats, peer_, link_, limits_, std::chrono::steady_clock::now()) {
    stats_.streams_total.fetch_add(1, std::memory_order_relaxed);
    // Only admitted streams count as open: a refused one that has not
    // reached OnDone yet must not inflate the count (10 000 streams at once
    // once read "1088 ingest streams are open" with max_streams=1024).
    int64_t open = stats_.active_streams.load(std::memory_order_relaxed);
    do {
      if (open >= static_cast<int64_t>(limits_.max_streams)) break;
    } while (!stats_.active_streams.compare_exchange_weak(open, open + 1,
                                                          std::memory_order_relaxed));
    admitted_ = open < static_cast<int64_t>(limits_.max_streams);
    if (!admitted_) {
      // Before reading anything: a refused stream costs no parse.
      stats_.CountRefused(StreamRefuseReason::kTooManyStreams);
      spdlog::log(stats_.refused_log.Level(std::chrono::steady_clock::now()),
                  "ingest stream from {} refused: {} streams open (limits.max_streams={})", peer_,
                  open, limits_.max_streams);
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat(open, " ingest streams are open (limits.max_streams=",
                                       limits_.max_streams, "); retry later")),
             /*flush=*/false);
      return;
    }
    StartRead(&batch_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed or went away: deliver what is queued, end.
      Finish(grpc::Status::OK, /*flush=*/true);
      return;
    }
    if (!session_.job()) {
      // In a cluster the hello's job must be this replica's (taken now when
      // nobody owns it: the first hello decides, docs/cluster.md).
      absl::Status s = cluster_ != nullptr && batch_.has_hello()
                           ? cluster_->Serve(batch_.hello().job_id(), /*take=*/true)
                           : absl::OkStatus();
      const bool served = s.ok();
      if (served) s = session_.Open(batch_, WallNow());
      if (!s.ok()) {
        stats_.CountRefused(!served ? StreamRefuseReason::kNotOwner
                            : s.code() == absl::StatusCode::kResourceExhausted
                                ? StreamRefuseReason::kTooManyJobs
                            : s.code() == absl::StatusCode::kUnavailable
                                ? StreamRefuseReason::kShuttingDown
                            : s.code() == absl::StatusCode::kFailedPrecondition
                                ? StreamRefuseReason::kRunLive
                                : StreamRefuseReason::kInvalidHello);
        // One client retrying a refused hello wrote 99 000 of these.
        spdlog::log(stats_.refused_log.Level(std::chrono::steady_clock::now()),
                    "ingest stream from {} refused: {}", peer_, std::string(s.message()));
        AddRedirectMetadata(s, context_);
        Finish(common::ToGrpcStatus(s), /*flush=*/false);
        return;
      }
    } else if (cluster_ != nullptr) {
      // Past the lease's local deadline another replica may soon own the
      // job: no report may move its membership here. The client keeps its
      // last membership and its unacknowledged reports, and reconnects.
      if (absl::Status s = cluster_->CheckMayDecide(session_.job()->id); !s.ok()) {
        Finish(common::ToGrpcStatus(s), /*flush=*/true);
        return;
      }
    }
    v1::Directive spare;
    {
      absl::MutexLock lock(&mu_);
      spare = slot_.TakeSpare();
    }
    session_.Apply(
        batch_, WallNow(), std::chrono::steady_clock::now(),
        [this](v1::Directive&& ack) { Offer(std::move(ack)); }, std::move(spare));
    absl::MutexLock lock(&mu_);
    // No new read once the RPC is being finished (shutdown, broken writes).
    if (!slot_.finishing()) StartRead(&batch_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (ok) stats_.directives_written.fetch_add(1, std::memory_order_relaxed);
    Act(slot_.WriteDone(ok));
  }

  // The call was cancelled: the client cancelled it or went away, or gRPC
  // cut it (its memory quota's RST_STREAM ENHANCE_YOUR_CALM, which nothing
  // else shows the application).
  void OnCancel() override {
    stats_.streams_cancelled.fetch_add(1, std::memory_order_relaxed);
  }

  void OnDone() override {
    // Cut the registry's link before anything else: after this no push can
    // reach `this`.
    link_->Detach();
    if (const std::shared_ptr<Job>& job = session_.job()) {
      registry_.Unsubscribe(*job, link_.get(), /*is_stream=*/true);
      spdlog::debug("job={} stream from {} closed", job->id, peer_);
    }
    if (admitted_) stats_.active_streams.fetch_sub(1, std::memory_order_relaxed);
    delete this;
  }

  // Reached through ReactorLink under the job's lock.
  void PushLocked(const Job::Locked& job) { Offer(session_.PushLocked(job)); }
  // A job dropped because another replica owns it now closes its streams
  // with a redirect (JobRegistry::Drop).
  void Close(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (!slot_.finishing()) AddRedirectMetadata(status, context_);
    Act(slot_.RequestFinish(common::ToGrpcStatus(status), /*flush=*/true));
  }

 private:
  void Offer(v1::Directive d) {
    absl::MutexLock lock(&mu_);
    bool coalesced = false;
    Act(slot_.Offer(std::move(d), &common::MergeDirective, &coalesced));
    if (coalesced) stats_.directives_coalesced.fetch_add(1, std::memory_order_relaxed);
  }

  void Finish(grpc::Status status, bool flush) {
    absl::MutexLock lock(&mu_);
    Act(slot_.RequestFinish(std::move(status), flush));
  }

  void Act(common::WriteAction action) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    common::CarryOut(action, slot_, static_cast<ServerBidiReactor&>(*this));
  }

  JobRegistry& registry_;
  DaemonStats& stats_;
  ClusterMember* const cluster_;  // null: alone
  grpc::CallbackServerContext* const context_;  // for a redirect's trailing metadata
  const std::string peer_;
  const std::shared_ptr<ReactorLink<IngestReactor>> link_;
  // The limits as of the stream's opening (a reload applies to later streams).
  const Limits limits_;
  IngestSession session_;
  v1::ReportBatch batch_;  // the read chain's buffer
  bool admitted_ = false;  // counted in active_streams (under max_streams)

  absl::Mutex mu_;
  common::WriteSlot<v1::Directive> slot_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerBidiReactor<v1::ReportBatch, v1::Directive>* IngestServiceImpl::Stream(
    grpc::CallbackServerContext* context) {
  return new IngestReactor(registry_, stats_, cluster_, context, context->peer());
}

}  // namespace straggler::daemon
