#include "http/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <variant>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api/api.h"
#include "api/query_forward.h"
#include "auth/auth.h"
#include "console/console.h"
#include "straggler/common/http_deadline.h"
#include "registry/job_registry.h"
#include "metrics/daemon_metrics.h"
#include "api/rest_route.h"
#include "spdlog/spdlog.h"
#include "metrics/stats.h"
#include "server/cluster_member.h"
#include "server/redirect.h"
#include "straggler/common/tls.h"

#ifndef STRAGGLERD_VERSION
#define STRAGGLERD_VERSION "unknown"
#endif

namespace straggler::daemon {
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

std::string Caller(const httplib::Request& req) {
  return absl::StrCat("http ", req.remote_addr, ":", req.remote_port);
}

// One api:: call per RestCall alternative that changes something (std::visit
// in Handle).
using Reg = JobRegistry;
using Who = const std::string&;  // the caller, for the admin log
// The reads are query_forward.h's Read (any replica answers for every job).
auto Call(Reg& r, const v1::SetPolicyRequest& q, Who c) { return api::SetPolicy(r, q, c); }
auto Call(Reg& r, const v1::SetRankOverrideRequest& q, Who c) {
  return api::SetRankOverride(r, q, c);
}
auto Call(Reg& r, const v1::ResetJobRequest& q, Who c) { return api::ResetJob(r, q, c); }

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// What the bearer token guards (auth.h): changes always, reads and /metrics
// with auth.protect_reads, probes never. An exhaustive switch, so that a new
// route does not compile until someone decided its access.
Access AccessOf(RouteId id) {
  switch (id) {
    case RouteId::kHealthz:
    case RouteId::kReadyz:
      return Access::kOpen;
    case RouteId::kMetrics:
    case RouteId::kJobs:
    case RouteId::kJob:
    case RouteId::kWorkers:
    case RouteId::kWorker:
    case RouteId::kMembership:
    case RouteId::kJobEvents:
    case RouteId::kEvents:
    case RouteId::kReports:
      return Access::kRead;
    case RouteId::kOverride:
    case RouteId::kPolicy:
    case RouteId::kReset:
      return Access::kAdmin;
  }
  return Access::kAdmin;
}

}  // namespace

HttpServer::HttpServer(JobRegistry& registry, DaemonStats& stats, const Authorizer& auth,
                       ClusterMember* cluster, const QueryForwarder* forwarder)
    : registry_(registry), stats_(stats), auth_(auth), cluster_(cluster), forwarder_(forwarder) {}

absl::Status HttpServer::RouteInCluster(const RouteMatch& route) const {
  if (cluster_ == nullptr) return absl::OkStatus();
  switch (route.id) {
    case RouteId::kOverride:
    case RouteId::kPolicy:
    case RouteId::kReset:
      // As the gRPC AdminService: only the owner changes a job. (Reads are
      // forwarded to the owner instead: api/query_forward.h.)
      return cluster_->Serve(route.segments[2], /*take=*/false);
    default:
      return absl::OkStatus();
  }
}

HttpServer::~HttpServer() { Stop(); }

absl::Status HttpServer::Start(const DaemonConfig& config, const common::ServerTls* tls) {
  https_ = tls != nullptr;
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

  // Per-request deadlines, and requests read before a worker is taken, so
  // slow clients hold no worker (http_deadline.h). Its own refusals (408,
  // 413, 414, 431) are counted as httplib's answers are.
  common::RefusalCounter refused = [this](int status) { stats_.CountHttpStatus(status); };
  if (tls != nullptr) {
    // Renewed certificate files serve new connections after at most
    // tls.reload_seconds, as gRPC's (SslContextSource).
    absl::StatusOr<std::shared_ptr<common::SslContextSource>> contexts =
        common::SslContextSource::Create(*tls);
    if (!contexts.ok()) return contexts.status();
    server_ = common::MakeDeadlineTlsServer(
        stats_.http_slow_clients, [source = *std::move(contexts)] { return source->Current(); },
        refused);
  } else {
    server_ = common::MakeDeadlineServer(stats_.http_slow_clients, refused);
  }
  common::ConfigureListener(*server_, http.threads, http.read_timeout_seconds,
                            http.write_timeout_seconds, http.keep_alive_timeout_seconds);
  server_->set_keep_alive_max_count(http.keep_alive_max_requests);
  server_->set_payload_max_length(http.max_body_bytes);

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
    SetSecurityHeaders(res);
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
  // After every answer, httplib's own errors included.
  server_->set_logger([this](const httplib::Request&, const httplib::Response& res) {
    stats_.CountHttpStatus(res.status);
  });
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
  SetSecurityHeaders(res);
  // The web console (console/console.h): static files, no job data.
  if (ServeConsole(req.method, req.path, res)) return;
  auto matched = MatchRoute(req.method, req.target);
  if (const RestError* e = std::get_if<RestError>(&matched)) {
    if (!e->allow.empty()) res.set_header("Allow", e->allow);
    return SendError(res, e->http_status, e->code, e->message);
  }
  const RouteMatch& route = std::get<RouteMatch>(matched);
  const std::string header = req.get_header_value("Authorization");
  std::optional<std::string_view> authorization;
  if (req.has_header("Authorization")) authorization = header;
  if (absl::Status s = auth_.Check(AccessOf(route.id), authorization); !s.ok()) {
    res.set_header("WWW-Authenticate", "Bearer realm=\"stragglerd\"");
    return SendStatus(res, s);
  }

  const Phase phase = phase_.load();
  switch (route.id) {
    case RouteId::kMetrics: {
      MetricsOptions options;
      options.version = STRAGGLERD_VERSION;
      options.per_rank_max_ranks = registry_.config()->metrics.per_rank_max_ranks;
      if (cluster_ != nullptr) options.cluster = cluster_->Metrics();
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
  absl::StatusOr<RestCall> call = ParseRestCall(route, req.target, req.body);
  if (!call.ok()) return SendStatus(res, call.status());
  if (absl::Status s = RouteInCluster(route); !s.ok()) {
    // Another replica owns the job: 307 keeps the method and the body, so
    // `curl -L` repeats a PUT or POST there (docs/api.md, "Replicas").
    if (std::optional<OwnerAddress> owner = OwnerOf(s); owner && !owner->http_address.empty()) {
      res.set_header("Location",
                     absl::StrCat(https_ ? "https://" : "http://", owner->http_address, req.target));
      res.set_header("Straggler-Owner-Id", owner->id);
      return SendError(res, 307, "UNAVAILABLE", s.message());
    }
    return SendStatus(res, s);
  }
  const std::string caller = Caller(req);
  QueryCaller reader;
  if (authorization) reader.authorization = std::string(*authorization);
  std::visit(
      [&](const auto& request) {
        if constexpr (requires { Read(registry_, forwarder_, request, reader); }) {
          SendResult(res, Read(registry_, forwarder_, request, reader));
        } else {
          SendResult(res, Call(registry_, request, caller));
        }
      },
      *call);
}

}  // namespace straggler::daemon
