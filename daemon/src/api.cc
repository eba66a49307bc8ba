#include "api.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "convert.h"
#include "spdlog/spdlog.h"

namespace straggler::daemon::api {
namespace {

// With job.mu held.
absl::Status CheckRank(const Job& job, uint32_t rank) {
  if (rank < job.world_size) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("rank ", rank, " not found: job '", job.id,
                                          "' has world_size ", job.world_size));
}

// A status from a Read/Mutate whose callback may have failed on its own.
absl::Status Either(const absl::Status& outer, const absl::Status& inner) {
  return outer.ok() ? inner : outer;
}

}  // namespace

absl::StatusOr<v1::ListJobsResponse> ListJobs(const JobRegistry& registry,
                                              const v1::ListJobsRequest&) {
  v1::ListJobsResponse response;
  for (const auto& job : registry.Jobs()) {
    std::lock_guard lock(job->mu);
    if (job->removed.load()) continue;  // swept as idle since the listing
    ToProto(*job, response.add_jobs());
  }
  return response;
}

absl::StatusOr<v1::Job> GetJob(const JobRegistry& registry, const v1::GetJobRequest& request) {
  v1::Job response;
  absl::Status s = registry.Read(request.job_id(), [&](const Job& job) { ToProto(job, &response); });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const JobRegistry& registry,
                                                    const v1::ListWorkersRequest& request) {
  v1::ListWorkersResponse response;
  absl::Status s = registry.Read(request.job_id(), [&](const Job& job) {
    // O(world_size) here: one engine::Worker lookup and an O(1) copy per rank.
    response.mutable_workers()->Reserve(static_cast<int>(job.world_size));
    for (uint32_t rank = 0; rank < job.world_size; ++rank) {
      ToProto(job.engine.Worker(rank), job, response.add_workers());
    }
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::Worker> GetWorker(const JobRegistry& registry,
                                     const v1::GetWorkerRequest& request) {
  v1::Worker response;
  absl::Status in_range;
  absl::Status found = registry.Read(request.job_id(), [&](const Job& job) {
    in_range = CheckRank(job, request.rank());
    if (in_range.ok()) ToProto(job.engine.Worker(request.rank()), job, &response);
  });
  if (absl::Status s = Either(found, in_range); !s.ok()) return s;
  return response;
}

absl::StatusOr<v1::Membership> GetMembership(const JobRegistry& registry,
                                             const v1::GetMembershipRequest& request) {
  v1::Membership response;
  absl::Status s = registry.Read(request.job_id(), [&](const Job& job) {
    ToProto(job.engine.membership(), job, &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::ListEventsResponse> ListEvents(const JobRegistry& registry,
                                                  const v1::ListEventsRequest& request) {
  EventQuery query;
  query.job_id = request.job_id();
  if (request.has_since_time()) query.since_time = FromProto(request.since_time());
  query.since_sequence = request.since_sequence();
  query.limit = request.limit();  // 0 = default; clamped to the maximum
  EventPage page = registry.Events(query);
  v1::ListEventsResponse response;
  for (const JournalEntry& e : page.events) ToProto(e, response.add_events());
  response.set_last_sequence(page.last_sequence);
  return response;
}

absl::StatusOr<v1::Job> SetPolicy(JobRegistry& registry, const v1::SetPolicyRequest& request,
                                  std::string_view caller) {
  v1::Job response;
  absl::Status s = registry.Mutate(request.job_id(), [&](Job& job, engine::Time now) {
    auto merged = MergePolicy(request.policy(), job.engine.policy());
    if (!merged.ok()) return merged.status();
    if (absl::Status s = job.engine.SetPolicy(*merged, now); !s.ok()) {
      return absl::InvalidArgumentError(s.message());
    }
    // From now on a SIGHUP reload leaves this job's policy alone.
    job.policy_overridden = true;
    spdlog::info("job={} policy set by admin call from {}", job.id, caller);
    ToProto(job, &response);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::Membership> SetRankOverride(JobRegistry& registry,
                                               const v1::SetRankOverrideRequest& request,
                                               std::string_view caller) {
  v1::Membership response;
  absl::Status s = registry.Mutate(request.job_id(), [&](Job& job, engine::Time now) {
    if (absl::Status s = CheckRank(job, request.rank()); !s.ok()) return s;
    auto override = FromProto(request.override());
    if (!override.ok()) return override.status();
    if (absl::Status s = job.engine.SetOverride(request.rank(), *override, request.reason(), now);
        !s.ok()) {
      return absl::InvalidArgumentError(s.message());
    }
    spdlog::info("job={} rank={} override {} by admin call from {}{}{}", job.id, request.rank(),
                 v1::RankOverride_Name(request.override()), caller,
                 request.reason().empty() ? "" : ": ", request.reason());
    ToProto(job.engine.membership(), job, &response);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::Job> ResetJob(JobRegistry& registry, const v1::ResetJobRequest& request,
                                 std::string_view caller) {
  v1::Job response;
  absl::Status s = registry.Mutate(request.job_id(), [&](Job& job, engine::Time now) {
    job.engine.Reset(now);
    spdlog::info("job={} reset by admin call from {}", job.id, caller);
    ToProto(job, &response);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return response;
}

}  // namespace straggler::daemon::api
