// Command line of straggler-sim: the flags, and the parsing of the values
// CLI11 cannot check by itself (`--slow RANK:FACTOR:FROM:TO`). Every error
// message names the offending value, e.g.
//   --slow '3:x:50:350': FACTOR 'x' is not a number
//
// Plain data and pure functions; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace straggler_sim {

// Rank `rank` computes `factor` times slower while the job is at iterations
// [from, to).
struct SlowSpec {
  uint32_t rank = 0;
  double factor = 1.0;
  uint64_t from = 0;
  uint64_t to = 0;
};

// --topology RxSxT: R data-parallel replicas x S pipeline stages x T tensor
// ranks, laid out in Megatron's default order (straggler/topology.h: rank =
// t + T*(r + R*s)); each rank declares peer group "stage<s>" and replica r.
struct Topology {
  uint32_t replicas = 0;  // 0: no --topology
  uint32_t stages = 0;
  uint32_t tensor = 0;
  uint32_t World() const { return replicas * stages * tensor; }
};

struct SimOptions {
  std::string daemon = "127.0.0.1:7070";  // where the ranks report: daemon or agent
  std::string query_daemon;               // QueryService for events; "" = daemon
  std::string job;  // empty: "sim-<pid>"
  // The launch (docs/runs.md). Empty: STRAGGLER_RUN_ID / TORCHELASTIC_RUN_ID,
  // else a random one when this process runs every rank (processes that
  // split a job must agree on it: --run-id).
  std::string run_id;
  uint32_t ranks = 8;        // run by this process: first_rank .. first_rank + ranks - 1
  uint32_t first_rank = 0;
  uint32_t world_size = 0;   // of the whole job; 0 = ranks
  uint64_t iterations = 400;
  double iteration_ms = 20.0;
  double noise = 0.05;
  uint64_t epoch_iterations = 0;  // 0: the whole run is one epoch
  std::vector<SlowSpec> slow;
  Topology topology;
  // --stage-cost c0,c1,...: stage s computes c<s> times --iteration-ms (a
  // pipeline unbalanced by design); empty = every stage 1. Needs --topology.
  std::vector<double> stage_cost;
  // --microbatches M: the pipeline model's microbatches per step (1F1B,
  // pipeline_model.h); with --topology.
  uint32_t microbatches = 8;
  bool no_exclusion = false;
  std::string report;
  uint64_t seed = 0;
  bool seed_given = false;
  int64_t membership_timeout_ms = 5000;
  bool quiet = false;

  uint32_t World() const { return world_size > 0 ? world_size : ranks; }
};

// Parses one --slow value; on error returns false and sets *error.
bool ParseSlowSpec(const std::string& text, SlowSpec* spec, std::string* error);

// Parses --topology RxSxT and --stage-cost c0,c1,...; on error return false
// and set *error, naming the value.
bool ParseTopology(const std::string& text, Topology* topology, std::string* error);
bool ParseStageCost(const std::string& text, std::vector<double>* costs, std::string* error);

// The stage of `rank` under --topology (0 without one).
uint32_t StageOf(const SimOptions& options, uint32_t rank);

// Checks the values against each other (slow ranks < ranks, ...). Empty
// string when usable, else what is wrong.
std::string Validate(const SimOptions& options);

// The slowdown of `rank` at job iteration `iteration` (1 when not slowed;
// overlapping windows: the largest factor applies), times its stage's
// --stage-cost.
double SlowFactor(const SimOptions& options, uint32_t rank, uint64_t iteration);

}  // namespace straggler_sim
