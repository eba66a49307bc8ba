// One process of a small hybrid-parallel job for the hybrid tests: R replicas
// x S=2 pipeline stages, Megatron's rank order (rank = replica + R * stage).
// Each process holds C model chunks of its stage, each chunk a data-parallel
// group of its own ("stage<s>.chunk<c>", one rank per replica) reduced by a
// Gloo group PartialAllReduce; all of a process's groups share one JobSwitch
// (the job's agreement, once per iteration) over a flat PartialAllReduce of
// every rank.
//
// The pipeline is real: stage 0 sends its activations to stage 1 of the same
// replica and receives the activations' gradients back, by Gloo
// point-to-point messages on a two-rank context per replica (built once at
// start through the daemon's rendezvous store). A replica left out of the
// data-parallel groups keeps running it (shadow steps) and steps no
// optimizer.
//
// Model, per element k of E (float): stage 0 h = a*x + b; stage 1 y = c*h + d,
// loss 0.5*(y - t)^2; chunk 0 holds (a | c), chunk 1 (b | d). Plain SGD.
//
// Prints one JSON object per iteration (flushed): the plan of each chunk's
// group, and a checksum (FNV-1a of the bytes) of each chunk's parameters
// after the step; then {"final": ...}. Exits 1 with the error on stderr when
// a collective fails. An excluded replica that learns where it is taken back
// skips its remaining shadow steps, both stages together (stage 0 decides and
// tells stage 1 over the pipe every step); skipped iterations print
// "skipped": true. --no-skip runs every shadow step instead.
#include <CLI/CLI.hpp>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <cstring>
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
#include "straggler/gloo_store.h"

namespace {

using straggler::testing::Json;

std::string Checksum(const std::vector<float>& v) {
  uint64_t h = 14695981039346656037ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Point-to-point between the two stages of this replica, on a context of two
// ranks (stage 0 is rank 0 in it). Each message has its own slot per
// iteration and direction, so messages can never pair with another step's.
class Pipe {
 public:
  Pipe(std::shared_ptr<gloo::Context> ctx, std::chrono::milliseconds timeout) : ctx_(std::move(ctx)), timeout_(timeout) {}
  void Send(std::vector<float>& data, uint64_t it, uint32_t dir) {
    auto buf = ctx_->createUnboundBuffer(data.data(), data.size() * sizeof(float));
    buf->send(1 - ctx_->rank, Slot(it, dir));
    if (!buf->waitSend(timeout_)) throw std::runtime_error("pipeline send timed out at iteration " + std::to_string(it));
  }
  void Recv(std::vector<float>& data, uint64_t it, uint32_t dir) {
    auto buf = ctx_->createUnboundBuffer(data.data(), data.size() * sizeof(float));
    buf->recv(1 - ctx_->rank, Slot(it, dir));
    if (!buf->waitRecv(timeout_)) throw std::runtime_error("pipeline receive timed out at iteration " + std::to_string(it));
  }
  // Stage 0 tells stage 1 where the replica goes next (the same for both:
  // they skip to a rejoin together or not at all).
  uint64_t Next(uint64_t it, uint64_t next) {
    auto buf = ctx_->createUnboundBuffer(&next, sizeof next);
    if (ctx_->rank == 0) {
      buf->send(1, Slot(it, 2));
      if (!buf->waitSend(timeout_)) throw std::runtime_error("pipeline control send timed out at iteration " + std::to_string(it));
    } else {
      buf->recv(0, Slot(it, 2));
      if (!buf->waitRecv(timeout_)) throw std::runtime_error("pipeline control receive timed out at iteration " + std::to_string(it));
    }
    return next;
  }

 private:
  static uint64_t Slot(uint64_t it, uint32_t dir) { return (it << 2) | dir; }
  std::shared_ptr<gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"straggler hybrid-parallel test driver"};
  std::string daemon, job, go_file, run_id = "hybrid";
  uint32_t rank = 0, replicas = 4, chunks = 2;
  uint64_t iterations = 100, slow_from = 0, slow_to = 0;
  int step_ms = 20, slow_ms = 0, membership_timeout_ms = 10000, collective_timeout_ms = 20000;
  size_t elements = 8;
  app.add_option("--daemon", daemon, "stragglerd gRPC address (reports and rendezvous)")->required();
  app.add_option("--job", job)->required();
  app.add_option("--rank", rank)->required();
  app.add_option("--replicas", replicas);
  app.add_option("--chunks", chunks, "model chunks per stage, each its own data-parallel group");
  app.add_option("--iterations", iterations);
  app.add_option("--step-ms", step_ms, "simulated compute per step");
  app.add_option("--slow-ms", slow_ms, "compute per step while slow (iterations [slow-from, slow-to))");
  app.add_option("--slow-from", slow_from);
  app.add_option("--slow-to", slow_to);
  app.add_option("--elements", elements);
  app.add_option("--membership-timeout-ms", membership_timeout_ms);
  app.add_option("--collective-timeout-ms", collective_timeout_ms);
  app.add_option("--run-id", run_id);
  app.add_option("--go-file", go_file, "wait for this file before iteration 0");
  bool no_skip = false;
  app.add_flag("--no-skip", no_skip,
               "an excluded replica runs every shadow step up to its rejoin instead of skipping to it");
  CLI11_PARSE(app, argc, argv);

  const uint32_t world = replicas * 2;
  const uint32_t replica = rank % replicas, stage = rank / replicas;
  const auto timeout = std::chrono::milliseconds(collective_timeout_ms);

  straggler::ClientOptions copts;
  copts.endpoint = daemon;
  copts.job_id = job;
  copts.run_id = run_id;
  copts.ranks = {rank};
  copts.world_size = world;
  copts.node = "node" + std::to_string(rank);
  copts.peer_group = "stage" + std::to_string(stage);
  copts.replica = replica;
  std::string error;
  auto client = straggler::Client::Create(copts, &error);
  if (!client) {
    std::cerr << "client: " << error << "\n";
    return 2;
  }
  straggler::GlooOptions gopts;
  gopts.rendezvous_endpoint = daemon;
  gopts.job_id = job;
  gopts.run_id = run_id;
  gopts.rank = rank;
  gopts.world_size = world;
  gopts.membership_timeout = std::chrono::milliseconds(membership_timeout_ms);
  gopts.collective_timeout = timeout;
  std::vector<uint32_t> replica_of(world);
  for (uint32_t r = 0; r < world; ++r) replica_of[r] = r % replicas;
  auto job_reducer = straggler::CreateGlooPartialAllReduce(*client, gopts, &error);
  std::shared_ptr<straggler::JobSwitch> sw =
      job_reducer ? straggler::JobSwitch::Create(std::move(job_reducer), replica_of, world, &error) : nullptr;
  if (!sw) {
    std::cerr << "job switch: " << error << "\n";
    return 2;
  }
  std::vector<std::unique_ptr<straggler::PartialAllReduce>> dp;
  for (uint32_t c = 0; c < chunks; ++c) {
    straggler::DataParallelGroup g;
    g.name = "stage" + std::to_string(stage) + ".chunk" + std::to_string(c);
    for (uint32_t r = 0; r < replicas; ++r) {
      g.ranks.push_back(r + replicas * stage);
      g.replicas.push_back(r);
    }
    dp.push_back(straggler::CreateGlooGroupPartialAllReduce(*client, sw, g, gopts, &error));
    if (!dp.back()) {
      std::cerr << "group " << g.name << ": " << error << "\n";
      return 2;
    }
  }
  std::shared_ptr<gloo::Context> pipe_ctx;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto store = std::make_shared<straggler::DaemonStore>(daemon, job, std::chrono::minutes(10), timeout);
    gloo::rendezvous::PrefixStore prefixed("pipe/" + run_id + "/r" + std::to_string(replica), *store);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(stage), 2);
    ctx->setTimeout(timeout);
    ctx->connectFullMesh(prefixed, device);
    pipe_ctx = ctx;
  } catch (const std::exception& e) {
    std::cerr << "pipeline context: " << e.what() << "\n";
    return 2;
  }
  Pipe pipe(pipe_ctx, timeout);
  while (!go_file.empty() && !std::ifstream(go_file).good())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));

  // Chunk c's parameters start different on every rank: the first sync
  // makes each group's equal to its lowest replica's.
  std::vector<std::vector<float>> params(chunks, std::vector<float>(elements));
  for (uint32_t c = 0; c < chunks; ++c)
    for (size_t k = 0; k < elements; ++k) params[c][k] = 0.5f + 0.01f * static_cast<float>(rank + 3 * c + k);
  uint64_t steps_taken = 0;
  const float lr = 0.05f;

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<straggler::StepPlan> plans;
  std::vector<bool> synced(chunks, false);
  // One line per iteration; a skipped one repeats the plans it skipped from
  // (not participating) and says "skipped".
  auto PrintLine = [&](uint64_t it, bool skipped) {
    std::ostringstream line;
    line << "{\"it\":" << it << ",\"t\":"
         << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << ",\"rank\":" << rank << ",\"replica\":" << replica << ",\"stage\":" << stage
         << ",\"skipped\":" << (skipped ? "true" : "false")
         << ",\"steps_taken\":" << steps_taken << ",\"job_active\":" << Json(sw->job().Plan().active_ranks)
         << ",\"chunks\":[";
    for (uint32_t c = 0; c < chunks; ++c) {
      const straggler::StepPlan& p = plans[c];
      line << (c ? "," : "") << "{\"version\":" << p.version << ",\"effective_iteration\":" << p.effective_iteration
           << ",\"certain\":" << (p.certain ? "true" : "false") << ",\"deferred_version\":" << p.deferred_version
           << ",\"participating\":" << (p.participating ? "true" : "false") << ",\"active\":" << Json(p.active_ranks)
           << ",\"root\":" << p.root << ",\"synced\":" << (synced[c] ? "true" : "false") << ",\"checksum\":\""
           << Checksum(params[c]) << "\"}";
    }
    line << "]}\n";
    std::fputs(line.str().c_str(), stdout);
    std::fflush(stdout);
  };
  try {
    for (uint64_t it = 0; it < iterations; ++it) {
      plans.clear();
      synced.assign(chunks, false);
      for (uint32_t c = 0; c < chunks; ++c) {
        plans.push_back(dp[c]->BeginIteration(it));
        if (plans.back().sync_parameters) {
          synced[c] = dp[c]->SyncParameters({{params[c].data(), params[c].size() * sizeof(float)},
                                             {&steps_taken, sizeof(steps_taken)}});
        }
      }
      // Skipping to the rejoin (docs/hybrid.md, "Readmission inside a
      // pipeline"): stage 0's plan names where the groups take the replica
      // back; both stages go there together, the steps in between unrun.
      const uint64_t next = pipe.Next(it, !no_skip && stage == 0 && plans[0].rejoin_iteration
                                              ? *plans[0].rejoin_iteration
                                              : it);
      if (next > it) {
        for (uint64_t s = it; s < next && s < iterations; ++s) PrintLine(s, true);
        it = next - 1;
        continue;
      }
      const auto start = std::chrono::steady_clock::now();
      const int ms = (slow_ms > 0 && it >= slow_from && it < slow_to) ? slow_ms : step_ms;
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      const double compute = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // Chunk 0 is the multiplier, the last chunk the bias of the stage
      // (with one chunk: h = a*x + a).
      std::vector<float>& mul = params[0];
      std::vector<float>& bias = params[chunks - 1];
      std::vector<std::vector<float>> grads(chunks, std::vector<float>(elements, 0.0f));
      std::vector<float> x(elements), h(elements), dh(elements);
      for (size_t k = 0; k < elements; ++k) x[k] = 0.1f * static_cast<float>((replica + it + k) % 5);
      if (stage == 0) {
        for (size_t k = 0; k < elements; ++k) h[k] = mul[k] * x[k] + bias[k];
        pipe.Send(h, it, 0);
        pipe.Recv(dh, it, 1);
        for (size_t k = 0; k < elements; ++k) {
          grads[0][k] += dh[k] * x[k];
          grads[chunks - 1][k] += dh[k];
        }
      } else {
        pipe.Recv(h, it, 0);
        for (size_t k = 0; k < elements; ++k) {
          const float t = 0.2f * static_cast<float>((replica * 3 + it + k) % 7);
          const float dy = mul[k] * h[k] + bias[k] - t;
          grads[0][k] += dy * h[k];
          grads[chunks - 1][k] += dy;
          dh[k] = dy * mul[k];
        }
        pipe.Send(dh, it, 1);
      }
      client->Report(0, it, compute);
      bool stepped = false;
      for (uint32_t c = 0; c < chunks; ++c) {
        const straggler::AllReduceResult r = dp[c]->AllReduceAverage(std::span<float>(grads[c]));
        if (r.participated) {
          for (size_t k = 0; k < elements; ++k) params[c][k] -= lr * grads[c][k];
          stepped = true;
        }
      }
      if (stepped) ++steps_taken;
      PrintLine(it, false);
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << "\n";
    return 1;
  }
  std::printf("{\"final\":true,\"steps_taken\":%llu}\n", static_cast<unsigned long long>(steps_taken));
  std::fflush(stdout);
  client->Flush(std::chrono::seconds(2));
  return 0;
}
