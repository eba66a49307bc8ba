// Helpers of the stream:* tests (stream_session_test.cc,
// stream_replicas_test.cc).
#pragma once

#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

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

}  // namespace straggler::stream::testutil
