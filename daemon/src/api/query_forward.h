// Queries on any replica (issue 30, item 4; docs/cluster.md "Queries on any
// replica"): with replicas on etcd, each job lives on the replica that owns
// it, yet the reads of QueryService and REST (and so the web console) answer
// for every job of the cluster on any replica:
//
//   * a read about one job that another replica owns is forwarded: this
//     replica asks the owner's QueryService the same question, with the
//     caller's bearer token, and answers with the owner's reply (the
//     job's `owner` field names it);
//   * ListJobs lists this replica's jobs and every other replica's;
//   * WatchMembership, a long-lived stream, is redirected instead (like an
//     ingest stream: UNAVAILABLE and the owner in trailing metadata), so the
//     watcher holds its stream on the owner and not through a second hop.
//
// Why forward and not redirect the reads: curl, browsers (the console's
// fetch would meet a cross-origin redirect), grpcurl and Grafana links follow
// no redirect of ours; a read decides nothing, so a second hop costs one
// round trip and no safety. A forwarded call carries kForwardedByMetadata
// and is answered from the receiving replica's own jobs whatever its view
// says, so two replicas whose views disagree for a moment never bounce a
// call between them. With gRPC over TLS the replicas have no client
// credentials for each other yet: reads about another replica's job are then
// redirected (UNAVAILABLE naming the owner) and ListJobs lists this
// replica's jobs only.
//
//   QueryForwarder forwarder(*cluster, /*plaintext_grpc=*/true);
//   absl::StatusOr<v1::Job> job = Read(registry, &forwarder, request, caller);
//   // alone: Read(registry, nullptr, request, caller) is api::GetJob
//
// Thread safety: thread-safe; `cluster` must outlive the forwarder.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "registry/job_registry.h"
#include "server/redirect.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::daemon {

class ClusterMember;

// The metadata of a query one replica forwards to another: the forwarding
// replica's id.
inline constexpr char kForwardedByMetadata[] = "straggler-forwarded-by";

// Who asked, as far as forwarding needs: the credentials to pass on, and
// whether another replica already forwarded the call.
struct QueryCaller {
  std::optional<std::string> authorization;  // "Bearer ..." as sent; nullopt: none
  bool forwarded = false;
};

// The caller of a gRPC query.
QueryCaller QueryCallerOf(const grpc::ServerContextBase& ctx);

class QueryForwarder {
 public:
  QueryForwarder(const ClusterMember& cluster, bool plaintext_grpc);
  ~QueryForwarder();

  const ClusterMember& cluster() const { return cluster_; }
  // Whether reads are forwarded (gRPC in plaintext) or redirected (TLS).
  bool forwarding() const { return forwarding_; }

  // OK to watch `job_id` here; UNAVAILABLE with the owner attached
  // (redirect.h) when another replica owns it.
  absl::Status WatchHere(const std::string& job_id, const QueryCaller& caller) const;

  // The owner's answer to `call` (a QueryService stub method), within 5 s.
  // An owner that does not answer: UNAVAILABLE naming it.
  template <class Req, class Resp>
  absl::StatusOr<Resp> Ask(const OwnerAddress& owner, const Req& request,
                           const QueryCaller& caller,
                           grpc::Status (v1::QueryService::Stub::*call)(grpc::ClientContext*,
                                                                        const Req&, Resp*)) const;

  // This replica's jobs and every other replica's (each asked once, in
  // parallel, within 2 s; one that does not answer is left out and logged).
  v1::ListJobsResponse MergeJobs(v1::ListJobsResponse local, const QueryCaller& caller) const;

 private:
  v1::QueryService::Stub& StubFor(const std::string& grpc_address) const;

  const ClusterMember& cluster_;
  const bool forwarding_;
  mutable absl::Mutex mu_;
  // One channel per replica address, kept: replicas are few.
  mutable std::map<std::string, std::unique_ptr<v1::QueryService::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

// The reads of api.h as any replica answers them (`forwarder` null: alone,
// exactly api::X). A v1::Job answered in a cluster has its `owner` set.
absl::StatusOr<v1::ListJobsResponse> Read(const JobRegistry& registry,
                                          const QueryForwarder* forwarder,
                                          const v1::ListJobsRequest& request,
                                          const QueryCaller& caller);
absl::StatusOr<v1::Job> Read(const JobRegistry& registry, const QueryForwarder* forwarder,
                             const v1::GetJobRequest& request, const QueryCaller& caller);
absl::StatusOr<v1::ListWorkersResponse> Read(const JobRegistry& registry,
                                             const QueryForwarder* forwarder,
                                             const v1::ListWorkersRequest& request,
                                             const QueryCaller& caller);
absl::StatusOr<v1::Worker> Read(const JobRegistry& registry, const QueryForwarder* forwarder,
                                const v1::GetWorkerRequest& request, const QueryCaller& caller);
absl::StatusOr<v1::Membership> Read(const JobRegistry& registry,
                                    const QueryForwarder* forwarder,
                                    const v1::GetMembershipRequest& request,
                                    const QueryCaller& caller);
// With a job_id: the owner's journal. Without: this replica's journal only
// (sequences are per replica, so journals do not merge into one page).
absl::StatusOr<v1::ListEventsResponse> Read(const JobRegistry& registry,
                                            const QueryForwarder* forwarder,
                                            const v1::ListEventsRequest& request,
                                            const QueryCaller& caller);
absl::StatusOr<v1::ExportReportsResponse> Read(const JobRegistry& registry,
                                               const QueryForwarder* forwarder,
                                               const v1::ExportReportsRequest& request,
                                               const QueryCaller& caller);

}  // namespace straggler::daemon
