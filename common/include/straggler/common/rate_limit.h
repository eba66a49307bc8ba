// A token bucket: `rate` tokens per second, holding at most `burst`. The
// ingest service keeps one per stream to cap the reports it takes from it
// (limits.stream_reports_per_second / stream_reports_burst).
//
//   TokenBucket bucket(20000, 100000, Clock::now());     // starts full
//   uint64_t take = bucket.Take(batch_reports, Clock::now());  // <= batch_reports
//
// rate 0 means no limit: Take grants everything. Time is passed in (a
// steady clock in the daemon, a made-up one in tests); time going backwards
// adds nothing. Not thread-safe: one owner (a stream's read chain).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"

namespace straggler::common {

class TokenBucket {
 public:
  using Time = std::chrono::steady_clock::time_point;

  TokenBucket(uint32_t rate_per_second, uint32_t burst, Time now)
      : rate_(rate_per_second), burst_(burst), tokens_(burst), last_(now) {}

  // Grants up to `wanted` tokens (whole ones), fewer when the bucket holds
  // fewer; returns how many were taken.
  uint64_t Take(uint64_t wanted, Time now) {
    if (rate_ == 0) return wanted;
    if (now > last_) {
      const double elapsed = std::chrono::duration<double>(now - last_).count();
      tokens_ = std::min<double>(burst_, tokens_ + elapsed * rate_);
      last_ = now;
    }
    const uint64_t granted = std::min<uint64_t>(wanted, static_cast<uint64_t>(tokens_));
    tokens_ -= static_cast<double>(granted);
    return granted;
  }

 private:
  uint32_t rate_;
  uint32_t burst_;
  double tokens_;
  Time last_;
};

// Rate-limited logging of a frequent event (an ingest stream opening): the
// first `burst` of each `interval` are logged one by one, the rest only
// counted; TakeSuppressed, called periodically, hands the count over for one
// summary line once the interval that held them has ended. 10 000 streams
// opening at once make ~20 lines, not 10 000.
//
//   if (budget.Take(now)) spdlog::info("stream ...");
//   if (uint64_t n = budget.TakeSuppressed(now)) spdlog::info("{} more ...", n);
//
// Thread-safe.
class LogBudget {
 public:
  using Time = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  LogBudget(uint32_t burst, Duration interval) : burst_(burst), interval_(interval) {}

  // true: log this event; false: it was counted for the summary.
  bool Take(Time now) {
    absl::MutexLock lock(&mu_);
    if (!started_ || now - window_start_ >= interval_) {
      started_ = true;
      window_start_ = now;
      logged_ = 0;
    }
    if (logged_ < burst_) {
      ++logged_;
      return true;
    }
    ++suppressed_;
    return false;
  }

  // The events not logged, once the interval they fell in has ended (0
  // before that, or when there were none); they are then reset.
  uint64_t TakeSuppressed(Time now) {
    absl::MutexLock lock(&mu_);
    if (suppressed_ == 0 || now - window_start_ < interval_) return 0;
    return std::exchange(suppressed_, 0);
  }

  uint32_t burst() const { return burst_; }
  Duration interval() const { return interval_; }

 private:
  const uint32_t burst_;
  const Duration interval_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  Time window_start_ ABSL_GUARDED_BY(mu_){};
  uint32_t logged_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

// A log line that can come in floods (one per stream refused, per stream
// opened, per rank's event): a LogBudget with its level and the summary line.
// Within the budget a line is logged at `level`, beyond it at debug (still
// there for a debugging session) and counted; Summarize, on a periodic tick,
// logs the count once its interval has ended, at `level`:
//   "99000 more ingest streams refused in the last 10 s (the first 20 of
//    every 10 s are logged one by one, the rest at debug level; <note>)"
// One client refused 99 000 times wrote 99 000 warnings (15.5 MB) before.
//
//   FloodLog refused{"ingest streams refused", spdlog::level::warn, "counted in ..."};
//   spdlog::log(refused.Level(now), "ingest stream from {} refused: {}", peer, why);
//   refused.Summarize(now);  // the tick
//
// Thread-safe.
class FloodLog {
 public:
  using Time = LogBudget::Time;

  FloodLog(std::string what, spdlog::level::level_enum level, std::string note,
           uint32_t burst = 20, LogBudget::Duration interval = std::chrono::seconds(10))
      : what_(std::move(what)), note_(std::move(note)), level_(level), budget_(burst, interval) {}

  // The level to log one more line at: `level` within the budget, else debug.
  spdlog::level::level_enum Level(Time now) {
    return budget_.Take(now) ? level_ : spdlog::level::debug;
  }

  // At a stop: the count of the interval not yet ended, so none is lost.
  void Flush() { Summarize(Time::max()); }

  // One line for the lines logged at debug in an interval that has ended.
  void Summarize(Time now) {
    const uint64_t n = budget_.TakeSuppressed(now);
    if (n == 0) return;
    const auto seconds =
        std::chrono::duration_cast<std::chrono::seconds>(budget_.interval()).count();
    spdlog::log(level_,
                "{} more {} in the last {} s (the first {} of every {} s are logged one by one, "
                "the rest at debug level{}{})",
                n, what_, seconds, budget_.burst(), seconds, note_.empty() ? "" : "; ", note_);
  }

 private:
  const std::string what_;
  const std::string note_;
  const spdlog::level::level_enum level_;
  LogBudget budget_;
};

}  // namespace straggler::common
