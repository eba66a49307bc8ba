// An httplib::Server (or SSLServer) whose connections cannot be held by a
// slow client.
//
// httplib's own timeouts apply per read and per write, so a client that
// trickles a request one byte at a time (slowloris), or reads a response as
// slowly, keeps one of the http.threads workers for as long as it likes, and
// http.threads such clients stop the HTTP server. Here a request (request
// line, headers and body) must arrive whole within read_timeout of its first
// byte, and its response must be written within write_timeout of the
// first write; a connection that misses either is closed and counted
// (SlowClientCounters). Idle keep-alive connections are closed
// after keep_alive_timeout as before. Over TLS the same deadlines hold (the
// handshake counts as part of the first request), on the same code: only
// how bytes move differs. Each TLS connection asks `contexts` for its
// OpenSSL context, so a renewed certificate serves new connections
// (tls.h, SslContextSource).
//
//   std::unique_ptr<httplib::Server> server = MakeDeadlineServer(stats.http_slow_clients);
//   server->set_read_timeout(5, 0);   // now: per request, not per read
//   auto https = MakeDeadlineTlsServer(counters, [source] { return source->Current(); });
//
// Used by stragglerd's HTTP(S) listener and straggler-agent's HTTP listener.
// Thread-safety: as httplib::Server; the counters are atomics.
#pragma once

#include <openssl/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

namespace httplib {
class Server;
}

namespace straggler::daemon {

// Connections closed for a request that did not arrive whole within the read
// timeout ([0]) or a response not taken within the write timeout ([1]).
using SlowClientCounters = std::array<std::atomic<uint64_t>, 2>;

// `slow_clients` must outlive the server.
std::unique_ptr<httplib::Server> MakeDeadlineServer(SlowClientCounters& slow_clients);
// HTTPS with the deadlines above: each connection is served with the
// context `contexts` returns when it is accepted (called on the worker
// thread; null refuses the connection).
using SslContexts = std::function<std::shared_ptr<SSL_CTX>()>;
std::unique_ptr<httplib::Server> MakeDeadlineTlsServer(SlowClientCounters& slow_clients,
                                                       SslContexts contexts);

// The listener settings stragglerd and straggler-agent share: `threads`
// workers, the request/response deadlines above, the idle keep-alive
// timeout, and SO_REUSEADDR without httplib's default SO_REUSEPORT (which
// would let a second process share the port instead of failing to start).
void ConfigureListener(httplib::Server& server, uint32_t threads, uint32_t read_timeout_seconds,
                       uint32_t write_timeout_seconds, uint32_t keep_alive_timeout_seconds);

}  // namespace straggler::daemon
