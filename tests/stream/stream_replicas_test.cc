// stream::StreamSession over several daemon addresses (issue 30, docs/
// cluster.md "Clients"): a list with an address nobody listens on reaches
// the live one; a stream ended with a redirect (UNAVAILABLE, the owner under
// kOwnerGrpcMetadata in the trailing metadata) goes straight to the owner,
// without the backoff; redirects that only point at each other fall back to
// the backoff; a list with an empty entry is refused naming it. The live
// daemon is the real stragglerd in process; the replica that redirects is a
// small IngestService of the test's own that only redirects (a replica of a
// cluster does that for jobs it does not own; cluster:* tests run the real
// ones against etcd).

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "daemon_test_util.h"
#include "straggler/stream/channel_pool.h"
#include "straggler/stream/routing.h"
#include "straggler/stream/stream_session.h"
#include "stream_test_util.h"

namespace v1 = straggler::v1;
namespace ss = straggler::stream;
namespace tu = straggler::daemon::testutil;
using namespace std::chrono_literals;

namespace {

using straggler::stream::testutil::DeadEndpoint;
using straggler::stream::testutil::Eventually;
using Source = straggler::stream::testutil::ReplayingRank;

// A replica that owns no job: every stream ends UNAVAILABLE naming `owner`.
class Redirector final : public v1::IngestService::CallbackService {
 public:
  explicit Redirector(std::string owner) : owner_(std::move(owner)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~Redirector() override { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void SetOwner(std::string owner) {
    absl::MutexLock lock(&mu_);
    owner_ = std::move(owner);
  }
  int streams() const { return streams_.load(); }

  grpc::ServerBidiReactor<v1::ReportBatch, v1::Directive>* Stream(
      grpc::CallbackServerContext* ctx) override {
    ++streams_;
    std::string owner;
    {
      absl::MutexLock lock(&mu_);
      owner = owner_;
    }
    ctx->AddTrailingMetadata(ss::kOwnerGrpcMetadata, owner);
    class Refuse : public grpc::ServerBidiReactor<v1::ReportBatch, v1::Directive> {
     public:
      explicit Refuse(const std::string& owner) {
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "job 'replicas' is owned by " + owner));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse(owner);
  }

 private:
  absl::Mutex mu_;
  std::string owner_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> streams_{0};
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

ss::StreamSession::Options Options() {
  ss::StreamSession::Options o;
  o.name = "replicas-test";
  // A backoff long enough to tell "straight to the owner" from "after the
  // backoff": 3 s at least between two attempts that are not a redirect.
  o.backoff = {3000ms, 3000ms, ss::Backoff::Jitter::kNarrow};
  o.max_send_delay = 0ms;
  o.log = [](ss::LogLevel, const std::string&) {};
  return o;
}

std::shared_ptr<ss::ChannelPool> Pool(const std::string& endpoints) {
  return straggler::stream::testutil::PoolOf(endpoints, Options());
}

}  // namespace

TEST_CASE("a list of addresses: a random first one, a dead one passed over for the next",
          "[stream][replicas]") {
  tu::LoopbackDaemon daemon;
  const std::string live = daemon.server.grpc_dial_address();
  const std::string dead = DeadEndpoint();
  auto o = Options();
  o.backoff = {20ms, 50ms, ss::Backoff::Jitter::kNarrow};
  // Sessions not started yet: where each would connect first. The processes
  // of a site spread over the replicas (64 draws of a fair coin land within
  // 16..48 but for about 5 in 100 000).
  Source idle("idle", 0);
  std::vector<std::unique_ptr<ss::StreamSession>> sessions;
  auto pool = Pool(dead + "," + live);
  int at_dead = 0;
  for (int i = 0; i < 64; ++i) {
    sessions.push_back(std::make_unique<ss::StreamSession>(pool, o, idle));
    at_dead += sessions.back()->Address() == dead;
  }
  CHECK(at_dead >= 16);
  CHECK(at_dead <= 48);
  sessions.clear();
  // One that starts at the dead address reaches the live one, in either
  // order of the list.
  int n = 0;
  for (const std::string& list : {dead + "," + live, live + " , " + dead}) {
    INFO("endpoints " << list);
    Source source("replicas-" + std::to_string(++n), 0);
    source.Queue(1, 5);
    auto p = Pool(list);
    std::unique_ptr<ss::StreamSession> session;
    while (!session || session->Address() != dead)
      session = std::make_unique<ss::StreamSession>(p, o, source);
    session->Start();
    REQUIRE(Eventually([&] { return source.accepted() == 5; }));
    CHECK(session->Address() == live);
    CHECK(session->Attempts() >= 2);
    session->Stop();
  }
}

TEST_CASE("a redirect goes straight to the owner, without the backoff", "[stream][replicas]") {
  tu::LoopbackDaemon daemon;
  const std::string owner = daemon.server.grpc_dial_address();
  Redirector replica(owner);
  Source source("replicas", 0);
  source.Queue(1, 5);
  ss::StreamSession session(Pool(replica.address()), Options(), source);
  const auto start = ss::Clock::now();
  session.Start();
  REQUIRE(Eventually([&] { return source.accepted() == 5; }));
  const auto took = ss::Clock::now() - start;
  CHECK(replica.streams() == 1);
  CHECK(session.Redirects() == 1);
  CHECK(session.Address() == owner);
  // Well under the 3 s backoff a failure without a redirect waits.
  CHECK(took < 2s);
  session.Stop();
}

TEST_CASE("redirects that only point at each other fall back to the backoff",
          "[stream][replicas]") {
  Redirector a("unset"), b("unset");
  a.SetOwner(b.address());
  b.SetOwner(a.address());
  Source source("replicas", 0);
  source.Queue(1, 1);
  auto o = Options();
  o.backoff = {300ms, 300ms, ss::Backoff::Jitter::kNarrow};
  ss::StreamSession session(Pool(a.address()), o, source);
  session.Start();
  std::this_thread::sleep_for(1500ms);
  session.Stop();
  // kMaxRedirects followed, then one attempt per backoff (300 ms +-20%):
  // far from the hundreds a loop without the bound makes in 1.5 s.
  const int streams = a.streams() + b.streams();
  INFO("streams " << streams << ", redirects " << session.Redirects());
  CHECK(session.Redirects() >= ss::StreamSession::kMaxRedirects);
  CHECK(streams <= static_cast<int>(ss::StreamSession::kMaxRedirects) + 8);
}

// Found by issue 30's failover benchmark: the replicas named the job's dead
// owner until its lease expired, the session stopped following redirects
// after kMaxRedirects, and the owner that took the job over, not in its
// list, was never reached.
TEST_CASE("after redirects to a dead owner, the redirect to the new owner is followed",
          "[stream][replicas]") {
  tu::LoopbackDaemon daemon;
  Redirector replica(DeadEndpoint());
  Source source("replicas", 0);
  source.Queue(1, 5);
  auto o = Options();
  o.backoff = {50ms, 100ms, ss::Backoff::Jitter::kNarrow};
  ss::StreamSession session(Pool(replica.address()), o, source);
  session.Start();
  REQUIRE(Eventually([&] {
    return replica.streams() > static_cast<int>(ss::StreamSession::kMaxRedirects) + 1;
  }));
  // The job is taken over by a replica at an address the client was not given.
  replica.SetOwner(daemon.server.grpc_dial_address());
  REQUIRE(Eventually([&] { return source.accepted() == 5; }));
  CHECK(session.Address() == daemon.server.grpc_dial_address());
  session.Stop();
}

TEST_CASE("a list with an empty entry is refused, naming it", "[stream][replicas]") {
  auto bad = ss::ChannelPool::Make("a:1,,b:2", grpc::InsecureChannelCredentials(), {});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()).find("'a:1,,b:2'") != std::string::npos);
  auto ok = ss::SplitEndpoints(" a:1 , unix:/run/x.sock ");
  REQUIRE(ok.ok());
  CHECK(*ok == std::vector<std::string>{"a:1", "unix:/run/x.sock"});
}

// UnaryRouter (stragglerctl, the rendezvous store) keeps StreamSession's
// rule: past max_redirects in a row a redirect is still followed, after the
// backoff, so a call whose first owners had just died reaches the one that
// took the job over. (It went back to its list before: a chain of five
// redirects never reached the daemon.)
TEST_CASE("a unary call follows a chain of redirects longer than max_redirects",
          "[stream][replicas]") {
  tu::LoopbackDaemon daemon;
  std::vector<std::unique_ptr<Redirector>> chain;
  std::string next = daemon.server.grpc_dial_address();
  for (int i = 0; i < 5; ++i) {
    chain.push_back(std::make_unique<Redirector>(next));
    next = chain.back()->address();
  }
  ss::UnaryRouter::Options o;
  o.backoff = {10ms, 10ms, ss::Backoff::Jitter::kNarrow};
  o.max_redirects = 3;
  ss::UnaryRouter router(Pool(next), o);
  std::string reached;
  const grpc::Status s = router.Call(
      [](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& ctx) {
        auto stream = v1::IngestService::NewStub(channel)->Stream(&ctx);
        stream->WritesDone();
        v1::Directive d;
        while (stream->Read(&d)) {
        }
        return stream->Finish();
      },
      std::chrono::system_clock::now() + 10s, &reached);
  CHECK(s.ok());
  CHECK(reached == daemon.server.grpc_dial_address());
  CHECK(router.redirects() == 5);
}
