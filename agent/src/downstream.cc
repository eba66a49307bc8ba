// DownstreamReactor: see downstream.h.
#include "downstream.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "straggler/common/directive.h"
#include "straggler/common/grpc_status.h"
#include "straggler/common/validate.h"

namespace straggler::agent {

DownstreamReactor::DownstreamReactor(JobTable& jobs, AgentStats& stats, std::string peer,
                                     int64_t pid)
    : jobs_(jobs), stats_(stats), peer_(std::move(peer)),
      link_(std::make_shared<DownLink>(this)) {
  link_->pid = pid;
  stats_.downstream_streams.fetch_add(1, std::memory_order_relaxed);
  stats_.downstream_streams_total.fetch_add(1, std::memory_order_relaxed);
  StartRead(&batch_);
}

void DownstreamReactor::OnReadDone(bool ok) {
  if (!ok) {
    Finish(grpc::Status::OK, /*flush=*/true);
    return;
  }
  if (!job_) {
    absl::Status s = Hello();
    if (!s.ok()) {
      spdlog::warn("downstream stream from {} refused: {}", peer_, std::string(s.message()));
      Finish(common::ToGrpcStatus(s), /*flush=*/false);
      return;
    }
  } else if (batch_.has_hello()) {
    // A later hello (client_lib sends one when a monitor-only client starts
    // asking for membership) changes only the monitor-only marks of the
    // stream's own ranks; its reports must belong to the first hello's ranks.
    job_->LaterHello(batch_.hello(), *link_);
  }
  Offer(job_->Take(link_, batch_));
  absl::MutexLock lock(&mu_);
  if (!slot_.finishing()) StartRead(&batch_);
}

void DownstreamReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  Act(slot_.WriteDone(ok));
}

void DownstreamReactor::OnDone() {
  link_->Detach();
  if (job_) job_->Detach(link_.get());
  stats_.downstream_streams.fetch_sub(1, std::memory_order_relaxed);
  delete this;
}

void DownstreamReactor::Offer(v1::Directive d) {
  absl::MutexLock lock(&mu_);
  Act(slot_.Offer(std::move(d), &common::MergeDirective));
}

void DownstreamReactor::Finish(grpc::Status status, bool flush) {
  absl::MutexLock lock(&mu_);
  Act(slot_.RequestFinish(std::move(status), flush));
}

absl::Status DownstreamReactor::Hello() {
  if (absl::Status s = common::RequireHello(batch_); !s.ok()) return s;
  auto job = jobs_.Attach(batch_.hello(), link_);
  if (!job.ok()) return job.status();
  job_ = *std::move(job);
  spdlog::info("job={} downstream stream from {}{} ranks={}", job_->id(), peer_,
               link_->pid > 0 ? absl::StrCat(" (pid ", link_->pid, ")") : "",
               batch_.hello().ranks_size());
  return absl::OkStatus();
}

void DownstreamReactor::Act(common::WriteAction action) {
  common::CarryOut(action, slot_, static_cast<ServerBidiReactor&>(*this));
}

void DownLink::Offer(v1::Directive d) {
  absl::MutexLock lock(&mu);
  if (reactor != nullptr) reactor->Offer(std::move(d));
}

}  // namespace straggler::agent
