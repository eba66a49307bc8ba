#include "cluster/etcd_stats.h"

namespace straggler::cluster {

// Buckets from 0.5 ms (an etcd on loopback) up to 2.5 s, past the default
// call timeout (2 s).
EtcdStats::EtcdStats()
    : round_trip_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void EtcdStats::Record(std::chrono::steady_clock::duration round_trip, bool ok) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  if (!ok) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  round_trip_.Observe(std::chrono::duration<double>(round_trip).count());
}

}  // namespace straggler::cluster
