// stragglerd: the straggler-monitoring daemon. Parses flags, loads the
// config, starts the server and then waits for signals on the main thread:
// SIGHUP reloads the config file, SIGTERM/SIGINT drain and exit 0.
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "config/config.h"
#include "server/server.h"
#include "straggler/common/service_main.h"
#include "spdlog/spdlog.h"

namespace {

using straggler::daemon::ConfigSources;
using straggler::daemon::DaemonConfig;

constexpr auto kDrainGrace = std::chrono::seconds(5);
// The whole drain's bound. gRPC's shutdown waits for every connection to
// close, and the connection of a client that stopped reading (a suspended
// `stragglerctl watch`) cannot be closed cleanly: gRPC lets go of it only
// when its own timers run out (measured up to 18 s). A stop must not depend
// on a peer, so past this the state is flushed and the process exits.
constexpr auto kDrainLimit = kDrainGrace + std::chrono::seconds(2);

std::string ReadyFileContents(const std::string& grpc_dial_address,
                              const std::string& http_dial_address) {
  return absl::StrCat("{\"grpc_address\":\"", grpc_dial_address, "\",\"http_address\":\"",
                      http_dial_address, "\",\"pid\":", getpid(), "}\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "stragglerd - finds slow ranks of synchronous data-parallel training jobs and\n"
      "publishes, per job, the versioned membership that leaves them out.\n\n"
      "Precedence: flags > environment (STRAGGLERD_GRPC_ADDRESS, STRAGGLERD_HTTP_ADDRESS,\n"
      "STRAGGLERD_LOG_LEVEL, STRAGGLERD_STATE_DB, STRAGGLERD_ETCD_ENDPOINTS,\n"
      "STRAGGLERD_CONFIG) > config file > built-in defaults.\n"
      "Signals: SIGHUP reloads the config file, SIGTERM/SIGINT drain (7 s at most) and exit 0.\n"
      "TLS, mutual TLS and the admin bearer token: tls.* and auth.* in the config file\n"
      "(docs/security.md); without auth.token_file admin calls are open (warned at start).",
      "stragglerd"};
  // Flags bind straight into the config sources: unset stays "not given".
  ConfigSources sources;
  std::string ready_file;
  straggler::common::AddServiceFlags(
      app,
      {"deploy/stragglerd.yaml", "STRAGGLERD_CONFIG",
       "{\"grpc_address\":\"HOST:PORT\",\"http_address\":\"HOST:PORT\",\"pid\":N}",
       "dialable addresses, useful with port 0"},
      sources.config_file, sources.log_level, ready_file);
  app.add_option("--grpc-address", sources.grpc_address,
                 absl::StrCat("gRPC listen address HOST:PORT, port 0 picks a free port "
                              "(default: $STRAGGLERD_GRPC_ADDRESS, else grpc_address, else ",
                              straggler::daemon::kDefaultGrpcAddress, ")"));
  app.add_option("--http-address", sources.http_address,
                 absl::StrCat("HTTP listen address HOST:PORT for /metrics, /healthz, /readyz, "
                              "REST under /v1/ and the web console at /, port 0 picks a free "
                              "port (default: $STRAGGLERD_HTTP_ADDRESS, else http_address, else ",
                              straggler::daemon::kDefaultHttpAddress, ")"));
  app.add_option("--state-db", sources.state_db,
                 "SQLite state database (default: $STRAGGLERD_STATE_DB, else persistence.path, "
                 "else none: nothing survives a restart)");
  app.add_option("--etcd-endpoints", sources.etcd_endpoints,
                 "join the stragglerd replicas on this etcd, HOST:PORT[,HOST:PORT...]: each "
                 "job is served by the replica that owns it, the others redirect (default: "
                 "$STRAGGLERD_ETCD_ENDPOINTS, else cluster.etcd_endpoints, else none: run alone; "
                 "docs/cluster.md)");
  if (std::optional<int> rc =
          straggler::common::ParseCommandLine(app, argc, argv, STRAGGLERD_VERSION)) {
    return *rc;
  }

  // Before any thread exists (gRPC, tick), so that every thread inherits the
  // mask and only ServeUntilStopped below ever sees the signals.
  const sigset_t signals = straggler::common::BlockControlSignals();

  straggler::daemon::Server server;  // its destructor stops what Start began
  if (std::optional<int> rc = straggler::common::StartService(
          {"stragglerd", STRAGGLERD_VERSION, ready_file},
          [&] { return LoadConfig(sources, straggler::common::GetEnv); },
          [](const DaemonConfig&) { return std::string(); },
          [&](const DaemonConfig& config) -> absl::Status {
            // A state database that cannot be opened or a TLS file that
            // cannot be used is a configuration error (persistence.path,
            // tls.*), like a bad key: FAILED_PRECONDITION, exit 2.
            if (absl::Status s = server.Start(config); !s.ok()) return s;
            spdlog::info("stragglerd listening: grpc={} http={}", server.grpc_address(),
                         server.http_address());
            return absl::OkStatus();
          },
          [&] {
            return ReadyFileContents(server.grpc_dial_address(), server.http_dial_address());
          })) {
    return *rc;
  }

  const int sig = straggler::common::ServeUntilStopped(
      signals,
      [&]() -> absl::StatusOr<DaemonConfig> {
        absl::StatusOr<DaemonConfig> next = LoadConfig(sources, straggler::common::GetEnv);
        // An empty file is refused by ServeUntilStopped, in its own words.
        if (!next.ok() || next->empty_file) return next;
        // A config the next restart would refuse, or one that turns
        // security off without saying so, is refused now.
        if (absl::Status s = server.CheckReload(*next); !s.ok()) return s;
        return next;
      },
      [&](const DaemonConfig& next) { server.Reload(next); },
      [&](const absl::Status&) { server.CountReloadRejected(); });
  spdlog::info("{} received", straggler::common::StopSignalName(sig));
  std::mutex drain_mu;
  std::condition_variable drain_cv;
  bool drained = false;
  std::thread watchdog([&] {
    std::unique_lock lock(drain_mu);
    if (drain_cv.wait_for(lock, kDrainLimit, [&] { return drained; })) return;
    spdlog::warn("drain not finished after {} s: a client connection that does not read holds "
                 "gRPC's shutdown; flushing the state database and exiting without it",
                 std::chrono::duration_cast<std::chrono::seconds>(kDrainLimit).count());
    server.FlushState();
    spdlog::info("stragglerd stopped (drain cut at its limit)");
    spdlog::shutdown();
    std::_Exit(0);
  });
  server.Shutdown(kDrainGrace);
  {
    std::lock_guard lock(drain_mu);
    drained = true;
  }
  drain_cv.notify_one();
  watchdog.join();
  return 0;
}
