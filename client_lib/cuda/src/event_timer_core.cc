#include "event_timer_core.h"

#include <stdexcept>
#include <utility>

namespace straggler::detail {

EventTimerCore::EventTimerCore(Client& client, std::unique_ptr<EventBackend> backend,
                               EventTimerCoreOptions options)
    : client_(client),
      backend_(std::move(backend)),
      options_(options),
      capacity_(backend_ ? backend_->Slots() : 0),
      slots_(capacity_) {
  if (capacity_ == 0) throw std::invalid_argument("EventTimerCore: backend has no event slots");
  resolver_ = std::thread([this] { ResolverLoop(); });
}

EventTimerCore::~EventTimerCore() { Shutdown(); }

bool EventTimerCore::Begin(void* stream, uint64_t epoch, uint64_t iteration) {
  if (open_ == Open::kRecorded) {
    // The previous Begin never got its End: its slot is still unpublished,
    // so it is simply re-recorded for this iteration.
    unmatched_.fetch_add(1, std::memory_order_relaxed);
  }
  open_ = Open::kNone;
  const uint64_t head = head_.load(std::memory_order_relaxed);
  if (head - tail_.load(std::memory_order_acquire) >= capacity_) {
    // Every slot is in flight: the GPU is far behind, or the resolver is.
    // Waiting here would stall the training thread, so this iteration goes
    // untimed instead.
    dropped_full_.fetch_add(1, std::memory_order_relaxed);
    open_ = Open::kDropped;
    return false;
  }
  std::string error;
  if (backend_->RecordStart(head % capacity_, stream, &error) != EventBackend::Result::kOk) {
    RecordError(error);
    return false;
  }
  slots_[head % capacity_] = Slot{epoch, iteration};
  open_ = Open::kRecorded;
  begun_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool EventTimerCore::End(void* stream) {
  if (open_ != Open::kRecorded) {
    // After a dropped Begin this End is expected and not a misuse.
    if (open_ == Open::kNone) unmatched_.fetch_add(1, std::memory_order_relaxed);
    open_ = Open::kNone;
    return false;
  }
  open_ = Open::kNone;
  const uint64_t head = head_.load(std::memory_order_relaxed);
  std::string error;
  if (backend_->RecordEnd(head % capacity_, stream, &error) != EventBackend::Result::kOk) {
    RecordError(error);
    return false;
  }
  // Publish the slot, then wake the resolver if it sleeps on an empty ring.
  // notify_one makes no system call while nobody waits.
  head_.store(head + 1, std::memory_order_seq_cst);
  wake_.fetch_add(1, std::memory_order_seq_cst);
  wake_.notify_one();
  return true;
}

void EventTimerCore::RecordError(const std::string& error) {
  errors_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&error_mu_);
  last_error_ = error;
}

EventTimerCore::Counters EventTimerCore::Stats() const {
  Counters c;
  c.begun = begun_.load(std::memory_order_relaxed);
  c.reported = reported_.load(std::memory_order_relaxed);
  c.report_dropped = report_dropped_.load(std::memory_order_relaxed);
  c.dropped_full = dropped_full_.load(std::memory_order_relaxed);
  c.unmatched = unmatched_.load(std::memory_order_relaxed);
  c.errors = errors_.load(std::memory_order_relaxed);
  c.abandoned = abandoned_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&error_mu_);
  c.last_error = last_error_;
  return c;
}

void EventTimerCore::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    drain_deadline_ = std::chrono::steady_clock::now() + options_.drain_timeout;
    stopping_.store(true, std::memory_order_seq_cst);
    wake_.fetch_add(1, std::memory_order_seq_cst);
    wake_.notify_one();
    resolver_.join();
  });
}

void EventTimerCore::ResolverLoop() {
  backend_->BindResolverThread();
  for (;;) {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail == head_.load(std::memory_order_acquire)) {
      if (stopping_.load(std::memory_order_seq_cst)) return;
      // Read the wake counter before re-checking the ring: a publish after
      // the re-check changes the counter, so wait() returns at once.
      const uint32_t seen = wake_.load(std::memory_order_seq_cst);
      if (tail != head_.load(std::memory_order_seq_cst) ||
          stopping_.load(std::memory_order_seq_cst)) {
        continue;
      }
      wake_.wait(seen, std::memory_order_seq_cst);
      continue;
    }

    const size_t index = tail % capacity_;
    double seconds = 0;
    std::string error;
    switch (backend_->Elapsed(index, &seconds, &error)) {
      case EventBackend::Result::kNotReady:
        if (stopping_.load(std::memory_order_seq_cst) &&
            std::chrono::steady_clock::now() >= drain_deadline_) {
          const uint64_t head = head_.load(std::memory_order_acquire);
          abandoned_.fetch_add(head - tail, std::memory_order_relaxed);
          tail_.store(head, std::memory_order_release);
          return;
        }
        // Events of one stream complete in order, so polling the oldest is
        // enough; a short sleep keeps the resolver off the CPU.
        std::this_thread::sleep_for(options_.poll_interval);
        continue;
      case EventBackend::Result::kError:
        RecordError(error);
        break;
      case EventBackend::Result::kOk: {
        const Slot& s = slots_[index];
        if (client_.Report(options_.rank, s.epoch, s.iteration, seconds)) {
          reported_.fetch_add(1, std::memory_order_relaxed);
        } else {
          report_dropped_.fetch_add(1, std::memory_order_relaxed);
        }
        break;
      }
    }
    // Only now may the producer record into this slot again.
    tail_.store(tail + 1, std::memory_order_release);
  }
}

}  // namespace straggler::detail
