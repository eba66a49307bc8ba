// Topology against the real daemon over gRPC and HTTP (docs/topology.md):
// a hello's declared peer groups and replicas show in GetWorker/ListWorkers,
// REST and /metrics; a bad claim is refused for that rank only, with a
// message naming the rank and value, counted by reason, nothing else lost;
// one incarnation cannot change its topology, a new one can.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <google/protobuf/util/json_util.h>

#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "daemon_test_util.h"
#include "ingest/rank_topology.h"

namespace straggler::daemon {
namespace {

using testutil::AddReport;
using testutil::Hello;
using testutil::LoopbackDaemon;
using testutil::OpenStream;
using testutil::WorkerOf;

void Declare(v1::ReportBatch& b, uint32_t rank, uint64_t incarnation, const std::string& group,
             std::optional<uint32_t> replica) {
  v1::RankDevice* d = b.mutable_hello()->add_devices();
  d->set_rank(rank);
  d->set_incarnation(incarnation);
  d->set_peer_group(group);
  if (replica) d->set_replica(*replica);
}

std::string HttpGet(LoopbackDaemon& d, const std::string& path) {
  httplib::Client http("127.0.0.1", d.server.http_port());
  auto res = http.Get(path);
  REQUIRE(res);
  REQUIRE(res->status == 200);
  return res->body;
}

std::vector<std::string> Rejections(const v1::Directive& ack, const std::string& reason) {
  std::vector<std::string> out;
  for (const auto& r : ack.rejections())
    if (r.reason() == reason) out.push_back(r.message());
  return out;
}

}  // namespace

TEST_CASE("topology: RankTopologies checks claims and keeps one per incarnation", "[topology]") {
  engine::JobEngine e(8, engine::PolicyConfig{}, engine::Time(0));
  RankTopologies t(e, 8);
  auto claim = [](uint32_t rank, uint64_t inc, std::string g, std::optional<uint32_t> rep) {
    return TopologyClaim{rank, inc, DeclaredTopology{std::move(g), rep, ""}};
  };
  auto refused = t.Apply({claim(0, 1, "stage0", 0), claim(1, 2, "stage1", 0),
                          claim(2, 3, "stage 1", 1), claim(3, 4, "stage1", 8),
                          claim(4, 5, std::string(65, 'g'), 1), claim(6, 6, "stage0", 3)},
                         {4, 3, 2, 1, 0});  // rank 6 is not a rank of this hello
  REQUIRE(refused.size() == 3);
  CHECK(refused[0].rank == 2);
  CHECK(refused[0].reason == TopologyRefuseReason::kInvalidPeerGroup);
  CHECK(refused[0].message ==
        "rank 2: peer_group 'stage 1' has ' ' at byte 5; allowed: A-Z a-z 0-9 . _ -");
  CHECK(refused[1].reason == TopologyRefuseReason::kReplicaOutOfRange);
  CHECK(refused[1].message == "rank 3: replica=8 >= world_size=8");
  CHECK(refused[2].message.find("is 65 bytes; at most 64") != std::string::npos);
  CHECK(t.Of(0) == DeclaredTopology{"stage0", 0, ""});
  CHECK(t.Of(2) == DeclaredTopology{});  // refused: still the default
  CHECK(t.Of(6) == DeclaredTopology{});

  // Same incarnation, same answer: fine; another answer: refused, kept.
  CHECK(t.Apply({claim(0, 1, "stage0", 0)}, {0}).empty());
  refused = t.Apply({claim(0, 1, "stage1", 0)}, {0});
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].reason == TopologyRefuseReason::kChanged);
  CHECK(refused[0].message.find("rank 0: peer_group 'stage1' replica 0 differs from the "
                                "peer_group 'stage0' replica 0") == 0);
  CHECK(t.Of(0).peer_group == "stage0");
  // Dropping the replica is a change too.
  CHECK(t.Apply({claim(0, 1, "stage0", std::nullopt)}, {0}).size() == 1);
  // A new client process for the rank may say something else.
  CHECK(t.Apply({claim(0, 9, "stage1", std::nullopt)}, {0}).empty());
  CHECK(t.Of(0) == DeclaredTopology{"stage1", std::nullopt, ""});

  // The GPU model: printable ASCII up to 96 bytes, part of what one
  // incarnation cannot change.
  TopologyClaim h100{5, 20, DeclaredTopology{"stage0", 1, "NVIDIA H100 80GB HBM3"}};
  CHECK(t.Apply({h100}, {5}).empty());
  CHECK(t.Of(5).gpu_model == "NVIDIA H100 80GB HBM3");
  TopologyClaim a100 = h100;
  a100.topology.gpu_model = "NVIDIA A100-SXM4-80GB";
  refused = t.Apply({a100}, {5});
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].reason == TopologyRefuseReason::kChanged);
  CHECK(refused[0].message.find("gpu_model 'NVIDIA A100-SXM4-80GB' differs") !=
        std::string::npos);
  TopologyClaim bad{7, 21, DeclaredTopology{"", std::nullopt, "H100\x01"}};
  refused = t.Apply({bad}, {7});
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].reason == TopologyRefuseReason::kInvalidGpuModel);
  CHECK(refused[0].message.find("rank 7: gpu_model 'H100") == 0);
  CHECK(refused[0].message.find("' has byte 0x01 at 4; allowed: printable ASCII") !=
        std::string::npos);
  bad.topology.gpu_model = std::string(97, 'm');
  refused = t.Apply({bad}, {7});
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].message.find("is 97 bytes; at most 96") != std::string::npos);
  CHECK(t.Of(7) == DeclaredTopology{});
}

TEST_CASE("topology: declared topology shows in gRPC, REST and metrics, bad claims are "
          "refused for their rank only",
          "[topology]") {
  LoopbackDaemon d({}, spdlog::level::err);
  const std::string job = "topo-job";
  // 4 ranks: 2 replicas x 2 stages; rank 3 says nothing (default group, own
  // replica) in the first stream.
  v1::ReportBatch b = Hello(job, 4, {0, 1, 2});
  Declare(b, 0, 11, "stage0", 0);
  b.mutable_hello()->mutable_devices(0)->set_gpu_model("NVIDIA H100 80GB HBM3");
  Declare(b, 1, 12, "stage1", 0);
  Declare(b, 2, 13, "stage 0", 1);  // refused: a space
  for (uint32_t r : {0u, 1u, 2u}) AddReport(b, r, 1, 0.1);
  OpenStream stream(*d.ingest);
  v1::Directive ack = stream.Send(b, 1);
  CHECK(ack.accepted() == 3);  // nothing else of the hello is lost
  CHECK(ack.rejected() == 0);  // a refused claim is not a rejected report
  const auto refused = Rejections(ack, "invalid_topology");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0] ==
        "rank 2: peer_group 'stage 0' has ' ' at byte 5; allowed: A-Z a-z 0-9 . _ -");

  v1::Worker w0 = WorkerOf(*d.query, job, 0);
  CHECK(w0.peer_group() == "stage0");
  REQUIRE(w0.has_replica());
  CHECK(w0.replica() == 0);
  CHECK(w0.gpu_model() == "NVIDIA H100 80GB HBM3");
  CHECK(WorkerOf(*d.query, job, 1).gpu_model().empty());
  CHECK(HttpGet(d, "/v1/jobs/" + job + "/workers/0").find(
            "\"gpuModel\":\"NVIDIA H100 80GB HBM3\"") != std::string::npos);
  CHECK(WorkerOf(*d.query, job, 1).peer_group() == "stage1");
  v1::Worker w2 = WorkerOf(*d.query, job, 2);
  CHECK(w2.peer_group().empty());
  CHECK_FALSE(w2.has_replica());
  CHECK(w2.reports_total() == 1);

  // REST: the same fields, proto3 JSON.
  const std::string body = HttpGet(d, "/v1/jobs/" + job + "/workers/1");
  v1::Worker rest;
  REQUIRE(google::protobuf::util::JsonStringToMessage(body, &rest).ok());
  CHECK(rest.peer_group() == "stage1");
  REQUIRE(rest.has_replica());
  CHECK(rest.replica() == 0);
  CHECK(body.find("\"peerGroup\":\"stage1\"") != std::string::npos);

  // A later hello on the same stream: the same incarnation changing its
  // group is refused; a new incarnation (a restarted trainer) may.
  v1::ReportBatch later = Hello(job, 4, {0, 1});
  Declare(later, 0, 11, "stage1", 0);  // same incarnation, another group
  Declare(later, 1, 99, "stage0", 1);  // a new process for rank 1
  ack = stream.Send(later, 2);
  const auto changed = Rejections(ack, "invalid_topology");
  REQUIRE(changed.size() == 1);
  // Rank 0 declared its GPU model in the first hello: the refusal names all
  // it declared then.
  CHECK(changed[0].find("rank 0: peer_group 'stage1' replica 0 differs from the peer_group "
                        "'stage0' replica 0 gpu_model 'NVIDIA H100 80GB HBM3' its client "
                        "process declared before") == 0);
  CHECK(WorkerOf(*d.query, job, 0).peer_group() == "stage0");
  v1::Worker w1 = WorkerOf(*d.query, job, 1);
  CHECK(w1.peer_group() == "stage0");
  CHECK(w1.replica() == 1);

  // A replica beyond the world, on a stream of its own.
  v1::ReportBatch other = Hello(job, 4, {3});
  Declare(other, 3, 14, "stage1", 4);
  AddReport(other, 3, 1, 0.1);
  OpenStream stream3(*d.ingest);
  ack = stream3.Send(other, 1);
  CHECK(ack.accepted() == 1);
  REQUIRE(Rejections(ack, "invalid_topology") ==
          std::vector<std::string>{"rank 3: replica=4 >= world_size=4"});

  // Metrics: per-rank families carry peer_group and replica; refusals by reason.
  const std::string metrics = HttpGet(d, "/metrics");
  CHECK(metrics.find("straggler_rank_compute_seconds{job=\"topo-job\",rank=\"1\",node=\"test-node\","
                     "peer_group=\"stage0\",replica=\"1\"}") != std::string::npos);
  CHECK(metrics.find("straggler_rank_compute_seconds{job=\"topo-job\",rank=\"3\",node=\"test-node\","
                     "peer_group=\"\",replica=\"\"}") != std::string::npos);
  CHECK(metrics.find("straggler_topology_refused_total{reason=\"invalid_peer_group\"} 1") !=
        std::string::npos);
  CHECK(metrics.find("straggler_topology_refused_total{reason=\"replica_out_of_range\"} 1") !=
        std::string::npos);
  CHECK(metrics.find(
            "straggler_topology_refused_total{reason=\"changed_without_new_incarnation\"} 1") !=
        std::string::npos);

  CHECK(stream3.Close().ok());
  CHECK(stream.Close().ok());
}

}  // namespace straggler::daemon
