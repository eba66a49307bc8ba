#include "http_deadline.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <type_traits>
#include <utility>

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

// How a DeadlineStream moves a connection's bytes, never blocking: the
// socket itself, or TLS over it. Read and Write return the bytes moved (0
// from Read: the peer closed), or -1 with `wait` = POLLIN/POLLOUT to retry
// once the socket is ready for that, or -1 with `wait` = 0: failed.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual ssize_t Read(char* buf, size_t size, short& wait) = 0;
  virtual ssize_t Write(const char* buf, size_t size, short& wait) = 0;
  // Received bytes a Read returns without touching the socket (a TLS
  // record's decrypted rest): polling the socket for them would wait in vain.
  virtual bool Pending() const { return false; }
};

class SocketTransport final : public Transport {
 public:
  explicit SocketTransport(int sock) : sock_(sock) {}

  ssize_t Read(char* buf, size_t size, short& wait) override {
    return Result(::recv(sock_, buf, size, MSG_DONTWAIT), POLLIN, wait);
  }
  ssize_t Write(const char* buf, size_t size, short& wait) override {
    return Result(::send(sock_, buf, size, MSG_DONTWAIT | MSG_NOSIGNAL), POLLOUT, wait);
  }

 private:
  static ssize_t Result(ssize_t n, short again, short& wait) {
    wait = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? again : 0;
    return n;
  }
  const int sock_;
};

// TLS on a non-blocking socket; owns the SSL object.
class TlsTransport final : public Transport {
 public:
  // `ctx`: certificate, key, client CA. The SSL object holds a reference
  // to it, so a context replaced meanwhile lives until this connection ends.
  TlsTransport(int sock, SSL_CTX* ctx) : ssl_(SSL_new(ctx)) {
    if (ssl_ != nullptr && SSL_set_fd(ssl_, sock) != 1) {
      SSL_free(ssl_);
      ssl_ = nullptr;
    }
  }
  ~TlsTransport() override {
    if (ssl_ == nullptr) return;
    // close_notify after a clean exchange, best effort: never waits.
    if (shutdown_) SSL_shutdown(ssl_);
    SSL_free(ssl_);
  }
  TlsTransport(const TlsTransport&) = delete;
  TlsTransport& operator=(const TlsTransport&) = delete;

  bool valid() const { return ssl_ != nullptr; }
  // One step of the server handshake: 1 done; -1 with `wait` as for Read.
  ssize_t Accept(short& wait) { return Result(SSL_accept(ssl_), wait); }
  void set_shutdown(bool clean) { shutdown_ = clean; }

  ssize_t Read(char* buf, size_t size, short& wait) override {
    const int n = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(size, INT_MAX)));
    if (n <= 0 && SSL_get_error(ssl_, n) == SSL_ERROR_ZERO_RETURN) {
      wait = 0;
      return 0;  // close_notify: the peer closed
    }
    return Result(n, wait);
  }
  ssize_t Write(const char* buf, size_t size, short& wait) override {
    return Result(SSL_write(ssl_, buf, static_cast<int>(std::min<size_t>(size, INT_MAX))), wait);
  }
  bool Pending() const override { return SSL_pending(ssl_) > 0; }

 private:
  ssize_t Result(int n, short& wait) {
    wait = 0;
    if (n > 0) return n;
    switch (SSL_get_error(ssl_, n)) {
      case SSL_ERROR_WANT_READ: wait = POLLIN; break;
      case SSL_ERROR_WANT_WRITE: wait = POLLOUT; break;
      default: ERR_clear_error(); break;  // this thread's next connection starts clean
    }
    return -1;
  }

  SSL* ssl_;
  bool shutdown_ = false;
};

// A connection's stream with whole-request and whole-response deadlines.
// Buffered: httplib reads request lines a byte at a time.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int sock, Transport& transport, std::chrono::microseconds read_timeout,
                 std::chrono::microseconds write_timeout)
      : sock_(sock),
        transport_(transport),
        read_timeout_(read_timeout),
        write_timeout_(write_timeout) {}

  // A request starts arriving (its first byte is readable or buffered). The
  // TLS handshake, too, runs under a request deadline.
  void StartRequest() {
    read_deadline_ = Clock::now() + read_timeout_;
    writing_ = false;
  }
  // Runs `step` (a Transport-style call) until it moves something or fails,
  // waiting for the socket as it asks, until the request's deadline.
  template <class Step>
  ssize_t UntilReadDeadline(Step step) {
    return Retry(step, read_deadline_, read_timed_out_);
  }
  bool Buffered() const { return pos_ < end_ || transport_.Pending(); }
  bool read_timed_out() const { return read_timed_out_; }
  bool write_timed_out() const { return write_timed_out_; }

  bool is_readable() const override {
    return Buffered() || WaitUntil(sock_, POLLIN, read_deadline_);
  }
  bool is_writable() const override { return WaitUntil(sock_, POLLOUT, WriteDeadline()); }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == end_) {
      const ssize_t n = UntilReadDeadline(
          [&](short& wait) { return transport_.Read(buffer_, sizeof buffer_, wait); });
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
    return Retry([&](short& wait) { return transport_.Write(ptr, size, wait); }, write_deadline_,
                 write_timed_out_);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    PeerName(sock_, /*remote=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    PeerName(sock_, /*remote=*/false, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  template <class Step>
  ssize_t Retry(Step step, Clock::time_point deadline, bool& timed_out) {
    for (;;) {
      short wait = 0;
      const ssize_t n = step(wait);
      if (n >= 0 || wait == 0) return n;
      if (!WaitUntil(sock_, wait, deadline)) {
        timed_out = true;
        return -1;
      }
    }
  }
  Clock::time_point WriteDeadline() const {
    return writing_ ? write_deadline_ : Clock::now() + write_timeout_;
  }

  const int sock_;
  Transport& transport_;
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

// httplib's Server with its keep-alive loop (process_server_socket)
// replaced by one over a DeadlineStream; TLS (its own, not httplib's
// SSLServer, whose one context is set once) when given `contexts`.
class DeadlineServer final : public httplib::Server {
 public:
  DeadlineServer(SlowClientCounters& slow_clients, SslContexts contexts)
      : slow_clients_(slow_clients), contexts_(std::move(contexts)) {}

 private:
  bool process_and_close_socket(socket_t sock) override {
    bool ret = false;
    if (contexts_) {
      ret = ServeTls(sock);
    } else {
      SocketTransport transport(sock);
      ret = Serve(sock, transport, [](DeadlineStream&) { return true; });
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ret;
  }

  bool ServeTls(int sock) {
    // OpenSSL writes with write(2): a peer gone mid-response would raise
    // SIGPIPE and end the daemon. Blocked on this worker thread instead (a
    // pending blocked SIGPIPE does nothing); the thread only serves HTTP.
    static thread_local const bool sigpipe_blocked = [] {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGPIPE);
      return pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0;
    }();
    (void)sigpipe_blocked;
    const int flags = ::fcntl(sock, F_GETFL);
    if (flags < 0 || ::fcntl(sock, F_SETFL, flags | O_NONBLOCK) < 0) return false;
    const std::shared_ptr<SSL_CTX> ctx = contexts_();
    if (!ctx) return false;
    TlsTransport transport(sock, ctx.get());
    if (!transport.valid()) return false;
    const bool ret = Serve(sock, transport, [&](DeadlineStream& stream) {
      return stream.UntilReadDeadline([&](short& wait) { return transport.Accept(wait); }) == 1;
    });
    transport.set_shutdown(ret);
    return ret;
  }

  // `open` runs once the connection's first byte arrived, under a request's
  // read deadline (the TLS handshake: a client that trickles it is as slow
  // as one trickling headers); false ends the connection.
  template <class Open>
  bool Serve(int sock, Transport& transport, Open open) {
    DeadlineStream stream(sock, transport,
                          Timeout(this->read_timeout_sec_, this->read_timeout_usec_),
                          Timeout(this->write_timeout_sec_, this->write_timeout_usec_));
    bool ret = false;
    bool opened = false;
    if (WaitForRequest(stream, sock)) {
      stream.StartRequest();
      opened = open(stream);
    }
    for (size_t left = this->keep_alive_max_count_;
         opened && left > 0 && WaitForRequest(stream, sock); --left) {
      stream.StartRequest();
      bool connection_closed = false;
      ret = this->process_request(stream, /*close_connection=*/left == 1, connection_closed,
                                  nullptr);
      if (!ret || connection_closed) break;
    }
    if (stream.read_timed_out()) {
      slow_clients_[0].fetch_add(1, std::memory_order_relaxed);
    } else if (stream.write_timed_out()) {
      slow_clients_[1].fetch_add(1, std::memory_order_relaxed);
    }
    return ret;
  }

  // The next request's first byte, for at most keep_alive_timeout; polled in
  // slices so that a stopping server lets go of idle connections at once.
  bool WaitForRequest(const DeadlineStream& stream, int sock) {
    if (stream.Buffered()) return true;  // a pipelined request
    const auto deadline = Clock::now() + std::chrono::seconds(this->keep_alive_timeout_sec_);
    while (this->svr_sock_ != INVALID_SOCKET) {
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      if (WaitUntil(sock, POLLIN, slice)) return true;
      if (Clock::now() >= deadline) return false;
    }
    return false;
  }

  SlowClientCounters& slow_clients_;
  const SslContexts contexts_;  // null: plaintext
};

}  // namespace

std::unique_ptr<httplib::Server> MakeDeadlineServer(SlowClientCounters& slow_clients) {
  return std::make_unique<DeadlineServer>(slow_clients, nullptr);
}

std::unique_ptr<httplib::Server> MakeDeadlineTlsServer(SlowClientCounters& slow_clients,
                                                       SslContexts contexts) {
  return std::make_unique<DeadlineServer>(slow_clients, std::move(contexts));
}

void ConfigureListener(httplib::Server& server, uint32_t threads, uint32_t read_timeout_seconds,
                       uint32_t write_timeout_seconds, uint32_t keep_alive_timeout_seconds) {
  const size_t workers = threads;
  server.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  server.set_read_timeout(read_timeout_seconds, 0);
  server.set_write_timeout(write_timeout_seconds, 0);
  server.set_keep_alive_timeout(keep_alive_timeout_seconds);
  server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
}

}  // namespace straggler::daemon
