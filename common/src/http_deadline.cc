#include "straggler/common/http_deadline.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace straggler::common {
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

// What the buffered bytes of a connection's next request allow.
struct Verdict {
  enum Kind { kWait, kServe, kRefuse } kind = kWait;
  int status = 0;  // kRefuse
  std::string message;
};

Verdict Refuse(int status, std::string message) {
  return {Verdict::kRefuse, status, std::move(message)};
}
Verdict ServeOrWait(bool whole) { return {whole ? Verdict::kServe : Verdict::kWait, 0, {}}; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Serve once the head (request line and headers) and a Content-Length body
// are buffered: a worker then reads the request from memory. A chunked body
// (the daemon refuses it with 411) or an unreadable Content-Length is
// served once the head is in: the worker reads the rest itself, under the
// same deadline. Refused at once: a head over httplib's limits (414, 431)
// and a Content-Length above `max_body` (413), before any body arrives.
Verdict Judge(Connection& c, size_t max_body) {
  const std::string& in = c.in;
  if (c.need > 0) return ServeOrWait(in.size() >= c.need);
  const size_t end = in.find("\r\n\r\n", c.scanned >= 3 ? c.scanned - 3 : 0);
  if (end == std::string::npos) {
    c.scanned = in.size();
    const size_t nl = in.rfind('\n');
    if (nl == std::string::npos) {
      if (in.size() > kMaxRequestLine) {
        return Refuse(414, "request line longer than " + std::to_string(kMaxRequestLine) +
                               " bytes");
      }
    } else if (in.size() - nl > kMaxHeaderLine || in.size() > kMaxHeadBytes) {
      return Refuse(431, "request header fields larger than " + std::to_string(kMaxHeaderLine) +
                             " bytes a line or " + std::to_string(kMaxHeadBytes) + " in all");
    }
    return {};
  }
  const size_t head = end + 4;
  if (head > kMaxHeadBytes) {
    return Refuse(431, "request header fields larger than " + std::to_string(kMaxHeadBytes) +
                           " bytes in all");
  }
  std::optional<uint64_t> length;
  bool read_by_worker = false;  // chunked, or a length httplib will judge
  // in[end + 1] is '\n': every header line ends at or before it.
  for (size_t at = in.find('\n'); at < end + 1;) {
    const size_t next = in.find('\n', at + 1);
    const std::string_view line(in.data() + at + 1, next - at - 1);
    at = next;
    if (line.size() + 1 > kMaxHeaderLine) {
      return Refuse(431, "request header line longer than " + std::to_string(kMaxHeaderLine) +
                             " bytes");
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = Trim(line.substr(colon + 1));
    if (EqualsNoCase(name, "Transfer-Encoding")) read_by_worker = true;
    if (EqualsNoCase(name, "Expect") && EqualsNoCase(value, "100-continue")) {
      c.expects_continue = true;
    }
    if (EqualsNoCase(name, "Content-Length") && !length && !read_by_worker) {
      uint64_t n = 0;
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec == std::errc() && ptr == value.data() + value.size() && !value.empty()) {
        length = n;
      } else {
        read_by_worker = true;
      }
    }
  }
  if (read_by_worker) {
    c.need = head;
    return ServeOrWait(true);
  }
  if (length && *length > max_body) {
    return Refuse(413, "request body of Content-Length " + std::to_string(*length) +
                           " bytes is larger than the limit of " + std::to_string(max_body));
  }
  c.need = head + length.value_or(0);
  return ServeOrWait(in.size() >= c.need);
}

// GET /healthz and /readyz get a worker of their own: they cost microseconds,
// while the shared workers may all be rendering large /metrics or REST
// answers (50 clients asking for a 10 000-rank /metrics keep 4 workers busy
// for seconds), and a kubelet probe must not queue behind those.
bool IsProbe(std::string_view in) {
  for (std::string_view path : {"GET /healthz", "GET /readyz"}) {
    if (in.size() > path.size() && in.substr(0, path.size()) == path &&
        (in[path.size()] == ' ' || in[path.size()] == '?')) {
      return true;
    }
  }
  return false;
}

const char* Reason(int status) {
  switch (status) {
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    default: return "Bad Request";
  }
}

const char* ErrorCode(int status) {
  switch (status) {
    case 408: return "REQUEST_TIMEOUT";
    case 413: return "PAYLOAD_TOO_LARGE";
    case 414: return "URI_TOO_LONG";
    case 431: return "HEADERS_TOO_LARGE";
    default: return "INVALID_ARGUMENT";
  }
}

// OpenSSL writes with write(2): a peer gone mid-response would raise
// SIGPIPE and end the process. Blocked on the listener's own threads (a
// pending blocked SIGPIPE does nothing); they only serve HTTP.
void BlockSigpipe() {
  static thread_local const bool blocked = [] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    return pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0;
  }();
  (void)blocked;
}

// A worker's view of a connection for one request: what the poller buffered
// first, then (a chunked body) the socket itself, until the request's read
// deadline. Writes go to the socket without waiting; what the socket does
// not take at once is handed over (Connection::out) for the poller to send
// by the response's write deadline, so a reader slower than the socket
// buffer holds no worker (issue 15: 8 slow readers of a 9 MB /metrics held
// all 4 workers for the 5 s write timeout, and /healthz waited behind them).
// A tail over the UnsentBudget is written by the worker itself, within
// kOverBudgetPatience.
class RequestStream final : public httplib::Stream {
 public:
  RequestStream(Connection& c, std::chrono::microseconds write_timeout, UnsentBudget& budget)
      : c_(c), write_timeout_(write_timeout), budget_(budget) {}

  bool read_timed_out() const { return read_timed_out_; }
  bool write_timed_out() const { return write_timed_out_; }
  // Drops the bytes this request consumed; the rest (a pipelined request)
  // stays for the next. Notes the write deadline for the poller.
  void Consume() {
    c_.in.erase(0, pos_);
    pos_ = 0;
    c_.write_deadline = WriteDeadline();
  }

  bool is_readable() const override {
    return pos_ < c_.in.size() || c_.transport->Pending() ||
           WaitUntil(c_.sock, POLLIN, c_.deadline);
  }
  // Writes never wait (see write): writable unless the connection failed.
  bool is_writable() const override {
    pollfd p{c_.sock, POLLOUT, 0};
    return ::poll(&p, 1, 0) >= 0 && (p.revents & (POLLERR | POLLNVAL)) == 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == c_.in.size()) {
      c_.in.resize(kReadChunk);
      pos_ = 0;
      const ssize_t n = Retry(
          [&](short& wait) { return c_.transport->Read(c_.in.data(), c_.in.size(), wait); },
          c_.deadline, read_timed_out_);
      c_.in.resize(static_cast<size_t>(std::max<ssize_t>(n, 0)));
      if (n <= 0) return n;
    }
    const size_t n = std::min(size, c_.in.size() - pos_);
    std::memcpy(ptr, c_.in.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  // All of `size` is written or handed over (httplib does not retry a short
  // write), or -1.
  ssize_t write(const char* ptr, size_t size) override {
    if (!writing_) {  // the response's first write starts its deadline
      writing_ = true;
      write_deadline_ = Clock::now() + write_timeout_;
    }
    if (size == 0) return 0;
    if (c_.unsent() > 0) {  // a tail is already handed over: the rest follows it
      if (Hold(ptr, size)) return static_cast<ssize_t>(size);
      if (!FlushHeld()) return -1;
    }
    size_t done = 0;
    while (done < size) {
      short wait = 0;
      const ssize_t n = c_.transport->Write(ptr + done, size - done, wait);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n == 0 || wait == 0) return -1;  // the connection failed
      // Over TLS the retry must pass these same bytes: Hold keeps them
      // first in Connection::out (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER).
      c_.out_wait = wait;
      if (Hold(ptr + done, size - done)) return static_cast<ssize_t>(size);
      if (!WaitUntil(c_.sock, wait, OverBudgetDeadline())) {
        write_timed_out_ = true;
        return -1;
      }
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    PeerName(c_.sock, /*remote=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    PeerName(c_.sock, /*remote=*/false, ip, port);
  }
  socket_t socket() const override { return c_.sock; }

 private:
  template <class Step>
  ssize_t Retry(Step step, Clock::time_point deadline, bool& timed_out) {
    for (;;) {
      short wait = 0;
      const ssize_t n = step(wait);
      if (n >= 0 || wait == 0) return n;
      if (!WaitUntil(c_.sock, wait, deadline)) {
        timed_out = true;
        return -1;
      }
    }
  }
  Clock::time_point WriteDeadline() const {
    return writing_ ? write_deadline_ : Clock::now() + write_timeout_;
  }
  // The worker's own wait for a reader, once the rest did not fit the budget.
  Clock::time_point OverBudgetDeadline() {
    if (!over_budget_) {
      over_budget_ = true;
      over_budget_deadline_ = std::min(write_deadline_, Clock::now() + kOverBudgetPatience);
    }
    return over_budget_deadline_;
  }

  // Appends to the handed-over tail if the budget allows.
  bool Hold(const char* ptr, size_t size) {
    if (!budget_.Take(c_.unsent(), size)) return false;
    c_.out.append(ptr, size);
    return true;
  }

  // Sends the handed-over tail itself (more would not fit the budget),
  // within the write deadline.
  bool FlushHeld() {
    while (c_.unsent() > 0) {
      const ssize_t n = Retry(
          [&](short& wait) {
            return c_.transport->Write(c_.out.data() + c_.out_pos, c_.unsent(), wait);
          },
          OverBudgetDeadline(), write_timed_out_);
      if (n <= 0) return false;
      c_.out_pos += static_cast<size_t>(n);
      budget_.Give(static_cast<size_t>(n));
    }
    std::string().swap(c_.out);
    c_.out_pos = 0;
    return true;
  }

  Connection& c_;
  const std::chrono::microseconds write_timeout_;
  UnsentBudget& budget_;
  Clock::time_point write_deadline_{};
  bool writing_ = false;
  bool read_timed_out_ = false;
  bool write_timed_out_ = false;
  bool over_budget_ = false;
  Clock::time_point over_budget_deadline_{};
  size_t pos_ = 0;
};

class DeadlineServer;

// The listener's task queue: httplib's accept loop hands it each accepted
// socket (enqueue runs process_and_close_socket at once, which calls Add).
// One poller thread waits for every connection's bytes (epoll) and holds
// each request's deadline; only a request that has arrived whole (or a
// chunked one's head) goes to one of the `workers`, so slow or idle
// connections never hold a worker or delay one another.
class Listener final : public httplib::TaskQueue {
 public:
  struct Settings {
    std::chrono::microseconds read_timeout;
    std::chrono::microseconds write_timeout;
    std::chrono::seconds keep_alive_timeout;
    size_t keep_alive_max_count;
    size_t max_body;
  };

  Listener(DeadlineServer& server, size_t workers, Settings settings);
  ~Listener() override;
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  void enqueue(std::function<void()> fn) override { fn(); }
  // Stops the poller (closing every connection not at a worker), then lets
  // the workers finish the requests they have.
  void shutdown() override;

  // From the accept thread: a new connection.
  void Add(int sock);

 private:
  void Run();
  void Wake();
  void TakeQueued(Clock::time_point now);
  void Open(int sock, Clock::time_point now);
  void Resume(Connection* c, bool keep, Clock::time_point now);
  void Progress(Connection* c);
  void Flush(Connection* c);
  void Drain(Connection* c);
  void Dispatch(Connection* c);
  void Answer(Connection* c, int status, const std::string& message);
  void Sweep(Clock::time_point now);
  void SetDeadline(Connection* c, Connection::State state, Clock::time_point deadline);
  void Watch(Connection* c, uint32_t events);
  void Unwatch(Connection* c);
  void Close(Connection* c);

  DeadlineServer& server_;
  const Settings settings_;
  const int epoll_;
  const int wake_;  // eventfd
  UnsentBudget budget_{kMaxUnsentPerConnection, kMaxUnsentTotal};
  httplib::ThreadPool pool_;
  httplib::ThreadPool probes_{1};  // IsProbe requests: never queued behind others
  std::thread poller_;
  std::atomic<bool> stopping_{false};

  std::mutex mu_;
  std::vector<int> added_;                                // guarded by mu_
  std::vector<std::pair<Connection*, bool>> returned_;  // guarded by mu_: (connection, keep)

  // Poller thread only (and the destructor, after it).
  std::unordered_map<Connection*, std::unique_ptr<Connection>> connections_;
  Clock::time_point next_deadline_ = Clock::time_point::max();
  Clock::time_point last_sweep_{};
  std::array<char, kReadChunk> chunk_{};
};

// httplib's Server with its per-connection keep-alive loop replaced by a
// Listener and workers that each serve one buffered request; TLS (its own,
// not httplib's SSLServer, whose one context is set once) when given
// `contexts`.
class DeadlineServer final : public httplib::Server {
 public:
  DeadlineServer(SlowClientCounters& slow_clients, SslContexts contexts, RefusalCounter refused)
      : slow_clients_(slow_clients),
        contexts_(std::move(contexts)),
        refused_(std::move(refused)) {}

  httplib::TaskQueue* NewListener(size_t workers) {
    auto* listener = new Listener(
        *this, workers,
        {Timeout(this->read_timeout_sec_, this->read_timeout_usec_),
         Timeout(this->write_timeout_sec_, this->write_timeout_usec_),
         std::chrono::seconds(this->keep_alive_timeout_sec_), this->keep_alive_max_count_,
         this->payload_max_length_});
    listener_.store(listener);
    return listener;
  }

  // The Listener's connection setup: its transport, or null to refuse it.
  std::unique_ptr<Connection> Open(int sock) {
    if (!contexts_) {
      return std::make_unique<Connection>(sock, std::make_unique<SocketTransport>(sock), nullptr);
    }
    const std::shared_ptr<SSL_CTX> ctx = contexts_();
    if (!ctx) return nullptr;
    auto tls = std::make_unique<TlsTransport>(sock, ctx.get());
    if (!tls->valid()) return nullptr;
    TlsTransport* raw = tls.get();
    return std::make_unique<Connection>(sock, std::move(tls), raw);
  }

  // On a worker: serves the request buffered in `c`; true to keep the
  // connection for another.
  bool Serve(Connection& c, std::chrono::microseconds write_timeout, UnsentBudget& budget) {
    BlockSigpipe();
    RequestStream stream(c, write_timeout, budget);
    bool connection_closed = false;
    const bool ret = this->process_request(stream, /*close_connection=*/c.requests_left <= 1,
                                           connection_closed, nullptr);
    stream.Consume();
    if (c.in.empty()) std::string().swap(c.in);  // an idle connection keeps no buffer
    c.scanned = 0;
    c.need = 0;
    c.expects_continue = false;
    if (c.requests_left > 0) --c.requests_left;
    if (stream.read_timed_out()) {
      CountSlow(0);
    } else if (stream.write_timed_out()) {
      CountSlow(1);
      c.abort = true;
    }
    c.clean = ret;
    return ret && !connection_closed && c.requests_left > 0;
  }

  // From ~Listener: the accept loop that used it has ended.
  void ListenerGone(Listener* listener) { listener_.compare_exchange_strong(listener, nullptr); }

  void CountSlow(size_t phase) { slow_clients_[phase].fetch_add(1, std::memory_order_relaxed); }
  void CountRefused(int status) {
    if (refused_) refused_(status);
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    Listener* listener = listener_.load();
    if (listener == nullptr) {  // not started through ConfigureListener's queue
      ::close(sock);
      return false;
    }
    listener->Add(sock);
    return true;
  }

  SlowClientCounters& slow_clients_;
  const SslContexts contexts_;  // null: plaintext
  const RefusalCounter refused_;
  std::atomic<Listener*> listener_{nullptr};
};

Listener::Listener(DeadlineServer& server, size_t workers, Settings settings)
    : server_(server),
      settings_(settings),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      pool_(std::max<size_t>(workers, 1)) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  ::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev);
  poller_ = std::thread([this] { Run(); });
}

Listener::~Listener() {
  shutdown();
  server_.ListenerGone(this);
  connections_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (int sock : added_) ::close(sock);
  ::close(wake_);
  ::close(epoll_);
}

void Listener::shutdown() {
  if (stopping_.exchange(true)) return;
  Wake();
  if (poller_.joinable()) poller_.join();
  pool_.shutdown();  // requests at a worker finish; their connections close in ~Listener
  probes_.shutdown();
}

void Listener::Add(int sock) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    added_.push_back(sock);
  }
  Wake();
}

void Listener::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_, &one, sizeof one);
}

void Listener::Run() {
  BlockSigpipe();
  std::array<epoll_event, 128> events{};
  while (!stopping_.load()) {
    int timeout_ms = 1000;
    if (next_deadline_ != Clock::time_point::max()) {
      // A sweep visits every connection: at most one per kSweepEvery, however
      // many deadlines fall between.
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          std::max(next_deadline_, last_sweep_ + kSweepEvery) - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
    }
    const int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), timeout_ms);
    const Clock::time_point now = Clock::now();
    for (int i = 0; i < n; ++i) {
      auto* c = static_cast<Connection*>(events[i].data.ptr);
      if (c == nullptr) {
        uint64_t count;
        (void)!::read(wake_, &count, sizeof count);
        TakeQueued(now);
        continue;
      }
      if (c->state == Connection::State::kClosing) {
        Drain(c);
        continue;
      }
      if (c->state == Connection::State::kWriting) {
        Flush(c);
        continue;
      }
      if (c->state == Connection::State::kIdle) {
        SetDeadline(c, Connection::State::kReading, now + settings_.read_timeout);
      }
      Progress(c);
    }
    if (now >= next_deadline_ && now >= last_sweep_ + kSweepEvery) Sweep(now);
  }
}

void Listener::TakeQueued(Clock::time_point now) {
  std::vector<int> added;
  std::vector<std::pair<Connection*, bool>> returned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    added.swap(added_);
    returned.swap(returned_);
  }
  for (int sock : added) Open(sock, now);
  for (const auto& [c, keep] : returned) Resume(c, keep, now);
}

void Listener::Open(int sock, Clock::time_point now) {
  const int flags = ::fcntl(sock, F_GETFL);
  if (flags < 0 || ::fcntl(sock, F_SETFL, flags | O_NONBLOCK) < 0) {
    ::close(sock);
    return;
  }
  // A response goes out in a few writes (headers, body; TLS records). With
  // Nagle's algorithm a write waits while an earlier one is unacknowledged
  // (over TLS 1.3 the session tickets sent after the handshake), and the
  // client delays its ACK: every HTTPS request took 46 ms on loopback.
  const int one = 1;
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::unique_ptr<Connection> owned = server_.Open(sock);
  if (!owned) {
    ::close(sock);
    return;
  }
  Connection* c = owned.get();
  connections_.emplace(c, std::move(owned));
  c->requests_left = settings_.keep_alive_max_count;
  SetDeadline(c, Connection::State::kIdle, now + settings_.keep_alive_timeout);
  Watch(c, EPOLLIN);
}

// A connection back from a worker (or done sending a response's tail):
// sending the tail its worker handed over, closed, or waiting for its next
// request (already buffered or pending in TLS: read on now).
void Listener::Resume(Connection* c, bool keep, Clock::time_point now) {
  if (stopping_.load()) return Close(c);
  if (c->unsent() > 0) {
    c->keep_after = keep;
    SetDeadline(c, Connection::State::kWriting, c->write_deadline);
    return Flush(c);
  }
  if (!keep) return Close(c);
  if (!c->in.empty() || c->transport->Pending()) {
    SetDeadline(c, Connection::State::kReading, now + settings_.read_timeout);
    Progress(c);
    return;
  }
  SetDeadline(c, Connection::State::kIdle, now + settings_.keep_alive_timeout);
  Watch(c, EPOLLIN);
}

// Reads what the connection has (after the TLS handshake) and serves,
// refuses, or goes on waiting.
void Listener::Progress(Connection* c) {
  short wait = 0;
  if (c->tls != nullptr && !c->handshaken) {
    if (c->tls->Accept(wait) == 1) {
      c->handshaken = true;
    } else if (wait != 0) {
      Watch(c, wait == POLLOUT ? EPOLLOUT : EPOLLIN);
      return;
    } else {
      Close(c);
      return;
    }
  }
  for (;;) {
    const Verdict v = Judge(*c, settings_.max_body);
    if (v.kind == Verdict::kServe) return Dispatch(c);
    if (v.kind == Verdict::kRefuse) return Answer(c, v.status, v.message);
    if (c->expects_continue) {  // its client waits for this before it sends the body
      c->expects_continue = false;
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      (void)c->transport->Write(kContinue, sizeof kContinue - 1, wait);
    }
    // Through chunk_, so a connection's buffer holds what it sent, not a
    // chunk's worth for every trickled byte.
    const ssize_t n = c->transport->Read(chunk_.data(), chunk_.size(), wait);
    if (n > 0) {
      c->in.append(chunk_.data(), static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && wait != 0) {
      Watch(c, wait == POLLOUT ? EPOLLOUT : EPOLLIN);
      return;
    }
    // The peer closed, or the connection failed, mid-request or between
    // requests: nothing to answer.
    return Close(c);
  }
}

// Sends what it can of a handed-over response tail; when all is sent, the
// connection goes on as its worker decided (Resume).
void Listener::Flush(Connection* c) {
  while (c->unsent() > 0) {
    short wait = 0;
    const ssize_t n = c->transport->Write(c->out.data() + c->out_pos, c->unsent(), wait);
    if (n > 0) {
      c->out_pos += static_cast<size_t>(n);
      budget_.Give(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && wait != 0) {
      c->out_wait = wait;
      return Watch(c, wait == POLLOUT ? EPOLLOUT : EPOLLIN);
    }
    return Close(c);  // the reader went away
  }
  std::string().swap(c->out);
  c->out_pos = 0;
  Resume(c, c->keep_after, Clock::now());
}

void Listener::Dispatch(Connection* c) {
  Unwatch(c);
  c->state = Connection::State::kWorking;
  const auto write_timeout = settings_.write_timeout;
  (IsProbe(c->in) ? probes_ : pool_).enqueue([this, c, write_timeout] {
    const bool keep = server_.Serve(*c, write_timeout, budget_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      returned_.emplace_back(c, keep);
    }
    Wake();
  });
}

// Refuses the request without a worker: a short JSON error written once
// (it fits any socket buffer), then the connection is drained and closed.
void Listener::Answer(Connection* c, int status, const std::string& message) {
  const std::string body = std::string("{\"code\":\"") + ErrorCode(status) +
                           "\",\"message\":\"" + message + "\"}\n";
  const std::string response = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) +
                               "\r\nContent-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) +
                               "\r\nConnection: close\r\n\r\n" + body;
  short wait = 0;
  (void)c->transport->Write(response.data(), response.size(), wait);
  server_.CountRefused(status);
  ::shutdown(c->sock, SHUT_WR);
  std::string().swap(c->in);
  SetDeadline(c, Connection::State::kClosing, Clock::now() + kLinger);
  Watch(c, EPOLLIN);
}

void Listener::Drain(Connection* c) {
  char buf[kReadChunk];
  for (;;) {
    const ssize_t n = ::recv(c->sock, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    return Close(c);
  }
}

// Deadlines: an idle connection is closed; a request not whole in time is
// answered 408 and counted (a TLS handshake not done in time: closed and
// counted); a response tail not taken in time is dropped (reset, counted);
// a refused connection's drain ends.
void Listener::Sweep(Clock::time_point now) {
  last_sweep_ = now;
  std::vector<Connection*> expired;
  next_deadline_ = Clock::time_point::max();
  for (const auto& [c, owned] : connections_) {
    if (c->state == Connection::State::kWorking) continue;
    if (c->deadline <= now) {
      expired.push_back(c);
    } else {
      next_deadline_ = std::min(next_deadline_, c->deadline);
    }
  }
  for (Connection* c : expired) {
    switch (c->state) {
      case Connection::State::kReading:
        server_.CountSlow(0);
        if (c->tls == nullptr || c->handshaken) {
          Answer(c, 408,
                 "request not received whole within the read timeout of " +
                     std::to_string(settings_.read_timeout.count() / 1000) + " ms");
        } else {
          Close(c);
        }
        break;
      case Connection::State::kWriting:  // a response not taken in time
        server_.CountSlow(1);
        c->abort = true;
        Close(c);
        break;
      case Connection::State::kIdle:
      case Connection::State::kClosing:
        Close(c);
        break;
      case Connection::State::kWorking:
        break;
    }
  }
}

void Listener::SetDeadline(Connection* c, Connection::State state, Clock::time_point deadline) {
  c->state = state;
  c->deadline = deadline;
  next_deadline_ = std::min(next_deadline_, deadline);
}

void Listener::Watch(Connection* c, uint32_t events) {
  if (c->events == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = c;
  if (::epoll_ctl(epoll_, c->events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->sock, &ev) != 0) {
    return Close(c);
  }
  c->events = events;
}

void Listener::Unwatch(Connection* c) {
  if (c->events == 0) return;
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, c->sock, nullptr);
  c->events = 0;
}

void Listener::Close(Connection* c) {
  Unwatch(c);
  budget_.Give(c->unsent());
  connections_.erase(c);
}

}  // namespace

std::unique_ptr<httplib::Server> MakeDeadlineServer(SlowClientCounters& slow_clients,
                                                    RefusalCounter refused) {
  return std::make_unique<DeadlineServer>(slow_clients, nullptr, std::move(refused));
}

std::unique_ptr<httplib::Server> MakeDeadlineTlsServer(SlowClientCounters& slow_clients,
                                                       SslContexts contexts,
                                                       RefusalCounter refused) {
  return std::make_unique<DeadlineServer>(slow_clients, std::move(contexts), std::move(refused));
}

void ConfigureListener(httplib::Server& server, uint32_t threads, uint32_t read_timeout_seconds,
                       uint32_t write_timeout_seconds, uint32_t keep_alive_timeout_seconds) {
  const size_t workers = threads;
  if (auto* deadline = dynamic_cast<DeadlineServer*>(&server)) {
    server.new_task_queue = [deadline, workers] { return deadline->NewListener(workers); };
  } else {
    server.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  }
  server.set_read_timeout(read_timeout_seconds, 0);
  server.set_write_timeout(write_timeout_seconds, 0);
  server.set_keep_alive_timeout(keep_alive_timeout_seconds);
  server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
}

}  // namespace straggler::common
