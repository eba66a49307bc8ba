// AdminService: change a job's policy at run time, force a rank in or out,
// reset a job. Every change goes through the job's engine, which records it
// as an event, and a resulting membership is pushed to the job's streams.
// The handlers only translate: the logic is api.h's, shared with REST.
// With auth.token_file set every call needs the bearer token (auth.h).
//
//   AdminServiceImpl admin(registry, stats, auth);
//   builder.RegisterService(&admin);
//
// Thread-safe; the registry and authorizer must outlive the server.
#pragma once

#include "api/api_service.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::daemon {

class AdminServiceImpl final : public straggler::v1::AdminService::CallbackService,
                               ApiService {
 public:
  AdminServiceImpl(JobRegistry& registry, DaemonStats& stats, const Authorizer& auth)
      : ApiService(registry, stats, auth, GrpcService::kAdmin) {}

  grpc::ServerUnaryReactor* SetPolicy(grpc::CallbackServerContext* ctx,
                                      const straggler::v1::SetPolicyRequest* request,
                                      straggler::v1::Job* response) override;
  grpc::ServerUnaryReactor* SetRankOverride(grpc::CallbackServerContext* ctx,
                                            const straggler::v1::SetRankOverrideRequest* request,
                                            straggler::v1::Membership* response) override;
  grpc::ServerUnaryReactor* ResetJob(grpc::CallbackServerContext* ctx,
                                     const straggler::v1::ResetJobRequest* request,
                                     straggler::v1::Job* response) override;
};

}  // namespace straggler::daemon
