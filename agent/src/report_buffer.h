// The agent's per-job store of reports between a trainer rank and the daemon:
// a bounded FIFO that remembers which upstream batch carried each report, so
// that an acknowledgement trims exactly what the daemon processed and a new
// upstream stream replays the rest in arrival order.
//
// Two markers travel in the same order as the reports (docs/runs.md, "Through
// the agent"): a rank's trainer closed cleanly (ReportBatch.finished_ranks,
// after that trainer's reports), and a hello (ranks and devices, so client
// incarnations) in force from that point on: a batch never carries reports
// from both sides of a hello, nor a report after a finished marker.
//
//   ReportBuffer buf(65536);
//   buf.Push(report, now);                       // drops the oldest when full
//   buf.PushHello(hello, now);                   // the next batch starts with it
//   buf.PushFinished(rank, now);                 // after the rank's reports
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
#include <memory>
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

  // Markers (not counted against the capacity; dropped with the reports
  // around them only when those overflow it). A hello holds the ranks and
  // devices an upstream hello names from here on; TakeUnsent puts it in the
  // batch that starts with it. A finished rank goes into the batch carrying
  // the reports before it.
  void PushHello(v1::StreamHello hello, Clock::time_point now);
  void PushFinished(uint32_t rank, Clock::time_point now);

  // The hello in force at the oldest entry held (the last hello marker that
  // left the buffer; empty before the first): a new upstream stream's first
  // hello, so that the replay is read under the incarnations it was sent in.
  const v1::StreamHello& base_hello() const { return base_hello_; }

  // A smaller capacity drops the oldest reports at once. Returns how many.
  size_t SetCapacity(size_t capacity);

  // Appends up to `max` of the oldest unsent entries to `out` and marks them
  // sent in the batch with `sequence` (sequences must grow): a hello marker
  // only first (into out->hello: ranks and devices), stopping before a later
  // one and before a report that follows a finished marker. Returns how many
  // entries.
  size_t TakeUnsent(size_t max, uint64_t sequence, v1::ReportBatch* out);

  // The daemon processed every batch up to `acked_sequence`: removes the
  // entries they carried, calling `on_acked` for each report, oldest first.
  // Returns how many reports were removed.
  size_t Ack(uint64_t acked_sequence,
             const std::function<void(const v1::IterationReport&)>& on_acked);

  // The upstream stream ended: every report still held counts as unsent, to
  // be replayed on the next stream in arrival order.
  void Rewind();

  size_t size() const { return entries_.size(); }  // reports and markers
  size_t reports() const { return reports_; }
  size_t unsent() const { return entries_.size() - sent_; }
  size_t capacity() const { return capacity_; }
  uint64_t dropped_total() const { return dropped_total_; }
  // Arrival time of the oldest unsent report (the batching deadline runs from it).
  std::optional<Clock::time_point> oldest_unsent_time() const;

 private:
  enum class Kind : uint8_t { kReport, kHello, kFinished };
  struct Entry {
    Kind kind = Kind::kReport;
    v1::IterationReport report;              // kReport
    std::shared_ptr<v1::StreamHello> hello;  // kHello
    uint32_t rank = 0;                       // kFinished
    Clock::time_point received;
    uint64_t sequence = 0;  // the upstream batch that carried it; 0 = unsent
  };
  // Removes the first entry (sent or not), keeping base_hello_ and the counts.
  void PopFront();
  size_t DropOldest(size_t reports);

  size_t capacity_;
  std::deque<Entry> entries_;  // arrival order; the first sent_ are sent
  size_t sent_ = 0;
  size_t reports_ = 0;  // kReport entries
  v1::StreamHello base_hello_;
  uint64_t dropped_total_ = 0;
};

}  // namespace straggler::agent
