// stragglerd's HTTP front end (cpp-httplib): Prometheus /metrics, /healthz,
// /readyz and the REST API under /v1/, which calls the same query/admin core
// as gRPC (api.h) and speaks the proto3 JSON mapping of the same messages.
//
//   HttpServer http(registry, stats, auth);
//   if (absl::Status s = http.Start(config, &tls); !s.ok()) ...;   // binds, serves
//   http.SetPhase(HttpServer::Phase::kServing);               // /readyz 200
//   http.SetPhase(HttpServer::Phase::kDraining);              // /readyz, /v1: 503
//   http.Stop();
//
// Routes (docs/api.md#rest is the reference):
//   GET  /metrics /healthz /readyz, and the web console: / and /console/* (console/console.h)
//   GET  /v1/jobs  /v1/jobs/{job}  /v1/jobs/{job}/workers  /v1/jobs/{job}/workers/{rank}
//        /v1/jobs/{job}/membership  /v1/jobs/{job}/events  /v1/events
//   PUT  /v1/jobs/{job}/policy  /v1/jobs/{job}/workers/{rank}/override
//   POST /v1/jobs/{job}/reset
// Errors are {"code":"NOT_FOUND","message":"job 'x' not found"} with the HTTP
// status of HttpStatusFor(code); 405 carries an Allow header, 401 (a missing
// or wrong bearer token, auth.h) a WWW-Authenticate header. Routing and
// parameter parsing are rest_route.h's; this file serves what it decides.
//
// Requests are served by http.threads worker threads, each once it has
// arrived whole: one listener thread receives every connection's bytes, so
// slow or idle connections hold no worker. A request must arrive, and its
// response be taken, within http.read/write_timeout_seconds (http_deadline.h). Thread-safe: Start and Stop once each, from one thread;
// SetPhase from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "config/config.h"
#include "api/rest_route.h"  // HttpStatusFor, DecodePathSegment

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace straggler::common {
struct ServerTls;
}  // namespace straggler::common

namespace straggler::daemon {

class Authorizer;
class ClusterMember;
class JobRegistry;
class QueryForwarder;
struct DaemonStats;

class HttpServer {
 public:
  enum class Phase { kStarting, kServing, kDraining };

  // `auth` decides which requests need the bearer token; it must outlive
  // this, as must `cluster` and `forwarder` (null: the daemon runs alone).
  // With them the REST reads answer for every job of the cluster
  // (api/query_forward.h), and a REST change of a job another replica owns
  // is answered 307 to the owner's HTTP address (docs/api.md, "Replicas").
  HttpServer(JobRegistry& registry, DaemonStats& stats, const Authorizer& auth,
             ClusterMember* cluster = nullptr, const QueryForwarder* forwarder = nullptr);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds config.http_address (port 0 picks a free port) with config.http's
  // limits and starts serving on its own thread; over TLS (HTTPS) when `tls`
  // is given (LoadServerTls; with a client CA, mutual TLS; certificate files
  // renewed in place serve new connections after tls.reload_seconds).
  absl::Status Start(const DaemonConfig& config, const common::ServerTls* tls = nullptr);
  // Stops accepting, closes idle keep-alive connections, joins the threads
  // (requests in progress finish first).
  void Stop();

  void SetPhase(Phase phase) { phase_.store(phase); }
  Phase phase() const { return phase_.load(); }

  int port() const { return port_; }
  // host:port as configured, with the real port.
  const std::string& address() const { return address_; }
  // An address a local client can dial: wildcard hosts become 127.0.0.1.
  std::string dial_address() const;

 private:
  void Handle(const httplib::Request& req, httplib::Response& res);
  // OK when this replica answers `route` (alone, its own job, a job nobody
  // owns); else why not: a redirect (redirect.h) or UNAVAILABLE.
  absl::Status RouteInCluster(const RouteMatch& route) const;

  JobRegistry& registry_;
  DaemonStats& stats_;
  const Authorizer& auth_;
  ClusterMember* const cluster_;
  const QueryForwarder* const forwarder_;
  bool https_ = false;  // the scheme of a redirect's Location (replicas share the TLS setting)
  std::atomic<Phase> phase_{Phase::kStarting};
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string address_;
  int port_ = 0;
};

}  // namespace straggler::daemon
