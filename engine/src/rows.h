// Rows: how reports of the ranks taking part in the collective are grouped
// by iteration before they are judged together (docs/detection.md, "Rows").
// A RowQueue holds the rows not judged yet, contiguous and ascending by
// iteration; when they complete is the engine's decision (engine_ingest.cc).
// Plain data, one thread at a time (the engine's).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

#include "straggler/engine/job_engine.h"

namespace straggler::engine::internal {

struct Row {
  uint64_t iteration = 0;
  uint64_t epoch = 0;
  double min = std::numeric_limits<double>::infinity();
  // The slowest reported step of the row (step_seconds, else compute):
  // what the synchronous step of this iteration cost the job.
  double step_max = 0.0;
  std::vector<std::pair<uint32_t, double>> values;  // (rank, Report::OwnSeconds)
  // Each value's work, in step with `values` (NaN: that report had none);
  // empty while no report of the row has work, so a job without work pays
  // nothing.
  std::vector<double> work;

  void Add(const Report& rep) {
    const double own = rep.OwnSeconds();
    values.emplace_back(rep.rank, own);
    if (rep.work || !work.empty()) {
      work.resize(values.size() - 1, std::numeric_limits<double>::quiet_NaN());
      work.push_back(rep.work.value_or(std::numeric_limits<double>::quiet_NaN()));
    }
    min = std::min(min, own);
    step_max = std::max(step_max, rep.step_seconds.value_or(own));
    epoch = std::max(epoch, rep.epoch);
  }
};

class RowQueue {
 public:
  bool empty() const { return rows_.empty(); }
  const Row& front() const { return rows_.front(); }

  // Whether a report of `iteration` comes too late to join a row: its row
  // was judged already (or lies before the oldest open one).
  bool Judged(uint64_t iteration) const {
    return (have_completed_ && iteration <= last_completed_) ||
           (!rows_.empty() && iteration < rows_.front().iteration);
  }

  // The open row of `iteration` (not Judged), opening it and every row up to
  // it as needed. The row of `iteration`, if opened now, is sized for
  // expected() reports at once (a million-rank row grown by doubling left
  // 15 MB of freed smaller blocks behind in the heap); rows skipped on the
  // way, which may never fill, are not.
  template <typename F>
  Row& At(uint64_t iteration, F&& expected) {
    const auto fresh = [&](uint64_t i) { return Fresh(i, i == iteration ? expected() : 0); };
    if (rows_.empty()) rows_.push_back(fresh(iteration));
    while (rows_.back().iteration < iteration) rows_.push_back(fresh(rows_.back().iteration + 1));
    return rows_[iteration - rows_.front().iteration];
  }

  // Takes the oldest open row out as completed; hand it back with Recycle.
  Row PopFront() {
    Row row = std::move(rows_.front());
    rows_.pop_front();
    have_completed_ = true;
    last_completed_ = row.iteration;
    return row;
  }

  // Keeps a row's memory for the next one.
  void Recycle(Row&& row) { spare_.push_back(std::move(row)); }

  // Rows start afresh with the next report: nothing open, nothing judged.
  void Clear() {
    for (auto& row : rows_) spare_.push_back(std::move(row));
    rows_.clear();
    have_completed_ = false;
  }
  // Forgets which iterations were judged (the job moved elsewhere).
  void ForgetCompleted() { have_completed_ = false; }

 private:
  Row Fresh(uint64_t iteration, size_t expected) {
    Row row;
    if (!spare_.empty()) {
      row = std::move(spare_.back());
      spare_.pop_back();
      row.values.clear();
      row.work.clear();
    }
    row.values.reserve(expected);
    row.iteration = iteration;
    row.epoch = 0;
    row.min = std::numeric_limits<double>::infinity();
    row.step_max = 0.0;
    return row;
  }

  std::deque<Row> rows_;
  std::vector<Row> spare_;
  bool have_completed_ = false;
  uint64_t last_completed_ = 0;  // reports at or below it are judged alone
};

}  // namespace straggler::engine::internal
