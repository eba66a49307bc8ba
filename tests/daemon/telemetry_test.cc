// GPU telemetry end to end in the daemon, over real gRPC and HTTP on
// loopback: ReportBatch.telemetry -> GetWorker / REST worker, the
// straggler_rank_gpu_* series on /metrics (checked by promtool), and the
// likely cause on the detection event (thermal when the straggler's GPU is
// throttled, none_visible when it looks like the others, unspecified without
// telemetry).
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <google/protobuf/util/json_util.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <unistd.h>

#include "config/config.h"
#include "daemon_test_util.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;
using namespace straggler::daemon::testutil;

namespace {

constexpr uint32_t kWorld = 4;

v1::GpuTelemetry Gpu(uint32_t index, double sm_ghz, uint64_t reasons, double temp) {
  v1::GpuTelemetry t;
  t.set_gpu_index(index);
  t.set_uuid("GPU-0000000" + std::to_string(index));
  t.mutable_sample_time()->set_seconds(1714564800);
  t.set_sm_clock_hertz(sm_ghz * 1e9);
  t.set_max_sm_clock_hertz(1.98e9);
  t.set_memory_clock_hertz(1.593e9);
  t.set_temperature_celsius(temp);
  t.set_power_watts(250);
  t.set_power_limit_watts(300);
  t.set_gpu_utilization(0.97);
  t.set_memory_utilization(0.4);
  t.set_clock_event_reasons(reasons);
  return t;
}

struct Fixture : LoopbackDaemon {
  Fixture() { http = std::make_unique<httplib::Client>("127.0.0.1", server.http_port()); }

  // One stream for all ranks: the telemetry of `rank3` (none when nullopt)
  // and of healthy ranks 0-2, then 12 iterations with rank 3 a straggler at
  // iteration 10 (AddRank3Slower). Returns the batch's ack.
  v1::Directive Feed(const std::string& job, std::optional<v1::GpuTelemetry> rank3,
                     bool others = true) {
    v1::ReportBatch b = Hello(job, kWorld, {0, 1, 2, 3}, "node-a");
    for (uint32_t r = 0; r < 3 && others; ++r) {
      v1::RankTelemetry* t = b.add_telemetry();
      t->set_rank(r);
      *t->mutable_gpu() = Gpu(r, 1.77, 0, 64);
    }
    if (rank3) {
      v1::RankTelemetry* t = b.add_telemetry();
      t->set_rank(3);
      *t->mutable_gpu() = *rank3;
    }
    AddRank3Slower(b, kWorld);
    return SendAlone(*ingest, b);
  }

  std::unique_ptr<httplib::Client> http;
};

// promtool's findings on `text` ("" = clean), or a line saying it failed.
std::string PromtoolCheck(const std::string& text) {
  char path[] = "/tmp/stragglerd-metrics-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream(path) << text;
  const std::string cmd = std::string(STRAGGLER_PROMTOOL) + " check metrics < " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int rc = pclose(p);
  std::remove(path);
  if (rc != 0 && out.empty()) out = "promtool exited with status " + std::to_string(rc);
  return out;
}

}  // namespace

TEST_CASE("telemetry: GetWorker and REST show the rank's latest sample", "[telemetry]") {
  Fixture f;
  f.Feed("tele-worker", Gpu(3, 1.10, 0x40, 91));
  v1::Worker w = WorkerOf(*f.query, "tele-worker", 3);
  REQUIRE(w.has_gpu());
  CHECK(w.gpu().uuid() == "GPU-00000003");
  CHECK(w.gpu().sm_clock_hertz() == 1.10e9);
  CHECK(w.gpu().temperature_celsius() == 91);
  CHECK(w.gpu().clock_event_reasons() == 0x40);
  CHECK_FALSE(w.gpu_stale());

  auto res = f.http->Get("/v1/jobs/tele-worker/workers/3");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  v1::Worker rest;
  REQUIRE(google::protobuf::util::JsonStringToMessage(res->body, &rest).ok());
  CHECK(rest.gpu().sm_clock_hertz() == 1.10e9);
  CHECK_THAT(res->body, Catch::Contains("\"clockEventReasons\":\"64\""));

  // Every rank shows its own GPU.
  w = WorkerOf(*f.query, "tele-worker", 0);
  CHECK(w.gpu().sm_clock_hertz() == 1.77e9);
}

TEST_CASE("telemetry: /metrics carries the straggler_rank_gpu_* series and passes promtool",
          "[telemetry]") {
  Fixture f;
  f.Feed("tele-metrics", Gpu(3, 1.10, 0x40 | 0x4, 91));
  auto res = f.http->Get("/metrics");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  const std::string& text = res->body;
  const std::string labels = "{job=\"tele-metrics\",rank=\"3\",node=\"node-a\",gpu=\"3\"}";
  CHECK_THAT(text, Catch::Contains("# TYPE straggler_rank_gpu_sm_clock_hertz gauge\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_gpu_sm_clock_hertz" + labels + " 1100000000\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_gpu_temperature_celsius" + labels + " 91\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_gpu_power_watts" + labels + " 250\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_gpu_throttle_thermal" + labels + " 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_gpu_throttle_power" + labels + " 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_gpu_utilization_ratio" + labels + " 0.97\n"));
  CHECK_THAT(text, Catch::Contains(
                       "straggler_rank_gpu_throttle_thermal{job=\"tele-metrics\",rank=\"0\","
                       "node=\"node-a\",gpu=\"0\"} 0\n"));
  CHECK_THAT(text, Catch::Contains("straggler_telemetry_samples_total 4\n"));
  CHECK(PromtoolCheck(text).empty());
}

TEST_CASE("telemetry: the detection event carries the likely cause", "[telemetry]") {
  Fixture f;
  SECTION("thermal throttling on the straggler's GPU") {
    f.Feed("tele-thermal", Gpu(3, 1.10, 0x20, 91));
    const v1::Event e = DetectionOf(*f.query, "tele-thermal", 3);
    CHECK(e.evidence().likely_cause() == v1::LIKELY_CAUSE_THERMAL_THROTTLE);
    CHECK_THAT(e.evidence().likely_cause_detail(),
               Catch::Contains("91 C") && Catch::Contains("62% of the other ranks' median 1.77 GHz"));
  }
  SECTION("a GPU that looks like the others") {
    f.Feed("tele-none", Gpu(3, 1.76, 0, 65));
    CHECK(DetectionOf(*f.query, "tele-none", 3).evidence().likely_cause() ==
          v1::LIKELY_CAUSE_NONE_VISIBLE);
  }
  SECTION("no telemetry at all") {
    f.Feed("tele-absent", std::nullopt, /*others=*/false);
    const v1::Event e = DetectionOf(*f.query, "tele-absent", 3);
    CHECK(e.evidence().likely_cause() == v1::LIKELY_CAUSE_UNSPECIFIED);
    CHECK(e.evidence().likely_cause_detail().empty());
  }
}

TEST_CASE("telemetry: samples for foreign ranks or with impossible values are refused and counted",
          "[telemetry]") {
  Fixture f;
  v1::ReportBatch b = Hello("tele-bad", kWorld, {0});
  v1::RankTelemetry* t = b.add_telemetry();
  t->set_rank(2);  // not this stream's
  *t->mutable_gpu() = Gpu(2, 1.7, 0, 60);
  t = b.add_telemetry();
  t->set_rank(0);
  *t->mutable_gpu() = Gpu(0, 1.7, 0, 60);
  t->mutable_gpu()->set_gpu_utilization(1.5);  // > 1
  SendAlone(*f.ingest, b);
  auto res = f.http->Get("/metrics");
  REQUIRE(res);
  CHECK_THAT(res->body, Catch::Contains(
                            "straggler_telemetry_rejected_total{reason=\"rank_not_in_stream\"} 1\n"));
  CHECK_THAT(res->body,
             Catch::Contains("straggler_telemetry_rejected_total{reason=\"invalid_value\"} 1\n"));
  CHECK_THAT(res->body, Catch::Contains("straggler_telemetry_samples_total 0\n"));
  CHECK_FALSE(WorkerOf(*f.query, "tele-bad", 0).has_gpu());
}
