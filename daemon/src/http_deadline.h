// An httplib::Server whose connections cannot be held by a slow client.
//
// httplib's own timeouts apply per read and per write, so a client that
// trickles a request one byte at a time (slowloris), or reads a response as
// slowly, keeps one of the http.threads workers for as long as it likes, and
// http.threads such clients stop the HTTP server. Here a request (request
// line, headers and body) must arrive whole within read_timeout of its first
// byte, and its response must be written within write_timeout of the
// first write; a connection that misses either is closed and counted
// (DaemonStats::http_slow_clients). Idle keep-alive connections are closed
// after keep_alive_timeout as before.
//
//   std::unique_ptr<httplib::Server> server = MakeDeadlineServer(stats);
//   server->set_read_timeout(5, 0);   // now: per request, not per read
//
// Thread-safety: as httplib::Server; the counters are atomics.
#pragma once

#include <memory>

namespace httplib {
class Server;
}

namespace straggler::daemon {

struct DaemonStats;

// `stats` must outlive the server.
std::unique_ptr<httplib::Server> MakeDeadlineServer(DaemonStats& stats);

}  // namespace straggler::daemon
