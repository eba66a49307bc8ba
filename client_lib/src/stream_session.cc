#include "stream_session.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <utility>

namespace straggler::detail {

namespace {

namespace pb = ::straggler::v1;

// Keepalive on the long-lived stream so a daemon that vanished without a FIN
// (host down, network partition) is noticed in well under a minute instead of
// after TCP's retransmission timeout. gRPC sends at most two pings while no
// data flows, which stays under a default server's ping-strike limit.
constexpr int kKeepaliveTimeMs = 30000;
constexpr int kKeepaliveTimeoutMs = 10000;
// After a stop request, how long the sender waits for the daemon to
// acknowledge outstanding batches after WritesDone before cancelling.
constexpr auto kCloseGrace = std::chrono::milliseconds(200);
// How long Stop() lets the sender close politely before cancelling the call
// under it (a Write blocked on flow control only returns then).
constexpr auto kStopGrace = std::chrono::milliseconds(500);

}  // namespace

std::shared_ptr<grpc::Channel> StreamSession::MakeChannel(
    const Options& options, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  // gRPC's own reconnect backoff otherwise grows to 2 minutes, which would
  // override ours: a daemon that comes back must be found within backoff_max.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(options.backoff_initial.count()));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(options.backoff_initial.count()));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(options.backoff_max.count()));
  return grpc::CreateCustomChannel(options.endpoint, std::move(credentials), args);
}

StreamSession::StreamSession(std::shared_ptr<grpc::Channel> channel, Options options,
                             Source& source)
    : options_(std::move(options)),
      source_(source),
      channel_(std::move(channel)),
      stub_(pb::IngestService::NewStub(channel_)),
      rng_(std::random_device{}()) {}

StreamSession::~StreamSession() { Stop(); }

void StreamSession::Start() { sender_ = std::thread([this] { SenderLoop(); }); }

void StreamSession::Stop() {
  if (!sender_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_.store(true, std::memory_order_seq_cst);
  }
  stop_cv_.notify_all();
  Wake();
  {
    std::unique_lock<std::mutex> lock(stop_mu_);
    if (!stop_cv_.wait_for(lock, kStopGrace, [this] { return sender_exited_; })) {
      lock.unlock();
      std::lock_guard<std::mutex> ctx_lock(ctx_mu_);
      if (ctx_ != nullptr) ctx_->TryCancel();
    }
  }
  sender_.join();
}

void StreamSession::FutexWake() {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
          0);
}

bool StreamSession::HasWork() const {
  return stop_.load() || broken_.load() || (source_.Queued() && source_.HasRoom());
}

// Sleeps until woken (MembershipFor, Flush, a burst of reports, an
// acknowledgement that frees room, a stream failure, a stop) or until the
// poll timer fires. The timer starts at 1 ms after the sender found work and
// doubles on every empty poll up to max_send_delay: a report waits at most
// that long for a sender nobody woke, and an idle client costs a few
// wake-ups per step rather than one per report.
void StreamSession::WaitForWork() {
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
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr,
          0);
  sender_idle_.store(false, std::memory_order_relaxed);
  if (source_.Queued()) {
    poll_ = kMinPoll;
  } else {
    poll_ = std::min<std::chrono::microseconds>(poll_ * 2, options_.max_send_delay);
  }
}

// First messages of a connection (Source::Opening). The daemon deduplicates
// by (rank, iteration), so a batch it processed before the failure but whose
// acknowledgement was lost is harmless to send again.
bool StreamSession::SendOpening(Stream* stream) {
  std::vector<pb::ReportBatch> opening;
  source_.Opening(&opening);
  for (const pb::ReportBatch& m : opening)
    if (!stream->Write(m)) return false;
  return true;
}

void StreamSession::SenderLoop() {
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
    std::unique_ptr<Stream> stream = stub_->Stream(&ctx);
    std::thread reader([this, s = stream.get()] { ReaderLoop(s); });

    bool ok = SendOpening(stream.get());
    pb::ReportBatch batch;
    while (ok && !stop_.load() && !broken_.load()) {
      if (source_.NextBatch(&batch)) {
        ok = stream->Write(batch);
        sent_.fetch_add(batch.reports_size(), std::memory_order_relaxed);
        continue;
      }
      WaitForWork();
    }

    if (ok && !broken_.load()) {
      // Stopping with a healthy stream: what is still queued, then the
      // closing message (a clean close: the daemon must not take the
      // silence that follows for unresponsive ranks), then half-close and
      // give the daemon a moment to acknowledge what is outstanding.
      while (ok && source_.NextBatch(&batch)) ok = stream->Write(batch);
      if (ok) {
        pb::ReportBatch closing;
        if (source_.Closing(&closing)) ok = stream->Write(closing);
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
std::chrono::milliseconds StreamSession::BackoffDelay(uint32_t attempt) {
  const int64_t initial = std::max<int64_t>(1, options_.backoff_initial.count());
  const int64_t max = std::max<int64_t>(initial, options_.backoff_max.count());
  int64_t cap = initial;
  for (uint32_t i = 0; i < attempt && cap < max; ++i) cap *= 2;
  cap = std::min(cap, max);
  std::uniform_int_distribution<int64_t> dist(initial, cap);
  return std::chrono::milliseconds(dist(rng_));
}

void StreamSession::ReaderLoop(Stream* stream) {
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
    source_.OnDirective(d);
  }
  {
    std::lock_guard<std::mutex> lock(reader_mu_);
    broken_.store(true);
  }
  reader_cv_.notify_all();
  Wake();
}

}  // namespace straggler::detail
