// JobRegistry's runs, restarts and job end (docs/runs.md): a rank's new
// client incarnation, a job restarted as a whole, a run retired by the next,
// earlier runs kept for queries, ranks that closed cleanly, a job lost.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "registry/job_proto.h"
#include "wire/convert.h"
#include "registry/job_registry.h"
#include "spdlog/spdlog.h"

namespace straggler::daemon {

void JobRegistry::NoteIncarnationsLocked(Job::Locked& job, const common::StreamHello& hello,
                                         engine::Time now) {
  std::vector<uint32_t> taken_over;
  for (const auto& [rank, incarnation] : hello.rank_incarnations) {
    if (rank >= job.world_size ||
        !std::binary_search(hello.ranks.begin(), hello.ranks.end(), rank)) {
      continue;
    }
    uint64_t& known = job->lineage_incarnation[rank];
    if (known == incarnation) continue;
    const bool first = known == 0;
    known = incarnation;
    if (!first) taken_over.push_back(rank);
  }
  if (taken_over.empty()) return;
  for (uint32_t rank : taken_over) {
    // A new trainer process for the rank: its iterations start over (a
    // restart from a checkpoint may be below what it reported before).
    job->engine.Restart(rank);
    if (!job->restarted[rank]) {
      job->restarted[rank] = true;
      ++job->restarted_count;
    }
  }
  bool others_live = false;
  for (uint32_t r = 0; r < job.world_size && !others_live; ++r) {
    if (job->restarted[r] || job->rank_streams[r] == 0) continue;
    const engine::WorkerState st = job->engine.Worker(r).state;
    others_live = st == engine::WorkerState::kHealthy || st == engine::WorkerState::kMild ||
                  st == engine::WorkerState::kStraggler;
  }
  if (others_live && job->restarted_count < job.world_size) return;
  // The job restarted: its iterations may be far below those the versions
  // published so far take effect at, so the engine starts over, with a
  // version above every one a client may still hold.
  const uint64_t next = job->engine.membership().version + 1;
  spdlog::info("job={} run='{}': restarted (new trainer processes for {} ranks, no other rank "
               "live): detection starts over at membership v{}",
               job.id, job.run_id, taken_over.size(), next);
  job->engine.StartOver(next, now);
  // The new lineage knows only the incarnations that started it.
  std::vector<uint64_t> kept(job.world_size, 0);
  for (uint32_t rank : taken_over) kept[rank] = job->lineage_incarnation[rank];
  job->lineage_incarnation = std::move(kept);
  std::fill(job->restarted.begin(), job->restarted.end(), false);
  job->restarted_count = 0;
}

bool JobRegistry::RunLiveLocked(const Job::Locked& job) {
  for (uint32_t r = 0; r < job.world_size; ++r) {
    if (job->rank_streams[r] == 0) continue;
    const engine::WorkerState st = job->engine.Worker(r).state;
    if (st != engine::WorkerState::kFinished && st != engine::WorkerState::kUnresponsive) {
      return true;
    }
  }
  return false;
}

void JobRegistry::RetireRunLocked(Job::Locked& job, const std::string& next_run) {
  v1::Job last;
  ToProto(job, &last);
  {
    absl::MutexLock lock(&earlier_mu_);
    auto& runs = earlier_[job.id];
    // A run id seen again (a stray hello of an old launch) keeps one entry.
    runs.erase(std::remove_if(runs.begin(), runs.end(),
                              [&](const v1::Job& j) { return j.run_id() == job.run_id; }),
               runs.end());
    runs.push_front(std::move(last));
    if (runs.size() > kMaxEarlierRuns) runs.pop_back();
  }
  spdlog::info("job={} run='{}' ended (run '{}' begins): {} reports, {} detections", job.id,
               job.run_id, next_run, job->engine.View().reports_total,
               job->engine.View().detections_total);
  job.MarkRemoved();
  const absl::Status closing =
      absl::UnavailableError(absl::StrCat("run ", common::Quoted(job.run_id), " of job '", job.id,
                                          "' ended: run ", common::Quoted(next_run), " began"));
  for (auto& sub : job->subscribers) sub->CloseLocked(closing);
  job->subscribers.clear();
  // The lookup that follows replaces the removed job in the map (Attach).
}

std::optional<v1::Job> JobRegistry::EarlierRun(absl::string_view job_id,
                                               absl::string_view run_id) const {
  absl::MutexLock lock(&earlier_mu_);
  auto it = earlier_.find(job_id);
  if (it == earlier_.end()) return std::nullopt;
  for (const v1::Job& j : it->second)
    if (j.run_id() == run_id) return j;
  return std::nullopt;
}

void JobRegistry::FillEarlierRuns(absl::string_view job_id, v1::Job* out) const {
  absl::MutexLock lock(&earlier_mu_);
  out->clear_earlier_runs();
  auto it = earlier_.find(job_id);
  if (it == earlier_.end()) return;
  for (const v1::Job& j : it->second) out->add_earlier_runs(j.run_id());
}

void JobRegistry::LoseLocked(Job::Locked& job, engine::Time now, std::chrono::seconds after) {
  const auto silent =
      std::chrono::duration_cast<std::chrono::seconds>(now - job->last_activity).count();
  const engine::JobView v = job->engine.View();
  spdlog::warn("job={} run='{}' ended unexpectedly: no stream and no report for {}s "
               "(limits.job_lost_after_seconds={}), {} of {} ranks finished",
               job.id, job.run_id, silent, after.count(), v.finished_ranks, job.world_size);
  job->engine.Lose(now, absl::StrCat("job ended unexpectedly: no stream and no report for ",
                                     silent, "s (limits.job_lost_after_seconds=", after.count(),
                                     "); ", v.finished_ranks, " of ", job.world_size,
                                     " ranks had finished"));
  CommitLocked(job);
}

void JobRegistry::FinishRanksLocked(Job::Locked& job, const JobSubscriber* stream,
                                    const std::vector<uint32_t>& ranks, engine::Time now) {
  auto mine = job->stream_ranks.find(stream);
  if (mine == job->stream_ranks.end()) return;
  for (uint32_t r : ranks) {
    // Only a stream that speaks for the rank may say it finished.
    if (std::binary_search(mine->second.begin(), mine->second.end(), r)) job->engine.Finish(r, now);
  }
  if (job->engine.Finished()) {
    spdlog::info("job={} run='{}' finished: every rank closed cleanly", job.id, job.run_id);
  }
}

}  // namespace straggler::daemon
