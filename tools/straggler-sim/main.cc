// straggler-sim — a simulated synchronous data-parallel job that reports to a
// real stragglerd through the real client library, so the whole loop
// (report -> detection -> membership -> partial "all-reduce") can be watched
// and measured without GPUs:
//
//   straggler-sim --daemon 127.0.0.1:7070 --ranks 8 --iterations 400
//                 --slow 3:3:50:350 --report run.json
//
// Each rank is a thread with its own straggler::Client (ranks = {r}). A step
// is: ask the client which membership is in force at iteration i, "compute"
// (sleep for a drawn time), report the measured time, then wait in an
// in-process barrier for the active ranks of that membership — so the job
// runs at the speed of the slowest *active* rank, as with a partial
// all-reduce. An excluded rank keeps computing and reporting on its own
// ("shadow"), and rejoins the group at the effective iteration of the first
// version that includes it again.
//
// Exit status: 0 ok; 1 ranks ran a step with different active sets (or the
// collective hung); 2 bad flags; 3 the daemon (--daemon) was never reached:
// no report of any rank came back acknowledged, rejected or as a duplicate.
// Ranks that ran a step with the same active
// set under different version numbers (a rank still disconnected after a
// daemon restart) are counted in the report's version_splits, not failed.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "options.h"
#include "sim.h"
#include "straggler/client.h"

int main(int argc, char** argv) {
  using straggler_sim::SimOptions;
  SimOptions o;
  std::vector<std::string> slow_texts;
  CLI::App app{
      "straggler-sim: a simulated synchronous data-parallel job reporting to stragglerd\n"
      "TLS to the daemon from STRAGGLER_TLS_CA, STRAGGLER_TLS_CERT, STRAGGLER_TLS_KEY; the\n"
      "bearer token for reading its events (auth.protect_reads) from the file\n"
      "STRAGGLER_TOKEN_FILE names."};
  app.add_option("--daemon", o.daemon, "daemon gRPC address")->capture_default_str();
  app.add_option("--job", o.job, "job id (default sim-<pid>)");
  app.add_option("--run-id", o.run_id,
                 "this launch's run id (default: STRAGGLER_RUN_ID or TORCHELASTIC_RUN_ID, else a "
                 "random one when this process runs every rank; processes that split one job "
                 "across --first-rank must pass the same value)");
  app.add_option("--ranks", o.ranks, "ranks (threads) this process runs")->capture_default_str();
  app.add_option("--first-rank", o.first_rank,
                 "the first of this process's ranks: it runs FIRST..FIRST+RANKS-1 (one job split "
                 "across processes; each process's collective waits for its own ranks only)")
      ->capture_default_str();
  app.add_option("--world-size", o.world_size, "ranks in the whole job (default: --ranks)");
  app.add_option("--iterations", o.iterations, "iterations to run")->capture_default_str();
  app.add_option("--iteration-ms", o.iteration_ms, "compute time of a healthy step, ms")
      ->capture_default_str();
  app.add_option("--noise", o.noise, "relative gaussian noise on compute time (sigma)")
      ->capture_default_str();
  app.add_option("--epoch-iterations", o.epoch_iterations, "iterations per epoch (0 = one epoch)")
      ->capture_default_str();
  app.add_option("--slow", slow_texts,
                 "RANK:FACTOR:FROM:TO — rank computes FACTOR times slower at iterations "
                 "[FROM, TO); repeatable")
      ->allow_extra_args(false);
  std::string topology_text, stage_cost_text;
  app.add_option("--topology", topology_text,
                 "REPLICASxSTAGESxTENSOR, e.g. 4x2x2: each rank declares peer group stage<s> and "
                 "replica r (rank = t + T*(r + R*s), docs/topology.md); --ranks defaults to the "
                 "product");
  app.add_option("--stage-cost", stage_cost_text,
                 "c0,c1,...: stage s computes c<s> times --iteration-ms (needs --topology)");
  app.add_option("--microbatches", o.microbatches,
                 "with --topology: microbatches per step of the 1F1B pipeline model whose "
                 "throughput the summary shows (docs/tools.md)")
      ->capture_default_str();
  app.add_flag("--no-exclusion", o.no_exclusion, "ignore memberships: every rank in every step");
  app.add_option("--report", o.report, "write a JSON report to this file");
  app.add_option("--query-daemon", o.query_daemon,
                 "daemon address for reading the job's events when --daemon is a node agent "
                 "(default: --daemon)");
  auto* seed = app.add_option("--seed", o.seed, "random seed (default: random, printed)");
  app.add_option("--membership-timeout-ms", o.membership_timeout_ms,
                 "how long a rank waits for the membership of an iteration")
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "print nothing but errors");
  app.footer(
      "Exit status: 0 ok; 1 ranks ran a step with different active sets, or the collective "
      "hung; 2 bad flags; 3 the daemon at --daemon was never reached (no report answered).");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? straggler_sim::kExitOk : straggler_sim::kExitUsage;
  }
  for (const auto& text : slow_texts) {
    straggler_sim::SlowSpec spec;
    std::string error;
    if (!straggler_sim::ParseSlowSpec(text, &spec, &error)) {
      std::cerr << "straggler-sim: " << error << '\n';
      return straggler_sim::kExitUsage;
    }
    o.slow.push_back(spec);
  }
  if (!topology_text.empty()) {
    std::string error;
    if (!straggler_sim::ParseTopology(topology_text, &o.topology, &error)) {
      std::cerr << "straggler-sim: " << error << '\n';
      return straggler_sim::kExitUsage;
    }
    if (app.count("--ranks") == 0 && app.count("--world-size") == 0) o.ranks = o.topology.World();
  }
  if (!stage_cost_text.empty()) {
    std::string error;
    if (!straggler_sim::ParseStageCost(stage_cost_text, &o.stage_cost, &error)) {
      std::cerr << "straggler-sim: " << error << '\n';
      return straggler_sim::kExitUsage;
    }
  }
  if (std::string error = straggler_sim::Validate(o); !error.empty()) {
    std::cerr << "straggler-sim: " << error << '\n';
    return straggler_sim::kExitUsage;
  }
  if (o.job.empty()) o.job = "sim-" + std::to_string(getpid());
  if (o.run_id.empty()) o.run_id = straggler::ClientOptions::FromEnv().run_id;
  if (o.run_id.empty() && o.first_rank == 0 && o.ranks == o.World()) {
    // One process, the whole job: a launch of its own, so a job id used
    // again does not inherit the last launch's exclusions.
    std::mt19937_64 rng(std::random_device{}());
    char text[32];
    std::snprintf(text, sizeof text, "sim-%016llx", static_cast<unsigned long long>(rng()));
    o.run_id = text;
  }
  o.seed_given = seed->count() > 0;
  if (!o.seed_given) o.seed = std::random_device{}();
  return straggler_sim::Sim(std::move(o)).Run();
}
