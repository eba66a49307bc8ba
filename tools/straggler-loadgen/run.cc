#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loadgen.h"
#include "stream.h"

namespace straggler::loadgen {
namespace {

// The run: its streams, the steps, the soak; results in a Results.
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
    r_.rss_before = RssKiB(o_.daemon_pid);

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
      r_.steps.push_back(Step(o_.rate, o_.duration));
      PrintStep(o_, r_.steps.back(), header_printed_);
    }

    bool drained = true;
    for (auto& s : streams_) drained = s->Drain(kDrainTimeout) && drained;
    r_.rss_after = RssKiB(o_.daemon_pid);
    for (auto& s : streams_) s->Close();

    int rc = kExitOk;
    uint64_t accepted = 0, rejected = 0;
    for (const auto& s : r_.steps) {
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
    PrintSummary(o_, r_);
    if (!o_.json_file.empty() && !WriteJson(o_, r_)) {
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
      r_.steps.push_back(r);
      PrintStep(o_, r, header_printed_);
      const bool kept_up = r.accepted_per_s >= 0.9 * rate;
      const bool grew = r.accepted_per_s >= 1.1 * best;
      const double first_p99 = r_.steps.front().p99_ms;
      const bool exploded = k > 0 && r.p99_ms > std::max(10 * first_p99, kExplodedFloorMs);
      if (kept_up && !exploded) knee = r_.steps.size() - 1;
      best = std::max(best, r.accepted_per_s);
      // Rate-limited: the steps from here on would measure the limit (they
      // used to end as "accepted/s stopped growing", a knee that was the
      // limiter's).
      if (r.rate_limited_batches > 0) {
        r_.stop_reason = RateLimitText(RateLimitMessage(), o_.streams) +
                       " rejected reports: not the daemon's capacity; " + kRateLimitHint;
        r_.rate_limited_stop = true;
        break;
      }
      if ((!kept_up && !grew) || exploded) {
        r_.stop_reason = exploded ? "p99 exploded" : "accepted/s stopped growing";
        break;
      }
      if (!kept_up) r_.stop_reason = "below the offered rate";
      rate *= o_.step_factor;
    }
    if (r_.stop_reason.empty()) r_.stop_reason = "--max-steps reached";
    r_.knee = knee;
    r_.saturation = best;
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
    for (double t = 0; t < total - 1e-9 && r_.soak.size() < 1'000'000;) {
      const double seconds = std::min(o_.soak_interval, total - t);
      r_.steps.push_back(Step(o_.rate, seconds));
      t += seconds;
      r_.soak.push_back({t, RssKiB(o_.daemon_pid)});
      const StepResult& s = r_.steps.back();
      if (!o_.quiet) {
        const std::optional<uint64_t>& rss = r_.soak.back().rss_kib;
        std::printf("soak %7.2f min: daemon VmRSS %s KiB, accepted %.0f/s, p99 %.3f ms\n",
                    t / 60, rss ? std::to_string(*rss).c_str() : "(not measured)",
                    s.accepted_per_s, s.p99_ms);
        std::fflush(stdout);
      }
    }
  }

  Options o_;
  std::vector<std::unique_ptr<Stream>> streams_;
  Results r_;
  bool header_printed_ = false;
};

}  // namespace

int Run(Options o) { return LoadGen(std::move(o)).Run(); }

}  // namespace straggler::loadgen
