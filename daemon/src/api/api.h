// The query and admin core: one function per unary RPC of QueryService and
// AdminService, taking the request proto and returning the response proto or
// the error. Both front ends call these and only translate: the gRPC
// handlers (query_service.cc, admin_service.cc) and REST (http_server.cc).
//
//   absl::StatusOr<v1::Worker> w = api::GetWorker(registry, request);
//   // NOT_FOUND "job 'x' not found" / "rank 9 not found: job 'x' has world_size 8"
//
// Errors: NOT_FOUND for an unknown job or a rank >= world_size,
// INVALID_ARGUMENT naming the value for a job id no job can have
// (ValidateJobId), a bad policy, override or override reason.
// `caller` (the gRPC peer, or "http 127.0.0.1:PORT") is logged with every
// admin change.
//
// Thread-safe: each call holds one job's mutex at most, while copying that
// job's state in or out.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "registry/job_registry.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::daemon::api {

namespace v1 = ::straggler::v1;

absl::StatusOr<v1::ListJobsResponse> ListJobs(const JobRegistry& registry,
                                              const v1::ListJobsRequest& request);
absl::StatusOr<v1::Job> GetJob(const JobRegistry& registry, const v1::GetJobRequest& request);
absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const JobRegistry& registry,
                                                    const v1::ListWorkersRequest& request);
absl::StatusOr<v1::Worker> GetWorker(const JobRegistry& registry,
                                     const v1::GetWorkerRequest& request);
absl::StatusOr<v1::Membership> GetMembership(const JobRegistry& registry,
                                             const v1::GetMembershipRequest& request);
// An unknown job_id is not an error: the journal keeps the events of jobs
// that are gone. limit 0 = 1000, clamped to 10000.
absl::StatusOr<v1::ListEventsResponse> ListEvents(const JobRegistry& registry,
                                                  const v1::ListEventsRequest& request);
// The job's kept reports with iteration >= since_iteration, ascending by
// (iteration, rank), the first `limit` of them (0 = all). NOT_FOUND for an
// unknown job.
absl::StatusOr<v1::ExportReportsResponse> ExportReports(const JobRegistry& registry,
                                                        const v1::ExportReportsRequest& request);

// Only the fields set in request.policy change; the rest keep their values.
absl::StatusOr<v1::Job> SetPolicy(JobRegistry& registry, const v1::SetPolicyRequest& request,
                                  std::string_view caller);
absl::StatusOr<v1::Membership> SetRankOverride(JobRegistry& registry,
                                               const v1::SetRankOverrideRequest& request,
                                               std::string_view caller);
absl::StatusOr<v1::Job> ResetJob(JobRegistry& registry, const v1::ResetJobRequest& request,
                                 std::string_view caller);

}  // namespace straggler::daemon::api
