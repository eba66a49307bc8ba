#include "query_service.h"

#include "absl/strings/str_cat.h"
#include "convert.h"
#include "rpc_util.h"
#include "spdlog/spdlog.h"

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

  // Subscribes (which sends the current membership) or finishes NOT_FOUND.
  void Start(const std::string& job_id) {
    // job_ is set before subscribing: once subscribed, a write and a cancel
    // may complete on other threads and run OnDone, which reads job_.
    job_ = registry_.Find(job_id);
    if (!job_) {
      Close(absl::NotFoundError(absl::StrCat("job '", job_id, "' not found")));
      return;
    }
    if (absl::Status s = registry_.Watch(*job_, link_); !s.ok()) Close(s);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    Act(slot_.WriteDone(ok));
  }

  void OnCancel() override {
    std::lock_guard lock(mu_);
    Act(slot_.RequestFinish(grpc::Status::CANCELLED, /*flush=*/false));
  }

  void OnDone() override {
    link_->Detach();
    if (job_) registry_.Unsubscribe(*job_, link_.get(), /*is_stream=*/false);
    stats_.active_watches.fetch_sub(1, std::memory_order_relaxed);
    delete this;
  }

  // Reached through ReactorLink with job.mu held.
  void PushLocked(const Job& job) {
    v1::Membership m;
    ToProto(job.engine.membership(), job, &m);
    std::lock_guard lock(mu_);
    Act(slot_.Offer(std::move(m), &KeepNewest));
  }
  void Close(const absl::Status& status) {
    std::lock_guard lock(mu_);
    Act(slot_.RequestFinish(ToGrpcStatus(status), /*flush=*/true));
  }

 private:
  void Act(WriteAction action) {  // mu_ held
    switch (action) {
      case WriteAction::kWrite: StartWrite(&slot_.current()); break;
      case WriteAction::kFinish: Finish(slot_.finish_status()); break;
      case WriteAction::kNone: break;
    }
  }

  JobRegistry& registry_;
  DaemonStats& stats_;
  const std::shared_ptr<ReactorLink<WatchReactor>> link_;
  std::shared_ptr<Job> job_;  // set in Start, before subscribing

  std::mutex mu_;
  WriteSlot<v1::Membership> slot_;  // guarded by mu_
};

}  // namespace

grpc::ServerUnaryReactor* QueryServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                     const v1::ListJobsRequest*,
                                                     v1::ListJobsResponse* response) {
  for (const auto& job : registry_.Jobs()) {
    std::lock_guard lock(job->mu);
    ToProto(*job, response->add_jobs());
  }
  return FinishUnary(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* QueryServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                   const v1::GetJobRequest* request,
                                                   v1::Job* response) {
  return FinishUnary(ctx, registry_.Read(request->job_id(),
                                  [&](const Job& job) { ToProto(job, response); }));
}

grpc::ServerUnaryReactor* QueryServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                        const v1::ListWorkersRequest* request,
                                                        v1::ListWorkersResponse* response) {
  return FinishUnary(ctx, registry_.Read(request->job_id(), [&](const Job& job) {
    // O(world_size) here: one engine::Worker lookup and an O(1) copy per rank.
    response->mutable_workers()->Reserve(static_cast<int>(job.world_size));
    for (uint32_t rank = 0; rank < job.world_size; ++rank) {
      ToProto(job.engine.Worker(rank), job, response->add_workers());
    }
  }));
}

grpc::ServerUnaryReactor* QueryServiceImpl::GetWorker(grpc::CallbackServerContext* ctx,
                                                      const v1::GetWorkerRequest* request,
                                                      v1::Worker* response) {
  absl::Status in_range;
  absl::Status found = registry_.Read(request->job_id(), [&](const Job& job) {
    if (request->rank() >= job.world_size) {
      in_range = absl::InvalidArgumentError(absl::StrCat("rank ", request->rank(),
                                                         " >= world_size ", job.world_size,
                                                         " of job '", job.id, "'"));
      return;
    }
    ToProto(job.engine.Worker(request->rank()), job, response);
  });
  return FinishUnary(ctx, found.ok() ? in_range : found);
}

grpc::ServerUnaryReactor* QueryServiceImpl::GetMembership(
    grpc::CallbackServerContext* ctx, const v1::GetMembershipRequest* request,
    v1::Membership* response) {
  return FinishUnary(ctx, registry_.Read(request->job_id(), [&](const Job& job) {
    ToProto(job.engine.membership(), job, response);
  }));
}

grpc::ServerWriteReactor<v1::Membership>* QueryServiceImpl::WatchMembership(
    grpc::CallbackServerContext*, const v1::WatchMembershipRequest* request) {
  auto* reactor = new WatchReactor(registry_, stats_);
  reactor->Start(request->job_id());
  return reactor;
}

grpc::ServerUnaryReactor* QueryServiceImpl::ListEvents(grpc::CallbackServerContext* ctx,
                                                       const v1::ListEventsRequest* request,
                                                       v1::ListEventsResponse* response) {
  EventQuery query;
  query.job_id = request->job_id();
  if (request->has_since_time()) query.since_time = FromProto(request->since_time());
  query.since_sequence = request->since_sequence();
  query.limit = request->limit();  // 0 = default; clamped to the maximum
  EventPage page = registry_.Events(query);
  for (const JournalEntry& e : page.events) ToProto(e, response->add_events());
  response->set_last_sequence(page.last_sequence);
  return FinishUnary(ctx, absl::OkStatus());
}

}  // namespace straggler::daemon
