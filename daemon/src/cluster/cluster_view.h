// Every replica's view of the cluster (issue 30, docs/cluster.md): which
// replicas are registered with which addresses, and which replica owns each
// job, kept in memory from etcd by one read and a watch from the revision
// after it. What a replica needs to redirect a client to a job's owner and
// to notice that a job lost its owner, without a read from etcd per call.
//
//   auto view = ClusterView::Start(etcd, "/stragglerd/");
//   if (auto owner = (*view)->OwnerOf("job-a")) {  // a replica id
//     std::optional<ReplicaInfo> r = (*view)->ReplicaById(*owner);  // its addresses
//   }
//
// The view lags etcd by the watch's delay (milliseconds on a LAN); it is a
// hint for routing, never the fence: ownership is decided by Replica's
// transactions alone. When etcd cancels the watch (its revision compacted
// away), Status() turns non-OK and the view stops changing: start a new one.
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "cluster/etcd_client.h"
#include "cluster/ownership.h"

namespace straggler::cluster {

class ClusterView {
 public:
  // Jobs whose owner went: their ownership key deleted while the replica
  // it named is no longer registered (its lease expired or was revoked:
  // etcd deletes a lease's keys in one revision). Called on the watch's
  // thread, after the view applied the batch, outside the view's lock; it
  // must not destroy the view.
  using OnOwnersGone = std::function<void(std::vector<std::string> jobs)>;

  // Reads replicas/ and owners/ under `prefix` (one Range of the prefix) and
  // watches the prefix from the revision after that read. `owners_gone`
  // (may be empty) hears of the jobs whose owner went, from the watch only.
  static absl::StatusOr<std::unique_ptr<ClusterView>> Start(std::shared_ptr<EtcdClient> etcd,
                                                            std::string prefix,
                                                            OnOwnersGone owners_gone = {});
  ~ClusterView();

  // The owning replica's id; nullopt when the job has no owner.
  std::optional<std::string> OwnerOf(absl::string_view job_id) const;
  std::optional<ReplicaInfo> ReplicaById(absl::string_view replica_id) const;
  // Ordered by id.
  std::vector<ReplicaInfo> Replicas() const;
  // Job id -> owning replica id, ordered by job id.
  std::map<std::string, std::string> Owners() const;
  // The etcd revision the view reflects.
  int64_t Revision() const;
  // OK while the watch runs or resumes; why it ended otherwise.
  absl::Status Status() const;

 private:
  explicit ClusterView(std::string prefix) : prefix_(std::move(prefix)) {}
  // Applies one key's state at `revision`: `kv` with a value, or deleted.
  // A deleted ownership key adds (job, its owner) to `gone` when given.
  void ApplyLocked(const KeyValue& kv, bool deleted,
                   std::vector<std::pair<std::string, std::string>>* gone = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string prefix_;
  mutable absl::Mutex mu_;
  std::map<std::string, ReplicaInfo, std::less<>> replicas_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string, std::less<>> owners_ ABSL_GUARDED_BY(mu_);
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Last: destroyed first, so no callback runs on a half-destroyed view.
  std::unique_ptr<Watch> watch_;
};

}  // namespace straggler::cluster
