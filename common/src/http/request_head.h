// What the deadline listener's poller decides from the bytes of a request
// buffered so far (http_deadline.h): wait for more, serve it (it is whole),
// or refuse it at once (413, 414, 431) without a worker; which requests are
// probes; the status texts of its own answers. Private to common/src/http*.
//
// Pure functions over one Connection's buffer; no shared state.
#pragma once

#include <string>
#include <string_view>

#include "connection.h"

namespace straggler::common::http_detail {

// What the buffered bytes of a connection's next request allow.
struct Verdict {
  enum Kind { kWait, kServe, kRefuse } kind = kWait;
  int status = 0;  // kRefuse
  std::string message;
};

// Serve once the head (request line and headers) and a Content-Length body
// are buffered: a worker then reads the request from memory. A chunked body
// (the daemon refuses it with 411) or an unreadable Content-Length is
// served once the head is in: the worker reads the rest itself, under the
// same deadline. Refused at once: a head over httplib's limits (414, 431)
// and a Content-Length above `max_body` (413), before any body arrives.
Verdict Judge(Connection& c, size_t max_body);

// GET /healthz and /readyz get a worker of their own: they cost microseconds,
// while the shared workers may all be rendering large /metrics or REST
// answers (50 clients asking for a 10 000-rank /metrics keep 4 workers busy
// for seconds), and a kubelet probe must not queue behind those.
bool IsProbe(std::string_view in);

// The reason phrase and the JSON error code of a status the poller answers
// itself (408, 413, 414, 431).
const char* Reason(int status);
const char* ErrorCode(int status);

}  // namespace straggler::common::http_detail
