// Per-rank compute-time traces for the detection-quality suite: the common
// form a scenario (scenarios/*.yaml, generated from a seed) and a recorded
// CSV trace are both turned into, and the per-(rank, iteration) boolean
// matrices that ground truth, flags and "was scored" are kept in.
//
//   Trace t = ...;                       // Generate(scenario) or ParseCsvTrace(...)
//   for (uint64_t row = 0; row < t.iterations; ++row)
//     for (uint32_t r = 0; r < t.ranks; ++r)
//       if (t.Reported(row, r)) use(t.Iteration(row), r, t.At(row, r));
//
// Plain value types; no shared state.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace straggler::quality {

// A rank x iteration-row matrix of booleans (truth, flags, scored).
class RankMatrix {
 public:
  RankMatrix() = default;
  RankMatrix(uint32_t ranks, uint64_t iterations)
      : ranks_(ranks), iterations_(iterations), v_(static_cast<size_t>(ranks) * iterations, 0) {}
  uint32_t ranks() const { return ranks_; }
  uint64_t iterations() const { return iterations_; }
  bool at(uint32_t rank, uint64_t row) const { return v_[Index(rank, row)] != 0; }
  void set(uint32_t rank, uint64_t row, bool value) { v_[Index(rank, row)] = value ? 1 : 0; }
  // Sets rows [from, to) of `rank`.
  void Fill(uint32_t rank, uint64_t from, uint64_t to, bool value) {
    for (uint64_t i = from; i < to && i < iterations_; ++i) set(rank, i, value);
  }
  size_t Count() const {
    size_t n = 0;
    for (auto b : v_) n += b;
    return n;
  }

 private:
  size_t Index(uint32_t rank, uint64_t row) const {
    return static_cast<size_t>(rank) * iterations_ + row;
  }
  uint32_t ranks_ = 0;
  uint64_t iterations_ = 0;
  std::vector<uint8_t> v_;
};

// [from, to) rows of one rank where a matrix is set.
struct Interval {
  uint32_t rank = 0;
  uint64_t from = 0;
  uint64_t to = 0;
  bool operator==(const Interval&) const = default;
};
// Maximal runs of set cells, by rank then row.
std::vector<Interval> Intervals(const RankMatrix& m);

struct Trace {
  static constexpr double kNoReport = std::numeric_limits<double>::quiet_NaN();

  std::string name;
  std::string description;
  uint32_t ranks = 0;
  uint64_t first_iteration = 0;       // iteration number of row 0
  uint64_t iterations = 0;            // rows
  uint64_t iterations_per_epoch = 0;  // announced epoch length; 0 = unknown
  // Compute time of a healthy step; for a CSV trace the median of all its times.
  double base_seconds = 0.0;
  std::vector<double> compute;   // [row * ranks + rank]; NaN = no report
  std::vector<uint64_t> epoch;   // per row
  // The step's work and phases where the trace gives them (a CSV's `work`,
  // `input_wait_seconds`, `optimizer_seconds` columns; docs/client.md, "Work
  // and phases"): [row * ranks + rank], NaN = not given for that report;
  // empty = the trace has no such column.
  std::vector<double> work;
  std::vector<double> input_wait;
  std::vector<double> optimizer;
  // Its process's run delay, s/s (the agent's ProcessTelemetry; a CSV's
  // `run_delay_seconds_per_second`), [row * ranks + rank], NaN = not given;
  // empty = none in the trace.
  std::vector<double> run_delay;
  // The likely cause every detection of a true episode must have (a
  // scenario's `cause`, e.g. "input_pipeline"); "" = not checked.
  std::string expected_cause;
  bool has_truth = false;
  RankMatrix truth;              // straggler per (rank, row), when has_truth
  // With truth: each cell's truth factor (how much slower than its peers,
  // [row * ranks + rank]) and whether the rank was ramping up there (a
  // gradual slowdown); what the issue-17 criteria's deadlines are read from
  // (criteria.h). Empty for a CSV trace.
  std::vector<float> truth_factor;
  RankMatrix ramping;
  // Each rank's declared topology (docs/topology.md), when the trace names
  // it (a CSV's peer_group / replica columns); empty = none declared: the
  // default group, every rank a replica of its own.
  std::vector<std::string> peer_group;           // per rank, "" = default
  std::vector<std::optional<uint32_t>> replica;  // per rank, nullopt = its own
  std::vector<std::string> gpu_model;            // per rank when declared, "" = unknown
  // Per rank: the row of its first report (a rank that joins late is
  // announced there, not at the start); empty = every rank from row 0.
  std::vector<uint64_t> join_row;

  uint64_t Iteration(uint64_t row) const { return first_iteration + row; }
  double At(uint64_t row, uint32_t rank) const {
    return compute[static_cast<size_t>(row) * ranks + rank];
  }
  bool Reported(uint64_t row, uint32_t rank) const { return !std::isnan(At(row, rank)); }
  float TruthFactorAt(uint64_t row, uint32_t rank) const {
    return truth_factor.empty() ? 1.0f : truth_factor[static_cast<size_t>(row) * ranks + rank];
  }
  // Cells that carry a report: what scoring counts.
  RankMatrix ReportedMatrix() const;
};

}  // namespace straggler::quality
