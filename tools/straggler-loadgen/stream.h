// One ingest stream of straggler-loadgen: a block of ranks, its own
// channel and TCP connection, a writer (WritePhase, on a thread of run.cc's)
// and a reader thread that takes the directives.
//
// Thread-safety: WritePhase runs on one writer thread, the reader on its
// own; what they share (in-flight batches, samples) is guarded by mu_, and
// their waits are Mutex::Await conditions on it (no condition variable). The
// other calls come from the run's thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "loadgen.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler::loadgen {

namespace v1 = ::straggler::v1;

// One ingest stream: a block of ranks, its own channel, a reader thread.
class Stream {
 public:
  Stream(const Options& o, uint32_t index, uint32_t first_rank, uint32_t rank_count,
         Clock::time_point deadline)
      : o_(o), index_(index), first_rank_(first_rank), rank_count_(rank_count) {
    grpc::ChannelArguments args;
    // A connection per stream, as separate agents would have (channels to the
    // same target otherwise share one subchannel, hence one TCP connection).
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
    channel_ = grpc::CreateCustomChannel(o.daemon, o.credentials, args);
    stub_ = v1::IngestService::NewStub(channel_);
    ctx_.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          deadline - Clock::now()));
    rng_ = 0x9E3779B97F4A7C15ull * (index + 1);
  }

  // Opens the stream with a hello-only batch and waits for its
  // acknowledgement, so the measured phases exclude connection setup.
  bool Open(std::string* error) {
    stream_ = stub_->Stream(&ctx_);
    v1::ReportBatch hello;
    v1::StreamHello* h = hello.mutable_hello();
    h->set_job_id(o_.job);
    h->set_node("loadgen-" + std::to_string(index_));
    for (uint32_t r = 0; r < rank_count_; ++r) h->add_ranks(first_rank_ + r);
    h->set_world_size(o_.ranks);
    h->set_client_version("straggler-loadgen");
    hello.set_sequence(next_sequence_++);
    {
      absl::MutexLock lock(&mu_);
      in_flight_.push_back({hello.sequence(), Clock::now(), 0});
    }
    reader_ = std::thread([this] { ReaderLoop(); });
    const std::string where =
        "stream " + std::to_string(index_) + " to the daemon at " + o_.daemon + ": ";
    if (!stream_->Write(hello)) {
      // A write fails only once the call is over, so the reader's Read ends
      // too, and Finish() has the status that says why (UNAVAILABLE for
      // nothing listening, INVALID_ARGUMENT for a refused hello, ...).
      *error = where + "the hello could not be written (" + FinishOpen() + ")";
      return false;
    }
    bool ended = false;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(this, &Stream::AckedOrEnded),
                               absl::FromChrono(kConnectTimeout)) &&
          in_flight_.empty())
        return true;
      ended = done_;
    }
    if (ended) {  // the daemon ended the call instead of acknowledging
      *error = where + "the stream ended before the hello was acknowledged (" + FinishOpen() + ")";
    } else {
      *error = where + "no acknowledgement of the hello within " +
               std::to_string(kConnectTimeout.count()) + " s";
    }
    return false;
  }

  // Writes batches at `rate` reports/s (0 = window-bound) until `end`.
  void WritePhase(double rate, Clock::time_point start, Clock::time_point end) {
    const double interval_s = rate > 0 ? static_cast<double>(o_.batch) / rate : 0;
    const auto interval = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(interval_s));
    // Streams start staggered over one interval so their batches interleave.
    Clock::time_point next = start + interval * index_ / std::max<uint32_t>(o_.streams, 1);
    // Count bound: no phase writes more batches than its duration allows at
    // one batch per microsecond.
    const uint64_t max_batches =
        static_cast<uint64_t>(std::chrono::duration<double>(end - start).count() * 1e6) + 1;
    for (uint64_t n = 0; n < max_batches; ++n) {
      if (rate > 0) {
        if (next >= end) return;
        if (Clock::now() < next) std::this_thread::sleep_until(next);
        next += interval;
      }
      {
        absl::MutexLock lock(&mu_);
        if (!mu_.AwaitWithTimeout(absl::Condition(this, &Stream::RoomOrEnded),
                                  absl::FromChrono(end - Clock::now())))
          return;  // the phase ended while the window was full
        if (done_) return;
      }
      if (Clock::now() >= end) return;
      Fill();
      const auto t = Clock::now();
      {
        absl::MutexLock lock(&mu_);
        in_flight_.push_back({batch_.sequence(), t, static_cast<uint32_t>(batch_.reports_size())});
      }
      if (!stream_->Write(batch_)) {
        absl::MutexLock lock(&mu_);
        if (failure_.empty()) failure_ = "a write failed (the stream ended)";
        done_ = true;
        return;
      }
      batches_written_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Waits (bounded) until every written batch is acknowledged.
  bool Drain(std::chrono::milliseconds limit) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(this, &Stream::AckedOrEnded),
                                absl::FromChrono(limit)) &&
           in_flight_.empty();
  }

  void Close() {
    if (stream_) {
      stream_->WritesDone();
      if (reader_.joinable()) reader_.join();
      grpc::Status status = stream_->Finish();
      if (!status.ok()) {
        absl::MutexLock lock(&mu_);
        if (failure_.empty())
          failure_ = "stream " + std::to_string(index_) + " to the daemon at " + o_.daemon +
                     " ended with " + StatusText(status);
      }
      stream_.reset();
    }
  }

  ~Stream() {
    if (reader_.joinable()) {
      ctx_.TryCancel();
      reader_.join();
    }
  }

  // Moves out the latency samples (ms) and counts gathered since last call.
  struct Take {
    std::vector<double> latencies_ms;
    uint64_t accepted = 0, rejected = 0, duplicates = 0, batches = 0;
    uint64_t rate_limited_batches = 0;  // acks with a rate_limited rejection
  };
  Take TakeSamples() {
    absl::MutexLock lock(&mu_);
    Take t;
    t.latencies_ms.swap(latencies_ms_);
    t.accepted = accepted_;
    t.rejected = rejected_;
    t.duplicates = duplicates_;
    t.batches = acked_batches_;
    t.rate_limited_batches = rate_limited_batches_;
    accepted_ = rejected_ = duplicates_ = acked_batches_ = rate_limited_batches_ = 0;
    return t;
  }

  std::string failure() {
    absl::MutexLock lock(&mu_);
    return failure_;
  }
  // The first rejection other than rate_limited, as "reason: message".
  std::string last_rejection() {
    absl::MutexLock lock(&mu_);
    return last_rejection_;
  }
  // The first rate_limited rejection's message.
  std::string rate_limit_message() {
    absl::MutexLock lock(&mu_);
    return rate_limit_message_;
  }

 private:
  struct Pending {
    uint64_t sequence;
    Clock::time_point written;
    uint32_t reports;
  };

  // Await conditions (checked by absl::Mutex as mu_ is released).
  bool AckedOrEnded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_.empty() || done_;
  }
  bool RoomOrEnded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_.size() < o_.window || done_;
  }

  // After Open() failed because the call ended: waits for the reader (its
  // Read has returned or is about to) and returns the call's status.
  std::string FinishOpen() {
    if (reader_.joinable()) reader_.join();
    const grpc::Status status = stream_->Finish();
    stream_.reset();
    return status.ok() ? "the daemon ended the stream without an error" : StatusText(status);
  }

  // The next B reports of this stream's row-by-row cycle.
  void Fill() {
    batch_.Clear();
    batch_.set_sequence(next_sequence_++);
    const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    for (uint32_t k = 0; k < o_.batch; ++k) {
      v1::IterationReport* r = batch_.add_reports();
      rng_ = rng_ * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(rng_ >> 11) / static_cast<double>(uint64_t{1} << 53);
      const double compute = 0.100 * (0.95 + 0.10 * u);
      r->set_rank(first_rank_ + cursor_rank_);
      r->set_epoch(0);
      r->set_iteration(cursor_iteration_);
      r->set_compute_seconds(compute);
      if (o_.work_fields) {  // about what straggler.torch.monitor sends
        r->set_work(4096.0 + static_cast<double>(rng_ >> 52));
        r->set_input_wait_seconds(0.004 * (0.5 + u));
        r->set_optimizer_seconds(0.010);
      }
      const int64_t start_ns = now_ns - static_cast<int64_t>(compute * 1e9);
      if (o_.timestamp_start) {
        r->mutable_start_time()->set_seconds(start_ns / 1'000'000'000);
        r->mutable_start_time()->set_nanos(static_cast<int32_t>(start_ns % 1'000'000'000));
      } else {
        r->set_start_unix_nanos(static_cast<uint64_t>(start_ns));
      }
      if (++cursor_rank_ == rank_count_) {
        cursor_rank_ = 0;
        ++cursor_iteration_;
      }
    }
  }

  void ReaderLoop() {
    v1::Directive d;
    while (stream_->Read(&d)) {
      const auto now = Clock::now();
      absl::MutexLock lock(&mu_);
      accepted_ += d.accepted();
      rejected_ += d.rejected();
      duplicates_ += d.duplicates();
      // Rate limiting is told apart: it is the daemon's configuration, not
      // a fault of the reports or of the daemon, and says what to change.
      bool rate_limited = false;
      for (const auto& rej : d.rejections()) {
        if (rej.reason() == "rate_limited") {
          rate_limited = true;
          if (rate_limit_message_.empty()) rate_limit_message_ = rej.message();
        } else if (last_rejection_.empty()) {
          last_rejection_ = rej.reason() + ": " + rej.message();
        }
      }
      rate_limited_batches_ += rate_limited;
      while (!in_flight_.empty() && in_flight_.front().sequence <= d.acked_sequence()) {
        if (in_flight_.front().reports > 0) {
          latencies_ms_.push_back(
              std::chrono::duration<double, std::milli>(now - in_flight_.front().written).count());
          ++acked_batches_;
        }
        in_flight_.pop_front();
      }
    }
    absl::MutexLock lock(&mu_);
    done_ = true;
    if (failure_.empty() && !in_flight_.empty()) failure_ = "the daemon ended the stream";
  }

  const Options& o_;
  const uint32_t index_;
  const uint32_t first_rank_;
  const uint32_t rank_count_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::IngestService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ReportBatch, v1::Directive>> stream_;
  std::thread reader_;

  // Writer-thread state.
  v1::ReportBatch batch_;
  uint64_t next_sequence_ = 1;
  uint32_t cursor_rank_ = 0;
  uint64_t cursor_iteration_ = 0;
  uint64_t rng_;
  std::atomic<uint64_t> batches_written_{0};

  absl::Mutex mu_;
  std::deque<Pending> in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<double> latencies_ms_ ABSL_GUARDED_BY(mu_);
  uint64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t duplicates_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t acked_batches_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // the reader ended
  std::string failure_ ABSL_GUARDED_BY(mu_);
  std::string last_rejection_ ABSL_GUARDED_BY(mu_);
  std::string rate_limit_message_ ABSL_GUARDED_BY(mu_);
  uint64_t rate_limited_batches_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace straggler::loadgen
