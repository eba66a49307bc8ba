// A replica's numbers for /metrics when it is one of a cluster on etcd
// (docs/cluster.md, docs/metrics.md "Cluster metrics"): taken by
// ClusterMember::Metrics() at scrape time, written by DaemonCollector as the
// straggler_cluster_* families. Without --etcd-endpoints there is none, and
// none of those families is exported.
//
// A plain value; `etcd` points into the replica's etcd client, which
// outlives the scrape that reads it.
#pragma once

#include <cstdint>
#include <string>

namespace straggler::cluster {
class EtcdStats;
}  // namespace straggler::cluster

namespace straggler::daemon {

struct ClusterMetrics {
  std::string replica_id;
  // Replicas registered in etcd, as this replica's view sees them.
  uint64_t replicas = 0;
  // Jobs this replica owns (holds the ownership key of) now.
  uint64_t jobs_owned = 0;
  // Ownership changes seen by this replica since it started: jobs it took,
  // and jobs it lost while alive (another replica owns them, or etcd freed
  // them: its lease expired). A graceful leave is not a loss.
  uint64_t jobs_taken = 0;
  uint64_t jobs_lost = 0;
  // ClusterMember::MayDecide(): its lease renewed in time.
  bool may_decide = false;
  const cluster::EtcdStats* etcd = nullptr;
};

}  // namespace straggler::daemon
