// IngestService.Stream: the bidirectional stream over which trainer ranks (or
// the node agent) send iteration reports and receive directives.
//
//   IngestServiceImpl ingest(registry, stats);
//   builder.RegisterService(&ingest);
//
// Each stream is a callback-API reactor that admits the stream, reads, and
// writes; what a batch does to the job is its IngestSession's
// (ingest_session.h): the first ReportBatch must carry a hello (job, ranks,
// world size); every batch is ingested under the job's mutex and
// acknowledged by a Directive whose memberships were snapshotted under that
// same lock, after the ingest. Membership changes made by other
// streams, the tick thread or admin calls are pushed to the stream through a
// single coalescing write slot. A stream's first directive carries every
// version its ranks may still need; later ones only the versions it has not
// carried yet (often none).
//
// In a cluster (`cluster` not null, docs/cluster.md) a stream's hello is
// served only when this replica owns the job (taking it when nobody does);
// otherwise the stream ends UNAVAILABLE, naming the owner in its trailing
// metadata (server/redirect.h). Each later batch is applied only while the
// replica may decide (ClusterMember::MayDecide), else the stream ends
// UNAVAILABLE and the client comes back once the replica may again.
//
// Thread-safe: gRPC calls Stream() from its own threads; the registry,
// stats and cluster member must outlive the server.
#pragma once

#include "registry/job_registry.h"
#include "metrics/stats.h"
#include "server/cluster_member.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::daemon {

class IngestServiceImpl final : public straggler::v1::IngestService::CallbackService {
 public:
  IngestServiceImpl(JobRegistry& registry, DaemonStats& stats, ClusterMember* cluster = nullptr)
      : registry_(registry), stats_(stats), cluster_(cluster) {}

  grpc::ServerBidiReactor<straggler::v1::ReportBatch, straggler::v1::Directive>* Stream(
      grpc::CallbackServerContext* context) override;

 private:
  JobRegistry& registry_;
  DaemonStats& stats_;
  ClusterMember* const cluster_;  // null: alone
};

}  // namespace straggler::daemon
