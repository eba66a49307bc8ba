#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api/admin_service.h"
#include "api/query_forward.h"
#include "auth/auth.h"
#include "http/http_server.h"
#include "ingest/ingest_service.h"
#include "registry/job_registry.h"
#include "api/query_service.h"
#include "rendezvous/rendezvous_service.h"
#include "rendezvous/rendezvous_store.h"
#include "server/cluster_member.h"
#include "spdlog/spdlog.h"
#include "persist/store.h"
#include "straggler/common/service_main.h"  // ApplyLogLevel
#include "straggler/common/tls.h"

namespace straggler::daemon {
namespace {

constexpr auto kTickInterval = std::chrono::seconds(1);

// gRPC's transport holds a whole message before its size is checked (chttp2
// grants the flow-control window for the length the 5-byte prefix announces),
// so without a bound every oversized message is buffered in full: 8 messages
// of 100 MB at once took the daemon from 22 MB to 609 MB (BENCHMARKS.md,
// "Oversized gRPC messages"). A ResourceQuota bounds the transport's buffers:
// above it gRPC cancels streams (RST_STREAM ENHANCE_YOUR_CALM, the client's
// call ends RESOURCE_EXHAUSTED) until it is back under. Room for several
// messages of the largest allowed size at once, and never below 32 MiB.
//
// Each open stream holds some of the quota too (its call's arena, its
// connection's read and write buffers): the 32 MiB quota cut idle streams
// (ENHANCE_YOUR_CALM, counted nowhere) from about 10 000 over 100
// connections, and held 3 000 but not 4 200 streams each on its own
// connection once a membership (1 000 excluded ranks) went to all of them
// (3 809 cut). So the quota is also at least limits.max_streams x
// kGrpcStreamQuotaBytes (16 KiB), and max_streams is what refuses a stream
// (RESOURCE_EXHAUSTED, counted as too_many_streams). The default 2048
// streams fill the 32 MiB floor exactly, so issue 15's bound on oversized
// messages is the same at the defaults (security:oversize_memory); a larger
// max_streams loosens it. Resized on reload (max_streams is reloadable).
constexpr size_t kMinGrpcMemoryQuota = size_t{32} << 20;
size_t GrpcMemoryQuota(uint32_t max_message_bytes, uint32_t max_streams) {
  return std::max({kMinGrpcMemoryQuota, size_t{4} * max_message_bytes,
                   size_t{max_streams} * kGrpcStreamQuotaBytes});
}

// Freed transport buffers stay in glibc's heaps (RSS did not come down after
// the refused messages were dropped): when resident memory grew by more than
// this since the last look, the tick hands free pages back (malloc_trim).
constexpr long kTrimGrowthBytes = long{8} << 20;
// ...and again on this many ticks after, for what was freed meanwhile.
constexpr int kTrimFollowUpTicks = 5;

long ResidentBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return resident * sysconf(_SC_PAGESIZE);
}

// "host:port" -> "host"; unix: addresses have no host part.
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

Server::Server() = default;

Server::~Server() { Shutdown(std::chrono::milliseconds(0)); }

absl::Status Server::Start(const DaemonConfig& config) {
  if (!config.persistence.path.empty()) {
    const PersistenceConfig& p = config.persistence;
    auto store = Store::Open({.path = p.path,
                              .synchronous_full = p.synchronous == "full",
                              .event_queue_capacity = p.event_queue_capacity});
    if (!store.ok()) return store.status();
    store_ = std::move(*store);
  }
  // Before anything binds: a bad certificate or key is a configuration
  // error (exit 2), named with its path.
  std::optional<common::ServerTls> tls;
  if (config.tls.enabled()) {
    absl::StatusOr<common::ServerTls> loaded = common::LoadServerTls(config.tls);
    if (!loaded.ok()) return loaded.status();
    tls = *std::move(loaded);
    // An expired or not-yet-valid certificate still starts (a renewal may
    // be on its way; rotation picks it up), but not silently: a warning, and
    // straggler_tls_certificate_expiry_seconds for the alert.
    if (absl::StatusOr<common::CertificateValidity> v = common::LeafValidity(tls->cert_chain);
        v.ok()) {
      stats_.tls_certificate_not_after.store(v->not_after, std::memory_order_relaxed);
      const std::string warning =
          common::ValidityWarning(*v, static_cast<int64_t>(time(nullptr)),
                                  absl::StrCat("tls.cert_file=", config.tls.cert_file));
      if (!warning.empty()) spdlog::warn("{}", warning);
    }
  }
  auth_ = std::make_unique<Authorizer>(config.auth, stats_);
  if (!auth_->token_configured()) {
    spdlog::warn("no auth.token_file: AdminService and mutating REST calls are open to anyone "
                 "who can connect (docs/security.md)");
  }
  if (!config.cluster.etcd_endpoints.empty()) {
    // Connected before the services exist, joined once the ports are known:
    // until then every job-scoped call is refused (not joined yet).
    absl::StatusOr<std::unique_ptr<ClusterMember>> member = ClusterMember::Create(config.cluster);
    if (!member.ok()) return member.status();
    cluster_ = *std::move(member);
  }
  registry_ = std::make_unique<JobRegistry>(std::make_shared<const DaemonConfig>(config), stats_,
                                            store_.get());
  // In a cluster each new membership goes to etcd before it is published,
  // and a job taken over starts from its last owner's (docs/cluster.md).
  registry_->SetSharedState(cluster_.get());
  if (absl::Status s = registry_->Restore(WallNow()); !s.ok()) return s;
  ingest_ = std::make_unique<IngestServiceImpl>(*registry_, stats_, cluster_.get());
  if (cluster_) {
    // Replicas forward reads to each other over plaintext gRPC only: with
    // TLS they have no client credentials yet and redirect instead.
    forwarder_ = std::make_unique<QueryForwarder>(*cluster_, !(tls && config.tls.grpc));
  }
  query_ = std::make_unique<QueryServiceImpl>(*registry_, stats_, *auth_, forwarder_.get());
  admin_ = std::make_unique<AdminServiceImpl>(*registry_, stats_, *auth_, cluster_.get());
  rendezvous_store_ = std::make_unique<RendezvousStore>(config.rendezvous);
  if (cluster_) {
    // A job taken over brings its rendezvous keys from etcd
    // (docs/cluster.md, "The rendezvous store at a failover").
    cluster_->SetOnTake([member = cluster_.get(), store = rendezvous_store_.get()](
                            const std::string& job) {
      auto keys = member->LoadRendezvousKeys(job);
      if (!keys.ok()) {
        spdlog::warn("job={} rendezvous keys not loaded from etcd: {}", job,
                     std::string(keys.status().message()));
        return;
      }
      if (keys->empty()) return;
      std::vector<RendezvousStore::Restored> entries;
      for (auto& e : *keys) entries.push_back({e.key, std::move(e.value), e.ttl});
      const size_t n = entries.size();
      spdlog::info("job={} {} of {} rendezvous keys loaded from etcd", job,
                   store->Restore(job, std::move(entries)), n);
    });
  }
  rendezvous_ = std::make_unique<RendezvousServiceImpl>(
      *rendezvous_store_, stats_, config.limits.max_message_bytes, cluster_.get());
  started_config_ = config;
  for (const std::string& w : config.warnings) spdlog::warn("{}", w);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  const bool grpc_tls = tls && config.tls.grpc;
  builder.AddListeningPort(
      config.grpc_address,
      grpc_tls ? common::GrpcServerCredentials(*tls) : grpc::InsecureServerCredentials(), &port);
  // Every service: a larger message ends its call with RESOURCE_EXHAUSTED
  // before any of it is parsed. These refusals (and the quota's below) are
  // not counted: gRPC 1.51 drops a unary call whose request it refused
  // before any handler or interceptor exists, and shows a stream's refused
  // message only as a failed Read on a cancelled call, as a client crash
  // looks (docs/security.md, "gRPC's own refusals").
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.limits.max_message_bytes));
  quota_ = std::make_unique<grpc::ResourceQuota>("stragglerd-grpc");
  quota_->Resize(GrpcMemoryQuota(config.limits.max_message_bytes, config.limits.max_streams));
  builder.SetResourceQuota(*quota_);
  // gRPC sets SO_REUSEPORT by default: a second stragglerd on the same port
  // would then start "successfully" and the kernel would split new
  // connections (ranks of one job) between the two daemons. Without it the
  // second one fails to bind and says so.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(ingest_.get());
  builder.RegisterService(query_.get());
  builder.RegisterService(admin_.get());
  builder.RegisterService(rendezvous_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on grpc_address=",
                                               config.grpc_address,
                                               " (address in use or not local?)"));
  }
  grpc_port_ = port;
  grpc_address_ = config.grpc_address.rfind("unix:", 0) == 0
                      ? config.grpc_address
                      : absl::StrCat(HostOf(config.grpc_address), ":", port);

  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  for (const char* service : {straggler::v1::IngestService::service_full_name(),
                              straggler::v1::QueryService::service_full_name(),
                              straggler::v1::AdminService::service_full_name(),
                              straggler::v1::RendezvousService::service_full_name()}) {
    health->SetServingStatus(service, true);
  }

  http_ = std::make_unique<HttpServer>(*registry_, stats_, *auth_, cluster_.get(),
                                       forwarder_.get());
  const bool http_tls = tls && config.tls.http;
  absl::Status s = http_->Start(config, http_tls ? &*tls : nullptr);
  if (s.ok() && cluster_) s = cluster_->Join(grpc_address_, http_->address());
  if (!s.ok()) {
    http_.reset();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
    return s;
  }

  spdlog::info("security: grpc {}, http {}{}; bearer token {}{}",
               grpc_tls ? "TLS" : "plaintext", http_tls ? "TLS" : "plaintext",
               tls && !config.tls.client_ca_file.empty() ? " (client certificates required)" : "",
               auth_->token_configured() ? "required for admin calls" : "not configured",
               config.auth.protect_reads ? " and reads" : "");
  tick_thread_ = std::thread([this] { TickLoop(); });
  // gRPC serves and the config is loaded (Start has it): ready.
  http_->SetPhase(HttpServer::Phase::kServing);
  return absl::OkStatus();
}

int Server::http_port() const { return http_ ? http_->port() : 0; }

const std::string& Server::http_address() const {
  static const std::string kNone;
  return http_ ? http_->address() : kNone;
}

std::string Server::http_dial_address() const { return http_ ? http_->dial_address() : ""; }

std::string Server::grpc_dial_address() const {
  const std::string host = HostOf(grpc_address_);
  if (grpc_address_.rfind("unix:", 0) == 0) return grpc_address_;
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    return absl::StrCat("127.0.0.1:", grpc_port_);
  }
  return grpc_address_;
}

absl::Status Server::CheckReload(const DaemonConfig& next) const {
  if (next.tls.enabled()) {
    absl::StatusOr<common::ServerTls> tls = common::LoadServerTls(next.tls);
    if (!tls.ok()) return tls.status();
  }
  const std::vector<std::string> dropped = SecurityDowngrades(*registry_->config(), next);
  if (dropped.empty() || next.security.allow_downgrade) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      next.config_file.empty() ? "the built-in defaults" : next.config_file,
      " would turn off ", absl::StrJoin(dropped, ", "),
      "; if that is meant, say so in the file with security.allow_downgrade: true "
      "(docs/security.md)"));
}

void Server::Reload(const DaemonConfig& config) {
  common::ApplyLogLevel(config.log_level);
  for (const std::string& change : RestartOnlyChanges(started_config_, config)) {
    spdlog::warn("reload: {} needs a restart to take effect; running on the old value", change);
  }
  for (const std::string& w : config.warnings) spdlog::warn("{}", w);
  // The token file was re-read by the config load; a new token applies to
  // the next call.
  // CheckReload let these through (security.allow_downgrade): said loudly.
  for (const std::string& d : SecurityDowngrades(*registry_->config(), config)) {
    spdlog::warn("reload: {} turned off (security.allow_downgrade: true)", d);
  }
  auth_->Apply(config.auth);
  registry_->ApplyConfig(std::make_shared<const DaemonConfig>(config));
  rendezvous_store_->ApplyConfig(config.rendezvous);
  // max_message_bytes needs a restart: the started one.
  quota_->Resize(
      GrpcMemoryQuota(started_config_.limits.max_message_bytes, config.limits.max_streams));
  stats_.config_reloads_applied.fetch_add(1, std::memory_order_relaxed);
  spdlog::info("config reloaded from {}",
               config.config_file.empty() ? "defaults" : config.config_file);
}

void Server::TickLoop() {
  long resident_seen = ResidentBytes();
  int trim_ticks_left = 0;
  while (true) {
    {
      // Stop sets stopping_ under tick_mu_, which ends the wait at once.
      absl::MutexLock lock(&tick_mu_);
      if (tick_mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(kTickInterval)))
        break;
    }
    if (cluster_) {
      // Jobs another replica owns now are no longer served or exported here;
      // and no job is ticked (no rank turns unresponsive, no membership
      // moves) while this replica may not decide.
      for (const auto& [job, status] : cluster_->TakeLostJobs()) {
        registry_->Drop(job, status);
        rendezvous_store_->DropJob(job, status);  // its waits follow the redirect
      }
      if (cluster_->MayDecide()) {
        registry_->TickAll(WallNow());
      } else {
        // Held rendezvous Waits end here, so their callers look for the
        // job's next owner instead of waiting for keys that will be set
        // there (docs/cluster.md, "The rendezvous store at a failover").
        rendezvous_store_->EndWaits(cluster_->CheckMayDecide("hold rendezvous waits"));
      }
    } else {
      registry_->TickAll(WallNow());
    }
    if (const long resident = ResidentBytes(); resident > resident_seen + kTrimGrowthBytes) {
      malloc_trim(0);
      resident_seen = ResidentBytes();
      trim_ticks_left = kTrimFollowUpTicks;
    } else {
      // Buffers still in use at the trim are freed later (refused gRPC
      // messages end over a few seconds): trimming once left +19 MB in one
      // of three runs of security:oversize_memory.
      if (trim_ticks_left > 0) {
        --trim_ticks_left;
        malloc_trim(0);
      }
      resident_seen = std::min(resident_seen, ResidentBytes());
    }
    if (started_config_.tls.enabled() && ++ticks_since_cert_check_ >= 60) {
      ticks_since_cert_check_ = 0;
      RefreshCertificateExpiry();
    }
    for (common::FloodLog* log : stats_.FloodLogs()) {
      log->Summarize(std::chrono::steady_clock::now());
    }
  }
}

void Server::RefreshCertificateExpiry() {
  std::ifstream in(started_config_.tls.cert_file);
  std::stringstream pem;
  pem << in.rdbuf();
  absl::StatusOr<common::CertificateValidity> v = common::LeafValidity(pem.str());
  if (!v.ok()) return;  // mid-rotation: keep the last value
  const int64_t before = stats_.tls_certificate_not_after.exchange(v->not_after,
                                                                  std::memory_order_relaxed);
  if (before == v->not_after) return;
  const std::string warning =
      common::ValidityWarning(*v, static_cast<int64_t>(time(nullptr)),
                              absl::StrCat("tls.cert_file=", started_config_.tls.cert_file));
  if (!warning.empty()) spdlog::warn("{}", warning);
}

void Server::FlushState() {
  if (!store_) return;
  store_->Flush();
  spdlog::info("state database {} flushed: {} events written, {} dropped, {} failed batches",
               store_->path(), store_->events_written(), store_->events_dropped(),
               store_->write_errors());
}

void Server::Shutdown(std::chrono::milliseconds grace) {
  if (!server_) return;
  spdlog::info("stragglerd draining (grace {} ms)", grace.count());
  // Readiness first (/readyz 503, REST 503, gRPC health NOT_SERVING), so load
  // balancers stop sending new work while we drain.
  if (http_) http_->SetPhase(HttpServer::Phase::kDraining);
  server_->GetHealthCheckService()->Shutdown();
  // Stops deciding, then frees every job at once: the streams closed below
  // find another replica that may take them without waiting out the lease.
  if (cluster_) cluster_->Leave();
  registry_->CloseAll(absl::UnavailableError("stragglerd is shutting down"));
  // Held Waits end now (UNAVAILABLE) rather than holding the drain for their timeout.
  rendezvous_store_->Close(absl::UnavailableError("stragglerd is shutting down"));
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  {
    absl::MutexLock lock(&tick_mu_);
    stopping_ = true;
  }
  if (tick_thread_.joinable()) tick_thread_.join();
  server_->Wait();
  server_.reset();
  // No stream or tick logs any more: the counts the tick has not summed up.
  for (common::FloodLog* log : stats_.FloodLogs()) log->Flush();
  // Nothing journals any more (no RPC, no tick): what is queued is all.
  FlushState();
  // HTTP last: /metrics and /healthz answer while gRPC drains.
  if (http_) http_->Stop();
  http_.reset();
  spdlog::info("stragglerd stopped");
}

}  // namespace straggler::daemon
