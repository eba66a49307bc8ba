// straggler-agent's config: embedded defaults equal the shipped file,
// precedence flags > environment > file, errors name key, value and line.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "agent_config.h"

namespace sa = straggler::agent;

namespace {

straggler::common::EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace

TEST_CASE("deploy/straggler-agent.yaml parses and equals the built-in defaults") {
  std::ifstream in(std::string(STRAGGLER_SOURCE_DIR) + "/deploy/straggler-agent.yaml");
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  auto parsed = sa::ParseAgentConfig(text.str(), "straggler-agent.yaml");
  REQUIRE(parsed.ok());
  const sa::AgentConfig d;
  CHECK(parsed->listen == d.listen);
  CHECK(parsed->listen_tcp == d.listen_tcp);
  CHECK(parsed->upstream == d.upstream);
  CHECK(parsed->http_address == d.http_address);
  CHECK(parsed->node == d.node);
  CHECK(parsed->log_level == d.log_level);
  CHECK(parsed->batch_max_reports == d.batch_max_reports);
  CHECK(parsed->batch_max_delay_ms == d.batch_max_delay_ms);
  CHECK(parsed->buffer_max_reports == d.buffer_max_reports);
  CHECK(parsed->reconnect_initial_ms == d.reconnect_initial_ms);
  CHECK(parsed->reconnect_max_ms == d.reconnect_max_ms);
  CHECK(parsed->shutdown_flush_ms == d.shutdown_flush_ms);
  CHECK(parsed->idle_job_timeout_ms == d.idle_job_timeout_ms);
  CHECK(parsed->telemetry_enabled == d.telemetry_enabled);
  CHECK(parsed->telemetry_interval_ms == d.telemetry_interval_ms);
  CHECK(parsed->nvml_library == d.nvml_library);
  CHECK(parsed->host_telemetry_enabled == d.host_telemetry_enabled);
  CHECK(parsed->host_telemetry_interval_ms == d.host_telemetry_interval_ms);
  CHECK(parsed->proc_root == d.proc_root);
  CHECK(parsed->upstream_tls.ca_file == d.upstream_tls.ca_file);
  CHECK(parsed->upstream_tls.cert_file == d.upstream_tls.cert_file);
  CHECK(parsed->upstream_tls.key_file == d.upstream_tls.key_file);
  CHECK(parsed->listen_tcp_tls.cert_file == d.listen_tcp_tls.cert_file);
  CHECK(parsed->listen_tcp_tls.key_file == d.listen_tcp_tls.key_file);
  CHECK(parsed->listen_tcp_tls.client_ca_file == d.listen_tcp_tls.client_ca_file);
  CHECK(parsed->listen_tcp_tls.reload_seconds == d.listen_tcp_tls.reload_seconds);
  CHECK(parsed->http_threads == d.http_threads);
  CHECK(parsed->http_read_timeout_seconds == d.http_read_timeout_seconds);
  CHECK(parsed->http_write_timeout_seconds == d.http_write_timeout_seconds);
  CHECK(parsed->http_keep_alive_timeout_seconds == d.http_keep_alive_timeout_seconds);
  // Equal defaults alone would pass for a file that omits a key: every key
  // must be shown.
  for (const char* key : {"listen:", "listen_tcp:", "upstream:", "http_address:", "node:",
                          "log_level:", "batch:", "buffer:", "reconnect:", "shutdown:", "jobs:",
                          "idle_timeout_ms:", "telemetry:", "enabled:", "interval_ms:",
                          "nvml_library:", "upstream_tls:", "ca_file:", "cert_file:",
                          "key_file:", "http:", "threads:", "read_timeout_seconds:",
                          "write_timeout_seconds:", "keep_alive_timeout_seconds:",
                          "listen_tcp_tls:", "client_ca_file:", "reload_seconds:"}) {
    INFO(key);
    const bool shown = text.str().find(std::string("\n") + key) != std::string::npos ||
                       text.str().find(std::string("  ") + key) != std::string::npos;
    CHECK(shown);
  }
}

TEST_CASE("upstream_tls: the three files, a certificate without its key is an error") {
  auto parsed = sa::ParseAgentConfig(
      "upstream_tls:\n  ca_file: /etc/straggler/ca.pem\n  cert_file: /etc/straggler/node.pem\n"
      "  key_file: /etc/straggler/node.key\n",
      "a.yaml");
  REQUIRE(parsed.ok());
  CHECK(parsed->upstream_tls.tls());
  CHECK(parsed->upstream_tls.ca_file == "/etc/straggler/ca.pem");
  CHECK(parsed->upstream_tls.cert_file == "/etc/straggler/node.pem");
  CHECK(parsed->upstream_tls.key_file == "/etc/straggler/node.key");
  CHECK_FALSE(sa::AgentConfig{}.upstream_tls.tls());

  auto half = sa::ParseAgentConfig("upstream_tls:\n  cert_file: /n.pem\n", "a.yaml");
  REQUIRE_FALSE(half.ok());
  CHECK_THAT(std::string(half.status().message()),
             Catch::Contains(
                 "a.yaml:2: upstream_tls: tls cert file /n.pem is set but no tls key file"));
  auto unknown = sa::ParseAgentConfig("upstream_tls:\n  ca: /ca.pem\n", "a.yaml");
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(std::string(unknown.status().message()),
             Catch::Contains("unknown key 'ca' in upstream_tls"));
}

TEST_CASE("listen_tcp_tls: the daemon's tls keys for the TCP listener, half a setup is an error") {
  auto parsed = sa::ParseAgentConfig(
      "listen_tcp: 0.0.0.0:7073\nlisten_tcp_tls:\n  cert_file: /etc/straggler/agent.pem\n"
      "  key_file: /etc/straggler/agent.key\n  client_ca_file: /etc/straggler/ca.pem\n"
      "  reload_seconds: 30\n",
      "a.yaml");
  REQUIRE(parsed.ok());
  CHECK(parsed->listen_tcp_tls.enabled());
  CHECK(parsed->listen_tcp_tls.cert_file == "/etc/straggler/agent.pem");
  CHECK(parsed->listen_tcp_tls.key_file == "/etc/straggler/agent.key");
  CHECK(parsed->listen_tcp_tls.client_ca_file == "/etc/straggler/ca.pem");
  CHECK(parsed->listen_tcp_tls.reload_seconds == 30);
  CHECK_FALSE(sa::AgentConfig{}.listen_tcp_tls.enabled());

  auto half = sa::ParseAgentConfig("listen_tcp_tls:\n  cert_file: /n.pem\n", "a.yaml");
  REQUIRE_FALSE(half.ok());
  CHECK(std::string(half.status().message()) ==
        "a.yaml:2: listen_tcp_tls.cert_file is set but listen_tcp_tls.key_file is not");
  // The daemon's per-listener switches mean nothing here.
  auto grpc = sa::ParseAgentConfig("listen_tcp_tls:\n  grpc: false\n", "a.yaml");
  REQUIRE_FALSE(grpc.ok());
  CHECK_THAT(std::string(grpc.status().message()),
             Catch::Contains("unknown key 'grpc' in listen_tcp_tls"));

  // A certificate without a TCP listener would protect nothing.
  const std::string path = "/tmp/straggler-agent-tls-test-" + std::to_string(getpid()) + ".yaml";
  {
    std::ofstream out(path);
    out << "listen_tcp_tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n";
  }
  sa::AgentSources flags;
  flags.config_file = path;
  auto no_tcp = sa::LoadAgentConfig(flags, FakeEnv({}));
  REQUIRE_FALSE(no_tcp.ok());
  CHECK(std::string(no_tcp.status().message()) ==
        "listen_tcp_tls.cert_file=/c.pem is set but listen_tcp is empty: TLS applies only to "
        "the TCP listener");
  flags.listen_tcp = "127.0.0.1:0";
  CHECK(sa::LoadAgentConfig(flags, FakeEnv({})).ok());
  std::filesystem::remove(path);
}

TEST_CASE("telemetry, idle jobs and the node name: file keys and environment") {
  auto parsed = sa::ParseAgentConfig(
      "telemetry:\n  enabled: false\n  interval_ms: 250\n  nvml_library: /opt/libnvml.so\n"
      "jobs:\n  idle_timeout_ms: 1500\nnode: file-node\n",
      "a.yaml");
  REQUIRE(parsed.ok());
  CHECK_FALSE(parsed->telemetry_enabled);
  CHECK(parsed->telemetry_interval_ms == 250);
  CHECK(parsed->nvml_library == "/opt/libnvml.so");
  CHECK(parsed->idle_job_timeout_ms == 1500);
  CHECK(parsed->node == "file-node");

  auto bad = sa::ParseAgentConfig("telemetry:\n  enabled: maybe\n", "a.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("telemetry.enabled") != std::string::npos);
  auto zero = sa::ParseAgentConfig("telemetry:\n  interval_ms: 0\n", "a.yaml");
  REQUIRE_FALSE(zero.ok());
  CHECK(std::string(zero.status().message()).find("telemetry.interval_ms=0 must be >= 1") !=
        std::string::npos);

  sa::AgentSources flags;
  auto env = sa::LoadAgentConfig(flags, FakeEnv({{"STRAGGLER_AGENT_NODE", "k8s-node-7"},
                                                 {"STRAGGLER_AGENT_TELEMETRY_ENABLED", "false"},
                                                 {"STRAGGLER_AGENT_TELEMETRY_INTERVAL_MS", "20"}}));
  REQUIRE(env.ok());
  CHECK(env->node == "k8s-node-7");
  CHECK_FALSE(env->telemetry_enabled);
  CHECK(env->telemetry_interval_ms == 20);
  flags.node = "flag-node";
  auto flag = sa::LoadAgentConfig(flags, FakeEnv({{"STRAGGLER_AGENT_NODE", "k8s-node-7"}}));
  REQUIRE(flag.ok());
  CHECK(flag->node == "flag-node");

  auto bad_env = sa::LoadAgentConfig(
      sa::AgentSources{}, FakeEnv({{"STRAGGLER_AGENT_TELEMETRY_ENABLED", "yes please"}}));
  REQUIRE_FALSE(bad_env.ok());
  CHECK(std::string(bad_env.status().message()) ==
        "STRAGGLER_AGENT_TELEMETRY_ENABLED=yes please must be true, false, 1 or 0");
}

TEST_CASE("flags beat the environment, which beats the file") {
  // Outside the source tree, whichever directory the test runs in.
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("agent_config_test." + std::to_string(getpid()) + ".yaml"))
                               .string();
  {
    std::ofstream out(path);
    out << "upstream: \"file:1\"\nlisten: \"unix:///tmp/file.sock\"\nbuffer:\n  max_reports: 10\n";
  }
  sa::AgentSources flags;
  flags.config_file = path;
  flags.upstream = "flag:3";
  auto cfg = sa::LoadAgentConfig(
      flags, FakeEnv({{"STRAGGLER_AGENT_UPSTREAM", "env:2"},
                      {"STRAGGLER_AGENT_LISTEN", "unix:///tmp/env.sock"}}));
  REQUIRE(cfg.ok());
  CHECK(cfg->upstream == "flag:3");
  CHECK(cfg->listen == "unix:///tmp/env.sock");
  CHECK(cfg->buffer_max_reports == 10);
  CHECK(cfg->config_file == path);
  std::filesystem::remove(path);
}

TEST_CASE("bad values are errors naming key, value and line") {
  auto bad = sa::ParseAgentConfig("batch:\n  max_reports: -3\n", "a.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()) ==
        "a.yaml:2: batch.max_reports=-3 is not an unsigned 32-bit integer");
  auto unknown = sa::ParseAgentConfig("buffer:\n  max_report: 3\n", "a.yaml");
  REQUIRE_FALSE(unknown.ok());
  CHECK(std::string(unknown.status().message()) == "a.yaml:2: unknown key 'max_report' in buffer");
  auto zero = sa::ParseAgentConfig("buffer:\n  max_reports: 0\n", "a.yaml");
  REQUIRE_FALSE(zero.ok());
  CHECK(std::string(zero.status().message()).find("buffer.max_reports=0 must be >= 1") !=
        std::string::npos);
  auto no_threads = sa::ParseAgentConfig("http:\n  threads: 0\n", "a.yaml");
  REQUIRE_FALSE(no_threads.ok());
  CHECK_THAT(std::string(no_threads.status().message()),
             Catch::Contains("a.yaml:2: http.threads=0 must be >= 1"));
  auto http_key = sa::ParseAgentConfig("http:\n  read_timeout: 3\n", "a.yaml");
  REQUIRE_FALSE(http_key.ok());
  CHECK_THAT(std::string(http_key.status().message()),
             Catch::Contains("unknown key 'read_timeout' in http"));
  sa::AgentSources flags;
  flags.listen = "127.0.0.1:5";
  auto not_unix = sa::LoadAgentConfig(flags, FakeEnv({}));
  REQUIRE_FALSE(not_unix.ok());
  CHECK(std::string(not_unix.status().message()).find("listen=127.0.0.1:5") != std::string::npos);
  flags.listen.reset();
  flags.upstream = "nohost";
  auto up = sa::LoadAgentConfig(flags, FakeEnv({}));
  REQUIRE_FALSE(up.ok());
  CHECK(std::string(up.status().message()).find("upstream=nohost") != std::string::npos);
}

TEST_CASE("unix socket addresses") {
  CHECK(sa::UnixSocketPath("unix:///run/straggler/agent.sock") == "/run/straggler/agent.sock");
  CHECK(sa::UnixSocketPath("unix:rel.sock") == "rel.sock");
  CHECK_FALSE(sa::UnixSocketPath("unix://").has_value());
  CHECK_FALSE(sa::UnixSocketPath("127.0.0.1:1").has_value());
}

// Issue 28: with a 5 s cap, ranks behind agents found a late daemon 9.6 s
// after it started; the cap is ~2 s (+-20% jitter), still configurable.
TEST_CASE("late_daemon: the agent's reconnect cap defaults to 2 s and stays configurable") {
  CHECK(sa::AgentConfig{}.reconnect_max_ms == 2000);
  auto parsed = sa::ParseAgentConfig("reconnect:\n  max_ms: 7000\n", "agent.yaml");
  REQUIRE(parsed.ok());
  CHECK(parsed->reconnect_max_ms == 7000);
}

TEST_CASE("yaml_bomb: the agent's config bounds alias expansion and names an unclosed quote") {
  // The daemon's loader (common::ConfigReader::Load), same bounds and words.
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    bomb += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 9; ++k) bomb += (k ? ", *a" : "*a") + std::to_string(i - 1);
    bomb += "]\n";
  }
  auto c = sa::ParseAgentConfig(bomb, "agent.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(std::string(c.status().message()),
             Catch::Contains("YAML nodes once its aliases are expanded (an alias bomb?)"));
  c = sa::ParseAgentConfig("upstream: \"127.0.0.1:7070\nnode: n1\n", "agent.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(std::string(c.status().message()),
             Catch::StartsWith("agent.yaml:1: the quoted value opened here (\") is not closed"));
  // Keys given twice: refused, as the daemon does.
  c = sa::ParseAgentConfig("node: a\nnode: b\n", "agent.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() == "agent.yaml:2: duplicate key 'node' (first given on line 1)");
  // An empty file is marked (a reload refuses it: common::ServeUntilStopped).
  c = sa::ParseAgentConfig("# nothing yet\n", "agent.yaml");
  REQUIRE(c.ok());
  CHECK(c->empty_file);
  c = sa::ParseAgentConfig("node: a\n", "agent.yaml");
  REQUIRE(c.ok());
  CHECK_FALSE(c->empty_file);
}

TEST_CASE("upstream: several replicas comma-separated, each checked") {
  auto load = [](const std::string& upstream) {
    sa::AgentSources flags;
    flags.upstream = upstream;
    return sa::LoadAgentConfig(flags, FakeEnv({}));
  };
  auto two = load("a.example:7070,b.example:7070");
  REQUIRE(two.ok());
  CHECK(two->upstream == "a.example:7070,b.example:7070");
  auto empty = load("a.example:7070,,b.example:7070");
  REQUIRE_FALSE(empty.ok());
  CHECK_THAT(std::string(empty.status().message()),
             Catch::Contains("upstream: endpoint 'a.example:7070,,b.example:7070' has an empty "
                             "address"));
  auto no_port = load("a.example:7070,b.example");
  REQUIRE_FALSE(no_port.ok());
  CHECK_THAT(std::string(no_port.status().message()),
             Catch::Contains("upstream=b.example is not HOST:PORT"));
}
