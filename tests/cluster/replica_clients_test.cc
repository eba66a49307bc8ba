// Clients following a job's owner across real replicas (issue 30, item 3;
// docs/client.md "The stream session"): two in-process stragglerd replicas
// on one real etcd; a job owned by the first; a stream::StreamSession - the
// client library's and the agent's stream - given only the second replica's
// address reaches the owner through its redirect, and one given both
// addresses reaches it whichever it starts at. Nothing is lost: every report
// is accepted once.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon_test_util.h"
#include "etcd_catch.h"
#include "straggler/stream/channel_pool.h"
#include "straggler/stream/stream_session.h"

namespace straggler::daemon {
namespace {

using namespace std::chrono_literals;
using cluster::testing::PollUntil;
using cluster::testing::RequireEtcd;
using testutil::LoopbackDaemon;

DaemonConfig Replica(const std::string& endpoint, const std::string& id) {
  DaemonConfig c;
  c.cluster.etcd_endpoints = endpoint;
  c.cluster.replica_id = id;
  c.cluster.lease_ttl_seconds = 1;
  return c;
}

// One rank of `job`: its reports in every connection's opening batch with
// the hello (the daemon drops duplicates).
class Rank : public stream::StreamSession::Source {
 public:
  Rank(std::string job, uint32_t rank) : job_(std::move(job)), rank_(rank) {}
  uint64_t accepted() const {
    absl::MutexLock lock(&mu_);
    return accepted_;
  }
  void Opening(std::vector<v1::ReportBatch>* out) override {
    absl::MutexLock lock(&mu_);
    v1::ReportBatch& b = out->emplace_back();
    b.set_sequence(next_++);
    *b.mutable_hello() = testutil::Hello(job_, 2, {rank_}).hello();
    for (uint64_t it = 1; it <= 5; ++it) testutil::AddReport(b, rank_, it, 0.1);
  }
  bool NextBatch(v1::ReportBatch*) override { return false; }
  stream::Clock::time_point ReadyAt() const override { return stream::Clock::time_point::max(); }
  void OnDirective(const v1::Directive& d) override {
    absl::MutexLock lock(&mu_);
    accepted_ += d.accepted();
  }

 private:
  const std::string job_;
  const uint32_t rank_;
  mutable absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;
};

stream::StreamSession::Options Options() {
  stream::StreamSession::Options o;
  o.name = "replica-clients-test";
  o.backoff = {50ms, 200ms, stream::Backoff::Jitter::kNarrow};
  o.max_send_delay = 0ms;
  o.log = [](stream::LogLevel, const std::string&) {};
  return o;
}

std::shared_ptr<stream::ChannelPool> Pool(const std::string& endpoints) {
  auto pool = stream::ChannelPool::Make(endpoints, grpc::InsecureChannelCredentials(),
                                        stream::StreamSession::ChannelArgs(Options()));
  REQUIRE(pool.ok());
  return *pool;
}

TEST_CASE("replicas: a client's stream follows the redirect to the job's owner", "[cluster]") {
  auto etcd = RequireEtcd();
  LoopbackDaemon a(Replica(etcd->endpoint(), "ra"));
  LoopbackDaemon b(Replica(etcd->endpoint(), "rb"));
  const std::string owner = a.server.grpc_dial_address();
  const std::string other = b.server.grpc_dial_address();

  // Rank 0 says hello to `a` first: `a` owns the job.
  Rank first("job-follow", 0);
  stream::StreamSession s0(Pool(owner), Options(), first);
  s0.Start();
  REQUIRE(PollUntil(10s, [&] { return first.accepted() == 5; }));

  SECTION("given only the replica that does not own the job") {
    Rank second("job-follow", 1);
    stream::StreamSession s1(Pool(other), Options(), second);
    s1.Start();
    REQUIRE(PollUntil(10s, [&] { return second.accepted() == 5; }));
    CHECK(s1.Redirects() == 1);
    CHECK(s1.Address() == owner);
    s1.Stop();
  }
  SECTION("given both replicas, whichever it starts at") {
    for (int i = 0; i < 4; ++i) {
      Rank rank("job-follow-" + std::to_string(i), 0);
      // This job is new: whichever replica the session reaches first takes
      // it; a second rank given both addresses then reaches the same owner.
      stream::StreamSession first_rank(Pool(owner + "," + other), Options(), rank);
      first_rank.Start();
      REQUIRE(PollUntil(10s, [&] { return rank.accepted() == 5; }));
      Rank rank1("job-follow-" + std::to_string(i), 1);
      stream::StreamSession second_rank(Pool(other + "," + owner), Options(), rank1);
      second_rank.Start();
      REQUIRE(PollUntil(10s, [&] { return rank1.accepted() == 5; }));
      CHECK(second_rank.Address() == first_rank.Address());
      second_rank.Stop();
      first_rank.Stop();
    }
  }
  s0.Stop();
}

}  // namespace
}  // namespace straggler::daemon
