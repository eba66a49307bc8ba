// The config of one stragglerd replica in the cluster tests.
#pragma once

#include <string>

#include "config/config.h"

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

}  // namespace straggler::daemon::testutil
