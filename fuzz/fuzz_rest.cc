// libFuzzer target: REST routing and parameter parsing (rest_route.h), as
// HttpServer runs them on every request. The input is
//   METHOD SP TARGET LF BODY
// (a missing LF: no body). Every request ends in a route, an api request or
// an error with an HTTP status and a message, never a crash.
#include <cstddef>
#include <cstdint>
#include <variant>

#include "absl/strings/string_view.h"
#include "require.h"
#include "api/rest_route.h"

namespace sd = straggler::daemon;

namespace {

void Require(bool ok, const char* what) { straggler::fuzz::Require(ok, "fuzz_rest", what); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t eol = in.find('\n');
  const absl::string_view line = in.substr(0, eol);
  const absl::string_view body = eol == absl::string_view::npos ? "" : in.substr(eol + 1);
  const size_t sp = line.find(' ');
  const absl::string_view method = line.substr(0, sp);
  const absl::string_view target = sp == absl::string_view::npos ? "" : line.substr(sp + 1);

  auto matched = sd::MatchRoute(method, target);
  if (const auto* e = std::get_if<sd::RestError>(&matched)) {
    Require(e->http_status >= 400 && e->http_status < 500, "a routing error that is not 4xx");
    Require(!e->message.empty() && !e->code.empty(), "a routing error without code or message");
    Require((e->http_status == 405) == !e->allow.empty(), "Allow without 405 or 405 without it");
    return 0;
  }
  const sd::RouteMatch& route = std::get<sd::RouteMatch>(matched);
  if (route.id == sd::RouteId::kMetrics || route.id == sd::RouteId::kHealthz ||
      route.id == sd::RouteId::kReadyz) {
    return 0;
  }
  absl::StatusOr<sd::RestCall> call = sd::ParseRestCall(route, target, body);
  if (!call.ok()) {
    Require(call.status().code() == absl::StatusCode::kInvalidArgument,
            "a REST request refused with another code");
    Require(!call.status().message().empty(), "a REST refusal without a message");
    Require(sd::HttpStatusFor(call.status().code()) == 400, "INVALID_ARGUMENT is not a 400");
  }
  return 0;
}
