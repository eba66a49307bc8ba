#include "console/console.h"

#include <httplib.h>

#include <string>


namespace straggler::daemon {
namespace {

constexpr char kPolicy[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace

const ConsoleAsset* FindConsoleAsset(std::string_view path) {
  for (const ConsoleAsset& a : ConsoleAssets()) {
    if (a.path == path) return &a;
  }
  return nullptr;
}

bool ServeConsole(std::string_view method, std::string_view path, httplib::Response& res) {
  const ConsoleAsset* asset = FindConsoleAsset(path);
  if (asset == nullptr) return false;
  if (method != "GET" && method != "HEAD") {
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_content(
        "{\"code\":\"METHOD_NOT_ALLOWED\",\"message\":\"the console is read with GET or HEAD\"}\n",
        "application/json");
    return true;
  }
  res.status = 200;
  // A daemon upgraded in place serves a new page: always revalidate.
  res.set_header("Cache-Control", "no-cache");
  res.set_content(std::string(asset->body), std::string(asset->content_type));
  return true;
}

void SetSecurityHeaders(httplib::Response& res) {
  res.set_header("Content-Security-Policy", kPolicy);
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("X-Frame-Options", "DENY");
}

std::string_view ContentSecurityPolicy() { return kPolicy; }

}  // namespace straggler::daemon
