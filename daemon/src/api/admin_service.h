// AdminService: change a job's policy at run time, force a rank in or out,
// reset a job. Every change goes through the job's engine, which records it
// as an event, and a resulting membership is pushed to the job's streams.
// The handlers only translate: the logic is api.h's, shared with REST.
// With auth.token_file set every call needs the bearer token (auth.h). In a
// cluster (`cluster` not null) a call about a job another replica owns ends
// UNAVAILABLE naming the owner in its trailing metadata (server/redirect.h).
//
//   AdminServiceImpl admin(registry, stats, auth);
//   builder.RegisterService(&admin);
//
// Thread-safe; the registry and authorizer must outlive the server.
#pragma once

#include "api/api_service.h"
#include "server/cluster_member.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::daemon {

class AdminServiceImpl final : public straggler::v1::AdminService::CallbackService,
                               ApiService {
 public:
  AdminServiceImpl(JobRegistry& registry, DaemonStats& stats, const Authorizer& auth,
                   ClusterMember* cluster = nullptr)
      : ApiService(registry, stats, auth, GrpcService::kAdmin), cluster_(cluster) {}

  grpc::ServerUnaryReactor* SetPolicy(grpc::CallbackServerContext* ctx,
                                      const straggler::v1::SetPolicyRequest* request,
                                      straggler::v1::Job* response) override;
  grpc::ServerUnaryReactor* SetRankOverride(grpc::CallbackServerContext* ctx,
                                            const straggler::v1::SetRankOverrideRequest* request,
                                            straggler::v1::Membership* response) override;
  grpc::ServerUnaryReactor* ResetJob(grpc::CallbackServerContext* ctx,
                                     const straggler::v1::ResetJobRequest* request,
                                     straggler::v1::Job* response) override;

 private:
  // OK when this replica serves `job_id` (always when alone). An admin call
  // never takes a job: one nobody owns is answered here (NOT_FOUND).
  absl::Status Route(const std::string& job_id) const {
    return cluster_ == nullptr ? absl::OkStatus() : cluster_->Serve(job_id, /*take=*/false);
  }

  ClusterMember* const cluster_;  // null: alone
};

}  // namespace straggler::daemon
