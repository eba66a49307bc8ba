// One accepted connection of the deadline listener (http_deadline.h), the
// limits its poller enforces, and the budget of unsent response tails the
// poller holds. Private to common/src/http*.
//
// Thread-safety: the listener's poller thread owns a Connection; a worker
// borrows it for one request (state kWorking) and hands it back, so one
// thread at a time touches it. UnsentBudget is shared: atomic.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "transport.h"

namespace straggler::common::http_detail {

constexpr size_t kReadChunk = 16 * 1024;
// httplib's own limits on one header line and on the request line, checked
// here as the bytes arrive; the whole head is capped too.
constexpr size_t kMaxHeaderLine = CPPHTTPLIB_HEADER_MAX_LENGTH;
constexpr size_t kMaxRequestLine = CPPHTTPLIB_REQUEST_URI_MAX_LENGTH;
constexpr size_t kMaxHeadBytes = 64 * 1024;
// How long a refused connection is drained (its unread bytes discarded)
// before it is closed: closing with unread bytes would reset it, and the
// client could lose the refusal.
constexpr auto kLinger = std::chrono::seconds(1);
// The unsent tails of responses the poller holds for readers slower than
// the socket (see RequestStream::write): at most this much per connection
// and in all. Beyond either, the worker writes the rest itself and gives the
// reader kOverBudgetPatience to take it: a reader at network speed takes a
// 9 MB /metrics well within it, while a slow one is dropped (reset, counted
// as a late response) instead of holding the worker for the write timeout:
// 50 slow readers of a 10 000-rank /metrics, 14 of them within the budget,
// kept the 4 workers waiting and a /metrics probe queued for tens of s.
constexpr size_t kMaxUnsentPerConnection = 32u << 20;
constexpr size_t kMaxUnsentTotal = 128u << 20;
constexpr auto kOverBudgetPatience = std::chrono::milliseconds(250);
// Deadlines are enforced this late at most (one pass over the connections
// serves every deadline that fell within it).
constexpr auto kSweepEvery = std::chrono::milliseconds(20);

// One accepted connection. The listener's poller thread owns it; a worker
// borrows it to serve one request (state kWorking) and hands it back.
struct Connection {
  enum class State {
    kIdle,     // waiting for a request's first byte, until keep_alive_timeout
    kReading,  // a request (or the TLS handshake) arriving, until read_timeout
    kWorking,  // at a worker
    kWriting,  // the poller sends a response's unsent tail, until its write deadline
    kClosing,  // refused: draining until kLinger
  };

  Connection(int s, std::unique_ptr<Transport> t, TlsTransport* tls_transport)
      : sock(s), transport(std::move(t)), tls(tls_transport) {}
  ~Connection() {
    if (tls != nullptr) tls->set_shutdown(clean && !abort);
    transport.reset();
    if (abort) {
      // A reset: the kernel drops the unsent bytes at once (after a FIN they
      // would wait, megabytes a connection, for a reader that takes none),
      // and the client learns the response is not whole.
      const linger reset{1, 0};
      ::setsockopt(sock, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    } else {
      ::shutdown(sock, SHUT_RDWR);
    }
    ::close(sock);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const int sock;
  std::unique_ptr<Transport> transport;
  TlsTransport* const tls;  // `transport`, over TLS; null: plaintext
  bool handshaken = false;
  bool clean = false;  // TLS: send close_notify when closed
  bool abort = false;  // a response dropped: reset the connection when closed
  State state = State::kIdle;
  Clock::time_point deadline{};
  uint32_t events = 0;  // epoll interest; 0: not registered
  std::string in;       // received bytes no request has consumed yet
  size_t scanned = 0;   // in[0, scanned) holds no end of the head
  size_t need = 0;      // the next request's head + body length, once known
  bool expects_continue = false;  // the head asked for "100 Continue" before its body
  size_t requests_left = 0;
  // A response's tail its worker handed over (kWriting): out[out_pos, end)
  // is unsent; sent once the socket is ready for `out_wait`, before
  // `write_deadline`; then the connection is kept if `keep_after`.
  std::string out;
  size_t out_pos = 0;
  short out_wait = 0;
  Clock::time_point write_deadline{};
  bool keep_after = false;

  size_t unsent() const { return out.size() - out_pos; }
};

// What the poller holds of all connections' unsent tails (kMaxUnsentTotal).
struct UnsentBudget {
  const size_t per_connection;
  const size_t total;
  std::atomic<size_t> held{0};

  // Takes `n` more bytes for a connection holding `has`; false if over a cap.
  bool Take(size_t has, size_t n) {
    if (has + n > per_connection) return false;
    if (held.fetch_add(n, std::memory_order_relaxed) + n > total) {
      held.fetch_sub(n, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  void Give(size_t n) { held.fetch_sub(n, std::memory_order_relaxed); }
};

}  // namespace straggler::common::http_detail
