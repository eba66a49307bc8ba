// Helpers of the stream:* tests (stream_session_test.cc,
// stream_replicas_test.cc).
#pragma once

#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "daemon_test_util.h"
#include "straggler/stream/channel_pool.h"
#include "straggler/stream/stream_session.h"

namespace straggler::stream::testutil {

// Polls `done` every 5 ms for up to `timeout`.
template <typename F>
bool Eventually(F done, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A loopback address nothing listens on (a port the kernel handed out and
// took back).
inline std::string DeadEndpoint() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

// One rank of a 2-rank job: all its reports in every connection's opening
// batch with the hello (the daemon drops the duplicates), so a stream that
// ended before they were acknowledged (a redirect) loses none.
class ReplayingRank : public StreamSession::Source {
 public:
  ReplayingRank(std::string job, uint32_t rank) : job_(std::move(job)), rank_(rank) {}
  void Queue(uint64_t first, uint64_t last) {
    absl::MutexLock lock(&mu_);
    for (uint64_t it = first; it <= last; ++it) reports_.push_back(it);
  }
  uint64_t accepted() const {
    absl::MutexLock lock(&mu_);
    return accepted_;
  }
  void Opening(std::vector<v1::ReportBatch>* out) override {
    absl::MutexLock lock(&mu_);
    v1::ReportBatch& b = out->emplace_back();
    b.set_sequence(next_++);
    *b.mutable_hello() = daemon::testutil::Hello(job_, 2, {rank_}).hello();
    for (uint64_t it : reports_) daemon::testutil::AddReport(b, rank_, it, 0.1);
  }
  bool NextBatch(v1::ReportBatch*) override { return false; }
  Clock::time_point ReadyAt() const override { return Clock::time_point::max(); }
  void OnDirective(const v1::Directive& d) override {
    absl::MutexLock lock(&mu_);
    accepted_ += d.accepted();
  }

 private:
  const std::string job_;
  const uint32_t rank_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> reports_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;
};

// A pool over `endpoints` (insecure, the session's channel arguments).
inline std::shared_ptr<ChannelPool> PoolOf(const std::string& endpoints,
                                           const StreamSession::Options& options) {
  auto pool = ChannelPool::Make(endpoints, grpc::InsecureChannelCredentials(),
                                StreamSession::ChannelArgs(options));
  REQUIRE(pool.ok());
  return *pool;
}

}  // namespace straggler::stream::testutil
