// The REST layer of stragglerd's HTTP server without sockets or state: a
// request's method, target ("/v1/jobs/x/events?since=3") and body in; the
// route, or the api:: request to make, or the error to answer, out.
// http_server.cc serves what this decides; fuzz/fuzz_rest.cc feeds it
// arbitrary requests.
//
//   auto match = MatchRoute("GET", "/v1/jobs/demo/workers/3");
//   if (auto* e = std::get_if<RestError>(&match)) ...;             // 404/405/400
//   absl::StatusOr<RestCall> call = ParseRestCall(std::get<RouteMatch>(match), target, body);
//   // call: a v1::GetWorkerRequest{job_id: "demo", rank: 3}
//
// Paths are routed segment by segment on the raw target, so that an encoded
// '/' (%2F) inside a job id stays inside it. Query parameters a route does
// not take, or given twice, are errors (typos do not pass silently). Every
// error names the offending value. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::daemon {

// The HTTP status for an absl/gRPC status code (the mapping of grpc-gateway):
// INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE 400; NOT_FOUND 404;
// UNAVAILABLE 503; ...; OK 200.
int HttpStatusFor(absl::StatusCode code);

// Percent-decodes one path segment ('+' stays '+'); nullopt on a bad escape.
std::optional<std::string> DecodePathSegment(absl::string_view segment);

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

// An answer decided without calling the api: {"code": code, "message": ...}
// with http_status; `allow` (405 only) is the Allow header.
struct RestError {
  int http_status = 400;
  std::string code;
  std::string message;
  std::string allow;
};

struct RouteMatch {
  RouteId id;
  std::vector<std::string> segments;  // the path's, percent-decoded
};

// The route for `method` (HEAD is GET) on the path of `target`: 404 for no
// such path, 405 (with `allow`) for a path without that method, 400 for bad
// percent-encoding.
std::variant<RouteMatch, RestError> MatchRoute(absl::string_view method, absl::string_view target);

// The api:: request of a REST route (kMetrics, kHealthz and kReadyz have
// none).
using RestCall =
    std::variant<v1::ListJobsRequest, v1::GetJobRequest, v1::ListWorkersRequest,
                 v1::GetWorkerRequest, v1::GetMembershipRequest, v1::ListEventsRequest,
                 v1::ExportReportsRequest, v1::SetPolicyRequest, v1::SetRankOverrideRequest,
                 v1::ResetJobRequest>;

// The request of `match` (a REST route) from the target's query string and
// the body. INVALID_ARGUMENT names the bad parameter, rank or JSON field.
// Job ids are checked by the api:: calls, alike for gRPC and REST.
absl::StatusOr<RestCall> ParseRestCall(const RouteMatch& match, absl::string_view target,
                                       absl::string_view body);

}  // namespace straggler::daemon
