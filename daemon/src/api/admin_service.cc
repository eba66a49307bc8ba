#include "api/admin_service.h"

#include "api/api.h"
#include "api/rpc_util.h"

namespace straggler::daemon {

grpc::ServerUnaryReactor* AdminServiceImpl::SetPolicy(grpc::CallbackServerContext* ctx,
                                                      const v1::SetPolicyRequest* request,
                                                      v1::Job* response) {
  return Authorized(ctx, Access::kAdmin, response,
                    [&]() -> absl::StatusOr<v1::Job> {
                      if (absl::Status s = Route(request->job_id()); !s.ok()) return s;
                      return api::SetPolicy(registry_, *request, ctx->peer());
                    });
}

grpc::ServerUnaryReactor* AdminServiceImpl::SetRankOverride(
    grpc::CallbackServerContext* ctx, const v1::SetRankOverrideRequest* request,
    v1::Membership* response) {
  return Authorized(ctx, Access::kAdmin, response,
                    [&]() -> absl::StatusOr<v1::Membership> {
                      if (absl::Status s = Route(request->job_id()); !s.ok()) return s;
                      return api::SetRankOverride(registry_, *request, ctx->peer());
                    });
}

grpc::ServerUnaryReactor* AdminServiceImpl::ResetJob(grpc::CallbackServerContext* ctx,
                                                     const v1::ResetJobRequest* request,
                                                     v1::Job* response) {
  return Authorized(ctx, Access::kAdmin, response,
                    [&]() -> absl::StatusOr<v1::Job> {
                      if (absl::Status s = Route(request->job_id()); !s.ok()) return s;
                      return api::ResetJob(registry_, *request, ctx->peer());
                    });
}

}  // namespace straggler::daemon
