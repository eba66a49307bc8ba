// One rank of a small synchronous "training" job for the collective tests:
// the real straggler::Client reports each step to the real stragglerd, and a
// Gloo PartialAllReduce averages a gradient among the active ranks. The
// gradient of rank r at iteration i is 12*(r+1) + 12*k + 12*(i%7) for
// element k: multiples of 12, so the sum over 3 or 4 ranks divides exactly
// and the average is an exact integer in float and double — the test
// compares it with the expected value for equality.
//
// Parameters start at 1000*rank + k (different on every rank) and move by the
// average each iteration in which the rank took part; SyncParameters makes
// them equal at iteration 0 and gives a readmitted rank the active group's.
//
// Prints one JSON object per iteration on stdout (flushed), then a final
// {"final": ...}; exits 1 with the error on stderr when a collective fails.
//
// --backend gloo (default) or nccl (builds with straggler::collective_nccl:
// rank r uses GPU r; the buffers stay host memory, which the backend stages
// through the device). --gpu-count prints the visible GPUs and exits, so the
// test can skip where there are fewer than it needs.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "driver_json.h"
#include "straggler/client.h"
#include "straggler/collective.h"
#include "straggler/collective_gloo.h"
#ifdef STRAGGLER_WITH_NCCL
#include "straggler/collective_nccl.h"
#endif

namespace {

using straggler::testing::Json;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"straggler collective test driver"};
  std::string daemon, report_endpoint, job;
  uint32_t rank = 0, world = 0;
  uint64_t iterations = 100;
  int step_ms = 20;
  int membership_timeout_ms = 10000;
  int collective_timeout_ms = 20000;
  size_t elements = 8;
  std::string go_file;
  std::string backend = "gloo";
  bool gpu_count = false;
  bool jump_to_rejoin = false;
  auto* daemon_opt = app.add_option("--daemon", daemon, "stragglerd gRPC address (rendezvous)");
  app.add_option("--report-endpoint", report_endpoint,
                 "where the client streams reports (default: --daemon; a test proxy can "
                 "delay directives)");
  auto* job_opt = app.add_option("--job", job);
  auto* rank_opt = app.add_option("--rank", rank);
  auto* world_opt = app.add_option("--world-size", world);
  app.add_option("--iterations", iterations);
  app.add_option("--step-ms", step_ms, "simulated compute time per step");
  app.add_option("--membership-timeout-ms", membership_timeout_ms);
  app.add_option("--collective-timeout-ms", collective_timeout_ms);
  app.add_option("--elements", elements);
  uint32_t agreement_interval = 1;
  app.add_option("--agreement-interval", agreement_interval,
                 "iterations between membership switches (GlooOptions::agreement_interval)");
  app.add_option("--go-file", go_file,
                 "wait for this file before iteration 0, so all ranks start together");
  app.add_option("--backend", backend, "gloo or nccl")->check(CLI::IsMember({"gloo", "nccl"}));
  app.add_flag("--gpu-count", gpu_count, "print the number of visible CUDA devices and exit");
  app.add_flag("--jump-to-rejoin", jump_to_rejoin,
               "while excluded, skip the remaining shadow iterations to the one that "
               "readmits this rank (StepPlan::rejoin_iteration)");
  CLI11_PARSE(app, argc, argv);

  if (gpu_count) {
#ifdef STRAGGLER_WITH_NCCL
    std::string why;
    const int n = straggler::NcclVisibleDevices(&why);
    std::printf("%d\n", n);
    if (n == 0) std::fprintf(stderr, "%s\n", why.c_str());
    // Which libnccl is loaded and which membership calls it allows.
    std::fprintf(stderr, "%s\n", straggler::NcclRuntimeDescription().c_str());
#else
    std::printf("0\n");
    std::fprintf(stderr, "this build has no NCCL backend\n");
#endif
    return 0;
  }
  // Required for a run, not for --gpu-count (which the test calls first).
  for (const CLI::Option* o : {daemon_opt, job_opt, rank_opt, world_opt}) {
    if (o->count() == 0) {
      std::fprintf(stderr, "%s is required\n", o->get_name().c_str());
      return 2;
    }
  }

  straggler::ClientOptions copts;
  copts.endpoint = report_endpoint.empty() ? daemon : report_endpoint;
  copts.job_id = job;
  copts.ranks = {rank};
  copts.world_size = world;
  copts.node = "node" + std::to_string(rank);
  std::string error;
  auto client = straggler::Client::Create(copts, &error);
  if (!client) {
    std::cerr << "client: " << error << "\n";
    return 2;
  }
  std::unique_ptr<straggler::PartialAllReduce> reducer;
  if (backend == "gloo") {
    straggler::GlooOptions gopts;
    gopts.rendezvous_endpoint = daemon;
    gopts.job_id = job;
    gopts.rank = rank;
    gopts.world_size = world;
    gopts.membership_timeout = std::chrono::milliseconds(membership_timeout_ms);
    gopts.agreement_interval = agreement_interval;
    gopts.collective_timeout = std::chrono::milliseconds(collective_timeout_ms);
    reducer = straggler::CreateGlooPartialAllReduce(*client, gopts, &error);
  } else {
#ifdef STRAGGLER_WITH_NCCL
    straggler::NcclOptions nopts;
    nopts.rendezvous_endpoint = daemon;
    nopts.job_id = job;
    nopts.rank = rank;
    nopts.world_size = world;
    // One GPU per rank: NCCL refuses two ranks on one GPU, except NCCL >=
    // 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 (experimental), where ranks
    // beyond the GPUs share them.
    const int gpus = std::max(1, straggler::NcclVisibleDevices());
    nopts.device = static_cast<int>(rank) % gpus;
    nopts.membership_timeout = std::chrono::milliseconds(membership_timeout_ms);
    nopts.agreement_interval = agreement_interval;
    nopts.collective_timeout = std::chrono::milliseconds(collective_timeout_ms);
    reducer = straggler::CreateNcclPartialAllReduce(*client, nopts, &error);
#else
    error = "this build has no NCCL backend (built without CUDA/NCCL)";
#endif
  }
  if (!reducer) {
    std::cerr << backend << ": " << error << "\n";
    return 2;
  }
  while (!go_file.empty() && !std::ifstream(go_file).good())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));

  std::vector<float> params(elements);
  for (size_t k = 0; k < elements; ++k) params[k] = static_cast<float>(1000 * rank + k);
  uint64_t steps_taken = 0;  // optimizer steps: part of the state a rejoiner receives

  try {
    for (uint64_t it = 0; it < iterations; ++it) {
      const auto begin = std::chrono::steady_clock::now();
      const straggler::StepPlan plan = reducer->BeginIteration(it);
      // How long the switch rule held this rank (a late directive shows here).
      const double begin_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
      bool synced = false;
      if (plan.sync_parameters) {
        synced = reducer->SyncParameters({{params.data(), params.size() * sizeof(float)},
                                          {&steps_taken, sizeof(steps_taken)}});
      }
      const auto start = std::chrono::steady_clock::now();
      std::vector<float> grad(elements);
      std::vector<double> grad64(elements);
      for (size_t k = 0; k < elements; ++k) {
        grad[k] = static_cast<float>(12 * (rank + 1) + 12 * k + 12 * (it % 7));
        grad64[k] = 2.0 * grad[k];
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
      client->Report(0, it, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      const straggler::AllReduceResult r = reducer->AllReduceAverage(std::span<float>(grad));
      reducer->AllReduceAverage(std::span<double>(grad64));
      if (r.participated) {
        // Excluded ranks never step on an average they did not take part in.
        for (size_t k = 0; k < elements; ++k) params[k] += grad[k];
        ++steps_taken;
      }
      std::printf(
          "{\"it\":%llu,\"version\":%llu,\"effective_iteration\":%llu,\"certain\":%s,"
          "\"deferred_version\":%llu,"
          "\"participated\":%s,\"active\":%s,\"synced\":%s,\"rejoin_iteration\":%s,"
          "\"begin_ms\":%.3f,\"avg\":%s,\"avg64\":%s}\n",
          static_cast<unsigned long long>(it), static_cast<unsigned long long>(plan.version),
          static_cast<unsigned long long>(plan.effective_iteration), plan.certain ? "true" : "false",
          static_cast<unsigned long long>(plan.deferred_version), r.participated ? "true" : "false", Json(plan.active_ranks).c_str(),
          synced ? "true" : "false",
          plan.rejoin_iteration ? std::to_string(*plan.rejoin_iteration).c_str() : "null", begin_ms,
          Json(grad).c_str(), Json(grad64).c_str());
      std::fflush(stdout);
      // The parameters it would compute on until then are overwritten by the
      // group's at the rejoin (SyncParameters), so the work is not needed.
      if (jump_to_rejoin && plan.rejoin_iteration && *plan.rejoin_iteration > it + 1)
        it = *plan.rejoin_iteration - 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << "\n";
    return 1;
  }
  std::printf("{\"final\":%s,\"steps_taken\":%llu}\n", Json(params).c_str(),
              static_cast<unsigned long long>(steps_taken));
  std::fflush(stdout);
  client->Flush(std::chrono::seconds(2));
  return 0;
}
