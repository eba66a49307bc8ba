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

namespace straggler::daemon {

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

}  // namespace straggler::daemon
