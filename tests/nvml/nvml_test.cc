// The NVML loader and sampler through the real dlopen path, against the
// stand-in libraries built from fake_nvml.c (whose readings the test sets at
// run time through a state file), the rank -> GPU mapping rule, and the seam
// the agent uses: sampler -> ReportBatch.telemetry -> a real stragglerd over
// gRPC -> GetWorker and the detection event's likely cause.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>

#include "config/config.h"
#include "server/server.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "straggler/nvml/nvml_sampler.h"
#include "straggler/nvml/telemetry_proto.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace nv = straggler::nvml;
namespace v1 = straggler::v1;
using namespace std::chrono_literals;

namespace {

// Two GPUs, healthy; GPU 1 does not measure temperature.
const char kTwoGpus[] =
    "count 2\n"
    "0 uuid GPU-aaaa0000-1111-2222-3333-444444444444\n"
    "0 sm 1770\n0 max_sm 1980\n0 mem 1593\n0 temp 64\n0 power_mw 250500\n0 limit_mw 300000\n"
    "0 util_gpu 97\n0 util_mem 40\n0 reasons 0x0\n0 ecc_corr 2\n0 ecc_uncorr 0\n"
    "1 uuid GPU-bbbb0000-1111-2222-3333-444444444444\n"
    "1 sm 1770\n1 max_sm 1980\n1 mem 1593\n1 power_mw 251000\n1 limit_mw 300000\n"
    "1 util_gpu 96\n1 util_mem 41\n1 reasons 0x0\n";

// The fake library's state file: $FAKE_NVML_STATE, rewritten atomically.
struct FakeNvml {
  explicit FakeNvml(const std::string& text) {
    char dir[] = "/tmp/fake-nvml-XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    path = std::string(dir) + "/state";
    Write(text);
    setenv("FAKE_NVML_STATE", path.c_str(), 1);
  }
  ~FakeNvml() {
    unsetenv("FAKE_NVML_STATE");
    std::remove(path.c_str());
    rmdir(path.substr(0, path.rfind('/')).c_str());
  }
  void Write(const std::string& text) {
    // rename() so that a concurrent read sees the old or the new file whole.
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp) << text;
    REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0);
  }
  std::string path;
};

// Captures what spdlog writes while alive.
struct LogCapture {
  LogCapture() : previous(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
    spdlog::set_level(spdlog::level::info);
  }
  ~LogCapture() { spdlog::set_default_logger(previous); }
  int Count(const std::string& needle) const {
    const std::string s = text.str();
    int n = 0;
    for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
    return n;
  }
  std::ostringstream text;
  std::shared_ptr<spdlog::logger> previous;
};

std::vector<nv::GpuIdentity> Gpus() {
  return {{0, "GPU-aaaa0000-1111"}, {1, "GPU-bbbb0000-2222"}, {2, "GPU-bbcc0000-3333"}};
}

}  // namespace

TEST_CASE("nvml: the loader reads every field through dlopen, in base units", "[nvml]") {
  FakeNvml fake(kTwoGpus);
  auto lib = nv::NvmlLibrary::Open(FAKE_NVML_PATH);
  REQUIRE(lib.ok());
  REQUIRE((*lib)->DeviceCount().value() == 2);
  auto s = (*lib)->Sample(0);
  REQUIRE(s.ok());
  CHECK(s->uuid == "GPU-aaaa0000-1111-2222-3333-444444444444");
  CHECK(s->sm_clock_hertz == 1.77e9);
  CHECK(s->max_sm_clock_hertz == 1.98e9);
  CHECK(s->memory_clock_hertz == 1.593e9);
  CHECK(s->temperature_celsius == 64);
  CHECK(s->power_watts == 250.5);
  CHECK(s->power_limit_watts == 300);
  CHECK(s->gpu_utilization == 0.97);
  CHECK(s->memory_utilization == 0.40);
  CHECK(s->clock_event_reasons == 0u);
  CHECK(s->ecc_corrected_errors == 2u);
  CHECK(s->ecc_uncorrected_errors == 0u);
  // NOT_SUPPORTED leaves just that field absent.
  auto s1 = (*lib)->Sample(1);
  REQUIRE(s1.ok());
  CHECK_FALSE(s1->temperature_celsius.has_value());
  CHECK_FALSE(s1->ecc_corrected_errors.has_value());
  CHECK(s1->sm_clock_hertz == 1.77e9);
  // A device NVML cannot hand out is an error naming the index.
  auto bad = (*lib)->Sample(5);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("nvmlDeviceGetHandleByIndex_v2(5)"));
}

TEST_CASE("nvml: a driver without the Events name falls back to ThrottleReasons", "[nvml]") {
  FakeNvml fake(std::string(kTwoGpus) + "0 reasons 0x40\n");
  auto lib = nv::NvmlLibrary::Open(FAKE_NVML_LEGACY_PATH);
  REQUIRE(lib.ok());
  CHECK((*lib)->Sample(0)->clock_event_reasons == 0x40u);
}

TEST_CASE("nvml: a library lacking a symbol is refused, naming the symbol", "[nvml]") {
  FakeNvml fake(kTwoGpus);
  auto lib = nv::NvmlLibrary::Open(FAKE_NVML_NO_POWER_PATH);
  REQUIRE_FALSE(lib.ok());
  CHECK(lib.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(lib.status().message()),
             Catch::Contains("nvmlDeviceGetPowerUsage") && Catch::Contains(FAKE_NVML_NO_POWER_PATH));
}

TEST_CASE("nvml: nvmlInit_v2 failing is reported with NVML's own error string", "[nvml]") {
  FakeNvml fake(std::string(kTwoGpus) + "init 9\n");
  auto lib = nv::NvmlLibrary::Open(FAKE_NVML_PATH);
  REQUIRE_FALSE(lib.ok());
  CHECK_THAT(std::string(lib.status().message()),
             Catch::Contains("nvmlInit_v2") && Catch::Contains("Driver Not Loaded"));
}

TEST_CASE("nvml: no library means telemetry off with one clear log line", "[nvml]") {
  LogCapture log;
  nv::NvmlSampler::Options o;
  o.library = "/nonexistent/libnvidia-ml.so.1";
  auto sampler = nv::NvmlSampler::Start(o);
  REQUIRE(sampler);
  CHECK_FALSE(sampler->enabled());
  CHECK_THAT(sampler->disabled_reason(), Catch::Contains("/nonexistent/libnvidia-ml.so.1"));
  CHECK_FALSE(sampler->ForRank({}).has_value());
  sampler->SampleNow();  // harmless when off
  CHECK(log.Count("\n") == 1);  // one line in all
  CHECK(log.Count("GPU telemetry off: cannot load NVML library '/nonexistent/libnvidia-ml.so.1'") == 1);
}

TEST_CASE("nvml: STRAGGLER_NVML_LIBRARY picks the library", "[nvml]") {
  FakeNvml fake(kTwoGpus);
  setenv("STRAGGLER_NVML_LIBRARY", FAKE_NVML_PATH, 1);
  auto sampler = nv::NvmlSampler::Start({});
  unsetenv("STRAGGLER_NVML_LIBRARY");
  REQUIRE(sampler->enabled());
  CHECK(sampler->Gpus().size() == 2);
}

TEST_CASE("nvml: the sampler follows the GPUs while it runs", "[nvml]") {
  FakeNvml fake(kTwoGpus);
  nv::NvmlSampler::Options o;
  o.library = FAKE_NVML_PATH;
  o.interval = 10ms;
  auto sampler = nv::NvmlSampler::Start(o);
  REQUIRE(sampler->enabled());
  nv::RankDevice rank1{/*rank=*/5, /*local_rank=*/1, "", ""};
  auto first = sampler->ForRank(rank1);
  REQUIRE(first);  // sampled before Start returned
  CHECK(first->gpu_index == 1);
  CHECK(first->clock_event_reasons == 0u);

  // Thermal throttling switched on mid-run: the sampler's thread picks it up.
  fake.Write(std::string(kTwoGpus) + "1 reasons 0x40\n1 sm 1100\n");
  std::optional<nv::GpuSample> s;
  for (int i = 0; i < 3000; ++i) {  // no timing assert: poll, a generous bound
    s = sampler->ForRank(rank1);
    if (s && s->clock_event_reasons == 0x40u) break;
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(s);
  CHECK(s->clock_event_reasons == 0x40u);
  CHECK(s->sm_clock_hertz == 1.1e9);
  CHECK(s->sequence > first->sequence);
}

TEST_CASE("nvml: rank -> GPU mapping rule", "[nvml][mapper]") {
  const auto gpus = Gpus();
  auto map = [&](uint32_t local_rank, std::string cvd, std::string uuid) {
    return nv::MapRankToGpu({0, local_rank, std::move(cvd), std::move(uuid)}, gpus);
  };
  // 1. a reported UUID wins over everything, case-insensitively; unknown = none.
  CHECK(map(0, "0", "gpu-BBBB0000-2222") == 1u);
  CHECK_FALSE(map(0, "0", "GPU-ffff").has_value());
  // 2. CUDA_VISIBLE_DEVICES: a single entry is the GPU.
  CHECK(map(3, "2", "") == 2u);
  CHECK(map(0, "GPU-aaaa", "") == 0u);      // unique UUID prefix
  CHECK(map(0, "aaaa0000", "") == 0u);      // "GPU-" may be left out
  CHECK_FALSE(map(0, "GPU-bb", "").has_value());  // ambiguous prefix
  CHECK_FALSE(map(0, "7", "").has_value());       // no such index
  // several entries: the local_rank-th.
  CHECK(map(1, "2, 0", "") == 0u);
  CHECK(map(0, "GPU-bbcc,GPU-aaaa", "") == 2u);
  CHECK_FALSE(map(2, "0,1", "").has_value());     // local_rank beyond the list
  // CUDA stops at an invalid entry; "-1" hides every GPU.
  CHECK_FALSE(map(0, "-1", "").has_value());
  CHECK(map(0, "1,-1,2", "") == 1u);
  CHECK(map(1, "1,-1,2", "") == 1u);  // the process sees one GPU: it is the rank's
  // 3. neither: local_rank is the NVML index.
  CHECK(map(2, "", "") == 2u);
  CHECK_FALSE(map(3, "", "").has_value());
}

TEST_CASE("nvml: the agent's seam carries the sampler's readings to stragglerd", "[nvml][seam]") {
  FakeNvml fake(kTwoGpus);
  nv::NvmlSampler::Options o;
  o.library = FAKE_NVML_PATH;
  o.interval = 1h;  // sampled on demand below
  auto sampler = nv::NvmlSampler::Start(o);
  REQUIRE(sampler->enabled());

  spdlog::set_level(spdlog::level::warn);
  straggler::daemon::DaemonConfig config;
  config.grpc_address = "127.0.0.1:0";
  config.http_address = "127.0.0.1:0";
  straggler::daemon::Server server;
  REQUIRE(server.Start(config).ok());
  auto channel = grpc::CreateChannel(server.grpc_dial_address(), grpc::InsecureChannelCredentials());
  auto ingest = v1::IngestService::NewStub(channel);
  auto query = v1::QueryService::NewStub(channel);

  // What two trainer processes' hellos say (client_lib fills these): rank 0
  // on CUDA_VISIBLE_DEVICES=0, rank 1 names its GPU by UUID.
  v1::StreamHello hello;
  hello.set_job_id("seam");
  hello.set_world_size(4);  // ranks 2 and 3: no device info, no telemetry
  hello.set_node("node-a");
  for (uint32_t r = 0; r < 4; ++r) hello.add_ranks(r);
  v1::RankDevice* d = hello.add_devices();
  d->set_rank(0);
  d->set_cuda_visible_devices("0");
  d = hello.add_devices();
  d->set_rank(1);
  d->set_local_rank(1);
  d->set_gpu_uuid("GPU-bbbb0000-1111-2222-3333-444444444444");

  // The agent's forwarding step: attach each rank's latest sample when new.
  std::map<uint32_t, uint64_t> last_sent;
  auto attach = [&](v1::ReportBatch& b) {
    for (const nv::RankDevice& dev : nv::DevicesOf(hello)) {
      std::optional<nv::GpuSample> s = sampler->ForRank(dev);
      if (!s || last_sent[dev.rank] == s->sequence) continue;
      nv::ToProto(*s, b.add_telemetry(), dev.rank);
      last_sent[dev.rank] = s->sequence;
    }
  };

  grpc::ClientContext ctx;
  auto stream = ingest->Stream(&ctx);
  uint64_t sequence = 0;
  auto send = [&](v1::ReportBatch& b) {
    b.set_sequence(++sequence);
    REQUIRE(stream->Write(b));
    v1::Directive ack;
    while (stream->Read(&ack) && ack.acked_sequence() != sequence) {
    }
    REQUIRE(ack.acked_sequence() == sequence);
  };
  auto reports = [&](v1::ReportBatch& b, uint64_t from, uint64_t to) {
    for (uint64_t it = from; it <= to; ++it) {
      for (uint32_t r = 0; r < 4; ++r) {
        v1::IterationReport* rep = b.add_reports();
        rep->set_rank(r);
        rep->set_iteration(it);
        rep->set_compute_seconds(r == 1 && it > 5 ? 0.3 : 0.1);
      }
    }
  };

  v1::ReportBatch b;
  *b.mutable_hello() = hello;
  attach(b);
  CHECK(b.telemetry_size() == 2);
  reports(b, 1, 5);
  send(b);
  v1::ReportBatch again;
  attach(again);
  CHECK(again.telemetry_size() == 0);  // nothing new sampled: nothing resent

  grpc::ClientContext qctx;
  v1::GetWorkerRequest req;
  req.set_job_id("seam");
  req.set_rank(1);
  v1::Worker w;
  REQUIRE(query->GetWorker(&qctx, req, &w).ok());
  CHECK(w.gpu().gpu_index() == 1);
  CHECK(w.gpu().uuid() == "GPU-bbbb0000-1111-2222-3333-444444444444");
  CHECK(w.gpu().power_watts() == 251);
  CHECK_FALSE(w.gpu().has_temperature_celsius());  // GPU 1 does not measure it

  // GPU 1 starts throttling for heat; rank 1 turns slow and is detected.
  fake.Write(std::string(kTwoGpus) + "1 reasons 0x20\n1 sm 1100\n1 temp 92\n");
  sampler->SampleNow();
  v1::ReportBatch hot;
  attach(hot);
  CHECK(hot.telemetry_size() == 2);
  reports(hot, 6, 12);
  send(hot);
  stream->WritesDone();
  v1::Directive rest;
  while (stream->Read(&rest)) {
  }
  REQUIRE(stream->Finish().ok());

  grpc::ClientContext ectx;
  v1::ListEventsRequest ereq;
  ereq.set_job_id("seam");
  v1::ListEventsResponse events;
  REQUIRE(query->ListEvents(&ectx, ereq, &events).ok());
  bool detected = false;
  for (const v1::Event& e : events.events()) {
    if (e.kind() != v1::EVENT_KIND_STATE_CHANGE || e.to() != v1::WORKER_STATE_STRAGGLER) continue;
    detected = true;
    CHECK(e.rank() == 1);
    CHECK(e.evidence().likely_cause() == v1::LIKELY_CAUSE_THERMAL_THROTTLE);
    CHECK_THAT(e.evidence().likely_cause_detail(),
               Catch::Contains("92 C") && Catch::Contains("SM clock 1.10 GHz"));
  }
  CHECK(detected);
}

TEST_CASE("nvml: the agent relays a rank's declared topology in its hellos", "[nvml][topology]") {
  v1::StreamHello hello;
  v1::RankDevice* d = hello.add_devices();
  d->set_rank(5);
  d->set_incarnation(7);
  d->set_peer_group("stage1");
  d->set_replica(0);
  d->set_gpu_model("NVIDIA H100 80GB HBM3");
  d = hello.add_devices();
  d->set_rank(6);  // declares nothing: the default group, a replica of its own
  const std::vector<nv::RankDevice> devices = nv::DevicesOf(hello);
  REQUIRE(devices.size() == 2);
  v1::RankDevice out;
  nv::ToProto(devices[0], &out);
  CHECK(out.peer_group() == "stage1");
  REQUIRE(out.has_replica());
  CHECK(out.replica() == 0);
  CHECK(out.incarnation() == 7);
  CHECK(out.gpu_model() == "NVIDIA H100 80GB HBM3");
  out.Clear();
  nv::ToProto(devices[1], &out);
  CHECK(out.peer_group().empty());
  CHECK_FALSE(out.has_replica());
}
