// stragglerctl against stragglerd replicas on a real etcd (issue 30,
// docs/cluster.md "Redirects"): the stragglerctl binary, given a replica that
// does not own the job (or several addresses, one of them down), follows the
// redirect to the owner for queries and admin calls.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "child_process.h"
#include "daemon_test_util.h"
#include "etcd_catch.h"
#include "replica_test_util.h"

namespace straggler::daemon {
namespace {

using namespace std::chrono_literals;
using cluster::testing::Finish;
using cluster::testing::RequireEtcd;
using cluster::testing::Slurp;
using cluster::testing::Spawn;
using testutil::LoopbackDaemon;
using testutil::kSteadyLeaseSeconds;
using testutil::ReplicaConfig;
using testutil::TakeWithHello;

struct CtlResult {
  int rc = -1;
  std::string out;
  std::string err;
};

CtlResult Ctl(const std::string& daemons, std::vector<std::string> args) {
  static int n = 0;
  const std::string dir = std::string(STRAGGLER_CLUSTER_TEST_DIR) + "/stragglerctl";
  std::filesystem::create_directories(dir);
  std::vector<std::string> argv = {STRAGGLERCTL, "--daemon", daemons, "--timeout-ms", "5000"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = Spawn(argv, dir + "/ctl" + std::to_string(++n));
  CtlResult r;
  r.rc = Finish(child, 20s);
  r.out = Slurp(child.out);
  r.err = Slurp(child.err);
  return r;
}

TEST_CASE("stragglerctl: queries and admin calls sent to a replica that does not own the job "
          "reach its owner",
          "[cluster]") {
  auto etcd = RequireEtcd();
  LoopbackDaemon owner(ReplicaConfig(etcd->endpoint(), "ra", kSteadyLeaseSeconds));
  LoopbackDaemon other(ReplicaConfig(etcd->endpoint(), "rb", kSteadyLeaseSeconds));
  TakeWithHello(owner, "job-ctl");
  const std::string b = other.server.grpc_dial_address();

  // Only the replica that does not own the job is named: it redirects.
  CtlResult job = Ctl(b, {"--output", "json", "job", "job-ctl"});
  INFO(job.err);
  CHECK(job.rc == 0);
  CHECK_THAT(job.out, Catch::Contains("\"jobId\": \"job-ctl\""));

  CtlResult workers = Ctl(b, {"workers", "job-ctl"});
  INFO(workers.err);
  CHECK(workers.rc == 0);

  CtlResult override_rank = Ctl(b, {"override", "job-ctl", "2", "exclude", "--reason", "bad NIC"});
  INFO(override_rank.err);
  CHECK(override_rank.rc == 0);
  // Applied on the owner.
  CtlResult after = Ctl(owner.server.grpc_dial_address(), {"--output", "json", "workers", "job-ctl"});
  CHECK_THAT(after.out, Catch::Contains("RANK_OVERRIDE_FORCE_EXCLUDE"));

  CtlResult policy = Ctl(b, {"policy", "job-ctl", "--limit", "7"});
  INFO(policy.err);
  CHECK(policy.rc == 0);

  // A list whose other address is down: tried once each, the owner found.
  for (int i = 0; i < 4; ++i) {
    CtlResult listed = Ctl("127.0.0.1:1," + b, {"membership", "job-ctl"});
    INFO(listed.err);
    CHECK(listed.rc == 0);
  }
  // Every address down: unreachable (exit 3) without waiting out the timeout.
  const auto start = std::chrono::steady_clock::now();
  CtlResult down = Ctl("127.0.0.1:1,127.0.0.1:2", {"jobs"});
  CHECK(down.rc == 3);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  // A bad list is a usage error naming it.
  CtlResult bad = Ctl("127.0.0.1:1,,127.0.0.1:2", {"jobs"});
  CHECK(bad.rc == 2);
  CHECK_THAT(bad.err, Catch::Contains("'127.0.0.1:1,,127.0.0.1:2'"));
}

}  // namespace
}  // namespace straggler::daemon
