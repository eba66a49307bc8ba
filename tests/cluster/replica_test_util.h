// Shared by the tests of stragglerd replicas (in-process daemons,
// tests/daemon's LoopbackDaemon) on a real etcd: a replica's config, two
// replicas, a hello and how it ended, the owner etcd holds for a job.
//
// Not thread-safe beyond what each function says; Catch2 assertions.
#pragma once

#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "cluster/etcd_client.h"
#include "config/config.h"
#include "daemon_test_util.h"
#include "server/redirect.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::daemon::testutil {

// The lease of a replica whose test never waits for one to expire (a stop
// revokes it).
inline constexpr int64_t kSteadyLeaseSeconds = 5;

// A replica of the cluster on `endpoint`, by default with the shortest lease
// etcd grants (its minimum is 1 s with the harness's settings). A test that
// never waits for a lease to expire asks for a longer one: a 1 s lease can
// expire on a loaded machine (renewals every 333 ms, 250 ms margin).
inline DaemonConfig ReplicaConfig(const std::string& endpoint, const std::string& id,
                                  int64_t lease_ttl_seconds = 1) {
  DaemonConfig c;
  c.cluster.etcd_endpoints = endpoint;
  c.cluster.replica_id = id;
  c.cluster.lease_ttl_seconds = lease_ttl_seconds;
  return c;
}

// Replicas "ra" and "rb" on one etcd with steady leases; either may be
// stopped gracefully (reset). Both(): their gRPC addresses, comma-separated.
struct TwoReplicas {
  explicit TwoReplicas(const std::string& endpoint)
      : a(std::make_unique<LoopbackDaemon>(ReplicaConfig(endpoint, "ra", kSteadyLeaseSeconds))),
        b(std::make_unique<LoopbackDaemon>(ReplicaConfig(endpoint, "rb", kSteadyLeaseSeconds))),
        both(a->server.grpc_dial_address() + "," + b->server.grpc_dial_address()) {}
  // The replica `id` names ("ra" or "rb").
  std::unique_ptr<LoopbackDaemon>& Named(const std::string& id) { return id == "ra" ? a : b; }

  std::unique_ptr<LoopbackDaemon> a;
  std::unique_ptr<LoopbackDaemon> b;
  const std::string both;
};

inline std::string Trailing(const grpc::ClientContext& ctx, const char* key) {
  const auto& md = ctx.GetServerTrailingMetadata();
  auto it = md.find(key);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// How one stream's hello ended: acknowledged, or refused with a redirect.
struct HelloResult {
  grpc::Status status;
  bool acked = false;
  std::string owner;     // trailing straggler-owner
  std::string owner_id;  // trailing straggler-owner-id
};

// A stream of ranks 0..3 of `job` saying hello with three iterations,
// half-closed at once and read to its end.
inline HelloResult SendHello(v1::IngestService::Stub& ingest, const std::string& job) {
  grpc::ClientContext ctx;
  auto stream = ingest.Stream(&ctx);
  v1::ReportBatch b = Hello(job, 4, {0, 1, 2, 3});
  AddRows(b, 1, 3);
  b.set_sequence(1);
  stream->Write(b);
  stream->WritesDone();
  HelloResult r;
  v1::Directive d;
  while (stream->Read(&d)) r.acked = r.acked || d.acked_sequence() == 1;
  r.status = stream->Finish();
  r.owner = Trailing(ctx, kOwnerGrpcMetadata);
  r.owner_id = Trailing(ctx, kOwnerIdMetadata);
  return r;
}

inline std::string OwnerKeyValue(const std::string& endpoint, const std::string& job) {
  auto etcd = cluster::EtcdClient::Connect({.endpoints = endpoint});
  REQUIRE(etcd.ok());
  auto r = (*etcd)->Get("/stragglerd/owners/" + job);
  REQUIRE(r.ok());
  return r->kvs.empty() ? std::string() : r->kvs[0].value;
}

// Ranks 0..3 of `job` say hello to `replica` (which takes the job when
// nobody owns it) with three iterations; the stream ends, the job stays.
inline void TakeWithHello(LoopbackDaemon& replica, const std::string& job) {
  const HelloResult r = SendHello(*replica.ingest, job);
  REQUIRE(r.status.ok());
  REQUIRE(r.acked);
}

}  // namespace straggler::daemon::testutil
