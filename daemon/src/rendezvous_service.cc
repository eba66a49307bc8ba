#include "rendezvous_service.h"

#include <atomic>
#include <mutex>

#include "rpc_util.h"

namespace straggler::daemon {
namespace {

std::optional<std::chrono::milliseconds> ToMillis(bool has, const google::protobuf::Duration& d) {
  if (!has) return std::nullopt;
  if (d.seconds() < 0 || d.nanos() < 0) return std::nullopt;  // treated as "unset": default
  return std::chrono::milliseconds(d.seconds() * 1000 + d.nanos() / 1000000);
}

// One held Wait. The store calls Finish exactly once (through the callback);
// OnCancel asks the store to end the wait, which then calls it with
// CANCELLED unless it already ended. gRPC deletes nothing: OnDone does.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  WaitReactor(RendezvousStore& store, DaemonStats& stats) : store_(store), stats_(stats) {}

  void Start(const v1::RendezvousWaitRequest& request) {
    std::vector<std::string> keys(request.keys().begin(), request.keys().end());
    // Finishes later than FinishUnary could: counted here the same way.
    const uint64_t id = store_.Wait(request.job_id(), keys,
                                    ToMillis(request.has_timeout(), request.timeout()),
                                    [this](const absl::Status& s) {
                                      stats_.CountGrpcRefused(GrpcService::kRendezvous, s.code());
                                      Finish(ToGrpcStatus(s));
                                    });
    std::lock_guard lock(mu_);
    id_ = id;
    if (cancelled_ && id_ != 0) store_.Cancel(id_);
  }

  void OnCancel() override {
    uint64_t id = 0;
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
      id = id_;
    }
    if (id != 0) store_.Cancel(id);  // no-op when the wait already ended
  }

  void OnDone() override { delete this; }

 private:
  RendezvousStore& store_;
  DaemonStats& stats_;
  std::mutex mu_;
  uint64_t id_ = 0;        // guarded by mu_
  bool cancelled_ = false;  // guarded by mu_
};

}  // namespace

grpc::ServerUnaryReactor* RendezvousServiceImpl::Set(grpc::CallbackServerContext* ctx,
                                                     const v1::RendezvousSetRequest* request,
                                                     v1::RendezvousSetResponse*) {
  return FinishUnary(ctx, store_.Set(request->job_id(), request->key(), request->value(),
                                     ToMillis(request->has_ttl(), request->ttl())),
                     call_);
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Get(grpc::CallbackServerContext* ctx,
                                                     const v1::RendezvousGetRequest* request,
                                                     v1::RendezvousGetResponse* response) {
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  absl::StatusOr<std::vector<std::string>> values = store_.Get(request->job_id(), keys);
  if (values.ok()) {
    for (size_t i = 0; i < keys.size(); ++i) {
      v1::RendezvousEntry* e = response->add_entries();
      e->set_key(keys[i]);
      e->set_value(std::move((*values)[i]));
    }
  }
  return FinishUnary(ctx, values.status(), call_);
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Wait(grpc::CallbackServerContext*,
                                                      const v1::RendezvousWaitRequest* request,
                                                      v1::RendezvousWaitResponse*) {
  auto* reactor = new WaitReactor(store_, stats_);
  reactor->Start(*request);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Add(grpc::CallbackServerContext* ctx,
                                                     const v1::RendezvousAddRequest* request,
                                                     v1::RendezvousAddResponse* response) {
  absl::StatusOr<int64_t> v = store_.Add(request->job_id(), request->key(), request->delta(),
                                         ToMillis(request->has_ttl(), request->ttl()));
  if (v.ok()) response->set_value(*v);
  return FinishUnary(ctx, v.status(), call_);
}

}  // namespace straggler::daemon
