// A stragglerd replica in a cluster on etcd, and the jobs it owns (issue 30;
// the design and the reasoning: docs/cluster.md). The primitive; nothing of the daemon
// here: the daemon's side is server/cluster_member.h.
//
//   auto etcd = EtcdClient::Connect({.endpoints = "127.0.0.1:2379"});
//   auto replica = Replica::Join(*std::move(etcd), {.id = "r1", .grpc_address = "10.0.0.1:50051",
//                                                   .http_address = "10.0.0.1:8080"});
//   auto claim = (*replica)->TakeJob("job-a");   // owned, or who owns it
//   if (claim.ok() && claim->owned) (*replica)->FencedPut(*claim, "membership", bytes);
//
// Keys, under Options::prefix (default "/stragglerd/"):
//   replicas/<replica id>  "grpc=<address> http=<address>", on the replica's lease
//   owners/<job id>        "<replica id>", on the owner's lease: the ownership key
//   jobs/<job id>/<name>   the job's state, written only by FencedPut
//
// A replica joins under one lease with a short TTL, renewed from a thread of
// its own; every ownership key it takes is on that lease, so when the
// replica dies (or loses etcd) all its keys go when the lease expires and
// other replicas may take its jobs. The guarantees:
//   * TakeJob creates the ownership key only if it is absent, in one etcd
//     transaction: at most one replica holds a job's key at any revision;
//   * FencedPut and Release write only if the ownership key is still the
//     very key the claim took (same create revision), on this replica's lease
//     and naming this replica: after a take-over the old owner's writes fail,
//     whatever the old owner believes;
//   * MayDecide() turns false before etcd could let the lease expire (the
//     local deadline), so decisions that are not etcd writes (a membership
//     pushed to clients) stop in time. TakeJob and FencedPut refuse past it.
//
// Thread safety: thread-safe; every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cluster/etcd_client.h"

namespace straggler::cluster {

struct ReplicaInfo {
  std::string id;
  std::string grpc_address;
  std::string http_address;
  int64_t lease = 0;
};

// Who holds a job, as one etcd read saw it. The fencing token of an owned
// job is (create_revision, lease).
struct JobClaim {
  std::string job_id;
  std::string owner;  // the holding replica's id; empty when nobody holds it
  bool owned = false;  // held by this replica on its current lease
  int64_t create_revision = 0;  // of the ownership key
  int64_t lease = 0;            // of the ownership key
};

// OK when `prefix` can be the cluster's key prefix (ends with '/'); else
// INVALID_ARGUMENT naming it. Replica::Join and ClusterView::Start check it.
absl::Status CheckKeyPrefix(absl::string_view prefix);

// A registration read back: `id` from the key, the addresses from `kv`'s
// value ("grpc=<address> http=<address>"), the lease from `kv`.
ReplicaInfo ParseRegistration(absl::string_view id, const KeyValue& kv);

class Replica {
 public:
  struct Options {
    std::string prefix = "/stragglerd/";  // must end with '/'
    std::string id;                       // job-id characters: A-Z a-z 0-9 . _ -
    std::string grpc_address;
    std::string http_address;
    // Requested; etcd raises a TTL below its minimum (ttl_seconds() is what
    // it granted). Failover takes up to the granted TTL.
    int64_t ttl_seconds = 3;
    // Taken off the lease's local deadline: covers the rate difference of
    // this host's and etcd's clocks and this process's own pauses between
    // checking MayDecide() and acting (docs/cluster.md, "Local deadline").
    std::chrono::milliseconds safety_margin{250};
  };

  // Grants the lease, starts renewing it and registers the replica. A
  // replica id already registered (another process, or this one's previous
  // run until its lease expires) is refused with ALREADY_EXISTS.
  static absl::StatusOr<std::unique_ptr<Replica>> Join(std::shared_ptr<EtcdClient> etcd,
                                                       Options options);
  // Stops renewing: the registration and ownership keys go when the lease
  // expires. Leave() removes them at once.
  ~Replica();

  // Revokes the lease: the registration and every ownership key go now.
  absl::Status Leave();

  const std::string& id() const { return options_.id; }
  int64_t lease_id() const { return lease_.id; }
  int64_t ttl_seconds() const { return lease_.ttl_seconds; }
  // Local time until which this replica may decide for its jobs: the
  // lease's local deadline less the safety margin.
  Clock::time_point DecideUntil() const;
  // Before DecideUntil(), and etcd has not said the lease is gone.
  bool MayDecide() const;
  // etcd said the lease is gone (it expired): this replica's registration and
  // every ownership key it held are gone for good; only a new Join serves.
  bool LeaseLost() const;
  // Why MayDecide() is false (UNAVAILABLE naming the replica and `what` it
  // cannot do); OK while it is true.
  absl::Status CheckMayDecide(absl::string_view what) const;

  // Every registered replica, this one included, ordered by id.
  absl::StatusOr<std::vector<ReplicaInfo>> Replicas() const;
  // Takes the job if nobody holds it; otherwise says who does (owned = true
  // when it is this replica on its current lease already).
  absl::StatusOr<JobClaim> TakeJob(absl::string_view job_id);
  absl::StatusOr<JobClaim> Owner(absl::string_view job_id) const;
  // Writes jobs/<job>/<name> if `claim` still holds (see above); otherwise
  // FAILED_PRECONDITION naming the job and its current owner. Returns the
  // store's revision after the write.
  absl::StatusOr<int64_t> FencedPut(const JobClaim& claim, absl::string_view name,
                                    absl::string_view value);
  // Writes jobs/<job>/<dir>/<key> (`key`: any bytes, '/' included) on etcd
  // lease `lease` (0: none, else etcd deletes it when that lease expires),
  // under the same fence and deadline as FencedPut.
  absl::StatusOr<int64_t> FencedPutEntry(const JobClaim& claim, absl::string_view dir,
                                         absl::string_view key, absl::string_view value,
                                         int64_t lease);
  // Deletes the ownership key if `claim` still holds.
  absl::Status Release(const JobClaim& claim);

  std::string OwnerKey(absl::string_view job_id) const;
  std::string OwnersPrefix() const { return options_.prefix + "owners/"; }
  std::string ReplicasPrefix() const { return options_.prefix + "replicas/"; }
  std::string JobKey(absl::string_view job_id, absl::string_view name) const;

 private:
  Replica(std::shared_ptr<EtcdClient> etcd, Options options, Lease lease);
  absl::Status Register();
  // The fence of a write for `claim`: its ownership key unchanged.
  absl::Status CheckClaim(const JobClaim& claim) const;
  std::vector<Compare> Fence(const JobClaim& claim) const;
  // FencedPut's and FencedPutEntry's write of `key`, `what` naming it.
  absl::StatusOr<int64_t> PutFenced(const JobClaim& claim, std::string key, absl::string_view what,
                                    absl::string_view value, int64_t lease);
  absl::Status FenceFailed(const JobClaim& claim, const TxnResult& result) const;

  const std::shared_ptr<EtcdClient> etcd_;
  const Options options_;
  const Lease lease_;
  const std::unique_ptr<LeaseKeeper> keeper_;
};

}  // namespace straggler::cluster
