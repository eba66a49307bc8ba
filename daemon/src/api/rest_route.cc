#include "api/rest_route.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <map>

#include <google/protobuf/empty.pb.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "straggler/common/validate.h"
#include "straggler/v1/requests.h"

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
using ::straggler::v1::requests::ForJob;
namespace pbu = ::google::protobuf::util;

absl::Status ParseJsonBody(absl::string_view body, google::protobuf::Message* msg,
                           absl::string_view what) {
  if (absl::StripAsciiWhitespace(body).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body must be a ", what, " JSON object; it is empty"));
  }
  pbu::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto s = pbu::JsonStringToMessage(std::string(body), msg, options);
  if (s.ok()) return absl::OkStatus();
  std::string detail(s.message().data(), s.message().size());
  constexpr absl::string_view kUnknown = ": Cannot find field.";
  if (absl::EndsWith(detail, kUnknown)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown field ", common::Quoted(detail.substr(0, detail.size() - kUnknown.size())),
        " in the ", what, " JSON body"));
  }
  std::replace(detail.begin(), detail.end(), '\n', ' ');
  absl::string_view text = absl::StripAsciiWhitespace(detail);
  if (absl::StartsWith(text, ": ")) text.remove_prefix(2);  // "Root element must be a message."
  // The parser's message can quote the body: escaped and cut like any value.
  return absl::InvalidArgumentError(
      absl::StrCat("the request body is not valid ", what, " JSON: ", common::Quoted(text, 256)));
}

absl::StatusOr<uint32_t> ParseRank(absl::string_view text) {
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  if (!digits) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", common::Quoted(text), " is not a non-negative integer"));
  }
  uint64_t v = 0;
  auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || v > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", common::Quoted(text),
                                                   " is out of range (at most ",
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
    return absl::InvalidArgumentError(absl::StrCat(
        "query parameter ", name, "=", common::Quoted(text), " is not an integer from 0 to ", max));
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
  return absl::InvalidArgumentError(
      absl::StrCat("override ", common::Quoted(text),
                   " is not one of none, force_include, force_exclude (or RANK_OVERRIDE_NONE, "
                   "RANK_OVERRIDE_FORCE_INCLUDE, RANK_OVERRIDE_FORCE_EXCLUDE)"));
}


struct Route {
  std::vector<absl::string_view> pattern;  // "{job}", "{rank}" or a literal segment
  absl::string_view method;
  RouteId id;
};

const std::vector<Route>& Routes() {
  static const std::vector<Route> routes = {
      {{"metrics"}, "GET", RouteId::kMetrics},
      {{"healthz"}, "GET", RouteId::kHealthz},
      {{"readyz"}, "GET", RouteId::kReadyz},
      {{"v1", "jobs"}, "GET", RouteId::kJobs},
      {{"v1", "events"}, "GET", RouteId::kEvents},
      {{"v1", "jobs", "{job}"}, "GET", RouteId::kJob},
      {{"v1", "jobs", "{job}", "workers"}, "GET", RouteId::kWorkers},
      {{"v1", "jobs", "{job}", "workers", "{rank}"}, "GET", RouteId::kWorker},
      {{"v1", "jobs", "{job}", "workers", "{rank}", "override"}, "PUT", RouteId::kOverride},
      {{"v1", "jobs", "{job}", "membership"}, "GET", RouteId::kMembership},
      {{"v1", "jobs", "{job}", "events"}, "GET", RouteId::kJobEvents},
      {{"v1", "jobs", "{job}", "policy"}, "PUT", RouteId::kPolicy},
      {{"v1", "jobs", "{job}", "reset"}, "POST", RouteId::kReset},
      {{"v1", "jobs", "{job}", "reports"}, "GET", RouteId::kReports},
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
      return absl::InvalidArgumentError(absl::StrCat("bad percent-encoding in the query string ",
                                                     common::Quoted(target.substr(mark + 1), 256)));
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
          "unknown query parameter ", common::Quoted(name),
          allowed.empty()
              ? std::string(" (this endpoint takes none)")
              : absl::StrCat(" (this endpoint takes ", absl::StrJoin(allowed, ", "), ")")));
    }
    if (query.count(name) > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter ", common::Quoted(name), " given more than once"));
    }
  }
  return absl::OkStatus();
}

// An event kind of ?kind=: the short word of the logs and stragglerctl
// ("state_change") or the enum name ("EVENT_KIND_STATE_CHANGE").
absl::StatusOr<v1::EventKind> ParseEventKind(absl::string_view text) {
  std::string name = absl::AsciiStrToUpper(text);
  if (!absl::StartsWith(name, "EVENT_KIND_")) name = absl::StrCat("EVENT_KIND_", name);
  v1::EventKind k = v1::EVENT_KIND_UNSPECIFIED;
  if (v1::EventKind_Parse(name, &k) && k != v1::EVENT_KIND_UNSPECIFIED) return k;
  return absl::InvalidArgumentError(absl::StrCat(
      "query parameter kind=", common::Quoted(text),
      " is not an event kind (state_change, membership, guard_blocked, policy_changed, override, "
      "reset, reprofile, membership_withheld, job_lost)"));
}

// ?since=SEQ&since_time=RFC3339&limit=N&kind=K1,K2&rank=R into a ListEventsRequest.
absl::Status EventsQuery(const Query& query, v1::ListEventsRequest& out) {
  if (absl::Status s =
          CheckParams(query, {"since", "since_time", "limit", "kind", "rank", "run"});
      !s.ok())
    return s;
  if (query.count("run")) out.set_run_id(Param(query, "run"));
  if (query.count("kind")) {
    const std::string kinds = Param(query, "kind");
    for (absl::string_view word : absl::StrSplit(kinds, ',')) {
      auto k = ParseEventKind(word);
      if (!k.ok()) return k.status();
      out.add_kinds(*k);
    }
  }
  if (query.count("rank")) {
    auto v = ParseUint("rank", Param(query, "rank"), std::numeric_limits<uint32_t>::max());
    if (!v.ok()) return v.status();
    out.set_rank(static_cast<uint32_t>(*v));
  }
  if (query.count("since")) {
    auto v = ParseUint("since", Param(query, "since"), std::numeric_limits<uint64_t>::max());
    if (!v.ok()) return v.status();
    out.set_since_sequence(*v);
  }
  if (query.count("limit")) {
    auto v = ParseUint("limit", Param(query, "limit"), common::kMaxEventLimit);
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
          absl::StrCat("query parameter since_time=", common::Quoted(text),
                       " is not an RFC 3339 time (e.g. 2024-05-01T12:00:00Z)"));
    }
  }
  return absl::OkStatus();
}

// {"override": "force_exclude" | "RANK_OVERRIDE_FORCE_EXCLUDE" | ..., "reason": "..."}
absl::Status ParseOverrideBody(absl::string_view body, v1::SetRankOverrideRequest& request) {
  google::protobuf::Struct fields;
  if (absl::Status s = ParseJsonBody(body, &fields, "override"); !s.ok()) return s;
  bool has_override = false;
  for (const auto& [key, value] : fields.fields()) {
    if (key != "override" && key != "reason") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown field ", common::Quoted(key),
                       " in the override JSON body (fields: override, reason)"));
    }
    if (value.kind_case() != google::protobuf::Value::kStringValue) {
      // Named as the JSON it was sent as (3, true, null, {...}).
      std::string json;
      const bool printed = pbu::MessageToJsonString(value, &json).ok();
      return absl::InvalidArgumentError(
          absl::StrCat("field '", key,
                       "' of the override body must be a string, "
                       "not ",
                       printed ? common::Quoted(json) : "a JSON value"));
    }
    if (key == "reason") {
      request.set_reason(value.string_value());
      continue;
    }
    auto o = ParseOverride(value.string_value());
    if (!o.ok()) return o.status();
    request.set_override(*o);
    has_override = true;
  }
  if (!has_override) {
    return absl::InvalidArgumentError(
        "the override body needs \"override\": none, force_include or force_exclude");
  }
  return absl::OkStatus();
}

}  // namespace

std::variant<RouteMatch, RestError> MatchRoute(absl::string_view method, absl::string_view target) {
  target = target.substr(0, target.find('?'));
  if (target.empty() || target.front() != '/') {
    return RestError{404, "NOT_FOUND", absl::StrCat("no such path: ", common::Quoted(target, 256)),
                     ""};
  }
  RouteMatch match;
  for (absl::string_view rest = target.substr(1);;) {
    const size_t slash = rest.find('/');
    auto decoded = DecodePathSegment(rest.substr(0, slash));
    if (!decoded) {
      return RestError{400, "INVALID_ARGUMENT",
                       absl::StrCat("bad percent-encoding in path ", common::Quoted(target, 256)),
                       ""};
    }
    match.segments.push_back(*std::move(decoded));
    if (slash == absl::string_view::npos) break;
    rest = rest.substr(slash + 1);
  }

  const absl::string_view as = method == "HEAD" ? absl::string_view("GET") : method;
  std::vector<std::string> allow;
  for (const Route& r : Routes()) {
    if (!Matches(r, match.segments)) continue;
    if (r.method == as) {
      match.id = r.id;
      return match;
    }
    allow.emplace_back(r.method);
    if (r.method == "GET") allow.emplace_back("HEAD");
  }
  if (allow.empty()) {
    return RestError{404, "NOT_FOUND", absl::StrCat("no such path: ", common::Quoted(target, 256)),
                     ""};
  }
  const std::string allowed = absl::StrJoin(allow, ", ");
  return RestError{405, "METHOD_NOT_ALLOWED",
                   absl::StrCat(common::Quoted(method), " is not allowed on ",
                                common::Quoted(target, 256), " (allowed: ", allowed, ")"),
                   allowed};
}

absl::StatusOr<RestCall> ParseRestCall(const RouteMatch& match, absl::string_view target,
                                       absl::string_view body) {
  absl::StatusOr<Query> query = ParseQuery(target);
  if (!query.ok()) return query.status();
  const std::vector<std::string>& segments = match.segments;
  const std::string& job = segments.size() > 2 ? segments[2] : segments[0];

  switch (match.id) {
    case RouteId::kEvents:
    case RouteId::kJobEvents: {
      v1::ListEventsRequest request;
      if (match.id == RouteId::kJobEvents) request.set_job_id(job);
      if (absl::Status s = EventsQuery(*query, request); !s.ok()) return s;
      return request;
    }
    case RouteId::kReports: {
      // ?since_iteration=N&limit=N
      auto request = ForJob<v1::ExportReportsRequest>(job);
      if (absl::Status s = CheckParams(*query, {"since_iteration", "limit"}); !s.ok()) return s;
      if (query->count("since_iteration")) {
        auto v = ParseUint("since_iteration", Param(*query, "since_iteration"),
                           std::numeric_limits<uint64_t>::max());
        if (!v.ok()) return v.status();
        request.set_since_iteration(*v);
      }
      if (query->count("limit")) {
        auto v = ParseUint("limit", Param(*query, "limit"), std::numeric_limits<uint32_t>::max());
        if (!v.ok()) return v.status();
        request.set_limit(static_cast<uint32_t>(*v));
      }
      return request;
    }
    case RouteId::kJob: {
      if (query->empty()) break;
      // ?run=ID: an earlier run's last state (docs/runs.md).
      if (absl::Status s = CheckParams(*query, {"run"}); !s.ok()) return s;
      auto request = ForJob<v1::GetJobRequest>(job);
      request.set_run_id(Param(*query, "run"));
      return request;
    }
    default:
      break;
  }
  if (absl::Status s = CheckParams(*query, {}); !s.ok()) return s;
  absl::StatusOr<uint32_t> rank = 0u;
  if (match.id == RouteId::kWorker || match.id == RouteId::kOverride) {
    rank = ParseRank(segments[4]);
    if (!rank.ok()) return rank.status();
  }
  switch (match.id) {
    case RouteId::kJobs:
      return v1::ListJobsRequest();
    case RouteId::kJob:
      return ForJob<v1::GetJobRequest>(job);
    case RouteId::kWorkers:
      return ForJob<v1::ListWorkersRequest>(job);
    case RouteId::kWorker: {
      auto request = ForJob<v1::GetWorkerRequest>(job);
      request.set_rank(*rank);
      return request;
    }
    case RouteId::kMembership:
      return ForJob<v1::GetMembershipRequest>(job);
    case RouteId::kPolicy: {
      auto request = ForJob<v1::SetPolicyRequest>(job);
      if (absl::Status s = ParseJsonBody(body, request.mutable_policy(), "PolicyConfig"); !s.ok()) {
        return s;
      }
      return request;
    }
    case RouteId::kOverride: {
      auto request = ForJob<v1::SetRankOverrideRequest>(job);
      request.set_rank(*rank);
      if (absl::Status s = ParseOverrideBody(body, request); !s.ok()) return s;
      return request;
    }
    case RouteId::kReset: {
      // No body, or an empty JSON object.
      if (!absl::StripAsciiWhitespace(body).empty()) {
        google::protobuf::Empty empty;
        if (absl::Status s = ParseJsonBody(body, &empty, "reset (empty or {})"); !s.ok()) return s;
      }
      return ForJob<v1::ResetJobRequest>(job);
    }
    default:
      return absl::InternalError(
          absl::StrCat("route ", static_cast<int>(match.id), " has no api call"));
  }
}

}  // namespace straggler::daemon
