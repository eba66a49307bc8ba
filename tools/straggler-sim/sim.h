// straggler-sim's simulated job (main.cc has the command line): one thread
// per rank, each with its own straggler::Client, stepping through the
// iterations under the membership in force (sim.cc), and the summary and JSON
// report of a run (sim_report.cc). The pipeline model of --topology is in
// pipeline_model.h.
//
// Thread safety: Run() is called once, from one thread; it starts and joins
// the rank threads itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "collective.h"
#include "options.h"
#include "pipeline_model.h"
#include "straggler/client.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler_sim {

using straggler::MembershipView;

inline constexpr int kExitOk = 0;
inline constexpr int kExitViolation = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;  // as stragglerctl's

std::string RankList(const std::vector<uint32_t>& ranks);
std::string Fixed(double v, int decimals);

// What one rank thread learns and records. The client's callback writes
// `history` on the client's thread; everything else belongs to the rank's
// own thread until the threads are joined.
struct RankState {
  std::unique_ptr<straggler::Client> client;
  absl::Mutex mu;
  std::map<uint64_t, MembershipView> history ABSL_GUARDED_BY(mu);  // every version seen, by version

  std::mt19937_64 rng;
  // Shadow reports are numbered by the rank's own counter, which lags the
  // job; this maps them back to the job iteration they were computed at, so
  // the daemon's events can be read in job iterations.
  std::map<uint64_t, uint64_t> shadow_job_iteration;
  std::vector<uint64_t> excluded_at;    // job iterations at which it went to shadow mode
  std::vector<uint64_t> readmitted_at;  // iterations at which it rejoined the group
  uint64_t rejoined_behind = 0;         // see Shadow(): stays 0
  double membership_wait_seconds = 0;   // time spent in MembershipFor (on the step's critical path)
  uint64_t membership_calls = 0;
  uint64_t reports_queued = 0;  // Report() calls the client took (not dropped): what must arrive
};

class Sim {
 public:
  explicit Sim(SimOptions options) : o_(std::move(options)) {}

  int Run();

 private:
  // After the run: flushes the clients, reads the job's events, prints the
  // summary and writes --report; returns the exit status.
  int Summarize(double wall_seconds);
  // What the daemon's journal (`events`) says of each rank of this process:
  // its detections and recoveries, with "rank R at I" for the summary line.
  struct Detections {
    uint64_t detections = 0, recoveries = 0;
    std::vector<std::string> detection_text, recovery_text;
  };
  // Summarize's per-rank --report entries: detections, recoveries,
  // exclusions, state changes, slow windows (and stage, replica).
  nlohmann::json RanksJson(const std::vector<straggler::v1::Event>& events,
                           Detections* found) const;
  // Every membership version any rank saw or applied, and where each rank
  // applied it (--report's memberships).
  nlohmann::json MembershipsJson();
  // Prints the pipeline model's figures; returns them for --report.
  nlohmann::json PrintPipeline(const PipelineSummary& summary);
  bool CreateClients(std::string* error);
  void RankMain(uint32_t rank);
  std::optional<MembershipView> Shadow(uint32_t rank, uint64_t start);
  // Sleeps for the drawn compute time of `rank` at `job_iteration`; returns
  // the measured time. `planned` (optional) receives the drawn time.
  double Compute(uint32_t rank, uint64_t job_iteration, double* planned = nullptr);
  void RecordApplied(uint32_t rank, uint64_t iteration, const MembershipView& m);
  std::vector<uint32_t> ActiveRanks(const MembershipView& m) const;
  uint64_t Epoch(uint64_t iteration) const {
    return o_.epoch_iterations > 0 ? iteration / o_.epoch_iterations : 0;
  }
  void Print(const std::string& line) ABSL_LOCKS_EXCLUDED(print_mu_);
  bool FetchEvents(std::vector<straggler::v1::Event>* events, std::string* error) const;
  uint64_t JobIteration(uint32_t rank, uint64_t reported_iteration) const;

  SimOptions o_;
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<PipelineModel> pipeline_;  // with --topology
  std::atomic<uint64_t> membership_timeouts_{0};

  absl::Mutex print_mu_;  // one line at a time on stdout (Print)

  absl::Mutex applied_mu_;
  // version -> rank -> first iteration at which the rank used that version.
  std::map<uint64_t, std::map<uint32_t, uint64_t>> applied_at_ ABSL_GUARDED_BY(applied_mu_);
  std::map<uint64_t, MembershipView> applied_views_ ABSL_GUARDED_BY(applied_mu_);
  std::set<uint32_t> printed_excluded_ ABSL_GUARDED_BY(applied_mu_);
};

}  // namespace straggler_sim
