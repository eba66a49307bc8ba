// stream::StreamSession, the background stream the client library and the
// agent share, driven through its Source hooks against a real stragglerd
// (in process, loopback, port 0) or against a port nobody listens on:
//  * WantsStream: no stream while the source wants none; an open one is
//    half-closed after idle_close (OnDisconnected says idle) and opened
//    again when the source wants one.
//  * Stop(deadline) + Drained: the sender delivers what is outstanding
//    before it closes; with no daemon Join returns by the deadline.
//  * Log sink: one warning per outage, not per retry; a refused hello once.
//  * SetBackoff: the next reconnect uses the new delay.
//  * late_daemon: sessions with the client's default backoff, failing for
//    seconds, reach a daemon that starts late within about the backoff cap.

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"
#include "daemon_test_util.h"
#include "straggler/stream/stream_session.h"
#include "stream_test_util.h"

namespace v1 = straggler::v1;
namespace ss = straggler::stream;
namespace tu = straggler::daemon::testutil;
using namespace std::chrono_literals;

namespace {

using straggler::stream::testutil::DeadEndpoint;
using straggler::stream::testutil::Eventually;
using straggler::stream::testutil::PoolOf;

// A Source as small as the client's: queued reports of one rank go out in
// one batch, kept until acknowledged and resent (with the hello) on a new
// connection.
class TestSource : public ss::StreamSession::Source {
 public:
  explicit TestSource(uint32_t world_size = 2, std::string job = "stream-test")
      : world_size_(world_size), job_(std::move(job)) {}

  void Queue(uint64_t first, uint64_t last) {
    absl::MutexLock lock(&mu_);
    for (uint64_t it = first; it <= last; ++it) queued_.push_back(it);
  }
  void SetWants(bool wants) {
    absl::MutexLock lock(&mu_);
    wants_ = wants;
  }
  // Never drained (Stop must still end by its deadline).
  void NeverDrained() {
    absl::MutexLock lock(&mu_);
    never_drained_ = true;
  }

  int openings() const { absl::MutexLock l(&mu_); return openings_; }
  int connected() const { absl::MutexLock l(&mu_); return connected_; }
  uint64_t accepted() const { absl::MutexLock l(&mu_); return accepted_; }
  uint64_t duplicates() const { absl::MutexLock l(&mu_); return duplicates_; }
  size_t unacked() const { absl::MutexLock l(&mu_); return unacked_.size(); }
  std::vector<ss::StreamSession::Disconnect> disconnects() const {
    absl::MutexLock l(&mu_);
    return disconnects_;
  }

  bool WantsStream() override {
    absl::MutexLock lock(&mu_);
    return wants_;
  }
  void Opening(std::vector<v1::ReportBatch>* out) override {
    absl::MutexLock lock(&mu_);
    ++openings_;
    for (const auto& [seq, its] : unacked_) out->push_back(BatchLocked(seq, its));
    if (out->empty()) out->emplace_back().set_sequence(next_sequence_++);
    *out->front().mutable_hello() = tu::Hello(job_, world_size_, {0}).hello();
  }
  bool NextBatch(v1::ReportBatch* batch) override {
    absl::MutexLock lock(&mu_);
    if (queued_.empty()) return false;
    const uint64_t seq = next_sequence_++;
    std::vector<uint64_t>& its = unacked_[seq];
    its.assign(queued_.begin(), queued_.end());
    queued_.clear();
    *batch = BatchLocked(seq, its);
    return true;
  }
  ss::Clock::time_point ReadyAt() const override {
    absl::MutexLock lock(&mu_);
    return queued_.empty() ? ss::Clock::time_point::max() : ss::Clock::time_point::min();
  }
  bool Drained() override {
    absl::MutexLock lock(&mu_);
    return !never_drained_ && queued_.empty() && unacked_.empty();
  }
  void OnConnected() override {
    absl::MutexLock lock(&mu_);
    ++connected_;
  }
  void OnDirective(const v1::Directive& d) override {
    absl::MutexLock lock(&mu_);
    accepted_ += d.accepted();
    duplicates_ += d.duplicates();
    unacked_.erase(unacked_.begin(), unacked_.upper_bound(d.acked_sequence()));
  }
  void OnDisconnected(const ss::StreamSession::Disconnect& how) override {
    absl::MutexLock lock(&mu_);
    disconnects_.push_back(how);
  }

 private:
  v1::ReportBatch BatchLocked(uint64_t seq, const std::vector<uint64_t>& its) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::ReportBatch b;
    b.set_sequence(seq);
    for (uint64_t it : its) tu::AddReport(b, 0, it, 0.1);
    return b;
  }

  const uint32_t world_size_;
  const std::string job_;
  mutable absl::Mutex mu_;
  bool wants_ ABSL_GUARDED_BY(mu_) = true;
  bool never_drained_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<uint64_t> queued_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::vector<uint64_t>> unacked_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  int openings_ ABSL_GUARDED_BY(mu_) = 0;
  int connected_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t duplicates_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ss::StreamSession::Disconnect> disconnects_ ABSL_GUARDED_BY(mu_);
};

// Every log line the session writes, by level.
struct Lines {
  absl::Mutex mu;
  std::vector<std::pair<ss::LogLevel, std::string>> lines ABSL_GUARDED_BY(mu);
  ss::LogSink Sink() {
    return [this](ss::LogLevel level, const std::string& line) {
      absl::MutexLock lock(&mu);
      lines.emplace_back(level, line);
    };
  }
  std::vector<std::string> At(ss::LogLevel level) {
    absl::MutexLock lock(&mu);
    std::vector<std::string> out;
    for (const auto& [l, text] : lines)
      if (l == level) out.push_back(text);
    return out;
  }
};

ss::StreamSession::Options OptionsFor(Lines& lines) {
  ss::StreamSession::Options o;
  o.name = "session-test";
  o.backoff = {10ms, 50ms, ss::Backoff::Jitter::kNarrow};
  o.max_send_delay = 0ms;  // the test source names every due time
  o.idle_close = 100ms;
  o.log = lines.Sink();
  return o;
}


}  // namespace

TEST_CASE("a stream is open only while the source wants one, and idles out", "[stream]") {
  tu::LoopbackDaemon daemon;
  Lines lines;
  TestSource source;
  source.SetWants(false);
  const std::string endpoint = daemon.server.grpc_dial_address();
  ss::StreamSession session(PoolOf(endpoint, OptionsFor(lines)), OptionsFor(lines), source);
  session.Start();

  std::this_thread::sleep_for(200ms);
  CHECK(session.Attempts() == 0);
  CHECK(source.openings() == 0);

  source.SetWants(true);
  source.Queue(1, 20);
  session.Wake();
  REQUIRE(Eventually([&] { return source.accepted() == 20; }));
  CHECK(source.openings() == 1);
  CHECK(source.connected() == 1);
  CHECK(session.Connected());

  // Nothing more to send and no stream wanted: half-closed after idle_close,
  // a clean end of the call, not a failure.
  source.SetWants(false);
  session.Wake();
  REQUIRE(Eventually([&] { return !source.disconnects().empty(); }));
  const auto first_end = source.disconnects().front();
  CHECK(first_end.idle);
  CHECK(first_end.was_connected);
  CHECK(first_end.status.ok());
  CHECK_FALSE(session.Connected());
  CHECK(lines.At(ss::LogLevel::kWarning).empty());

  // Wanted again: a new stream, the hello again, more reports.
  source.SetWants(true);
  source.Queue(21, 30);
  session.Wake();
  REQUIRE(Eventually([&] { return source.accepted() == 30; }));
  CHECK(source.openings() == 2);
  CHECK(session.Attempts() == 2);
  CHECK(session.Connections() == 2);
  session.Stop(ss::Clock::now() + 5s);
  session.Join();
  CHECK(source.duplicates() == 0);
}

TEST_CASE("Stop delivers what is outstanding before the stream closes", "[stream]") {
  tu::LoopbackDaemon daemon;
  Lines lines;
  TestSource source;
  const std::string endpoint = daemon.server.grpc_dial_address();
  ss::StreamSession session(PoolOf(endpoint, OptionsFor(lines)), OptionsFor(lines), source);
  session.Start();
  for (uint64_t it = 1; it <= 2000; it += 100) {
    source.Queue(it, it + 99);
    session.Wake();
  }
  session.Stop(ss::Clock::now() + 10s);
  session.Join();
  // Drained() held when the sender closed: every report acknowledged.
  CHECK(source.unacked() == 0);
  CHECK(source.accepted() == 2000);
  REQUIRE_FALSE(source.disconnects().empty());
  CHECK(source.disconnects().back().status.ok());
}

TEST_CASE("without a daemon the session retries quietly and Stop ends by its deadline",
          "[stream][no_daemon]") {
  Lines lines;
  TestSource source;
  source.NeverDrained();
  source.Queue(1, 5);
  const std::string endpoint = DeadEndpoint();
  ss::StreamSession session(PoolOf(endpoint, OptionsFor(lines)), OptionsFor(lines), source);
  session.Start();
  REQUIRE(Eventually([&] { return session.Reconnects() >= 4; }));
  CHECK(source.connected() == 0);
  CHECK_FALSE(session.Connected());
  // One warning for the outage, the later retries at debug level.
  const auto warnings = lines.At(ss::LogLevel::kWarning);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("session-test: cannot reach " + endpoint));
  CHECK(lines.At(ss::LogLevel::kDebug).size() >= 3);

  // Never drained, no daemon: Join returns once the deadline has passed
  // (the no-daemon rule: a shutdown is bounded).
  const auto t0 = ss::Clock::now();
  session.Stop(t0 + 300ms);
  session.Join();
  const auto took = ss::Clock::now() - t0;
  CHECK(took >= 300ms);
  CHECK(took < 5s);
}

TEST_CASE("a refused hello is logged once and retried at the backoff maximum", "[stream]") {
  tu::LoopbackDaemon daemon({}, spdlog::level::err);
  Lines lines;
  TestSource source(/*world_size=*/0);  // the daemon refuses world_size=0
  const std::string endpoint = daemon.server.grpc_dial_address();
  ss::StreamSession session(PoolOf(endpoint, OptionsFor(lines)), OptionsFor(lines), source);
  session.Start();
  REQUIRE(Eventually([&] { return source.disconnects().size() >= 3; }));
  session.Stop();
  for (const auto& d : source.disconnects()) {
    CHECK(d.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_FALSE(d.was_connected);
  }
  const auto warnings = lines.At(ss::LogLevel::kWarning);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("rejected the stream") &&
                              Catch::Contains("world_size") && Catch::Contains("50 ms"));
  CHECK(source.connected() == 0);
}

TEST_CASE("SetBackoff applies to the next reconnect", "[stream][no_daemon]") {
  Lines lines;
  TestSource source;
  const std::string endpoint = DeadEndpoint();
  auto options = OptionsFor(lines);
  options.backoff = {5ms, 5ms, ss::Backoff::Jitter::kNarrow};
  ss::StreamSession session(PoolOf(endpoint, options), options, source);
  session.Start();
  REQUIRE(Eventually([&] { return session.Reconnects() >= 5; }));
  session.SetBackoff({10s, 10s, ss::Backoff::Jitter::kNarrow});
  // At most the reconnect already waiting on the old delay happens.
  std::this_thread::sleep_for(100ms);
  const uint64_t after = session.Reconnects();
  std::this_thread::sleep_for(500ms);
  CHECK(session.Reconnects() == after);
  // Stop cuts the 10 s wait short.
  const auto t0 = ss::Clock::now();
  session.Stop();
  CHECK(ss::Clock::now() - t0 < 5s);
}

// Issue 28: ranks whose backoff had grown to its cap (5 s then) reached a
// daemon that came up late 9.6 s after it started. Sessions with the
// client's default backoff fail against a closed port until every one has
// retried at its cap, then the daemon starts there. The times are printed;
// what is asserted is that every session gets there, within a generous
// bound, and that the default cap is the issue's ~2 s. (The sessions'
// channels share one gRPC subchannel, as a process's channels to one
// address do, so they come back together.)
TEST_CASE("late_daemon: sessions at their backoff cap reach a daemon that starts late",
          "[stream][no_daemon]") {
  // The session's default, the client's (client:late_daemon checks that
  // ClientOptions and the C ABI default to it) and the agent's.
  const ss::Backoff defaults;
  CHECK(defaults.max <= 2000ms);
  constexpr int kSessions = 8;
  Lines lines;
  const std::string endpoint = DeadEndpoint();
  std::vector<std::unique_ptr<TestSource>> sources;
  std::vector<std::unique_ptr<ss::StreamSession>> sessions;
  for (int i = 0; i < kSessions; ++i) {
    sources.push_back(std::make_unique<TestSource>(2, "late-" + std::to_string(i)));
    sources.back()->Queue(1, 3);
    auto o = OptionsFor(lines);
    o.backoff = defaults;  // kSpread, as the client's
    // One channel per session, made as the client makes its own: separate
    // connections, gRPC's reconnect backoff bounded by the session's.
    sessions.push_back(std::make_unique<ss::StreamSession>(
        PoolOf(endpoint, o), o,
        *sources.back()));
    sessions.back()->Start();
  }
  // Failing long enough that every session retries at its cap: the delays
  // double from backoff_initial and reach backoff_max within 6 attempts.
  REQUIRE(Eventually(
      [&] {
        for (const auto& s : sessions)
          if (s->Reconnects() < 8) return false;
        return true;
      },
      60s));

  straggler::daemon::DaemonConfig config;
  config.grpc_address = endpoint;
  config.http_address = "127.0.0.1:0";
  straggler::daemon::Server server;
  const auto started = ss::Clock::now();
  REQUIRE(server.Start(config).ok());
  std::vector<double> seconds(kSessions, -1);
  REQUIRE(Eventually(
      [&] {
        bool all = true;
        for (int i = 0; i < kSessions; ++i) {
          if (seconds[i] < 0 && sources[i]->connected() > 0)
            seconds[i] = std::chrono::duration<double>(ss::Clock::now() - started).count();
          all = all && seconds[i] >= 0;
        }
        return all;
      },
      30s));
  std::sort(seconds.begin(), seconds.end());
  // Generous (a loaded machine stretches it): the cap, gRPC's own reconnect
  // within 1.2x the cap, a second of slack. With the old 5 s cap the sessions
  // took 3-8 s, their delay and gRPC's added up.
  CHECK(seconds.back() < 2 * std::chrono::duration<double>(defaults.max).count() + 1.0);
  std::string text;
  for (double t : seconds) text += " " + std::to_string(t).substr(0, 5);
  WARN("late_daemon: backoff " << defaults.initial.count() << ".." << defaults.max.count()
                               << " ms; seconds from the daemon's start to each session's first "
                                  "directive:"
                               << text);
  for (auto& s : sessions) s->Stop(ss::Clock::now() + 2s);
  for (auto& s : sessions) s->Join();
  for (const auto& src : sources) CHECK(src->accepted() == 3);
  server.Shutdown(0ms);
}
