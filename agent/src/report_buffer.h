// The agent's per-job store of reports between a trainer rank and the daemon:
// a bounded FIFO that remembers which upstream batch carried each report, so
// that an acknowledgement trims exactly what the daemon processed and a new
// upstream stream replays the rest in arrival order.
//
//   ReportBuffer buf(65536);
//   buf.Push(report, now);                       // drops the oldest when full
//   v1::ReportBatch b; buf.TakeUnsent(256, 7, &b);  // sent as sequence 7
//   buf.Ack(7, [](const v1::IterationReport&) {});  // the daemon processed it
//   buf.Rewind();                                // stream lost: all unsent again
//
// Not thread-safe: the owner (UpstreamJob) guards it with its mutex.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>

#include "straggler/v1/straggler.pb.h"

namespace straggler::agent {

namespace v1 = ::straggler::v1;

class ReportBuffer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ReportBuffer(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // Appends `report`; when the buffer holds `capacity` reports the oldest are
  // dropped first (sent or not: they are lost to the daemon unless it already
  // processed them). Returns how many were dropped.
  size_t Push(v1::IterationReport report, Clock::time_point now);

  // A smaller capacity drops the oldest reports at once. Returns how many.
  size_t SetCapacity(size_t capacity);

  // Appends up to `max` of the oldest unsent reports to `out` and marks them
  // sent in the batch with `sequence` (sequences must grow). Returns how many.
  size_t TakeUnsent(size_t max, uint64_t sequence, v1::ReportBatch* out);

  // The daemon processed every batch up to `acked_sequence`: removes the
  // reports they carried, calling `on_acked` for each, oldest first. Returns
  // how many were removed.
  size_t Ack(uint64_t acked_sequence,
             const std::function<void(const v1::IterationReport&)>& on_acked);

  // The upstream stream ended: every report still held counts as unsent, to
  // be replayed on the next stream in arrival order.
  void Rewind();

  size_t size() const { return entries_.size(); }
  size_t unsent() const { return entries_.size() - sent_; }
  size_t capacity() const { return capacity_; }
  uint64_t dropped_total() const { return dropped_total_; }
  // Arrival time of the oldest unsent report (the batching deadline runs from it).
  std::optional<Clock::time_point> oldest_unsent_time() const;

 private:
  struct Entry {
    v1::IterationReport report;
    Clock::time_point received;
    uint64_t sequence = 0;  // the upstream batch that carried it; 0 = unsent
  };
  size_t DropOldest(size_t n);

  size_t capacity_;
  std::deque<Entry> entries_;  // arrival order; the first sent_ are sent
  size_t sent_ = 0;
  uint64_t dropped_total_ = 0;
};

}  // namespace straggler::agent
