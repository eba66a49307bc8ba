// DaemonConfig: YAML parsing, error messages that name key/value/line,
// precedence of flags over environment over file, and job policy globs.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <sys/stat.h>
#include <unistd.h>
#include <string>

#include "auth/auth.h"
#include "config/config.h"
#include "straggler/common/config_reader.h"
#include "straggler/common/config_sections.h"

namespace sd = straggler::daemon;
using straggler::engine::PolicyKind;
using straggler::engine::RecoveryMode;

namespace {

straggler::common::EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// The error of a config text the parser must refuse.
std::string RefusedConfig(const std::string& text, const std::string& source) {
  auto cfg = sd::ParseConfig(text, source);
  REQUIRE_FALSE(cfg.ok());
  return std::string(cfg.status().message());
}

// A config file in the temp dir, removed at scope exit.
struct TempFile {
  explicit TempFile(const std::string& text) {
    char tmpl[] = "/tmp/stragglerd_config_test_XXXXXX";
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    path = tmpl;
    std::ofstream(path) << text;
  }
  ~TempFile() { std::remove(path.c_str()); }
  std::string path;
};

}  // namespace

TEST_CASE("no config file at all gives the embedded defaults") {
  auto cfg = sd::LoadConfig({}, FakeEnv({}));
  REQUIRE(cfg.ok());
  CHECK(cfg->grpc_address == "0.0.0.0:7070");
  CHECK(cfg->http_address == "0.0.0.0:7071");
  CHECK(cfg->log_level == "info");
  CHECK(cfg->limits.max_jobs == 1000);
  CHECK(cfg->limits.max_ranks_per_job == 65536);
  CHECK(cfg->limits.max_batch_reports == 10000);
  CHECK(cfg->limits.events_retained == 100000);
  CHECK(cfg->limits.job_idle_ttl_seconds == 3600);
  CHECK(cfg->limits.job_lost_after_seconds == 120);
  CHECK(cfg->limits.recent_reports_per_job == 65536);
  CHECK(cfg->limits.max_streams == 2048);
  CHECK(cfg->limits.stream_reports_per_second == 20000);
  CHECK(cfg->limits.stream_reports_burst == 100000);
  CHECK(cfg->limits.max_message_bytes == 4194304);
  CHECK(cfg->metrics.per_rank_max_ranks == 4096);
  CHECK(cfg->http.threads == 4);
  CHECK(cfg->http.read_timeout_seconds == 5);
  CHECK(cfg->http.write_timeout_seconds == 5);
  CHECK(cfg->http.max_body_bytes == 1048576);
  CHECK(cfg->http.keep_alive_max_requests == 100);
  CHECK(cfg->http.keep_alive_timeout_seconds == 2);
  CHECK(sd::SamePolicy(cfg->policy, straggler::engine::PolicyConfig{}));
  CHECK(cfg->config_file.empty());
}

TEST_CASE("deploy/stragglerd.yaml parses and documents exactly the defaults") {
  sd::ConfigSources flags;
  flags.config_file = STRAGGLER_SOURCE_DIR "/deploy/stragglerd.yaml";
  auto cfg = sd::LoadConfig(flags, FakeEnv({}));
  REQUIRE(cfg.ok());
  const sd::DaemonConfig defaults;
  CHECK(sd::SamePolicy(cfg->policy, defaults.policy));
  CHECK(cfg->grpc_address == defaults.grpc_address);
  CHECK(cfg->http_address == defaults.http_address);
  CHECK(cfg->log_level == defaults.log_level);
  CHECK(cfg->jobs.empty());
  CHECK(cfg->limits.max_jobs == defaults.limits.max_jobs);
  CHECK(cfg->limits.max_ranks_per_job == defaults.limits.max_ranks_per_job);
  CHECK(cfg->limits.max_batch_reports == defaults.limits.max_batch_reports);
  CHECK(cfg->limits.events_retained == defaults.limits.events_retained);
  CHECK(cfg->limits.job_idle_ttl_seconds == defaults.limits.job_idle_ttl_seconds);
  CHECK(cfg->limits.job_lost_after_seconds == defaults.limits.job_lost_after_seconds);
  CHECK(cfg->limits.recent_reports_per_job == defaults.limits.recent_reports_per_job);
  CHECK(cfg->limits.max_streams == defaults.limits.max_streams);
  CHECK(cfg->limits.stream_reports_per_second == defaults.limits.stream_reports_per_second);
  CHECK(cfg->limits.stream_reports_burst == defaults.limits.stream_reports_burst);
  CHECK(cfg->limits.max_message_bytes == defaults.limits.max_message_bytes);
  CHECK(cfg->metrics.per_rank_max_ranks == defaults.metrics.per_rank_max_ranks);
  CHECK(cfg->http.threads == defaults.http.threads);
  CHECK(cfg->http.read_timeout_seconds == defaults.http.read_timeout_seconds);
  CHECK(cfg->http.write_timeout_seconds == defaults.http.write_timeout_seconds);
  CHECK(cfg->http.max_body_bytes == defaults.http.max_body_bytes);
  CHECK(cfg->http.keep_alive_max_requests == defaults.http.keep_alive_max_requests);
  CHECK(cfg->http.keep_alive_timeout_seconds == defaults.http.keep_alive_timeout_seconds);
  CHECK(cfg->rendezvous.max_key_bytes == defaults.rendezvous.max_key_bytes);
  CHECK(cfg->rendezvous.max_value_bytes == defaults.rendezvous.max_value_bytes);
  CHECK(cfg->rendezvous.max_keys_per_job == defaults.rendezvous.max_keys_per_job);
  CHECK(cfg->rendezvous.max_jobs == defaults.rendezvous.max_jobs);
  CHECK(cfg->rendezvous.default_ttl_seconds == defaults.rendezvous.default_ttl_seconds);
  CHECK(cfg->rendezvous.max_ttl_seconds == defaults.rendezvous.max_ttl_seconds);
  CHECK(cfg->rendezvous.max_wait_seconds == defaults.rendezvous.max_wait_seconds);
  CHECK(cfg->rendezvous.max_waiters == defaults.rendezvous.max_waiters);
  CHECK(cfg->rendezvous.max_bytes_per_job == defaults.rendezvous.max_bytes_per_job);
  const sd::PersistenceConfig& p = cfg->persistence;
  CHECK(p.path == defaults.persistence.path);
  CHECK(p.synchronous == defaults.persistence.synchronous);
  CHECK(p.event_queue_capacity == defaults.persistence.event_queue_capacity);
  CHECK(p.events_max_age_seconds == defaults.persistence.events_max_age_seconds);
  CHECK(p.events_max_rows == defaults.persistence.events_max_rows);
  CHECK(p.membership_versions_kept == defaults.persistence.membership_versions_kept);
  CHECK(p.retention_interval_seconds == defaults.persistence.retention_interval_seconds);
  const sd::ClusterConfig& c = cfg->cluster;
  CHECK(c.etcd_endpoints == defaults.cluster.etcd_endpoints);
  CHECK(c.replica_id == defaults.cluster.replica_id);
  CHECK(c.key_prefix == defaults.cluster.key_prefix);
  CHECK(c.advertise_grpc_address == defaults.cluster.advertise_grpc_address);
  CHECK(c.advertise_http_address == defaults.cluster.advertise_http_address);
  CHECK(c.lease_ttl_seconds == defaults.cluster.lease_ttl_seconds);
  CHECK(cfg->tls.cert_file == defaults.tls.cert_file);
  CHECK(cfg->tls.key_file == defaults.tls.key_file);
  CHECK(cfg->tls.client_ca_file == defaults.tls.client_ca_file);
  CHECK(cfg->tls.grpc == defaults.tls.grpc);
  CHECK(cfg->tls.http == defaults.tls.http);
  CHECK(cfg->tls.reload_seconds == defaults.tls.reload_seconds);
  CHECK(cfg->auth.token_file == defaults.auth.token_file);
  CHECK(cfg->auth.protect_reads == defaults.auth.protect_reads);
}

TEST_CASE("tls keys parse, half a TLS setup is an error naming the missing key") {
  auto cfg = sd::ParseConfig(
      "tls:\n  cert_file: /etc/s.crt\n  key_file: /etc/s.key\n  client_ca_file: /etc/ca.pem\n"
      "  http: false\n  reload_seconds: 5\n",
      "t.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->tls.enabled());
  CHECK(cfg->tls.cert_file == "/etc/s.crt");
  CHECK(cfg->tls.key_file == "/etc/s.key");
  CHECK(cfg->tls.client_ca_file == "/etc/ca.pem");
  CHECK(cfg->tls.grpc);
  CHECK_FALSE(cfg->tls.http);
  CHECK(cfg->tls.reload_seconds == 5);
  CHECK_FALSE(sd::DaemonConfig{}.tls.enabled());

  const std::pair<const char*, const char*> bad[] = {
      {"tls:\n  cert_file: /a.crt\n", "tls.cert_file is set but tls.key_file is not"},
      {"tls:\n  key_file: /a.key\n", "tls.key_file is set but tls.cert_file is not"},
      {"tls:\n  client_ca_file: /ca.pem\n", "tls.client_ca_file (mutual TLS) needs"},
      {"tls:\n  cert_file: /a\n  key_file: /b\n  grpc: no\n  http: off\n",
       "tls.grpc and tls.http are both false"},
      {"tls:\n  grpc: maybe\n", "tls.grpc=maybe is not true or false"},
      {"tls:\n  certfile: /a\n", "unknown key 'certfile' in tls"},
  };
  for (const auto& [yaml, message] : bad) {
    auto c = sd::ParseConfig(yaml, "t.yaml");
    INFO(yaml);
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(std::string(c.status().message()), Catch::Contains(message));
  }
}

TEST_CASE("auth.token_file is read by LoadConfig into a digest, bad files name the path only") {
  TempFile token("  s3cret-Token_42\n");
  TempFile config("auth:\n  token_file: " + token.path + "\n  protect_reads: true\n");
  sd::ConfigSources flags;
  flags.config_file = config.path;
  auto cfg = sd::LoadConfig(flags, FakeEnv({}));
  REQUIRE(cfg.ok());
  CHECK(cfg->auth.token_file == token.path);
  CHECK(cfg->auth.protect_reads);
  // Surrounding whitespace is not part of the token; the token itself is not kept.
  CHECK(cfg->auth.token_sha256 == sd::TokenDigest("s3cret-Token_42"));
  CHECK(cfg->auth.token_sha256.size() == 32);

  auto reject = [&](const std::string& token_text, const std::string& expected) {
    TempFile t(token_text);
    TempFile c("auth:\n  token_file: " + t.path + "\n");
    sd::ConfigSources f;
    f.config_file = c.path;
    auto loaded = sd::LoadConfig(f, FakeEnv({}));
    INFO(token_text);
    REQUIRE_FALSE(loaded.ok());
    const std::string message(loaded.status().message());
    CHECK_THAT(message, Catch::Contains(t.path));
    CHECK_THAT(message, Catch::Contains(expected));
    if (token_text.find_first_not_of(" \n") != std::string::npos) {
      CHECK_THAT(message, !Catch::Contains("hunter2"));
    }
  };
  reject("", "is empty");
  reject(" \n\n", "is empty");
  reject("hunter2 hunter3\n", "space, control or non-ASCII character at byte 7");
  reject("hunter2\x01", "space, control or non-ASCII character");

  TempFile missing_config("auth:\n  token_file: /nonexistent/stragglerd.token\n");
  flags.config_file = missing_config.path;
  auto missing = sd::LoadConfig(flags, FakeEnv({}));
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("auth.token_file: cannot read token file "
                             "/nonexistent/stragglerd.token: No such file or directory"));

  auto reads_alone = sd::ParseConfig("auth:\n  protect_reads: true\n", "t.yaml");
  REQUIRE_FALSE(reads_alone.ok());
  CHECK_THAT(std::string(reads_alone.status().message()),
             Catch::Contains("auth.protect_reads=true needs auth.token_file"));
}

TEST_CASE("ingest limits parse, stream_reports_per_second 0 is no limit, bad values named") {
  auto cfg = sd::ParseConfig("limits:\n  max_streams: 7\n  stream_reports_per_second: 0\n"
                             "  stream_reports_burst: 9\n  max_message_bytes: 65536\n",
                             "t.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->limits.max_streams == 7);
  CHECK(cfg->limits.stream_reports_per_second == 0);
  CHECK(cfg->limits.stream_reports_burst == 9);
  CHECK(cfg->limits.max_message_bytes == 65536);
  auto bad = sd::ParseConfig("limits:\n  max_message_bytes: 100\n", "t.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "t.yaml:2: limits.max_message_bytes=100 must be >= 4096");
  bad = sd::ParseConfig("limits:\n  max_streams: 0\n", "t.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "t.yaml:2: limits.max_streams=0 must be > 0");
  bad = sd::ParseConfig("limits:\n  stream_reports_burst: -5\n", "t.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() ==
        "t.yaml:2: limits.stream_reports_burst=-5 is not an unsigned 32-bit integer");
}

TEST_CASE("persistence keys parse, --state-db wins, and bad values name the key") {
  auto cfg = sd::ParseConfig("persistence:\n  path: /var/lib/s.db\n  synchronous: full\n"
                             "  events_max_rows: 0\n",
                             "t.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->persistence.path == "/var/lib/s.db");
  CHECK(cfg->persistence.synchronous == "full");
  CHECK(cfg->persistence.events_max_rows == 0);

  auto bad = sd::ParseConfig("persistence:\n  synchronous: sometimes\n", "t.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("persistence.synchronous=sometimes") !=
        std::string::npos);
  bad = sd::ParseConfig("persistence:\n  retention_interval_seconds: 0\n", "t.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("persistence.retention_interval_seconds=0") !=
        std::string::npos);
  bad = sd::ParseConfig("persistence:\n  pth: x\n", "t.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("unknown key 'pth' in persistence") !=
        std::string::npos);

  sd::ConfigSources flags;
  flags.state_db = "/flag.db";
  auto loaded = sd::LoadConfig(flags, FakeEnv({{"STRAGGLERD_STATE_DB", "/env.db"}}));
  REQUIRE(loaded.ok());
  CHECK(loaded->persistence.path == "/flag.db");
  loaded = sd::LoadConfig(sd::ConfigSources{}, FakeEnv({{"STRAGGLERD_STATE_DB", "/env.db"}}));
  REQUIRE(loaded.ok());
  CHECK(loaded->persistence.path == "/env.db");
}

TEST_CASE("cluster keys parse, the flag beats the environment, bad ones name the key") {
  auto cfg = sd::ParseConfig(
      "cluster:\n  etcd_endpoints: 10.0.0.1:2379\n  replica_id: r-1\n  key_prefix: /s/\n"
      "  advertise_grpc_address: a:1\n  advertise_http_address: a:2\n  lease_ttl_seconds: 5\n",
      "c.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->cluster.etcd_endpoints == "10.0.0.1:2379");
  CHECK(cfg->cluster.replica_id == "r-1");
  CHECK(cfg->cluster.key_prefix == "/s/");
  CHECK(cfg->cluster.advertise_grpc_address == "a:1");
  CHECK(cfg->cluster.advertise_http_address == "a:2");
  CHECK(cfg->cluster.lease_ttl_seconds == 5);
  for (const auto& [yaml, message] : std::vector<std::pair<std::string, std::string>>{
           {"cluster:\n  key_prefix: /s\n", "cluster.key_prefix=/s must end with '/'"},
           {"cluster:\n  lease_ttl_seconds: 0\n", "cluster.lease_ttl_seconds=0 must be > 0"},
           {"cluster:\n  etcd: x\n", "unknown key 'etcd' in cluster"}}) {
    auto bad = sd::ParseConfig(yaml, "c.yaml");
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(std::string(bad.status().message()), Catch::Contains(message));
  }
  sd::ConfigSources flags;
  flags.etcd_endpoints = "10.0.0.9:2379";
  auto loaded =
      sd::LoadConfig(flags, FakeEnv({{"STRAGGLERD_ETCD_ENDPOINTS", "10.0.0.8:2379"}}));
  REQUIRE(loaded.ok());
  CHECK(loaded->cluster.etcd_endpoints == "10.0.0.9:2379");
  loaded = sd::LoadConfig(sd::ConfigSources{},
                          FakeEnv({{"STRAGGLERD_ETCD_ENDPOINTS", "10.0.0.8:2379"}}));
  REQUIRE(loaded.ok());
  CHECK(loaded->cluster.etcd_endpoints == "10.0.0.8:2379");
  CHECK(sd::RestartOnlyChanges(sd::DaemonConfig{}, *loaded) ==
        std::vector<std::string>{"cluster.etcd_endpoints ( -> 10.0.0.8:2379)"});
}

TEST_CASE("rendezvous limits parse and bad ones name the key") {
  auto cfg = sd::ParseConfig("rendezvous:\n  max_key_bytes: 64\n  max_wait_seconds: 2\n", "rv.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->rendezvous.max_key_bytes == 64);
  CHECK(cfg->rendezvous.max_wait_seconds == 2);
  auto zero = sd::ParseConfig("rendezvous:\n  max_keys_per_job: 0\n", "rv.yaml");
  REQUIRE_FALSE(zero.ok());
  CHECK_THAT(std::string(zero.status().message()),
             Catch::Contains("rendezvous.max_keys_per_job=0 must be > 0"));
  auto unknown = sd::ParseConfig("rendezvous:\n  max_keyz: 3\n", "rv.yaml");
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(std::string(unknown.status().message()), Catch::Contains("max_keyz"));
  auto ttl = sd::ParseConfig("rendezvous:\n  default_ttl_seconds: 10\n  max_ttl_seconds: 5\n",
                             "rv.yaml");
  REQUIRE_FALSE(ttl.ok());
  CHECK_THAT(std::string(ttl.status().message()), Catch::Contains("default_ttl_seconds=10"));
  auto bytes = sd::ParseConfig("rendezvous:\n  max_bytes_per_job: 1000\n", "rv.yaml");
  REQUIRE_FALSE(bytes.ok());
  CHECK_THAT(std::string(bytes.status().message()),
             Catch::Contains("rendezvous.max_bytes_per_job=1000 must be >= "
                             "rendezvous.max_key_bytes + max_value_bytes (1049088)"));
}

TEST_CASE("an empty file is all defaults") {
  auto cfg = sd::ParseConfig("", "empty.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->grpc_address == "0.0.0.0:7070");
}

TEST_CASE("a good config sets every section") {
  auto cfg = sd::ParseConfig(R"(
grpc_address: 127.0.0.1:0
http_address: 127.0.0.1:9999
log_level: debug
policy:
  kind: ewma
  limit: 7
  threshold_factor: 3.5
  recovery: probation
  ewma_ratio: 1.8
  exclusion_enabled: false
  max_compute_seconds: 60
limits:
  max_jobs: 5
  events_retained: 50
  job_idle_ttl_seconds: 120
  recent_reports_per_job: 0
metrics:
  per_rank_max_ranks: 0
http:
  threads: 8
  read_timeout_seconds: 2
  write_timeout_seconds: 3
  max_body_bytes: 4096
  keep_alive_max_requests: 10
  keep_alive_timeout_seconds: 1
jobs:
  - match: "bert-*"
    policy:
      kind: static
      static_threshold_seconds: 0.25
)",
                             "good.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->grpc_address == "127.0.0.1:0");
  CHECK(cfg->http_address == "127.0.0.1:9999");
  CHECK(cfg->log_level == "debug");
  CHECK(cfg->policy.kind == PolicyKind::kEwma);
  CHECK(cfg->policy.limit == 7);
  CHECK(cfg->policy.threshold_factor == 3.5);
  CHECK(cfg->policy.recovery == RecoveryMode::kProbation);
  CHECK(cfg->policy.ewma_ratio == 1.8);
  CHECK_FALSE(cfg->policy.exclusion_enabled);
  CHECK(cfg->policy.max_compute_seconds == 60);
  CHECK(cfg->limits.max_jobs == 5);
  CHECK(cfg->limits.events_retained == 50);
  CHECK(cfg->limits.job_idle_ttl_seconds == 120);
  CHECK(cfg->limits.recent_reports_per_job == 0);  // 0 is allowed: keep no reports
  CHECK(cfg->limits.max_batch_reports == 10000);  // untouched key keeps its default
  CHECK(cfg->metrics.per_rank_max_ranks == 0);      // 0: no per-rank series at all
  CHECK(cfg->http.threads == 8);
  CHECK(cfg->http.read_timeout_seconds == 2);
  CHECK(cfg->http.write_timeout_seconds == 3);
  CHECK(cfg->http.max_body_bytes == 4096);
  CHECK(cfg->http.keep_alive_max_requests == 10);
  CHECK(cfg->http.keep_alive_timeout_seconds == 1);
  REQUIRE(cfg->jobs.size() == 1);
  // Job overrides sit on top of the top-level policy, not of the defaults.
  const auto& bert = cfg->jobs[0].policy;
  CHECK(bert.kind == PolicyKind::kStatic);
  CHECK(bert.static_threshold_seconds == 0.25);
  CHECK(bert.limit == 7);
  CHECK_FALSE(bert.exclusion_enabled);
}

TEST_CASE("an unknown key is an error naming the key and its line") {
  SECTION("top level") {
    auto cfg = sd::ParseConfig("log_level: info\ngrpc_adress: 1.2.3.4:5\n", "x.yaml");
    REQUIRE_FALSE(cfg.ok());
    CHECK(cfg.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(cfg.status().message()) == "x.yaml:2: unknown key 'grpc_adress'");
  }
  SECTION("inside policy") {
    const std::string error = RefusedConfig("policy:\n  limit: 3\n  limt: 4\n", "x.yaml");
    CHECK(error == "x.yaml:3: unknown key 'limt' in policy");
  }
  SECTION("inside a job rule's policy") {
    const std::string error =
        RefusedConfig("jobs:\n  - match: a\n    policy:\n      foo: 1\n", "x.yaml");
    CHECK_THAT(error, Catch::Contains("x.yaml:4:") && Catch::Contains("unknown key 'foo'"));
  }
  SECTION("inside metrics") {
    const std::string error = RefusedConfig("metrics:\n  per_rank_max: 5\n", "x.yaml");
    CHECK(error == "x.yaml:2: unknown key 'per_rank_max' in metrics");
  }
  SECTION("inside http") {
    const std::string error = RefusedConfig("http:\n  thread: 5\n", "x.yaml");
    CHECK(error == "x.yaml:2: unknown key 'thread' in http");
  }
  SECTION("inside limits") {
    const std::string error = RefusedConfig("limits:\n  max_job: 3\n", "x.yaml");
    CHECK(error == "x.yaml:2: unknown key 'max_job' in limits");
  }
}

TEST_CASE("a bad value is an error naming the key and the value") {
  SECTION("not a number") {
    const std::string error = RefusedConfig("policy:\n  limit: five\n", "x.yaml");
    CHECK_THAT(error, Catch::Contains("x.yaml:2:") && Catch::Contains("policy.limit=five"));
  }
  SECTION("negative count") {
    const std::string error = RefusedConfig("policy:\n  cooldown_iterations: -1\n", "x.yaml");
    CHECK_THAT(error, Catch::Contains("cooldown_iterations=-1"));
  }
  SECTION("unknown policy kind") {
    const std::string error = RefusedConfig("policy:\n  kind: fancy\n", "x.yaml");
    // The message lists every kind, the default (peer) first (the list
    // itself: engine:"policy: ParsePolicyKind and ParseRecoveryMode").
    CHECK_THAT(error, Catch::Contains("policy.kind=fancy is not " +
                                      straggler::engine::PolicyKindChoices()));
    CHECK_THAT(error, Catch::Contains("policy.kind=fancy is not peer, "));
  }
  SECTION("unknown recovery mode") {
    const std::string error = RefusedConfig("policy:\n  recovery: sometimes\n", "x.yaml");
    CHECK_THAT(error, Catch::Contains("policy.recovery=sometimes is not shadow or probation"));
  }
  SECTION("out of range, caught by PolicyConfig::Validate") {
    const std::string error = RefusedConfig("policy:\n  threshold_factor: 0.5\n", "x.yaml");
    CHECK_THAT(error, Catch::StartsWith("x.yaml:") && Catch::Contains("threshold_factor=0.5"));
  }
  SECTION("a job rule's merged policy is validated too") {
    const std::string error = RefusedConfig(
        "jobs:\n  - match: x\n    policy:\n      max_excluded_fraction: 2\n", "x.yaml");
    CHECK_THAT(error, Catch::Contains("match 'x'") && Catch::Contains("max_excluded_fraction=2"));
  }
  SECTION("zero limit") {
    auto cfg = sd::ParseConfig("limits:\n  max_jobs: 0\n", "x.yaml");
    REQUIRE_FALSE(cfg.ok());
    CHECK_THAT(std::string(cfg.status().message()), Catch::Contains("limits.max_jobs=0"));
    cfg = sd::ParseConfig("limits:\n  job_idle_ttl_seconds: 0\n", "x.yaml");
    REQUIRE_FALSE(cfg.ok());
    CHECK_THAT(std::string(cfg.status().message()),
               Catch::Contains("limits.job_idle_ttl_seconds=0"));
  }
  SECTION("bad http and metrics values") {
    auto cfg = sd::ParseConfig("http:\n  threads: 0\n", "x.yaml");
    REQUIRE_FALSE(cfg.ok());
    CHECK_THAT(std::string(cfg.status().message()), Catch::Contains("http.threads=0 must be > 0"));
    cfg = sd::ParseConfig("http:\n  max_body_bytes: -1\n", "x.yaml");
    REQUIRE_FALSE(cfg.ok());
    CHECK_THAT(std::string(cfg.status().message()), Catch::Contains("http.max_body_bytes=-1"));
    cfg = sd::ParseConfig("metrics:\n  per_rank_max_ranks: lots\n", "x.yaml");
    REQUIRE_FALSE(cfg.ok());
    CHECK_THAT(std::string(cfg.status().message()),
               Catch::Contains("metrics.per_rank_max_ranks=lots"));
  }
  SECTION("http_address is not a unix socket") {
    sd::ConfigSources flags;
    flags.http_address = "unix:/tmp/x.sock";
    auto cfg = sd::LoadConfig(flags, FakeEnv({}));
    REQUIRE_FALSE(cfg.ok());
    CHECK_THAT(std::string(cfg.status().message()), Catch::Contains("http_address=unix:"));
  }
  SECTION("bad log level from the environment") {
    auto cfg = sd::LoadConfig({}, FakeEnv({{"STRAGGLERD_LOG_LEVEL", "loud"}}));
    REQUIRE_FALSE(cfg.ok());
    CHECK_THAT(std::string(cfg.status().message()), Catch::Contains("log_level=loud"));
  }
  SECTION("address without a port") {
    sd::ConfigSources flags;
    flags.grpc_address = "localhost";
    auto cfg = sd::LoadConfig(flags, FakeEnv({}));
    REQUIRE_FALSE(cfg.ok());
    CHECK_THAT(std::string(cfg.status().message()), Catch::Contains("grpc_address=localhost"));
  }
  SECTION("malformed YAML names the line") {
    const std::string error = RefusedConfig("policy:\n  limit: [1, 2\n", "x.yaml");
    CHECK_THAT(error, Catch::StartsWith("x.yaml:"));
  }
}

TEST_CASE("flags override the environment, which overrides the file") {
  TempFile file("grpc_address: 10.0.0.1:1000\nhttp_address: 10.0.0.1:1001\nlog_level: warn\n");

  SECTION("file only") {
    sd::ConfigSources flags;
    flags.config_file = file.path;
    auto cfg = sd::LoadConfig(flags, FakeEnv({}));
    REQUIRE(cfg.ok());
    CHECK(cfg->grpc_address == "10.0.0.1:1000");
    CHECK(cfg->log_level == "warn");
    CHECK(cfg->config_file == file.path);
  }
  SECTION("STRAGGLERD_CONFIG names the file; env beats file") {
    auto cfg = sd::LoadConfig({}, FakeEnv({{"STRAGGLERD_CONFIG", file.path},
                                           {"STRAGGLERD_GRPC_ADDRESS", "127.0.0.1:2000"}}));
    REQUIRE(cfg.ok());
    CHECK(cfg->grpc_address == "127.0.0.1:2000");
    CHECK(cfg->http_address == "10.0.0.1:1001");
    CHECK(cfg->log_level == "warn");
  }
  SECTION("flags beat env and file") {
    sd::ConfigSources flags;
    flags.config_file = file.path;
    flags.grpc_address = "127.0.0.1:0";
    flags.log_level = "error";
    auto cfg = sd::LoadConfig(flags, FakeEnv({{"STRAGGLERD_GRPC_ADDRESS", "127.0.0.1:2000"},
                                              {"STRAGGLERD_HTTP_ADDRESS", "127.0.0.1:2001"},
                                              {"STRAGGLERD_LOG_LEVEL", "debug"}}));
    REQUIRE(cfg.ok());
    CHECK(cfg->grpc_address == "127.0.0.1:0");
    CHECK(cfg->http_address == "127.0.0.1:2001");
    CHECK(cfg->log_level == "error");
  }
  SECTION("--config beats STRAGGLERD_CONFIG") {
    sd::ConfigSources flags;
    flags.config_file = file.path;
    auto cfg = sd::LoadConfig(flags, FakeEnv({{"STRAGGLERD_CONFIG", "/nonexistent.yaml"}}));
    REQUIRE(cfg.ok());
    CHECK(cfg->grpc_address == "10.0.0.1:1000");
  }
  SECTION("a missing file is an error naming it") {
    sd::ConfigSources flags;
    flags.config_file = "/nonexistent/stragglerd.yaml";
    auto cfg = sd::LoadConfig(flags, FakeEnv({}));
    REQUIRE_FALSE(cfg.ok());
    CHECK_THAT(std::string(cfg.status().message()), Catch::Contains("/nonexistent/stragglerd.yaml"));
  }
}

TEST_CASE("PolicyFor picks the first matching job rule, else the default") {
  auto cfg = sd::ParseConfig(R"(
policy:
  limit: 5
jobs:
  - match: resnet-42
    policy: {limit: 9}
  - match: "resnet-*"
    policy: {limit: 7}
  - match: "*-eval-*"
    policy: {limit: 3}
)",
                             "x.yaml");
  REQUIRE(cfg.ok());
  CHECK(cfg->PolicyFor("resnet-42").limit == 9);   // exact id, listed first
  CHECK(cfg->PolicyFor("resnet-7").limit == 7);    // glob
  CHECK(cfg->PolicyFor("resnet-").limit == 7);     // * matches nothing too
  CHECK(cfg->PolicyFor("bert-eval-1").limit == 3);
  CHECK(cfg->PolicyFor("bert").limit == 5);        // default
  CHECK(cfg->PolicyFor("xresnet-1").limit == 5);   // globs are anchored
}

TEST_CASE("GlobMatch") {
  CHECK(sd::GlobMatch("*", ""));
  CHECK(sd::GlobMatch("a*c", "abbbc"));
  CHECK(sd::GlobMatch("a*b*c", "aXbYc"));
  CHECK_FALSE(sd::GlobMatch("a*c", "abbb"));
  CHECK_FALSE(sd::GlobMatch("abc", "abcd"));
  CHECK(sd::GlobMatch("**a", "a"));
}

TEST_CASE("config: --config naming a directory is refused naming the path") {
  char tmpl[] = "/tmp/stragglerd_config_dir_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  sd::ConfigSources flags;
  flags.config_file = dir;
  auto cfg = sd::LoadConfig(flags, FakeEnv({}));
  REQUIRE_FALSE(cfg.ok());
  CHECK(std::string(cfg.status().message()) ==
        "config file " + dir + " is a directory, not a YAML file");
  rmdir(dir.c_str());
}

TEST_CASE("an alias that refers to itself is refused, not followed for ever") {
  // fuzz_config found it: the duplicate-key walk recursed until the stack ran out.
  auto top = sd::ParseConfig("a: &x [*x]\n", "t.yaml");
  REQUIRE_FALSE(top.ok());
  CHECK_THAT(std::string(top.status().message()),
             Catch::Contains("nested deeper than 32 levels"));
}

TEST_CASE("a key given twice in one map is refused naming the key and both lines") {
  auto top = sd::ParseConfig("log_level: info\ngrpc_address: 127.0.0.1:1\nlog_level: debug\n",
                             "t.yaml");
  REQUIRE_FALSE(top.ok());
  CHECK(std::string(top.status().message()) ==
        "t.yaml:3: duplicate key 'log_level' (first given on line 1)");
  auto nested = sd::ParseConfig("policy:\n  limit: 5\n  threshold_factor: 2\n  limit: 9\n",
                                "t.yaml");
  REQUIRE_FALSE(nested.ok());
  CHECK(std::string(nested.status().message()) ==
        "t.yaml:4: duplicate key 'limit' (first given on line 2)");
  auto in_jobs = sd::ParseConfig(
      "jobs:\n  - match: a\n    policy:\n      limit: 3\n      limit: 4\n", "t.yaml");
  REQUIRE_FALSE(in_jobs.ok());
  CHECK_THAT(std::string(in_jobs.status().message()),
             Catch::StartsWith("t.yaml:5: duplicate key 'limit'"));
  // The same key in two different maps is fine.
  CHECK(sd::ParseConfig("policy:\n  limit: 5\njobs:\n  - match: a\n    policy:\n      limit: 4\n",
                        "t.yaml")
            .ok());
}

TEST_CASE("every *_seconds key and every policy duration has an upper bound, named when passed") {
  for (const char* yaml : {"limits:\n  job_idle_ttl_seconds: 31536001\n",
                           "http:\n  read_timeout_seconds: 4294967295\n",
                           "rendezvous:\n  max_ttl_seconds: 40000000\n",
                           "persistence:\n  retention_interval_seconds: 99999999\n",
                           "tls:\n  reload_seconds: 31536001\n"}) {
    INFO(yaml);
    const std::string error = RefusedConfig(yaml, "t.yaml");
    CHECK_THAT(error,
               Catch::StartsWith("t.yaml:2: ") &&
                   Catch::EndsWith("is above its upper bound: must be <= 31536000 (a year)"));
  }
  CHECK(sd::ParseConfig("limits:\n  job_idle_ttl_seconds: 31536000\n", "t.yaml").ok());

  auto overflow = sd::ParseConfig("policy:\n  unresponsive_after_seconds: 1e10\n", "t.yaml");
  REQUIRE_FALSE(overflow.ok());
  CHECK(std::string(overflow.status().message()) ==
        "t.yaml:2: policy: unresponsive_after_seconds=1e+10 is above its upper bound: "
        "must be <= 604800");
}

TEST_CASE("a token file others can read, or a short token, draws a warning naming the file") {
  TempFile token("abc\n");
  chmod(token.path.c_str(), 0644);
  TempFile config("auth:\n  token_file: " + token.path + "\n");
  sd::ConfigSources flags;
  flags.config_file = config.path;
  auto cfg = sd::LoadConfig(flags, FakeEnv({}));
  REQUIRE(cfg.ok());
  REQUIRE(cfg->warnings.size() == 2);
  CHECK(cfg->warnings[0] == "auth.token_file " + token.path +
                                " has mode 0644: group or others may read the token (chmod 600 it)");
  CHECK(cfg->warnings[1] == "auth.token_file " + token.path +
                                " holds a 3-character token: use at least 16 random characters "
                                "(openssl rand -hex 32)");

  TempFile good("0123456789abcdef0123\n");
  chmod(good.path.c_str(), 0600);
  TempFile good_config("auth:\n  token_file: " + good.path + "\n");
  flags.config_file = good_config.path;
  cfg = sd::LoadConfig(flags, FakeEnv({}));
  REQUIRE(cfg.ok());
  CHECK(cfg->warnings.empty());
}

TEST_CASE("RestartOnlyChanges names each restart-only key that a reload changed") {
  sd::DaemonConfig a;
  sd::DaemonConfig b = a;
  CHECK(sd::RestartOnlyChanges(a, b).empty());
  b.persistence.synchronous = "full";
  b.http.threads = 8;
  b.tls.reload_seconds = 5;
  b.limits.max_jobs = 7;  // reloadable: not named
  b.policy.limit = 9;     // reloadable: not named
  const auto changes = sd::RestartOnlyChanges(a, b);
  REQUIRE(changes.size() == 3);
  CHECK(changes[0] == "http.threads (4 -> 8)");
  CHECK(changes[1] == "persistence.synchronous (normal -> full)");
  CHECK(changes[2] == "tls.reload_seconds (60 -> 5)");
}

TEST_CASE("a section reader's own NotFound is passed on, not read as an unknown key") {
  const straggler::common::ConfigReader reader("test.yaml");
  const YAML::Node node = YAML::Load("known: 1\nother: 2\n");
  const absl::Status unknown = straggler::common::ReadSection(
      reader, node, "sec", [](const std::string& key, const YAML::Node&) -> absl::Status {
        return key == "known" ? absl::OkStatus() : straggler::common::UnknownKey();
      });
  CHECK(unknown.message() == "test.yaml:2: unknown key 'other' in sec");
  const absl::Status own = straggler::common::ReadSection(
      reader, node, "sec", [](const std::string&, const YAML::Node&) -> absl::Status {
        return absl::NotFoundError("no such file: /etc/ca.pem");
      });
  CHECK(absl::IsNotFound(own));
  CHECK(own.message() == "no such file: /etc/ca.pem");
}
