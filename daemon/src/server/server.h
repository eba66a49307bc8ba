// The running daemon: gRPC server (ingest, query, admin, rendezvous, health,
// reflection),
// the HTTP server (/metrics, /healthz, /readyz, REST), the job registry and
// the once-a-second tick thread.
//
//   Server server;
//   if (absl::Status s = server.Start(config); !s.ok()) ...;
//   std::cout << server.grpc_port();          // the real port, also for port 0
//   std::cout << server.http_port();
//   server.Reload(new_config);                // SIGHUP
//   server.Shutdown(std::chrono::seconds(5)); // SIGTERM
//
// Thread-safe after Start: Reload and Shutdown may be called from any one
// thread (the signal thread in main.cc); Start and Shutdown once each.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/status/status.h"
#include "config/config.h"
#include "metrics/stats.h"

namespace grpc {
class ResourceQuota;
class Server;
}  // namespace grpc

namespace straggler::daemon {

// What gRPC's memory quota holds for each of limits.max_streams ingest
// streams (server.cc, GrpcMemoryQuota): 1.5 times what one stream on its own
// connection was measured to hold while a membership went to all of them.
inline constexpr size_t kGrpcStreamQuotaBytes = size_t{16} << 10;

class JobRegistry;
class IngestServiceImpl;
class QueryServiceImpl;
class AdminServiceImpl;
class Authorizer;
class RendezvousStore;
class RendezvousServiceImpl;
class HttpServer;
class Store;
class ClusterMember;
class QueryForwarder;

class Server {
 public:
  Server();
  ~Server();  // Shutdown(0s) when still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // With cluster.etcd_endpoints set, connects to etcd first (a bad endpoint:
  // FAILED_PRECONDITION) and, once both listeners are bound, joins the
  // replicas there with the addresses it listens on (etcd unreachable:
  // UNAVAILABLE naming it; docs/cluster.md). Without it nothing of the
  // cluster exists.
  // Opens the state database when persistence.path is set (and restores the
  // journal and jobs from it: JobRegistry::Restore; an error there is
  // FAILED_PRECONDITION naming the path), reads and checks the TLS files of
  // config.tls (LoadServerTls; FAILED_PRECONDITION naming the file), then
  // binds config.grpc_address, then config.http_address (port 0 picks a free
  // port), and starts serving; /readyz answers 200 once both are up.
  absl::Status Start(const DaemonConfig& config);

  // Applies a reloaded config: log level, limits, policies (see
  // JobRegistry::ApplyConfig), the bearer token and auth.protect_reads.
  // Addresses, http.* and tls.* need a restart; a change is logged as a
  // warning naming each key (RestartOnlyChanges).
  void Reload(const DaemonConfig& config);

  // OK when a SIGHUP may apply `next`:
  //  - the next restart would start with it as far as a reload can tell:
  //    its TLS files are readable, parse and belong together (a SIGHUP that
  //    accepted a missing certificate made the next restart fail);
  //  - it turns no security off (SecurityDowngrades against the config in
  //    force, the registry's) unless it sets security.allow_downgrade.
  // Otherwise FAILED_PRECONDITION naming the file or what would be turned
  // off; the reload must be refused (and CountReloadRejected called).
  absl::Status CheckReload(const DaemonConfig& next) const;

  // straggler_config_reloads_total{result="rejected"}: a SIGHUP whose config
  // was refused (main.cc, common::ServeUntilStopped). Reload counts "applied".
  void CountReloadRejected() {
    stats_.config_reloads_rejected.fetch_add(1, std::memory_order_relaxed);
  }

  // /readyz turns 503 (and REST answers 503) first; in a cluster the replica
  // stops deciding and leaves (its jobs are free for the other replicas at
  // once); then stops accepting gRPC,
  // tells every stream and watcher to go (UNAVAILABLE, so clients reconnect
  // elsewhere or later), waits up to `grace` for calls to end, cancels the
  // rest, joins the tick thread, and stops HTTP last (/metrics and /healthz
  // serve until then).
  void Shutdown(std::chrono::milliseconds grace);

  // Writes what the state database's queue holds and logs the counts (a
  // no-op without persistence). Shutdown does it once gRPC has stopped; a
  // drain that cannot finish (see stragglerd's main) calls it from another
  // thread while Shutdown is still waiting: safe, the Store serialises it.
  void FlushState();

  int grpc_port() const { return grpc_port_; }
  // host:port as configured, with the real port.
  const std::string& grpc_address() const { return grpc_address_; }
  // An address a local client can dial: wildcard hosts become 127.0.0.1.
  std::string grpc_dial_address() const;

  int http_port() const;
  const std::string& http_address() const;  // host:port with the real port
  std::string http_dial_address() const;

  JobRegistry& registry() { return *registry_; }
  RendezvousStore& rendezvous() { return *rendezvous_store_; }
  const DaemonStats& stats() const { return stats_; }
  const Store* store() const { return store_.get(); }  // null without persistence
  ClusterMember* cluster() { return cluster_.get(); }  // null without cluster.etcd_endpoints

 private:
  void TickLoop();

  DaemonStats stats_;
  // Before registry_: the registry writes into it until it is destroyed.
  std::unique_ptr<Store> store_;
  std::unique_ptr<Authorizer> auth_;  // before the services that hold a reference
  std::unique_ptr<ClusterMember> cluster_;  // likewise; null: alone
  std::unique_ptr<QueryForwarder> forwarder_;  // with cluster_: queries on any replica
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<IngestServiceImpl> ingest_;
  std::unique_ptr<QueryServiceImpl> query_;
  std::unique_ptr<AdminServiceImpl> admin_;
  // Declared before server_: held Waits reference the store until they end.
  std::unique_ptr<RendezvousStore> rendezvous_store_;
  std::unique_ptr<RendezvousServiceImpl> rendezvous_;
  // gRPC's memory quota; resized when a reload changes limits.max_streams.
  std::unique_ptr<grpc::ResourceQuota> quota_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;
  // The config Start ran with: restart-only keys keep these values.
  DaemonConfig started_config_;
  // The tick thread's: re-reads tls.cert_file's expiry every 60 ticks.
  void RefreshCertificateExpiry();
  int ticks_since_cert_check_ = 0;
  std::string grpc_address_;
  int grpc_port_ = 0;

  absl::Mutex tick_mu_;
  bool stopping_ ABSL_GUARDED_BY(tick_mu_) = false;
  std::thread tick_thread_;
};

}  // namespace straggler::daemon
