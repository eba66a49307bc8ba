// The cost of straggler::Client::Report() on the training thread (issue 6,
// item 1; goal: <= 50 ns median, never blocking).
//
// Report() is a bounded lock-free enqueue plus a check whether the sender
// thread sleeps. Benchmarks, from the inside out:
//
//  * BM_QueuePushPop         detail::BoundedQueue TryPush + TryPop on one
//                            thread: the enqueue path itself, cache-hot.
//  * BM_ClientReport_Draining  Client::Report() connected to an in-process
//                            fake IngestService that acknowledges every batch,
//                            so the client's sender really drains the queue.
//                            Reports are timed in bursts of kBurst; between
//                            bursts (untimed) we wait until the backlog leaves
//                            room for a whole burst, so no timed call hits a
//                            full queue (counter `dropped` proves it).
//                            Counters: per_report (mean) and best_ns (the
//                            fastest burst, per report: robust to other load).
//                            Sender busy: no wake-up is needed.
//  * BM_ClientReport_IdleSender  one Report() per "training step" with the
//                            sender asleep, as in real training (a report every
//                            few ms; Flush between steps stands for the
//                            trainer's MembershipFor, which wakes the sender):
//                            each call is timed on its own; p50/p99
//                            counters (ns) include about one clock read
//                            (BM_SteadyClockNow). Second argument: how the
//                            training thread spends the step_us (third
//                            argument: 200 or 2000) between reports: 0 = asleep (sleep_for; in a VM the vCPU
//                            halts and comes back with cold caches, so this
//                            measures a cold call), 1 = computing (a busy
//                            loop, as a trainer's CPU thread does while it
//                            prepares and launches work), 2 = computing, and
//                            Flush only every 500th step (most calls then
//                            follow no send: what Report() costs when the
//                            sender's gRPC work has not just run on the core).
//  * BM_ClientReport_QueueFull  Report() to an unreachable endpoint once the
//                            queue is full: the drop path.
//  * BM_CoarseRealtimeNow    one clock_gettime(CLOCK_REALTIME_COARSE): the
//                            wall-clock read Report() makes to date the report.
//  * BM_SystemClockNow / BM_SteadyClockNow  one precise clock read, for
//                            comparison (Report() read system_clock until it
//                            switched to the coarse clock); the per-call
//                            timings of IdleSender read steady_clock twice.
//
//   client_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "queued_report.h"
#include "report_queue.h"
#include "straggler/client.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace {

namespace v1 = straggler::v1;
using Clock = std::chrono::steady_clock;

// The client's own queued report (80 bytes since issue 31's work and phases; 56 before).
using straggler::detail::QueuedReport;

constexpr size_t kQueueCapacity = 4096;  // ClientOptions default

void BM_QueuePushPop(benchmark::State& state) {
  straggler::detail::BoundedQueue<QueuedReport> q(kQueueCapacity);
  QueuedReport in{3, 0, 0, 0.1, 0, 0, 0, 0, 0, 0}, out{};
  for (auto _ : state) {
    ++in.iteration;
    benchmark::DoNotOptimize(q.TryPush(in));
    benchmark::DoNotOptimize(q.TryPop(out));
  }
  benchmark::DoNotOptimize(out);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_QueuePushPop);

// A fake IngestService: acknowledges every batch at once (no engine), so the
// client's sender drains its queue at full speed.
class AckAll final : public v1::IngestService::Service {
 public:
  grpc::Status Stream(grpc::ServerContext*,
                      grpc::ServerReaderWriter<v1::Directive, v1::ReportBatch>* stream) override {
    v1::ReportBatch batch;
    v1::Directive d;
    while (stream->Read(&batch)) {
      d.Clear();
      d.set_acked_sequence(batch.sequence());
      d.set_accepted(static_cast<uint32_t>(batch.reports_size()));
      if (!stream->Write(d)) break;
    }
    return grpc::Status::OK;
  }
};

struct FakeDaemon {
  AckAll service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

FakeDaemon& Fake() {
  static FakeDaemon* fake = [] {
    auto* f = new FakeDaemon;
    int port = 0;
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&f->service);
    f->server = b.BuildAndStart();
    f->address = "127.0.0.1:" + std::to_string(port);
    return f;
  }();
  return *fake;
}

std::unique_ptr<straggler::Client> MakeClient(const std::string& endpoint) {
  straggler::ClientOptions o;
  o.endpoint = endpoint;
  o.job_id = "bench";
  o.ranks = {0};
  o.world_size = 1;
  o.node = "bench";
  std::string error;
  auto c = straggler::Client::Create(o, &error);
  if (!c) std::fprintf(stderr, "client_bench: %s\n", error.c_str());
  return c;
}

// Waits (bounded) until the connected client's backlog is at most `backlog`.
bool WaitBacklog(straggler::Client& c, uint64_t backlog, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    const auto s = c.Stats();
    if (s.enqueued - std::min(s.enqueued, s.sent) <= backlog) return true;
    std::this_thread::yield();
  }
  return false;
}

bool WaitConnected(straggler::Client& c) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    if (c.Stats().connected) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

constexpr int kBurst = 1024;

// The timed loop of BM_ClientReport_Draining, out of line so that
// `valgrind --tool=callgrind --toggle-collect='*ReportBurst*'` counts the
// instructions of exactly kBurst Report() calls (plus a few of loop). form 0:
// Report(rank, epoch, iteration, seconds) (the C ABI's and Python's call);
// form 1: Report(epoch, iteration, seconds) for the first rank (ComputeTimer's);
// form 2: Report(rank, epoch, iteration, seconds, StepDetails) with work,
// input wait and optimizer time (issue 31; the C ABI's straggler_report_step,
// Python's report(work=...), ComputeTimer with marks).
[[gnu::noinline]] uint64_t ReportBurst(straggler::Client& client, int64_t form,
                                       uint64_t* iteration) {
  uint64_t dropped = 0;
  if (form == 0) {
    for (int k = 0; k < kBurst; ++k)
      if (!client.Report(0, 0, (*iteration)++, 0.1)) ++dropped;
  } else if (form == 2) {
    straggler::StepDetails details;
    details.input_wait_seconds = 0.004;
    details.optimizer_seconds = 0.002;
    for (int k = 0; k < kBurst; ++k) {
      details.work = static_cast<double>(4096 + k);
      if (!client.Report(0, 0, (*iteration)++, 0.1, details)) ++dropped;
    }
  } else {
    for (int k = 0; k < kBurst; ++k)
      if (!client.Report(0, (*iteration)++, 0.1)) ++dropped;
  }
  return dropped;
}

void BM_ClientReport_Draining(benchmark::State& state) {
  auto client = MakeClient(Fake().address);
  if (!client || !WaitConnected(*client)) {
    state.SkipWithError("client did not connect to the in-process fake daemon");
    return;
  }
  uint64_t iteration = 0;
  uint64_t dropped = 0;
  double best_burst = 1e9;
  for (auto _ : state) {
    if (!WaitBacklog(*client, kQueueCapacity - kBurst, std::chrono::seconds(5))) {
      state.SkipWithError("the client's sender did not drain the queue within 5 s");
      break;
    }
    const auto t0 = Clock::now();
    dropped += ReportBurst(*client, state.range(0), &iteration);
    const auto t1 = Clock::now();
    const double burst = std::chrono::duration<double>(t1 - t0).count();
    best_burst = std::min(best_burst, burst);
    state.SetIterationTime(burst);
  }
  state.SetItemsProcessed(state.iterations() * kBurst);
  // Seconds per report (printed with an SI prefix: "45.2n" is 45.2 ns).
  state.counters["per_report"] = benchmark::Counter(
      static_cast<double>(state.iterations() * kBurst),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["dropped"] = static_cast<double>(dropped);
  // The fastest burst's ns per report: on a shared machine the mean above
  // follows the other load (preemption, the sender sharing the core); the
  // best burst of a run is what Report() costs when nothing interferes.
  state.counters["best_ns"] = best_burst * 1e9 / kBurst;
}
BENCHMARK(BM_ClientReport_Draining)->ArgName("form")->Arg(0)->Arg(1)->Arg(2)->UseManualTime();

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// mode 0: a monitoring-only client (never called MembershipFor): Report()
// makes no system call. mode 1: a client that uses MembershipFor: Report()
// wakes the sleeping sender (a futex wake) so the report's round trip
// overlaps the rest of the step. mode 2: no Report() between the two clock
// reads: the timing's own cost in the same state, to subtract from modes 0/1.
constexpr int64_t kTimingOnly = 2;
constexpr int64_t kFlushRarely = 2;  // second argument ("busy")

void BM_ClientReport_IdleSender(benchmark::State& state) {
  auto client = MakeClient(Fake().address);
  if (!client || !WaitConnected(*client)) {
    state.SkipWithError("client did not connect to the in-process fake daemon");
    return;
  }
  if (state.range(0) == 1) client->MembershipFor(0, std::chrono::milliseconds(0));
  std::vector<double> ns;
  ns.reserve(static_cast<size_t>(state.max_iterations));
  uint64_t iteration = 0;
  uint64_t dropped = 0;
  for (auto _ : state) {
    // Untimed: everything sent and acknowledged and the sender back asleep,
    // as between two training steps (Flush wakes the sender, as
    // MembershipFor does in a trainer).
    if (state.range(1) != kFlushRarely || iteration % 500 == 0)
      client->Flush(std::chrono::seconds(5));
    if (state.range(1) == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(state.range(2)));
    } else {
      const auto until = Clock::now() + std::chrono::microseconds(state.range(2));
      while (Clock::now() < until) {
      }
    }
    const auto t0 = Clock::now();
    if (state.range(0) != kTimingOnly && !client->Report(0, 0, iteration++, 0.1)) ++dropped;
    const auto t1 = Clock::now();
    const double d = std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(d);
    ns.push_back(d * 1e9);
  }
  state.counters["p50_ns"] = Percentile(ns, 0.50);
  state.counters["p99_ns"] = Percentile(ns, 0.99);
  state.counters["dropped"] = static_cast<double>(dropped);
  // Share of the calls that woke the sender (a futex wake on this thread).
  state.counters["wakes"] =
      static_cast<double>(client->Stats().report_wakes) / static_cast<double>(std::max<uint64_t>(1, iteration));
}
// Each iteration spends step_us untimed: a fixed count keeps the run short.
BENCHMARK(BM_ClientReport_IdleSender)
    ->ArgsProduct({{0, 1, kTimingOnly}, {0, 1, kFlushRarely}, {200, 2000}})
    ->ArgNames({"mode", "busy", "step_us"})
    ->UseManualTime()
    ->Iterations(2000);

void BM_ClientReport_QueueFull(benchmark::State& state) {
  // Port 1 on loopback: nothing listens, the client keeps reconnecting.
  auto client = MakeClient("127.0.0.1:1");
  if (!client) {
    state.SkipWithError("client creation failed");
    return;
  }
  uint64_t iteration = 0;
  for (size_t i = 0; i <= kQueueCapacity; ++i) client->Report(0, 0, iteration++, 0.1);
  uint64_t accepted = 0;
  for (auto _ : state) accepted += client->Report(0, 0, iteration++, 0.1);
  state.SetItemsProcessed(state.iterations());
  state.counters["accepted"] = static_cast<double>(accepted);  // stays 0: all dropped
}
BENCHMARK(BM_ClientReport_QueueFull);

// The clocks: Report() reads CLOCK_REALTIME_COARSE once (the report's wall
// time); the per-call timings of BM_ClientReport_IdleSender read steady_clock
// twice.
void BM_CoarseRealtimeNow(benchmark::State& state) {
  for (auto _ : state) {
    timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    benchmark::DoNotOptimize(ts);
  }
}
BENCHMARK(BM_CoarseRealtimeNow);

void BM_SystemClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::system_clock::now());
}
BENCHMARK(BM_SystemClockNow);

void BM_SteadyClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Clock::now());
}
BENCHMARK(BM_SteadyClockNow);

}  // namespace

BENCHMARK_MAIN();
