// straggler-agent: the per-node sidecar. Parses flags, loads the config,
// starts the agent and waits for signals on the main thread: SIGHUP reloads
// the config file, SIGTERM/SIGINT flush the buffer upstream (bounded) and
// exit 0.
#include <unistd.h>

#include <iostream>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "agent.h"
#include "agent_config.h"
#include "straggler/common/service_main.h"
#include "spdlog/spdlog.h"

namespace {

using straggler::agent::AgentConfig;
using straggler::agent::AgentSources;

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string ReadyFileContents(const straggler::agent::Agent& agent) {
  return absl::StrCat("{\"listen\":", JsonString(agent.listen_address()),
                      ",\"listen_tcp\":", JsonString(agent.tcp_dial_address()),
                      ",\"http_address\":", JsonString(agent.http_dial_address()),
                      ",\"pid\":", getpid(), "}\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "straggler-agent - per-node sidecar of stragglerd: serves the daemon's IngestService\n"
      "to the trainer ranks of this node on a unix socket (mode 0660), fans each job's\n"
      "ranks into one upstream stream, buffers reports while the daemon is unreachable\n"
      "and replays them, and relays memberships back. The optional TCP listener speaks\n"
      "TLS (optionally mutual) when the config file sets listen_tcp_tls; the unix socket\n"
      "is always plaintext.\n\n"
      "Precedence: flags > environment (STRAGGLER_AGENT_CONFIG, STRAGGLER_AGENT_LISTEN,\n"
      "STRAGGLER_AGENT_LISTEN_TCP, STRAGGLER_AGENT_UPSTREAM, STRAGGLER_AGENT_HTTP_ADDRESS,\n"
      "STRAGGLER_AGENT_LOG_LEVEL, STRAGGLER_AGENT_NODE, STRAGGLER_AGENT_TELEMETRY_ENABLED,\n"
      "STRAGGLER_AGENT_TELEMETRY_INTERVAL_MS; NVML library: STRAGGLER_NVML_LIBRARY)\n"
      "> config file > built-in defaults.\n"
      "Signals: SIGHUP reloads the config file (batching, buffer, reconnect, idle jobs, log\n"
      "level live; addresses, node and telemetry need a restart); SIGTERM/SIGINT flush the\n"
      "buffer upstream for up to shutdown.flush_ms and exit 0.",
      "straggler-agent"};
  // Flags bind straight into the config sources: unset stays "not given".
  AgentSources sources;
  std::string ready_file;
  straggler::common::AddServiceFlags(
      app,
      {"deploy/straggler-agent.yaml", "STRAGGLER_AGENT_CONFIG",
       "{\"listen\":\"unix:...\",\"listen_tcp\":\"HOST:PORT\",\"http_address\":"
       "\"HOST:PORT\",\"pid\":N}",
       "dialable addresses; \"\" for a listener that is off"},
      sources.config_file, sources.log_level, ready_file);
  app.add_option("--listen", sources.listen,
                 "unix socket to serve trainers on, unix:///PATH (default "
                 "unix:///run/straggler/agent.sock; the directory is created)");
  app.add_option("--listen-tcp", sources.listen_tcp,
                 "also serve on TCP HOST:PORT, port 0 picks a free port "
                 "(default: no TCP); plaintext unless the config file's "
                 "listen_tcp_tls gives a certificate");
  app.add_option("--upstream", sources.upstream,
                 "stragglerd gRPC address HOST:PORT, or several replicas "
                 "comma-separated: each job's stream follows its owner (default "
                 "127.0.0.1:7070)");
  app.add_option("--http-address", sources.http_address,
                 "HTTP HOST:PORT for /metrics, /healthz and /readyz, port 0 picks a "
                 "free port (default 0.0.0.0:7072)");
  app.add_option("--node", sources.node, "node name sent to the daemon (default: the host name)");
  if (std::optional<int> rc =
          straggler::common::ParseCommandLine(app, argc, argv, STRAGGLERD_VERSION)) {
    return *rc;
  }

  // Before any thread exists, so only ServeUntilStopped below sees them.
  const sigset_t signals = straggler::common::BlockControlSignals();

  std::optional<straggler::agent::Agent> agent;
  if (std::optional<int> rc = straggler::common::StartService(
          {"straggler-agent", STRAGGLERD_VERSION, ready_file},
          [&] { return straggler::agent::LoadAgentConfig(sources, straggler::common::GetEnv); },
          [](const AgentConfig& c) { return absl::StrCat("; upstream ", c.upstream); },
          [&](const AgentConfig& config) -> absl::Status {
            // A TLS file that cannot be read or a socket directory that
            // cannot be made is a configuration error, as in stragglerd:
            // FAILED_PRECONDITION, exit 2.
            agent.emplace(config);
            if (absl::Status s = agent->Start(); !s.ok()) return s;
            spdlog::info(
                "straggler-agent listening: {}{}{}", agent->listen_address(),
                agent->tcp_dial_address().empty() ? "" : " tcp=" + agent->tcp_dial_address(),
                agent->http_dial_address().empty() ? "" : " http=" + agent->http_dial_address());
            return absl::OkStatus();
          },
          [&] { return ReadyFileContents(*agent); })) {
    return *rc;
  }

  const int sig = straggler::common::ServeUntilStopped(
      signals,
      [&] { return straggler::agent::LoadAgentConfig(sources, straggler::common::GetEnv); },
      [&](const AgentConfig& next) { agent->Reload(next); },
      [](const absl::Status&) {});  // logged by ServeUntilStopped; no agent metric
  spdlog::info("{} received: flushing the buffer upstream", straggler::common::StopSignalName(sig));
  agent->Shutdown();
  spdlog::info("straggler-agent stopped");
  return 0;
}
