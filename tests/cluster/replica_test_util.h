// Shared by the tests of stragglerd replicas on a real etcd
// (replica_daemon_test.cc, replica_observe_test.cc): a replica's config,
// a hello and how it ended, the owner etcd holds for a job.
//
// Not thread-safe beyond what each function says; Catch2 assertions.
#pragma once

#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <string>

#include "cluster/etcd_client.h"
#include "config/config.h"
#include "daemon_test_util.h"
#include "server/redirect.h"
#include "straggler/v1/straggler.grpc.pb.h"

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

}  // namespace straggler::daemon::testutil
