#include "http_server.h"

#include <sys/socket.h>

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include <google/protobuf/empty.pb.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "api.h"
#include "auth.h"
#include "job_registry.h"
#include "metrics.h"
#include "spdlog/spdlog.h"
#include "stats.h"
#include "tls.h"

#ifndef STRAGGLERD_VERSION
#define STRAGGLERD_VERSION "unknown"
#endif

namespace straggler::daemon {

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kCancelled: return 499;  // client closed request
    case absl::StatusCode::kUnknown: return 500;
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists: return 409;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kFailedPrecondition: return 400;
    case absl::StatusCode::kAborted: return 409;
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kInternal: return 500;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDataLoss: return 500;
    case absl::StatusCode::kUnauthenticated: return 401;
    default: return 500;
  }
}

std::optional<std::string> DecodePathSegment(absl::string_view segment) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(segment.size());
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] != '%') {
      out += segment[i];
      continue;
    }
    if (i + 2 >= segment.size()) return std::nullopt;
    const int hi = hex(segment[i + 1]), lo = hex(segment[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

namespace {

namespace v1 = ::straggler::v1;
namespace pbu = ::google::protobuf::util;

constexpr char kJsonType[] = "application/json";
constexpr char kMetricsType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kTextType[] = "text/plain; charset=utf-8";

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          static const char* kHex = "0123456789abcdef";
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

void SendError(httplib::Response& res, int http_status, absl::string_view code,
               absl::string_view message) {
  res.status = http_status;
  res.set_content(
      absl::StrCat("{\"code\":", JsonQuote(code), ",\"message\":", JsonQuote(message), "}\n"),
      kJsonType);
}

void SendStatus(httplib::Response& res, const absl::Status& s) {
  SendError(res, HttpStatusFor(s.code()), absl::StatusCodeToString(s.code()), s.message());
}

template <class Msg>
void SendResult(httplib::Response& res, const absl::StatusOr<Msg>& result) {
  if (!result.ok()) return SendStatus(res, result.status());
  pbu::JsonPrintOptions options;
  // Zero values are information here (counter 0, excluded false), as in
  // `stragglerctl --output json`; lowerCamelCase names, enums by name.
  options.always_print_primitive_fields = true;
  std::string out;
  if (auto s = pbu::MessageToJsonString(*result, &out, options); !s.ok()) {
    return SendError(res, 500, "INTERNAL", absl::StrCat("cannot render JSON: ", s.ToString()));
  }
  out += '\n';
  res.status = 200;
  res.set_content(out, kJsonType);
}

// protobuf's JSON parser messages, made to name what was wrong.
absl::Status ParseJsonBody(const std::string& body, google::protobuf::Message* msg,
                           absl::string_view what) {
  if (absl::StripAsciiWhitespace(body).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body must be a ", what, " JSON object; it is empty"));
  }
  pbu::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto s = pbu::JsonStringToMessage(body, msg, options);
  if (s.ok()) return absl::OkStatus();
  std::string detail(s.message().data(), s.message().size());
  constexpr absl::string_view kUnknown = ": Cannot find field.";
  if (absl::EndsWith(detail, kUnknown)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown field '", detail.substr(0, detail.size() - kUnknown.size()),
                     "' in the ", what, " JSON body"));
  }
  std::replace(detail.begin(), detail.end(), '\n', ' ');
  absl::string_view text = absl::StripAsciiWhitespace(detail);
  if (absl::StartsWith(text, ": ")) text.remove_prefix(2);  // "Root element must be a message."
  return absl::InvalidArgumentError(
      absl::StrCat("the request body is not valid ", what, " JSON: ", text));
}

absl::StatusOr<uint32_t> ParseRank(absl::string_view text) {
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  if (!digits) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank '", text, "' is not a non-negative integer"));
  }
  uint64_t v = 0;
  auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || v > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("rank '", text, "' is out of range (at most ",
                                                   std::numeric_limits<uint32_t>::max(), ")"));
  }
  return static_cast<uint32_t>(v);
}

absl::StatusOr<uint64_t> ParseUint(absl::string_view name, absl::string_view text, uint64_t max) {
  uint64_t v = 0;
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (!digits || r.ec != std::errc() || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("query parameter ", name, "='", text,
                                                   "' is not an integer from 0 to ", max));
  }
  return v;
}

// The rank override of a PUT .../override body: the enum name, or a short
// lowercase alias.
absl::StatusOr<v1::RankOverride> ParseOverride(absl::string_view text) {
  v1::RankOverride o = v1::RANK_OVERRIDE_UNSPECIFIED;
  if (text == "none") return v1::RANK_OVERRIDE_NONE;
  if (text == "force_include") return v1::RANK_OVERRIDE_FORCE_INCLUDE;
  if (text == "force_exclude") return v1::RANK_OVERRIDE_FORCE_EXCLUDE;
  if (v1::RankOverride_Parse(std::string(text), &o) && o != v1::RANK_OVERRIDE_UNSPECIFIED) {
    return o;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "override '", text,
      "' is not one of none, force_include, force_exclude (or RANK_OVERRIDE_NONE, "
      "RANK_OVERRIDE_FORCE_INCLUDE, RANK_OVERRIDE_FORCE_EXCLUDE)"));
}

enum class RouteId {
  kMetrics,
  kHealthz,
  kReadyz,
  kJobs,
  kJob,
  kWorkers,
  kWorker,
  kOverride,
  kMembership,
  kJobEvents,
  kEvents,
  kPolicy,
  kReset,
  kReports,
};

struct Route {
  std::vector<absl::string_view> pattern;  // "{job}", "{rank}" or a literal segment
  absl::string_view method;
  RouteId id;
  // What the bearer token guards (auth.h): changes always, reads and
  // /metrics with auth.protect_reads, probes never.
  Access access;
};

const std::vector<Route>& Routes() {
  static const std::vector<Route> routes = {
      {{"metrics"}, "GET", RouteId::kMetrics, Access::kRead},
      {{"healthz"}, "GET", RouteId::kHealthz, Access::kOpen},
      {{"readyz"}, "GET", RouteId::kReadyz, Access::kOpen},
      {{"v1", "jobs"}, "GET", RouteId::kJobs, Access::kRead},
      {{"v1", "events"}, "GET", RouteId::kEvents, Access::kRead},
      {{"v1", "jobs", "{job}"}, "GET", RouteId::kJob, Access::kRead},
      {{"v1", "jobs", "{job}", "workers"}, "GET", RouteId::kWorkers, Access::kRead},
      {{"v1", "jobs", "{job}", "workers", "{rank}"}, "GET", RouteId::kWorker, Access::kRead},
      {{"v1", "jobs", "{job}", "workers", "{rank}", "override"}, "PUT", RouteId::kOverride,
       Access::kAdmin},
      {{"v1", "jobs", "{job}", "membership"}, "GET", RouteId::kMembership, Access::kRead},
      {{"v1", "jobs", "{job}", "events"}, "GET", RouteId::kJobEvents, Access::kRead},
      {{"v1", "jobs", "{job}", "policy"}, "PUT", RouteId::kPolicy, Access::kAdmin},
      {{"v1", "jobs", "{job}", "reset"}, "POST", RouteId::kReset, Access::kAdmin},
      {{"v1", "jobs", "{job}", "reports"}, "GET", RouteId::kReports, Access::kRead},
  };
  return routes;
}

bool Matches(const Route& route, const std::vector<std::string>& segments) {
  if (route.pattern.size() != segments.size()) return false;
  for (size_t i = 0; i < segments.size(); ++i) {
    const absl::string_view p = route.pattern[i];
    if (p.front() == '{') {
      if (segments[i].empty()) return false;
    } else if (p != segments[i]) {
      return false;
    }
  }
  return true;
}

// The query string of the target, decoded ('+' is a space). httplib's
// req.params also holds the fields of a form-encoded body (`curl -d` sends
// one), which are not query parameters.
using Query = std::multimap<std::string, std::string>;

absl::StatusOr<Query> ParseQuery(absl::string_view target) {
  Query query;
  const size_t mark = target.find('?');
  if (mark == absl::string_view::npos) return query;
  for (absl::string_view part : absl::StrSplit(target.substr(mark + 1), '&')) {
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    std::string name(part.substr(0, eq));
    std::string value(eq == absl::string_view::npos ? absl::string_view() : part.substr(eq + 1));
    std::replace(name.begin(), name.end(), '+', ' ');
    std::replace(value.begin(), value.end(), '+', ' ');
    auto n = DecodePathSegment(name);
    auto v = DecodePathSegment(value);
    if (!n || !v) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad percent-encoding in the query string of ", target));
    }
    query.emplace(*std::move(n), *std::move(v));
  }
  return query;
}

std::string Param(const Query& query, const std::string& name) {
  auto it = query.find(name);
  return it == query.end() ? std::string() : it->second;
}

// Query parameters a route accepts; any other is a 400 (typos do not pass
// silently). /metrics, /healthz and /readyz ignore theirs.
absl::Status CheckParams(const Query& query, std::vector<absl::string_view> allowed) {
  for (const auto& [name, value] : query) {
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown query parameter '", name, "'",
          allowed.empty() ? std::string(" (this endpoint takes none)")
                          : absl::StrCat(" (this endpoint takes ", absl::StrJoin(allowed, ", "),
                                         ")")));
    }
    if (query.count(name) > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter '", name, "' given more than once"));
    }
  }
  return absl::OkStatus();
}

// ?since=SEQ&since_time=RFC3339&limit=N into a ListEventsRequest.
absl::Status EventsQuery(const Query& query, v1::ListEventsRequest& out) {
  if (absl::Status s = CheckParams(query, {"since", "since_time", "limit"}); !s.ok()) return s;
  if (query.count("since")) {
    auto v = ParseUint("since", Param(query, "since"), std::numeric_limits<uint64_t>::max());
    if (!v.ok()) return v.status();
    out.set_since_sequence(*v);
  }
  if (query.count("limit")) {
    auto v = ParseUint("limit", Param(query, "limit"), JobRegistry::kMaxEventLimit);
    if (!v.ok()) return v.status();
    out.set_limit(static_cast<uint32_t>(*v));
  }
  if (query.count("since_time")) {
    // A '+' of an unencoded UTC offset arrives as a space (form encoding):
    // no RFC 3339 time has a space, so put it back.
    std::string text = Param(query, "since_time");
    std::replace(text.begin(), text.end(), ' ', '+');
    if (!google::protobuf::util::TimeUtil::FromString(text, out.mutable_since_time())) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter since_time='", text,
                       "' is not an RFC 3339 time (e.g. 2024-05-01T12:00:00Z)"));
    }
  }
  return absl::OkStatus();
}

std::string Caller(const httplib::Request& req) {
  return absl::StrCat("http ", req.remote_addr, ":", req.remote_port);
}

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

HttpServer::HttpServer(JobRegistry& registry, DaemonStats& stats, const Authorizer& auth)
    : registry_(registry), stats_(stats), auth_(auth) {}

HttpServer::~HttpServer() { Stop(); }

absl::Status HttpServer::Start(const DaemonConfig& config, const ServerTls* tls) {
  const HttpConfig& http = config.http;
  const std::string& address = config.http_address;
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon != std::string::npos) {
    std::from_chars(address.data() + colon + 1, address.data() + address.size(), port);
  }
  if (colon == std::string::npos || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("http_address=", address, " is not HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::] -> ::
  }

  if (tls != nullptr) {
    // The context was checked by LoadServerTls; a failure here is unexpected.
    absl::Status setup;
    server_ = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
      setup = ConfigureSslContext(*tls, &ctx);
      return setup.ok();
    });
    if (!server_->is_valid()) {
      server_.reset();
      return setup.ok() ? absl::InternalError("cannot set up the HTTPS listener") : setup;
    }
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  const size_t threads = http.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_read_timeout(http.read_timeout_seconds, 0);
  server_->set_write_timeout(http.write_timeout_seconds, 0);
  server_->set_keep_alive_max_count(http.keep_alive_max_requests);
  server_->set_keep_alive_timeout(http.keep_alive_timeout_seconds);
  server_->set_payload_max_length(http.max_body_bytes);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a
  // second daemon share the port instead of failing to start.
  server_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });

  auto handler = [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res); };
  server_->Get(".*", handler);
  server_->Post(".*", handler);
  server_->Put(".*", handler);
  server_->Patch(".*", handler);
  server_->Delete(".*", handler);
  server_->Options(".*", handler);

  const uint32_t max_body = http.max_body_bytes;
  server_->set_pre_routing_handler([this, max_body](const httplib::Request& req,
                                                    httplib::Response& res) {
    // Before httplib reads a body. A chunked body has no length to hold
    // against http.max_body_bytes: refused.
    if (req.has_header("Transfer-Encoding")) {
      SendError(res, 411, "LENGTH_REQUIRED",
                absl::StrCat("request bodies need a Content-Length (at most http.max_body_bytes=",
                             max_body, "), not a Transfer-Encoding"));
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    // Without Content-Length a request has no body (RFC 9112 6.3), but
    // httplib would read a POST/PUT/PATCH/DELETE body until the connection
    // closes (`curl -X POST` sends no Content-Length): serve it now.
    if (!req.has_header("Content-Length") &&
        (req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
         req.method == "DELETE")) {
      Handle(req, res);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Errors httplib answers itself (413, malformed requests) get the JSON shape too.
  server_->set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    switch (res.status) {
      case 413:
        SendError(res, 413, "PAYLOAD_TOO_LARGE",
                  absl::StrCat("request body larger than http.max_body_bytes=", max_body));
        break;
      case 414:
        SendError(res, 414, "URI_TOO_LONG", "request URI too long");
        break;
      case 404:
        SendError(res, 404, "NOT_FOUND", "no such path");
        break;
      default:
        SendError(res, res.status, res.status >= 500 ? "INTERNAL" : "INVALID_ARGUMENT",
                  absl::StrCat("HTTP ", res.status, ": the request could not be served"));
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  server_->set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::error("http {} {}: {}", req.method, req.path, what);
        SendError(res, 500, "INTERNAL", what);
      });

  if (port == 0) {
    port = server_->bind_to_any_port(host);
  } else if (!server_->bind_to_port(host, port)) {
    port = -1;
  }
  if (port <= 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on http_address=", address, " (address in use or not local?)"));
  }
  port_ = port;
  address_ = absl::StrCat(HostOf(address), ":", port);
  thread_ = std::thread([this] {
    if (!server_->listen_after_bind()) spdlog::error("HTTP server on {} stopped", address_);
  });
  // Stop() before the listener runs would be lost (httplib's stop() only
  // acts on a running server): return once it runs.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!server_->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_->is_running()) {
    Stop();
    return absl::InternalError(absl::StrCat("HTTP server on ", address_, " did not start"));
  }
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (!server_) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

std::string HttpServer::dial_address() const {
  const std::string host = HostOf(address_);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    return absl::StrCat("127.0.0.1:", port_);
  }
  return address_;
}

void HttpServer::Handle(const httplib::Request& req, httplib::Response& res) {
  // Routing on the raw target, segment by segment, so that an encoded '/'
  // (%2F) inside a job id stays inside it.
  absl::string_view target = req.target;
  target = target.substr(0, target.find('?'));
  if (target.empty() || target.front() != '/') {
    return SendError(res, 404, "NOT_FOUND", absl::StrCat("no such path: ", target));
  }
  std::vector<std::string> segments;
  for (absl::string_view rest = target.substr(1);;) {
    const size_t slash = rest.find('/');
    auto decoded = DecodePathSegment(rest.substr(0, slash));
    if (!decoded) {
      return SendError(res, 400, "INVALID_ARGUMENT",
                       absl::StrCat("bad percent-encoding in path ", target));
    }
    segments.push_back(*std::move(decoded));
    if (slash == absl::string_view::npos) break;
    rest = rest.substr(slash + 1);
  }

  const absl::string_view method = req.method == "HEAD" ? "GET" : absl::string_view(req.method);
  const Route* route = nullptr;
  std::vector<std::string> allow;
  for (const Route& r : Routes()) {
    if (!Matches(r, segments)) continue;
    if (r.method == method) {
      route = &r;
      break;
    }
    allow.emplace_back(r.method);
    if (r.method == "GET") allow.emplace_back("HEAD");
  }
  if (route == nullptr) {
    if (allow.empty()) {
      return SendError(res, 404, "NOT_FOUND", absl::StrCat("no such path: ", target));
    }
    res.set_header("Allow", absl::StrJoin(allow, ", "));
    return SendError(res, 405, "METHOD_NOT_ALLOWED",
                     absl::StrCat(req.method, " is not allowed on ", target, " (allowed: ",
                                  absl::StrJoin(allow, ", "), ")"));
  }

  const std::string header = req.get_header_value("Authorization");
  std::optional<std::string_view> authorization;
  if (req.has_header("Authorization")) authorization = header;
  if (absl::Status s = auth_.Check(route->access, authorization); !s.ok()) {
    res.set_header("WWW-Authenticate", "Bearer realm=\"stragglerd\"");
    return SendStatus(res, s);
  }

  const Phase phase = phase_.load();
  switch (route->id) {
    case RouteId::kMetrics: {
      MetricsOptions options;
      options.version = STRAGGLERD_VERSION;
      options.per_rank_max_ranks = registry_.config()->metrics.per_rank_max_ranks;
      res.status = 200;
      res.set_content(RenderDaemonMetrics(registry_, stats_, options), kMetricsType);
      return;
    }
    case RouteId::kHealthz:
      res.status = 200;
      res.set_content("ok", kTextType);
      return;
    case RouteId::kReadyz:
      res.status = phase == Phase::kServing ? 200 : 503;
      res.set_content(phase == Phase::kServing    ? "ready"
                      : phase == Phase::kStarting ? "starting"
                                                  : "draining",
                      kTextType);
      return;
    default:
      break;
  }

  // REST.
  if (phase == Phase::kDraining) {
    return SendError(res, 503, "UNAVAILABLE", "stragglerd is shutting down");
  }
  absl::StatusOr<Query> query = ParseQuery(req.target);
  if (!query.ok()) return SendStatus(res, query.status());
  if (route->id == RouteId::kJobEvents || route->id == RouteId::kEvents) {
    v1::ListEventsRequest request;
    if (route->id == RouteId::kJobEvents) request.set_job_id(segments[2]);
    if (absl::Status s = EventsQuery(*query, request); !s.ok()) return SendStatus(res, s);
    return SendResult(res, api::ListEvents(registry_, request));
  }
  if (route->id == RouteId::kReports) {
    // ?since_iteration=N&limit=N
    v1::ExportReportsRequest request;
    request.set_job_id(segments[2]);
    if (absl::Status s = CheckParams(*query, {"since_iteration", "limit"}); !s.ok()) {
      return SendStatus(res, s);
    }
    if (query->count("since_iteration")) {
      auto v = ParseUint("since_iteration", Param(*query, "since_iteration"),
                         std::numeric_limits<uint64_t>::max());
      if (!v.ok()) return SendStatus(res, v.status());
      request.set_since_iteration(*v);
    }
    if (query->count("limit")) {
      auto v = ParseUint("limit", Param(*query, "limit"), std::numeric_limits<uint32_t>::max());
      if (!v.ok()) return SendStatus(res, v.status());
      request.set_limit(static_cast<uint32_t>(*v));
    }
    return SendResult(res, api::ExportReports(registry_, request));
  }
  if (absl::Status s = CheckParams(*query, {}); !s.ok()) return SendStatus(res, s);
  const std::string& job = segments.size() > 2 ? segments[2] : segments[0];
  absl::StatusOr<uint32_t> rank = 0u;
  if (route->id == RouteId::kWorker || route->id == RouteId::kOverride) {
    rank = ParseRank(segments[4]);
    if (!rank.ok()) return SendStatus(res, rank.status());
  }

  switch (route->id) {
    case RouteId::kJobs:
      return SendResult(res, api::ListJobs(registry_, v1::ListJobsRequest()));
    case RouteId::kJob: {
      v1::GetJobRequest request;
      request.set_job_id(job);
      return SendResult(res, api::GetJob(registry_, request));
    }
    case RouteId::kWorkers: {
      v1::ListWorkersRequest request;
      request.set_job_id(job);
      return SendResult(res, api::ListWorkers(registry_, request));
    }
    case RouteId::kWorker: {
      v1::GetWorkerRequest request;
      request.set_job_id(job);
      request.set_rank(*rank);
      return SendResult(res, api::GetWorker(registry_, request));
    }
    case RouteId::kMembership: {
      v1::GetMembershipRequest request;
      request.set_job_id(job);
      return SendResult(res, api::GetMembership(registry_, request));
    }
    case RouteId::kPolicy: {
      v1::SetPolicyRequest request;
      request.set_job_id(job);
      if (absl::Status s = ParseJsonBody(req.body, request.mutable_policy(), "PolicyConfig");
          !s.ok()) {
        return SendStatus(res, s);
      }
      return SendResult(res, api::SetPolicy(registry_, request, Caller(req)));
    }
    case RouteId::kOverride: {
      // {"override": "force_exclude" | "RANK_OVERRIDE_FORCE_EXCLUDE" | ..., "reason": "..."}
      google::protobuf::Struct body;
      if (absl::Status s = ParseJsonBody(req.body, &body, "override"); !s.ok()) {
        return SendStatus(res, s);
      }
      v1::SetRankOverrideRequest request;
      request.set_job_id(job);
      request.set_rank(*rank);
      bool has_override = false;
      for (const auto& [key, value] : body.fields()) {
        if (key != "override" && key != "reason") {
          return SendError(res, 400, "INVALID_ARGUMENT",
                           absl::StrCat("unknown field '", key,
                                        "' in the override JSON body (fields: override, reason)"));
        }
        if (value.kind_case() != google::protobuf::Value::kStringValue) {
          return SendError(res, 400, "INVALID_ARGUMENT",
                           absl::StrCat("field '", key, "' of the override body must be a string"));
        }
        if (key == "reason") {
          request.set_reason(value.string_value());
          continue;
        }
        auto o = ParseOverride(value.string_value());
        if (!o.ok()) return SendStatus(res, o.status());
        request.set_override(*o);
        has_override = true;
      }
      if (!has_override) {
        return SendError(res, 400, "INVALID_ARGUMENT",
                         "the override body needs \"override\": none, force_include or "
                         "force_exclude");
      }
      return SendResult(res, api::SetRankOverride(registry_, request, Caller(req)));
    }
    case RouteId::kReset: {
      // No body, or an empty JSON object.
      if (!absl::StripAsciiWhitespace(req.body).empty()) {
        google::protobuf::Empty empty;
        if (absl::Status s = ParseJsonBody(req.body, &empty, "reset (empty or {})"); !s.ok()) {
          return SendStatus(res, s);
        }
      }
      v1::ResetJobRequest request;
      request.set_job_id(job);
      return SendResult(res, api::ResetJob(registry_, request, Caller(req)));
    }
    default:
      return SendError(res, 500, "INTERNAL", "unrouted path");
  }
}

}  // namespace straggler::daemon
