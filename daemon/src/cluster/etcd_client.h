// A client of etcd's v3 gRPC API, the part stragglerd's replicas need (issue
// 30, docs/cluster.md): KV reads and writes, transactions with compares,
// leases kept alive over their stream, and watches of a key prefix.
//
//   auto etcd = EtcdClient::Connect({.endpoints = "127.0.0.1:2379"});
//   auto lease = (*etcd)->GrantLease(3);            // etcd may raise the TTL
//   auto keeper = (*etcd)->KeepAlive(*lease);       // renews from its own thread
//   TxnResult r = *(*etcd)->Txn({Compare::Absent("/k")}, {TxnOp::Put("/k", "v", lease->id)}, {});
//
// Every error names the endpoint and the call ("etcd 127.0.0.1:2379 Txn:
// ..."), with gRPC's code (UNAVAILABLE when etcd cannot be reached,
// DEADLINE_EXCEEDED past the call timeout). The generated etcd stubs stay in
// the .cc: nothing here includes them.
//
// Thread safety: EtcdClient is thread-safe (its gRPC stubs are); a
// LeaseKeeper's and a Watch's accessors may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cluster/etcd_stats.h"
#include "cluster/etcd_types.h"

namespace straggler::cluster {

class EtcdClient {
 public:
  struct Options {
    // The client URLs of etcd's members, comma-separated: host:port each,
    // an "http://" prefix accepted and dropped; several only as IP
    // addresses (one DNS name may hold a record per member), tried in
    // order. https: not yet.
    std::string endpoints;
    // Bound of each unary call and of a watch's creation.
    std::chrono::milliseconds call_timeout{2000};
  };

  // Checks the endpoint (a clear error naming it) and opens a channel; does
  // not wait for etcd to answer.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(Options options);
  virtual ~EtcdClient() = default;

  // The members as checked ("10.0.0.1:2379,10.0.0.2:2379"): what errors name.
  virtual const std::string& endpoint() const = 0;
  // Round trips and errors of this client's calls and of its keepers and
  // watches, for /metrics.
  virtual const EtcdStats& stats() const = 0;

  virtual absl::StatusOr<RangeResult> Get(absl::string_view key) = 0;
  virtual absl::StatusOr<RangeResult> GetPrefix(absl::string_view prefix) = 0;
  // The store's revision after the write.
  virtual absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value,
                                      int64_t lease = 0) = 0;
  // How many keys were deleted.
  virtual absl::StatusOr<int64_t> Delete(absl::string_view key) = 0;
  virtual absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) = 0;
  // Atomically: if every compare holds, the success ops, else the failure ops.
  virtual absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares,
                                        const std::vector<TxnOp>& success,
                                        const std::vector<TxnOp>& failure) = 0;
  // Drops the history before `revision`: a watch from an older revision is
  // canceled by etcd.
  virtual absl::Status Compact(int64_t revision) = 0;

  virtual absl::StatusOr<Lease> GrantLease(int64_t ttl_seconds) = 0;
  // Deletes the lease and every key attached to it.
  virtual absl::Status RevokeLease(int64_t id) = 0;
  virtual absl::StatusOr<LeaseStatus> TimeToLive(int64_t id) = 0;
  // Starts renewing `lease`; its Deadline() starts at lease.sent + TTL.
  virtual std::unique_ptr<LeaseKeeper> KeepAlive(const Lease& lease) = 0;

  // Watches every key under `prefix` from `start_revision` (inclusive; 0:
  // from now). Returns once etcd confirmed the watch, or an error.
  virtual absl::StatusOr<std::unique_ptr<Watch>> WatchPrefix(absl::string_view prefix,
                                                             int64_t start_revision,
                                                             Watch::OnEvents on_events,
                                                             Watch::OnEnd on_end) = 0;
};

}  // namespace straggler::cluster
