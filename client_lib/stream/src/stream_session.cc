// StreamSession: see straggler/stream/stream_session.h.
#include "straggler/stream/stream_session.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace straggler::stream {

namespace {

namespace pb = ::straggler::v1;

// Keepalive on the long-lived stream so a daemon that vanished without a FIN
// (host down, network partition) is noticed in well under a minute instead of
// after TCP's retransmission timeout. gRPC sends at most two pings while no
// data flows, which stays under a default server's ping-strike limit.
constexpr int kKeepaliveTimeMs = 30000;
constexpr int kKeepaliveTimeoutMs = 10000;
// A futex wait longer than this is cut short (the caller re-checks).
constexpr auto kLongestSleep = std::chrono::hours(1);
// How often a reconnect wait looks whether the channel is READY again.
constexpr auto kChannelPoll = std::chrono::milliseconds(50);

bool IsSet(std::atomic<bool>* flag) { return flag->load(); }

}  // namespace

grpc::ChannelArguments StreamSession::ChannelArgs(const Options& options) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  BoundReconnectBackoff(options.backoff, args);
  // And no connect attempt waits past `initial` (issue 28's setting): the
  // session retries on its own backoff anyway.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(options.backoff.initial.count()));
  return args;
}

StreamSession::StreamSession(std::shared_ptr<ChannelPool> pool, Options options, Source& source)
    : options_(std::move(options)),
      source_(source),
      pool_(std::move(pool)),
      cursor_(pool_->addresses()),
      backoff_(options_.backoff),
      rng_(std::random_device{}()) {
  SwitchTo(cursor_.current());  // a random first address (routing.h)
}

std::string StreamSession::Address() const {
  absl::MutexLock lock(&address_mu_);
  return address_;
}

void StreamSession::SwitchTo(const std::string& address) {
  {
    absl::MutexLock lock(&address_mu_);
    if (address == address_ && channel_) return;
    address_ = address;
  }
  channel_ = pool_->Get(address);
  stub_ = pb::IngestService::NewStub(channel_);
}

bool StreamSession::ChooseNext(grpc::ClientContext& ctx, bool was_connected) {
  if (was_connected) redirect_run_.Reset();
  const std::string owner = RedirectOwner(ctx);
  const std::string current = Address();
  if (!owner.empty() && owner != current) {
    // RedirectRun's rule (the owner may be in no list).
    const bool at_once = redirect_run_.FollowAtOnce();
    redirects_.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kInfo, absl::StrCat(current, " redirected the stream to the job's owner ",
                                      owner, at_once ? "" : " (after the backoff)"));
    cursor_.MoveTo(owner);
    SwitchTo(owner);
    return at_once;
  }
  // Any other end: the next address of the list, the one after the list
  // address used last (from a redirect's owner too: the replica that
  // redirected there may name that owner again), after the backoff. The
  // backoff bounds this loop, so the next redirect is followed at once
  // again: "in a row" counts redirects with no other end between them.
  redirect_run_.Reset();
  cursor_.Next();
  SwitchTo(cursor_.current());
  return false;
}

StreamSession::~StreamSession() { Join(); }

void StreamSession::Start() { sender_ = std::thread([this] { SenderLoop(); }); }

void StreamSession::Stop(Clock::time_point deadline) {
  {
    absl::MutexLock lock(&stop_mu_);
    const Clock::time_point now = Clock::now();
    if (!stop_.load()) cancel_at_ = now + kStopGrace;
    deadline_ = std::min(deadline_, deadline);
    cancel_at_ = std::max(deadline_, cancel_at_);
    stop_.store(true, std::memory_order_seq_cst);
  }
  Wake();
}

void StreamSession::Join() {
  if (!sender_.joinable()) return;
  if (!stop_.load()) Stop(Clock::now());
  bool exited;
  {
    absl::MutexLock lock(&stop_mu_);
    const auto left = std::max<Clock::duration>(cancel_at_ - Clock::now(), Clock::duration::zero());
    exited = stop_mu_.AwaitWithTimeout(absl::Condition(&sender_exited_), absl::FromChrono(left));
  }
  if (!exited) {
    absl::MutexLock lock(&ctx_mu_);
    cancelled_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  sender_.join();
}

void StreamSession::SetBackoff(Backoff backoff) {
  absl::MutexLock lock(&backoff_mu_);
  backoff_ = backoff;
}

void StreamSession::FutexWake() {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
          0);
}

void StreamSession::SleepUntil(uint32_t seen, Clock::time_point until) {
  const Clock::time_point now = Clock::now();
  if (until <= now) return;
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
      std::min<Clock::duration>(until - now, kLongestSleep));
  timespec ts{static_cast<time_t>(left.count() / 1000000),
              static_cast<long>(left.count() % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr,
          0);
}

Clock::time_point StreamSession::StopDeadline() const {
  absl::MutexLock lock(&stop_mu_);
  return deadline_;
}

bool StreamSession::StopDue() {
  if (!stop_.load()) return false;
  return Clock::now() >= StopDeadline() || source_.Drained();
}

// Sleeps until woken (the source has work: a report for a trainer that
// waits in MembershipFor, a Flush, an acknowledgement that frees room; a
// stream failure; a stop), until the Source's ready time, until `wake_at`,
// or until the poll timer fires. The timer starts at 1 ms after the sender
// found work and doubles on every empty poll up to max_send_delay: a report
// waits at most that long for a sender nobody woke, and an idle client costs
// a few wake-ups per step rather than one per report.
void StreamSession::WaitForWork(Clock::time_point wake_at) {
  const uint32_t seen = wake_.load(std::memory_order_acquire);
  const bool stopping = stop_.load();
  sender_idle_.store(true, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const Clock::time_point ready = source_.ReadyAt();
  const Clock::time_point now = Clock::now();
  if (broken_.load() || stopping != stop_.load() || ready <= now) {
    sender_idle_.store(false, std::memory_order_relaxed);
    poll_ = kMinPoll;
    return;
  }
  Clock::time_point until = std::min(ready, wake_at);
  if (options_.max_send_delay.count() > 0) {
    until = std::min<Clock::time_point>(
        until, now + std::min<std::chrono::microseconds>(poll_, options_.max_send_delay));
  }
  SleepUntil(seen, until);
  sender_idle_.store(false, std::memory_order_relaxed);
  if (source_.ReadyAt() <= Clock::now()) {
    poll_ = kMinPoll;
  } else {
    poll_ = std::min<std::chrono::microseconds>(poll_ * 2, options_.max_send_delay);
  }
}

void StreamSession::WaitForReader(std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&reader_mu_);
  reader_mu_.AwaitWithTimeout(absl::Condition(&IsSet, &broken_), absl::FromChrono(timeout));
}

// The first messages of a connection come from Source::Opening. The daemon
// deduplicates by (rank, iteration), so a batch it processed before a
// failure whose acknowledgement was lost is harmless to send again.
StreamSession::Ending StreamSession::Converse(Stream* stream) {
  std::vector<pb::ReportBatch> opening;
  source_.Opening(&opening);
  for (const pb::ReportBatch& m : opening)
    if (!stream->Write(m)) return Ending::kWriteFailed;

  pb::ReportBatch batch;
  bool closing_written = false;
  Clock::time_point quiet_since{};  // the source wants no stream since; {}: it does
  for (;;) {
    if (broken_.load()) return Ending::kBroken;
    if (source_.NextBatch(&batch)) {
      sent_.fetch_add(batch.reports_size(), std::memory_order_relaxed);
      if (!stream->Write(batch)) return Ending::kWriteFailed;
      continue;
    }
    Clock::time_point wake_at = Clock::time_point::max();
    if (stop_.load()) {
      // Stopping on a healthy stream: after what was due, the closing message
      // (a clean close: the daemon must not take the silence that follows for
      // unresponsive ranks), then what is outstanding is acknowledged.
      if (!closing_written) {
        closing_written = true;
        pb::ReportBatch closing;
        if (source_.Closing(&closing) && !stream->Write(closing)) return Ending::kWriteFailed;
        continue;
      }
      if (source_.Drained()) return Ending::kStopped;
      wake_at = StopDeadline();
      if (Clock::now() >= wake_at) return Ending::kDeadline;
    } else if (!source_.WantsStream()) {
      const Clock::time_point now = Clock::now();
      if (quiet_since == Clock::time_point{}) quiet_since = now;
      wake_at = quiet_since + options_.idle_close;
      if (now >= wake_at) return Ending::kIdle;
    } else {
      quiet_since = {};
    }
    WaitForWork(wake_at);
  }
}

void StreamSession::SenderLoop() {
  uint32_t attempt = 0;
  for (;;) {
    if (StopDue()) break;
    if (!stop_.load() && !source_.WantsStream()) {
      // No stream until the source wants one (it then calls Wake) or a stop.
      const uint32_t seen = wake_.load(std::memory_order_acquire);
      if (!stop_.load() && !source_.WantsStream()) SleepUntil(seen, Clock::time_point::max());
      continue;
    }
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&ctx_mu_);
      if (cancelled_) break;
      ctx_ = &ctx;
    }
    broken_.store(false);
    got_directive_.store(false);
    attempts_.fetch_add(1, std::memory_order_relaxed);
    std::unique_ptr<Stream> stream = stub_->Stream(&ctx);
    std::thread reader([this, s = stream.get()] { ReaderLoop(s); });

    const Ending end = Converse(stream.get());
    if (end == Ending::kStopped || end == Ending::kIdle) {
      // Half-close and give the peer a moment to acknowledge what is
      // outstanding and end the call itself.
      stream->WritesDone();
      WaitForReader(options_.close_grace);
    } else if (end == Ending::kWriteFailed) {
      // A failed Write means the call is over; the reader's Read ends with
      // it. Wait briefly so Finish() reports the daemon's status, not ours.
      WaitForReader(options_.close_grace);
    }
    if (!broken_.load()) ctx.TryCancel();
    reader.join();
    const grpc::Status status = stream->Finish();
    {
      absl::MutexLock lock(&ctx_mu_);
      ctx_ = nullptr;
    }
    const bool was_connected = got_directive_.load();
    connected_.store(false);
    upstream_unavailable_.store(false);  // known again from the next stream
    source_.OnDisconnected({status, was_connected, end == Ending::kIdle});
    if (end == Ending::kIdle) {
      attempt = 0;
      outage_logged_ = false;
      Log(LogLevel::kInfo, absl::StrCat("stream closed: no stream wanted for ",
                                        options_.idle_close.count(), " ms"));
      continue;
    }
    if (StopDue()) break;

    if (was_connected) {
      attempt = 0;
      outage_logged_ = false;
    }
    const std::string failed = Address();
    if (ChooseNext(ctx, was_connected)) {
      // Straight to the owner: it is up (the replica that redirected knows
      // it holds the job's lease).
      reconnects_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const Clock::time_point failed_at = Clock::now();
    const Clock::time_point retry_at =
        failed_at + RetryDelay(failed, status, was_connected, attempt);
    // The call failed because the channel was down (not a refusal on a live
    // connection): gRPC reconnects it in the background, on its own backoff
    // bounded by ours (ChannelArgs). Once it is READY again the daemon is
    // back, and waiting out the rest of our delay only adds to it (issue 28:
    // the two backoffs added up to 9.6 s). Not before `initial` though, so a
    // daemon that accepts connections and drops them is not hammered.
    const bool watch_channel = channel_->GetState(false) != GRPC_CHANNEL_READY;
    const Clock::time_point earliest = failed_at + InitialBackoff();
    bool stopped = false;
    for (;;) {
      const uint32_t seen = wake_.load(std::memory_order_acquire);
      if ((stopped = StopDue())) break;
      const Clock::time_point now = Clock::now();
      if (now >= retry_at) break;
      Clock::time_point until = retry_at;
      if (watch_channel) {
        // try_to_connect: an IDLE channel starts connecting rather than
        // waiting for our next call.
        if (now >= earliest && channel_->GetState(true) == GRPC_CHANNEL_READY) break;
        until = std::min(until, std::max(earliest, now + kChannelPoll));
      }
      SleepUntil(seen, stop_.load() ? std::min(until, StopDeadline()) : until);
    }
    if (stopped) break;
    reconnects_.fetch_add(1, std::memory_order_relaxed);
  }
  absl::MutexLock lock(&stop_mu_);
  sender_exited_ = true;
}

std::chrono::milliseconds StreamSession::RetryDelay(const std::string& address,
                                                    const grpc::Status& status,
                                                    bool was_connected, uint32_t& attempt) {
  const std::string why =
      absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                   ": ", status.error_message());
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    // The daemon refused the hello: retrying fast cannot fix options.
    std::chrono::milliseconds max;
    {
      absl::MutexLock lock(&backoff_mu_);
      max = backoff_.max;
    }
    if (status.error_message() != last_refusal_) {
      last_refusal_ = status.error_message();
      Log(LogLevel::kWarning, absl::StrCat(address, " rejected the stream (", why,
                                           "); retrying every ", max.count(), " ms"));
    }
    return max;
  }
  // FAILED_PRECONDITION: another run of the job id is live on the daemon
  // (docs/runs.md); retried like an outage until it ends.
  const char* what = was_connected ? "lost the stream to "
                     : status.error_code() == grpc::StatusCode::FAILED_PRECONDITION
                         ? "refused by "
                         : "cannot reach ";
  std::string line = absl::StrCat(what, address, " (", why, ")");
  if (std::string state = source_.Describe(); !state.empty()) absl::StrAppend(&line, ", ", state);
  if (!outage_logged_) {
    outage_logged_ = true;
    Log(LogLevel::kWarning,
        absl::StrCat(line, "; retrying in the background, training is not affected"));
  } else {
    Log(LogLevel::kDebug, absl::StrCat(line, "; retrying"));
  }
  return BackoffDelay(attempt++);
}

std::chrono::milliseconds StreamSession::InitialBackoff() {
  absl::MutexLock lock(&backoff_mu_);
  return backoff_.initial;
}

std::chrono::milliseconds StreamSession::BackoffDelay(uint32_t attempt) {
  Backoff b;
  {
    absl::MutexLock lock(&backoff_mu_);
    b = backoff_;
  }
  return stream::BackoffDelay(b, attempt, rng_);
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
      std::string line = absl::StrCat("connected to ", Address());
      if (std::string state = source_.Describe(); !state.empty())
        absl::StrAppend(&line, " (", state, ")");
      Log(LogLevel::kInfo, line);
      source_.OnConnected();
    } else if (d.has_upstream_unavailable()) {
      const bool down = d.upstream_unavailable();
      // The agent's stream reached the daemon again: like a new connection
      // for MembershipFor's once-per-outage rule.
      if (upstream_unavailable_.exchange(down) && !down) connections_.fetch_add(1);
    }
    source_.OnDirective(d);
    // A stopping sender waits for Drained, which an acknowledgement may
    // have made true.
    if (stop_.load(std::memory_order_relaxed)) Wake();
  }
  {
    absl::MutexLock lock(&reader_mu_);
    broken_.store(true);
  }
  Wake();
}

void StreamSession::Log(LogLevel level, const std::string& message) const {
  const std::string line = options_.name.empty() ? message : options_.name + ": " + message;
  if (options_.log) {
    options_.log(level, line);
  } else if (level == LogLevel::kWarning) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

}  // namespace straggler::stream
