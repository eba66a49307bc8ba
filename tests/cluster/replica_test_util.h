// What the cluster tests share about stragglerd replicas (in-process
// daemons, tests/daemon's LoopbackDaemon) on a real etcd.
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "config/config.h"
#include "daemon_test_util.h"

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

// Ranks 0..3 of `job` say hello to `replica` (which takes the job when
// nobody owns it) with three iterations; the stream ends, the job stays.
inline void TakeWithHello(LoopbackDaemon& replica, const std::string& job) {
  grpc::ClientContext ctx;
  auto stream = replica.ingest->Stream(&ctx);
  v1::ReportBatch b = Hello(job, 4, {0, 1, 2, 3});
  AddRows(b, 1, 3);
  b.set_sequence(1);
  REQUIRE(stream->Write(b));
  stream->WritesDone();
  v1::Directive d;
  bool acked = false;
  while (stream->Read(&d)) acked = acked || d.acked_sequence() == 1;
  REQUIRE(stream->Finish().ok());
  REQUIRE(acked);
}

}  // namespace straggler::daemon::testutil
