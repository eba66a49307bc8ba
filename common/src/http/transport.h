// How the deadline listener (http_deadline.h) moves one connection's bytes
// without blocking: the socket itself, or TLS over it; and the small socket
// helpers its poller and workers share. Private to common/src/http*.
//
// Thread-safety: a Transport belongs to one connection, used by one thread
// at a time (the poller, or the worker that borrowed the connection).
#pragma once

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <string>

namespace straggler::common::http_detail {

using Clock = std::chrono::steady_clock;

// Waits for `events` on `sock` until `deadline`; false on timeout or error.
bool WaitUntil(int sock, short events, Clock::time_point deadline);
// The address of `sock`'s peer (`remote`) or its own; left as is on error.
void PeerName(int sock, bool remote, std::string& ip, int& port);
// OpenSSL writes with write(2): a peer gone mid-response would raise
// SIGPIPE and end the process. Blocked on the listener's own threads (a
// pending blocked SIGPIPE does nothing); they only serve HTTP.
void BlockSigpipe();

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
    // A response's unsent tail moves from the worker's buffer to the
    // connection's (Connection::out) and is retried from there, a record at
    // a time: a retried SSL_write may then pass another address holding the
    // same bytes (and more), and reports each record written.
    if (ssl_ != nullptr) {
      SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
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

}  // namespace straggler::common::http_detail
