// RendezvousService: the gRPC face of RendezvousStore (Set, Get, Wait, Add).
// Wait is held on the server without a thread: its reactor finishes from the
// store's callback (keys complete, deadline, cancellation or shutdown).
//
//   RendezvousServiceImpl rendezvous(store, stats, config.limits.max_message_bytes);
//   builder.RegisterService(&rendezvous);
//
// In a cluster (`cluster` not null, docs/cluster.md) a job's keys live on the
// replica that owns the job: a call about a job another replica owns ends
// UNAVAILABLE naming the owner in its trailing metadata (server/redirect.h);
// a call about a job nobody owns takes it, as a hello does.
//
// Thread-safe; the store, stats and cluster member must outlive the server.
#pragma once

#include "rendezvous/rendezvous_store.h"
#include "metrics/stats.h"
#include "server/cluster_member.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::daemon {

class RendezvousServiceImpl final : public straggler::v1::RendezvousService::CallbackService {
 public:
  // A Get whose answer would pass max_response_bytes is refused
  // (RendezvousStore::Get): gRPC itself sends answers of any size.
  RendezvousServiceImpl(RendezvousStore& store, DaemonStats& stats, size_t max_response_bytes,
                        ClusterMember* cluster = nullptr)
      : store_(store), stats_(stats), max_response_bytes_(max_response_bytes), cluster_(cluster) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx,
                                const straggler::v1::RendezvousSetRequest* request,
                                straggler::v1::RendezvousSetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx,
                                const straggler::v1::RendezvousGetRequest* request,
                                straggler::v1::RendezvousGetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx,
                                 const straggler::v1::RendezvousWaitRequest* request,
                                 straggler::v1::RendezvousWaitResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx,
                                const straggler::v1::RendezvousAddRequest* request,
                                straggler::v1::RendezvousAddResponse* response) override;

 private:
  RendezvousStore& store_;
  DaemonStats& stats_;  // refusals: straggler_grpc_refused_total
  const size_t max_response_bytes_;
  ClusterMember* const cluster_;  // null: alone
  absl::Status Route(const std::string& job_id) const {
    return cluster_ == nullptr ? absl::OkStatus() : cluster_->Serve(job_id, /*take=*/true);
  }
  const CallOf call_{stats_, GrpcService::kRendezvous};  // every refusal is counted under it
};

}  // namespace straggler::daemon
