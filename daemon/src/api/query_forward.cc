#include "api/query_forward.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "api/api.h"
#include "server/cluster_member.h"
#include "spdlog/spdlog.h"

namespace straggler::daemon {
namespace {

using Stub = v1::QueryService::Stub;

constexpr auto kForwardDeadline = std::chrono::seconds(5);
// ListJobs asks every replica: one that is down must not hold the list long.
constexpr auto kListDeadline = std::chrono::seconds(2);

void SetOwner(v1::Job& job, const OwnerAddress& owner) {
  v1::ReplicaRef* r = job.mutable_owner();
  r->set_id(owner.id);
  r->set_grpc_address(owner.grpc_address);
  r->set_http_address(owner.http_address);
}

// A local answer in a cluster names this replica as the owner of its jobs.
void Stamp(absl::StatusOr<v1::Job>& r, const OwnerAddress& self) {
  if (r.ok()) SetOwner(*r, self);
}
void Stamp(absl::StatusOr<v1::ListJobsResponse>& r, const OwnerAddress& self) {
  if (!r.ok()) return;
  for (v1::Job& job : *r->mutable_jobs()) SetOwner(job, self);
}
template <class Resp>
void Stamp(absl::StatusOr<Resp>&, const OwnerAddress&) {}

void Prepare(grpc::ClientContext& ctx, const QueryCaller& caller, const std::string& self_id,
             std::chrono::seconds deadline) {
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  if (caller.authorization) ctx.AddMetadata("authorization", *caller.authorization);
  ctx.AddMetadata(kForwardedByMetadata, self_id.empty() ? "-" : self_id);
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// A read about one job: answered here (alone, forwarded to us, our job or
// nobody's), else asked of its owner (or redirected to it under TLS).
template <class Req, class Resp>
absl::StatusOr<Resp> Routed(const JobRegistry& registry, const QueryForwarder* forwarder,
                            const Req& request, const QueryCaller& caller,
                            absl::StatusOr<Resp> (*local)(const JobRegistry&, const Req&),
                            grpc::Status (Stub::*remote)(grpc::ClientContext*, const Req&, Resp*)) {
  if (forwarder == nullptr) return local(registry, request);
  std::optional<OwnerAddress> owner;
  if (!caller.forwarded) owner = forwarder->cluster().OwnerElsewhere(request.job_id());
  if (!owner) {
    absl::StatusOr<Resp> r = local(registry, request);
    Stamp(r, forwarder->cluster().Self());
    return r;
  }
  if (!forwarder->forwarding()) {
    return WithOwner(absl::UnavailableError(absl::StrCat(
                         "job '", request.job_id(), "' is owned by stragglerd replica '",
                         owner->id, "' at ", owner->grpc_address,
                         " (HTTP ", owner->http_address,
                         "); ask it there: replicas serving gRPC over TLS do not forward "
                         "queries to each other")),
                     *owner);
  }
  return forwarder->Ask(*owner, request, caller, remote);
}

}  // namespace

QueryCaller QueryCallerOf(const grpc::ServerContextBase& ctx) {
  QueryCaller caller;
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    caller.authorization = std::string(it->second.data(), it->second.size());
  }
  caller.forwarded = md.find(kForwardedByMetadata) != md.end();
  return caller;
}

QueryForwarder::QueryForwarder(const ClusterMember& cluster, bool plaintext_grpc)
    : cluster_(cluster), forwarding_(plaintext_grpc) {}

QueryForwarder::~QueryForwarder() = default;

Stub& QueryForwarder::StubFor(const std::string& grpc_address) const {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stub>& stub = stubs_[grpc_address];
  if (!stub) {
    stub = v1::QueryService::NewStub(
        grpc::CreateChannel(grpc_address, grpc::InsecureChannelCredentials()));
  }
  return *stub;
}

template <class Req, class Resp>
absl::StatusOr<Resp> QueryForwarder::Ask(const OwnerAddress& owner, const Req& request,
                                         const QueryCaller& caller,
                                         grpc::Status (Stub::*call)(grpc::ClientContext*,
                                                                    const Req&, Resp*)) const {
  grpc::ClientContext ctx;
  Prepare(ctx, caller, cluster_.replica_id(), kForwardDeadline);
  Resp response;
  const grpc::Status s = (StubFor(owner.grpc_address).*call)(&ctx, request, &response);
  if (s.ok()) return response;
  // The owner's own refusal (NOT_FOUND, UNAUTHENTICATED, ...) is the answer;
  // an owner that cannot be reached is said as such.
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
      s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return FromGrpc(s);
  }
  return absl::UnavailableError(absl::StrCat("job '", request.job_id(),
                                             "' is owned by stragglerd replica '", owner.id,
                                             "' at ", owner.grpc_address,
                                             ", which did not answer: ", s.error_message()));
}

v1::ListJobsResponse QueryForwarder::MergeJobs(v1::ListJobsResponse local,
                                               const QueryCaller& caller) const {
  const std::vector<OwnerAddress> others = forwarding_ ? cluster_.OtherReplicas()
                                                       : std::vector<OwnerAddress>();
  std::vector<std::future<std::pair<grpc::Status, v1::ListJobsResponse>>> answers;
  for (const OwnerAddress& r : others) {
    answers.push_back(std::async(std::launch::async, [this, &r, &caller] {
      grpc::ClientContext ctx;
      Prepare(ctx, caller, cluster_.replica_id(), kListDeadline);
      v1::ListJobsResponse out;
      grpc::Status s = StubFor(r.grpc_address).ListJobs(&ctx, v1::ListJobsRequest(), &out);
      return std::make_pair(std::move(s), std::move(out));
    }));
  }
  // job id -> the newest membership seen (a job that is moving may be on two
  // replicas for a moment: the new owner's version is the higher).
  std::map<std::string, v1::Job> jobs;
  auto add = [&](v1::Job&& job) {
    auto [it, inserted] = jobs.try_emplace(job.job_id(), job);
    if (!inserted && job.membership().version() > it->second.membership().version()) {
      it->second = std::move(job);
    }
  };
  for (v1::Job& job : *local.mutable_jobs()) add(std::move(job));
  for (size_t i = 0; i < answers.size(); ++i) {
    auto [status, out] = answers[i].get();
    if (!status.ok()) {
      spdlog::warn("ListJobs: stragglerd replica '{}' at {} did not answer ({}); its jobs are "
                   "left out of the list",
                   others[i].id, others[i].grpc_address, status.error_message());
      continue;
    }
    for (v1::Job& job : *out.mutable_jobs()) add(std::move(job));
  }
  v1::ListJobsResponse merged;
  for (auto& [id, job] : jobs) *merged.add_jobs() = std::move(job);
  return merged;
}

absl::Status QueryForwarder::WatchHere(const std::string& job_id, const QueryCaller& caller) const {
  if (caller.forwarded) return absl::OkStatus();
  std::optional<OwnerAddress> owner = cluster_.OwnerElsewhere(job_id);
  if (!owner) return absl::OkStatus();
  return WithOwner(absl::UnavailableError(absl::StrCat(
                       "job '", job_id, "' is owned by stragglerd replica '", owner->id, "' at ",
                       owner->grpc_address, " (trailing metadata ", kOwnerGrpcMetadata,
                       "): watch it there")),
                   *owner);
}

absl::StatusOr<v1::ListJobsResponse> Read(const JobRegistry& registry,
                                          const QueryForwarder* forwarder,
                                          const v1::ListJobsRequest& request,
                                          const QueryCaller& caller) {
  absl::StatusOr<v1::ListJobsResponse> local = api::ListJobs(registry, request);
  if (forwarder == nullptr) return local;
  Stamp(local, forwarder->cluster().Self());
  // Asked by another replica: our own jobs only, or lists would recurse.
  if (!local.ok() || caller.forwarded) return local;
  return forwarder->MergeJobs(*std::move(local), caller);
}

absl::StatusOr<v1::Job> Read(const JobRegistry& registry, const QueryForwarder* forwarder,
                             const v1::GetJobRequest& request, const QueryCaller& caller) {
  return Routed(registry, forwarder, request, caller, &api::GetJob, &Stub::GetJob);
}

absl::StatusOr<v1::ListWorkersResponse> Read(const JobRegistry& registry,
                                             const QueryForwarder* forwarder,
                                             const v1::ListWorkersRequest& request,
                                             const QueryCaller& caller) {
  return Routed(registry, forwarder, request, caller, &api::ListWorkers, &Stub::ListWorkers);
}

absl::StatusOr<v1::Worker> Read(const JobRegistry& registry, const QueryForwarder* forwarder,
                                const v1::GetWorkerRequest& request, const QueryCaller& caller) {
  return Routed(registry, forwarder, request, caller, &api::GetWorker, &Stub::GetWorker);
}

absl::StatusOr<v1::Membership> Read(const JobRegistry& registry,
                                    const QueryForwarder* forwarder,
                                    const v1::GetMembershipRequest& request,
                                    const QueryCaller& caller) {
  return Routed(registry, forwarder, request, caller, &api::GetMembership, &Stub::GetMembership);
}

absl::StatusOr<v1::ListEventsResponse> Read(const JobRegistry& registry,
                                            const QueryForwarder* forwarder,
                                            const v1::ListEventsRequest& request,
                                            const QueryCaller& caller) {
  if (request.job_id().empty()) return api::ListEvents(registry, request);
  return Routed(registry, forwarder, request, caller, &api::ListEvents, &Stub::ListEvents);
}

absl::StatusOr<v1::ExportReportsResponse> Read(const JobRegistry& registry,
                                               const QueryForwarder* forwarder,
                                               const v1::ExportReportsRequest& request,
                                               const QueryCaller& caller) {
  return Routed(registry, forwarder, request, caller, &api::ExportReports, &Stub::ExportReports);
}

}  // namespace straggler::daemon
