#include "http_deadline.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "stats.h"

namespace straggler::daemon {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::microseconds Timeout(time_t sec, time_t usec) {
  return std::chrono::seconds(sec) + std::chrono::microseconds(usec);
}

// Waits for `events` on `sock` until `deadline`; false on timeout or error.
bool WaitUntil(int sock, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{sock, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

void PeerName(int sock, bool remote, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int rc = remote ? ::getpeername(sock, reinterpret_cast<sockaddr*>(&addr), &len)
                        : ::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    port = ntohs(a->sin6_port);
  }
  ip = text;
}

// A connection's stream with whole-request and whole-response deadlines.
// Buffered: httplib reads request lines a byte at a time.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int sock, std::chrono::microseconds read_timeout,
                 std::chrono::microseconds write_timeout)
      : sock_(sock), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

  // A request starts arriving (its first byte is readable or buffered).
  void StartRequest() {
    read_deadline_ = Clock::now() + read_timeout_;
    writing_ = false;
  }
  bool Buffered() const { return pos_ < end_; }
  bool read_timed_out() const { return read_timed_out_; }
  bool write_timed_out() const { return write_timed_out_; }

  bool is_readable() const override {
    return Buffered() || WaitUntil(sock_, POLLIN, read_deadline_);
  }
  bool is_writable() const override { return WaitUntil(sock_, POLLOUT, WriteDeadline()); }

  ssize_t read(char* ptr, size_t size) override {
    if (!Buffered()) {
      if (!WaitUntil(sock_, POLLIN, read_deadline_)) {
        read_timed_out_ = true;
        return -1;
      }
      ssize_t n;
      do {
        n = ::recv(sock_, buffer_, sizeof buffer_, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      pos_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - pos_);
    std::memcpy(ptr, buffer_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!writing_) {  // the response's first write starts its deadline
      writing_ = true;
      write_deadline_ = Clock::now() + write_timeout_;
    }
    if (!WaitUntil(sock_, POLLOUT, write_deadline_)) {
      write_timed_out_ = true;
      return -1;
    }
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    PeerName(sock_, /*remote=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    PeerName(sock_, /*remote=*/false, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  Clock::time_point WriteDeadline() const {
    return writing_ ? write_deadline_ : Clock::now() + write_timeout_;
  }

  const int sock_;
  const std::chrono::microseconds read_timeout_;
  const std::chrono::microseconds write_timeout_;
  Clock::time_point read_deadline_{};
  Clock::time_point write_deadline_{};
  bool writing_ = false;
  bool read_timed_out_ = false;
  bool write_timed_out_ = false;
  char buffer_[4096];
  size_t pos_ = 0, end_ = 0;
};

class DeadlineServer final : public httplib::Server {
 public:
  explicit DeadlineServer(DaemonStats& stats) : stats_(stats) {}

 private:
  // httplib's keep-alive loop (process_server_socket), with DeadlineStream.
  bool process_and_close_socket(socket_t sock) override {
    DeadlineStream stream(sock, Timeout(read_timeout_sec_, read_timeout_usec_),
                          Timeout(write_timeout_sec_, write_timeout_usec_));
    bool ret = false;
    for (size_t left = keep_alive_max_count_; left > 0 && WaitForRequest(stream, sock); --left) {
      stream.StartRequest();
      bool connection_closed = false;
      ret = process_request(stream, /*close_connection=*/left == 1, connection_closed, nullptr);
      if (!ret || connection_closed) break;
    }
    if (stream.read_timed_out()) {
      stats_.http_slow_clients[0].fetch_add(1, std::memory_order_relaxed);
    } else if (stream.write_timed_out()) {
      stats_.http_slow_clients[1].fetch_add(1, std::memory_order_relaxed);
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ret;
  }

  // The next request's first byte, for at most keep_alive_timeout; polled in
  // slices so that a stopping server lets go of idle connections at once.
  bool WaitForRequest(const DeadlineStream& stream, int sock) {
    if (stream.Buffered()) return true;  // a pipelined request
    const auto deadline = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    while (svr_sock_ != INVALID_SOCKET) {
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      if (WaitUntil(sock, POLLIN, slice)) return true;
      if (Clock::now() >= deadline) return false;
    }
    return false;
  }

  DaemonStats& stats_;
};

}  // namespace

std::unique_ptr<httplib::Server> MakeDeadlineServer(DaemonStats& stats) {
  return std::make_unique<DeadlineServer>(stats);
}

}  // namespace straggler::daemon
