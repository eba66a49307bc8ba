#include "admin_service.h"

#include "absl/strings/str_cat.h"
#include "convert.h"
#include "rpc_util.h"
#include "spdlog/spdlog.h"

namespace straggler::daemon {
grpc::ServerUnaryReactor* AdminServiceImpl::SetPolicy(grpc::CallbackServerContext* ctx,
                                                      const v1::SetPolicyRequest* request,
                                                      v1::Job* response) {
  absl::Status status = registry_.Mutate(request->job_id(), [&](Job& job, engine::Time now) {
    auto merged = MergePolicy(request->policy(), job.engine.policy());
    if (!merged.ok()) return merged.status();
    if (absl::Status s = job.engine.SetPolicy(*merged, now); !s.ok()) {
      return absl::InvalidArgumentError(s.message());
    }
    // From now on a SIGHUP reload leaves this job's policy alone.
    job.policy_overridden = true;
    spdlog::info("job={} policy set by admin call from {}", job.id, ctx->peer());
    ToProto(job, response);
    return absl::OkStatus();
  });
  return FinishUnary(ctx, status);
}

grpc::ServerUnaryReactor* AdminServiceImpl::SetRankOverride(
    grpc::CallbackServerContext* ctx, const v1::SetRankOverrideRequest* request,
    v1::Membership* response) {
  absl::Status status = registry_.Mutate(request->job_id(), [&](Job& job, engine::Time now) {
    if (request->rank() >= job.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", request->rank(), " >= world_size ",
                                                     job.world_size, " of job '", job.id, "'"));
    }
    auto override = FromProto(request->override());
    if (!override.ok()) return override.status();
    if (absl::Status s = job.engine.SetOverride(request->rank(), *override, request->reason(), now);
        !s.ok()) {
      return absl::InvalidArgumentError(s.message());
    }
    spdlog::info("job={} rank={} override {} by admin call from {}{}{}", job.id, request->rank(),
                 v1::RankOverride_Name(request->override()), ctx->peer(),
                 request->reason().empty() ? "" : ": ", request->reason());
    ToProto(job.engine.membership(), job, response);
    return absl::OkStatus();
  });
  return FinishUnary(ctx, status);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ResetJob(grpc::CallbackServerContext* ctx,
                                                     const v1::ResetJobRequest* request,
                                                     v1::Job* response) {
  absl::Status status = registry_.Mutate(request->job_id(), [&](Job& job, engine::Time now) {
    job.engine.Reset(now);
    spdlog::info("job={} reset by admin call from {}", job.id, ctx->peer());
    ToProto(job, response);
    return absl::OkStatus();
  });
  return FinishUnary(ctx, status);
}

}  // namespace straggler::daemon
