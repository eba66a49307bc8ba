// Replica registration and job ownership against a real etcd: one owner per
// job, take-over after the owner's lease expires, fenced writes of an old
// owner refused (by its local deadline, and by etcd's compare), a renewed
// lease after etcd restarts; the ClusterView every replica routes by.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "cluster/cluster_view.h"
#include "cluster/ownership.h"
#include "etcd_catch.h"

namespace straggler::cluster {
namespace {

using namespace std::chrono_literals;
using testing::RequireEtcd;
using testing::PollUntil;
using testing::TcpProxy;

std::shared_ptr<EtcdClient> Connect(const std::string& endpoint) {
  auto client = EtcdClient::Connect({.endpoints = endpoint});
  REQUIRE(client.ok());
  return std::shared_ptr<EtcdClient>(*std::move(client));
}

Replica::Options Options(const std::string& id, int64_t ttl_seconds = 1) {
  Replica::Options o;
  o.id = id;
  o.grpc_address = id + ".example:50051";
  o.http_address = id + ".example:8080";
  o.ttl_seconds = ttl_seconds;
  return o;
}

std::unique_ptr<Replica> Join(std::shared_ptr<EtcdClient> etcd, const std::string& id,
                              int64_t ttl_seconds = 1) {
  auto replica = Replica::Join(std::move(etcd), Options(id, ttl_seconds));
  INFO((replica.ok() ? std::string() : std::string(replica.status().message())));
  REQUIRE(replica.ok());
  return *std::move(replica);
}

TEST_CASE("ownership: replicas register their addresses, an id is taken once", "[cluster]") {
  auto etcd = RequireEtcd();
  auto client = Connect(etcd->endpoint());
  auto r1 = Join(client, "r1");
  auto r2 = Join(client, "r2");
  auto replicas = r1->Replicas();
  REQUIRE(replicas.ok());
  REQUIRE(replicas->size() == 2);
  CHECK((*replicas)[0].id == "r1");
  CHECK((*replicas)[0].grpc_address == "r1.example:50051");
  CHECK((*replicas)[0].http_address == "r1.example:8080");
  CHECK((*replicas)[0].lease == r1->lease_id());
  CHECK((*replicas)[1].id == "r2");
  CHECK(r1->MayDecide());

  auto again = Replica::Join(client, Options("r1"));
  REQUIRE_FALSE(again.ok());
  CHECK(again.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK_THAT(std::string(again.status().message()), Catch::Contains("replica id 'r1'"));
  auto bad_id = Replica::Join(client, Options("bad/id"));
  CHECK(bad_id.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad_id.status().message()), Catch::Contains("replica id 'bad/id'"));
  Replica::Options no_slash = Options("r3");
  no_slash.prefix = "/no-slash";
  CHECK_THAT(std::string(Replica::Join(client, no_slash).status().message()),
             Catch::Contains("prefix '/no-slash' must end with '/'"));
  Replica::Options margin = Options("r4");
  margin.safety_margin = std::chrono::seconds(5);
  CHECK_THAT(std::string(Replica::Join(client, margin).status().message()),
             Catch::Contains("below the granted lease TTL"));

  // Leaving revokes the lease: the registration goes at once.
  REQUIRE(r2->Leave().ok());
  CHECK(r1->Replicas()->size() == 1);
}

TEST_CASE("ownership: one owner per job, a stale claim's write is refused by etcd", "[cluster]") {
  auto etcd = RequireEtcd();
  auto client = Connect(etcd->endpoint());
  auto r1 = Join(client, "r1", 5);
  auto r2 = Join(client, "r2", 5);

  auto a = r1->TakeJob("job-a");
  REQUIRE(a.ok());
  CHECK(a->owned);
  CHECK(a->owner == "r1");
  CHECK(a->lease == r1->lease_id());
  auto seen_by_r2 = r2->TakeJob("job-a");
  REQUIRE(seen_by_r2.ok());
  CHECK_FALSE(seen_by_r2->owned);
  CHECK(seen_by_r2->owner == "r1");
  CHECK(seen_by_r2->create_revision == a->create_revision);
  auto again = r1->TakeJob("job-a");  // taking a job held already is a no-op
  REQUIRE(again.ok());
  CHECK(again->owned);
  CHECK(again->create_revision == a->create_revision);

  REQUIRE(r1->FencedPut(*a, "membership", "v1").ok());
  CHECK(client->Get(r1->JobKey("job-a", "membership"))->kvs.at(0).value == "v1");
  // Another replica cannot write with a claim it does not hold.
  CHECK(r2->FencedPut(*seen_by_r2, "membership", "x").status().code() ==
        absl::StatusCode::kFailedPrecondition);

  // r1 lets go and r2 takes the job: r1's old claim is still within r1's
  // live lease and deadline, so only etcd's compare can refuse it.
  REQUIRE(r1->Release(*a).ok());
  auto b = r2->TakeJob("job-a");
  REQUIRE(b.ok());
  CHECK(b->owned);
  CHECK(b->create_revision > a->create_revision);
  CHECK(r1->MayDecide());
  auto stale = r1->FencedPut(*a, "membership", "stale");
  REQUIRE_FALSE(stale.ok());
  CHECK(stale.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(stale.status().message()), Catch::Contains("owned by 'r2'"));
  CHECK(r1->Release(*a).code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(r2->FencedPut(*b, "membership", "v2").ok());
  CHECK(client->Get(r1->JobKey("job-a", "membership"))->kvs.at(0).value == "v2");
  CHECK(r1->Owner("job-a")->owner == "r2");
}

TEST_CASE("ownership: replicas racing for the same new jobs get exactly one owner each",
          "[cluster]") {
  auto etcd = RequireEtcd();
  constexpr int kReplicas = 3;
  constexpr int kJobs = 20;
  std::vector<std::unique_ptr<Replica>> replicas;
  for (int r = 0; r < kReplicas; ++r) {
    // Each with a client of its own, as separate processes would have.
    replicas.push_back(Join(Connect(etcd->endpoint()), "r" + std::to_string(r), 5));
  }
  // Every replica tries every job at once (issue 30's test C, many times).
  std::vector<std::vector<absl::StatusOr<JobClaim>>> claims(kReplicas);
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (int r = 0; r < kReplicas; ++r) {
    threads.emplace_back([&, r] {
      while (!go) std::this_thread::yield();
      for (int j = 0; j < kJobs; ++j) {
        claims[r].push_back(replicas[r]->TakeJob("job-" + std::to_string(j)));
      }
    });
  }
  go = true;
  for (std::thread& t : threads) t.join();
  for (int j = 0; j < kJobs; ++j) {
    INFO("job-" << j);
    int owners = 0;
    std::string owner;
    for (int r = 0; r < kReplicas; ++r) {
      const absl::StatusOr<JobClaim>& c = claims[r][j];
      REQUIRE(c.ok());
      if (c->owned) {
        ++owners;
        CHECK(c->owner == replicas[r]->id());
      }
      if (owner.empty()) owner = c->owner;
      CHECK(c->owner == owner);  // everyone names the same owner
    }
    CHECK(owners == 1);
    auto stored = replicas[0]->Owner("job-" + std::to_string(j));
    REQUIRE(stored.ok());
    CHECK(stored->owner == owner);
  }
}

TEST_CASE("ownership: a partitioned owner stops deciding, then another replica takes its job",
          "[cluster]") {
  auto etcd = RequireEtcd();
  auto direct = Connect(etcd->endpoint());
  auto proxy = TcpProxy::Start(etcd->client_port());
  REQUIRE(proxy.ok());
  auto r1 = Join(Connect((*proxy)->endpoint()), "r1");  // r1 reaches etcd through the proxy
  auto r2 = Join(direct, "r2");

  testing::WatchRecorder recorder;
  auto watch = direct->WatchPrefix(r2->OwnersPrefix(), 0, recorder.OnEvents(), nullptr);
  REQUIRE(watch.ok());

  auto a = r1->TakeJob("job-a");
  REQUIRE(a.ok());
  REQUIRE(a->owned);
  REQUIRE(r1->FencedPut(*a, "membership", "v1").ok());

  // The partition: r1's lease can no longer be renewed.
  (*proxy)->Cut();
  // Poll r2's take-over; every time it fails, r1 may still be deciding, but
  // once it succeeds r1 must have stopped: its local deadline comes before
  // etcd's expiry.
  const auto limit = std::chrono::seconds(r1->ttl_seconds()) + 3s;
  absl::StatusOr<JobClaim> b;
  bool r1_stopped_first = true;
  REQUIRE(PollUntil(std::chrono::duration_cast<std::chrono::milliseconds>(limit), [&] {
    const bool r1_may_decide = r1->MayDecide();
    b = r2->TakeJob("job-a");
    if (b.ok() && b->owned && r1_may_decide) r1_stopped_first = false;
    return b.ok() && b->owned;
  }));
  CHECK(r1_stopped_first);
  CHECK_FALSE(r1->MayDecide());
  REQUIRE(r2->FencedPut(*b, "membership", "v2").ok());

  // The old owner's write is refused by its own deadline...
  auto late = r1->FencedPut(*a, "membership", "stale");
  CHECK(late.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(late.status().message()), Catch::Contains("not renewed in time"));
  // ...and once the partition heals, etcd tells r1 its lease is gone.
  (*proxy)->Heal();
  REQUIRE(PollUntil(5s, [&] { return !r1->MayDecide() && r1->Owner("job-a").ok(); }));
  REQUIRE(PollUntil(5s, [&] { return r1->FencedPut(*a, "membership", "stale").status().message()
                                         .find("is gone") != std::string::npos; }));
  CHECK(direct->Get(r2->JobKey("job-a", "membership"))->kvs.at(0).value == "v2");

  // The watch saw the job go from r1 to nobody to r2, in that order.
  REQUIRE(PollUntil(5s, [&] { return recorder.Events().size() >= 3; }));
  const std::vector<WatchEvent> events = recorder.Events();
  REQUIRE(events.size() == 3);
  CHECK(events[0].type == WatchEvent::Type::kPut);
  CHECK(events[0].kv.value == "r1");
  CHECK(events[1].type == WatchEvent::Type::kDelete);
  CHECK(events[1].kv.key == r1->OwnerKey("job-a"));
  CHECK(events[2].type == WatchEvent::Type::kPut);
  CHECK(events[2].kv.value == "r2");
  CHECK(events[2].kv.create_revision == b->create_revision);
}

TEST_CASE("ownership: an owner stops deciding while etcd is down and resumes after", "[cluster]") {
  auto etcd = RequireEtcd();
  auto client = Connect(etcd->endpoint());
  auto r1 = Join(client, "r1");
  auto a = r1->TakeJob("job-a");
  REQUIRE(a.ok());
  REQUIRE(a->owned);

  etcd->Kill();
  REQUIRE(PollUntil(std::chrono::seconds(r1->ttl_seconds()) + 1s,
                    [&] { return !r1->MayDecide(); }));
  CHECK(r1->TakeJob("job-b").status().code() == absl::StatusCode::kUnavailable);

  // etcd restores leases on restart with a fresh TTL: the keeper renews it
  // again and the replica, still holding the job's key, decides again.
  absl::Status restarted = etcd->Restart();
  INFO(restarted.message());
  REQUIRE(restarted.ok());
  REQUIRE(PollUntil(std::chrono::seconds(r1->ttl_seconds()) + 5s, [&] { return r1->MayDecide(); }));
  auto owner = r1->Owner("job-a");
  REQUIRE(owner.ok());
  CHECK(owner->owned);
  CHECK(owner->create_revision == a->create_revision);
  CHECK(r1->FencedPut(*a, "membership", "after restart").ok());
}

TEST_CASE("ownership: the cluster view follows registrations and owners", "[cluster]") {
  auto etcd = RequireEtcd();
  auto client = Connect(etcd->endpoint());
  auto r1 = Join(client, "r1", 5);
  auto a = r1->TakeJob("job-a");
  REQUIRE(a.ok());
  REQUIRE(client->Put("/elsewhere/owners/job-x", "not ours").ok());

  // Read at start: r1 and its job.
  auto view = ClusterView::Start(client, "/stragglerd/");
  REQUIRE(view.ok());
  ClusterView& v = **view;
  CHECK(v.OwnerOf("job-a") == std::optional<std::string>("r1"));
  REQUIRE(v.ReplicaById("r1").has_value());
  CHECK(v.ReplicaById("r1")->grpc_address == "r1.example:50051");
  CHECK(v.ReplicaById("r1")->http_address == "r1.example:8080");
  CHECK_FALSE(v.OwnerOf("job-x").has_value());
  const int64_t start = v.Revision();

  // Then watched: a new replica and its job...
  auto r2 = Join(client, "r2", 5);
  auto b = r2->TakeJob("job-b");
  REQUIRE(b.ok());
  REQUIRE(PollUntil(5s, [&] { return v.OwnerOf("job-b").has_value(); }));
  CHECK(*v.OwnerOf("job-b") == "r2");
  CHECK(v.Replicas().size() == 2);
  CHECK(v.Revision() >= b->create_revision);
  // ...and a replica leaving takes its registration and its jobs along.
  REQUIRE(r1->Leave().ok());
  REQUIRE(PollUntil(5s, [&] { return !v.OwnerOf("job-a").has_value(); }));
  CHECK_FALSE(v.ReplicaById("r1").has_value());
  REQUIRE(v.Replicas().size() == 1);
  CHECK(v.Replicas()[0].id == "r2");
  CHECK(v.Owners() == std::map<std::string, std::string>{{"job-b", "r2"}});
  CHECK(v.Revision() > start);
  CHECK(v.Status().ok());
  CHECK(ClusterView::Start(client, "/no-slash").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace straggler::cluster
