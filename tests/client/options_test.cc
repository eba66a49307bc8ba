// ClientOptions::FromEnv and Validate: launchers' environment variables in,
// messages that name the offending variable and value out.
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "straggler/client.h"

using straggler::ClientOptions;

namespace {

const char* const kVars[] = {"RANK",           "WORLD_SIZE",       "LOCAL_RANK",
                             "STRAGGLER_ENDPOINT", "STRAGGLER_JOB_ID", "STRAGGLER_NODE",
                             "STRAGGLER_ITERATIONS_PER_EPOCH", "CUDA_VISIBLE_DEVICES",
                             "STRAGGLER_GPU_UUID", "STRAGGLER_TLS_CA", "STRAGGLER_TLS_CERT",
                             "STRAGGLER_TLS_KEY", "STRAGGLER_PEER_GROUP", "STRAGGLER_REPLICA",
                             "TORCHELASTIC_RUN_ID", "STRAGGLER_RUN_ID"};

// Each test starts from a clean environment for the variables FromEnv reads.
struct CleanEnv {
  CleanEnv() { Clear(); }
  ~CleanEnv() { Clear(); }
  static void Clear() {
    for (const char* v : kVars) unsetenv(v);
  }
};

ClientOptions Good() {
  ClientOptions o;
  o.job_id = "job-a";
  o.ranks = {1};
  o.world_size = 4;
  return o;
}

}  // namespace

TEST_CASE("FromEnv reads the launcher and straggler variables", "[options]") {
  CleanEnv env;
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("STRAGGLER_ENDPOINT", "unix:///run/straggler/agent.sock", 1);
  setenv("STRAGGLER_JOB_ID", "resnet-42", 1);
  setenv("STRAGGLER_NODE", "gpu-node-7", 1);
  setenv("STRAGGLER_ITERATIONS_PER_EPOCH", "391", 1);
  setenv("CUDA_VISIBLE_DEVICES", "2,3", 1);
  setenv("STRAGGLER_GPU_UUID", "GPU-8f3a0c11-2b4e-4c1d-9e7a-0123456789ab", 1);
  const ClientOptions o = ClientOptions::FromEnv();
  CHECK(o.cuda_visible_devices == "2,3");
  CHECK(o.gpu_uuid == "GPU-8f3a0c11-2b4e-4c1d-9e7a-0123456789ab");
  CHECK(o.ranks == std::vector<uint32_t>{3});
  CHECK(o.world_size == 8);
  CHECK(o.local_rank == 1);
  CHECK(o.endpoint == "unix:///run/straggler/agent.sock");
  CHECK(o.job_id == "resnet-42");
  CHECK(o.node == "gpu-node-7");
  CHECK(o.iterations_per_epoch == 391);
  CHECK(o.env_error.empty());
  CHECK(o.Validate().empty());
}

TEST_CASE("FromEnv with nothing set keeps defaults and Validate says what is missing",
          "[options]") {
  CleanEnv env;
  const ClientOptions o = ClientOptions::FromEnv();
  CHECK(o.endpoint == ClientOptions{}.endpoint);
  CHECK(o.ranks.empty());
  CHECK(o.Validate().find("STRAGGLER_JOB_ID") != std::string::npos);
  setenv("STRAGGLER_JOB_ID", "j", 1);
  CHECK(ClientOptions::FromEnv().Validate().find("WORLD_SIZE") != std::string::npos);
  setenv("WORLD_SIZE", "2", 1);
  CHECK(ClientOptions::FromEnv().Validate().find("RANK") != std::string::npos);
  setenv("RANK", "1", 1);
  CHECK(ClientOptions::FromEnv().Validate().empty());
}

// Issue 28: under torchrun without STRAGGLER_JOB_ID every rank died on
// "job_id is empty"; the launch's rendezvous id names the job instead.
TEST_CASE("job_id_missing: FromEnv takes torchrun's run id, else the refusal names "
          "STRAGGLER_JOB_ID", "[options]") {
  CleanEnv env;
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("TORCHELASTIC_RUN_ID", "23a6e586-22b1-4a14-a40c-7b63f6438a45", 1);  // --standalone's
  ClientOptions o = ClientOptions::FromEnv();
  CHECK(o.job_id == "23a6e586-22b1-4a14-a40c-7b63f6438a45");
  CHECK(o.run_id == o.job_id);
  CHECK(o.Validate().empty());
  // STRAGGLER_JOB_ID wins; set but empty counts as unset.
  setenv("STRAGGLER_JOB_ID", "resnet", 1);
  CHECK(ClientOptions::FromEnv().job_id == "resnet");
  setenv("STRAGGLER_JOB_ID", "", 1);
  CHECK(ClientOptions::FromEnv().job_id == "23a6e586-22b1-4a14-a40c-7b63f6438a45");
  // torchrun's "none" (no --rdzv_id), and an id the daemon would refuse,
  // name no job: the refusal names the variable to set.
  for (const char* run : {"none", "my run", ""}) {
    INFO("TORCHELASTIC_RUN_ID='" << run << "'");
    setenv("TORCHELASTIC_RUN_ID", run, 1);
    o = ClientOptions::FromEnv();
    CHECK(o.job_id.empty());
    CHECK_THAT(o.Validate(), Catch::StartsWith("job_id is empty (set STRAGGLER_JOB_ID"));
  }
}

TEST_CASE("Validate refuses the job ids the daemon refuses, naming the byte", "[options]") {
  ClientOptions o;
  o.job_id = "resnet-42_a.b";
  o.world_size = 2;
  o.ranks = {0};
  CHECK(o.Validate().empty());
  o.job_id = "my job";
  CHECK(o.Validate() == "job_id 'my job' has ' ' at byte 2; allowed: A-Z a-z 0-9 . _ -");
  o.job_id = std::string("a\nb");
  CHECK(o.Validate() == "job_id 'a\\nb' has '\\n' at byte 1; allowed: A-Z a-z 0-9 . _ -");
  o.job_id = std::string(128, 'j');
  CHECK(o.Validate().empty());
  o.job_id = std::string(129, 'j');
  CHECK(o.Validate() == "job_id '" + std::string(32, 'j') + "...' is 129 bytes; at most 128");
  // run_id: the same rule, and "" (the job's default run) is fine.
  o.job_id = "j";
  o.run_id = "";
  CHECK(o.Validate().empty());
  o.run_id = "run 2";
  CHECK(o.Validate() == "run_id 'run 2' has ' ' at byte 3; allowed: A-Z a-z 0-9 . _ -");
  o.run_id = std::string(129, 'r');
  CHECK(o.Validate() == "run_id '" + std::string(32, 'r') + "...' is 129 bytes; at most 128");
}

TEST_CASE("FromEnv: a bad integer is reported by Validate with variable and value",
          "[options]") {
  CleanEnv env;
  setenv("STRAGGLER_JOB_ID", "j", 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);

  SECTION("not a number") {
    setenv("WORLD_SIZE", "eight", 1);
    const std::string e = ClientOptions::FromEnv().Validate();
    CHECK(e.find("WORLD_SIZE") != std::string::npos);
    CHECK(e.find("'eight'") != std::string::npos);
  }
  SECTION("negative") {
    setenv("RANK", "-1", 1);
    const ClientOptions o = ClientOptions::FromEnv();
    CHECK(o.ranks.empty());
    const std::string e = o.Validate();
    CHECK(e.find("RANK='-1'") != std::string::npos);
  }
  SECTION("trailing garbage") {
    setenv("LOCAL_RANK", "2x", 1);
    CHECK(ClientOptions::FromEnv().Validate().find("LOCAL_RANK='2x'") != std::string::npos);
  }
  SECTION("out of range for 32 bits") {
    setenv("WORLD_SIZE", "4294967296", 1);
    CHECK(ClientOptions::FromEnv().Validate().find("WORLD_SIZE='4294967296'") !=
          std::string::npos);
  }
  SECTION("empty") {
    setenv("STRAGGLER_ITERATIONS_PER_EPOCH", "", 1);
    CHECK(ClientOptions::FromEnv().Validate().find("STRAGGLER_ITERATIONS_PER_EPOCH=''") !=
          std::string::npos);
  }
}

TEST_CASE("Validate names the offending value", "[options]") {
  CHECK(Good().Validate().empty());

  ClientOptions o = Good();
  o.job_id.clear();
  CHECK(o.Validate().find("job_id") != std::string::npos);

  o = Good();
  o.world_size = 0;
  CHECK(o.Validate().find("world_size=0") != std::string::npos);

  o = Good();
  o.ranks.clear();
  CHECK(o.Validate().find("ranks") != std::string::npos);

  o = Good();
  o.ranks = {0, 4};
  CHECK(o.Validate() == "rank 4 >= world_size=4");

  o = Good();
  o.ranks = {2, 2};
  CHECK(o.Validate().find("rank 2 listed twice") != std::string::npos);

  o = Good();
  o.queue_capacity = 0;
  CHECK(o.Validate().find("queue_capacity=0") != std::string::npos);

  o = Good();
  o.max_batch = 0;
  CHECK(o.Validate().find("max_batch=0") != std::string::npos);

  o = Good();
  o.endpoint.clear();
  CHECK(o.Validate().find("endpoint") != std::string::npos);

  o = Good();
  o.backoff_initial = std::chrono::milliseconds(0);
  CHECK(o.Validate().find("backoff_initial=0ms") != std::string::npos);

  o = Good();
  o.backoff_initial = std::chrono::milliseconds(200);
  o.backoff_max = std::chrono::milliseconds(100);
  CHECK(o.Validate().find("backoff_max=100ms") != std::string::npos);

  o = Good();
  o.max_send_delay = std::chrono::milliseconds(0);
  CHECK(o.Validate().find("max_send_delay=0ms") != std::string::npos);
}

TEST_CASE("Client::Create refuses invalid options with the reason", "[options]") {
  ClientOptions o = Good();
  o.world_size = 0;
  std::string error;
  CHECK(straggler::Client::Create(o, &error) == nullptr);
  CHECK(error.find("world_size=0") != std::string::npos);
}

TEST_CASE("FromEnv takes the TLS files, half a client certificate and unreadable files fail",
          "[options]") {
  CleanEnv env;
  CHECK(ClientOptions::FromEnv().tls_ca_file.empty());
  setenv("STRAGGLER_TLS_CA", "/etc/straggler/ca.pem", 1);
  setenv("STRAGGLER_TLS_CERT", "/etc/straggler/rank.pem", 1);
  setenv("STRAGGLER_TLS_KEY", "/etc/straggler/rank.key", 1);
  const ClientOptions from_env = ClientOptions::FromEnv();
  CHECK(from_env.tls_ca_file == "/etc/straggler/ca.pem");
  CHECK(from_env.tls_cert_file == "/etc/straggler/rank.pem");
  CHECK(from_env.tls_key_file == "/etc/straggler/rank.key");

  ClientOptions o = Good();
  o.tls_cert_file = "/etc/straggler/rank.pem";
  CHECK(o.Validate().find("tls cert file /etc/straggler/rank.pem is set but no tls key file") !=
        std::string::npos);
  o.tls_cert_file.clear();
  o.tls_key_file = "/etc/straggler/rank.key";
  CHECK(o.Validate().find("tls key file /etc/straggler/rank.key is set but no tls cert file") !=
        std::string::npos);

  // Files are read by Create: a missing CA is an error now, not a channel
  // that never connects.
  o = Good();
  o.tls_ca_file = "/nonexistent/straggler-ca.pem";
  std::string error;
  CHECK(straggler::Client::Create(o, &error) == nullptr);
  CHECK(error ==
        "cannot read tls ca file /nonexistent/straggler-ca.pem: No such file or directory");

  // A unix: endpoint (the node agent) is plaintext whatever the TLS
  // variables say, so the files are not even read.
  o.endpoint = "unix:///run/straggler/agent.sock";
  CHECK(straggler::Client::Create(o, &error) != nullptr);
}

TEST_CASE("Validate: several daemon replicas comma-separated, none empty", "[options]") {
  ClientOptions o;
  o.job_id = "j";
  o.world_size = 2;
  o.ranks = {0};
  o.endpoint = "10.0.0.1:7070, 10.0.0.2:7070";
  CHECK(o.Validate().empty());
  o.endpoint = "10.0.0.1:7070,";
  CHECK(o.Validate() ==
        "endpoint '10.0.0.1:7070,' has an empty address (one address, or several separated by "
        "commas)");
}
