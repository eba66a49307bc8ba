// QueryService: read-only views of jobs, workers, memberships and the event
// journal, plus WatchMembership (a server stream of membership versions).
//
//   QueryServiceImpl query(registry, stats, auth);
//   builder.RegisterService(&query);
//
// Unary calls run on gRPC's callback threads and only translate: the logic is
// api.h's (shared with REST), which holds one job's mutex while copying its
// state out. WatchMembership keeps one write in flight and only
// the newest version pending, so a slow watcher (or one that never reads)
// may skip versions (counted: straggler_watch_versions_skipped_total) but
// never makes the daemon buffer more than one version per watcher beyond
// gRPC's flow-control window.
//
// With auth.protect_reads every call needs the bearer token (auth.h).
//
// In a cluster (`cluster` not null, docs/cluster.md) a call about one job
// that this replica does not serve, while another replica owns it, ends
// UNAVAILABLE with the owner in its trailing metadata (server/redirect.h),
// as admin calls do; ListJobs answers from the jobs served here.
// Thread-safe; the registry, stats and authorizer must outlive the server.
#pragma once

#include "api/api_service.h"
#include "server/cluster_member.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::daemon {

class QueryServiceImpl final : public straggler::v1::QueryService::CallbackService,
                               ApiService {
 public:
  QueryServiceImpl(JobRegistry& registry, DaemonStats& stats, const Authorizer& auth,
                   ClusterMember* cluster = nullptr)
      : ApiService(registry, stats, auth, GrpcService::kQuery), cluster_(cluster) {}

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const straggler::v1::ListJobsRequest* request,
                                     straggler::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const straggler::v1::GetJobRequest* request,
                                   straggler::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const straggler::v1::ListWorkersRequest* request,
                                        straggler::v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* GetWorker(grpc::CallbackServerContext* ctx,
                                      const straggler::v1::GetWorkerRequest* request,
                                      straggler::v1::Worker* response) override;
  grpc::ServerUnaryReactor* GetMembership(grpc::CallbackServerContext* ctx,
                                          const straggler::v1::GetMembershipRequest* request,
                                          straggler::v1::Membership* response) override;
  grpc::ServerWriteReactor<straggler::v1::Membership>* WatchMembership(
      grpc::CallbackServerContext* ctx,
      const straggler::v1::WatchMembershipRequest* request) override;
  grpc::ServerUnaryReactor* ListEvents(grpc::CallbackServerContext* ctx,
                                       const straggler::v1::ListEventsRequest* request,
                                       straggler::v1::ListEventsResponse* response) override;
  grpc::ServerUnaryReactor* ExportReports(grpc::CallbackServerContext* ctx,
                                          const straggler::v1::ExportReportsRequest* request,
                                          straggler::v1::ExportReportsResponse* response) override;

 private:
  // `api` about `job_id` (a query of one job), or the redirect to its owner
  // when this replica does not serve it and another replica owns it.
  template <class Msg, class Api>
  grpc::ServerUnaryReactor* OfJob(grpc::CallbackServerContext* ctx, const std::string& job_id,
                                  Msg* response, Api api) {
    return Authorized(ctx, Access::kRead, response, [&]() -> absl::StatusOr<Msg> {
      if (absl::Status s = Route(job_id); !s.ok()) return s;
      return api();
    });
  }
  absl::Status Route(const std::string& job_id) const;

  ClusterMember* const cluster_;  // null: alone
};

}  // namespace straggler::daemon
