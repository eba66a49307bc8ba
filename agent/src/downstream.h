// The trainer-facing side of the agent: straggler.v1.IngestService served to
// the node's trainer ranks (client_lib Clients). Each stream is a
// DownstreamReactor: its hello attaches it to its job's fan-in (JobTable),
// every batch is taken into the job's buffer and acknowledged at once, and
// the job's relayed directives go out through one coalescing write slot
// (common/write_slot.h, merged with common::MergeDirective). A client cannot
// tell it from the daemon's IngestReactor (agent.h).
//
// Thread safety: gRPC runs the reactor's callbacks; Offer and Finish may be
// called from any thread (the job's upstream reader relays through DownLink,
// whose own mutex makes it a no-op once the reactor is done). The reactor
// deletes itself in OnDone.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/status/status.h"
#include "agent_stats.h"
#include "job_table.h"
#include "straggler/common/write_slot.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::agent {

// One trainer stream (a client_lib Client) on the agent: the daemon's
// IngestReactor seen from the client, with the agent's buffer behind it.
class DownstreamReactor final : public grpc::ServerBidiReactor<v1::ReportBatch, v1::Directive> {
 public:
  // `pid`: the trainer process on the other end (0 = unknown, e.g. TCP).
  DownstreamReactor(JobTable& jobs, AgentStats& stats, std::string peer, int64_t pid);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

  // Queues a directive (merged into a pending one while a write is in
  // flight).
  void Offer(v1::Directive d);
  // Ends the stream; with `flush`, after the pending directive is written.
  void Finish(grpc::Status status, bool flush);

 private:
  // The stream's first batch: its hello attaches the stream to its job.
  absl::Status Hello();
  void Act(common::WriteAction action) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobTable& jobs_;
  AgentStats& stats_;
  const std::string peer_;
  const std::shared_ptr<DownLink> link_;
  v1::ReportBatch batch_;
  std::shared_ptr<UpstreamJob> job_;  // read chain only
  absl::Mutex mu_;
  common::WriteSlot<v1::Directive> slot_ ABSL_GUARDED_BY(mu_);
};

// The IngestService the agent serves: one DownstreamReactor per stream.
class IngestProxy final : public v1::IngestService::CallbackService {
 public:
  // `pid_of`: the process of a gRPC peer (UnixPeerListener::PidOf), 0 when
  // unknown; called on gRPC threads.
  using PidOf = std::function<int64_t(const std::string& peer)>;
  IngestProxy(JobTable& jobs, AgentStats& stats, PidOf pid_of)
      : jobs_(jobs), stats_(stats), pid_of_(std::move(pid_of)) {}
  grpc::ServerBidiReactor<v1::ReportBatch, v1::Directive>* Stream(
      grpc::CallbackServerContext* context) override {
    std::string peer = context->peer();
    const int64_t pid = pid_of_ ? pid_of_(peer) : 0;
    return new DownstreamReactor(jobs_, stats_, std::move(peer), pid);
  }

 private:
  JobTable& jobs_;
  AgentStats& stats_;
  const PidOf pid_of_;
};

}  // namespace straggler::agent
