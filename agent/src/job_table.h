// The agent's jobs: finds or creates the fan-in (UpstreamJob) of a
// downstream hello's (job id, run id), and removes jobs idle for
// jobs.idle_timeout_ms (no trainer stream, nothing buffered) from a sweeper
// thread, so an idle job's next trainer stream starts it afresh.
//
// Thread safety: thread-safe; one absl::Mutex guards the table (its fields
// are annotated: clang's -Wthread-safety checks them, ctest
// layout:thread_safety). Lock order: the table's, then a job's (Attach and
// the sweeper hold both).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent_stats.h"
#include "upstream_job.h"

namespace straggler::agent {

class JobTable {
 public:
  // `decorator` is read by every job's upstream thread; it must outlive the
  // table and not change after the first job is made.
  JobTable(std::shared_ptr<stream::ChannelPool> pool, std::string node, AgentStats& stats,
           const BatchDecorator* decorator, LiveConfig live);
  ~JobTable() { StopSweeper(); }

  // Finds or creates the hello's job and attaches `link` to it, as one step
  // under the table's lock, so the sweeper never retires a job a new stream
  // is joining. Refuses an invalid hello (common::ValidateHello), a world
  // size other than the job's, and every hello after Close (UNAVAILABLE).
  absl::StatusOr<std::shared_ptr<UpstreamJob>> Attach(const v1::StreamHello& hello,
                                                      const std::shared_ptr<DownLink>& link)
      ABSL_LOCKS_EXCLUDED(mu_);

  // SIGHUP: the live keys, for every job and the sweeper.
  void SetLive(LiveConfig live) ABSL_LOCKS_EXCLUDED(mu_);

  // Every job (of every run) now.
  std::vector<std::shared_ptr<UpstreamJob>> Jobs() const ABSL_LOCKS_EXCLUDED(mu_);

  // Refuses new jobs from now on; stops the sweeper; returns the existing
  // ones (the caller stops and joins them).
  std::vector<std::shared_ptr<UpstreamJob>> Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Through Attach.
  absl::StatusOr<std::shared_ptr<UpstreamJob>> Find(const v1::StreamHello& hello)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopSweeper() ABSL_LOCKS_EXCLUDED(mu_);
  // Removes jobs idle for live_.idle_job_timeout: checked every quarter of
  // it (at most once a second), so a job goes within 1.25x the timeout.
  void Sweep() ABSL_LOCKS_EXCLUDED(mu_);

  std::shared_ptr<stream::ChannelPool> pool_;
  const std::string node_;
  AgentStats& stats_;
  const BatchDecorator* decorator_;
  mutable absl::Mutex mu_;
  LiveConfig live_ ABSL_GUARDED_BY(mu_);
  // By (job id, run id).
  std::map<std::pair<std::string, std::string>, std::shared_ptr<UpstreamJob>> jobs_
      ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool sweeper_stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar sweep_cv_;  // with mu_: sweeper_stop_ or live_ changed
  std::thread sweeper_;
};

}  // namespace straggler::agent
