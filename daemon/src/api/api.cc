#include "api/api.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "registry/job_proto.h"
#include "wire/convert.h"
#include "straggler/common/validate.h"
#include "spdlog/spdlog.h"

namespace straggler::daemon::api {
namespace {

absl::Status CheckRank(const Job::Locked& job, uint32_t rank) {
  if (rank < job.world_size) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("rank ", rank, " not found: job '", job.id,
                                          "' has world_size ", job.world_size));
}

// A job id no hello could have created is the caller's error, named, not
// NOT_FOUND.
absl::Status CheckJobId(const std::string& job_id) {
  return common::ValidateJobId("job_id", job_id);
}

// A status from a Read/Mutate whose callback may have failed on its own.
absl::Status Either(const absl::Status& outer, const absl::Status& inner) {
  return outer.ok() ? inner : outer;
}

// What every one-job call shares: the id checked, `fill(job, response)` run
// under the job's lock, then the response, or the first error (the id's, the
// registry's NOT_FOUND, or fill's own).
template <class Response, class Fill>
absl::StatusOr<Response> ReadJob(const JobRegistry& registry, const std::string& job_id,
                                 Fill fill) {
  if (absl::Status s = CheckJobId(job_id); !s.ok()) return s;
  Response response;
  absl::Status filled;
  absl::Status found =
      registry.Read(job_id, [&](const Job::Locked& job) { filled = fill(job, response); });
  if (absl::Status s = Either(found, filled); !s.ok()) return s;
  return response;
}

// The same for a change: `change(job, now, response)` runs under the job's
// lock and the registry commits after it (JobRegistry::Mutate). `precheck`,
// the request's own check of its other fields, is the error after the id's
// and before the registry's NOT_FOUND.
template <class Response, class Change>
absl::StatusOr<Response> MutateJob(JobRegistry& registry, const std::string& job_id,
                                   Change change, absl::Status precheck = absl::OkStatus()) {
  if (absl::Status s = CheckJobId(job_id); !s.ok()) return s;
  if (!precheck.ok()) return precheck;
  Response response;
  absl::Status s = registry.Mutate(
      job_id, [&](Job::Locked& job, engine::Time now) { return change(job, now, response); });
  if (!s.ok()) return s;
  return response;
}

}  // namespace

absl::StatusOr<v1::ListJobsResponse> ListJobs(const JobRegistry& registry,
                                              const v1::ListJobsRequest&) {
  v1::ListJobsResponse response;
  for (const auto& job : registry.Jobs()) {
    const Job::Locked locked(*job);
    if (job->removed()) continue;  // swept as idle since the listing
    ToProto(locked, response.add_jobs());
  }
  return response;
}

absl::StatusOr<v1::Job> GetJob(const JobRegistry& registry, const v1::GetJobRequest& request) {
  absl::StatusOr<v1::Job> response = ReadJob<v1::Job>(
      registry, request.job_id(), [&](const Job::Locked& job, v1::Job& out) {
        if (request.run_id().empty() || request.run_id() == job.run_id) ToProto(job, &out);
        return absl::OkStatus();
      });
  if (!response.ok()) return response;
  // An earlier run: its last state, kept when the next run began.
  if (response->job_id().empty()) {
    std::optional<v1::Job> earlier = registry.EarlierRun(request.job_id(), request.run_id());
    if (!earlier) {
      return absl::NotFoundError(absl::StrCat("job '", request.job_id(), "' has no run '",
                                              request.run_id(), "' (earlier runs are listed in "
                                              "the job's earlier_runs)"));
    }
    return *earlier;
  }
  registry.FillEarlierRuns(request.job_id(), &*response);
  return response;
}

absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const JobRegistry& registry,
                                                    const v1::ListWorkersRequest& request) {
  return ReadJob<v1::ListWorkersResponse>(
      registry, request.job_id(), [](const Job::Locked& job, v1::ListWorkersResponse& out) {
        // O(world_size) here: one engine::Worker lookup and an O(1) copy per rank.
        out.mutable_workers()->Reserve(static_cast<int>(job.world_size));
        for (uint32_t rank = 0; rank < job.world_size; ++rank) {
          ToProto(job->engine.Worker(rank), job, out.add_workers());
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<v1::Worker> GetWorker(const JobRegistry& registry,
                                     const v1::GetWorkerRequest& request) {
  return ReadJob<v1::Worker>(registry, request.job_id(),
                             [&](const Job::Locked& job, v1::Worker& out) {
                               absl::Status in_range = CheckRank(job, request.rank());
                               if (in_range.ok()) {
                                 ToProto(job->engine.Worker(request.rank()), job, &out);
                               }
                               return in_range;
                             });
}

absl::StatusOr<v1::Membership> GetMembership(const JobRegistry& registry,
                                             const v1::GetMembershipRequest& request) {
  return ReadJob<v1::Membership>(registry, request.job_id(),
                                 [](const Job::Locked& job, v1::Membership& out) {
                                   ToProto(job->engine.membership(), job, &out);
                                   return absl::OkStatus();
                                 });
}

absl::StatusOr<v1::ListEventsResponse> ListEvents(const JobRegistry& registry,
                                                  const v1::ListEventsRequest& request) {
  if (!request.job_id().empty()) {  // "" = every job
    if (absl::Status s = CheckJobId(request.job_id()); !s.ok()) return s;
  }
  EventQuery query;
  query.job_id = request.job_id();
  if (request.has_run_id()) query.run_id = request.run_id();
  if (request.has_since_time()) query.since_time = FromProto(request.since_time());
  query.since_sequence = request.since_sequence();
  query.limit = request.limit();  // 0 = default; clamped to the maximum
  for (int kind : request.kinds()) {
    absl::StatusOr<engine::EventKind> k = FromProto(static_cast<v1::EventKind>(kind));
    if (!k.ok()) return k.status();
    query.kinds.push_back(*k);
  }
  if (request.has_rank()) query.rank = request.rank();
  EventPage page = registry.Events(query);
  v1::ListEventsResponse response;
  for (const JournalEntry& e : page.events) ToProto(e, response.add_events());
  response.set_last_sequence(page.last_sequence);
  return response;
}

absl::StatusOr<v1::ExportReportsResponse> ExportReports(
    const JobRegistry& registry, const v1::ExportReportsRequest& request) {
  const uint64_t since = request.since_iteration();
  // Copied under the job's lock; sorted and rendered after releasing it.
  struct Kept {
    std::vector<RecentReport> reports;
    uint64_t dropped = 0;
  };
  absl::StatusOr<Kept> copied =
      ReadJob<Kept>(registry, request.job_id(), [since](const Job::Locked& job, Kept& out) {
        out.reports.reserve(job->recent.size());
        job->recent.ForEach([&](const RecentReport& r) {
          if (r.iteration >= since) out.reports.push_back(r);
        });
        if (job->recent.dropped() > 0 && job->recent.dropped_max_iteration() >= since) {
          out.dropped = job->recent.dropped();
        }
        return absl::OkStatus();
      });
  if (!copied.ok()) return copied.status();
  std::vector<RecentReport>& kept = copied->reports;
  auto by_iteration_rank = [](const RecentReport& a, const RecentReport& b) {
    return a.iteration != b.iteration ? a.iteration < b.iteration : a.rank < b.rank;
  };
  size_t n = kept.size();
  if (request.limit() > 0 && request.limit() < n) {
    n = request.limit();
    std::partial_sort(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(n), kept.end(),
                      by_iteration_rank);
  } else {
    std::sort(kept.begin(), kept.end(), by_iteration_rank);
  }
  v1::ExportReportsResponse response;
  response.mutable_reports()->Reserve(static_cast<int>(n));
  for (size_t i = 0; i < n; ++i) {
    v1::IterationReport* out = response.add_reports();
    out->set_rank(kept[i].rank);
    out->set_epoch(kept[i].epoch);
    out->set_iteration(kept[i].iteration);
    out->set_compute_seconds(kept[i].compute_seconds);
    // Work and phases as kept (floats), where the report had them.
    if (!std::isnan(kept[i].work)) out->set_work(kept[i].work);
    if (!std::isnan(kept[i].input_wait_seconds))
      out->set_input_wait_seconds(kept[i].input_wait_seconds);
    if (!std::isnan(kept[i].optimizer_seconds))
      out->set_optimizer_seconds(kept[i].optimizer_seconds);
    v1::ReportScore* score = response.add_scores();
    score->set_reference_seconds(kept[i].reference_seconds);
    score->set_ratio(kept[i].reference_seconds > 0
                         ? kept[i].compute_seconds / kept[i].reference_seconds
                         : 0.0);
    score->set_job_step_seconds(kept[i].job_step_seconds);
  }
  response.set_dropped_before(copied->dropped);
  return response;
}

absl::StatusOr<v1::Job> SetPolicy(JobRegistry& registry, const v1::SetPolicyRequest& request,
                                  std::string_view caller) {
  return MutateJob<v1::Job>(registry, request.job_id(), [&](Job::Locked& job, engine::Time now,
                                                            v1::Job& out) {
    auto merged = MergePolicy(request.policy(), job->engine.policy());
    if (!merged.ok()) return merged.status();
    if (absl::Status s = job->engine.SetPolicy(*merged, now); !s.ok()) {
      return absl::InvalidArgumentError(s.message());
    }
    // From now on a SIGHUP reload leaves this job's policy alone.
    job->policy_overridden = true;
    spdlog::info("job={} policy set by admin call from {}", job.id, caller);
    ToProto(job, &out);
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::Membership> SetRankOverride(JobRegistry& registry,
                                               const v1::SetRankOverrideRequest& request,
                                               std::string_view caller) {
  return MutateJob<v1::Membership>(
      registry, request.job_id(),
      [&](Job::Locked& job, engine::Time now, v1::Membership& out) {
        if (absl::Status s = CheckRank(job, request.rank()); !s.ok()) return s;
        auto override = FromProto(request.override());
        if (!override.ok()) return override.status();
        if (absl::Status s =
                job->engine.SetOverride(request.rank(), *override, request.reason(), now);
            !s.ok()) {
          return absl::InvalidArgumentError(s.message());
        }
        // Kept for the state database, which restores the reason with the override.
        if (*override == engine::RankOverride::kNone) {
          job->override_reasons.erase(request.rank());
        } else {
          job->override_reasons[request.rank()] = request.reason();
        }
        spdlog::info("job={} rank={} override {} by admin call from {}{}{}", job.id, request.rank(),
                     v1::RankOverride_Name(request.override()), caller,
                     request.reason().empty() ? "" : ": ", request.reason());
        ToProto(job->engine.membership(), job, &out);
        return absl::OkStatus();
      },
      common::ValidateReason(request.reason()));
}

absl::StatusOr<v1::Job> ResetJob(JobRegistry& registry, const v1::ResetJobRequest& request,
                                 std::string_view caller) {
  return MutateJob<v1::Job>(registry, request.job_id(), [&](Job::Locked& job, engine::Time now,
                                                            v1::Job& out) {
    job->engine.Reset(now);
    spdlog::info("job={} reset by admin call from {}", job.id, caller);
    ToProto(job, &out);
    return absl::OkStatus();
  });
}

}  // namespace straggler::daemon::api
