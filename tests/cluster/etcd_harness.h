// What the cluster tests run against: a real etcd (Debian's etcd-server)
// started as a child process on loopback, and a TCP proxy that can cut one
// client off from it, as a network partition would.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cluster/etcd_types.h"

namespace straggler::cluster::testing {

// One etcd member on 127.0.0.1 with free ports and a fresh data dir under
// STRAGGLER_CLUSTER_TEST_DIR (the build tree), tuned for short leases
// (heartbeat 50 ms, election 500 ms: etcd's minimum lease TTL is then 1 s).
// The destructor kills it and removes the data dir.
class EtcdProcess {
 public:
  // Starts etcd and waits (20 s at most) until it answers a read; the error
  // carries the tail of etcd's log.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start();
  ~EtcdProcess();

  // "127.0.0.1:<client port>".
  std::string endpoint() const;
  int client_port() const { return client_port_; }
  // SIGKILL, and waits for the exit.
  void Kill();
  // Starts it again on the same ports and data dir, waiting until it answers.
  absl::Status Restart();

 private:
  EtcdProcess(std::string dir, int client_port, int peer_port);
  absl::Status Spawn();
  absl::Status WaitReady();
  std::string Log() const;
  std::string LogTail() const;

  std::string dir_;
  int client_port_;
  int peer_port_;
  pid_t pid_ = -1;
  size_t log_start_ = 0;  // where this run's lines start in etcd.log
};

// Forwards 127.0.0.1:port() to an upstream port. Cut() drops every
// connection and refuses new ones (they are accepted and closed at once)
// until Heal(). Thread-safe.
class TcpProxy {
 public:
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(int upstream_port);
  ~TcpProxy();
  std::string endpoint() const;
  void Cut();
  void Heal();

 private:
  TcpProxy(int listen_fd, int port, int upstream_port);
  void AcceptLoop();
  void Pump(int from, int to);

  const int listen_fd_;
  const int port_;
  const int upstream_port_;
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  bool cut_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> open_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

// What a watch delivered, read by the test's thread while the watch's thread
// adds to it. Thread-safe.
class WatchRecorder {
 public:
  Watch::OnEvents OnEvents();
  Watch::OnEnd OnEnd();
  std::vector<WatchEvent> Events() const;
  std::vector<std::string> Values() const;  // each event's kv.value, in order
  std::vector<absl::Status> Ends() const;   // on_end's reasons
  // The revision given with each batch of events, in order.
  std::vector<int64_t> Revisions() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<WatchEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> ends_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> revisions_ ABSL_GUARDED_BY(mu_);
};

// A free TCP port on 127.0.0.1 (bound, read, released).
int FreePort();

// Calls `done` every 20 ms until it returns true or `limit` passes; true
// when it did.
bool PollUntil(std::chrono::milliseconds limit, const std::function<bool()>& done);

}  // namespace straggler::cluster::testing
