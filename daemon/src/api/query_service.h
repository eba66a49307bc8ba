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
// With replicas on etcd (a QueryForwarder), every call answers for any job
// of the cluster: api/query_forward.h.
// Thread-safe; the registry, stats, authorizer and forwarder must outlive
// the server.
#pragma once

#include "api/api_service.h"
#include "api/query_forward.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::daemon {

class QueryServiceImpl final : public straggler::v1::QueryService::CallbackService,
                               ApiService {
 public:
  // `forwarder` null: the daemon runs alone.
  QueryServiceImpl(JobRegistry& registry, DaemonStats& stats, const Authorizer& auth,
                   const QueryForwarder* forwarder = nullptr)
      : ApiService(registry, stats, auth, GrpcService::kQuery), forwarder_(forwarder) {}

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
  // A read as any replica answers it (query_forward.h).
  template <class Req, class Resp>
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const Req* request,
                                   Resp* response) {
    return Authorized(ctx, Access::kRead, response,
                      [&] { return Read(registry_, forwarder_, *request, QueryCallerOf(*ctx)); });
  }

  const QueryForwarder* const forwarder_;
};

}  // namespace straggler::daemon
