// straggler::Client over one gRPC bidi stream (IngestService.Stream).
//
// Threads:
//   * callers: Report() pushes into a lock-free queue; nothing else.
//   * sender (one per Client): owns the stream; connects, sends the hello,
//     drains the queue into ReportBatches, keeps unacknowledged batches for
//     resending, reconnects with backoff.
//   * reader (one per connection): reads Directives, applies acknowledgements,
//     progress and memberships, runs membership callbacks.
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <charconv>
#include <cmath>
#include <ctime>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/escaping.h"
#include "channel_security.h"
#include "membership_history.h"
#include "parse_unsigned.h"
#include "report_queue.h"
#include "straggler/client.h"
#include "straggler/v1/straggler.grpc.pb.h"
#include "straggler/v1/wire_rules.h"

namespace straggler {

namespace {

namespace pb = ::straggler::v1;
using Clock = std::chrono::steady_clock;

constexpr const char* kClientVersion = "0.1.0";
// Keepalive on the long-lived stream so a daemon that vanished without a FIN
// (host down, network partition) is noticed in well under a minute instead of
// after TCP's retransmission timeout. gRPC sends at most two pings while no
// data flows, which stays under a default server's ping-strike limit.
constexpr int kKeepaliveTimeMs = 30000;
constexpr int kKeepaliveTimeoutMs = 10000;
// After a stop request, how long the sender waits for the daemon to
// acknowledge outstanding batches after WritesDone before cancelling.
constexpr auto kCloseGrace = std::chrono::milliseconds(200);
// How long the destructor lets the sender close politely before cancelling
// the call under it (a Write blocked on flow control only returns then).
constexpr auto kStopGrace = std::chrono::milliseconds(500);
// condition_variable::wait_for adds the timeout to now(); clamp so a caller's
// milliseconds::max() means "a very long time", not an overflowed deadline.
constexpr auto kLongestWait = std::chrono::hours(24 * 365);

std::chrono::milliseconds ClampTimeout(std::chrono::milliseconds t) {
  if (t.count() < 0) return std::chrono::milliseconds(0);
  return std::min<std::chrono::milliseconds>(t, kLongestWait);
}

// What Report() stores: fixed size, trivially copyable (see BoundedQueue).
// The wall time stamped on a report only dates it (start_time = this -
// compute_seconds): CLOCK_REALTIME_COARSE (vDSO, a few ns, 1-4 ms resolution)
// instead of CLOCK_REALTIME (~30 ns here, half of Report()'s cost).
inline int64_t CoarseUnixNanos() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct QueuedReport {
  uint32_t rank;
  uint64_t epoch;
  uint64_t iteration;
  double compute_seconds;
  double step_seconds;             // NaN = absent
  double collective_wait_seconds;  // NaN = absent
  int64_t reported_unix_ns;        // wall clock when Report() was called
};

struct InFlightBatch {
  uint64_t sequence;
  std::vector<QueuedReport> reports;
};

// The daemon's exclusion reasons and the names MembershipView carries.
constexpr std::pair<pb::ExclusionReason, std::string_view> kReasonNames[] = {
    {pb::EXCLUSION_REASON_STRAGGLER, "straggler"},
    {pb::EXCLUSION_REASON_UNRESPONSIVE, "unresponsive"},
    {pb::EXCLUSION_REASON_FORCED, "forced"},
    {pb::EXCLUSION_REASON_PROBATION_END, "probation_end"},
};

std::string ReasonName(pb::ExclusionReason r) {
  for (const auto& [reason, name] : kReasonNames)
    if (reason == r) return std::string(name);
  return "unspecified";
}

pb::ExclusionReason ReasonFromName(std::string_view n) {
  for (const auto& [reason, name] : kReasonNames)
    if (name == n) return reason;
  return pb::EXCLUSION_REASON_UNSPECIFIED;
}

MembershipView ToView(const pb::Membership& m, uint32_t fallback_world_size) {
  MembershipView v;
  v.ok = true;
  v.version = m.version();
  v.effective_iteration = m.effective_iteration();
  v.incarnation = m.incarnation();
  v.world_size = m.world_size() != 0 ? m.world_size() : fallback_world_size;
  v.lead_iterations = m.lead_iterations() != 0 ? m.lead_iterations() : detail::kAssumedLeadIterations;
  v.excluded.reserve(m.excluded_size());
  for (const pb::ExcludedRank& e : m.excluded())
    v.excluded.push_back(ExcludedRankInfo{e.rank(), ReasonName(e.reason()), e.detail()});
  std::sort(v.excluded.begin(), v.excluded.end(),
            [](const ExcludedRankInfo& a, const ExcludedRankInfo& b) { return a.rank < b.rank; });
  return v;
}

void FillReport(const QueuedReport& q, pb::IterationReport* r) {
  r->set_rank(q.rank);
  r->set_epoch(q.epoch);
  r->set_iteration(q.iteration);
  r->set_compute_seconds(q.compute_seconds);
  if (!std::isnan(q.step_seconds)) r->set_step_seconds(q.step_seconds);
  if (!std::isnan(q.collective_wait_seconds))
    r->set_collective_wait_seconds(q.collective_wait_seconds);
  // The step started compute_seconds before it was reported. Garbage compute
  // times are the daemon's to reject with a reason; here they only must not
  // corrupt the timestamp.
  int64_t start_ns = q.reported_unix_ns;
  if (std::isfinite(q.compute_seconds) && q.compute_seconds > 0 && q.compute_seconds < 1e6)
    start_ns -= static_cast<int64_t>(q.compute_seconds * 1e9);
  r->mutable_start_time()->set_seconds(start_ns / 1'000'000'000);
  r->mutable_start_time()->set_nanos(static_cast<int32_t>(start_ns % 1'000'000'000));
}

using detail::ParseUnsigned;

// True when `name` is set and parses; records the first parse error.
template <typename T>
bool ReadEnvUnsigned(const char* name, T* out, std::string* error) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  if (ParseUnsigned(std::string_view(v), out)) return true;
  if (error->empty())
    *error = std::string(name) + "='" + v + "' is not an unsigned integer (max " +
             std::to_string(std::numeric_limits<T>::max()) + ")";
  return false;
}

std::string HostName() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return std::string(buf.data());
}

class ClientImpl final : public Client {
 public:
  ClientImpl(ClientOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(std::move(options)),
        served_(options_.ranks),
        first_rank_(options_.ranks.front()),
        multi_rank_(options_.ranks.size() > 1),
        queue_(options_.queue_capacity),
        max_in_flight_(std::max(queue_.capacity(), options_.max_batch)),
        history_(InitialMembership()),
        rng_(std::random_device{}()),
        incarnation_(NewIncarnation()) {
    std::sort(served_.begin(), served_.end());
    progress_.resize(served_.size());
    current_.store(history_.Newest(), std::memory_order_release);
    // A power of two no larger than a batch or a quarter of the queue: a
    // burst wakes the sender while there is still room.
    const size_t stride = std::bit_floor(
        std::max<size_t>(1, std::min(options_.max_batch, queue_.capacity() / 4)));
    wake_stride_mask_ = stride - 1;

    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
    // gRPC's own reconnect backoff otherwise grows to 2 minutes, which would
    // override ours: a daemon that comes back must be found within backoff_max.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
                static_cast<int>(options_.backoff_initial.count()));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
                static_cast<int>(options_.backoff_initial.count()));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(options_.backoff_max.count()));
    channel_ = grpc::CreateCustomChannel(options_.endpoint, credentials, args);
    stub_ = pb::IngestService::NewStub(channel_);

    sender_ = std::thread([this] { SenderLoop(); });
  }

  ~ClientImpl() override {
    Flush(std::chrono::seconds(1));
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      stop_.store(true, std::memory_order_seq_cst);
    }
    stop_cv_.notify_all();
    WakeSender();
    {
      std::unique_lock<std::mutex> lock(stop_mu_);
      if (!stop_cv_.wait_for(lock, kStopGrace, [this] { return sender_exited_; })) {
        lock.unlock();
        std::lock_guard<std::mutex> ctx_lock(ctx_mu_);
        if (ctx_ != nullptr) ctx_->TryCancel();
      }
    }
    sender_.join();
    // MembershipFor waiters (callers racing the destructor are a caller bug,
    // but do not leave them hanging longer than their timeout anyway).
    state_cv_.notify_all();
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

  MembershipView CurrentMembership() const override {
    return *current_.load(std::memory_order_acquire);
  }

  MembershipView MembershipFor(uint64_t iteration, std::chrono::milliseconds timeout,
                               std::optional<uint32_t> rank) override {
    const uint32_t who = rank.value_or(FirstRank());
    const int slot = SlotOf(who);
    if (!wake_on_report_.load(std::memory_order_relaxed))
      wake_on_report_.store(true, std::memory_order_relaxed);
    std::unique_lock<std::mutex> lock(state_mu_);
    // Only called with slot >= 0.
    auto certain = [&] { return history_.Certain(iteration, who, progress_[slot]); };
    bool ok = slot >= 0 && certain();
    if (!ok && slot >= 0) {
      // The report that makes us certain is usually still in the queue
      // (Report() does not wake the sender): send it now, not at the next poll.
      WakeSender();
      // Once a wait has timed out while the stream was down, later calls do
      // not wait again until a new connection reached the daemon: no
      // acknowledgement can arrive meanwhile, so waiting would only stall
      // every step of a job whose daemon is gone by `timeout`. This never
      // makes an answer certain that is not, so the switch rule holds; the
      // caller treats ok = false as "keep the membership you applied".
      // Behind an agent the stream stays up while the daemon is gone; the
      // agent says so (upstream_unavailable) and that counts as disconnected.
      auto unreachable = [&] { return !connected_.load() || upstream_unavailable_.load(); };
      const bool known_unreachable =
          unreachable() && gave_up_on_connection_ == connections_.load();
      if (!known_unreachable) {
        ok = state_cv_.wait_for(lock, ClampTimeout(timeout),
                                [&] { return certain() || stop_.load(); });
        if (ok && stop_.load()) ok = certain();
        if (!ok && unreachable()) gave_up_on_connection_ = connections_.load();
      }
    }
    MembershipView v = history_.InForce(iteration);
    v.ok = ok;
    return v;
  }

  std::optional<MembershipView> ReadmissionAfter(uint64_t iteration,
                                                 std::optional<uint32_t> rank) override {
    std::lock_guard<std::mutex> lock(state_mu_);
    return history_.ReadmissionAfter(iteration, rank.value_or(FirstRank()));
  }

  void OnMembershipChange(MembershipCallback callback) override {
    if (!callback) return;
    std::lock_guard<std::mutex> lock(callbacks_mu_);
    callbacks_.push_back(std::make_shared<MembershipCallback>(std::move(callback)));
  }

  bool Flush(std::chrono::milliseconds timeout) override {
    const uint64_t target = queue_.PushedCount();
    WakeSender();  // queued reports go now, not at the sender's next poll
    std::unique_lock<std::mutex> lock(flight_mu_);
    return flush_cv_.wait_for(lock, ClampTimeout(timeout), [&] { return completed_ >= target; });
  }

  ClientStats Stats() const override {
    ClientStats s;
    s.enqueued = queue_.PushedCount();
    s.dropped = dropped_.load(std::memory_order_relaxed);
    s.report_wakes = report_wakes_.load(std::memory_order_relaxed);
    s.sent = sent_.load(std::memory_order_relaxed);
    s.acked = acked_.load(std::memory_order_relaxed);
    s.rejected = rejected_.load(std::memory_order_relaxed);
    s.duplicates = duplicates_.load(std::memory_order_relaxed);
    s.reconnects = reconnects_.load(std::memory_order_relaxed);
    s.connected = connected_.load(std::memory_order_relaxed);
    s.upstream_unavailable = upstream_unavailable_.load(std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(rejection_mu_);
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
  bool Serves(uint32_t rank) const { return rank == first_rank_ || (multi_rank_ && SlotOf(rank) >= 0); }

  // The enqueue behind both Report() forms (inlined into each).
  [[gnu::always_inline]] bool Enqueue(uint32_t rank, uint64_t epoch, uint64_t iteration,
                                      double compute_seconds, double step_seconds,
                                      double collective_wait_seconds) {
    const QueuedReport r{rank,         epoch,
                         iteration,    compute_seconds,
                         step_seconds, collective_wait_seconds,
                         CoarseUnixNanos()};
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
      // Pairs with the fence in WaitForWork(): either the sender sees our
      // item when it re-checks the queue, or we see its idle flag.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (sender_idle_.load(std::memory_order_relaxed)) WakeFromReport();
    } else if ((position & wake_stride_mask_) == wake_stride_mask_ &&
               sender_idle_.load(std::memory_order_relaxed)) {
      WakeFromReport();
    }
    return true;
  }

  MembershipView InitialMembership() const {
    MembershipView v;
    v.version = 0;
    v.effective_iteration = 0;
    v.world_size = options_.world_size;
    v.lead_iterations = detail::kAssumedLeadIterations;
    return v;
  }

  // Index of `rank` among the served ranks, -1 when not served. The array is
  // fixed after construction: a binary search over a few entries, no locks.
  int SlotOf(uint32_t rank) const {
    auto it = std::lower_bound(served_.begin(), served_.end(), rank);
    if (it == served_.end() || *it != rank) return -1;
    return static_cast<int>(it - served_.begin());
  }

  // wake_ is waited on and woken with raw futex calls, not
  // std::atomic::wait/notify: libstdc++ has no timed atomic wait, and its
  // notify skips the system call unless its own wait registered a waiter.
  void WakeSender() {
    wake_.fetch_add(1, std::memory_order_release);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_), FUTEX_WAKE_PRIVATE, 1, nullptr,
            nullptr, 0);
  }
  // Out of line: Report()'s fast path keeps only the call.
  [[gnu::noinline]] void WakeFromReport() {
    report_wakes_.fetch_add(1, std::memory_order_relaxed);
    WakeSender();
  }

  // Room for one more batch among the unacknowledged ones.
  bool InFlightHasRoom() {
    std::lock_guard<std::mutex> lock(flight_mu_);
    return in_flight_reports_ + options_.max_batch <= max_in_flight_ || in_flight_.empty();
  }

  bool HasWork() {
    return stop_.load() || broken_.load() || (queue_.SizeApprox() > 0 && InFlightHasRoom());
  }

  // Sleeps until woken (MembershipFor, Flush, a burst of reports, an
  // acknowledgement that frees room, a stream failure, a stop) or until the
  // poll timer fires. The timer starts at 1 ms after the sender found work and
  // doubles on every empty poll up to max_send_delay: a report waits at most
  // that long for a sender nobody woke, and an idle client costs a few
  // wake-ups per step rather than one per report.
  void WaitForWork() {
    const uint32_t seen = wake_.load(std::memory_order_acquire);
    sender_idle_.store(true, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (HasWork()) {
      sender_idle_.store(false, std::memory_order_relaxed);
      poll_ = kMinPoll;
      return;
    }
    const auto poll = std::min<std::chrono::microseconds>(poll_, options_.max_send_delay);
    timespec ts{static_cast<time_t>(poll.count() / 1000000),
                static_cast<long>(poll.count() % 1000000) * 1000};
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_), FUTEX_WAIT_PRIVATE, seen, &ts,
            nullptr, 0);
    sender_idle_.store(false, std::memory_order_relaxed);
    if (queue_.SizeApprox() > 0) {
      poll_ = kMinPoll;
    } else {
      poll_ = std::min<std::chrono::microseconds>(poll_ * 2, options_.max_send_delay);
    }
  }

  // Moves up to max_batch reports from the queue into a new in-flight batch.
  bool TakeBatch(pb::ReportBatch* batch) {
    if (!InFlightHasRoom()) return false;
    InFlightBatch b;
    QueuedReport q;
    while (b.reports.size() < options_.max_batch && queue_.TryPop(q)) {
      highest_dequeued_ = std::max(highest_dequeued_, q.iteration + 1);
      b.reports.push_back(q);
    }
    if (b.reports.empty()) return false;
    b.sequence = next_sequence_++;
    batch->Clear();
    batch->set_sequence(b.sequence);
    for (const QueuedReport& r : b.reports) FillReport(r, batch->add_reports());
    std::lock_guard<std::mutex> lock(flight_mu_);
    in_flight_reports_ += b.reports.size();
    in_flight_.push_back(std::move(b));
    return true;
  }

  void FillHello(pb::ReportBatch* batch) const {
    pb::StreamHello* h = batch->mutable_hello();
    h->set_job_id(options_.job_id);
    h->set_node(options_.node);
    for (uint32_t r : served_) h->add_ranks(r);
    h->set_world_size(options_.world_size);
    h->set_iterations_per_epoch(options_.iterations_per_epoch);
    h->set_client_version(kClientVersion);
    h->set_run_id(options_.run_id);
    // One process, one GPU: every rank this client serves computes on it.
    for (uint32_t r : served_) {
      pb::RankDevice* d = h->add_devices();
      d->set_rank(r);
      d->set_local_rank(options_.local_rank);
      d->set_cuda_visible_devices(options_.cuda_visible_devices);
      d->set_gpu_uuid(options_.gpu_uuid);
      d->set_incarnation(incarnation_);
    }
    // The newest version we hold, so that a restarted daemon (which starts
    // again from version 0) publishes a version above it, effective after it,
    // instead of versions this client would ignore as already known.
    // current_ is history_.Newest(); snapshots live as long as the history.
    if (const MembershipView* newest = current_.load(std::memory_order_acquire);
        newest != nullptr && newest->version > 0) {
      h->set_known_membership_version(newest->version);
      h->set_known_effective_iteration(newest->effective_iteration);
      h->set_known_incarnation(newest->incarnation);
      // Its excluded ranks: a daemon restarted without its state database
      // republishes them rather than "everyone", so ranks that take up its
      // first version at different iterations still agree on who takes part.
      for (const ExcludedRankInfo& e : newest->excluded) {
        pb::ExcludedRank* x = h->add_known_excluded();
        x->set_rank(e.rank);
        x->set_reason(ReasonFromName(e.reason));
        x->set_detail(e.detail);
      }
    }
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

  // First messages of a connection: the hello, riding on the oldest
  // unacknowledged batch when there is one, then the other unacknowledged
  // batches with their original sequence numbers. The daemon deduplicates by
  // (rank, iteration), so a batch it processed before the failure but whose
  // acknowledgement was lost is harmless to send again.
  bool SendOpening(grpc::ClientReaderWriter<pb::ReportBatch, pb::Directive>* stream) {
    std::vector<pb::ReportBatch> opening;
    {
      std::lock_guard<std::mutex> lock(flight_mu_);
      for (const InFlightBatch& b : in_flight_) {
        pb::ReportBatch& m = opening.emplace_back();
        m.set_sequence(b.sequence);
        for (const QueuedReport& r : b.reports) FillReport(r, m.add_reports());
      }
    }
    if (opening.empty()) {
      // Hello alone: its acknowledgement brings the current membership.
      opening.emplace_back().set_sequence(next_sequence_++);
    }
    FillHello(&opening.front());
    for (const pb::ReportBatch& m : opening)
      if (!stream->Write(m)) return false;
    return true;
  }

  void SenderLoop() {
    uint32_t attempt = 0;
    while (!stop_.load()) {
      grpc::ClientContext ctx;
      {
        std::lock_guard<std::mutex> lock(ctx_mu_);
        if (stop_.load()) break;
        ctx_ = &ctx;
      }
      broken_.store(false);
      got_directive_.store(false);
      std::unique_ptr<grpc::ClientReaderWriter<pb::ReportBatch, pb::Directive>> stream =
          stub_->Stream(&ctx);
      std::thread reader([this, s = stream.get()] { ReaderLoop(s); });

      bool ok = SendOpening(stream.get());
      pb::ReportBatch batch;
      while (ok && !stop_.load() && !broken_.load()) {
        if (TakeBatch(&batch)) {
          ok = stream->Write(batch);
          sent_.fetch_add(batch.reports_size(), std::memory_order_relaxed);
          continue;
        }
        WaitForWork();
      }

      if (ok && !broken_.load()) {
        // Stopping with a healthy stream: what is still queued, then that
        // our ranks finished (a clean close: the daemon must not take the
        // silence that follows for unresponsive ranks), then half-close and
        // give the daemon a moment to acknowledge what is outstanding.
        while (ok && TakeBatch(&batch)) ok = stream->Write(batch);
        if (ok) {
          pb::ReportBatch finished;
          finished.set_sequence(next_sequence_++);
          for (uint32_t r : served_) finished.add_finished_ranks(r);
          ok = stream->Write(finished);
        }
        stream->WritesDone();
        std::unique_lock<std::mutex> lock(reader_mu_);
        reader_cv_.wait_for(lock, kCloseGrace, [this] { return broken_.load(); });
      } else if (!ok && !broken_.load()) {
        // A failed Write means the call is over; the reader's Read ends with
        // it. Wait briefly so Finish() reports the daemon's status, not ours.
        std::unique_lock<std::mutex> lock(reader_mu_);
        reader_cv_.wait_for(lock, kCloseGrace, [this] { return broken_.load(); });
      }
      const bool reader_done = broken_.load();
      if (!reader_done) ctx.TryCancel();
      reader.join();
      const grpc::Status status = stream->Finish();
      {
        std::lock_guard<std::mutex> lock(ctx_mu_);
        ctx_ = nullptr;
      }
      const bool was_connected = got_directive_.load();
      connected_.store(false);
      upstream_unavailable_.store(false);  // known again from the next stream
      if (stop_.load()) break;

      std::chrono::milliseconds delay;
      if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
        // The daemon refused our hello: retrying fast cannot fix options.
        if (status.error_message() != last_logged_error_) {
          last_logged_error_ = status.error_message();
          std::fprintf(stderr, "straggler client: daemon at %s rejected job '%s': %s\n",
                       options_.endpoint.c_str(), options_.job_id.c_str(),
                       status.error_message().c_str());
        }
        delay = options_.backoff_max;
      } else {
        if (was_connected) {
          attempt = 0;
          outage_logged_ = false;
        }
        if (!outage_logged_) {
          outage_logged_ = true;
          std::fprintf(stderr,
                       "straggler client: %s stragglerd at %s (%s); retrying in the background, "
                       "training is not affected\n",
                       was_connected ? "lost the stream to" : "cannot reach",
                       options_.endpoint.c_str(), status.error_message().c_str());
        }
        delay = BackoffDelay(attempt++);
      }
      {
        std::unique_lock<std::mutex> lock(stop_mu_);
        if (stop_cv_.wait_for(lock, delay, [this] { return stop_.load(); })) break;
      }
      reconnects_.fetch_add(1, std::memory_order_relaxed);
    }
    std::lock_guard<std::mutex> lock(stop_mu_);
    sender_exited_ = true;
    stop_cv_.notify_all();
  }

  // Exponential backoff with jitter: uniform in [initial, min(max, initial *
  // 2^attempt)]. The floor keeps a flapping daemon from being hammered; the
  // spread keeps the ranks of a large job from reconnecting in lock-step.
  std::chrono::milliseconds BackoffDelay(uint32_t attempt) {
    const int64_t initial = std::max<int64_t>(1, options_.backoff_initial.count());
    const int64_t max = std::max<int64_t>(initial, options_.backoff_max.count());
    int64_t cap = initial;
    for (uint32_t i = 0; i < attempt && cap < max; ++i) cap *= 2;
    cap = std::min(cap, max);
    std::uniform_int_distribution<int64_t> dist(initial, cap);
    return std::chrono::milliseconds(dist(rng_));
  }

  void ReaderLoop(grpc::ClientReaderWriter<pb::ReportBatch, pb::Directive>* stream) {
    pb::Directive d;
    while (stream->Read(&d)) {
      if (!got_directive_.exchange(true)) {
        // A daemon never sets the field; an agent sets it in its first
        // directive, so a new stream starts from what this one says.
        upstream_unavailable_.store(d.has_upstream_unavailable() && d.upstream_unavailable());
        connections_.fetch_add(1);
        connected_.store(true);
      } else if (d.has_upstream_unavailable()) {
        const bool down = d.upstream_unavailable();
        // The agent's stream reached the daemon again: like a new connection
        // for MembershipFor's once-per-outage rule.
        if (upstream_unavailable_.exchange(down) && !down) connections_.fetch_add(1);
      }
      HandleDirective(d);
    }
    {
      std::lock_guard<std::mutex> lock(reader_mu_);
      broken_.store(true);
    }
    reader_cv_.notify_all();
    WakeSender();
  }

  void HandleDirective(const pb::Directive& d) {
    // Rejections are counted on every directive, not only on a new
    // acknowledgement: a daemon names each rejected report in exactly one
    // directive (the ack of its batch), but an agent acknowledges a batch
    // when it buffers it and relays the daemon's rejections later, under an
    // acked_sequence the client has already seen. Counted before the progress
    // below wakes MembershipFor, so a caller that saw the progress sees them.
    rejected_.fetch_add(d.rejected(), std::memory_order_relaxed);
    if (d.rejections_size() > 0) {
      std::lock_guard<std::mutex> lock(rejection_mu_);
      last_rejection_ = d.rejections(d.rejections_size() - 1).message();
    }
    // Memberships first: a MembershipFor waiter woken by the progress below
    // must already see every version this directive carries.
    std::vector<const MembershipView*> announced;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      for (const pb::Membership& m : d.memberships())
        if (const MembershipView* v = history_.Add(ToView(m, options_.world_size)))
          announced.push_back(v);
      current_.store(history_.Newest(), std::memory_order_release);
      for (const pb::RankProgress& p : d.progress()) {
        const int slot = SlotOf(p.rank());
        if (slot < 0) continue;
        std::optional<uint64_t>& mine = progress_[slot];
        if (!mine || *mine < p.iteration()) mine = p.iteration();
      }
    }
    state_cv_.notify_all();

    if (d.acked_sequence() > last_acked_sequence_) {
      last_acked_sequence_ = d.acked_sequence();
      acked_.fetch_add(d.accepted(), std::memory_order_relaxed);
      duplicates_.fetch_add(d.duplicates(), std::memory_order_relaxed);
      bool freed = false;
      {
        std::lock_guard<std::mutex> lock(flight_mu_);
        while (!in_flight_.empty() && in_flight_.front().sequence <= d.acked_sequence()) {
          completed_ += in_flight_.front().reports.size();
          in_flight_reports_ -= in_flight_.front().reports.size();
          in_flight_.pop_front();
          freed = true;
        }
      }
      if (freed) {
        flush_cv_.notify_all();
        WakeSender();  // it may be waiting for room among the in-flight batches
      }
    }

    if (announced.empty()) return;
    std::vector<std::shared_ptr<MembershipCallback>> callbacks;
    {
      std::lock_guard<std::mutex> lock(callbacks_mu_);
      callbacks = callbacks_;
    }
    for (const MembershipView* v : announced) {
      for (const auto& cb : callbacks) {
        try {
          (*cb)(*v);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "straggler client: membership callback threw: %s\n", e.what());
        } catch (...) {
          std::fprintf(stderr, "straggler client: membership callback threw\n");
        }
      }
    }
  }

  const ClientOptions options_;
  std::vector<uint32_t> served_;  // sorted; fixed after construction
  // Report()'s rank check without a search: options_.ranks.front() (what
  // FirstRank() returns), and whether any other rank is served.
  const uint32_t first_rank_;
  const bool multi_rank_;
  detail::BoundedQueue<QueuedReport> queue_;
  const size_t max_in_flight_;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::IngestService::Stub> stub_;

  // Sender wake-up (see WaitForWork). poll_ is the sender's alone.
  static constexpr std::chrono::microseconds kMinPoll{1000};
  std::atomic<bool> sender_idle_{false};
  std::atomic<bool> wake_on_report_{false};  // set by the first MembershipFor()
  std::atomic<uint32_t> wake_{0};
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  std::chrono::microseconds poll_{kMinPoll};
  uint64_t wake_stride_mask_ = 0;

  // Statistics.
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> report_wakes_{0};
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> acked_{0};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> duplicates_{0};
  std::atomic<uint64_t> reconnects_{0};
  std::atomic<bool> connected_{false};
  mutable std::mutex rejection_mu_;
  std::string last_rejection_;

  // Unacknowledged batches, oldest first (sender appends, reader pops).
  std::mutex flight_mu_;
  std::condition_variable flush_cv_;
  std::deque<InFlightBatch> in_flight_;
  size_t in_flight_reports_ = 0;
  uint64_t completed_ = 0;  // reports in acknowledged batches

  // Membership history and per-rank progress (reader writes, MembershipFor
  // waits). current_ is the lock-free view of history_.Newest().
  std::mutex state_mu_;
  std::condition_variable state_cv_;
  detail::MembershipHistory history_;
  std::vector<std::optional<uint64_t>> progress_;  // by slot of served_
  std::atomic<const MembershipView*> current_{nullptr};
  // Connections that reached the daemon so far, and the count at which a
  // MembershipFor wait last timed out while disconnected (guarded by state_mu_).
  // Reset per connection from its first directive; written by the reader.
  std::atomic<bool> upstream_unavailable_{false};
  // Highest iteration + 1 (0: none) among the reports Report() dropped
  // (queue full), and among those the sender took from the queue (sender
  // thread only): with the queued ones, the hello's reported_iteration.
  std::atomic<uint64_t> highest_dropped_{0};
  uint64_t highest_dequeued_ = 0;
  std::atomic<uint64_t> connections_{0};
  std::optional<uint64_t> gave_up_on_connection_;

  std::mutex callbacks_mu_;
  std::vector<std::shared_ptr<MembershipCallback>> callbacks_;

  // Connection state. ctx_ is the live call's context so the destructor can
  // cancel a sender blocked inside gRPC.
  std::mutex ctx_mu_;
  grpc::ClientContext* ctx_ = nullptr;
  std::mutex reader_mu_;
  std::condition_variable reader_cv_;
  std::atomic<bool> broken_{false};         // this connection's reader has ended
  std::atomic<bool> got_directive_{false};  // this connection reached the daemon

  // Sender-thread-only state.
  uint64_t next_sequence_ = 1;  // 0 means "nothing acknowledged"
  std::string last_logged_error_;
  bool outage_logged_ = false;  // one line per outage, not per retry
  std::mt19937_64 rng_;
  // Random per Client, never 0: a restarted trainer is a new incarnation and
  // may report lower iterations again (RankDevice.incarnation, docs/runs.md).
  // Declared after rng_, which initializes it.
  const uint64_t incarnation_;
  uint64_t NewIncarnation() {
    uint64_t v = 0;
    while (v == 0) v = rng_();
    return v;
  }
  // Reader-thread-only (one reader at a time; joined before the next starts).
  uint64_t last_acked_sequence_ = 0;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::atomic<bool> stop_{false};
  bool sender_exited_ = false;
  std::thread sender_;
};

}  // namespace

bool MembershipView::IsExcluded(uint32_t rank) const {
  return std::binary_search(
      excluded.begin(), excluded.end(), ExcludedRankInfo{rank, {}, {}},
      [](const ExcludedRankInfo& a, const ExcludedRankInfo& b) { return a.rank < b.rank; });
}

std::vector<uint32_t> MembershipView::ActiveRanks() const {
  std::vector<uint32_t> active;
  active.reserve(world_size);
  for (uint32_t r = 0; r < world_size; ++r)
    if (!IsExcluded(r)) active.push_back(r);
  return active;
}

namespace {

ChannelSecurity SecurityOf(const ClientOptions& o) {
  return ChannelSecurity{o.tls_ca_file, o.tls_cert_file, o.tls_key_file};
}

}  // namespace

static std::string RunIdFromEnv() {
  // torchrun sets TORCHELASTIC_RUN_ID to the literal "none" without
  // --rdzv_id or --standalone: that names no launch.
  for (const char* name : {"STRAGGLER_RUN_ID", "TORCHELASTIC_RUN_ID"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0' && std::string_view(v) != "none") return v;
  }
  return {};
}

ClientOptions ClientOptions::FromEnv() {
  ClientOptions o;
  std::string error;
  if (const char* v = std::getenv("STRAGGLER_ENDPOINT"); v != nullptr && *v != '\0') o.endpoint = v;
  if (const char* v = std::getenv("STRAGGLER_JOB_ID"); v != nullptr) o.job_id = v;
  if (const char* v = std::getenv("STRAGGLER_NODE"); v != nullptr) o.node = v;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr) o.cuda_visible_devices = v;
  if (const char* v = std::getenv("STRAGGLER_GPU_UUID"); v != nullptr) o.gpu_uuid = v;
  o.run_id = RunIdFromEnv();
  const ChannelSecurity tls = ChannelSecurityFromEnv();
  o.tls_ca_file = tls.ca_file;
  o.tls_cert_file = tls.cert_file;
  o.tls_key_file = tls.key_file;
  uint32_t rank = 0;
  if (ReadEnvUnsigned("RANK", &rank, &error)) o.ranks = {rank};
  ReadEnvUnsigned("WORLD_SIZE", &o.world_size, &error);
  ReadEnvUnsigned("LOCAL_RANK", &o.local_rank, &error);
  ReadEnvUnsigned("STRAGGLER_ITERATIONS_PER_EPOCH", &o.iterations_per_epoch, &error);
  o.env_error = std::move(error);
  return o;
}

std::string ClientOptions::Validate() const {
  if (!env_error.empty()) return env_error;
  if (endpoint.empty()) return "endpoint is empty (set STRAGGLER_ENDPOINT)";
  if (job_id.empty()) return "job_id is empty (set STRAGGLER_JOB_ID)";
  // The daemon's rule (straggler/v1/wire_rules.h): refused here, once, rather
  // than by the daemon on every reconnect.
  if (job_id.size() > pb::rules::kMaxJobIdBytes)
    return "job_id '" + absl::CHexEscape(job_id.substr(0, 32)) + "...' is " +
           std::to_string(job_id.size()) + " bytes; at most " +
           std::to_string(pb::rules::kMaxJobIdBytes);
  if (const size_t i = pb::rules::FirstBadJobIdByte(job_id); i != std::string_view::npos)
    return "job_id '" + absl::CHexEscape(job_id) + "' has '" +
           absl::CHexEscape(job_id.substr(i, 1)) + "' at byte " + std::to_string(i) +
           "; allowed: " + std::string(pb::rules::kJobIdAllowed);
  if (run_id.size() > pb::rules::kMaxJobIdBytes)
    return "run_id is " + std::to_string(run_id.size()) + " bytes; at most " +
           std::to_string(pb::rules::kMaxJobIdBytes);
  if (const size_t i = pb::rules::FirstBadJobIdByte(run_id);
      !run_id.empty() && i != std::string_view::npos)
    return "run_id '" + absl::CHexEscape(run_id) + "' has '" +
           absl::CHexEscape(run_id.substr(i, 1)) + "' at byte " + std::to_string(i) +
           "; allowed: " + std::string(pb::rules::kJobIdAllowed);
  if (std::string problem = SecurityOf(*this).Validate(); !problem.empty()) return problem;
  if (world_size == 0) return "world_size=0: must be > 0 (set WORLD_SIZE)";
  if (ranks.empty()) return "ranks is empty: name at least one rank (set RANK)";
  std::vector<uint32_t> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] >= world_size)
      return "rank " + std::to_string(sorted[i]) + " >= world_size=" + std::to_string(world_size);
    if (i > 0 && sorted[i] == sorted[i - 1])
      return "rank " + std::to_string(sorted[i]) + " listed twice";
  }
  if (queue_capacity == 0 || queue_capacity > detail::BoundedQueue<int>::kMaxCapacity)
    return "queue_capacity=" + std::to_string(queue_capacity) + ": must be in [1, " +
           std::to_string(detail::BoundedQueue<int>::kMaxCapacity) + "]";
  if (max_batch == 0) return "max_batch=0: must be > 0";
  if (backoff_initial.count() <= 0)
    return "backoff_initial=" + std::to_string(backoff_initial.count()) + "ms: must be > 0";
  if (backoff_max < backoff_initial)
    return "backoff_max=" + std::to_string(backoff_max.count()) + "ms < backoff_initial=" +
           std::to_string(backoff_initial.count()) + "ms";
  if (backoff_max.count() > std::numeric_limits<int>::max())
    return "backoff_max=" + std::to_string(backoff_max.count()) + "ms is too large";
  if (max_send_delay.count() < 1 || max_send_delay > std::chrono::hours(1))
    return "max_send_delay=" + std::to_string(max_send_delay.count()) +
           "ms: must be between 1 ms and 1 h";
  return {};
}

std::unique_ptr<Client> Client::Create(const ClientOptions& options, std::string* error) {
  if (std::string problem = options.Validate(); !problem.empty()) {
    if (error != nullptr) *error = std::move(problem);
    return nullptr;
  }
  // The TLS files are read once, here: a path that cannot be read is an
  // error now rather than a channel that never connects.
  std::string problem;
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      MakeChannelCredentials(SecurityOf(options), options.endpoint, &problem);
  if (!credentials) {
    if (error != nullptr) *error = std::move(problem);
    return nullptr;
  }
  ClientOptions o = options;
  if (o.node.empty()) o.node = HostName();
  return std::make_unique<ClientImpl>(std::move(o), std::move(credentials));
}

}  // namespace straggler
