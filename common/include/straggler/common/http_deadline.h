// An httplib::Server (or SSLServer) whose connections cannot be held by a
// slow client, and whose probes never wait behind one.
//
// httplib itself gives each connection a worker from the moment it is
// accepted until it closes, with timeouts per read and per write: a client
// that trickles a request one byte at a time (slowloris), or an idle
// keep-alive connection, holds one of the http.threads workers, and the
// connections accepted after it wait in the queue (issue 15: 8 such clients
// made /healthz take 12 s). Here one poller thread (epoll) receives every
// connection's bytes and holds its deadlines; a worker gets a connection
// only once its next request has arrived whole (request line, headers and
// a Content-Length body, buffered), so workers only ever run handlers. A
// worker writes the response without waiting: what the socket does not take
// at once goes back to the poller, which sends it as the reader takes it, so
// a slow reader of a large response (/metrics of 10 000 ranks) holds no
// worker either. The poller holds at most 32 MiB of one response and
// 128 MiB of all; a tail beyond that is written by its worker, which gives
// the reader 250 ms to take it and then drops it (reset, counted [1]).
// GET /healthz and /readyz are served by one worker of their own, so that a
// probe never waits behind the workers' queue (renders of a large /metrics).
// A request must arrive whole within read_timeout of its first byte, else
// it is answered 408 and the connection closed and counted
// (SlowClientCounters[0]); a response must be taken within write_timeout of
// its first write, else the connection is reset and counted ([1]).
// Refused at once, without a worker and without reading a body: a
// Content-Length above set_payload_max_length (413), a request line over
// 8 KiB (414), a header line over 8 KiB or a head over 64 KiB (431). Idle
// keep-alive connections are closed after keep_alive_timeout, and cost
// no worker meanwhile. Over TLS the same deadlines hold (the handshake, done
// by the poller, counts as part of the first request), on the same code:
// only how bytes move differs. Each TLS connection asks `contexts` for its
// OpenSSL context, so a renewed certificate serves new connections
// (tls.h, SslContextSource).
//
//   std::unique_ptr<httplib::Server> server = MakeDeadlineServer(stats.http_slow_clients);
//   ConfigureListener(*server, threads, 5, 5, 2);   // needed: installs the poller
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

namespace straggler::common {

// Connections closed for a request that did not arrive whole within the read
// timeout ([0]) or a response not taken within the write timeout ([1]).
using SlowClientCounters = std::array<std::atomic<uint64_t>, 2>;

// Called (on the poller thread) with the status of each answer the poller
// gives itself (408, 413, 414, 431), which httplib's logger never sees.
using RefusalCounter = std::function<void(int status)>;

// `slow_clients` must outlive the server.
std::unique_ptr<httplib::Server> MakeDeadlineServer(SlowClientCounters& slow_clients,
                                                    RefusalCounter refused = nullptr);
// HTTPS with the deadlines above: each connection is served with the
// context `contexts` returns when it is accepted (called on the poller
// thread; null refuses the connection).
using SslContexts = std::function<std::shared_ptr<SSL_CTX>()>;
std::unique_ptr<httplib::Server> MakeDeadlineTlsServer(SlowClientCounters& slow_clients,
                                                       SslContexts contexts,
                                                       RefusalCounter refused = nullptr);

// The listener settings stragglerd and straggler-agent share: `threads`
// workers (for a Make*Server server: behind the poller that receives every
// request first), the request/response deadlines above, the idle keep-alive
// timeout, and SO_REUSEADDR without httplib's default SO_REUSEPORT (which
// would let a second process share the port instead of failing to start).
void ConfigureListener(httplib::Server& server, uint32_t threads, uint32_t read_timeout_seconds,
                       uint32_t write_timeout_seconds, uint32_t keep_alive_timeout_seconds);

}  // namespace straggler::common
