// UpstreamJob: see upstream_job.h. The first half (Attach, Take) fills the
// buffer from trainer streams; the second (the Source methods) is what the
// job's StreamSession sends upstream and how the daemon's directives are
// relayed down: replay in order, version history, progress to the owning link.
#include "upstream_job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "straggler/common/directive.h"
#include "straggler/nvml/telemetry_proto.h"

#ifndef STRAGGLERD_VERSION
#define STRAGGLERD_VERSION "unknown"
#endif

namespace straggler::agent {
namespace {

constexpr size_t kMembershipHistory = 32;  // as the daemon keeps
// How long a job's upstream stream stays open once no trainer stream is left
// and the daemon acknowledged everything: then it ends, so that the daemon
// sees the run's stream go (its ranks detach: a killed one turns
// unresponsive, a new run of the job id is admitted; docs/runs.md).
constexpr auto kUpstreamIdleGrace = std::chrono::seconds(2);
// After the half-close of an idle or drained stream, how long the daemon
// gets to end the call before it is cancelled.
constexpr auto kUpstreamCloseGrace = std::chrono::seconds(1);

stream::Backoff BackoffOf(const LiveConfig& live) {
  return {live.reconnect_initial, live.reconnect_max, stream::Backoff::Jitter::kNarrow};
}

}  // namespace

stream::StreamSession::Options UpstreamJob::SessionOptions(const std::string& id,
                                                           const std::string& run_id,
                                                           const LiveConfig& live) {
  stream::StreamSession::Options o;
  o.name = absl::StrCat("job=", id, " run='", run_id, "' upstream");
  o.backoff = BackoffOf(live);
  o.max_send_delay = std::chrono::milliseconds(0);  // ReadyAt names every batching deadline
  o.idle_close = kUpstreamIdleGrace;
  o.close_grace = kUpstreamCloseGrace;
  o.log = [](stream::LogLevel level, const std::string& line) {
    switch (level) {
      case stream::LogLevel::kDebug: spdlog::debug("{}", line); break;
      case stream::LogLevel::kInfo: spdlog::info("{}", line); break;
      case stream::LogLevel::kWarning: spdlog::warn("{}", line); break;
    }
  };
  return o;
}

UpstreamJob::UpstreamJob(std::string job_id, std::string run_id, uint32_t world_size,
                         uint64_t iterations_per_epoch, std::shared_ptr<stream::ChannelPool> pool,
                         std::string node, LiveConfig live, AgentStats& stats,
                         const BatchDecorator* decorator)
    : id_(std::move(job_id)),
      run_id_(std::move(run_id)),
      world_size_(world_size),
      node_(std::move(node)),
      stats_(stats),
      decorator_(decorator),
      iterations_per_epoch_(iterations_per_epoch),
      live_(live),
      buffer_(live.buffer_max_reports),
      session_(std::move(pool), SessionOptions(id_, run_id_, live), *this) {}

void UpstreamJob::Snapshot::Add(const Snapshot& o) {
  buffered += o.buffered;
  dropped += o.dropped;
  connected = connected || o.connected;
  connects += o.connects;
  downstreams += o.downstreams;
  for (const auto& [r, it] : o.acked) acked[r] = std::max(acked[r], it);
  for (const auto& [r, n] : o.acked_count) acked_count[r] += n;
  for (const auto& [r, n] : o.received) received[r] += n;
}

absl::Status UpstreamJob::Attach(const v1::StreamHello& hello,
                                 const std::shared_ptr<DownLink>& link) {
  absl::MutexLock lock(&mu_);
  if (hello.world_size() != world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("world_size=", hello.world_size(),
                                                   " differs from job '", id_,
                                                   "' world_size=", world_size_));
  }
  // Ranks < world_size: checked by common::ValidateHello in JobTable::Find.
  std::vector<uint32_t> ranks(hello.ranks().begin(), hello.ranks().end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  link->ranks = ranks;
  bool changed = false;
  for (uint32_t r : ranks) changed |= ranks_.insert(r).second;
  if (hello.iterations_per_epoch() > 0) iterations_per_epoch_ = hello.iterations_per_epoch();
  for (const nvml::RankDevice& d : nvml::DevicesOf(hello)) {
    if (!std::binary_search(ranks.begin(), ranks.end(), d.rank)) continue;
    auto [it, fresh] = devices_.try_emplace(d.rank, d);
    if (!fresh && it->second.incarnation != d.incarnation) {
      spdlog::info("job={} run='{}' rank {}: new trainer process (incarnation {:x} -> {:x})",
                   id_, run_id_, d.rank, it->second.incarnation, d.incarnation);
      changed = true;
    }
    changed |= fresh && d.incarnation != 0;
    it->second = d;
  }
  for (uint32_t r : ranks) {
    if (link->pid > 0) {
      pids_[r] = link->pid;
    } else {
      pids_.erase(r);  // its earlier process's id would now name another
    }
  }
  ++devices_version_;
  changed |= NoteMonitorOnlyLocked(hello, ranks);
  if (changed) {
    buffer_.PushHello(HelloPartLocked(), Clock::now());
    flush_ = true;
  }
  if (hello.known_membership_version() > known_.version) {
    known_ = {hello.known_membership_version(), hello.known_effective_iteration(),
              hello.known_incarnation(),
              {hello.known_excluded().begin(), hello.known_excluded().end()}};
  }
  if (hello.has_reported_iteration()) NoteReportedLocked(hello.reported_iteration());
  links_.push_back(link);
  v1::Directive first;
  for (uint32_t r : ranks) {
    if (auto it = progress_.find(r); it != progress_.end()) {
      v1::RankProgress* p = first.add_progress();
      p->set_rank(r);
      p->set_iteration(it->second);
    }
  }
  AddUnsentVersionsLocked(*link, first);
  // Until the daemon answers, the client should not count on progress.
  first.set_upstream_unavailable(!connected_);
  link->Offer(std::move(first));
  idle_since_.reset();
  if (!started_) {
    started_ = true;
    session_.Start();
  }
  session_.Wake();
  return absl::OkStatus();
}

void UpstreamJob::LaterHello(const v1::StreamHello& hello, const DownLink& link) {
  absl::MutexLock lock(&mu_);
  std::vector<uint32_t> owned;
  for (uint32_t r : hello.ranks())
    if (link.Owns(r)) owned.push_back(r);
  std::sort(owned.begin(), owned.end());
  owned.erase(std::unique(owned.begin(), owned.end()), owned.end());
  if (!NoteMonitorOnlyLocked(hello, owned)) return;
  buffer_.PushHello(HelloPartLocked(), Clock::now());
  flush_ = true;
  session_.Wake();
}

bool UpstreamJob::NoteMonitorOnlyLocked(const v1::StreamHello& hello,
                                        const std::vector<uint32_t>& ranks) {
  const auto& marked = hello.monitor_only_ranks();
  bool changed = false;
  for (uint32_t r : ranks) {
    const bool on = std::find(marked.begin(), marked.end(), r) != marked.end();
    changed |= on ? monitor_only_.insert(r).second : monitor_only_.erase(r) > 0;
  }
  return changed;
}

void UpstreamJob::Detach(const DownLink* link) {
  absl::MutexLock lock(&mu_);
  links_.erase(std::remove_if(links_.begin(), links_.end(),
                              [&](const auto& l) { return l.get() == link; }),
               links_.end());
  session_.Wake();  // the last one gone starts the upstream stream's idle grace
}

v1::Directive UpstreamJob::Take(const std::shared_ptr<DownLink>& link,
                                const v1::ReportBatch& batch) {
  v1::Directive ack;
  ack.set_acked_sequence(batch.sequence());
  uint32_t accepted = 0, rejected = 0;
  const auto now = Clock::now();
  absl::MutexLock lock(&mu_);
  for (const v1::IterationReport& r : batch.reports()) {
    if (!link->Owns(r.rank())) {
      // Checked here so that the daemon's answers about a rank always have
      // exactly one downstream stream to go to.
      ++rejected;
      stats_.reports_rejected_local.fetch_add(1, std::memory_order_relaxed);
      if (ack.rejections_size() < common::kMaxDirectiveRejections) {
        v1::ReportRejection* rej = ack.add_rejections();
        rej->set_rank(r.rank());
        rej->set_iteration(r.iteration());
        rej->set_reason("rank_not_in_stream");
        rej->set_message(absl::StrCat("rank ", r.rank(), " is not among the ",
                                      link->ranks.size(),
                                      " ranks named in this stream's hello"));
      }
      continue;
    }
    ++accepted;
    ++received_[r.rank()];
    NoteReportedLocked(r.iteration());
    dropped_ += buffer_.Push(r, now);
  }
  // The trainer closed cleanly after these reports: the marker follows
  // them through the buffer (and any replay) to the daemon.
  bool finished = false;
  for (uint32_t rank : batch.finished_ranks()) {
    if (!link->Owns(rank)) continue;
    buffer_.PushFinished(rank, now);
    finished = flush_ = true;
  }
  stats_.reports_received.fetch_add(accepted, std::memory_order_relaxed);
  link->last_acked_sequence = std::max(link->last_acked_sequence, batch.sequence());
  ack.set_accepted(accepted);
  ack.set_rejected(rejected);
  if (accepted > 0 || finished) session_.Wake();
  return ack;
}

bool UpstreamJob::RetireIfIdle(Clock::time_point now, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  if (!links_.empty() || buffer_.size() > 0) {
    idle_since_.reset();
    return false;
  }
  if (!idle_since_) idle_since_ = now;
  if (now - *idle_since_ < timeout) return false;
  stopping_ = true;
  session_.Stop(now);  // nothing to flush: the stream closes at once
  return true;
}

void UpstreamJob::SetLive(LiveConfig live) {
  absl::MutexLock lock(&mu_);
  live_ = live;
  dropped_ += buffer_.SetCapacity(live.buffer_max_reports);
  session_.SetBackoff(BackoffOf(live));
  session_.Wake();
}

void UpstreamJob::Stop(Clock::time_point deadline) {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  session_.Stop(deadline);
}

void UpstreamJob::Join() {
  session_.Join();
  if (joined_) return;
  joined_ = true;
  absl::MutexLock lock(&mu_);
  if (buffer_.size() > 0) {
    spdlog::warn("job={} run='{}' stopping with {} reports not acknowledged by the daemon", id_,
                 run_id_, buffer_.reports());
  }
}

UpstreamJob::Snapshot UpstreamJob::Snap() const {
  absl::MutexLock lock(&mu_);
  return {buffer_.reports(), dropped_,  connected_, connects_,
          links_.size(),  acked_,       acked_count_, received_};
}

void UpstreamJob::NoteReportedLocked(uint64_t iteration) {
  if (!reported_ || *reported_ < iteration) reported_ = iteration;
}

void UpstreamJob::AddUnsentVersionsLocked(DownLink& link, v1::Directive& d) {
  for (const auto& [version, m] : history_) {
    if (link.sent_versions.insert(version).second) *d.add_memberships() = m;
  }
  // Forget versions the history no longer holds: bounded per link.
  if (!history_.empty()) {
    link.sent_versions.erase(link.sent_versions.begin(),
                             link.sent_versions.lower_bound(history_.begin()->first));
  }
}

v1::StreamHello UpstreamJob::HelloPartLocked() const {
  v1::StreamHello h;
  for (uint32_t r : ranks_) h.add_ranks(r);
  for (const auto& [rank, d] : devices_) nvml::ToProto(d, h.add_devices());
  for (uint32_t r : monitor_only_) h.add_monitor_only_ranks(r);
  return h;
}

void UpstreamJob::FillHelloLocked(v1::ReportBatch& b) {
  v1::StreamHello* h = b.mutable_hello();
  h->set_job_id(id_);
  h->set_run_id(run_id_);
  h->set_node(node_);
  h->set_world_size(world_size_);
  h->set_iterations_per_epoch(iterations_per_epoch_);
  h->set_client_version(absl::StrCat("straggler-agent/", STRAGGLERD_VERSION));
  // The newest version held here or by any client: after a daemon restart
  // the new daemon publishes a version above it (docs/membership.md#the-switch-rule).
  Known k = known_;
  if (!history_.empty() && history_.rbegin()->first > k.version) {
    const v1::Membership& m = history_.rbegin()->second;
    k = {m.version(), m.effective_iteration(), m.incarnation(),
         {m.excluded().begin(), m.excluded().end()}};
  }
  if (k.version > 0) {
    h->set_known_membership_version(k.version);
    h->set_known_effective_iteration(k.effective_iteration);
    h->set_known_incarnation(k.incarnation);
    for (v1::ExcludedRank& e : k.excluded) *h->add_known_excluded() = std::move(e);
  }
  if (reported_) h->set_reported_iteration(*reported_);
  hello_pending_ = false;
}


// StreamSession::Source: what goes up.

bool UpstreamJob::WantsStream() {
  // No trainer and nothing to deliver: no stream (an open one idles out).
  absl::MutexLock lock(&mu_);
  return !links_.empty() || buffer_.size() > 0;
}

void UpstreamJob::Opening(std::vector<v1::ReportBatch>* out) {
  {
    absl::MutexLock lock(&mu_);
    buffer_.Rewind();  // whatever was not acknowledged goes again
    hello_pending_ = true;
    ++connects_;
  }
  stats_.upstream_connects.fetch_add(1, std::memory_order_relaxed);
  marks_.clear();  // a new stream (maybe a new daemon) has seen nothing
  host_mark_ = 0;
  process_marks_.clear();
  TakeBatch(&out->emplace_back());
}

Clock::time_point UpstreamJob::ReadyAtLocked() const {
  const size_t unsent = buffer_.unsent();
  if (unsent == 0) return Clock::time_point::max();
  // A full batch, a stop (flush without delay), a hello or finished marker.
  if (unsent >= live_.batch_max_reports || stopping_ || flush_) return Clock::time_point::min();
  return *buffer_.oldest_unsent_time() + live_.batch_max_delay;
}

stream::Clock::time_point UpstreamJob::ReadyAt() const {
  absl::MutexLock lock(&mu_);
  return ReadyAtLocked();
}

bool UpstreamJob::NextBatch(v1::ReportBatch* batch) {
  {
    absl::MutexLock lock(&mu_);
    if (ReadyAtLocked() > Clock::now()) return false;
  }
  TakeBatch(batch);  // the sender alone takes from the buffer: still due
  return true;
}

void UpstreamJob::TakeBatch(v1::ReportBatch* batch) {
  batch->Clear();
  {
    absl::MutexLock lock(&mu_);
    batch->set_sequence(++next_sequence_);
    buffer_.TakeUnsent(live_.batch_max_reports, batch->sequence(), batch);
    if (buffer_.unsent() == 0) flush_ = false;
    // A new stream's hello: the one in force where the replay starts.
    if (hello_pending_ && !batch->has_hello()) *batch->mutable_hello() = buffer_.base_hello();
    if (batch->has_hello()) FillHelloLocked(*batch);
    if (run_devices_version_ != devices_version_) {
      run_devices_ = devices_;
      run_pids_ = pids_;
      run_devices_version_ = devices_version_;
    }
  }
  if (decorator_ != nullptr && *decorator_) {
    (*decorator_)(BatchContext{id_, run_devices_, marks_, run_pids_, host_mark_, process_marks_}, *batch);
  }
}

bool UpstreamJob::Drained() {
  absl::MutexLock lock(&mu_);
  return buffer_.size() == 0;
}

std::string UpstreamJob::Describe() const {
  absl::MutexLock lock(&mu_);
  return absl::StrCat(buffer_.reports(), " reports buffered");
}

// StreamSession::Source: what comes down.

void UpstreamJob::OnConnected() {
  absl::MutexLock lock(&mu_);
  connected_ = true;
  OfferUpstreamStateLocked(false);
}

void UpstreamJob::OnDisconnected(const stream::StreamSession::Disconnect&) {
  absl::MutexLock lock(&mu_);
  if (connected_) OfferUpstreamStateLocked(true);
  connected_ = false;
}

void UpstreamJob::OnDirective(const v1::Directive& d) {
  absl::MutexLock lock(&mu_);
  for (const v1::Membership& m : d.memberships()) history_[m.version()] = m;
  while (history_.size() > kMembershipHistory) history_.erase(history_.begin());
  for (const v1::RankProgress& p : d.progress()) {
    uint64_t& it = progress_[p.rank()];
    it = std::max(it, p.iteration());
  }
  // Runs inside Ack, under mu_ (the analysis does not follow the call).
  const size_t acked = buffer_.Ack(d.acked_sequence(), [&](const v1::IterationReport& r)
                                                           ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto [it, fresh] = acked_.emplace(r.rank(), r.iteration());
    if (!fresh) it->second = std::max(it->second, r.iteration());
    ++acked_count_[r.rank()];
  });
  stats_.reports_forwarded.fetch_add(acked, std::memory_order_relaxed);
  if (d.rejected() > 0) {
    spdlog::debug("job={} daemon rejected {} reports", id_, d.rejected());
  }
  for (const auto& link : links_) {
    v1::Directive out;
    AddUnsentVersionsLocked(*link, out);
    for (const v1::RankProgress& p : d.progress()) {
      if (link->Owns(p.rank())) *out.add_progress() = p;
    }
    uint32_t rejected = 0;
    for (const v1::ReportRejection& r : d.rejections()) {
      if (link->Owns(r.rank())) {
        *out.add_rejections() = r;
        ++rejected;
      }
    }
    if (out.memberships_size() == 0 && out.progress_size() == 0 && rejected == 0) continue;
    out.set_rejected(rejected);
    out.set_acked_sequence(link->last_acked_sequence);
    stats_.directives_relayed.fetch_add(1, std::memory_order_relaxed);
    link->Offer(std::move(out));
  }
}

void UpstreamJob::OfferUpstreamStateLocked(bool unavailable) {
  for (const auto& link : links_) {
    v1::Directive d;
    d.set_upstream_unavailable(unavailable);
    d.set_acked_sequence(link->last_acked_sequence);
    link->Offer(std::move(d));
  }
}

}  // namespace straggler::agent
