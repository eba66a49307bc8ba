// Pieces shared by the daemon's gRPC handlers: how a unary call ends (and is
// counted), the bearer-token check of a call (auth.h), and the link through
// which the registry reaches a reactor that may already be gone. The status
// mapping and the coalescing write slot are shared with straggler-agent:
// straggler/common/write_slot.h.
//
// ReactorLink is thread-safe.
#pragma once

#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "auth/auth.h"
#include "registry/job_registry.h"
#include "metrics/stats.h"
#include "server/redirect.h"
#include "straggler/common/grpc_status.h"
#include "straggler/common/write_slot.h"

namespace straggler::daemon {

// A redirect's trailing metadata (server/redirect.h) when `status` names a
// job's owner; nothing otherwise. Before the call's Finish.
inline void AddRedirectMetadata(const absl::Status& status, grpc::ServerContextBase* ctx) {
  if (status.ok()) return;
  std::optional<OwnerAddress> owner = OwnerOf(status);
  if (!owner) return;
  ctx->AddTrailingMetadata(kOwnerGrpcMetadata, owner->grpc_address);
  if (!owner->http_address.empty()) {
    ctx->AddTrailingMetadata(kOwnerHttpMetadata, owner->http_address);
  }
  if (!owner->id.empty()) ctx->AddTrailingMetadata(kOwnerIdMetadata, owner->id);
}

// Ends a unary callback RPC with `status` (the response was filled by the
// caller). Every refusal of a unary call ends here (or, for the calls that
// finish later, goes through CountGrpcRefused as well), so
// straggler_grpc_refused_total counts them all.
inline grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                             const absl::Status& status, CallOf call) {
  call.stats.CountGrpcRefused(call.service, status.code());
  AddRedirectMetadata(status, ctx);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(common::ToGrpcStatus(status));
  return reactor;
}

// Ends a unary callback RPC with the result of an api:: call: the value
// becomes the response, an error the status.
template <class Msg>
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                      absl::StatusOr<Msg> result, Msg* response, CallOf call) {
  if (result.ok()) *response = *std::move(result);
  return FinishUnary(ctx, result.status(), call);
}

// The call's `authorization` metadata (nullopt: none sent).
inline std::optional<std::string_view> AuthorizationOf(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string_view(it->second.data(), it->second.size());
}

// A unary call that `auth` admits for `access` gets the result of `call()`;
// otherwise it ends UNAUTHENTICATED without running it.
template <class Msg, class Call>
grpc::ServerUnaryReactor* FinishAuthorized(grpc::CallbackServerContext* ctx,
                                           const Authorizer& auth, Access access, Call call,
                                           Msg* response, CallOf of) {
  if (absl::Status s = auth.Check(access, AuthorizationOf(ctx)); !s.ok()) {
    return FinishUnary(ctx, s, of);
  }
  return FinishUnary(ctx, call(), response, of);
}

// The registry's handle on a reactor. gRPC deletes a reactor after OnDone;
// the registry may still hold the link then, so OnDone calls Detach() first
// and every later call is a no-op. Reactor must offer
// PushLocked(const Job::Locked&) and Close(const absl::Status&).
template <class Reactor>
class ReactorLink final : public JobSubscriber {
 public:
  explicit ReactorLink(Reactor* reactor) : reactor_(reactor) {}

  void OnMembershipChangedLocked(const Job::Locked& job) override {
    absl::MutexLock lock(&mu_);
    if (reactor_ != nullptr) reactor_->PushLocked(job);
  }
  void CloseLocked(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (reactor_ != nullptr) reactor_->Close(status);
  }
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_);  // null once the reactor is done
};

}  // namespace straggler::daemon
