// straggler::Client over one gRPC bidi stream (IngestService.Stream).
//
// The pieces (each with its own header):
//   * client_options.cc: ClientOptions::FromEnv and Validate.
//   * stream::StreamSession (straggler/stream/stream_session.h, shared with
//     the agent): the connection's life - the sender thread (connect, write,
//     reconnect with backoff) and a reader thread per connection.
//   * UnackedBatches (unacked_batches.h): batches written and not yet
//     acknowledged, resent on a new connection.
//   * MembershipTracker (membership_tracker.h): the versions received, the
//     daemon's progress of our ranks, MembershipFor's wait, the callbacks.
// ClientImpl below joins them: Report() pushes into a lock-free queue
// (nothing else), and as the session's Source it turns the queue into
// batches and the hello, and a directive into acknowledgements, statistics
// and memberships.
#include <algorithm>
#include <atomic>
#include <bit>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "straggler/common/channel_security.h"
#include "clamp_timeout.h"
#include "client_options.h"
#include "membership_tracker.h"
#include "queued_report.h"
#include "report_queue.h"
#include "straggler/client.h"
#include "straggler/stream/channel_pool.h"
#include "straggler/stream/stream_session.h"
#include "straggler/v1/straggler.grpc.pb.h"
#include "unacked_batches.h"

namespace straggler {

namespace {

namespace pb = ::straggler::v1;
using detail::QueuedReport;

constexpr const char* kClientVersion = "0.1.0";

using stream::StreamSession;

StreamSession::Options SessionOptions(const ClientOptions& o) {
  StreamSession::Options s;
  s.name = "straggler client (job '" + o.job_id + "')";
  s.backoff = {o.backoff_initial, o.backoff_max, stream::Backoff::Jitter::kSpread};
  s.max_send_delay = o.max_send_delay;
  return s;  // log: warnings to stderr; idle_close unused (a client always wants its stream)
}

// Random per Client, never 0: a restarted trainer is a new incarnation and
// may report lower iterations again (RankDevice.incarnation, docs/runs.md).
uint64_t NewIncarnation() {
  std::mt19937_64 rng(std::random_device{}());
  uint64_t v = 0;
  while (v == 0) v = rng();
  return v;
}

class ClientImpl final : public Client, private StreamSession::Source {
 public:
  ClientImpl(ClientOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(std::move(options)),
        first_rank_(options_.ranks.front()),
        multi_rank_(options_.ranks.size() > 1),
        queue_(options_.queue_capacity),
        unacked_(queue_.capacity(), options_.max_batch),
        tracker_(options_.world_size, options_.ranks),
        incarnation_(NewIncarnation()),
        session_(stream::ChannelPool::Make(options_.endpoint, std::move(credentials),
                                           StreamSession::ChannelArgs(SessionOptions(options_)))
                     .value(),  // Validate checked the list
                 SessionOptions(options_), *this) {
    // A power of two no larger than a batch or a quarter of the queue: a
    // burst wakes the sender while there is still room.
    const size_t stride = std::bit_floor(
        std::max<size_t>(1, std::min(options_.max_batch, queue_.capacity() / 4)));
    wake_stride_mask_ = stride - 1;
    session_.Start();
  }

  ~ClientImpl() override {
    Flush(std::chrono::seconds(1));
    session_.Stop();
    // MembershipFor waiters (callers racing the destructor are a caller bug,
    // but do not leave them hanging longer than their timeout anyway).
    tracker_.WakeAll();
  }

  using Client::Report;

  bool Report(uint32_t rank, uint64_t epoch, uint64_t iteration, double compute_seconds,
              std::optional<double> step_seconds,
              std::optional<double> collective_wait_seconds) override {
    if (!Serves(rank)) return false;
    return Enqueue(rank, epoch, iteration, compute_seconds,
                   step_seconds.value_or(std::numeric_limits<double>::quiet_NaN()),
                   collective_wait_seconds.value_or(std::numeric_limits<double>::quiet_NaN()));
  }

  bool Report(uint32_t rank, uint64_t epoch, uint64_t iteration, double compute_seconds,
              const StepDetails& d) override {
    if (!Serves(rank)) return false;
    constexpr double kAbsent = std::numeric_limits<double>::quiet_NaN();
    return Enqueue(rank, epoch, iteration, compute_seconds, d.step_seconds.value_or(kAbsent),
                   d.collective_wait_seconds.value_or(kAbsent), d.work.value_or(kAbsent),
                   d.input_wait_seconds.value_or(kAbsent), d.optimizer_seconds.value_or(kAbsent));
  }

  MembershipView CurrentMembership() const override { return tracker_.Current(); }

  MembershipView MembershipFor(uint64_t iteration, std::chrono::milliseconds timeout,
                               std::optional<uint32_t> rank) override {
    if (!wake_on_report_.load(std::memory_order_relaxed))
      wake_on_report_.store(true, std::memory_order_relaxed);
    ActOnMembership();
    return tracker_.For(iteration, timeout, rank.value_or(FirstRank()), session_);
  }

  std::optional<MembershipView> ReadmissionAfter(uint64_t iteration,
                                                 std::optional<uint32_t> rank) override {
    ActOnMembership();
    return tracker_.ReadmissionAfter(iteration, rank.value_or(FirstRank()));
  }

  void OnMembershipChange(MembershipCallback callback) override {
    tracker_.OnChange(std::move(callback));
  }

  bool Flush(std::chrono::milliseconds timeout) override {
    const uint64_t target = queue_.PushedCount();
    session_.Wake();  // queued reports go now, not at the sender's next poll
    return unacked_.WaitCompleted(target, detail::ClampTimeout(timeout));
  }

  ClientStats Stats() const override {
    ClientStats s;
    s.enqueued = queue_.PushedCount();
    s.dropped = dropped_.load(std::memory_order_relaxed);
    s.report_wakes = report_wakes_.load(std::memory_order_relaxed);
    s.sent = session_.Sent();
    s.acked = acked_.load(std::memory_order_relaxed);
    s.rejected = rejected_.load(std::memory_order_relaxed);
    s.duplicates = duplicates_.load(std::memory_order_relaxed);
    s.reconnects = session_.Reconnects();
    s.connected = session_.Connected();
    s.upstream_unavailable = session_.UpstreamUnavailable();
    absl::MutexLock lock(&rejection_mu_);
    s.last_rejection = last_rejection_;
    return s;
  }

  uint32_t FirstRank() const override { return first_rank_; }

 protected:
  bool ReportForFirstRank(uint64_t epoch, uint64_t iteration, double compute_seconds) override {
    return Enqueue(first_rank_, epoch, iteration, compute_seconds,
                   std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::quiet_NaN());
  }
  bool ReportForRank(uint32_t rank, uint64_t epoch, uint64_t iteration,
                     double compute_seconds) override {
    if (!Serves(rank)) return false;
    return Enqueue(rank, epoch, iteration, compute_seconds,
                   std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::quiet_NaN());
  }

 private:
  // The usual client serves one rank: one compare, no search.
  bool Serves(uint32_t rank) const {
    return rank == first_rank_ || (multi_rank_ && tracker_.SlotOf(rank) >= 0);
  }

  // The enqueue behind both Report() forms (inlined into each).
  // NaN = absent.
  [[gnu::always_inline]] bool Enqueue(
      uint32_t rank, uint64_t epoch, uint64_t iteration, double compute_seconds,
      double step_seconds, double collective_wait_seconds,
      double work = std::numeric_limits<double>::quiet_NaN(),
      double input_wait_seconds = std::numeric_limits<double>::quiet_NaN(),
      double optimizer_seconds = std::numeric_limits<double>::quiet_NaN()) {
    const QueuedReport r{rank,
                         epoch,
                         iteration,
                         compute_seconds,
                         step_seconds,
                         collective_wait_seconds,
                         detail::CoarseUnixNanos(),
                         work,
                         input_wait_seconds,
                         optimizer_seconds};
    uint64_t position;
    if (!queue_.TryPush(r, &position)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      // The rank has reached `iteration` even though the report is lost: the
      // next hello says so (StreamHello.reported_iteration, ReportedMark()).
      // Queued reports are counted by the sender, so the training thread
      // pays for this bookkeeping only on this (rare) path.
      uint64_t seen = highest_dropped_.load(std::memory_order_relaxed);
      while (seen <= iteration &&
             !highest_dropped_.compare_exchange_weak(seen, iteration + 1,
                                                     std::memory_order_relaxed)) {
      }
      return false;
    }
    // A trainer that asks MembershipFor() each step needs this report at the
    // daemon soon: its next MembershipFor waits for the acknowledgement, and
    // waking the sender now overlaps that round trip with the rest of the
    // step (measured: mean MembershipFor wait 0.6 ms with, 1.6 ms without, in
    // straggler-sim). That costs one futex wake (~5 us) per report while the
    // sender sleeps, so a monitoring-only client (no MembershipFor yet) skips
    // it: the sender polls on a timer (max_send_delay) and Flush wakes it.
    // Every wake_stride-th report also checks, so that a burst fills batches
    // instead of the queue.
    if (wake_on_report_.load(std::memory_order_relaxed)) {
      // Pairs with the fence in StreamSession::WaitForWork(): either the
      // sender sees our item when it re-checks the queue, or we see its idle
      // flag.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (session_.SenderIdle()) WakeFromReport();
    } else if ((position & wake_stride_mask_) == wake_stride_mask_ && session_.SenderIdle()) {
      WakeFromReport();
    }
    return true;
  }

  // A monitor-only client that asks for membership acts on it from now on:
  // the daemon must hear that before it may exclude our ranks, so a later
  // hello goes out on the current stream at once (a new stream's opening
  // hello says it anyway). One load after the first call.
  void ActOnMembership() {
    if (!monitor_only_.load(std::memory_order_relaxed)) return;
    if (!monitor_only_.exchange(false)) return;
    hello_due_.store(true);
    session_.Wake();
  }

  // Out of line: Report()'s fast path keeps only the call.
  [[gnu::noinline]] void WakeFromReport() {
    report_wakes_.fetch_add(1, std::memory_order_relaxed);
    session_.Wake();
  }

  // StreamSession::Source, on the sender thread: the queue into batches.

  // A batch is due whenever reports are queued and there is room for it;
  // otherwise Report() (sometimes), Flush, MembershipFor or an
  // acknowledgement wakes the sender, or its poll timer does.
  stream::Clock::time_point ReadyAt() const override {
    return (queue_.SizeApprox() > 0 && unacked_.HasRoom()) || hello_due_.load()
               ? stream::Clock::time_point::min()
               : stream::Clock::time_point::max();
  }

  // Moves up to max_batch reports from the queue into a new unacknowledged
  // batch; a later hello that is due rides on it (or goes alone, not kept
  // for a resend: a new stream opens with a hello of its own).
  bool NextBatch(pb::ReportBatch* batch) override {
    detail::UnackedBatches::Batch b;
    if (unacked_.HasRoom()) {
      QueuedReport q;
      while (b.reports.size() < options_.max_batch && queue_.TryPop(q)) {
        highest_dequeued_ = std::max(highest_dequeued_, q.iteration + 1);
        b.reports.push_back(q);
      }
    }
    const bool hello = hello_due_.exchange(false);
    if (b.reports.empty() && !hello) return false;
    batch->Clear();
    if (b.reports.empty()) {
      batch->set_sequence(unacked_.NextSequence());
    } else {
      b.sequence = unacked_.NextSequence();
      batch->set_sequence(b.sequence);
      for (const QueuedReport& r : b.reports) detail::FillReport(r, batch->add_reports());
      unacked_.Add(std::move(b));
    }
    if (hello) FillHello(batch);
    return true;
  }

  // The hello, riding on the oldest unacknowledged batch when there is one,
  // then the other unacknowledged batches with their original sequence numbers.
  void Opening(std::vector<pb::ReportBatch>* opening) override {
    unacked_.ForEach([opening](const detail::UnackedBatches::Batch& b) {
      pb::ReportBatch& m = opening->emplace_back();
      m.set_sequence(b.sequence);
      for (const QueuedReport& r : b.reports) detail::FillReport(r, m.add_reports());
    });
    if (opening->empty()) {
      // Hello alone: its acknowledgement brings the current membership.
      opening->emplace_back().set_sequence(unacked_.NextSequence());
    }
    hello_due_.store(false);  // this hello says what a later one would
    FillHello(&opening->front());
  }

  // That our ranks finished: a clean close, not ranks gone silent.
  bool Closing(pb::ReportBatch* finished) override {
    finished->set_sequence(unacked_.NextSequence());
    for (uint32_t r : tracker_.Served()) finished->add_finished_ranks(r);
    return true;
  }

  void FillHello(pb::ReportBatch* batch) const {
    pb::StreamHello* h = batch->mutable_hello();
    h->set_job_id(options_.job_id);
    h->set_node(options_.node);
    for (uint32_t r : tracker_.Served()) h->add_ranks(r);
    h->set_world_size(options_.world_size);
    h->set_iterations_per_epoch(options_.iterations_per_epoch);
    h->set_client_version(kClientVersion);
    h->set_run_id(options_.run_id);
    if (monitor_only_.load(std::memory_order_relaxed))
      for (uint32_t r : tracker_.Served()) h->add_monitor_only_ranks(r);
    // One process, one GPU: every rank this client serves computes on it.
    for (uint32_t r : tracker_.Served()) {
      pb::RankDevice* d = h->add_devices();
      d->set_rank(r);
      d->set_local_rank(options_.local_rank);
      d->set_cuda_visible_devices(options_.cuda_visible_devices);
      d->set_gpu_uuid(options_.gpu_uuid);
      d->set_incarnation(incarnation_);
      d->set_peer_group(options_.peer_group);
      if (options_.replica) d->set_replica(*options_.replica);
      d->set_gpu_model(options_.gpu_model);
    }
    // The newest version we hold, so that a restarted daemon (which starts
    // again from version 0) publishes a version above it, effective after it,
    // instead of versions this client would ignore as already known.
    tracker_.FillKnown(h);
    // How far our ranks are: that daemon's versions take effect after it.
    if (const uint64_t mark = ReportedMark(); mark > 0) h->set_reported_iteration(mark - 1);
  }

  // Sender thread. Highest iteration passed to Report() + 1 (0: none): of
  // the reports the sender took from the queue, those still in it, and those
  // dropped because it was full.
  uint64_t ReportedMark() const {
    uint64_t mark = std::max(highest_dequeued_, highest_dropped_.load(std::memory_order_relaxed));
    queue_.ForEachQueued(
        [&mark](const QueuedReport& r) { mark = std::max(mark, r.iteration + 1); });
    return mark;
  }

  // StreamSession::Source, on the reader thread.
  void OnDirective(const pb::Directive& d) override {
    // Rejections are counted on every directive, not only on a new
    // acknowledgement: a daemon names each rejected report in exactly one
    // directive (the ack of its batch), but an agent acknowledges a batch
    // when it buffers it and relays the daemon's rejections later, under an
    // acked_sequence the client has already seen. Counted before the progress
    // below wakes MembershipFor, so a caller that saw the progress sees them.
    rejected_.fetch_add(d.rejected(), std::memory_order_relaxed);
    if (d.rejections_size() > 0) {
      absl::MutexLock lock(&rejection_mu_);
      last_rejection_ = d.rejections(d.rejections_size() - 1).message();
    }
    // The acknowledgement's counts too: Apply below wakes MembershipFor, and
    // a caller that saw the progress must see Stats().acked include it.
    if (unacked_.IsNewer(d.acked_sequence())) {
      acked_.fetch_add(d.accepted(), std::memory_order_relaxed);
      duplicates_.fetch_add(d.duplicates(), std::memory_order_relaxed);
    }
    const std::vector<const MembershipView*> announced = tracker_.Apply(d);
    // The sender may be waiting for room among the unacknowledged batches.
    if (unacked_.Ack(d.acked_sequence())) session_.Wake();
    tracker_.RunCallbacks(announced);
  }

  const ClientOptions options_;
  // Report()'s rank check without a search: options_.ranks.front() (what
  // FirstRank() returns), and whether any other rank is served.
  const uint32_t first_rank_;
  const bool multi_rank_;
  detail::BoundedQueue<QueuedReport> queue_;
  detail::UnackedBatches unacked_;
  detail::MembershipTracker tracker_;

  std::atomic<bool> wake_on_report_{false};  // set by the first MembershipFor()
  // ClientOptions::monitor_only until the first MembershipFor() or
  // ReadmissionAfter(); then a later hello is due (sender thread clears it).
  std::atomic<bool> monitor_only_{options_.monitor_only};
  std::atomic<bool> hello_due_{false};
  uint64_t wake_stride_mask_ = 0;

  // Statistics (the session keeps its own: sent, reconnects, connected).
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> report_wakes_{0};
  std::atomic<uint64_t> acked_{0};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> duplicates_{0};
  mutable absl::Mutex rejection_mu_;
  std::string last_rejection_ ABSL_GUARDED_BY(rejection_mu_);

  // Highest iteration + 1 (0: none) among the reports Report() dropped
  // (queue full), and among those the sender took from the queue (sender
  // thread only): with the queued ones, the hello's reported_iteration.
  std::atomic<uint64_t> highest_dropped_{0};
  uint64_t highest_dequeued_ = 0;
  const uint64_t incarnation_;

  // Last: its threads use everything above, and Stop() joins them in ~ClientImpl.
  StreamSession session_;
};

}  // namespace

std::unique_ptr<Client> Client::Create(const ClientOptions& options, std::string* error) {
  if (std::string problem = options.Validate(); !problem.empty()) {
    if (error != nullptr) *error = std::move(problem);
    return nullptr;
  }
  // The TLS files are read once, here: a path that cannot be read is an
  // error now rather than a channel that never connects.
  std::string problem;
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      MakeChannelCredentials(detail::SecurityOf(options), options.endpoint, &problem);
  if (!credentials) {
    if (error != nullptr) *error = std::move(problem);
    return nullptr;
  }
  ClientOptions o = options;
  if (o.node.empty()) o.node = detail::HostName();
  return std::make_unique<ClientImpl>(std::move(o), std::move(credentials));
}

}  // namespace straggler
