// What an EtcdClient and its streams count, for /metrics (issue 30: etcd
// round-trip latency and errors; not exported yet, docs/cluster.md).
//
//   const EtcdStats& s = etcd->stats();
//   s.calls(); s.errors(); s.round_trip_seconds().Collect();
//
// Thread safety: thread-safe; recording is lock-free.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "straggler/common/atomic_histogram.h"

namespace straggler::cluster {

class EtcdStats {
 public:
  EtcdStats();
  // One round trip to etcd: a unary call (ok: gRPC's status; a transaction
  // whose compares fail is ok) or a lease renewal.
  void Record(std::chrono::steady_clock::duration round_trip, bool ok);
  // A keep-alive or watch stream that broke (it is reopened).
  void StreamBroken() { streams_broken_.fetch_add(1, std::memory_order_relaxed); }

  uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  uint64_t errors() const { return errors_.load(std::memory_order_relaxed); }
  uint64_t streams_broken() const { return streams_broken_.load(std::memory_order_relaxed); }
  // Seconds, successful round trips only (a failed one's time says how
  // long etcd took to be found missing, not how fast it answers).
  const common::AtomicHistogram& round_trip_seconds() const { return round_trip_; }

 private:
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> streams_broken_{0};
  common::AtomicHistogram round_trip_;
};

}  // namespace straggler::cluster
