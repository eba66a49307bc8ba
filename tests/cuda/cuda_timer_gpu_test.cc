// straggler::CudaComputeTimer against a real GPU. Without a CUDA device the
// binary exits 77, which ctest reports as skipped (SKIP_RETURN_CODE), after
// printing why. With --no-device it checks the opposite case instead: that
// on a machine without a device Create fails cleanly, naming the CUDA error
// (and exits 77 where a device exists).
//
// Timing checks use physical bounds that cannot flake: the GPU interval
// between the two events contains a host function's measured run time (lower
// bound) and lies within the wall time from Begin to the report (upper bound).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "fake_client.h"
#include "straggler/cuda_timer.h"
#include "straggler/straggler_c.h"
#include "straggler/straggler_cuda_c.h"

using straggler::CudaComputeTimer;
using straggler::CudaTimerOptions;
using straggler::testing::FakeClient;
using straggler::testing::WaitUntil;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kSkip = 77;

#define CUDA_REQUIRE(call)                                                           \
  do {                                                                               \
    const cudaError_t e_ = (call);                                                   \
    INFO(#call << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_));    \
    REQUIRE(e_ == cudaSuccess);                                                      \
  } while (0)

// A host function in the stream: sleeps `sleep`, or blocks until `release`
// is set (at most 60 s, so a failing test cannot hang the stream forever),
// and records how long it really ran.
struct HostWork {
  std::chrono::milliseconds sleep{0};
  std::atomic<bool>* release = nullptr;
  std::atomic<bool> started{false};
  // Written by the driver's callback thread, read by the test: atomics.
  std::atomic<Clock::rep> begin{0}, end{0};
};

void CUDART_CB RunHostWork(void* p) {
  auto* w = static_cast<HostWork*>(p);
  const auto begin = Clock::now();
  w->begin = begin.time_since_epoch().count();
  w->started = true;
  if (w->release != nullptr) {
    const auto limit = begin + std::chrono::seconds(60);
    while (!w->release->load() && Clock::now() < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } else {
    std::this_thread::sleep_for(w->sleep);
  }
  w->end = Clock::now().time_since_epoch().count();
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Stream {
  Stream() { CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  cudaStream_t s = nullptr;
};

CudaTimerOptions FastPolling(size_t max_pending = 8) {
  CudaTimerOptions o;
  o.max_pending = max_pending;
  o.poll_interval = std::chrono::microseconds(100);
  return o;
}

}  // namespace

TEST_CASE("GPU time of a step brackets the work in the stream and stays within wall time") {
  FakeClient client;
  Stream stream;
  std::string error;
  auto timer = CudaComputeTimer::Create(client, FastPolling(), &error);
  INFO(error);
  REQUIRE(timer);

  HostWork work;
  work.sleep = std::chrono::milliseconds(50);
  const auto t0 = Clock::now();
  REQUIRE(timer->Begin(stream.s, 2, 40));
  CUDA_REQUIRE(cudaLaunchHostFunc(stream.s, RunHostWork, &work));
  REQUIRE(timer->End(stream.s));
  REQUIRE(WaitUntil([&] { return client.Reports().size() == 1; }));
  const auto t1 = Clock::now();

  const auto r = client.Reports()[0];
  CHECK(r.rank == 3);  // FakeClient::FirstRank
  CHECK(r.epoch == 2);
  CHECK(r.iteration == 40);
  const double host = Seconds(Clock::duration(work.end.load() - work.begin.load()));
  const double wall = Seconds(t1 - t0);
  INFO("gpu " << r.seconds << " s, host function " << host << " s, wall " << wall << " s");
  // The end event cannot complete before the host function returned, nor
  // the start event after it began (GPU timestamps have ~0.5 us resolution).
  CHECK(r.seconds >= host * 0.99 - 0.0005);
  CHECK(r.seconds <= wall + 0.002);
  CHECK(timer->Stats().errors == 0);
}

TEST_CASE("Begin/End never wait for the GPU, a full pool drops and counts") {
  FakeClient client;
  Stream stream;
  std::string error;
  auto timer = CudaComputeTimer::Create(client, FastPolling(/*max_pending=*/2), &error);
  INFO(error);
  REQUIRE(timer);

  std::atomic<bool> release{false};
  HostWork blocker;
  blocker.release = &release;
  REQUIRE(timer->Begin(stream.s, 0, 0));
  CUDA_REQUIRE(cudaLaunchHostFunc(stream.s, RunHostWork, &blocker));
  REQUIRE(timer->End(stream.s));
  // The stream is blocked until `release`: if Begin/End synchronised, the
  // next lines would never return (and ctest's timeout would fail the test).
  REQUIRE(timer->Begin(stream.s, 0, 1));
  REQUIRE(timer->End(stream.s));
  CHECK_FALSE(timer->Begin(stream.s, 0, 2));  // both slots in flight
  CHECK_FALSE(timer->End(stream.s));
  REQUIRE(WaitUntil([&] { return blocker.started.load(); }));
  auto s = timer->Stats();
  CHECK(s.dropped_full == 1);
  CHECK(s.reported == 0);  // the end events cannot have completed
  release = true;
  REQUIRE(WaitUntil([&] { return timer->Stats().reported == 2; }));
  const auto r = client.Reports();
  CHECK(r[0].iteration == 0);
  CHECK(r[1].iteration == 1);
  // The pool is reusable after the drop.
  REQUIRE(timer->Begin(stream.s, 0, 3));
  REQUIRE(timer->End(stream.s));
  REQUIRE(WaitUntil([&] { return timer->Stats().reported == 3; }));
}

TEST_CASE("device work (cudaMemsetAsync of 256 MiB) is timed on the GPU") {
  FakeClient client;
  Stream stream;
  std::string error;
  auto timer = CudaComputeTimer::Create(client, FastPolling(), &error);
  INFO(error);
  REQUIRE(timer);
  void* buffer = nullptr;
  const size_t bytes = size_t{256} << 20;
  CUDA_REQUIRE(cudaMalloc(&buffer, bytes));
  const auto t0 = Clock::now();
  for (uint64_t it = 0; it < 3; ++it) {
    REQUIRE(timer->Begin(stream.s, 0, it));
    for (int k = 0; k < 4; ++k)
      CUDA_REQUIRE(cudaMemsetAsync(buffer, k, bytes, stream.s));
    REQUIRE(timer->End(stream.s));
  }
  REQUIRE(WaitUntil([&] { return client.Reports().size() == 3; }));
  const double wall = Seconds(Clock::now() - t0);
  for (const auto& r : client.Reports()) {
    INFO("iteration " << r.iteration << ": " << r.seconds << " s of wall " << wall << " s");
    CHECK(r.seconds > 0);
    CHECK(r.seconds <= wall + 0.002);
  }
  CUDA_REQUIRE(cudaStreamSynchronize(stream.s));
  CUDA_REQUIRE(cudaFree(buffer));
}

TEST_CASE("destroying the timer while the stream is stuck returns (drain timeout)") {
  FakeClient client;
  Stream stream;
  std::atomic<bool> release{false};
  HostWork blocker;
  blocker.release = &release;
  {
    CudaTimerOptions o = FastPolling();
    o.drain_timeout = std::chrono::milliseconds(50);
    std::string error;
    auto timer = CudaComputeTimer::Create(client, o, &error);
    INFO(error);
    REQUIRE(timer);
    REQUIRE(timer->Begin(stream.s, 0, 0));
    CUDA_REQUIRE(cudaLaunchHostFunc(stream.s, RunHostWork, &blocker));
    REQUIRE(timer->End(stream.s));
  }  // destroys pending events: the driver frees them once they complete
  CHECK(client.Reports().empty());
  release = true;
  CUDA_REQUIRE(cudaStreamSynchronize(stream.s));
}

TEST_CASE("C ABI: a timer on a straggler_client_t reports through the client's queue") {
  straggler_options_t o;
  straggler_options_init(&o);
  const uint32_t rank = 0;
  o.endpoint = "127.0.0.1:1";  // nobody listens: reports stay queued, which is enough
  o.job_id = "cuda-c-abi";
  o.ranks = &rank;
  o.num_ranks = 1;
  o.world_size = 1;
  char err[256] = {0};
  straggler_client_t* client = straggler_client_create(&o, err, sizeof err);
  INFO(err);
  REQUIRE(client != nullptr);
  straggler_cuda_timer_options_t to;
  straggler_cuda_timer_options_init(&to);
  to.poll_interval_us = 100;
  straggler_cuda_timer_t* timer = straggler_cuda_timer_create(client, &to, err, sizeof err);
  REQUIRE(timer != nullptr);
  Stream stream;
  HostWork work;
  work.sleep = std::chrono::milliseconds(5);
  REQUIRE(straggler_cuda_timer_begin(timer, stream.s, 0, 0) == STRAGGLER_OK);
  CUDA_REQUIRE(cudaLaunchHostFunc(stream.s, RunHostWork, &work));
  REQUIRE(straggler_cuda_timer_end(timer, stream.s) == STRAGGLER_OK);
  straggler_cuda_timer_stats_t ts;
  REQUIRE(WaitUntil([&] {
    return straggler_cuda_timer_stats(timer, &ts) == STRAGGLER_OK && ts.reported == 1;
  }));
  straggler_stats_t cs;
  REQUIRE(straggler_stats(client, &cs) == STRAGGLER_OK);
  CHECK(cs.enqueued == 1);
  CHECK(straggler_cuda_timer_end(timer, stream.s) == STRAGGLER_INCOMPLETE);  // nothing open
  CHECK(straggler_cuda_timer_begin(nullptr, stream.s, 0, 0) == STRAGGLER_EINVAL);
  straggler_cuda_timer_destroy(timer);
  straggler_client_destroy(client);
}

// Without a device: Create must fail with the CUDA error named, through both
// the C++ API and the C ABI, and never crash.
static int CheckNoDevice() {
  FakeClient client;
  std::string error;
  auto timer = CudaComputeTimer::Create(client, {}, &error);
  if (timer) {
    std::fprintf(stderr, "FAIL: CudaComputeTimer::Create succeeded without a device\n");
    return 1;
  }
  std::printf("CudaComputeTimer::Create without a device: %s\n", error.c_str());
  if (error.find("cuda") == std::string::npos) {
    std::fprintf(stderr, "FAIL: the error does not name the CUDA call\n");
    return 1;
  }
  char err[256] = {0};
  if (straggler_cuda_timer_create(nullptr, nullptr, err, sizeof err) != nullptr ||
      std::strcmp(err, "client is NULL") != 0) {
    std::fprintf(stderr, "FAIL: straggler_cuda_timer_create(NULL client): '%s'\n", err);
    return 1;
  }
  std::printf("no-device behaviour: OK\n");
  return 0;
}

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  const bool have_device = e == cudaSuccess && devices > 0;
  if (argc > 1 && std::strcmp(argv[1], "--no-device") == 0) {
    if (have_device) {
      std::printf("SKIP: %d CUDA device(s) present; the no-device check does not apply\n",
                  devices);
      return kSkip;
    }
    return CheckNoDevice();
  }
  if (!have_device) {
    std::printf("SKIP: no CUDA device (cudaGetDeviceCount: %s, %s); GPU timing not tested\n",
                cudaGetErrorName(e), cudaGetErrorString(e));
    return kSkip;
  }
  return Catch::Session().run(argc, argv);
}
