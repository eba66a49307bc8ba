// The daemon's side of a cluster of replicas on etcd (issue 30,
// docs/cluster.md): with cluster.etcd_endpoints set, the Server makes one,
// joins once it listens, and every job-scoped call asks it whether this
// replica serves the job. Without it nothing here exists and the daemon runs
// alone.
//
//   auto member = ClusterMember::Create(config.cluster);   // connects, joins nothing yet
//   ... bind the servers ...
//   (*member)->Join(grpc_address, http_address);          // registers, watches owners
//   absl::Status s = (*member)->Serve(job_id, /*take=*/true);  // a hello: take if free
//   if (!s.ok()) ...  // UNAVAILABLE; with the owner attached (redirect.h) when another owns it
//
// What it promises:
//   * Serve is OK only for a job this replica owns in etcd (taking it when
//     nobody does and `take` is set), and only while MayDecide();
//   * MayDecide() is false before the replica's lease could expire in etcd
//     (cluster::Replica's local deadline), after Leave(), and before Join;
//     callers must not change a membership while it is false;
//   * a job whose owner went (its lease expired or was revoked, as the watch
//     saw) is taken by this replica at once when etcd lets it (every replica
//     tries; the create-if-absent transaction picks one), not only when its
//     clients come back: the job has a new owner within about the TTL of
//     its old owner's last renewal, whatever the clients' backoff;
//   * TakeLostJobs() hands back, once each, the jobs it served whose
//     ownership key is gone or another's (the watch saw it), so the caller
//     stops serving and exporting them;
//   * as the registry's SharedJobState, a job's membership is written to
//     jobs/<job>/membership only by a fenced write under the job's claim:
//     never after another replica took the job.
//
// Thread safety: thread-safe; every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "cluster/ownership.h"
#include "config/config.h"
#include "metrics/cluster_metrics.h"
#include "registry/shared_state.h"
#include "server/redirect.h"

namespace straggler::cluster {
class ClusterView;
}  // namespace straggler::cluster

namespace straggler::daemon {

class ClusterMember final : public SharedJobState {
 public:
  // Checks the config and opens the channel to etcd (no call yet).
  // INVALID_ARGUMENT names a bad endpoint, id or prefix.
  static absl::StatusOr<std::unique_ptr<ClusterMember>> Create(const ClusterConfig& config);
  ~ClusterMember() override;

  // Registers this replica with the addresses it listens on (host:port with
  // the real ports; cluster.advertise_* override them, a wildcard host
  // becomes this host's name) and starts watching the cluster. A previous
  // run of the same id still registered is waited out (at most two TTLs).
  // UNAVAILABLE when etcd cannot be reached, naming it.
  absl::Status Join(const std::string& grpc_address, const std::string& http_address);

  // Whether this replica serves `job_id` now (see above). Refusals are
  // UNAVAILABLE: owned by another replica (the owner attached, redirect.h),
  // or this replica may not decide (not joined, leaving, lease not renewed
  // in time), or etcd could not be asked. An invalid job id is
  // INVALID_ARGUMENT naming it.
  absl::Status Serve(absl::string_view job_id, bool take);

  bool MayDecide() const;
  // OK while MayDecide(); else UNAVAILABLE saying why, naming `job_id`.
  absl::Status CheckMayDecide(absl::string_view job_id) const;

  // From the tick: the jobs served here whose ownership this replica lost
  // (its key gone or another's, as the watch saw it; every job when etcd
  // said the lease is gone), each with the status to close its streams with
  // (a redirect when the new owner is known). Forgets them. Also restarts a
  // view that etcd cancelled and joins again under a new lease when the old
  // one is gone (etcd round trips made under the member's lock: Serve waits
  // for them meanwhile, which is rare and bounded by the calls' timeouts).
  std::vector<std::pair<std::string, absl::Status>> TakeLostJobs();

  // Stops serving for good (Serve refuses, MayDecide false) and revokes the
  // lease: every job this replica owned is free at once.
  void Leave();

  // SharedJobState: the job's state as a straggler.v1.Job (job_id, run_id,
  // world_size, membership) in etcd under jobs/<job>/membership.
  // SaveMembership: FAILED_PRECONDITION when the job is not this replica's
  // (never taken, or taken over since), UNAVAILABLE past the lease's local
  // deadline or when etcd cannot be reached.
  absl::Status SaveMembership(const v1::Job& state) override;
  absl::StatusOr<std::optional<v1::Job>> LoadMembership(const std::string& job_id) override;
  // The job's admin policy and overrides under jobs/<job>/admin
  // (server/cluster_state.cc); SaveAdmin fails as SaveMembership does.
  absl::Status SaveAdmin(const std::string& job_id, const SharedAdminState& state) override;
  absl::StatusOr<std::optional<SharedAdminState>> LoadAdmin(const std::string& job_id) override;

  // The rendezvous store at a failover (docs/cluster.md, "The rendezvous
  // store at a failover"): each key a job's owner sets is first written to
  // jobs/<job>/rendezvous/<key> under the job's fence, on an etcd lease of
  // the key's TTL (etcd deletes it when it expires); errors as
  // SaveMembership's. A replica that takes a job calls `on_take` (set once,
  // before Join) before it serves the job, so the job's keys are loaded
  // before any call is answered.
  absl::Status SaveRendezvousKey(const std::string& job_id, const std::string& key,
                                 const std::string& value, std::chrono::milliseconds ttl);
  struct RendezvousEntry {
    std::string key;
    std::string value;
    std::chrono::milliseconds ttl;  // left in etcd
  };
  absl::StatusOr<std::vector<RendezvousEntry>> LoadRendezvousKeys(const std::string& job_id);
  void SetOnTake(std::function<void(const std::string& job_id)> on_take);

  const std::string& replica_id() const { return id_; }
  // Jobs this replica took because their owner went (not from a client).
  uint64_t jobs_adopted() const { return adopted_.load(std::memory_order_relaxed); }
  // The granted lease TTL (0 before Join).
  int64_t ttl_seconds() const;
  // Jobs served here, ascending.
  std::vector<std::string> OwnedJobs() const;
  // For queries on any replica (api/query_forward.h): the job's owner when
  // the view names another replica with known addresses (nullopt when this
  // replica or nobody owns it, or before Join); every other registered
  // replica; this replica as it registered (empty before Join).
  std::optional<OwnerAddress> OwnerElsewhere(absl::string_view job_id) const;
  std::vector<OwnerAddress> OtherReplicas() const;
  OwnerAddress Self() const;
  // This replica's numbers for /metrics (docs/metrics.md, "Cluster metrics").
  ClusterMetrics Metrics() const;

 private:
  ClusterMember(std::shared_ptr<cluster::EtcdClient> etcd, ClusterConfig config, std::string id);
  absl::Status JoinLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE for `job_id`, owned by `owner_id`, with its addresses when
  // the view knows them.
  absl::Status Redirect(absl::string_view job_id, const std::string& owner_id) const;
  // The view's watch: jobs whose owner went, queued for the adopter thread
  // (the watch's thread must not wait on mu_: TakeLostJobs destroys views
  // under it).
  void NoteOrphans(std::vector<std::string> jobs);
  // The adopter thread: takes each queued job (Serve with take).
  void AdoptLoop();
  absl::StatusOr<std::unique_ptr<cluster::ClusterView>> StartView();
  // The replica and the job's claim, for a fenced write about `job_id`:
  // UNAVAILABLE when not serving, FAILED_PRECONDITION when not the owner.
  absl::StatusOr<std::pair<std::shared_ptr<cluster::Replica>, cluster::JobClaim>> ClaimFor(
      const std::string& job_id) const;
  // The replica joined now (null before Join and while joining again).
  std::shared_ptr<cluster::Replica> CurrentReplica() const;

  const std::shared_ptr<cluster::EtcdClient> etcd_;
  const ClusterConfig config_;
  // cluster.replica_id, or the default Join makes before any replica_
  // exists; read without mu_ only after replica_ was seen set.
  std::string id_;

  mutable absl::Mutex mu_;
  std::string grpc_address_ ABSL_GUARDED_BY(mu_);  // as registered
  std::string http_address_ ABSL_GUARDED_BY(mu_);
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  // Replaced (never destroyed while a Serve uses it: shared) on a re-join.
  std::shared_ptr<cluster::Replica> replica_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<cluster::ClusterView> view_ ABSL_GUARDED_BY(mu_);
  // Jobs served here: their claims (the fencing token of later writes).
  std::map<std::string, cluster::JobClaim, std::less<>> claims_ ABSL_GUARDED_BY(mu_);

  absl::Mutex orphans_mu_;
  std::vector<std::string> orphans_ ABSL_GUARDED_BY(orphans_mu_);
  bool stop_adopting_ ABSL_GUARDED_BY(orphans_mu_) = false;
  std::atomic<uint64_t> adopted_{0};
  std::thread adopter_;  // started by the first Join
  // Ownership changes since start (ClusterMetrics::jobs_taken, jobs_lost).
  uint64_t jobs_taken_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t jobs_lost_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const std::string&)> on_take_;  // set before Join
  // The etcd lease of recent rendezvous keys per (job, TTL in seconds),
  // reused for a second: one grant per context build, not one per key.
  struct RecentLease {
    int64_t id = 0;
    std::chrono::steady_clock::time_point granted;
  };
  std::map<std::pair<std::string, int64_t>, RecentLease> rendezvous_leases_ ABSL_GUARDED_BY(mu_);
};

}  // namespace straggler::daemon
