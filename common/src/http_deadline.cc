// The deadline listener: the public entry points and the pieces' map.
//   http/transport.h       sockets and TLS without blocking; socket helpers
//   http/connection.h      one connection's state, the limits, the tail budget
//   http/request_head.*    judging a buffered request: wait, serve, refuse
//   http/request_stream.h  a worker's stream; slow readers' tails to the poller
//   http/listener.*        the poller: the connections' state machine and deadlines
//   DeadlineServer, here   the httplib::Server that ties them together
// How it behaves, and why: straggler/common/http_deadline.h and
// docs/security.md.
#include "straggler/common/http_deadline.h"

#include <unistd.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "http/connection.h"
#include "http/listener.h"
#include "http/request_stream.h"
#include "http/transport.h"

namespace straggler::common {

namespace http_detail {
namespace {

std::chrono::microseconds Timeout(time_t sec, time_t usec) {
  return std::chrono::seconds(sec) + std::chrono::microseconds(usec);
}

// httplib's Server with its per-connection keep-alive loop replaced by a
// Listener and workers that each serve one buffered request; TLS (its own,
// not httplib's SSLServer, whose one context is set once) when given
// `contexts`.
class DeadlineServer final : public httplib::Server, public ListenerOwner {
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
  std::unique_ptr<Connection> Open(int sock) override {
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
  bool Serve(Connection& c, std::chrono::microseconds write_timeout,
             UnsentBudget& budget) override {
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
  void ListenerGone(Listener* listener) override {
    listener_.compare_exchange_strong(listener, nullptr);
  }

  void CountSlow(size_t phase) override {
    slow_clients_[phase].fetch_add(1, std::memory_order_relaxed);
  }
  void CountRefused(int status) override {
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

}  // namespace
}  // namespace http_detail

using http_detail::DeadlineServer;

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
