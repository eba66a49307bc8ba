// One long-lived IngestService.Stream kept up in the background, shared by
// the client library (a trainer's stream to stragglerd or to its node's
// agent) and the agent (each job's stream to stragglerd). A sender thread
// connects, writes what a Source gives it and, when the call fails,
// reconnects with exponential backoff and jitter; a reader thread per
// connection hands the Directives to the Source. What goes on the stream
// (hello, reports, resends of unacknowledged batches) and what a directive
// means are the Source's; the session owns the connection's life: when one
// is open, its wake-ups, its backoff, its log lines and a bounded shutdown.
// docs/client.md#the-stream-session describes both users.
//
//   auto pool = ChannelPool::Make(endpoints, credentials, StreamSession::ChannelArgs(o));
//   StreamSession session(*pool, o, source);
//   session.Start();
//   ... the source has work ...  session.Wake();
//   session.Stop(deadline);  // delivers what it can (Source::Drained) until then
//   session.Join();          // the call is cancelled once the deadline has passed
//
// The no-daemon rule: nothing here blocks a caller on the daemon. Wake and
// the accessors never wait; Join waits at most until the stop deadline (at
// least kStopGrace after Stop) and then cancels the call under the sender.
//
// Thread safety: Wake, SetBackoff, Stop and the accessors may be called from
// any thread; Start once, Join from one thread. Source methods run on the
// session's threads (see Source) and may take the source's own locks; the
// session holds none of its locks while it calls them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "straggler/stream/channel_pool.h"
#include "straggler/stream/routing.h"
#include "straggler/v1/straggler.grpc.pb.h"
#include "straggler/v1/wire_rules.h"

namespace straggler::stream {

using Clock = std::chrono::steady_clock;

enum class LogLevel { kDebug, kInfo, kWarning };
// Gets each log line whole, prefixed with Options::name. Called from the
// session's threads, never with the session's locks held.
using LogSink = std::function<void(LogLevel, const std::string&)>;

class StreamSession {
 public:
  struct Options {
    std::string name;      // who speaks in log lines: "straggler client (job 'j')"
    Backoff backoff;
    // Longest the sender sleeps when nothing wakes it and the Source names
    // no time (see Source::ReadyAt); the poll starts at 1 ms after work and
    // doubles while idle. 0: no poll, the sender sleeps until woken.
    std::chrono::milliseconds max_send_delay{20};
    // An open stream is half-closed once the Source has not wanted one
    // (WantsStream) for this long.
    std::chrono::milliseconds idle_close{2000};
    // After the last write of a clean close (WritesDone), how long the
    // sender waits for the peer to end the call before cancelling it.
    std::chrono::milliseconds close_grace{200};
    LogSink log;  // empty: warnings to stderr
  };

  // How a connection ended, for Source::OnDisconnected.
  struct Disconnect {
    grpc::Status status;
    bool was_connected = false;  // a directive had arrived on it
    bool idle = false;           // closed by the session: the Source wanted no stream
  };

  // What differs between the users of a session.
  class Source {
   public:
    virtual ~Source() = default;
    // Sender thread: whether a stream should be open. While false and not
    // stopping, none is opened and an open one is half-closed after
    // Options::idle_close.
    virtual bool WantsStream() { return true; }
    // Sender thread, at the start of every connection: the messages that
    // open it, the first carrying the hello (e.g. the unacknowledged
    // batches again, under their sequence numbers). At least one.
    virtual void Opening(std::vector<::straggler::v1::ReportBatch>* out) = 0;
    // Sender thread: fills `batch` with the next batch to write; false when
    // none is due now.
    virtual bool NextBatch(::straggler::v1::ReportBatch* batch) = 0;
    // Sender thread: when NextBatch will give a batch unless something
    // changes first (the source then calls Wake): <= now for now, a batching
    // deadline, or Clock::time_point::max() for "not until woken".
    virtual Clock::time_point ReadyAt() const = 0;
    // Sender thread, once when stopping on a healthy stream after the
    // batches due: the closing message (e.g. finished ranks); false: none.
    virtual bool Closing(::straggler::v1::ReportBatch* /*message*/) { return false; }
    // Sender thread, when stopping: whether everything written has been
    // acknowledged. Until it is, or the stop deadline, the sender keeps
    // writing and reconnecting; it asks again after every directive.
    // Default: nothing to wait for.
    virtual bool Drained() { return true; }
    // Reader thread: the first directive of a connection arrived (the
    // session has set Connected()); OnDirective gets it next.
    virtual void OnConnected() {}
    // Reader thread: each directive, in order.
    virtual void OnDirective(const ::straggler::v1::Directive& d) = 0;
    // Sender thread: a connection ended, its reader joined.
    virtual void OnDisconnected(const Disconnect& /*how*/) {}
    // For log lines: the source's state worth a mention ("12 reports
    // buffered"); empty: none.
    virtual std::string Describe() const { return {}; }
  };

  // The least time Join lets a stopping sender close politely.
  static constexpr std::chrono::milliseconds kStopGrace{500};

  // The session's channel arguments (for its ChannelPool): keepalive, and
  // gRPC's own reconnect backoff bounded by ours.
  static grpc::ChannelArguments ChannelArgs(const Options& options);

  // Over the pool's addresses (docs/cluster.md, "Clients"): the first
  // connection goes to a random one of them, so that the processes of a
  // site spread over the replicas; a stream that ends with a redirect
  // (kOwnerGrpcMetadata) reconnects straight to the owner it names, without
  // the backoff (after kMaxRedirects redirects in a row, with no directive
  // and no other end between them, after the backoff: two replicas that
  // disagree must not be ping-ponged
  // between, and an owner named while it was dying must not stop the
  // session from following the next one); any other failure moves to the
  // next address of the list after the one used last, with the backoff.
  // `source` must outlive the session; nothing runs before Start().
  StreamSession(std::shared_ptr<ChannelPool> pool, Options options, Source& source);
  ~StreamSession();  // Stop() unless stopped; Join()
  StreamSession(const StreamSession&) = delete;
  StreamSession& operator=(const StreamSession&) = delete;

  void Start();
  // Asks the sender to stop by `deadline`: it writes what NextBatch still
  // gives and the Closing message, waits for Drained (reconnecting while it
  // is false), half-closes, and exits. Does not wait. A second call can
  // only bring the deadline forward.
  void Stop(Clock::time_point deadline);
  // Waits for the sender; once the deadline (and kStopGrace after Stop) has
  // passed, cancels the call under it (a Write blocked on flow control only
  // returns then). Without an earlier Stop, stops now. Idempotent.
  void Join();
  // Stop(now) and Join(): the client's shutdown.
  void Stop() {
    Stop(Clock::now());
    Join();
  }

  // The backoff of the next reconnect (the agent's SIGHUP).
  void SetBackoff(Backoff backoff);

  // Wakes the sender if it sleeps (one futex wake). wake_ is waited on and
  // woken with raw futex calls, not std::atomic::wait/notify: libstdc++ has
  // no timed atomic wait, and its notify skips the system call unless its
  // own wait registered a waiter.
  void Wake() {
    wake_.fetch_add(1, std::memory_order_release);
    FutexWake();
  }
  // Whether the sender sleeps waiting for work (relaxed; a caller that must
  // not miss it fences first, pairing with the fence in WaitForWork).
  bool SenderIdle() const { return sender_idle_.load(std::memory_order_relaxed); }

  bool Stopping() const { return stop_.load(); }
  // A directive arrived on the current connection.
  bool Connected() const { return connected_.load(); }
  // An agent on the other end said its own stream to the daemon is down.
  bool UpstreamUnavailable() const { return upstream_unavailable_.load(); }
  // No daemon can answer: not connected, or the agent says it is cut off.
  bool Unreachable() const { return !Connected() || UpstreamUnavailable(); }
  // Connections that reached the daemon so far (an agent's stream coming
  // back counts as one).
  uint64_t Connections() const { return connections_.load(); }
  // Streams opened (attempts, the first included).
  uint64_t Attempts() const { return attempts_.load(std::memory_order_relaxed); }
  uint64_t Reconnects() const { return reconnects_.load(std::memory_order_relaxed); }
  // Streams ended with a redirect that was followed.
  uint64_t Redirects() const { return redirects_.load(std::memory_order_relaxed); }
  // The address the session connects to now (the sender's; a copy).
  std::string Address() const ABSL_LOCKS_EXCLUDED(address_mu_);

  static constexpr uint32_t kMaxRedirects = 3;
  uint64_t Sent() const { return sent_.load(std::memory_order_relaxed); }

 private:
  using Stream = grpc::ClientReaderWriter<::straggler::v1::ReportBatch, ::straggler::v1::Directive>;
  // How Converse ended: the reader saw the call end, a Write failed, stopped
  // with everything delivered, stopped at the deadline, closed while idle.
  enum class Ending { kBroken, kWriteFailed, kStopped, kDeadline, kIdle };

  void FutexWake();
  // Sleeps until Wake() or `until` (one futex wait; `seen` is wake_ read
  // before the caller checked for work, so a Wake in between is not lost).
  void SleepUntil(uint32_t seen, Clock::time_point until);
  void SenderLoop();
  void ReaderLoop(Stream* stream);
  // One connection's writes, from the opening to its end.
  Ending Converse(Stream* stream);
  // Stopping, and delivered (Drained) or past the deadline.
  bool StopDue();
  Clock::time_point StopDeadline() const ABSL_LOCKS_EXCLUDED(stop_mu_);
  void WaitForWork(Clock::time_point idle_due);
  void WaitForReader(std::chrono::milliseconds timeout) ABSL_LOCKS_EXCLUDED(reader_mu_);
  // After a failed connection to `address`: logs it (once per outage) and
  // says how long to wait; `attempt` counts the failures of this outage.
  std::chrono::milliseconds RetryDelay(const std::string& address, const grpc::Status& status,
                                       bool was_connected, uint32_t& attempt);
  std::chrono::milliseconds BackoffDelay(uint32_t attempt) ABSL_LOCKS_EXCLUDED(backoff_mu_);
  std::chrono::milliseconds InitialBackoff() ABSL_LOCKS_EXCLUDED(backoff_mu_);
  void Log(LogLevel level, const std::string& message) const;

  // After a connection ended: the address to try next (a redirect's owner,
  // the next of the list, or the same). True when it follows a redirect.
  bool ChooseNext(grpc::ClientContext& ctx, bool was_connected);
  void SwitchTo(const std::string& address);

  const Options options_;
  Source& source_;
  const std::shared_ptr<ChannelPool> pool_;
  // The sender's connection target; address_ is also read by Address().
  AddressCursor cursor_;  // the sender's: where the next connection goes
  RedirectRun redirect_run_{kMaxRedirects};
  mutable absl::Mutex address_mu_;
  std::string address_ ABSL_GUARDED_BY(address_mu_);
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<::straggler::v1::IngestService::Stub> stub_;

  mutable absl::Mutex backoff_mu_;
  Backoff backoff_ ABSL_GUARDED_BY(backoff_mu_);

  // Sender wake-up (see WaitForWork). poll_ is the sender's alone.
  static constexpr std::chrono::microseconds kMinPoll{1000};
  std::atomic<bool> sender_idle_{false};
  std::atomic<uint32_t> wake_{0};
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  std::chrono::microseconds poll_{kMinPoll};

  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> attempts_{0};
  std::atomic<uint64_t> reconnects_{0};
  std::atomic<uint64_t> redirects_{0};
  std::atomic<bool> connected_{false};
  // Reset per connection from its first directive; written by the reader.
  std::atomic<bool> upstream_unavailable_{false};
  std::atomic<uint64_t> connections_{0};

  // The live call's context, so that Join() can cancel a sender blocked in
  // gRPC; once cancelled_, no new call starts.
  absl::Mutex ctx_mu_;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(ctx_mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(ctx_mu_) = false;
  // This connection's reader has ended (written under reader_mu_ so that
  // WaitForReader's condition is re-evaluated; read lock-free elsewhere).
  absl::Mutex reader_mu_;
  std::atomic<bool> broken_{false};
  std::atomic<bool> got_directive_{false};  // this connection reached the daemon

  // Sender-thread-only state.
  std::string last_refusal_;    // the last refused hello's message, logged once
  bool outage_logged_ = false;  // one warning per outage, not per retry
  std::mt19937_64 rng_;         // backoff jitter

  mutable absl::Mutex stop_mu_;
  std::atomic<bool> stop_{false};
  Clock::time_point deadline_ ABSL_GUARDED_BY(stop_mu_) = Clock::time_point::max();
  Clock::time_point cancel_at_ ABSL_GUARDED_BY(stop_mu_) = Clock::time_point::max();
  bool sender_exited_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread sender_;
};

}  // namespace straggler::stream
