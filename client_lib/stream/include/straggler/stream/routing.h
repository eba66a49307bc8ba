// Finding the replica that owns a job (issue 30, docs/cluster.md
// "Redirects"): one set of rules for every caller that talks to stragglerd
// about one job - the ingest stream (StreamSession), the rendezvous store
// (DaemonStore) and stragglerctl.
//
//   * a process starts at a random address of its list, so the processes
//     of a site spread over the replicas;
//   * a call ended UNAVAILABLE with the owner in trailing metadata
//     (kOwnerGrpcMetadata) goes straight to the owner, without a pause;
//   * any other failure moves to the next address of the list, with the
//     backoff (Backoff, BackoffDelay).
//
//   UnaryRouter router(pool, {});
//   grpc::Status s = router.Call(
//       [&](const std::shared_ptr<grpc::Channel>& ch, grpc::ClientContext& ctx) {
//         return v1::AdminService::NewStub(ch)->ResetJob(&ctx, req, &resp);
//       },
//       std::chrono::system_clock::now() + 10s);
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "straggler/stream/channel_pool.h"
#include "straggler/v1/wire_rules.h"

namespace straggler::stream {

// The trailing-metadata key of a redirect (docs/cluster.md, "Redirects"): a
// replica that does not own the job ends the call with UNAVAILABLE and the
// owner's gRPC address under this key; callers go straight there.
using ::straggler::v1::rules::kOwnerGrpcMetadata;

// The owner a call's trailing metadata names (kOwnerGrpcMetadata), or "".
// Only after the call finished.
std::string RedirectOwner(const grpc::ClientContext& ctx);

// How long to wait before the next connection attempt after a failed one:
// `initial`, doubling per failure up to `max`, with jitter. Reset once a
// connection reached the daemon (a directive arrived) or closed when idle.
// A call that failed because the channel was down is retried sooner, as
// soon as gRPC's own reconnect (bounded by `max` too) has the channel READY
// again, but not before `initial`.
struct Backoff {
  enum class Jitter {
    // Uniform in [initial, min(max, initial * 2^attempt)]: the ranks of a
    // large job spread their reconnects; the floor spares a flapping daemon.
    kSpread,
    // min(max, initial * 2^attempt) +-20%: an agent per node, steadier.
    kNarrow,
  };
  std::chrono::milliseconds initial{100};
  // The cap, about how long a daemon that comes (back) up waits for a
  // session at its cap to find it (issue 28: 5 s let that be 9.6 s). The
  // client's and the agent's default.
  std::chrono::milliseconds max{2000};
  Jitter jitter = Jitter::kSpread;
};

// The pause before try `attempt` (0 = after the first failure), as Backoff
// says.
std::chrono::milliseconds BackoffDelay(const Backoff& backoff, uint32_t attempt,
                                       std::mt19937_64& rng);

// Channel arguments that keep gRPC's own reconnect backoff (otherwise up to
// 2 minutes) within `backoff`: a daemon that comes back must be found within
// backoff.max. Added to `args`. The connect timeout
// (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20 s by default) is left alone: a
// short one cuts handshakes with a busy daemon ("timed out before receiving
// SETTINGS frame"), which a one-shot caller such as stragglerctl reports.
void BoundReconnectBackoff(const Backoff& backoff, grpc::ChannelArguments& args);

// The redirect rule StreamSession and UnaryRouter share: a redirect is
// always followed, without the backoff only `max` times in a row - replicas
// that disagree are not ping-ponged between, and a client whose first
// redirects named an owner that had just died still reaches the one that
// took the job over. Any other end starts the run over. Not thread-safe
// (one per stream, or per call).
class RedirectRun {
 public:
  explicit RedirectRun(uint32_t max) : max_(max) {}
  // One more redirect in the run: whether to follow it at once.
  bool FollowAtOnce() { return ++in_a_row_ <= max_; }
  void Reset() { in_a_row_ = 0; }

 private:
  uint32_t max_;
  uint32_t in_a_row_ = 0;
};

// Where the next call goes: an address of the list or a redirect's owner.
// Not thread-safe (one owner; UnaryRouter guards its own).
class AddressCursor {
 public:
  // Starts at a random address of `list` (not empty).
  explicit AddressCursor(std::vector<std::string> list);
  const std::string& current() const { return current_; }
  // To a redirect's owner (any address, in the list or not).
  void MoveTo(const std::string& owner) { current_ = owner; }
  // To the next address of the list: from a redirect's owner, the one
  // after the list address used last; with one address, that one again.
  void Next();

 private:
  std::vector<std::string> list_;
  size_t index_ = 0;  // the list address used last
  std::string current_;
};

// Unary calls about a job, each tried until it is answered by the job's
// owner or its deadline passes (the rules at the top of this file).
// Thread-safe: calls may run at once from several threads; they share where
// the last one ended up.
class UnaryRouter {
 public:
  struct Options {
    Backoff backoff;
    // Redirects followed in a row within one call before the next one waits
    // out the backoff: two replicas that disagree must not ping-pong a call.
    uint32_t max_redirects = 3;
    // Failures (other than redirects followed at once) after which a call gives up before its
    // deadline; 0: none. A command-line tool tries each address once.
    uint32_t max_failures = 0;
  };
  using Attempt =
      std::function<grpc::Status(const std::shared_ptr<grpc::Channel>&, grpc::ClientContext&)>;
  // `make_context` adds what every attempt needs (metadata: a bearer token);
  // may be empty.
  UnaryRouter(std::shared_ptr<ChannelPool> pool, Options options,
              std::function<void(grpc::ClientContext&)> make_context = {});

  // Runs `attempt` with a fresh context whose deadline is `deadline` (the
  // attempt may set a nearer one) until it returns anything but
  // UNAVAILABLE, or the deadline passes: then the last status. `address`,
  // when given, is where the last attempt went.
  grpc::Status Call(const Attempt& attempt, std::chrono::system_clock::time_point deadline,
                    std::string* address = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Where the next call goes first.
  std::string Address() const ABSL_LOCKS_EXCLUDED(mu_);
  // Redirects followed so far.
  uint64_t redirects() const { return redirects_.load(std::memory_order_relaxed); }
  const std::shared_ptr<ChannelPool>& pool() const { return pool_; }

 private:
  const std::shared_ptr<ChannelPool> pool_;
  const Options options_;
  const std::function<void(grpc::ClientContext&)> make_context_;
  mutable absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  AddressCursor cursor_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> redirects_{0};
};

}  // namespace straggler::stream
