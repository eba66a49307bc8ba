// What the cluster tests share about stragglerd replicas (in-process
// daemons, tests/daemon's LoopbackDaemon) on a real etcd.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "config/config.h"
#include "daemon_test_util.h"

namespace straggler::daemon::testutil {

// A replica of the cluster on `endpoint` with the shortest lease etcd grants
// (its minimum is 1 s with the harness's settings).
inline DaemonConfig ReplicaConfig(const std::string& endpoint, const std::string& id) {
  DaemonConfig c;
  c.cluster.etcd_endpoints = endpoint;
  c.cluster.replica_id = id;
  c.cluster.lease_ttl_seconds = 1;
  return c;
}

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
