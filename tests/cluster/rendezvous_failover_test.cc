// The rendezvous store at a failover (issue 30, docs/cluster.md "The
// rendezvous store at a failover"): stragglerd replicas (in-process daemons)
// on a real etcd, the collective layer's DaemonStore given every replica's
// address. Keys a job's owner accepted are in etcd; the replica that takes
// the job over loads them, and a Wait the old owner held is asked again of
// the new one. The last cases run a real Gloo job (rank processes of
// straggler-collective-driver) across the stop, or the SIGKILL, of its owner.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "child_process.h"
#include "cluster/etcd_client.h"
#include "rendezvous/rendezvous_store.h"
#include "daemon_test_util.h"
#include "etcd_catch.h"
#include "replica_test_util.h"
#include "straggler/gloo_store.h"

namespace straggler::daemon {
namespace {

using namespace std::chrono_literals;
using cluster::testing::Child;
using cluster::testing::Finish;
using cluster::testing::PollUntil;
using cluster::testing::Slurp;
using cluster::testing::Spawn;
using cluster::testing::TcpProxy;
using cluster::testing::RequireEtcd;
using testutil::LoopbackDaemon;
using testutil::kSteadyLeaseSeconds;
using testutil::ReplicaConfig;
using testutil::TwoReplicas;

std::string OwnerOf(cluster::EtcdClient& etcd, const std::string& job) {
  auto r = etcd.Get("/stragglerd/owners/" + job);
  REQUIRE(r.ok());
  return r->kvs.empty() ? std::string() : r->kvs[0].value;
}

size_t KeysInEtcd(cluster::EtcdClient& etcd, const std::string& job) {
  auto r = etcd.GetPrefix("/stragglerd/jobs/" + job + "/rendezvous/");
  REQUIRE(r.ok());
  return r->kvs.size();
}

std::vector<char> Bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string Text(const std::vector<char>& v) { return {v.begin(), v.end()}; }

TEST_CASE("rendezvous failover: keys the owner accepted, and a held Wait, reach the next owner",
          "[cluster]") {
  auto etcd = RequireEtcd();
  TwoReplicas replicas(etcd->endpoint());
  const std::string& both = replicas.both;
  auto client = cluster::EtcdClient::Connect({.endpoints = etcd->endpoint()});
  REQUIRE(client.ok());

  DaemonStore first(both, "job-rdzv", 10min, 20s);
  first.set("gloo/0", Bytes("address of rank 0"));
  // The largest value the store takes (rendezvous.max_value_bytes, 1 MiB)
  // fits etcd's default request limit (1.5 MiB) with the transaction around it.
  const std::string big(DaemonConfig().rendezvous.max_value_bytes, 'x');
  first.set("nccl/id", Bytes(big));
  const std::string owner = OwnerOf(**client, "job-rdzv");
  REQUIRE((owner == "ra" || owner == "rb"));
  CHECK(KeysInEtcd(**client, "job-rdzv") == 2);

  // Held on the owner while it stops.
  DaemonStore waiter(both, "job-rdzv", 10min, 20s);
  auto waited = std::async(std::launch::async, [&] {
    waiter.wait({"gloo/1"});
    return Text(waiter.get("gloo/1"));
  });
  std::this_thread::sleep_for(300ms);
  replicas.Named(owner).reset();  // a graceful stop: the job is free at once

  DaemonStore late(both, "job-rdzv", 10min, 20s);
  late.set("gloo/1", Bytes("address of rank 1"));
  CHECK(OwnerOf(**client, "job-rdzv") == (owner == "ra" ? "rb" : "ra"));
  // Set before the stop, read from the new owner.
  CHECK(Text(late.get("gloo/0")) == "address of rank 0");
  CHECK(Text(late.get("nccl/id")) == big);
  REQUIRE(waited.wait_for(20s) == std::future_status::ready);
  CHECK(waited.get() == "address of rank 1");
}

TEST_CASE("rendezvous failover: an owner cut off from etcd ends its held Waits, which the next "
          "owner completes",
          "[cluster]") {
  auto etcd = RequireEtcd();
  auto proxy = TcpProxy::Start(etcd->client_port());
  REQUIRE(proxy.ok());
  LoopbackDaemon a(ReplicaConfig((*proxy)->endpoint(), "ra"));  // expires once cut
  LoopbackDaemon b(ReplicaConfig(etcd->endpoint(), "rb", kSteadyLeaseSeconds));
  const std::string both = a.server.grpc_dial_address() + "," + b.server.grpc_dial_address();
  DaemonStore on_a(a.server.grpc_dial_address(), "job-cut", 10min, 5s);
  on_a.set("gloo/0", Bytes("address of rank 0"));  // ra takes the job
  auto client = cluster::EtcdClient::Connect({.endpoints = etcd->endpoint()});
  REQUIRE(client.ok());
  REQUIRE(OwnerOf(**client, "job-cut") == "ra");

  // Longer than the test: only the end of the held Wait can free it in time.
  DaemonStore waiter(both, "job-cut", 10min, 60s);
  auto waited = std::async(std::launch::async, [&] {
    waiter.wait({"gloo/1"});
    return Text(waiter.get("gloo/1"));
  });
  REQUIRE(PollUntil(5s, [&] { return a.server.rendezvous().WaiterCount() == 1; }));
  (*proxy)->Cut();

  // rb takes the job once ra's lease expired (a Set through rb alone).
  DaemonStore on_b(b.server.grpc_dial_address(), "job-cut", 10min, 20s);
  on_b.set("gloo/1", Bytes("address of rank 1"));
  CHECK(OwnerOf(**client, "job-cut") == "rb");
  CHECK(Text(on_b.get("gloo/0")) == "address of rank 0");
  REQUIRE(waited.wait_for(15s) == std::future_status::ready);
  CHECK(waited.get() == "address of rank 1");
  CHECK(a.server.rendezvous().WaiterCount() == 0);
  (*proxy)->Heal();
}

TEST_CASE("rendezvous failover: a store given several addresses follows the owner's redirect",
          "[cluster]") {
  auto etcd = RequireEtcd();
  LoopbackDaemon a(ReplicaConfig(etcd->endpoint(), "ra", kSteadyLeaseSeconds));
  LoopbackDaemon b(ReplicaConfig(etcd->endpoint(), "rb", kSteadyLeaseSeconds));
  // The job taken by `a` through its own address alone.
  DaemonStore on_a(a.server.grpc_dial_address(), "job-redirect", 10min, 5s);
  on_a.set("k", Bytes("v"));
  // A store that starts at `b` is sent to `a`, however often it is asked.
  for (int i = 0; i < 3; ++i) {
    DaemonStore listed(b.server.grpc_dial_address() + "," + a.server.grpc_dial_address(),
                       "job-redirect", 10min, 5s);
    CHECK(Text(listed.get("k")) == "v");
    CHECK(listed.address() == a.server.grpc_dial_address());
  }
  // A bad list is refused naming it.
  CHECK_THROWS_WITH(DaemonStore("a:1,,b:2", "job-redirect"), Catch::Contains("'a:1,,b:2'"));
}

// One rank process of the Gloo job; its stdout and stderr in files.
Child StartRank(const std::string& daemons, const std::string& job, int rank, int world,
                const std::string& dir) {
  Child c = Spawn({STRAGGLER_COLLECTIVE_DRIVER, "--daemon", daemons, "--job", job, "--rank",
                   std::to_string(rank), "--world-size", std::to_string(world), "--iterations",
                   "40", "--step-ms", "10", "--membership-timeout-ms", "30000",
                   "--collective-timeout-ms", "40000"},
                  dir + "/rank" + std::to_string(rank));
  REQUIRE(c.pid > 0);
  return c;
}

// A Gloo job of 3 rank processes on the replicas `daemons` (ids `ids`)
// across a failover: ranks 0 and 1 set their addresses and wait for rank
// 2's; then `stop_owner(owner id)` makes the job's owner go with their keys
// in its memory and their Waits held; rank 2 arrives after, needing ranks 0
// and 1's keys (only etcd still has them), and they need its key, set on
// the new owner. Every rank must finish, and the other replica own the job.
void GlooJobAcrossFailover(const std::string& daemons,
                           const std::pair<std::string, std::string>& ids,
                           const std::string& etcd_endpoint, const std::string& job,
                           const std::function<void(const std::string&)>& stop_owner) {
  auto client = cluster::EtcdClient::Connect({.endpoints = etcd_endpoint});
  REQUIRE(client.ok());
  const std::string dir = std::string(STRAGGLER_CLUSTER_TEST_DIR) + "/" + job;
  std::filesystem::create_directories(dir);
  std::vector<Child> ranks = {StartRank(daemons, job, 0, 3, dir),
                              StartRank(daemons, job, 1, 3, dir)};
  const bool published = PollUntil(30s, [&] { return KeysInEtcd(**client, job) >= 2; });
  INFO("rank 0 stderr: " << Slurp(ranks[0].err));
  REQUIRE(published);
  const std::string owner = OwnerOf(**client, job);
  REQUIRE((owner == ids.first || owner == ids.second));
  stop_owner(owner);

  ranks.push_back(StartRank(daemons, job, 2, 3, dir));
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int rc = Finish(ranks[r], 90s);
    INFO("rank " << r << " stderr: " << Slurp(ranks[r].err));
    CHECK(rc == 0);
    CHECK_THAT(Slurp(ranks[r].out), Catch::Contains("\"final\""));
  }
  CHECK(OwnerOf(**client, job) == (owner == ids.first ? ids.second : ids.first));
}

TEST_CASE("rendezvous failover: a Gloo job builds its context across the stop of its owner",
          "[cluster]") {
  auto etcd = RequireEtcd();
  TwoReplicas replicas(etcd->endpoint());
  GlooJobAcrossFailover(replicas.both, {"ra", "rb"}, etcd->endpoint(), "job-gloo-failover",
                        [&](const std::string& owner) { replicas.Named(owner).reset(); });
}

// One stragglerd process of the cluster (the real binary): its gRPC address
// once it serves, from its --ready-file.
struct ReplicaProcess {
  Child child;
  std::string grpc_address;
};

ReplicaProcess StartReplica(const std::string& etcd, const std::string& id,
                            const std::string& dir) {
  const std::string config = dir + "/" + id + ".yaml";
  {
    std::ofstream out(config);
    // 2 s: the killed owner's jobs are free soon, the survivor keeps its
    // lease on a loaded machine.
    out << "cluster:\n  replica_id: " << id << "\n  lease_ttl_seconds: 2\n";
  }
  const std::string ready = dir + "/" + id + ".ready";
  std::filesystem::remove(ready);
  ReplicaProcess r;
  r.child = Spawn({STRAGGLERD, "--config", config, "--grpc-address", "127.0.0.1:0",
                   "--http-address", "127.0.0.1:0", "--etcd-endpoints", etcd, "--ready-file",
                   ready},
                  dir + "/" + id);
  REQUIRE(r.child.pid > 0);
  const bool up = PollUntil(20s, [&] { return std::filesystem::exists(ready); });
  INFO(Slurp(r.child.err));
  REQUIRE(up);
  const std::string text = Slurp(ready);
  const std::string key = "\"grpc_address\":\"";
  const size_t at = text.find(key);
  REQUIRE(at != std::string::npos);
  r.grpc_address = text.substr(at + key.size(), text.find('"', at + key.size()) - at - key.size());
  return r;
}

TEST_CASE("rendezvous failover: a Gloo job builds its context across the SIGKILL of its owner "
          "process",
          "[cluster]") {
  auto etcd = RequireEtcd();
  const std::string dir = std::string(STRAGGLER_CLUSTER_TEST_DIR) + "/gloo-sigkill";
  std::filesystem::create_directories(dir);
  std::vector<ReplicaProcess> replicas = {StartReplica(etcd->endpoint(), "pa", dir),
                                          StartReplica(etcd->endpoint(), "pb", dir)};
  const std::string both = replicas[0].grpc_address + "," + replicas[1].grpc_address;
  ReplicaProcess* survivor = nullptr;
  GlooJobAcrossFailover(both, {"pa", "pb"}, etcd->endpoint(), "job-gloo-sigkill",
                        [&](const std::string& owner) {
                          ReplicaProcess& killed = replicas[owner == "pa" ? 0 : 1];
                          survivor = &replicas[owner == "pa" ? 1 : 0];
                          // No Leave: the job is free once its lease expires.
                          kill(killed.child.pid, SIGKILL);
                          CHECK(Finish(killed.child, 10s) == 128 + SIGKILL);
                        });
  REQUIRE(survivor != nullptr);
  kill(survivor->child.pid, SIGTERM);
  CHECK(Finish(survivor->child, 15s) == 0);
}

}  // namespace
}  // namespace straggler::daemon
