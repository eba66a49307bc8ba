// straggler-loadgen — drives a real stragglerd over gRPC with R simulated
// ranks and measures what the daemon sustains (issue 6, item 2):
//
//   straggler-loadgen --ready-file /run/stragglerd.ready.json --ranks 1000
//                     --streams 8 --rate 100000 --batch 256 --duration 10
//   straggler-loadgen --daemon 127.0.0.1:7070 --daemon-pid 1234 --ranks 1000
//                     --find-saturation --json sat.json
//
// The ranks are split across S IngestService streams, as node agents would
// split them (stream k speaks for a contiguous block of ranks and says so in
// its hello). Each stream has its own channel and TCP connection, a writer
// thread and a reader thread. The writer sends ReportBatches of B reports at
// its share of --rate (0 = as fast as the window allows), keeping at most
// --window unacknowledged batches in flight; the reader takes the daemon's
// directives. Reports are valid, so the daemon accepts them: every rank
// reports iterations 0, 1, 2, ... in order (the stream cycles through its
// ranks row by row, so iteration rows complete and get judged), compute times
// are 100 ms +-5 %.
//
// Measured:
//  * accepted reports/s: the sum of Directive.accepted over the directives
//    read during the measured window, divided by the window;
//  * report-to-directive latency: from just before a batch is written to the
//    moment the directive acknowledging it (acked_sequence >= its sequence)
//    is read; p50/p99/max over every batch acknowledged in the window;
//  * daemon resident memory per rank: VmRSS of the daemon (from --daemon-pid,
//    or the pid in --ready-file) before any stream is opened and after the
//    run, difference / ranks. Meaningful for large --ranks only: a few MiB of
//    fixed cost (streams, gRPC buffers, allocator caches) are spread over R.
//
// --find-saturation runs steps of --step-duration seconds at rising offered
// rates (from --rate, default 50 000/s, times --step-factor each step, at
// most --max-steps), and stops when accepted/s stops growing (below 90 % of
// the offered rate and below 110 % of the best step so far) or p99 explodes
// (above 10x the first step's p99, and above 5 ms). The best accepted/s of
// any step is printed too (the saturation throughput). The knee is the last step
// that kept up with its offered rate and whose p99 had not exploded.
// A step whose reports the daemon rejected as rate_limited (its per-stream
// limits.stream_reports_per_second, 20 000/s by default) ends the search
// too, with that as the stop reason: past it the steps measure the limit,
// not the daemon, so such runs need a daemon with the limit off.
//
// --soak-minutes M runs M minutes at --rate in consecutive samples of
// --soak-interval seconds (default 60): after each one it prints the daemon's
// VmRSS, accepted reports/s and p99, so memory that grows with time (not with
// ranks) shows as a rising column; --json gets the samples and the growth
// from the first sample to the last (BENCHMARKS.md "Soak").
//
// Loopback only: --daemon must be 127.0.0.0/8, localhost, [::1] or unix:.
// Every loop is bounded in time (a call deadline covers the whole run; every
// wait has a timeout) and in count (steps, batches per step).
//
// Exit status: 0 ok (and at least one report accepted); 1 the daemon failed,
// rejected reports, or accepted none; 2 bad flags.
#include "absl/status/status.h"
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "straggler/common/channel_security.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace {

namespace v1 = straggler::v1;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr uint32_t kMaxBatch = 10000;  // the daemon's default limits.max_batch_reports
constexpr int kMaxStreams = 256;
constexpr auto kConnectTimeout = std::chrono::seconds(10);
constexpr auto kDrainTimeout = std::chrono::seconds(5);
// p99 "explodes" above 10x the first saturation step's p99, and at least this.
constexpr double kExplodedFloorMs = 5.0;

struct Options {
  std::string daemon;
  std::string ready_file;
  int64_t daemon_pid = 0;
  uint32_t ranks = 1000;
  uint32_t streams = 8;
  double rate = 0;  // reports/s over all streams; 0 = as fast as possible
  uint32_t batch = 256;
  double duration = 10;
  std::string job;
  bool find_saturation = false;
  double soak_minutes = 0;    // 0 = no soak
  double soak_interval = 60;  // seconds per soak sample
  double step_duration = 3;
  double step_factor = 2;
  uint32_t max_steps = 10;
  uint32_t window = 8;  // unacknowledged batches per stream
  std::string json_file;
  bool quiet = false;
  // From STRAGGLER_TLS_CA/_CERT/_KEY (plaintext when none is set).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

bool IsLoopback(const std::string& address) {
  std::string a = address;
  for (const char* prefix : {"dns:///", "ipv4:", "ipv6:"}) {
    if (a.rfind(prefix, 0) == 0) a = a.substr(std::string(prefix).size());
  }
  if (a.rfind("unix:", 0) == 0) return true;
  if (a.rfind("127.", 0) == 0) return true;
  if (a.rfind("localhost:", 0) == 0 || a == "localhost") return true;
  if (a.rfind("[::1]", 0) == 0) return true;
  return false;
}

// VmRSS of a process in KiB; nullopt when unreadable.
std::optional<uint64_t> RssKiB(int64_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream s(line.substr(6));
      uint64_t kib = 0;
      if (s >> kib) return kib;
    }
  }
  return std::nullopt;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// gRPC's codes are absl's (same numbering); absl names them.
std::string CodeName(grpc::StatusCode code) {
  const std::string name(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
  return name.empty() ? "CODE_" + std::to_string(static_cast<int>(code)) : name;
}

std::string StatusText(const grpc::Status& status) {
  return CodeName(status.error_code()) + ": " + status.error_message();
}

// The daemon's rate_limited rejection says "... over the stream's
// limits.stream_reports_per_second=20000 (burst 100000)"; the limit, when
// the message names it.
std::optional<double> RateLimitFrom(const std::string& message) {
  static const std::string kKey = "limits.stream_reports_per_second=";
  const size_t at = message.find(kKey);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = message.c_str() + at + kKey.size();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v) || v <= 0) return std::nullopt;
  return v;
}

// The daemon's per-stream rate limit, with its value when `message` (a
// rate_limited rejection) names it.
std::string RateLimitText(const std::string& message, uint32_t streams) {
  std::string text = "the daemon's per-stream rate limit";
  if (auto limit = RateLimitFrom(message)) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  " (limits.stream_reports_per_second=%.0f per stream: %.0f/s over %u streams)",
                  *limit, *limit * streams, streams);
    return text + buf;
  }
  return text + " (limits.stream_reports_per_second)";
}

// What to do about it (docs/security.md#limits-and-input-validation).
constexpr const char* kRateLimitHint =
    "run the daemon with limits.stream_reports_per_second: 0 to measure past it";

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
      std::lock_guard lock(mu_);
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
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, kConnectTimeout, [this] { return in_flight_.empty() || done_; }) &&
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
        std::unique_lock lock(mu_);
        if (!cv_.wait_until(lock, end, [this] {
              return in_flight_.size() < o_.window || done_;
            }))
          return;  // the phase ended while the window was full
        if (done_) return;
      }
      if (Clock::now() >= end) return;
      Fill();
      const auto t = Clock::now();
      {
        std::lock_guard lock(mu_);
        in_flight_.push_back({batch_.sequence(), t, static_cast<uint32_t>(batch_.reports_size())});
      }
      if (!stream_->Write(batch_)) {
        std::lock_guard lock(mu_);
        if (failure_.empty()) failure_ = "a write failed (the stream ended)";
        done_ = true;
        return;
      }
      batches_written_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Waits (bounded) until every written batch is acknowledged.
  bool Drain(std::chrono::milliseconds limit) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [this] { return in_flight_.empty() || done_; }) &&
           in_flight_.empty();
  }

  void Close() {
    if (stream_) {
      stream_->WritesDone();
      if (reader_.joinable()) reader_.join();
      grpc::Status status = stream_->Finish();
      if (!status.ok()) {
        std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
    return failure_;
  }
  // The first rejection other than rate_limited, as "reason: message".
  std::string last_rejection() {
    std::lock_guard lock(mu_);
    return last_rejection_;
  }
  // The first rate_limited rejection's message.
  std::string rate_limit_message() {
    std::lock_guard lock(mu_);
    return rate_limit_message_;
  }

 private:
  struct Pending {
    uint64_t sequence;
    Clock::time_point written;
    uint32_t reports;
  };

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
      const int64_t start_ns = now_ns - static_cast<int64_t>(compute * 1e9);
      r->mutable_start_time()->set_seconds(start_ns / 1'000'000'000);
      r->mutable_start_time()->set_nanos(static_cast<int32_t>(start_ns % 1'000'000'000));
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
      std::lock_guard lock(mu_);
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
      cv_.notify_all();
    }
    std::lock_guard lock(mu_);
    done_ = true;
    if (failure_.empty() && !in_flight_.empty()) failure_ = "the daemon ended the stream";
    cv_.notify_all();
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

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> in_flight_;     // guarded by mu_
  std::vector<double> latencies_ms_;  // guarded by mu_
  uint64_t accepted_ = 0, rejected_ = 0, duplicates_ = 0, acked_batches_ = 0;  // mu_
  bool done_ = false;                 // guarded by mu_: the reader ended
  std::string failure_;               // guarded by mu_
  std::string last_rejection_;        // guarded by mu_
  std::string rate_limit_message_;    // guarded by mu_
  uint64_t rate_limited_batches_ = 0;  // guarded by mu_
};

struct StepResult {
  double offered_rate = 0;  // 0 = as fast as possible
  double seconds = 0;
  uint64_t accepted = 0, rejected = 0, duplicates = 0, batches = 0;
  uint64_t rate_limited_batches = 0;  // not in the JSON: stop_reason says it
  double accepted_per_s = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
};

json ToJson(const StepResult& s) {
  return json{{"offered_rate", s.offered_rate}, {"seconds", s.seconds},
              {"accepted", s.accepted},         {"rejected", s.rejected},
              {"duplicates", s.duplicates},     {"batches_acked", s.batches},
              {"accepted_per_s", s.accepted_per_s}, {"p50_ms", s.p50_ms},
              {"p99_ms", s.p99_ms},             {"max_ms", s.max_ms}};
}

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

class LoadGen {
 public:
  explicit LoadGen(Options o) : o_(std::move(o)) {}

  int Run() {
    // Every wait below is bounded; the call deadline bounds the streams too.
    const double planned = o_.soak_minutes > 0   ? o_.soak_minutes * 60
                           : o_.find_saturation ? o_.step_duration * o_.max_steps
                                                : o_.duration;
    const auto deadline = Clock::now() + std::chrono::seconds(60) +
                          std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(planned * 1.5));
    rss_before_ = RssKiB(o_.daemon_pid);

    const uint32_t per = o_.ranks / o_.streams, extra = o_.ranks % o_.streams;
    uint32_t first = 0;
    for (uint32_t s = 0; s < o_.streams; ++s) {
      const uint32_t n = per + (s < extra ? 1 : 0);
      streams_.push_back(std::make_unique<Stream>(o_, s, first, n, deadline));
      first += n;
    }
    std::string error;
    for (auto& s : streams_) {
      if (!s->Open(&error)) {
        std::cerr << "straggler-loadgen: " << error << '\n';
        return kExitFailed;
      }
    }
    for (auto& s : streams_) s->TakeSamples();  // the hellos are not measured

    if (o_.soak_minutes > 0) {
      Soak();
    } else if (o_.find_saturation) {
      FindSaturation();
    } else {
      steps_.push_back(Step(o_.rate, o_.duration));
      PrintStep(steps_.back());
    }

    bool drained = true;
    for (auto& s : streams_) drained = s->Drain(kDrainTimeout) && drained;
    rss_after_ = RssKiB(o_.daemon_pid);
    for (auto& s : streams_) s->Close();

    int rc = kExitOk;
    uint64_t accepted = 0, rejected = 0;
    for (const auto& s : steps_) {
      accepted += s.accepted;
      rejected += s.rejected;
    }
    // Rejections are summed up over the streams, once per run: every
    // stream of a run usually meets the same limit.
    uint32_t rate_limited_streams = 0, rejecting_streams = 0;
    std::string rate_limit_example, rejection_example;
    for (auto& s : streams_) {
      if (!s->failure().empty()) {
        std::cerr << "straggler-loadgen: " << s->failure() << '\n';
        rc = kExitFailed;
      }
      if (std::string m = s->rate_limit_message(); !m.empty()) {
        ++rate_limited_streams;
        if (rate_limit_example.empty()) rate_limit_example = m;
      }
      if (std::string m = s->last_rejection(); !m.empty()) {
        ++rejecting_streams;
        if (rejection_example.empty()) rejection_example = m;
      }
    }
    if (rejected > 0 && rate_limited_streams > 0) {
      std::cerr << "straggler-loadgen: the daemon rate-limited reports on " << rate_limited_streams
                << " of " << o_.streams << " streams, e.g. rate_limited: " << rate_limit_example
                << "; that is " << RateLimitText(rate_limit_example, o_.streams) << "; "
                << kRateLimitHint << '\n';
      rc = kExitFailed;
    }
    if (rejected > 0 && rejecting_streams > 0) {
      std::cerr << "straggler-loadgen: the daemon rejected reports on " << rejecting_streams
                << " of " << o_.streams << " streams, e.g. " << rejection_example << '\n';
      rc = kExitFailed;
    }
    if (!drained) std::cerr << "straggler-loadgen: not every batch was acknowledged in time\n";
    if (accepted == 0) {
      std::cerr << "straggler-loadgen: the daemon accepted no report\n";
      rc = kExitFailed;
    }
    PrintSummary();
    if (!o_.json_file.empty() && !WriteJson()) {
      std::cerr << "straggler-loadgen: cannot write --json " << o_.json_file << '\n';
      rc = kExitFailed;
    }
    return rc;
  }

 private:
  StepResult Step(double rate, double seconds) {
    const auto start = Clock::now() + std::chrono::milliseconds(5);
    const auto end = start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(seconds));
    const double per_stream = rate > 0 ? rate / o_.streams : 0;
    for (auto& s : streams_) s->TakeSamples();  // acks of the previous step's tail
    std::vector<std::thread> writers;
    for (auto& s : streams_)
      writers.emplace_back([&s, per_stream, start, end] { s->WritePhase(per_stream, start, end); });
    for (auto& w : writers) w.join();
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    StepResult r;
    r.offered_rate = rate;
    r.seconds = elapsed;
    std::vector<double> lat;
    for (auto& s : streams_) {
      Stream::Take t = s->TakeSamples();
      r.accepted += t.accepted;
      r.rejected += t.rejected;
      r.duplicates += t.duplicates;
      r.batches += t.batches;
      r.rate_limited_batches += t.rate_limited_batches;
      lat.insert(lat.end(), t.latencies_ms.begin(), t.latencies_ms.end());
    }
    r.accepted_per_s = elapsed > 0 ? static_cast<double>(r.accepted) / elapsed : 0;
    r.p50_ms = Percentile(lat, 0.50);
    r.p99_ms = Percentile(lat, 0.99);
    r.max_ms = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
    return r;
  }

  void FindSaturation() {
    double rate = o_.rate > 0 ? o_.rate : 50000;
    double best = 0;
    std::optional<size_t> knee;
    for (uint32_t k = 0; k < o_.max_steps; ++k) {
      StepResult r = Step(rate, o_.step_duration);
      steps_.push_back(r);
      PrintStep(r);
      const bool kept_up = r.accepted_per_s >= 0.9 * rate;
      const bool grew = r.accepted_per_s >= 1.1 * best;
      const double first_p99 = steps_.front().p99_ms;
      const bool exploded = k > 0 && r.p99_ms > std::max(10 * first_p99, kExplodedFloorMs);
      if (kept_up && !exploded) knee = steps_.size() - 1;
      best = std::max(best, r.accepted_per_s);
      // Rate-limited: the steps from here on would measure the limit (they
      // used to end as "accepted/s stopped growing", a knee that was the
      // limiter's).
      if (r.rate_limited_batches > 0) {
        stop_reason_ = RateLimitText(RateLimitMessage(), o_.streams) +
                       " rejected reports: not the daemon's capacity; " + kRateLimitHint;
        rate_limited_stop_ = true;
        break;
      }
      if ((!kept_up && !grew) || exploded) {
        stop_reason_ = exploded ? "p99 exploded" : "accepted/s stopped growing";
        break;
      }
      if (!kept_up) stop_reason_ = "below the offered rate";
      rate *= o_.step_factor;
    }
    if (stop_reason_.empty()) stop_reason_ = "--max-steps reached";
    knee_ = knee;
    saturation_ = best;
  }

  std::string RateLimitMessage() {
    for (auto& s : streams_)
      if (std::string m = s->rate_limit_message(); !m.empty()) return m;
    return "";
  }

  // Consecutive steps at one rate; the daemon's VmRSS after each.
  void Soak() {
    const double total = o_.soak_minutes * 60;
    // Count bound: at most total / 0.1 s samples (the interval's minimum).
    for (double t = 0; t < total - 1e-9 && soak_.size() < 1'000'000;) {
      const double seconds = std::min(o_.soak_interval, total - t);
      steps_.push_back(Step(o_.rate, seconds));
      t += seconds;
      soak_.push_back({t, RssKiB(o_.daemon_pid)});
      const StepResult& s = steps_.back();
      if (!o_.quiet) {
        const std::optional<uint64_t>& rss = soak_.back().rss_kib;
        std::printf("soak %7.2f min: daemon VmRSS %s KiB, accepted %.0f/s, p99 %.3f ms\n",
                    t / 60, rss ? std::to_string(*rss).c_str() : "(not measured)",
                    s.accepted_per_s, s.p99_ms);
        std::fflush(stdout);
      }
    }
  }

  void PrintHeader() {
    if (header_printed_ || o_.quiet) return;
    header_printed_ = true;
    std::printf("%12s %14s %10s %10s %10s %10s %10s\n", "offered/s", "accepted/s", "rejected",
                "batches", "p50_ms", "p99_ms", "max_ms");
  }

  void PrintStep(const StepResult& s) {
    if (o_.quiet) return;
    PrintHeader();
    std::printf("%12s %14.0f %10llu %10llu %10.3f %10.3f %10.3f\n",
                s.offered_rate > 0 ? Fmt("%.0f", s.offered_rate).c_str() : "max",
                s.accepted_per_s, static_cast<unsigned long long>(s.rejected),
                static_cast<unsigned long long>(s.batches), s.p50_ms, s.p99_ms, s.max_ms);
    std::fflush(stdout);
  }

  std::optional<double> BytesPerRank() const {
    if (!rss_before_ || !rss_after_) return std::nullopt;
    return (static_cast<double>(*rss_after_) - static_cast<double>(*rss_before_)) * 1024.0 /
           o_.ranks;
  }

  void PrintSummary() {
    if (o_.quiet) return;
    std::printf("job %s: %u ranks over %u streams, batch %u, window %u\n", o_.job.c_str(),
                o_.ranks, o_.streams, o_.batch, o_.window);
    if (o_.find_saturation) {
      if (knee_) {
        const StepResult& k = steps_[*knee_];
        std::printf("knee: offered %.0f/s, accepted %.0f/s, p50 %.3f ms, p99 %.3f ms%s\n",
                    k.offered_rate, k.accepted_per_s, k.p50_ms, k.p99_ms,
                    rate_limited_stop_ ? " (the last step before the daemon's rate limit rejected "
                                         "reports; not the daemon's capacity)"
                                       : "");
      } else {
        std::printf("knee: none (the first step already fell behind its offered rate)\n");
      }
      std::printf("saturation: best accepted %.0f/s (%s)\n", saturation_, stop_reason_.c_str());
    }
    if (!soak_.empty() && soak_.front().rss_kib && soak_.back().rss_kib) {
      std::printf("soak: daemon VmRSS %llu KiB after the first sample, %llu KiB after the last "
                  "(max %llu KiB)\n",
                  static_cast<unsigned long long>(*soak_.front().rss_kib),
                  static_cast<unsigned long long>(*soak_.back().rss_kib),
                  static_cast<unsigned long long>(SoakMaxRss()));
    }
    if (auto b = BytesPerRank()) {
      std::printf("daemon VmRSS: %llu KiB before, %llu KiB after: %.0f bytes per rank\n",
                  static_cast<unsigned long long>(*rss_before_),
                  static_cast<unsigned long long>(*rss_after_), *b);
    } else {
      std::printf("daemon VmRSS: not measured (give --daemon-pid or --ready-file)\n");
    }
  }

  bool WriteJson() {
    json j;
    j["config"] = {{"daemon", o_.daemon},   {"job", o_.job},         {"ranks", o_.ranks},
                   {"streams", o_.streams}, {"rate", o_.rate},       {"batch", o_.batch},
                   {"window", o_.window},
                   {"find_saturation", o_.find_saturation},
                   {"soak_minutes", o_.soak_minutes}, {"soak_interval", o_.soak_interval}};
    // --duration is the length of a plain run only: a saturation run records
    // what its steps ran instead (each step's measured seconds are in steps[]).
    if (o_.find_saturation) {
      j["config"]["step_duration"] = o_.step_duration;
      j["config"]["step_factor"] = o_.step_factor;
      j["config"]["max_steps"] = o_.max_steps;
    } else if (o_.soak_minutes == 0) {  // a soak's length is soak_minutes
      j["config"]["duration"] = o_.duration;
    }
    j["steps"] = json::array();
    for (const auto& s : steps_) j["steps"].push_back(ToJson(s));
    uint64_t accepted = 0, rejected = 0;
    for (const auto& s : steps_) {
      accepted += s.accepted;
      rejected += s.rejected;
    }
    j["accepted"] = accepted;
    j["rejected"] = rejected;
    if (o_.find_saturation) {
      j["knee"] = knee_ ? ToJson(steps_[*knee_]) : json(nullptr);
      j["saturation_accepted_per_s"] = saturation_;
      j["stop_reason"] = stop_reason_;
    }
    if (o_.soak_minutes > 0) {
      json samples = json::array();
      for (size_t i = 0; i < soak_.size(); ++i) {
        samples.push_back({{"elapsed_s", soak_[i].elapsed_s},
                           {"rss_kib", soak_[i].rss_kib ? json(*soak_[i].rss_kib) : json(nullptr)},
                           {"accepted_per_s", steps_[i].accepted_per_s},
                           {"p99_ms", steps_[i].p99_ms}});
      }
      json soak{{"samples", samples}};
      const bool measured = !soak_.empty() && soak_.front().rss_kib && soak_.back().rss_kib;
      soak["rss_growth_kib"] = measured ? json(static_cast<int64_t>(*soak_.back().rss_kib) -
                                               static_cast<int64_t>(*soak_.front().rss_kib))
                                        : json(nullptr);
      soak["rss_max_kib"] = measured ? json(SoakMaxRss()) : json(nullptr);
      j["soak"] = soak;
    }
    json mem;
    mem["daemon_pid"] = o_.daemon_pid;
    mem["rss_before_kib"] = rss_before_ ? json(*rss_before_) : json(nullptr);
    mem["rss_after_kib"] = rss_after_ ? json(*rss_after_) : json(nullptr);
    auto b = BytesPerRank();
    mem["bytes_per_rank"] = b ? json(*b) : json(nullptr);
    j["memory"] = mem;
    std::ofstream out(o_.json_file, std::ios::trunc);
    out << j.dump(2) << '\n';
    return static_cast<bool>(out.flush());
  }

  uint64_t SoakMaxRss() const {
    uint64_t m = 0;
    for (const auto& s : soak_) m = std::max(m, s.rss_kib.value_or(0));
    return m;
  }

  struct SoakSample {
    double elapsed_s;                 // since the soak began, at the end of the sample
    std::optional<uint64_t> rss_kib;  // the daemon's VmRSS then
  };

  Options o_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<SoakSample> soak_;  // one per soak step, parallel to steps_
  std::vector<StepResult> steps_;
  std::optional<size_t> knee_;
  double saturation_ = 0;
  std::string stop_reason_;
  bool rate_limited_stop_ = false;  // the search ended at the daemon's rate limit
  std::optional<uint64_t> rss_before_, rss_after_;
  bool header_printed_ = false;
};

// The daemon's ready file: {"grpc_address": "...", "pid": N}.
bool ReadReadyFile(Options& o, std::string* error) {
  std::ifstream in(o.ready_file);
  if (!in) {
    *error = "--ready-file " + o.ready_file + " cannot be read";
    return false;
  }
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    *error = "--ready-file " + o.ready_file + " is not a JSON object";
    return false;
  }
  if (o.daemon.empty() && j.contains("grpc_address") && j["grpc_address"].is_string())
    o.daemon = j["grpc_address"].get<std::string>();
  if (o.daemon_pid == 0 && j.contains("pid") && j["pid"].is_number_integer())
    o.daemon_pid = j["pid"].get<int64_t>();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"straggler-loadgen - drives a real stragglerd over gRPC with simulated ranks and\n"
               "reports sustained accepted reports/s, report-to-directive latency and the\n"
               "daemon's resident memory per rank. Loopback only. TLS from STRAGGLER_TLS_CA,\n"
               "STRAGGLER_TLS_CERT and STRAGGLER_TLS_KEY.",
               "straggler-loadgen"};
  app.add_option("--daemon", o.daemon, "daemon gRPC address (loopback), e.g. 127.0.0.1:7070");
  app.add_option("--ready-file", o.ready_file,
                 "the daemon's --ready-file: address (when --daemon is not given) and pid");
  app.add_option("--daemon-pid", o.daemon_pid, "daemon pid, for VmRSS")->check(CLI::PositiveNumber);
  // Defaults shown in --help come from the Options members themselves
  // (capture_default_str), so the help cannot drift from them.
  app.add_option("--ranks", o.ranks, "simulated ranks (world size)")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  app.add_option("--streams", o.streams, "ingest streams the ranks are split across")
      ->check(CLI::Range(1, kMaxStreams))
      ->capture_default_str();
  app.add_option("--rate", o.rate,
                 "offered reports/s over all streams; 0 = as fast as possible (with "
                 "--find-saturation: the first step's rate, 0 = 50000)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "reports per ReportBatch")
      ->check(CLI::Range(1u, kMaxBatch))
      ->capture_default_str();
  auto* duration =
      app.add_option("--duration", o.duration, "seconds to run (without --find-saturation)")
          ->check(CLI::Range(0.1, 3600.0))
          ->capture_default_str();
  app.add_option("--job", o.job, "job id (default: loadgen-<pid>)");
  auto* saturation =
      app.add_flag("--find-saturation", o.find_saturation,
                   "step the offered rate up until accepted/s stops growing, p99 explodes or the "
                   "daemon's per-stream rate limit rejects reports");
  app.add_option("--soak-minutes", o.soak_minutes,
                 "soak: run this many minutes at --rate, printing the daemon's VmRSS, "
                 "accepted/s and p99 every --soak-interval seconds")
      ->check(CLI::Range(0.001, 10080.0))
      ->excludes(duration)
      ->excludes(saturation);
  app.add_option("--soak-interval", o.soak_interval, "seconds per soak sample")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_option("--step-duration", o.step_duration, "seconds per saturation step")
      ->check(CLI::Range(0.1, 600.0))
      ->capture_default_str();
  app.add_option("--step-factor", o.step_factor, "offered-rate multiplier per saturation step")
      ->check(CLI::Range(1.05, 10.0))
      ->capture_default_str();
  app.add_option("--max-steps", o.max_steps, "most saturation steps")
      ->check(CLI::Range(1u, 40u))
      ->capture_default_str();
  app.add_option("--window", o.window, "unacknowledged batches per stream")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  app.add_option("--json", o.json_file, "write the results as JSON to this file");
  app.add_flag("--quiet", o.quiet, "print nothing but errors");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  std::string error;
  if (!o.ready_file.empty() && !ReadReadyFile(o, &error)) {
    std::cerr << "straggler-loadgen: " << error << '\n';
    return kExitUsage;
  }
  if (o.daemon.empty()) {
    std::cerr << "straggler-loadgen: give --daemon ADDR or --ready-file FILE\n";
    return kExitUsage;
  }
  if (!IsLoopback(o.daemon)) {
    std::cerr << "straggler-loadgen: --daemon " << o.daemon
              << " is not a loopback address (127.0.0.0/8, localhost, [::1], unix:)\n";
    return kExitUsage;
  }
  if (o.streams > o.ranks) {
    std::cerr << "straggler-loadgen: --streams " << o.streams << " > --ranks " << o.ranks
              << ": every stream needs at least one rank\n";
    return kExitUsage;
  }
  o.credentials =
      straggler::MakeChannelCredentials(straggler::ChannelSecurityFromEnv(), o.daemon, &error);
  if (!o.credentials) {
    std::cerr << "straggler-loadgen: " << error << '\n';
    return kExitUsage;
  }
  if (o.job.empty()) o.job = "loadgen-" + std::to_string(::getpid());
  return LoadGen(std::move(o)).Run();
}
