#include "agent.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "report_buffer.h"
#include "spdlog/spdlog.h"
#include "straggler/common/directive.h"
#include "straggler/common/http_deadline.h"
#include "straggler/common/metrics.h"
#include "straggler/common/service_main.h"  // ApplyLogLevel
#include "straggler/common/tls.h"
#include "straggler/common/validate.h"
#include "straggler/common/write_slot.h"
#include "telemetry_attach.h"
#include "straggler/nvml/nvml_sampler.h"
#include "straggler/nvml/telemetry_proto.h"
#include "straggler/v1/straggler.grpc.pb.h"

#ifndef STRAGGLERD_VERSION
#define STRAGGLERD_VERSION "unknown"
#endif

namespace straggler::agent {
namespace {

using common::WriteAction;
using common::WriteSlot;
using Clock = std::chrono::steady_clock;

constexpr size_t kMembershipHistory = 32;  // as the daemon keeps
// How long a job's upstream stream stays open once no trainer stream is left
// and the daemon acknowledged everything: then it ends, so that the daemon
// sees the run's stream go (its ranks detach: a killed one turns
// unresponsive, a new run of the job id is admitted; docs/runs.md).
constexpr auto kUpstreamIdleGrace = std::chrono::seconds(2);

struct AgentStats {
  std::atomic<int64_t> downstream_streams{0};
  std::atomic<uint64_t> downstream_streams_total{0};
  std::atomic<uint64_t> reports_received{0};
  std::atomic<uint64_t> reports_forwarded{0};  // acknowledged by the daemon
  std::atomic<uint64_t> reports_rejected_local{0};
  std::atomic<uint64_t> upstream_connects{0};
  std::atomic<uint64_t> directives_relayed{0};
  std::atomic<uint64_t> jobs_removed{0};
  common::SlowClientCounters http_slow_clients{};  // the HTTP listener's (http_deadline.h)
};

// The live part of the config, copied under the job's mutex when used.
struct LiveConfig {
  uint32_t batch_max_reports;
  std::chrono::milliseconds batch_max_delay;
  uint32_t buffer_max_reports;
  std::chrono::milliseconds reconnect_initial;
  std::chrono::milliseconds reconnect_max;
  std::chrono::milliseconds shutdown_flush;
  std::chrono::milliseconds idle_job_timeout;
  static LiveConfig From(const AgentConfig& c) {
    return {c.batch_max_reports,
            std::chrono::milliseconds(c.batch_max_delay_ms),
            c.buffer_max_reports,
            std::chrono::milliseconds(c.reconnect_initial_ms),
            std::chrono::milliseconds(c.reconnect_max_ms),
            std::chrono::milliseconds(c.shutdown_flush_ms),
            std::chrono::milliseconds(c.idle_job_timeout_ms)};
  }
};

class DownstreamReactor;

// A downstream stream as its job sees it. Relay state (ranks, versions sent)
// is guarded by the job's mutex; the reactor pointer by mu (null once the
// reactor is done, as with the daemon's ReactorLink).
struct DownLink {
  explicit DownLink(DownstreamReactor* r) : reactor(r) {}
  void Offer(v1::Directive d);
  void Detach() {
    std::lock_guard lock(mu);
    reactor = nullptr;
  }

  std::mutex mu;
  DownstreamReactor* reactor;            // guarded by mu
  std::vector<uint32_t> ranks;           // ascending; job mutex
  std::set<uint64_t> sent_versions;      // job mutex
  uint64_t last_acked_sequence = 0;      // job mutex
  bool Owns(uint32_t rank) const { return std::binary_search(ranks.begin(), ranks.end(), rank); }
};

// One job's fan-in: the buffer, the upstream stream (own thread), the
// membership history and the daemon's per-rank progress, and the downstream
// links to relay to. Thread-safe (mu_).
class UpstreamJob {
 public:
  UpstreamJob(std::string job_id, std::string run_id, uint32_t world_size,
              uint64_t iterations_per_epoch, std::shared_ptr<grpc::Channel> channel,
              std::string node, LiveConfig live, AgentStats& stats,
              const BatchDecorator* decorator)
      : id_(std::move(job_id)),
        run_id_(std::move(run_id)),
        world_size_(world_size),
        iterations_per_epoch_(iterations_per_epoch),
        stub_(v1::IngestService::NewStub(channel)),
        node_(std::move(node)),
        live_(live),
        stats_(stats),
        decorator_(decorator),
        buffer_(live.buffer_max_reports),
        rng_(std::random_device{}()) {}
  ~UpstreamJob() { Join(); }

  const std::string& id() const { return id_; }
  const std::string& run_id() const { return run_id_; }

  // A downstream hello. Checks the world size against the job's; registers
  // the link, offers its first directive (every kept version, the daemon's
  // progress of its ranks) and, when it brings ranks the upstream stream
  // does not speak for or a new client incarnation of a rank (a restarted
  // trainer), queues a later hello behind the buffered reports (the old
  // incarnation's reach the daemon first). The first attach starts the
  // upstream thread.
  absl::Status Attach(const v1::StreamHello& hello, const std::shared_ptr<DownLink>& link) {
    std::lock_guard lock(mu_);
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
    ++devices_version_;
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
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    cv_.notify_all();
    return absl::OkStatus();
  }

  void Detach(const DownLink* link) {
    std::lock_guard lock(mu_);
    links_.erase(std::remove_if(links_.begin(), links_.end(),
                                [&](const auto& l) { return l.get() == link; }),
                 links_.end());
    cv_.notify_all();  // the last one gone starts the upstream stream's grace
  }

  // Takes a downstream batch's reports into the buffer; never waits for the
  // daemon. Returns the acknowledgement to send back.
  v1::Directive Take(const std::shared_ptr<DownLink>& link, const v1::ReportBatch& batch) {
    v1::Directive ack;
    ack.set_acked_sequence(batch.sequence());
    uint32_t accepted = 0, rejected = 0;
    const auto now = Clock::now();
    std::lock_guard lock(mu_);
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
    if (accepted > 0 || finished) cv_.notify_all();
    return ack;
  }

  // Called by the table's sweeper: true when the job has had no downstream
  // stream and an empty buffer for `timeout`; it then stops (nothing to
  // flush) and must be forgotten. The table calls this holding its lock, so
  // no new stream can attach to a job that returned true.
  bool RetireIfIdle(Clock::time_point now, std::chrono::milliseconds timeout) {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    if (!links_.empty() || buffer_.size() > 0) {
      idle_since_.reset();
      return false;
    }
    if (!idle_since_) idle_since_ = now;
    if (now - *idle_since_ < timeout) return false;
    stopping_ = true;
    deadline_ = now;
    cv_.notify_all();
    return true;
  }

  void SetLive(LiveConfig live) {
    std::lock_guard lock(mu_);
    live_ = live;
    dropped_ += buffer_.SetCapacity(live.buffer_max_reports);
    cv_.notify_all();
  }

  // Begins the bounded flush: the upstream thread exits once the buffer is
  // acknowledged or at the deadline.
  void Stop(Clock::time_point deadline) {
    std::lock_guard lock(mu_);
    stopping_ = true;
    deadline_ = deadline;
    cv_.notify_all();
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  struct Snapshot {
    size_t buffered = 0;
    uint64_t dropped = 0;
    bool connected = false;
    uint64_t connects = 0;
    size_t downstreams = 0;
    std::map<uint32_t, uint64_t> acked;        // highest iteration the daemon acknowledged
    std::map<uint32_t, uint64_t> acked_count;  // reports the daemon acknowledged
    std::map<uint32_t, uint64_t> received;     // reports taken from trainer streams

    // Another run's fan-in of the same job id (metrics are per job id).
    void Add(const Snapshot& o) {
      buffered += o.buffered;
      dropped += o.dropped;
      connected = connected || o.connected;
      connects += o.connects;
      downstreams += o.downstreams;
      for (const auto& [r, it] : o.acked) acked[r] = std::max(acked[r], it);
      for (const auto& [r, n] : o.acked_count) acked_count[r] += n;
      for (const auto& [r, n] : o.received) received[r] += n;
    }
  };
  Snapshot Snap() const {
    std::lock_guard lock(mu_);
    return {buffer_.reports(), dropped_,  connected_, connects_,
            links_.size(),  acked_,       acked_count_, received_};
  }

 private:
  struct Known {
    uint64_t version = 0, effective_iteration = 0, incarnation = 0;
    std::vector<v1::ExcludedRank> excluded;
  };

  // How far the job's ranks on this node are, for the upstream hello
  // (StreamHello.reported_iteration): the maximum over its trainers' hellos
  // and every report they sent here.
  void NoteReportedLocked(uint64_t iteration) {
    if (!reported_ || *reported_ < iteration) reported_ = iteration;
  }

  // Versions kept that `link` has not been sent, ascending, into `d`.
  void AddUnsentVersionsLocked(DownLink& link, v1::Directive& d) {
    for (const auto& [version, m] : history_) {
      if (link.sent_versions.insert(version).second) *d.add_memberships() = m;
    }
    // Forget versions the history no longer holds: bounded per link.
    if (!history_.empty()) {
      link.sent_versions.erase(link.sent_versions.begin(),
                               link.sent_versions.lower_bound(history_.begin()->first));
    }
  }

  // The ranks and devices (client incarnations) an upstream hello names now.
  v1::StreamHello HelloPartLocked() const {
    v1::StreamHello h;
    for (uint32_t r : ranks_) h.add_ranks(r);
    for (const auto& [rank, d] : devices_) nvml::ToProto(d, h.add_devices());
    return h;
  }

  // Completes b.hello (its ranks and devices come from the buffer: the hello
  // in force where the batch starts).
  void FillHelloLocked(v1::ReportBatch& b) {
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

  // Reader thread: an upstream directive.
  void HandleDirective(const v1::Directive& d) {
    std::lock_guard lock(mu_);
    const bool became_connected = !connected_;
    if (!connected_) {
      connected_ = true;
      refused_logged_ = false;
      backoff_ = live_.reconnect_initial;
      spdlog::info("job={} run='{}' upstream connected ({} reports buffered)", id_, run_id_,
                   buffer_.reports());
    }
    for (const v1::Membership& m : d.memberships()) history_[m.version()] = m;
    while (history_.size() > kMembershipHistory) history_.erase(history_.begin());
    for (const v1::RankProgress& p : d.progress()) {
      uint64_t& it = progress_[p.rank()];
      it = std::max(it, p.iteration());
    }
    const size_t acked = buffer_.Ack(d.acked_sequence(), [&](const v1::IterationReport& r) {
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
      if (out.memberships_size() == 0 && out.progress_size() == 0 && rejected == 0 &&
          !became_connected) {
        continue;
      }
      if (became_connected) out.set_upstream_unavailable(false);
      out.set_rejected(rejected);
      out.set_acked_sequence(link->last_acked_sequence);
      stats_.directives_relayed.fetch_add(1, std::memory_order_relaxed);
      link->Offer(std::move(out));
    }
    cv_.notify_all();  // a stopping writer waits for the buffer to drain
  }

  // With mu_ held: tells every downstream stream whether the daemon is
  // reachable through this job's upstream stream.
  void OfferUpstreamStateLocked(bool unavailable) {
    for (const auto& link : links_) {
      v1::Directive d;
      d.set_upstream_unavailable(unavailable);
      d.set_acked_sequence(link->last_acked_sequence);
      link->Offer(std::move(d));
    }
  }

  bool FlushDone() const {
    return stopping_ && (buffer_.size() == 0 || Clock::now() >= deadline_);
  }

  // The upstream thread: connect, (re)send the hello, replay the buffer,
  // then batch by size and time; on failure back off with jitter and retry.
  void Run() {
    backoff_ = live_.reconnect_initial;
    for (;;) {
      grpc::ClientContext ctx;
      std::unique_ptr<grpc::ClientReaderWriter<v1::ReportBatch, v1::Directive>> stream;
      std::atomic<bool> broken{false};
      {
        std::unique_lock lock(mu_);
        if (FlushDone()) break;
        // No trainer and nothing to deliver: no stream until one attaches.
        cv_.wait(lock, [&] { return stopping_ || !links_.empty() || buffer_.size() > 0; });
        if (FlushDone()) break;
        buffer_.Rewind();  // whatever was not acknowledged goes again
        hello_pending_ = true;
        ++connects_;
      }
      marks_.clear();  // a new stream (maybe a new daemon) has seen nothing
      stream = stub_->Stream(&ctx);
      stats_.upstream_connects.fetch_add(1, std::memory_order_relaxed);
      std::thread reader([&] {
        v1::Directive d;
        while (stream->Read(&d)) HandleDirective(d);
        {
          std::lock_guard lock(mu_);
          broken.store(true);
        }
        cv_.notify_all();
      });

      bool ok = true;
      bool half_closed = false;
      bool idle = false;  // ended after kUpstreamIdleGrace without trainers
      Clock::time_point quiet_since{};  // no trainer, nothing buffered since; {} = not quiet
      for (;;) {
        v1::ReportBatch batch;
        {
          std::unique_lock lock(mu_);
          for (;;) {
            if (broken.load() || FlushDone()) break;
            if (hello_pending_) break;
            const size_t unsent = buffer_.unsent();
            if (unsent >= live_.batch_max_reports || (stopping_ && unsent > 0)) break;
            if (flush_ && unsent > 0) break;  // a hello or finished marker waits
            if (!stopping_ && links_.empty() && buffer_.size() == 0) {
              const auto now = Clock::now();
              if (quiet_since == Clock::time_point{}) quiet_since = now;
              if (now - quiet_since >= kUpstreamIdleGrace) {
                idle = true;
                break;
              }
              cv_.wait_until(lock, quiet_since + kUpstreamIdleGrace);
              continue;
            }
            quiet_since = {};
            if (auto oldest = buffer_.oldest_unsent_time()) {
              const auto due = *oldest + live_.batch_max_delay;
              if (Clock::now() >= due) break;
              cv_.wait_until(lock, std::min(due, stopping_ ? deadline_ : due));
            } else if (stopping_) {
              cv_.wait_until(lock, deadline_);
            } else {
              cv_.wait(lock);
            }
          }
          if (broken.load()) break;
          if (FlushDone() || idle) {
            half_closed = buffer_.size() == 0;
            break;
          }
          batch.set_sequence(++next_sequence_);
          buffer_.TakeUnsent(live_.batch_max_reports, batch.sequence(), &batch);
          if (buffer_.unsent() == 0) flush_ = false;
          // A new stream's hello: the one in force where the replay starts.
          if (hello_pending_ && !batch.has_hello()) *batch.mutable_hello() = buffer_.base_hello();
          if (batch.has_hello()) FillHelloLocked(batch);
          if (run_devices_version_ != devices_version_) {
            run_devices_ = devices_;
            run_devices_version_ = devices_version_;
          }
        }
        if (decorator_ != nullptr && *decorator_) {
          (*decorator_)(BatchContext{id_, run_devices_, marks_}, batch);
        }
        if (!stream->Write(batch)) {
          ok = false;
          break;
        }
      }
      if (ok && half_closed) {
        stream->WritesDone();
      } else {
        ctx.TryCancel();
      }
      reader.join();
      const grpc::Status status = stream->Finish();
      std::chrono::milliseconds delay;
      {
        std::unique_lock lock(mu_);
        const bool was_connected = connected_;
        connected_ = false;
        if (was_connected) OfferUpstreamStateLocked(true);
        if (FlushDone()) break;
        if (idle && half_closed) {
          spdlog::info("job={} run='{}' upstream stream closed: no trainer stream for {} s",
                       id_, run_id_, kUpstreamIdleGrace.count());
          backoff_ = live_.reconnect_initial;
          continue;  // parks until a trainer attaches
        }
        if (was_connected) {
          spdlog::warn("job={} run='{}' upstream stream ended ({}: {}); {} reports buffered, "
                       "reconnecting",
                       id_, run_id_, static_cast<int>(status.error_code()),
                       status.error_message(), buffer_.reports());
        } else if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
          // Another run of the job id is live on the daemon: retried with
          // backoff until it ends; the buffer is kept (bounded).
          if (!refused_logged_) {
            refused_logged_ = true;
            spdlog::info("job={} run='{}' refused by the daemon ({}); retrying, {} reports "
                         "buffered", id_, run_id_, status.error_message(), buffer_.reports());
          }
        } else {
          spdlog::debug("job={} upstream unreachable ({})", id_, status.error_message());
        }
        // +-20% jitter so that the agents of a cluster do not reconnect in step.
        std::uniform_real_distribution<double> jitter(0.8, 1.2);
        delay = std::chrono::milliseconds(
            static_cast<int64_t>(static_cast<double>(backoff_.count()) * jitter(rng_)));
        backoff_ = std::min(backoff_ * 2, live_.reconnect_max);
        cv_.wait_for(lock, delay, [&] { return stopping_ && Clock::now() >= deadline_; });
        if (stopping_ && Clock::now() >= deadline_) break;
      }
    }
    std::lock_guard lock(mu_);
    if (buffer_.size() > 0) {
      spdlog::warn("job={} run='{}' stopping with {} reports not acknowledged by the daemon", id_,
                   run_id_, buffer_.reports());
    }
  }

  const std::string id_;
  const std::string run_id_;  // StreamHello.run_id of every trainer of this fan-in
  const uint32_t world_size_;
  uint64_t iterations_per_epoch_;
  std::unique_ptr<v1::IngestService::Stub> stub_;
  const std::string node_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  LiveConfig live_;
  AgentStats& stats_;
  const BatchDecorator* decorator_;
  ReportBuffer buffer_;
  std::set<uint32_t> ranks_;                 // every rank a downstream hello named
  bool hello_pending_ = true;                // a new upstream stream: its first hello
  bool flush_ = false;                       // a marker is buffered: send without delay
  bool refused_logged_ = false;              // FAILED_PRECONDITION logged since connected
  Known known_;
  std::optional<uint64_t> reported_;  // see NoteReportedLocked
  std::map<uint64_t, v1::Membership> history_;  // newest kMembershipHistory versions
  std::map<uint32_t, uint64_t> progress_;       // the daemon's, per rank
  std::map<uint32_t, uint64_t> acked_;          // highest iteration acknowledged upstream
  std::map<uint32_t, uint64_t> acked_count_;    // reports acknowledged upstream, per rank
  std::map<uint32_t, uint64_t> received_;       // reports taken from downstream, per rank
  std::vector<std::shared_ptr<DownLink>> links_;
  std::map<uint32_t, nvml::RankDevice> devices_;  // from downstream hellos, by rank
  uint64_t devices_version_ = 0;                  // grows on every change of devices_
  std::optional<Clock::time_point> idle_since_;   // no links, empty buffer since
  // Upstream thread only: its copy of devices_, and the decorator's marks.
  std::map<uint32_t, nvml::RankDevice> run_devices_;
  uint64_t run_devices_version_ = ~uint64_t{0};
  std::map<uint32_t, uint64_t> marks_;
  uint64_t dropped_ = 0;
  uint64_t next_sequence_ = 0;
  uint64_t connects_ = 0;
  bool connected_ = false;
  bool stopping_ = false;
  Clock::time_point deadline_{};
  std::chrono::milliseconds backoff_{100};
  std::mt19937_64 rng_;
  std::thread thread_;
};

// Finds or creates a job's fan-in; a sweeper thread removes idle jobs.
// Thread-safe. Lock order: the table's mu_, then a job's.
class JobTable {
 public:
  JobTable(std::shared_ptr<grpc::Channel> channel, std::string node, AgentStats& stats,
           const BatchDecorator* decorator, LiveConfig live)
      : channel_(std::move(channel)),
        node_(std::move(node)),
        stats_(stats),
        decorator_(decorator),
        live_(live) {
    sweeper_ = std::thread([this] { Sweep(); });
  }
  ~JobTable() { StopSweeper(); }

  // Finds or creates the hello's job and attaches `link` to it, as one step
  // under the table's lock, so the sweeper never retires a job a new stream
  // is joining.
  absl::StatusOr<std::shared_ptr<UpstreamJob>> Attach(const v1::StreamHello& hello,
                                                      const std::shared_ptr<DownLink>& link) {
    std::lock_guard lock(mu_);
    auto job = Find(hello);
    if (!job.ok()) return job.status();
    if (absl::Status s = (*job)->Attach(hello, link); !s.ok()) return s;
    return job;
  }

 private:
  // With mu_ held (through Attach).
  absl::StatusOr<std::shared_ptr<UpstreamJob>> Find(const v1::StreamHello& hello) {
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
                                          hello.iterations_per_epoch(), channel_, node_, live_,
                                          stats_, decorator_);
      spdlog::info("job={} run='{}' first stream: upstream stream opened (world_size={})",
                   hello.job_id(), hello.run_id(), hello.world_size());
    }
    return job;
  }

 public:
  void SetLive(LiveConfig live) {
    std::lock_guard lock(mu_);
    live_ = live;
    for (auto& [id, job] : jobs_) job->SetLive(live);
    sweep_cv_.notify_all();
  }

  std::vector<std::shared_ptr<UpstreamJob>> Jobs() const {
    std::lock_guard lock(mu_);
    std::vector<std::shared_ptr<UpstreamJob>> out;
    for (const auto& [id, job] : jobs_) out.push_back(job);
    return out;
  }

  // Refuses new jobs from now on; returns the existing ones.
  std::vector<std::shared_ptr<UpstreamJob>> Close() {
    StopSweeper();
    std::lock_guard lock(mu_);
    closed_ = true;
    std::vector<std::shared_ptr<UpstreamJob>> out;
    for (const auto& [id, job] : jobs_) out.push_back(job);
    return out;
  }

 private:
  void StopSweeper() {
    {
      std::lock_guard lock(mu_);
      sweeper_stop_ = true;
    }
    sweep_cv_.notify_all();
    if (sweeper_.joinable()) sweeper_.join();
  }

  // Removes jobs idle for live_.idle_job_timeout: checked every quarter of
  // it (at most once a second), so a job goes within 1.25x the timeout.
  void Sweep() {
    std::unique_lock lock(mu_);
    while (!sweeper_stop_) {
      const auto timeout = live_.idle_job_timeout;
      const auto period = std::clamp<std::chrono::milliseconds>(
          timeout / 4, std::chrono::milliseconds(10), std::chrono::seconds(1));
      sweep_cv_.wait_for(lock, period);
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
      lock.unlock();
      for (const auto& job : retired) {
        job->Join();
        stats_.jobs_removed.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("job={} run='{}' removed: no trainer stream and nothing buffered for {} ms",
                     job->id(), job->run_id(), timeout.count());
      }
      lock.lock();
    }
  }

  std::shared_ptr<grpc::Channel> channel_;
  const std::string node_;
  AgentStats& stats_;
  const BatchDecorator* decorator_;
  mutable std::mutex mu_;
  LiveConfig live_;  // guarded by mu_
  // By (job id, run id).
  std::map<std::pair<std::string, std::string>, std::shared_ptr<UpstreamJob>> jobs_;
  bool closed_ = false;
  bool sweeper_stop_ = false;  // guarded by mu_
  std::condition_variable sweep_cv_;
  std::thread sweeper_;
};

// One trainer stream (a client_lib Client) on the agent: the daemon's
// IngestReactor seen from the client, with the agent's buffer behind it.
class DownstreamReactor final : public grpc::ServerBidiReactor<v1::ReportBatch, v1::Directive> {
 public:
  DownstreamReactor(JobTable& jobs, AgentStats& stats, std::string peer)
      : jobs_(jobs), stats_(stats), peer_(std::move(peer)),
        link_(std::make_shared<DownLink>(this)) {
    stats_.downstream_streams.fetch_add(1, std::memory_order_relaxed);
    stats_.downstream_streams_total.fetch_add(1, std::memory_order_relaxed);
    StartRead(&batch_);
  }

  void OnReadDone(bool ok) override {
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
    }
    // A later hello on a downstream stream is ignored (client_lib never
    // sends one); its reports must belong to the first hello's ranks.
    Offer(job_->Take(link_, batch_));
    std::lock_guard lock(mu_);
    if (!slot_.finishing()) StartRead(&batch_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    Act(slot_.WriteDone(ok));
  }

  void OnDone() override {
    link_->Detach();
    if (job_) job_->Detach(link_.get());
    stats_.downstream_streams.fetch_sub(1, std::memory_order_relaxed);
    delete this;
  }

  void Offer(v1::Directive d) {
    std::lock_guard lock(mu_);
    Act(slot_.Offer(std::move(d), &common::MergeDirective));
  }
  void Finish(grpc::Status status, bool flush) {
    std::lock_guard lock(mu_);
    Act(slot_.RequestFinish(std::move(status), flush));
  }

 private:
  absl::Status Hello() {
    if (absl::Status s = common::RequireHello(batch_); !s.ok()) return s;
    auto job = jobs_.Attach(batch_.hello(), link_);
    if (!job.ok()) return job.status();
    job_ = *std::move(job);
    spdlog::info("job={} downstream stream from {} ranks={}", job_->id(), peer_,
                 batch_.hello().ranks_size());
    return absl::OkStatus();
  }

  void Act(WriteAction action) {  // mu_ held
    common::CarryOut(action, slot_, static_cast<ServerBidiReactor&>(*this));
  }

  JobTable& jobs_;
  AgentStats& stats_;
  const std::string peer_;
  const std::shared_ptr<DownLink> link_;
  v1::ReportBatch batch_;
  std::shared_ptr<UpstreamJob> job_;  // read chain only
  std::mutex mu_;
  WriteSlot<v1::Directive> slot_;  // guarded by mu_
};

void DownLink::Offer(v1::Directive d) {
  std::lock_guard lock(mu);
  if (reactor != nullptr) reactor->Offer(std::move(d));
}

class IngestProxy final : public v1::IngestService::CallbackService {
 public:
  IngestProxy(JobTable& jobs, AgentStats& stats) : jobs_(jobs), stats_(stats) {}
  grpc::ServerBidiReactor<v1::ReportBatch, v1::Directive>* Stream(
      grpc::CallbackServerContext* context) override {
    return new DownstreamReactor(jobs_, stats_, context->peer());
  }

 private:
  JobTable& jobs_;
  AgentStats& stats_;
};

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string DialAddress(const std::string& address, int port) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") host = "127.0.0.1";
  return absl::StrCat(host, ":", port);
}

}  // namespace

struct Agent::Impl {
  explicit Impl(AgentConfig c) : config(std::move(c)) {}

  // The agent's families (docs/metrics.md), built at scrape time from the
  // job table's snapshots and the relaxed counters of AgentStats.
  std::vector<prometheus::MetricFamily> CollectMetrics() const {
    using T = prometheus::MetricType;
    using common::AddFamily;
    using common::AddSample;
    std::vector<prometheus::MetricFamily> out;
    const auto jobs = table->Jobs();
    // Per job id: the fan-ins of its runs (briefly two, while a new run
    // waits for the old one's stream to end) add up.
    std::map<std::string, UpstreamJob::Snapshot> snaps;
    for (const auto& j : jobs) {
      auto [it, fresh] = snaps.try_emplace(j->id(), j->Snap());
      if (!fresh) it->second.Add(j->Snap());
    }
    using Snap = UpstreamJob::Snapshot;
    struct JobFamily {
      const char* name;
      T type;
      const char* help;
      double (*value)(const Snap&);
    };
    static const JobFamily kJobFamilies[] = {
        {"straggler_agent_buffered_reports", T::Gauge,
         "Reports held for the daemon (not yet acknowledged by it).",
         [](const Snap& s) { return static_cast<double>(s.buffered); }},
        {"straggler_agent_dropped_reports_total", T::Counter,
         "Reports dropped from a full buffer (oldest first) before the daemon acknowledged them.",
         [](const Snap& s) { return static_cast<double>(s.dropped); }},
        {"straggler_agent_upstream_connected", T::Gauge,
         "1 while the job's upstream stream to the daemon is up.",
         [](const Snap& s) { return s.connected ? 1.0 : 0.0; }},
        {"straggler_agent_upstream_connects_total", T::Counter,
         "Upstream stream attempts (the first one included).",
         [](const Snap& s) { return static_cast<double>(s.connects); }},
        {"straggler_agent_job_downstream_streams", T::Gauge, "Open trainer streams of the job.",
         [](const Snap& s) { return static_cast<double>(s.downstreams); }},
    };
    for (const JobFamily& f : kJobFamilies) {
      auto& family = AddFamily(out, f.name, f.type, f.help);
      for (const auto& [id, s] : snaps) AddSample(family, {{"job", id}}, f.value(s));
    }
    // Per rank: a node runs a handful of ranks, so the cardinality is small.
    struct RankFamily {
      const char* name;
      T type;
      const char* help;
      std::map<uint32_t, uint64_t> Snap::*member;
    };
    static const RankFamily kRankFamilies[] = {
        {"straggler_agent_rank_acked_iteration", T::Gauge,
         "Highest iteration of the rank the daemon acknowledged through this agent.",
         &Snap::acked},
        {"straggler_agent_rank_received_reports_total", T::Counter,
         "Reports of the rank taken from its trainer stream.", &Snap::received},
        {"straggler_agent_rank_acked_reports_total", T::Counter,
         "Reports of the rank the daemon acknowledged (all daemon runs together).",
         &Snap::acked_count},
    };
    for (const RankFamily& f : kRankFamilies) {
      auto& family = AddFamily(out, f.name, f.type, f.help);
      for (const auto& [id, s] : snaps) {
        for (const auto& [rank, v] : s.*f.member) {
          AddSample(family, {{"job", id}, {"rank", std::to_string(rank)}},
                    static_cast<double>(v));
        }
      }
    }
    const bool telemetry_on = sampler && sampler->enabled();
    struct AgentFamily {
      const char* name;
      T type;
      const char* help;
      double value;
    };
    const AgentFamily agent_families[] = {
        {"straggler_agent_downstream_streams", T::Gauge, "Open trainer streams.",
         static_cast<double>(stats.downstream_streams.load())},
        {"straggler_agent_reports_received_total", T::Counter,
         "Reports taken from trainer streams into the buffer.",
         static_cast<double>(stats.reports_received.load())},
        {"straggler_agent_reports_forwarded_total", T::Counter,
         "Reports the daemon acknowledged.", static_cast<double>(stats.reports_forwarded.load())},
        {"straggler_agent_reports_rejected_total", T::Counter,
         "Reports refused by the agent itself (rank not in the stream's hello).",
         static_cast<double>(stats.reports_rejected_local.load())},
        {"straggler_agent_directives_relayed_total", T::Counter,
         "Directives relayed from the daemon to trainer streams.",
         static_cast<double>(stats.directives_relayed.load())},
        {"straggler_agent_jobs", T::Gauge,
         "Jobs (per run) the agent holds, with an upstream stream, retrying, or waiting "
         "for a trainer stream.",
         static_cast<double>(jobs.size())},
        {"straggler_agent_jobs_removed_total", T::Counter,
         "Jobs removed after jobs.idle_timeout_ms without trainer streams or buffer.",
         static_cast<double>(stats.jobs_removed.load())},
        {"straggler_agent_telemetry_enabled", T::Gauge,
         "1 while GPU telemetry (NVML) is on; 0 when disabled or NVML is absent.",
         telemetry_on ? 1.0 : 0.0},
        {"straggler_agent_gpus", T::Gauge, "GPUs NVML lists on this node.",
         telemetry_on ? static_cast<double>(sampler->Gpus().size()) : 0.0},
        {"straggler_agent_telemetry_samples_sent_total", T::Counter,
         "Per-rank GPU samples attached to upstream batches.",
         static_cast<double>(telemetry_sent.load())},
    };
    for (const AgentFamily& f : agent_families) {
      AddSample(AddFamily(out, f.name, f.type, f.help), {}, f.value);
    }
    auto& slow = AddFamily(out, "straggler_agent_http_slow_clients_total", T::Counter,
                           "HTTP connections closed for a request or response slower than the "
                           "http.*_timeout_seconds.");
    AddSample(slow, {{"phase", "request"}}, static_cast<double>(stats.http_slow_clients[0].load()));
    AddSample(slow, {{"phase", "response"}}, static_cast<double>(stats.http_slow_clients[1].load()));
    AddSample(AddFamily(out, "straggler_agent_build_info", T::Gauge, "Always 1."),
              {{"version", STRAGGLERD_VERSION}}, 1);
    common::AddProcessMetrics(common::ReadProcessStats(), out);
    return out;
  }

  std::string RenderMetrics() const { return common::TextSerializer().Serialize(CollectMetrics()); }

  AgentConfig config;
  BatchDecorator user_decorator;  // SetBatchDecorator's
  BatchDecorator decorator;       // telemetry, then user_decorator
  std::unique_ptr<nvml::NvmlSampler> sampler;  // null when telemetry is disabled
  std::atomic<uint64_t> telemetry_sent{0};
  std::atomic<bool> ready{false};
  AgentStats stats;
  std::unique_ptr<JobTable> table;
  std::unique_ptr<IngestProxy> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<httplib::Server> http;
  std::thread http_thread;
  int tcp_port = 0;
  int http_port = 0;
  bool stopped = false;
};

Agent::Agent(AgentConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}

Agent::~Agent() { Shutdown(); }

void Agent::SetBatchDecorator(BatchDecorator decorator) {
  impl_->user_decorator = std::move(decorator);
}

absl::Status Agent::Start() {
  Impl& m = *impl_;
  const AgentConfig& c = m.config;
  const std::string path = *UnixSocketPath(c.listen);
  // The socket's directory (e.g. /run/straggler) may not exist yet on a
  // fresh node or in a fresh hostPath volume.
  std::error_code ec;
  if (const auto dir = std::filesystem::path(path).parent_path(); !dir.empty()) {
    std::filesystem::create_directories(dir, ec);
  }
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create the directory of listen=",
                                                      c.listen, ": ", ec.message()));
  }

  if (c.telemetry_enabled) {
    nvml::NvmlSampler::Options o;
    o.library = c.nvml_library;
    o.interval = std::chrono::milliseconds(c.telemetry_interval_ms);
    // Logs its one line: on (GPUs, library, interval), or off on a GPU-less host.
    m.sampler = nvml::NvmlSampler::Start(o);
  } else {
    spdlog::info("GPU telemetry off (telemetry.enabled=false)");
  }
  {
    Impl* impl = impl_.get();
    const bool telemetry_on = m.sampler && m.sampler->enabled();
    if (telemetry_on || m.user_decorator) {
      m.decorator = [impl, telemetry_on](const BatchContext& ctx, v1::ReportBatch& batch) {
        if (telemetry_on) {
          impl->telemetry_sent.fetch_add(AttachTelemetry(*impl->sampler, ctx, batch),
                                         std::memory_order_relaxed);
        }
        if (impl->user_decorator) impl->user_decorator(ctx, batch);
      };
    }
  }

  grpc::ChannelArguments args;
  // Reconnect quickly after a daemon restart; the agent's own backoff paces
  // the stream attempts.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::string tls_error;
  auto credentials = MakeChannelCredentials(c.upstream_tls, c.upstream, &tls_error);
  if (!credentials) {
    return absl::FailedPreconditionError(absl::StrCat("upstream_tls: ", tls_error));
  }
  // TLS on the TCP listener: the files are read and checked now, so that a
  // bad one stops the start naming it (FAILED_PRECONDITION: exit 2).
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials = grpc::InsecureServerCredentials();
  if (!c.listen_tcp.empty() && c.listen_tcp_tls.enabled()) {
    absl::StatusOr<common::ServerTls> tls =
        common::LoadServerTls(c.listen_tcp_tls, "listen_tcp_tls");
    if (!tls.ok()) return tls.status();
    tcp_credentials = common::GrpcServerCredentials(*tls);
  }
  auto channel = grpc::CreateCustomChannel(c.upstream, credentials, args);
  m.table = std::make_unique<JobTable>(channel, c.node.empty() ? HostName() : c.node, m.stats,
                                       &m.decorator, LiveConfig::From(c));
  m.service = std::make_unique<IngestProxy>(*m.table, m.stats);

  // The same standard services as stragglerd, so a client (or a probe such
  // as grpc_health_probe) cannot tell the agent from the daemon.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // The socket is created by BuildAndStart with the process umask: made
  // 0660 from its first moment (not chmod-ed afterwards, which would leave a
  // window in which any local user could connect and report as any rank).
  // umask is process-wide; no other thread creates files at this point.
  const mode_t old_umask = umask(0117);
  // The unix socket is plaintext: its file mode decides who may connect.
  builder.AddListeningPort(c.listen, grpc::InsecureServerCredentials());
  if (!c.listen_tcp.empty()) {
    builder.AddListeningPort(c.listen_tcp, tcp_credentials, &m.tcp_port);
  }
  // No SO_REUSEPORT (gRPC's default): a second agent on the same TCP port
  // must fail to start, not split the node's trainers with the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(m.service.get());
  m.server = builder.BuildAndStart();
  umask(old_umask);
  if (!m.server) {
    return absl::UnavailableError(absl::StrCat("cannot listen on listen=", c.listen,
                                               c.listen_tcp.empty() ? "" : " / listen_tcp=",
                                               c.listen_tcp));
  }
  grpc::HealthCheckServiceInterface* health = m.server->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus(straggler::v1::IngestService::service_full_name(), true);
  // Trainer processes of the same group (not every local user) may connect.
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 0007) != 0) {
    spdlog::warn("agent socket {} is accessible to other users (mode {:o})", path,
                 st.st_mode & 0777);
  }

  if (!c.http_address.empty()) {
    const size_t colon = c.http_address.rfind(':');
    std::string host = c.http_address.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    const int port = std::stoi(c.http_address.substr(colon + 1));
    // Whole-request deadlines, as the daemon's listener: httplib's own
    // timeouts are per read, so a client trickling its request (slowloris)
    // would hold a worker for as long as it liked.
    m.http = common::MakeDeadlineServer(m.stats.http_slow_clients);
    common::ConfigureListener(*m.http, c.http_threads, c.http_read_timeout_seconds,
                              c.http_write_timeout_seconds, c.http_keep_alive_timeout_seconds);
    Impl* impl = impl_.get();
    m.http->Get("/metrics", [impl](const httplib::Request&, httplib::Response& res) {
      res.set_content(impl->RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
    });
    m.http->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    // Ready while trainers can connect: from Start until Shutdown begins.
    m.http->Get("/readyz", [impl](const httplib::Request&, httplib::Response& res) {
      if (impl->ready.load()) {
        res.set_content("ready\n", "text/plain");
      } else {
        res.status = 503;
        res.set_content("shutting down\n", "text/plain");
      }
    });
    m.http_port = port == 0 ? m.http->bind_to_any_port(host)
                            : (m.http->bind_to_port(host, port) ? port : -1);
    if (m.http_port <= 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on http_address=", c.http_address));
    }
    m.http_thread = std::thread([impl] { impl->http->listen_after_bind(); });
  }
  m.ready.store(true);
  return absl::OkStatus();
}

void Agent::Reload(const AgentConfig& next) {
  Impl& m = *impl_;
  auto restart_needed = [&](const char* key, const std::string& was, const std::string& now) {
    if (was != now) {
      spdlog::warn("SIGHUP: {} changed ({} -> {}): takes effect after a restart", key, was, now);
    }
  };
  restart_needed("listen", m.config.listen, next.listen);
  restart_needed("listen_tcp", m.config.listen_tcp, next.listen_tcp);
  restart_needed("upstream", m.config.upstream, next.upstream);
  restart_needed("listen_tcp_tls.cert_file", m.config.listen_tcp_tls.cert_file,
                 next.listen_tcp_tls.cert_file);
  restart_needed("listen_tcp_tls.key_file", m.config.listen_tcp_tls.key_file,
                 next.listen_tcp_tls.key_file);
  restart_needed("listen_tcp_tls.client_ca_file", m.config.listen_tcp_tls.client_ca_file,
                 next.listen_tcp_tls.client_ca_file);
  restart_needed("listen_tcp_tls.reload_seconds",
                 std::to_string(m.config.listen_tcp_tls.reload_seconds),
                 std::to_string(next.listen_tcp_tls.reload_seconds));
  restart_needed("http_address", m.config.http_address, next.http_address);
  if (m.config.http_threads != next.http_threads ||
      m.config.http_read_timeout_seconds != next.http_read_timeout_seconds ||
      m.config.http_write_timeout_seconds != next.http_write_timeout_seconds ||
      m.config.http_keep_alive_timeout_seconds != next.http_keep_alive_timeout_seconds) {
    spdlog::warn("SIGHUP: http.* changed: takes effect after a restart");
  }
  restart_needed("node", m.config.node, next.node);
  restart_needed("upstream_tls.ca_file", m.config.upstream_tls.ca_file, next.upstream_tls.ca_file);
  restart_needed("upstream_tls.cert_file", m.config.upstream_tls.cert_file,
                 next.upstream_tls.cert_file);
  restart_needed("upstream_tls.key_file", m.config.upstream_tls.key_file,
                 next.upstream_tls.key_file);
  AgentConfig applied = m.config;
  applied.log_level = next.log_level;
  applied.batch_max_reports = next.batch_max_reports;
  applied.batch_max_delay_ms = next.batch_max_delay_ms;
  applied.buffer_max_reports = next.buffer_max_reports;
  applied.reconnect_initial_ms = next.reconnect_initial_ms;
  applied.reconnect_max_ms = next.reconnect_max_ms;
  applied.shutdown_flush_ms = next.shutdown_flush_ms;
  applied.idle_job_timeout_ms = next.idle_job_timeout_ms;
  if (m.config.telemetry_enabled != next.telemetry_enabled ||
      m.config.telemetry_interval_ms != next.telemetry_interval_ms ||
      m.config.nvml_library != next.nvml_library) {
    spdlog::warn("SIGHUP: telemetry changed: takes effect after a restart");
  }
  m.config = applied;
  common::ApplyLogLevel(applied.log_level);
  if (m.table) m.table->SetLive(LiveConfig::From(applied));
  spdlog::info("SIGHUP: config reloaded (log_level={}, batch {} reports / {} ms, buffer {} "
               "reports per job, reconnect {}..{} ms, shutdown flush {} ms, idle job timeout "
               "{} ms)",
               applied.log_level, applied.batch_max_reports, applied.batch_max_delay_ms,
               applied.buffer_max_reports, applied.reconnect_initial_ms,
               applied.reconnect_max_ms, applied.shutdown_flush_ms, applied.idle_job_timeout_ms);
}

void Agent::Shutdown() {
  Impl& m = *impl_;
  if (m.stopped || !m.table) return;
  m.stopped = true;
  m.ready.store(false);
  // No new streams; ending the open ones lets clients reconnect elsewhere
  // (or to the next agent) with what they hold.
  const auto jobs = m.table->Close();
  if (m.server) m.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  const auto deadline = Clock::now() + std::chrono::milliseconds(m.config.shutdown_flush_ms);
  for (const auto& j : jobs) j->Stop(deadline);
  for (const auto& j : jobs) j->Join();
  if (m.http) {
    m.http->stop();
    if (m.http_thread.joinable()) m.http_thread.join();
  }
  if (m.server) m.server->Wait();
  // The socket file stays otherwise; a later bind replaces it anyway.
  if (auto path = UnixSocketPath(m.config.listen)) unlink(path->c_str());
}

const std::string& Agent::listen_address() const { return impl_->config.listen; }

std::string Agent::tcp_dial_address() const {
  return impl_->config.listen_tcp.empty() ? ""
                                          : DialAddress(impl_->config.listen_tcp, impl_->tcp_port);
}

std::string Agent::http_dial_address() const {
  return impl_->config.http_address.empty()
             ? ""
             : DialAddress(impl_->config.http_address, impl_->http_port);
}

}  // namespace straggler::agent
