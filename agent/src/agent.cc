// Agent: see agent.h. Start, Reload and Shutdown wire the pieces together:
// the job table and its upstream jobs (job_table.h, upstream_job.h), the
// trainer-facing service (downstream.h), /metrics (agent_metrics.h), GPU
// telemetry (telemetry_attach.h) and the listeners.
#include "agent.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "agent_metrics.h"
#include "agent_stats.h"
#include "downstream.h"
#include "job_table.h"
#include "peer_listener.h"
#include "spdlog/spdlog.h"
#include "straggler/stream/channel_pool.h"
#include "straggler/common/http_deadline.h"
#include "straggler/common/service_main.h"  // ApplyLogLevel
#include "straggler/common/tls.h"
#include "straggler/nvml/nvml_sampler.h"
#include "straggler/v1/straggler.grpc.pb.h"
#include "telemetry_attach.h"

namespace straggler::agent {
namespace {

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string DialAddress(const std::string& address, int port) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") host = "127.0.0.1";
  return absl::StrCat(host, ":", port);
}

}  // namespace

struct Agent::Impl {
  explicit Impl(AgentConfig c) : config(std::move(c)) {}

  std::string RenderMetrics() const {
    return RenderAgentMetrics(table->Jobs(), stats, sampler.get(), telemetry_sent.load());
  }

  // GPU and host telemetry (each logs its line: on, or why not) and the
  // decorator that attaches them, then user_decorator, to upstream batches.
  void StartTelemetry() {
    const AgentConfig& c = config;
    if (c.telemetry_enabled) {
      nvml::NvmlSampler::Options o;
      o.library = c.nvml_library;
      o.interval = std::chrono::milliseconds(c.telemetry_interval_ms);
      // Logs its one line: on (GPUs, library, interval), or off on a GPU-less host.
      sampler = nvml::NvmlSampler::Start(o);
    } else {
      spdlog::info("GPU telemetry off (telemetry.enabled=false)");
    }
    if (c.host_telemetry_enabled) {
      HostSampler::Options o;
      o.proc_root = c.proc_root;
      o.interval = std::chrono::milliseconds(c.host_telemetry_interval_ms);
      // Logs its line: on, and what this kernel does not provide.
      host = HostSampler::Start(o);
    } else {
      spdlog::info("host telemetry off (host_telemetry.enabled=false)");
    }
    {
      Impl* impl = this;
      const bool telemetry_on = sampler && sampler->enabled();
      if (telemetry_on || host || user_decorator) {
        decorator = [impl, telemetry_on](const BatchContext& ctx, v1::ReportBatch& batch) {
          if (telemetry_on) {
            impl->telemetry_sent.fetch_add(AttachTelemetry(*impl->sampler, ctx, batch),
                                           std::memory_order_relaxed);
          }
          if (impl->host) AttachHostTelemetry(*impl->host, ctx, batch);
          if (impl->user_decorator) impl->user_decorator(ctx, batch);
        };
      }
    }
  }

  AgentConfig config;
  BatchDecorator user_decorator;  // SetBatchDecorator's
  BatchDecorator decorator;       // telemetry, then user_decorator
  std::unique_ptr<nvml::NvmlSampler> sampler;  // null when telemetry is disabled
  std::unique_ptr<HostSampler> host;           // null when host telemetry is disabled
  std::atomic<uint64_t> telemetry_sent{0};
  std::atomic<bool> ready{false};
  AgentStats stats;
  std::unique_ptr<JobTable> table;
  std::unique_ptr<IngestProxy> service;
  std::unique_ptr<grpc::Server> server;
  // The unix socket (after `server`: stopped and destroyed before it).
  std::unique_ptr<UnixPeerListener> unix_listener;
  std::unique_ptr<httplib::Server> http;
  std::thread http_thread;
  int tcp_port = 0;
  int http_port = 0;
  bool stopped = false;
};

Agent::Agent(AgentConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}

Agent::~Agent() { Shutdown(); }

void Agent::SetBatchDecorator(BatchDecorator decorator) {
  impl_->user_decorator = std::move(decorator);
}

absl::Status Agent::Start() {
  Impl& m = *impl_;
  const AgentConfig& c = m.config;
  const std::string path = *UnixSocketPath(c.listen);
  // The socket's directory (e.g. /run/straggler) may not exist yet on a
  // fresh node or in a fresh hostPath volume.
  std::error_code ec;
  if (const auto dir = std::filesystem::path(path).parent_path(); !dir.empty()) {
    std::filesystem::create_directories(dir, ec);
  }
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create the directory of listen=",
                                                      c.listen, ": ", ec.message()));
  }

  m.StartTelemetry();

  grpc::ChannelArguments args;
  // Reconnect quickly after a daemon restart; the agent's own backoff paces
  // the stream attempts.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::string tls_error;
  auto credentials = MakeChannelCredentials(c.upstream_tls, c.upstream, &tls_error);
  if (!credentials) {
    return absl::FailedPreconditionError(absl::StrCat("upstream_tls: ", tls_error));
  }
  // TLS on the TCP listener: the files are read and checked now, so that a
  // bad one stops the start naming it (FAILED_PRECONDITION: exit 2).
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials = grpc::InsecureServerCredentials();
  if (!c.listen_tcp.empty() && c.listen_tcp_tls.enabled()) {
    absl::StatusOr<common::ServerTls> tls =
        common::LoadServerTls(c.listen_tcp_tls, "listen_tcp_tls");
    if (!tls.ok()) return tls.status();
    tcp_credentials = common::GrpcServerCredentials(*tls);
  }
  // One channel per replica address, shared by the jobs' streams (each
  // job's stream follows its own owner: docs/cluster.md, "Clients").
  absl::StatusOr<std::shared_ptr<stream::ChannelPool>> pool =
      stream::ChannelPool::Make(c.upstream, credentials, args);
  if (!pool.ok()) return pool.status();
  m.table = std::make_unique<JobTable>(*pool, c.node.empty() ? HostName() : c.node, m.stats,
                                       &m.decorator, LiveConfig::From(c));
  {
    Impl* impl = impl_.get();
    // unix_listener is set before the server starts, so before any call.
    m.service = std::make_unique<IngestProxy>(*m.table, m.stats, [impl](const std::string& peer) {
      return impl->unix_listener ? impl->unix_listener->PidOf(peer) : int64_t{0};
    });
  }

  // The same standard services as stragglerd, so a client (or a probe such
  // as grpc_health_probe) cannot tell the agent from the daemon.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // The socket is created by BuildAndStart with the process umask: made
  // 0660 from its first moment (not chmod-ed afterwards, which would leave a
  // window in which any local user could connect and report as any rank).
  // umask is process-wide; no other thread creates files at this point.
  const mode_t old_umask = umask(0117);
  // The unix socket is plaintext: its file mode decides who may connect.
  // The agent accepts on it itself, to learn each trainer's process
  // (SO_PEERCRED, for the host telemetry), and hands the connections to
  // gRPC.
  absl::StatusOr<std::unique_ptr<UnixPeerListener>> unix_listener = UnixPeerListener::Bind(path);
  if (!unix_listener.ok()) {
    umask(old_umask);
    return unix_listener.status();
  }
  m.unix_listener = *std::move(unix_listener);
  if (!c.listen_tcp.empty()) {
    builder.AddListeningPort(c.listen_tcp, tcp_credentials, &m.tcp_port);
  }
  // No SO_REUSEPORT (gRPC's default): a second agent on the same TCP port
  // must fail to start, not split the node's trainers with the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(m.service.get());
  m.server = builder.BuildAndStart();
  umask(old_umask);
  if (!m.server) {
    return absl::UnavailableError(absl::StrCat("cannot listen on listen=", c.listen,
                                               c.listen_tcp.empty() ? "" : " / listen_tcp=",
                                               c.listen_tcp));
  }
  m.unix_listener->Serve(m.server.get());
  grpc::HealthCheckServiceInterface* health = m.server->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus(straggler::v1::IngestService::service_full_name(), true);
  // Trainer processes of the same group (not every local user) may connect.
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 0007) != 0) {
    spdlog::warn("agent socket {} is accessible to other users (mode {:o})", path,
                 st.st_mode & 0777);
  }

  if (!c.http_address.empty()) {
    const size_t colon = c.http_address.rfind(':');
    std::string host = c.http_address.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    const int port = std::stoi(c.http_address.substr(colon + 1));
    // Whole-request deadlines, as the daemon's listener: httplib's own
    // timeouts are per read, so a client trickling its request (slowloris)
    // would hold a worker for as long as it liked.
    m.http = common::MakeDeadlineServer(m.stats.http_slow_clients);
    common::ConfigureListener(*m.http, c.http_threads, c.http_read_timeout_seconds,
                              c.http_write_timeout_seconds, c.http_keep_alive_timeout_seconds);
    Impl* impl = impl_.get();
    m.http->Get("/metrics", [impl](const httplib::Request&, httplib::Response& res) {
      res.set_content(impl->RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
    });
    m.http->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    // Ready while trainers can connect: from Start until Shutdown begins.
    m.http->Get("/readyz", [impl](const httplib::Request&, httplib::Response& res) {
      if (impl->ready.load()) {
        res.set_content("ready\n", "text/plain");
      } else {
        res.status = 503;
        res.set_content("shutting down\n", "text/plain");
      }
    });
    m.http_port = port == 0 ? m.http->bind_to_any_port(host)
                            : (m.http->bind_to_port(host, port) ? port : -1);
    if (m.http_port <= 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on http_address=", c.http_address));
    }
    m.http_thread = std::thread([impl] { impl->http->listen_after_bind(); });
  }
  m.ready.store(true);
  return absl::OkStatus();
}

void Agent::Reload(const AgentConfig& next) {
  Impl& m = *impl_;
  auto restart_needed = [&](const char* key, const std::string& was, const std::string& now) {
    if (was != now) {
      spdlog::warn("SIGHUP: {} changed ({} -> {}): takes effect after a restart", key, was, now);
    }
  };
  restart_needed("listen", m.config.listen, next.listen);
  restart_needed("listen_tcp", m.config.listen_tcp, next.listen_tcp);
  restart_needed("upstream", m.config.upstream, next.upstream);
  restart_needed("listen_tcp_tls.cert_file", m.config.listen_tcp_tls.cert_file,
                 next.listen_tcp_tls.cert_file);
  restart_needed("listen_tcp_tls.key_file", m.config.listen_tcp_tls.key_file,
                 next.listen_tcp_tls.key_file);
  restart_needed("listen_tcp_tls.client_ca_file", m.config.listen_tcp_tls.client_ca_file,
                 next.listen_tcp_tls.client_ca_file);
  restart_needed("listen_tcp_tls.reload_seconds",
                 std::to_string(m.config.listen_tcp_tls.reload_seconds),
                 std::to_string(next.listen_tcp_tls.reload_seconds));
  restart_needed("http_address", m.config.http_address, next.http_address);
  if (m.config.http_threads != next.http_threads ||
      m.config.http_read_timeout_seconds != next.http_read_timeout_seconds ||
      m.config.http_write_timeout_seconds != next.http_write_timeout_seconds ||
      m.config.http_keep_alive_timeout_seconds != next.http_keep_alive_timeout_seconds) {
    spdlog::warn("SIGHUP: http.* changed: takes effect after a restart");
  }
  restart_needed("node", m.config.node, next.node);
  restart_needed("upstream_tls.ca_file", m.config.upstream_tls.ca_file, next.upstream_tls.ca_file);
  restart_needed("upstream_tls.cert_file", m.config.upstream_tls.cert_file,
                 next.upstream_tls.cert_file);
  restart_needed("upstream_tls.key_file", m.config.upstream_tls.key_file,
                 next.upstream_tls.key_file);
  AgentConfig applied = m.config;
  applied.log_level = next.log_level;
  applied.batch_max_reports = next.batch_max_reports;
  applied.batch_max_delay_ms = next.batch_max_delay_ms;
  applied.buffer_max_reports = next.buffer_max_reports;
  applied.reconnect_initial_ms = next.reconnect_initial_ms;
  applied.reconnect_max_ms = next.reconnect_max_ms;
  applied.shutdown_flush_ms = next.shutdown_flush_ms;
  applied.idle_job_timeout_ms = next.idle_job_timeout_ms;
  if (m.config.telemetry_enabled != next.telemetry_enabled ||
      m.config.telemetry_interval_ms != next.telemetry_interval_ms ||
      m.config.nvml_library != next.nvml_library) {
    spdlog::warn("SIGHUP: telemetry changed: takes effect after a restart");
  }
  if (m.config.host_telemetry_enabled != next.host_telemetry_enabled ||
      m.config.host_telemetry_interval_ms != next.host_telemetry_interval_ms ||
      m.config.proc_root != next.proc_root) {
    spdlog::warn("SIGHUP: host_telemetry changed: takes effect after a restart");
  }
  m.config = applied;
  common::ApplyLogLevel(applied.log_level);
  if (m.table) m.table->SetLive(LiveConfig::From(applied));
  spdlog::info("SIGHUP: config reloaded (log_level={}, batch {} reports / {} ms, buffer {} "
               "reports per job, reconnect {}..{} ms, shutdown flush {} ms, idle job timeout "
               "{} ms)",
               applied.log_level, applied.batch_max_reports, applied.batch_max_delay_ms,
               applied.buffer_max_reports, applied.reconnect_initial_ms,
               applied.reconnect_max_ms, applied.shutdown_flush_ms, applied.idle_job_timeout_ms);
}

void Agent::Shutdown() {
  Impl& m = *impl_;
  if (m.stopped || !m.table) return;
  m.stopped = true;
  m.ready.store(false);
  // No new streams; ending the open ones lets clients reconnect elsewhere
  // (or to the next agent) with what they hold.
  const auto jobs = m.table->Close();
  if (m.unix_listener) m.unix_listener->Stop();  // no connection added to a stopping server
  if (m.server) m.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  const auto deadline = Clock::now() + std::chrono::milliseconds(m.config.shutdown_flush_ms);
  for (const auto& j : jobs) j->Stop(deadline);
  for (const auto& j : jobs) j->Join();
  if (m.http) {
    m.http->stop();
    if (m.http_thread.joinable()) m.http_thread.join();
  }
  if (m.server) m.server->Wait();
  // The socket file stays otherwise; a later bind replaces it anyway.
  if (auto path = UnixSocketPath(m.config.listen)) unlink(path->c_str());
}

const std::string& Agent::listen_address() const { return impl_->config.listen; }

std::string Agent::tcp_dial_address() const {
  return impl_->config.listen_tcp.empty() ? ""
                                          : DialAddress(impl_->config.listen_tcp, impl_->tcp_port);
}

std::string Agent::http_dial_address() const {
  return impl_->config.http_address.empty()
             ? ""
             : DialAddress(impl_->config.http_address, impl_->http_port);
}

}  // namespace straggler::agent
