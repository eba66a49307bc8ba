// Pieces shared by the gRPC handlers: absl -> grpc status, the bearer-token
// check of a call (auth.h), the coalescing
// write slot of the streaming reactors, and the link through which the
// registry reaches a reactor that may already be gone.
//
// A streaming reactor keeps ONE write in flight and ONE pending message; a
// newer message is merged into the pending one, so a slow reader costs one
// message of memory, never a queue:
//
//   std::lock_guard lock(mu_);
//   CarryOut(slot_.Offer(std::move(msg), &Merge), slot_, *this);  // StartWrite or Finish
//
// WriteSlot is not thread-safe (the reactor's mutex guards it); ReactorLink
// is thread-safe.
#pragma once

#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "auth/auth.h"
#include "registry/job_registry.h"
#include "metrics/stats.h"

namespace straggler::daemon {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}


// Ends a unary callback RPC with `status` (the response was filled by the
// caller). Every refusal of a unary call ends here (or, for the calls that
// finish later, goes through CountGrpcRefused as well), so
// straggler_grpc_refused_total counts them all.
inline grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                             const absl::Status& status, CallOf call) {
  call.stats.CountGrpcRefused(call.service, status.code());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
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

enum class WriteAction { kNone, kWrite, kFinish };

template <class Msg>
class WriteSlot {
 public:
  using MergeFn = void (*)(Msg& pending, Msg&& newer);

  // A message to send. kWrite: the caller must StartWrite(&current()).
  WriteAction Offer(Msg msg, MergeFn merge, bool* coalesced = nullptr) {
    if (finishing_) return WriteAction::kNone;
    if (!writing_) {
      current_ = std::move(msg);
      writing_ = true;
      return WriteAction::kWrite;
    }
    if (pending_) {
      merge(*pending_, std::move(msg));
      if (coalesced) *coalesced = true;
    } else {
      pending_ = std::move(msg);
    }
    return WriteAction::kNone;
  }

  // The write in flight completed. kWrite: start the pending one; kFinish:
  // call Finish(finish_status()).
  WriteAction WriteDone(bool ok) {
    writing_ = false;
    if (!ok) {
      // The peer is gone; nothing more can be delivered.
      pending_.reset();
      if (!finishing_) {
        finishing_ = true;
        status_ = grpc::Status(grpc::StatusCode::CANCELLED, "write failed: peer gone");
      }
    }
    if (pending_) {
      current_ = std::move(*pending_);
      pending_.reset();
      writing_ = true;
      return WriteAction::kWrite;
    }
    return TakeFinish();
  }

  // End the RPC with `status` once what is queued has been written (`flush`)
  // or after the write in flight (`!flush`). Only the first request counts.
  WriteAction RequestFinish(grpc::Status status, bool flush) {
    if (finishing_) return WriteAction::kNone;
    finishing_ = true;
    status_ = std::move(status);
    if (!flush) pending_.reset();
    return writing_ ? WriteAction::kNone : TakeFinish();
  }

  const Msg& current() const { return current_; }
  bool finishing() const { return finishing_; }
  const grpc::Status& finish_status() const { return status_; }

 private:
  WriteAction TakeFinish() {
    if (!finishing_ || finished_) return WriteAction::kNone;
    finished_ = true;
    return WriteAction::kFinish;
  }

  Msg current_;
  std::optional<Msg> pending_;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  grpc::Status status_;
};

// Does what `slot` asked for with `action` on `reactor`: a
// grpc::ServerBidiReactor or ServerWriteReactor (pass it as its gRPC base
// when the reactor hides Finish(grpc::Status) behind an overload of its own).
// The caller holds the mutex that guards `slot`; gRPC runs the completions
// of StartWrite and Finish on its own threads, never inline, so holding it
// across them is safe.
template <class Msg, class Reactor>
void CarryOut(WriteAction action, const WriteSlot<Msg>& slot, Reactor& reactor) {
  switch (action) {
    case WriteAction::kWrite: reactor.StartWrite(&slot.current()); break;
    case WriteAction::kFinish: reactor.Finish(slot.finish_status()); break;
    case WriteAction::kNone: break;
  }
}

// The registry's handle on a reactor. gRPC deletes a reactor after OnDone;
// the registry may still hold the link then, so OnDone calls Detach() first
// and every later call is a no-op. Reactor must offer
// PushLocked(const Job&) and Close(const absl::Status&).
template <class Reactor>
class ReactorLink final : public JobSubscriber {
 public:
  explicit ReactorLink(Reactor* reactor) : reactor_(reactor) {}

  void OnMembershipChangedLocked(const Job& job) override {
    std::lock_guard lock(mu_);
    if (reactor_ != nullptr) reactor_->PushLocked(job);
  }
  void CloseLocked(const absl::Status& status) override {
    std::lock_guard lock(mu_);
    if (reactor_ != nullptr) reactor_->Close(status);
  }
  void Detach() {
    std::lock_guard lock(mu_);
    reactor_ = nullptr;
  }

 private:
  std::mutex mu_;
  Reactor* reactor_;  // guarded by mu_; null once the reactor is done
};

}  // namespace straggler::daemon
