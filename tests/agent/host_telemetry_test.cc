// The agent's host telemetry (docs/agent.md#host-telemetry): the /proc
// parsers, the sampler over an injected /proc root of fake files (normal,
// a kernel without PSI, malformed files), the decorator's once-per-sample
// rule, one reading of the real /proc of this test process, and the real
// agent learning a trainer's process from its unix socket (SO_PEERCRED).
#include <catch2/catch.hpp>

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "agent.h"
#include "agent_config.h"
#include "config/config.h"
#include "server/server.h"
#include "straggler/common/validate.h"
#include "straggler/client.h"
#include "straggler/v1/straggler.grpc.pb.h"

#include <grpcpp/grpcpp.h>
#include "host_procfs.h"
#include "host_sampler.h"
#include "telemetry_attach.h"

namespace sa = straggler::agent;
namespace v1 = straggler::v1;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

// A fake /proc: a temporary directory, removed with everything in it.
struct FakeProc {
  FakeProc() {
    char tmpl[] = "/tmp/straggler_proc_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    root = tmpl;
  }
  ~FakeProc() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  void Write(const std::string& rel, const std::string& text) const {
    const fs::path p = fs::path(root) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void Pressure(const std::string& resource, double avg10, uint64_t total) const {
    Write("pressure/" + resource, "some avg10=" + std::to_string(avg10) +
                                      " avg60=0.00 avg300=0.00 total=" + std::to_string(total) +
                                      "\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n");
  }
  // /proc/stat with `total` ticks, `steal` of them stolen.
  void Stat(uint64_t total, uint64_t steal) const {
    const uint64_t idle = total - steal - 30;
    Write("stat", "cpu  10 0 20 " + std::to_string(idle) + " 0 0 0 " + std::to_string(steal) +
                      " 0 0\ncpu0 5 0 10 1 0 0 0 0 0 0\nctxt 99\n");
  }
  void Thread(int pid, int tid, uint64_t run_delay_ns, uint64_t switches) const {
    const std::string dir = std::to_string(pid) + "/task/" + std::to_string(tid);
    Write(dir + "/schedstat", "123456 " + std::to_string(run_delay_ns) + " 42\n");
    Write(dir + "/status", "Name:\tpython\nState:\tR (running)\nvoluntary_ctxt_switches:\t7\n"
                           "nonvoluntary_ctxt_switches:\t" + std::to_string(switches) + "\n");
  }
  std::string root;
};

sa::HostSampler::Options Manual(const std::string& root) {
  sa::HostSampler::Options o;
  o.proc_root = root;
  o.start_thread = false;
  return o;
}

// At least `ms` between two samples, so periods are not tiny.
void Pause(int ms = 20) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

}  // namespace

TEST_CASE("host procfs: the parsers read the values and name the file and the bad value") {
  namespace pf = sa::procfs;
  auto p = pf::ParsePressure("some avg10=12.50 avg60=1.00 avg300=0.50 total=987654\n"
                             "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
                             "/proc/pressure/io");
  REQUIRE(p.ok());
  CHECK(p->avg10_percent == Approx(12.5));
  CHECK(p->total_us == 987654u);

  auto bad = pf::ParsePressure("some avg10=abc avg60=0 avg300=0 total=1\n", "/x/pressure/cpu");
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  CHECK_THAT(std::string(bad.status().message()), Contains("/x/pressure/cpu") &&
                                                      Contains("avg10='abc'"));
  auto over = pf::ParsePressure("some avg10=140.0 avg60=0 avg300=0 total=1\n", "f");
  CHECK_THAT(std::string(over.status().message()), Contains("avg10='140.0'"));
  auto no_total = pf::ParsePressure("some avg10=1.0 avg60=0 avg300=0\n", "f");
  CHECK_THAT(std::string(no_total.status().message()), Contains("lacks total="));
  CHECK_THAT(std::string(pf::ParsePressure("full avg10=0 total=0\n", "f").status().message()),
             Contains("no 'some' line"));

  auto cpu = pf::ParseCpuTimes("cpu  100 5 30 800 10 1 2 52 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n",
                               "/proc/stat");
  REQUIRE(cpu.ok());
  CHECK(cpu->steal == 52u);
  CHECK(cpu->total == 100u + 5 + 30 + 800 + 10 + 1 + 2 + 52);  // guest is inside user
  auto short_line = pf::ParseCpuTimes("cpu  1 2 3 4 5 6 7\n", "/proc/stat");
  CHECK_THAT(std::string(short_line.status().message()), Contains("7 values"));
  auto bad_steal = pf::ParseCpuTimes("cpu  1 2 3 4 5 6 7 -8\n", "/p/stat");
  CHECK_THAT(std::string(bad_steal.status().message()),
             Contains("/p/stat") && Contains("cpu steal='-8'"));

  auto delay = pf::ParseRunDelay("1000 2500 3\n", "schedstat");
  REQUIRE(delay.ok());
  CHECK(*delay == 2500u);
  CHECK_THAT(std::string(pf::ParseRunDelay("1000\n", "/p/1/task/1/schedstat").status().message()),
             Contains("/p/1/task/1/schedstat"));
  auto sw = pf::ParseInvoluntarySwitches(
      "voluntary_ctxt_switches:\t10\nnonvoluntary_ctxt_switches:\t33\n", "status");
  REQUIRE(sw.ok());
  CHECK(*sw == 33u);
  auto sw_bad = pf::ParseInvoluntarySwitches("nonvoluntary_ctxt_switches:\tlots\n", "/p/status");
  CHECK_THAT(std::string(sw_bad.status().message()),
             Contains("/p/status") && Contains("nonvoluntary_ctxt_switches='lots'"));
}

TEST_CASE("host sampler: pressure, steal and a process's run delay as rates over the period") {
  FakeProc proc;
  proc.Pressure("cpu", 12.5, 1'000'000);
  proc.Pressure("memory", 0, 0);
  proc.Pressure("io", 3.0, 500);
  proc.Stat(1000, 10);
  proc.Thread(4242, 4242, 1'000'000'000, 100);
  auto host = sa::HostSampler::Start(Manual(proc.root));

  std::optional<sa::NodeSample> first = host->Node();
  REQUIRE(first);
  CHECK(first->period_seconds == 0);
  CHECK(first->cpu.reading == sa::Reading::kAvailable);
  CHECK(*first->cpu.some_avg10 == Approx(0.125));
  CHECK_FALSE(first->cpu.some_share);  // one reading: no period yet
  CHECK(first->steal_reading == sa::Reading::kAvailable);
  CHECK_FALSE(first->cpu_steal_share);
  CHECK_FALSE(host->ForPid(4242));  // watched from now on

  host->SampleNow();  // the process's first reading
  CHECK_FALSE(host->ForPid(4242));
  Pause();
  proc.Pressure("cpu", 20.0, 1'000'000 + 5'000);  // 5 ms stalled
  proc.Pressure("io", 3.0, 500);                   // none
  proc.Stat(1000 + 200, 10 + 50);                  // 50 of 200 ticks stolen
  proc.Thread(4242, 4242, 1'000'000'000 + 4'000'000, 100 + 6);  // +4 ms, +6
  proc.Thread(4242, 4243, 2'000'000, 3);  // a new thread: counts whole
  host->SampleNow();

  std::optional<sa::NodeSample> n = host->Node();
  REQUIRE(n);
  CHECK(n->sequence > first->sequence);
  REQUIRE(n->period_seconds > 0);
  CHECK(*n->cpu.some_avg10 == Approx(0.2));
  REQUIRE(n->cpu.some_share);
  CHECK(*n->cpu.some_share == Approx(0.005 / n->period_seconds));
  CHECK(*n->io.some_share == 0);
  REQUIRE(n->cpu_steal_share);
  CHECK(*n->cpu_steal_share == Approx(0.25));

  std::optional<sa::ProcessSample> p = host->ForPid(4242);
  REQUIRE(p);
  CHECK(p->reading == sa::Reading::kAvailable);
  REQUIRE(p->period_seconds > 0);
  CHECK(*p->run_delay_seconds_per_second == Approx(0.006 / p->period_seconds));
  CHECK(*p->involuntary_switches_per_second == Approx(9 / p->period_seconds));

  v1::HostTelemetry wire;
  sa::ToProto(*n, &wire);
  CHECK(wire.cpu_pressure().reading() == v1::HOST_READING_AVAILABLE);
  CHECK(wire.cpu_pressure().some_avg10() == Approx(0.2));
  CHECK(wire.cpu_steal_share() == Approx(0.25));
  v1::ProcessTelemetry pw;
  sa::ToProto(*p, 3, &pw);
  CHECK(pw.rank() == 3);
  CHECK(pw.pid() == 4242);
  CHECK(pw.has_run_delay_seconds_per_second());
}

TEST_CASE("host sampler: a kernel without PSI gives 'not available', never zeros") {
  FakeProc proc;  // no pressure/ directory at all
  proc.Stat(1000, 0);
  auto host = sa::HostSampler::Start(Manual(proc.root));
  Pause();
  proc.Stat(1100, 0);
  host->SampleNow();
  std::optional<sa::NodeSample> n = host->Node();
  REQUIRE(n);
  for (const sa::PressureReading* r : {&n->cpu, &n->memory, &n->io}) {
    CHECK(r->reading == sa::Reading::kNotAvailable);
    CHECK_FALSE(r->some_avg10);
    CHECK_FALSE(r->some_share);
    CHECK_THAT(r->detail, Contains("not available") && Contains(proc.root + "/pressure/"));
  }
  // Steal does not depend on PSI.
  CHECK(n->steal_reading == sa::Reading::kAvailable);
  REQUIRE(n->cpu_steal_share);
  CHECK(*n->cpu_steal_share == 0);

  v1::HostTelemetry wire;
  sa::ToProto(*n, &wire);
  CHECK(wire.memory_pressure().reading() == v1::HOST_READING_NOT_AVAILABLE);
  CHECK_FALSE(wire.memory_pressure().has_some_avg10());
  CHECK_FALSE(wire.memory_pressure().has_some_share());
  CHECK_THAT(wire.memory_pressure().detail(), Contains("pressure/memory"));
}

TEST_CASE("host sampler: malformed files are errors naming the file and the value") {
  FakeProc proc;
  proc.Pressure("cpu", 1.0, 10);
  proc.Write("pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=many\n");
  proc.Pressure("io", 1.0, 10);
  proc.Write("stat", "cpu  1 x 3 4 5 6 7 8\n");
  proc.Thread(77, 77, 5, 5);
  proc.Write("77/task/77/schedstat", "100 not-a-number 3\n");
  auto host = sa::HostSampler::Start(Manual(proc.root));
  host->ForPid(77);
  host->SampleNow();

  std::optional<sa::NodeSample> n = host->Node();
  REQUIRE(n);
  CHECK(n->cpu.reading == sa::Reading::kAvailable);
  CHECK(n->memory.reading == sa::Reading::kError);
  CHECK_THAT(n->memory.detail, Contains(proc.root + "/pressure/memory") && Contains("'many'"));
  CHECK(n->steal_reading == sa::Reading::kError);
  CHECK_THAT(n->steal_detail, Contains(proc.root + "/stat") && Contains("cpu nice='x'"));
  CHECK_FALSE(n->cpu_steal_share);

  std::optional<sa::ProcessSample> p = host->ForPid(77);
  REQUIRE(p);
  CHECK(p->reading == sa::Reading::kError);
  CHECK_THAT(p->detail, Contains("77/task/77/schedstat") && Contains("'not-a-number'"));
  CHECK_FALSE(p->run_delay_seconds_per_second);

  // A process that does not exist: not available, saying so.
  host->ForPid(78);
  host->SampleNow();
  std::optional<sa::ProcessSample> gone = host->ForPid(78);
  REQUIRE(gone);
  CHECK(gone->reading == sa::Reading::kNotAvailable);
  CHECK_THAT(gone->detail, Contains("process 78 does not exist"));
  // Unchanged, it is not a new sample (so not sent again).
  host->SampleNow();
  CHECK(host->ForPid(78)->sequence == gone->sequence);
}

TEST_CASE("host decorator: each sample goes upstream once per stream") {
  FakeProc proc;
  proc.Pressure("cpu", 1.0, 10);
  proc.Pressure("memory", 1.0, 10);
  proc.Pressure("io", 1.0, 10);
  proc.Stat(1000, 0);
  proc.Thread(500, 500, 1000, 1);
  auto host = sa::HostSampler::Start(Manual(proc.root));
  const std::string job = "job";
  std::map<uint32_t, straggler::nvml::RankDevice> devices;
  std::map<uint32_t, uint64_t> marks, process_marks;
  std::map<uint32_t, int64_t> pids{{2, 500}};
  uint64_t host_mark = 0;
  sa::BatchContext ctx{job, devices, marks, pids, host_mark, process_marks};

  v1::ReportBatch b1;
  CHECK(sa::AttachHostTelemetry(*host, ctx, b1) == 1);  // the node; the process not read yet
  CHECK(b1.has_host());
  CHECK(b1.processes_size() == 0);
  host->SampleNow();
  Pause();
  proc.Thread(500, 500, 2000, 2);
  host->SampleNow();
  v1::ReportBatch b2;
  CHECK(sa::AttachHostTelemetry(*host, ctx, b2) == 2);
  REQUIRE(b2.processes_size() == 1);
  CHECK(b2.processes(0).rank() == 2);
  CHECK(b2.processes(0).pid() == 500);
  v1::ReportBatch b3;  // nothing new
  CHECK(sa::AttachHostTelemetry(*host, ctx, b3) == 0);
  CHECK_FALSE(b3.has_host());
  host_mark = 0;  // a new upstream stream
  process_marks.clear();
  v1::ReportBatch b4;
  CHECK(sa::AttachHostTelemetry(*host, ctx, b4) == 2);
}

TEST_CASE("host sampler: the real /proc of this process, with busy threads on one core") {
  auto host = sa::HostSampler::Start(Manual("/proc"));
  const bool psi = fs::exists("/proc/pressure/cpu");
  std::optional<sa::NodeSample> n = host->Node();
  REQUIRE(n);
  CHECK(n->cpu.reading == (psi ? sa::Reading::kAvailable : sa::Reading::kNotAvailable));
  CHECK(n->steal_reading == sa::Reading::kAvailable);
  const int64_t pid = ::getpid();
  host->ForPid(pid);
  host->SampleNow();

  // Three spinning threads pinned to one CPU of ours: at most one runs, the
  // others wait runnable (run delay) and are preempted (involuntary switches).
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  REQUIRE(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &allowed)) ++cpu;
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < 3; ++i) {
    busy.emplace_back([&] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      pthread_setaffinity_np(pthread_self(), sizeof one, &one);
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  Pause(300);
  host->SampleNow();  // while they still run: their threads are listed
  stop = true;
  for (auto& t : busy) t.join();

  std::optional<sa::ProcessSample> p = host->ForPid(pid);
  REQUIRE(p);
  INFO(p->detail);
  REQUIRE(p->reading == sa::Reading::kAvailable);
  REQUIRE(p->run_delay_seconds_per_second);
  CHECK(*p->run_delay_seconds_per_second > 0);
  REQUIRE(p->involuntary_switches_per_second);
  CHECK(*p->involuntary_switches_per_second > 0);
}

TEST_CASE("host_telemetry config: keys, and an empty proc_root is an error") {
  auto c = sa::ParseAgentConfig(
      "host_telemetry:\n  enabled: false\n  interval_ms: 250\n  proc_root: /host/proc\n", "a.yaml");
  REQUIRE(c.ok());
  CHECK_FALSE(c->host_telemetry_enabled);
  CHECK(c->host_telemetry_interval_ms == 250);
  CHECK(c->proc_root == "/host/proc");
  auto empty = sa::ParseAgentConfig("host_telemetry:\n  proc_root: \"\"\n", "a.yaml");
  REQUIRE_FALSE(empty.ok());
  CHECK_THAT(std::string(empty.status().message()), Contains("host_telemetry.proc_root"));
  auto zero = sa::ParseAgentConfig("host_telemetry:\n  interval_ms: 0\n", "a.yaml");
  REQUIRE_FALSE(zero.ok());
  CHECK_THAT(std::string(zero.status().message()), Contains("host_telemetry.interval_ms=0"));
}

TEST_CASE("host telemetry through the real agent: the trainer's process from its unix socket") {
  namespace sd = straggler::daemon;
  sd::DaemonConfig dc;
  dc.grpc_address = "127.0.0.1:0";
  dc.http_address = "127.0.0.1:0";
  dc.log_level = "warn";
  sd::Server daemon;
  REQUIRE(daemon.Start(dc).ok());

  sa::AgentConfig ac;
  ac.listen = "unix:///tmp/straggler-agent-host-" + std::to_string(getpid()) + ".sock";
  ac.upstream = "127.0.0.1:" + std::to_string(daemon.grpc_port());
  ac.http_address = "";
  ac.telemetry_enabled = false;
  ac.host_telemetry_interval_ms = 20;
  sa::Agent agent(ac);
  // Runs after the host decorator: sees what it attached.
  absl::Mutex mu;
  std::map<uint32_t, int64_t> pids;
  std::vector<v1::ProcessTelemetry> processes;
  int hosts = 0;
  agent.SetBatchDecorator([&](const sa::BatchContext& ctx, v1::ReportBatch& batch) {
    absl::MutexLock lock(&mu);
    pids = ctx.pids;
    for (const auto& p : batch.processes()) processes.push_back(p);
    hosts += batch.has_host() ? 1 : 0;
  });
  REQUIRE(agent.Start().ok());

  straggler::ClientOptions o;
  o.endpoint = ac.listen;
  o.job_id = "host";
  o.ranks = {5};
  o.world_size = 8;
  auto client = straggler::Client::Create(o);
  REQUIRE(client);
  // Report until the daemon shows a process sample of rank 5, at most 20 s:
  // the daemon keeps the latest per rank and shows it in the rank's Worker.
  auto query = v1::QueryService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(daemon.grpc_port()), grpc::InsecureChannelCredentials()));
  v1::Worker w;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (uint64_t it = 0;; ++it) {
    if (std::chrono::steady_clock::now() > deadline)
      FAIL("no process sample of rank 5 in the daemon's Worker within 20 s");
    REQUIRE(client->Report(5, it, 0.01));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    grpc::ClientContext qctx;
    v1::GetWorkerRequest req;
    req.set_job_id("host");
    req.set_rank(5);
    if (query->GetWorker(&qctx, req, &w).ok() && w.has_process()) break;
  }
  client.reset();
  agent.Shutdown();
  CHECK(w.process().pid() == static_cast<uint32_t>(::getpid()));
  CHECK(w.process().reading() == v1::HOST_READING_AVAILABLE);
  CHECK(w.host().steal_reading() == v1::HOST_READING_AVAILABLE);
  CHECK_FALSE(w.host_stale());
  daemon.Shutdown(std::chrono::milliseconds(0));

  absl::MutexLock lock(&mu);
  CHECK(pids == std::map<uint32_t, int64_t>{{5, ::getpid()}});
  CHECK(hosts >= 1);
  const v1::ProcessTelemetry& p = processes.front();
  CHECK(p.rank() == 5);
  CHECK(p.pid() == static_cast<uint32_t>(::getpid()));
  CHECK(p.reading() == v1::HOST_READING_AVAILABLE);
  CHECK(p.period_seconds() > 0);
  CHECK(p.has_run_delay_seconds_per_second());
  CHECK(p.has_involuntary_switches_per_second());
}

TEST_CASE("host telemetry the daemon refuses: shares outside [0, 1], NaN rates, named") {
  v1::HostTelemetry h;
  h.set_period_seconds(1);
  h.mutable_cpu_pressure()->set_some_share(0.5);
  CHECK(straggler::common::ValidateHostTelemetry(h).ok());
  h.mutable_io_pressure()->set_some_share(1.5);
  absl::Status s = straggler::common::ValidateHostTelemetry(h);
  CHECK_THAT(std::string(s.message()), Contains("io_pressure.some_share=1.5"));
  h.mutable_io_pressure()->clear_some_share();
  h.set_cpu_steal_share(-0.1);
  CHECK_THAT(std::string(straggler::common::ValidateHostTelemetry(h).message()),
             Contains("cpu_steal_share=-0.1"));

  v1::ProcessTelemetry p;
  p.set_rank(3);
  p.set_period_seconds(1);
  p.set_run_delay_seconds_per_second(2.5);  // several threads waiting: above 1 is fine
  CHECK(straggler::common::ValidateProcessTelemetry(p).ok());
  p.set_involuntary_switches_per_second(std::nan(""));
  CHECK_THAT(std::string(straggler::common::ValidateProcessTelemetry(p).message()),
             Contains("rank 3") && Contains("involuntary_switches_per_second=nan"));
}
