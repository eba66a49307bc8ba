// The base of the gRPC services whose calls are api.h's, shared with REST
// (QueryService, AdminService): what they hold (the registry, the
// authorizer, the counter of their refusals) and how one of their unary
// calls runs: checked against the token, then the api:: call, its result
// the response or the status.
//
//   grpc::ServerUnaryReactor* QueryServiceImpl::GetJob(ctx, request, response) {
//     return Authorized(ctx, Access::kRead, response,
//                       [&] { return api::GetJob(registry_, *request); });
//   }
//
// Thread-safe as its members: the registry and authorizer are, and the
// counter is atomic; they must outlive the server.
#pragma once

#include <grpcpp/grpcpp.h>

#include "api/rpc_util.h"
#include "auth/auth.h"
#include "metrics/stats.h"
#include "registry/job_registry.h"

namespace straggler::daemon {

class ApiService {
 protected:
  ApiService(JobRegistry& registry, DaemonStats& stats, const Authorizer& auth,
             GrpcService service)
      : registry_(registry), stats_(stats), auth_(auth), call_{stats, service} {}

  // A unary call that auth_ admits for `access` gets api()'s result (an
  // absl::StatusOr<Msg>); otherwise it ends UNAUTHENTICATED without running
  // it. Every refusal is counted under this service
  // (straggler_grpc_refused_total).
  template <class Msg, class Api>
  grpc::ServerUnaryReactor* Authorized(grpc::CallbackServerContext* ctx, Access access,
                                       Msg* response, Api api) {
    return FinishAuthorized(ctx, auth_, access, api, response, call_);
  }

  JobRegistry& registry_;
  DaemonStats& stats_;
  const Authorizer& auth_;
  const CallOf call_;
};

}  // namespace straggler::daemon
