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

// Checks the values against each other (slow ranks < ranks, ...). Empty
// string when usable, else what is wrong.
std::string Validate(const SimOptions& options);

// The slowdown of `rank` at job iteration `iteration` (1 when not slowed;
// overlapping windows: the largest factor applies).
double SlowFactor(const SimOptions& options, uint32_t rank, uint64_t iteration);

}  // namespace straggler_sim
