// One long-lived IngestService.Stream to stragglerd (or the node's agent),
// kept up in the background: a sender thread connects, writes what a Source
// gives it, and on failure reconnects with exponential backoff and jitter; a
// reader thread per connection reads the Directives and hands them to the
// Source. What goes on the stream (the hello, reports, resends of
// unacknowledged batches) and what a directive means are the Source's; the
// session owns the connection's life, its wake-ups and its shutdown.
//
//   StreamSession session(StreamSession::MakeChannel(o, credentials), o, source);
//   session.Start();
//   ... source has work ...  session.Wake();
//   session.Stop();  // writes the Source's closing message, then half-closes
//
// Threads: Start() starts the sender; the sender starts and joins one reader
// per connection. Source methods run on those threads (see Source).
// Thread safety: Wake, SenderIdle and the connection-state accessors may be
// called from any thread; Start and Stop from the owner, once each.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::detail {

class StreamSession {
 public:
  struct Options {
    std::string endpoint;
    std::string job_id;  // named in log lines
    std::chrono::milliseconds backoff_initial{100};
    std::chrono::milliseconds backoff_max{5000};
    // Longest the sender sleeps when nothing wakes it (see WaitForWork).
    std::chrono::milliseconds max_send_delay{20};
  };

  // What the session sends and who takes the answers.
  class Source {
   public:
    virtual ~Source() = default;
    // Sender thread, at the start of every connection: the messages that
    // open it, the first carrying the hello (e.g. the unacknowledged batches
    // again, under their sequence numbers). At least one.
    virtual void Opening(std::vector<::straggler::v1::ReportBatch>* out) = 0;
    // Sender thread: fills `batch` with the next batch to write; false when
    // there is none now.
    virtual bool NextBatch(::straggler::v1::ReportBatch* batch) = 0;
    // Any thread: whether reports wait to be batched (approximate), and
    // whether a batch may be taken now (room among unacknowledged ones).
    virtual bool Queued() const = 0;
    virtual bool HasRoom() const = 0;
    // Sender thread, when stopping on a healthy stream after the last
    // batch: the closing message (e.g. finished ranks); false: none.
    virtual bool Closing(::straggler::v1::ReportBatch* message) = 0;
    // Reader thread: each directive, in order, after the session has taken
    // its connection state (Connected, UpstreamUnavailable) from it.
    virtual void OnDirective(const ::straggler::v1::Directive& d) = 0;
  };

  // A channel for `endpoint` with the session's keepalive, and gRPC's own
  // reconnect backoff bounded by ours.
  static std::shared_ptr<grpc::Channel> MakeChannel(
      const Options& options, std::shared_ptr<grpc::ChannelCredentials> credentials);

  // `source` must outlive the session; nothing runs before Start().
  StreamSession(std::shared_ptr<grpc::Channel> channel, Options options, Source& source);
  ~StreamSession();  // Stop()
  StreamSession(const StreamSession&) = delete;
  StreamSession& operator=(const StreamSession&) = delete;

  void Start();
  // Asks the sender to close politely (what NextBatch still gives, then
  // Closing, then a half-close and a short wait for acknowledgements);
  // cancels the call under it after a grace period; joins. Idempotent.
  void Stop();

  // Wakes the sender if it sleeps (one futex wake). wake_ is waited on and
  // woken with raw futex calls, not std::atomic::wait/notify: libstdc++ has
  // no timed atomic wait, and its notify skips the system call unless its
  // own wait registered a waiter.
  void Wake() {
    wake_.fetch_add(1, std::memory_order_release);
    FutexWake();
  }
  // Whether the sender sleeps in WaitForWork (relaxed; a caller that must
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
  uint64_t Reconnects() const { return reconnects_.load(std::memory_order_relaxed); }
  uint64_t Sent() const { return sent_.load(std::memory_order_relaxed); }

 private:
  using Stream = grpc::ClientReaderWriter<::straggler::v1::ReportBatch, ::straggler::v1::Directive>;

  void FutexWake();
  void SenderLoop();
  void ReaderLoop(Stream* stream);
  bool SendOpening(Stream* stream);
  bool HasWork() const;
  void WaitForWork();
  std::chrono::milliseconds BackoffDelay(uint32_t attempt);

  const Options options_;
  Source& source_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<::straggler::v1::IngestService::Stub> stub_;

  // Sender wake-up (see WaitForWork). poll_ is the sender's alone.
  static constexpr std::chrono::microseconds kMinPoll{1000};
  std::atomic<bool> sender_idle_{false};
  std::atomic<uint32_t> wake_{0};
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  std::chrono::microseconds poll_{kMinPoll};

  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> reconnects_{0};
  std::atomic<bool> connected_{false};
  // Reset per connection from its first directive; written by the reader.
  std::atomic<bool> upstream_unavailable_{false};
  std::atomic<uint64_t> connections_{0};

  // Connection state. ctx_ is the live call's context so Stop() can cancel
  // a sender blocked inside gRPC.
  std::mutex ctx_mu_;
  grpc::ClientContext* ctx_ = nullptr;  // guarded by ctx_mu_
  std::mutex reader_mu_;
  std::condition_variable reader_cv_;
  std::atomic<bool> broken_{false};         // this connection's reader has ended
  std::atomic<bool> got_directive_{false};  // this connection reached the daemon

  // Sender-thread-only state.
  std::string last_logged_error_;
  bool outage_logged_ = false;  // one line per outage, not per retry
  std::mt19937_64 rng_;         // backoff jitter

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::atomic<bool> stop_{false};
  bool sender_exited_ = false;  // guarded by stop_mu_
  std::thread sender_;
};

}  // namespace straggler::detail
