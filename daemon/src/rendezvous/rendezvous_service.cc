#include "rendezvous/rendezvous_service.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"

#include "api/rpc_util.h"
#include "straggler/common/grpc_status.h"

namespace straggler::daemon {
namespace {

// A request's ttl or timeout: nullopt when unset (the store's default);
// a negative one is refused naming it, a huge one saturates (the store caps
// it at rendezvous.max_ttl_seconds / max_wait_seconds) instead of
// overflowing the multiplication.
absl::StatusOr<std::optional<std::chrono::milliseconds>> ToMillis(
    bool has, const google::protobuf::Duration& d, const char* field) {
  if (!has) return std::optional<std::chrono::milliseconds>();
  if (d.seconds() < 0 || d.nanos() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, "=", d.seconds(), "s ", d.nanos(), "ns is negative (omit it for the default)"));
  }
  constexpr int64_t kMaxSeconds = int64_t{1} << 40;  // ~35 000 years: far past any cap
  const int64_t seconds = std::min(d.seconds(), kMaxSeconds);
  return std::optional<std::chrono::milliseconds>(
      std::chrono::milliseconds(seconds * 1000 + d.nanos() / 1000000));
}

// One held Wait. The store calls Finish exactly once (through the callback);
// OnCancel asks the store to end the wait, which then calls it with
// CANCELLED unless it already ended. gRPC deletes nothing: OnDone does.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  WaitReactor(RendezvousStore& store, DaemonStats& stats) : store_(store), stats_(stats) {}

  void Start(const v1::RendezvousWaitRequest& request,
             std::optional<std::chrono::milliseconds> timeout) {
    std::vector<std::string> keys(request.keys().begin(), request.keys().end());
    // Finishes later than FinishUnary could: counted here the same way.
    const uint64_t id = store_.Wait(request.job_id(), keys, timeout,
                                    [this](const absl::Status& s) {
                                      stats_.CountGrpcRefused(GrpcService::kRendezvous, s.code());
                                      Finish(common::ToGrpcStatus(s));
                                    });
    absl::MutexLock lock(&mu_);
    id_ = id;
    if (cancelled_ && id_ != 0) store_.Cancel(id_);
  }

  void OnCancel() override {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      id = id_;
    }
    if (id != 0) store_.Cancel(id);  // no-op when the wait already ended
  }

  void OnDone() override { delete this; }

 private:
  RendezvousStore& store_;
  DaemonStats& stats_;
  absl::Mutex mu_;
  uint64_t id_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerUnaryReactor* RendezvousServiceImpl::Set(grpc::CallbackServerContext* ctx,
                                                     const v1::RendezvousSetRequest* request,
                                                     v1::RendezvousSetResponse*) {
  if (absl::Status s = Route(request->job_id()); !s.ok()) return FinishUnary(ctx, s, call_);
  auto ttl = ToMillis(request->has_ttl(), request->ttl(), "ttl");
  if (!ttl.ok()) return FinishUnary(ctx, ttl.status(), call_);
  if (cluster_ != nullptr) {
    // In etcd before it is here (docs/cluster.md, "The rendezvous store at
    // a failover"): a peer whose Wait this Set completes may use the key at
    // once, and a new owner must find it.
    absl::StatusOr<std::chrono::milliseconds> effective =
        store_.CheckSet(request->job_id(), request->key(), request->value().size(), *ttl);
    if (!effective.ok()) return FinishUnary(ctx, effective.status(), call_);
    if (absl::Status s = cluster_->SaveRendezvousKey(request->job_id(), request->key(),
                                                     request->value(), *effective);
        !s.ok()) {
      return FinishUnary(ctx, s, call_);
    }
  }
  return FinishUnary(ctx, store_.Set(request->job_id(), request->key(), request->value(), *ttl),
                     call_);
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Get(grpc::CallbackServerContext* ctx,
                                                     const v1::RendezvousGetRequest* request,
                                                     v1::RendezvousGetResponse* response) {
  if (absl::Status s = Route(request->job_id()); !s.ok()) return FinishUnary(ctx, s, call_);
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  absl::StatusOr<std::vector<RendezvousStore::KeyValue>> entries =
      store_.Get(request->job_id(), keys, max_response_bytes_);
  if (entries.ok()) {
    for (auto& [key, value] : *entries) {
      v1::RendezvousEntry* e = response->add_entries();
      e->set_key(std::move(key));
      e->set_value(std::move(value));
    }
  }
  return FinishUnary(ctx, entries.status(), call_);
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Wait(grpc::CallbackServerContext* ctx,
                                                      const v1::RendezvousWaitRequest* request,
                                                      v1::RendezvousWaitResponse*) {
  if (absl::Status s = Route(request->job_id()); !s.ok()) return FinishUnary(ctx, s, call_);
  auto timeout = ToMillis(request->has_timeout(), request->timeout(), "timeout");
  if (!timeout.ok()) return FinishUnary(ctx, timeout.status(), call_);
  auto* reactor = new WaitReactor(store_, stats_);
  reactor->Start(*request, *timeout);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Add(grpc::CallbackServerContext* ctx,
                                                     const v1::RendezvousAddRequest* request,
                                                     v1::RendezvousAddResponse* response) {
  if (absl::Status s = Route(request->job_id()); !s.ok()) return FinishUnary(ctx, s, call_);
  auto ttl = ToMillis(request->has_ttl(), request->ttl(), "ttl");
  if (!ttl.ok()) return FinishUnary(ctx, ttl.status(), call_);
  absl::StatusOr<int64_t> v = store_.Add(request->job_id(), request->key(), request->delta(), *ttl);
  if (v.ok() && cluster_ != nullptr) {
    // The counter's new value to etcd after the add (an add cannot be
    // written first without a read-modify-write across the two): an Add
    // whose write failed is answered UNAVAILABLE and counts twice if the
    // caller retries it (docs/cluster.md).
    absl::StatusOr<std::chrono::milliseconds> effective =
        store_.CheckSet(request->job_id(), request->key(), 0, *ttl);
    absl::Status s = effective.status();
    if (s.ok()) {
      s = cluster_->SaveRendezvousKey(request->job_id(), request->key(), std::to_string(*v),
                                      *effective);
    }
    if (!s.ok()) return FinishUnary(ctx, s, call_);
  }
  if (v.ok()) response->set_value(*v);
  return FinishUnary(ctx, v.status(), call_);
}

}  // namespace straggler::daemon
