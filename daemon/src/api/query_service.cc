#include "api/query_service.h"

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "api/api.h"
#include "registry/job_proto.h"
#include "wire/convert.h"
#include "api/rpc_util.h"
#include "spdlog/spdlog.h"
#include "straggler/common/grpc_status.h"

namespace straggler::daemon {
namespace {

// A watcher wants the newest version only: a pending one is replaced.
void KeepNewest(v1::Membership& pending, v1::Membership&& newer) {
  if (newer.version() >= pending.version()) pending = std::move(newer);
}

class WatchReactor final : public grpc::ServerWriteReactor<v1::Membership> {
 public:
  WatchReactor(JobRegistry& registry, DaemonStats& stats)
      : registry_(registry),
        stats_(stats),
        link_(std::make_shared<ReactorLink<WatchReactor>>(this)) {
    stats_.active_watches.fetch_add(1, std::memory_order_relaxed);
  }

  // Subscribes (which sends the current membership) or finishes NOT_FOUND
  // (INVALID_ARGUMENT for an id no job can have).
  void Start(const std::string& job_id) {
    if (absl::Status s = common::ValidateJobId("job_id", job_id); !s.ok()) {
      Refuse(s);
      return;
    }
    // job_ is set before subscribing: once subscribed, a write and a cancel
    // may complete on other threads and run OnDone, which reads job_.
    job_ = registry_.Find(job_id);
    if (!job_) {
      Refuse(absl::NotFoundError(absl::StrCat("job '", job_id, "' not found")));
      return;
    }
    if (absl::Status s = registry_.Watch(*job_, link_); !s.ok()) Refuse(s);
  }

  // Ends a watch refused at its start, counted like a unary refusal (a
  // watch closed later - shutdown, job removed - is not a refusal).
  void Refuse(const absl::Status& status) {
    stats_.CountGrpcRefused(GrpcService::kQuery, status.code());
    Close(status);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    Act(slot_.WriteDone(ok));
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    Act(slot_.RequestFinish(grpc::Status::CANCELLED, /*flush=*/false));
  }

  void OnDone() override {
    link_->Detach();
    if (job_) registry_.Unsubscribe(*job_, link_.get(), /*is_stream=*/false);
    stats_.active_watches.fetch_sub(1, std::memory_order_relaxed);
    delete this;
  }

  // Reached through ReactorLink under the job's lock.
  void PushLocked(const Job::Locked& job) {
    v1::Membership m;
    ToProto(job->engine.membership(), job, &m);
    absl::MutexLock lock(&mu_);
    bool skipped = false;
    Act(slot_.Offer(std::move(m), &KeepNewest, &skipped));
    if (skipped) stats_.watch_versions_skipped.fetch_add(1, std::memory_order_relaxed);
  }
  void Close(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    Act(slot_.RequestFinish(common::ToGrpcStatus(status), /*flush=*/true));
  }

 private:
  void Act(common::WriteAction action) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    common::CarryOut(action, slot_, *this);
  }

  JobRegistry& registry_;
  DaemonStats& stats_;
  const std::shared_ptr<ReactorLink<WatchReactor>> link_;
  std::shared_ptr<Job> job_;  // set in Start, before subscribing

  absl::Mutex mu_;
  common::WriteSlot<v1::Membership> slot_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status QueryServiceImpl::Route(const std::string& job_id) const {
  if (cluster_ == nullptr || registry_.Find(job_id)) return absl::OkStatus();
  return cluster_->RedirectIfElsewhere(job_id);
}

grpc::ServerUnaryReactor* QueryServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                     const v1::ListJobsRequest* request,
                                                     v1::ListJobsResponse* response) {
  return Authorized(ctx, Access::kRead, response,
                    [&] { return api::ListJobs(registry_, *request); });
}

grpc::ServerUnaryReactor* QueryServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                   const v1::GetJobRequest* request,
                                                   v1::Job* response) {
  return OfJob(ctx, request->job_id(), response,
               [&] { return api::GetJob(registry_, *request); });
}

grpc::ServerUnaryReactor* QueryServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                        const v1::ListWorkersRequest* request,
                                                        v1::ListWorkersResponse* response) {
  return OfJob(ctx, request->job_id(), response,
               [&] { return api::ListWorkers(registry_, *request); });
}

grpc::ServerUnaryReactor* QueryServiceImpl::GetWorker(grpc::CallbackServerContext* ctx,
                                                      const v1::GetWorkerRequest* request,
                                                      v1::Worker* response) {
  return OfJob(ctx, request->job_id(), response,
               [&] { return api::GetWorker(registry_, *request); });
}

grpc::ServerUnaryReactor* QueryServiceImpl::GetMembership(
    grpc::CallbackServerContext* ctx, const v1::GetMembershipRequest* request,
    v1::Membership* response) {
  return OfJob(ctx, request->job_id(), response,
               [&] { return api::GetMembership(registry_, *request); });
}

grpc::ServerWriteReactor<v1::Membership>* QueryServiceImpl::WatchMembership(
    grpc::CallbackServerContext* ctx, const v1::WatchMembershipRequest* request) {
  auto* reactor = new WatchReactor(registry_, stats_);
  if (absl::Status s = auth_.Check(Access::kRead, AuthorizationOf(ctx)); !s.ok()) {
    reactor->Refuse(s);
  } else if (absl::Status r = Route(request->job_id()); !r.ok()) {
    AddRedirectMetadata(r, ctx);
    reactor->Refuse(r);
  } else {
    reactor->Start(request->job_id());
  }
  return reactor;
}

grpc::ServerUnaryReactor* QueryServiceImpl::ListEvents(grpc::CallbackServerContext* ctx,
                                                       const v1::ListEventsRequest* request,
                                                       v1::ListEventsResponse* response) {
  // Events of one job are the owner's (its journal, docs/cluster.md).
  if (request->job_id().empty()) {
    return Authorized(ctx, Access::kRead, response,
                      [&] { return api::ListEvents(registry_, *request); });
  }
  return OfJob(ctx, request->job_id(), response,
               [&] { return api::ListEvents(registry_, *request); });
}

grpc::ServerUnaryReactor* QueryServiceImpl::ExportReports(
    grpc::CallbackServerContext* ctx, const v1::ExportReportsRequest* request,
    v1::ExportReportsResponse* response) {
  return OfJob(ctx, request->job_id(), response,
               [&] { return api::ExportReports(registry_, *request); });
}

}  // namespace straggler::daemon
