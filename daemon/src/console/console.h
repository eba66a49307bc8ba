// The web console (docs/console.md): a single page served at GET / on the
// daemon's HTTP listener, with its script and style sheet under /console/.
// Every asset is compiled into the binary (embed_assets.cmake), so it works
// with no internet access. The page reads only the /v1 REST API, sending the
// token the user types (kept in the page's memory, never stored) on reads
// under auth.protect_reads and on admin calls.
//
//   if (ServeConsole(req.method, req.path, res)) return;  // before REST routing
//   SetSecurityHeaders(res);                               // on every answer
//
// The page and its assets hold no job data, so serving them needs no token:
// what a job looks like comes from /v1, which checks auth.h's rules.
// Pure functions over constant data; thread-safe.
#pragma once

#include <string_view>

#include "console/console_assets.h"

namespace httplib {
struct Response;
}  // namespace httplib

namespace straggler::daemon {

// ConsoleAsset (one built-in file): console_assets.h.

// The asset served at `path` (the request path, no query), or nullptr.
const ConsoleAsset* FindConsoleAsset(std::string_view path);

// Answers GET/HEAD of a console path (200 with the asset, no-cache) and
// returns true; false leaves `res` alone for the REST router. Another
// method on a console path is 405 with an Allow header.
bool ServeConsole(std::string_view method, std::string_view path, httplib::Response& res);

// The Content-Security-Policy every response carries: scripts, styles and
// fetches from the daemon's own origin only, no inline script, no plugins,
// no framing; plus nosniff and no-referrer. Set before the handler's answer.
void SetSecurityHeaders(httplib::Response& res);

// The policy itself, for tests.
std::string_view ContentSecurityPolicy();

}  // namespace straggler::daemon
