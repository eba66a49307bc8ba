#include "report_buffer.h"

#include <algorithm>

namespace straggler::agent {

size_t ReportBuffer::DropOldest(size_t n) {
  n = std::min(n, entries_.size());
  for (size_t i = 0; i < n; ++i) {
    entries_.pop_front();
    if (sent_ > 0) --sent_;
  }
  dropped_total_ += n;
  return n;
}

size_t ReportBuffer::Push(v1::IterationReport report, Clock::time_point now) {
  const size_t dropped = entries_.size() >= capacity_ ? DropOldest(entries_.size() + 1 - capacity_) : 0;
  entries_.push_back(Entry{std::move(report), now, 0});
  return dropped;
}

size_t ReportBuffer::SetCapacity(size_t capacity) {
  capacity_ = capacity == 0 ? 1 : capacity;
  return entries_.size() > capacity_ ? DropOldest(entries_.size() - capacity_) : 0;
}

size_t ReportBuffer::TakeUnsent(size_t max, uint64_t sequence, v1::ReportBatch* out) {
  size_t taken = 0;
  while (taken < max && sent_ < entries_.size()) {
    Entry& e = entries_[sent_++];
    e.sequence = sequence;
    *out->add_reports() = e.report;
    ++taken;
  }
  return taken;
}

size_t ReportBuffer::Ack(uint64_t acked_sequence,
                         const std::function<void(const v1::IterationReport&)>& on_acked) {
  // Sent entries form a prefix with growing sequences, so the acknowledged
  // ones are a prefix of it.
  size_t removed = 0;
  while (sent_ > 0 && entries_.front().sequence <= acked_sequence) {
    if (on_acked) on_acked(entries_.front().report);
    entries_.pop_front();
    --sent_;
    ++removed;
  }
  return removed;
}

void ReportBuffer::Rewind() {
  for (size_t i = 0; i < sent_; ++i) entries_[i].sequence = 0;
  sent_ = 0;
}

std::optional<ReportBuffer::Clock::time_point> ReportBuffer::oldest_unsent_time() const {
  if (sent_ >= entries_.size()) return std::nullopt;
  return entries_[sent_].received;
}

}  // namespace straggler::agent
