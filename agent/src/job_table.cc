// JobTable: see job_table.h.
#include "job_table.h"

#include <algorithm>
#include <limits>

#include "absl/time/time.h"
#include "spdlog/spdlog.h"
#include "straggler/common/validate.h"

namespace straggler::agent {

JobTable::JobTable(std::shared_ptr<stream::ChannelPool> pool, std::string node, AgentStats& stats,
                   const BatchDecorator* decorator, LiveConfig live)
    : pool_(std::move(pool)),
      node_(std::move(node)),
      stats_(stats),
      decorator_(decorator),
      live_(live) {
  sweeper_ = std::thread([this] { Sweep(); });
}

absl::StatusOr<std::shared_ptr<UpstreamJob>> JobTable::Attach(
    const v1::StreamHello& hello, const std::shared_ptr<DownLink>& link) {
  absl::MutexLock lock(&mu_);
  auto job = Find(hello);
  if (!job.ok()) return job.status();
  if (absl::Status s = (*job)->Attach(hello, link); !s.ok()) return s;
  return job;
}

absl::StatusOr<std::shared_ptr<UpstreamJob>> JobTable::Find(const v1::StreamHello& hello) {
  // The daemon's own checks (its ranks-per-job limit is the daemon's to
  // enforce; it answers the upstream hello with it).
  if (absl::Status s =
          common::ValidateHello(common::FromProto(hello), std::numeric_limits<uint32_t>::max());
      !s.ok()) {
    return s;
  }
  if (closed_) return absl::UnavailableError("straggler-agent is shutting down");
  // One upstream stream per run (docs/runs.md): a new launch of the job id
  // gets its own, admitted by the daemon once the old run's has ended.
  auto& job = jobs_[{hello.job_id(), hello.run_id()}];
  if (!job) {
    job = std::make_shared<UpstreamJob>(hello.job_id(), hello.run_id(), hello.world_size(),
                                        hello.iterations_per_epoch(), pool_, node_, live_,
                                        stats_, decorator_);
    spdlog::info("job={} run='{}' first stream: upstream stream opened (world_size={})",
                 hello.job_id(), hello.run_id(), hello.world_size());
  }
  return job;
}

void JobTable::SetLive(LiveConfig live) {
  absl::MutexLock lock(&mu_);
  live_ = live;
  for (auto& [id, job] : jobs_) job->SetLive(live);
  sweep_cv_.SignalAll();
}

std::vector<std::shared_ptr<UpstreamJob>> JobTable::Jobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<UpstreamJob>> out;
  for (const auto& [id, job] : jobs_) out.push_back(job);
  return out;
}

std::vector<std::shared_ptr<UpstreamJob>> JobTable::Close() {
  StopSweeper();
  absl::MutexLock lock(&mu_);
  closed_ = true;
  std::vector<std::shared_ptr<UpstreamJob>> out;
  for (const auto& [id, job] : jobs_) out.push_back(job);
  return out;
}

void JobTable::StopSweeper() {
  {
    absl::MutexLock lock(&mu_);
    sweeper_stop_ = true;
    sweep_cv_.SignalAll();
  }
  if (sweeper_.joinable()) sweeper_.join();
}

void JobTable::Sweep() {
  mu_.Lock();
  while (!sweeper_stop_) {
    const auto timeout = live_.idle_job_timeout;
    const auto period = std::clamp<std::chrono::milliseconds>(
        timeout / 4, std::chrono::milliseconds(10), std::chrono::seconds(1));
    sweep_cv_.WaitWithTimeout(&mu_, absl::FromChrono(period));
    if (sweeper_stop_) break;
    std::vector<std::shared_ptr<UpstreamJob>> retired;
    const auto now = Clock::now();
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (it->second->RetireIfIdle(now, live_.idle_job_timeout)) {
        retired.push_back(std::move(it->second));
        it = jobs_.erase(it);
      } else {
        ++it;
      }
    }
    if (retired.empty()) continue;
    // Joined without the table's lock: a stopping job may still wait for
    // its upstream stream to close.
    mu_.Unlock();
    for (const auto& job : retired) {
      job->Join();
      stats_.jobs_removed.fetch_add(1, std::memory_order_relaxed);
      spdlog::info("job={} run='{}' removed: no trainer stream and nothing buffered for {} ms",
                   job->id(), job->run_id(), timeout.count());
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace straggler::agent
