#include "report_buffer.h"

#include <algorithm>

namespace straggler::agent {

void ReportBuffer::PopFront() {
  Entry& e = entries_.front();
  if (e.kind == Kind::kReport) --reports_;
  if (e.kind == Kind::kHello) base_hello_ = std::move(*e.hello);
  entries_.pop_front();
  if (sent_ > 0) --sent_;
}

size_t ReportBuffer::DropOldest(size_t reports) {
  size_t dropped = 0;
  while (dropped < reports && !entries_.empty()) {
    if (entries_.front().kind == Kind::kReport) ++dropped;
    PopFront();
  }
  dropped_total_ += dropped;
  return dropped;
}

size_t ReportBuffer::Push(v1::IterationReport report, Clock::time_point now) {
  const size_t dropped = reports_ >= capacity_ ? DropOldest(reports_ + 1 - capacity_) : 0;
  entries_.push_back(Entry{Kind::kReport, std::move(report), nullptr, 0, now, 0});
  ++reports_;
  return dropped;
}

void ReportBuffer::PushHello(v1::StreamHello hello, Clock::time_point now) {
  entries_.push_back(Entry{Kind::kHello, {}, std::make_shared<v1::StreamHello>(std::move(hello)),
                           0, now, 0});
}

void ReportBuffer::PushFinished(uint32_t rank, Clock::time_point now) {
  entries_.push_back(Entry{Kind::kFinished, {}, nullptr, rank, now, 0});
}

size_t ReportBuffer::SetCapacity(size_t capacity) {
  capacity_ = capacity == 0 ? 1 : capacity;
  return reports_ > capacity_ ? DropOldest(reports_ - capacity_) : 0;
}

size_t ReportBuffer::TakeUnsent(size_t max, uint64_t sequence, v1::ReportBatch* out) {
  size_t taken = 0;
  bool finished = false;
  while (taken < max && sent_ < entries_.size()) {
    Entry& e = entries_[sent_];
    switch (e.kind) {
      case Kind::kHello:
        // A hello starts a batch: the daemon applies it before the batch's
        // reports, so those before it go in the batch before.
        if (taken > 0 || out->has_hello() || out->reports_size() > 0) return taken;
        *out->mutable_hello() = *e.hello;
        break;
      case Kind::kFinished:
        out->add_finished_ranks(e.rank);
        finished = true;
        break;
      case Kind::kReport:
        // The daemon applies finished_ranks after the batch's reports: a
        // report after the marker (a restarted trainer's) waits for the next.
        if (finished) return taken;
        *out->add_reports() = e.report;
        break;
    }
    e.sequence = sequence;
    ++sent_;
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
    if (entries_.front().kind == Kind::kReport) {
      if (on_acked) on_acked(entries_.front().report);
      ++removed;
    }
    PopFront();
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
