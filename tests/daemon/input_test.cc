// The daemon's checks of untrusted input without a server: job ids, hellos,
// override reasons (validate.h), REST routing and parameter parsing
// (rest_route.h), the per-stream token bucket (rate_limit.h) and the policy
// wire mapping (policy_convert.h). Messages must name the offending value.
// The same code runs under the fuzz targets in fuzz/.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "straggler/common/rate_limit.h"
#include "api/rest_route.h"
#include "straggler/common/validate.h"
#include "straggler/v1/enum_names.h"
#include "wire/policy_convert.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;

namespace {

straggler::common::StreamHello GoodHello() {
  straggler::common::StreamHello h;
  h.job_id = "train.a-1_B";
  h.node = "node-a.example.com";
  h.client_version = "straggler 0.1.0";
  h.world_size = 4;
  h.ranks = {0, 3};
  return h;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

}  // namespace

TEST_CASE("job ids: A-Z a-z 0-9 . _ -, 1 to 128 bytes, errors name the value and the byte") {
  CHECK(straggler::common::ValidateJobId("job_id", "train.a-1_B").ok());
  CHECK(straggler::common::ValidateJobId("job_id", std::string(128, 'x')).ok());

  absl::Status s = straggler::common::ValidateJobId("hello.job_id", "a b");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(s) == "hello.job_id 'a b' has ' ' at byte 1; allowed: A-Z a-z 0-9 . _ -, 1 to "
                      "128 bytes");
  CHECK(Message(straggler::common::ValidateJobId("job_id", "")) == "job_id must not be empty");
  CHECK_THAT(Message(straggler::common::ValidateJobId("job_id", std::string(129, 'x'))),
             Catch::Contains("is 129 bytes; at most 128") && Catch::Contains("'..."));
  // Control and non-ASCII bytes are shown escaped, never raw.
  CHECK_THAT(Message(straggler::common::ValidateJobId("job_id", std::string("a\nb\xff", 4))),
             Catch::Contains("'a\\nb\\xff'") && Catch::Contains("'\\n' at byte 1"));
  CHECK_THAT(Message(straggler::common::ValidateJobId("job_id", "a/b")),
             Catch::Contains("'/' at byte 1"));
}

TEST_CASE("hello checks cover every field a stream's first batch sets") {
  const uint32_t max_ranks = 8;
  CHECK(straggler::common::ValidateHello(GoodHello(), max_ranks).ok());

  straggler::common::StreamHello h = GoodHello();
  h.node = "node\x01";
  CHECK_THAT(Message(straggler::common::ValidateHello(h, max_ranks)),
             Catch::Contains("hello.node 'node\\x01' has byte 0x01 at 4"));
  h = GoodHello();
  h.node = std::string(256, 'n');
  CHECK_THAT(Message(straggler::common::ValidateHello(h, max_ranks)),
             Catch::Contains("hello.node") && Catch::Contains("256 bytes; at most 255"));
  h = GoodHello();
  h.client_version = "v\t1";
  CHECK_THAT(Message(straggler::common::ValidateHello(h, max_ranks)),
             Catch::Contains("hello.client_version"));
  h = GoodHello();
  h.world_size = 9;
  CHECK(Message(straggler::common::ValidateHello(h, max_ranks)) ==
        "hello.world_size=9 exceeds limits.max_ranks_per_job=8");
  h = GoodHello();
  h.ranks = {4};
  CHECK_THAT(Message(straggler::common::ValidateHello(h, max_ranks)),
             Catch::Contains("hello rank 4 >= world_size=4"));
  h = GoodHello();
  h.job_id = "x y";
  CHECK_THAT(Message(straggler::common::ValidateHello(h, max_ranks)),
             Catch::StartsWith("hello.job_id 'x y'"));
}

TEST_CASE("hello known_excluded: a reason the daemon publishes, a bounded clean detail") {
  namespace eng = straggler::engine;
  const uint32_t max_ranks = 8;
  straggler::common::StreamHello h = GoodHello();
  h.known_membership_version = 3;
  h.known_excluded = {{2, eng::ExclusionReason::kForced, "forced out by an operator", 10}};
  CHECK(straggler::common::ValidateHello(h, max_ranks).ok());

  // From the wire: FromProto keeps the value it does not know for the message.
  v1::StreamHello wire;
  wire.set_job_id("j");
  wire.set_world_size(4);
  wire.add_ranks(0);
  wire.set_known_membership_version(3);
  v1::ExcludedRank* x = wire.add_known_excluded();
  x->set_rank(2);
  x->set_reason(static_cast<v1::ExclusionReason>(99));
  CHECK(Message(straggler::common::ValidateHello(straggler::common::FromProto(wire), max_ranks)) ==
        "hello.known_excluded rank 2 reason=99 is not an exclusion reason; allowed: "
        "EXCLUSION_REASON_STRAGGLER, _UNRESPONSIVE, _FORCED, _PROBATION_END, _REPLICA");
  x->set_reason(v1::EXCLUSION_REASON_UNSPECIFIED);
  CHECK_THAT(Message(straggler::common::ValidateHello(straggler::common::FromProto(wire), max_ranks)),
             Catch::StartsWith("hello.known_excluded rank 2 reason=0 "
                               "(EXCLUSION_REASON_UNSPECIFIED) is not an exclusion reason"));
  x->set_reason(v1::EXCLUSION_REASON_STRAGGLER);
  x->set_detail("slow\r\nINFO forged log line");
  CHECK(Message(straggler::common::ValidateHello(straggler::common::FromProto(wire), max_ranks)) ==
        "hello.known_excluded rank 2 detail 'slow\\r\\nINFO forged log line' has control "
        "character 0x0d at byte 4");
  x->set_detail(std::string(1025, 'd'));
  CHECK_THAT(Message(straggler::common::ValidateHello(straggler::common::FromProto(wire), max_ranks)),
             Catch::Contains("hello.known_excluded rank 2 detail 'ddd") &&
                 Catch::Contains("'... is 1025 bytes; at most 1024"));
  x->set_detail(std::string(1024, 'd'));
  CHECK(straggler::common::ValidateHello(straggler::common::FromProto(wire), max_ranks).ok());
  // A hello built in code: its engine reason is checked.
  h.known_excluded[0].reason = eng::ExclusionReason::kNone;
  CHECK_THAT(Message(straggler::common::ValidateHello(h, max_ranks)),
             Catch::Contains("rank 2 reason=0 (EXCLUSION_REASON_UNSPECIFIED)"));
}

TEST_CASE("hello known_excluded: a replica's culprit fields are read and bounded") {
  // A daemon restarted without its database takes the held set over with
  // them (docs/hybrid.md, "A restarted daemon").
  const uint32_t max_ranks = 8;
  v1::StreamHello wire;
  wire.set_job_id("j");
  wire.set_world_size(4);
  wire.add_ranks(0);
  wire.set_known_membership_version(3);
  v1::ExcludedRank* x = wire.add_known_excluded();
  x->set_rank(3);
  x->set_reason(v1::EXCLUSION_REASON_REPLICA);
  x->set_culprit_rank(1);
  x->set_culprit_peer_group("stage0");
  x->set_replica(1);
  const straggler::common::StreamHello h = straggler::common::FromProto(wire);
  REQUIRE(h.known_excluded.size() == 1);
  CHECK(h.known_excluded[0].culprit == std::optional<uint32_t>(1));
  CHECK(h.known_excluded[0].culprit_group == "stage0");
  CHECK(h.known_excluded[0].replica == std::optional<uint32_t>(1));
  CHECK(straggler::common::ValidateHello(h, max_ranks).ok());
  x->set_culprit_rank(4);
  CHECK(Message(straggler::common::ValidateHello(straggler::common::FromProto(wire), max_ranks)) ==
        "hello.known_excluded rank 3 culprit_rank=4 >= world_size=4 of job 'j'");
  x->set_culprit_rank(1);
  x->set_replica(7);
  CHECK(Message(straggler::common::ValidateHello(straggler::common::FromProto(wire), max_ranks)) ==
        "hello.known_excluded rank 3 replica=7 >= world_size=4 of job 'j'");
  x->set_replica(1);
  x->set_culprit_peer_group("stage 0");
  CHECK_THAT(Message(straggler::common::ValidateHello(straggler::common::FromProto(wire), max_ranks)),
             Catch::StartsWith("hello.known_excluded rank 3 culprit_peer_group 'stage 0' has ' ' "
                               "at byte 5; allowed: "));
  x->set_culprit_peer_group(std::string(65, 'g'));
  CHECK_THAT(Message(straggler::common::ValidateHello(straggler::common::FromProto(wire), max_ranks)),
             Catch::EndsWith("is 65 bytes; at most 64"));
  x->clear_culprit_rank();
  x->clear_replica();
  x->clear_culprit_peer_group();
  const straggler::common::StreamHello pure = straggler::common::FromProto(wire);
  CHECK_FALSE(pure.known_excluded[0].culprit.has_value());
  CHECK_FALSE(pure.known_excluded[0].replica.has_value());
  CHECK(straggler::common::ValidateHello(pure, max_ranks).ok());
}

TEST_CASE("override reasons: no control characters, at most 1024 bytes") {
  CHECK(straggler::common::ValidateReason("").ok());
  CHECK(straggler::common::ValidateReason("ECC errors on gpu3 (ticket #42) \xc3\xa9").ok());
  CHECK_THAT(Message(straggler::common::ValidateReason("a\nb")),
             Catch::Contains("control character 0x0a at byte 1"));
  CHECK_THAT(Message(straggler::common::ValidateReason(std::string(1025, 'r'))),
             Catch::Contains("1025 bytes; at most 1024"));
}

TEST_CASE("telemetry: a non-printable or overlong GPU uuid is refused") {
  v1::GpuTelemetry t;
  t.set_gpu_index(2);
  t.set_uuid("GPU-8f0c1d2e-0000-1111-2222-333344445555");
  CHECK(straggler::common::ValidateTelemetry(t).ok());
  t.set_uuid(std::string(97, 'u'));
  CHECK_THAT(Message(straggler::common::ValidateTelemetry(t)),
             Catch::Contains("telemetry of gpu 2: uuid") && Catch::Contains("at most 96"));
  t.set_uuid("GPU-\x7f");
  CHECK_THAT(Message(straggler::common::ValidateTelemetry(t)), Catch::Contains("byte 0x7f"));
}

TEST_CASE("report timestamps far outside engine time saturate instead of overflowing") {
  google::protobuf::Timestamp t;
  t.set_seconds(9'223'372'035);  // just inside the range the conversion computes
  t.set_nanos(2'000'000'000);    // not a valid Timestamp, but the wire allows it
  CHECK(straggler::common::FromProto(t) == straggler::engine::Time::max());
  t.set_seconds(-9'223'372'035);
  t.set_nanos(-2'000'000'000);
  CHECK(straggler::common::FromProto(t) == straggler::engine::Time::min());
  t.set_seconds(1);
  t.set_nanos(5);
  CHECK(straggler::common::FromProto(t) == straggler::engine::Time(1'000'000'005));
}

TEST_CASE("wire compatibility: a report's start from start_unix_nanos, or a 0.1 client's start_time") {
  // docs/api.md, "Wire compatibility": either encoding works with either
  // release; the fixed64 wins when both are set.
  v1::IterationReport r;
  r.set_rank(1);
  r.set_iteration(7);
  r.set_compute_seconds(0.25);
  CHECK(straggler::common::FromProto(r).start_time == straggler::engine::Time(0));  // absent
  r.mutable_start_time()->set_seconds(1'700'000'000);
  r.mutable_start_time()->set_nanos(5);
  CHECK(straggler::common::FromProto(r).start_time ==
        straggler::engine::Time(1'700'000'000'000'000'005));
  r.set_start_unix_nanos(1'800'000'000'000'000'009);
  CHECK(straggler::common::FromProto(r).start_time ==
        straggler::engine::Time(1'800'000'000'000'000'009));
  r.clear_start_time();
  r.set_start_unix_nanos(~uint64_t{0});  // no time: saturates, no negative
  CHECK(straggler::common::FromProto(r).start_time == straggler::engine::Time::max());
}

TEST_CASE("report work and phases: carried to the engine's report, absent stays absent") {
  // Issue 31 (docs/api.md, "Wire compatibility"): optional fields; the
  // engine checks them (engine:input "work and phases").
  v1::IterationReport r;
  r.set_rank(2);
  r.set_iteration(9);
  r.set_compute_seconds(0.1);
  straggler::engine::Report e = straggler::common::FromProto(r);
  CHECK_FALSE(e.work.has_value());
  CHECK_FALSE(e.input_wait_seconds.has_value());
  CHECK_FALSE(e.optimizer_seconds.has_value());
  r.set_work(1e-9);
  r.set_input_wait_seconds(0);
  r.set_optimizer_seconds(3600.25);
  e = straggler::common::FromProto(r);
  CHECK(e.work == 1e-9);
  CHECK(e.input_wait_seconds == 0.0);
  CHECK(e.optimizer_seconds == 3600.25);
}

TEST_CASE("REST routing: route, method, percent-encoding") {
  auto route = [](absl::string_view method, absl::string_view target) {
    return sd::MatchRoute(method, target);
  };
  auto m = route("GET", "/v1/jobs/a%2Fb/workers/3?x=1");
  REQUIRE(std::holds_alternative<sd::RouteMatch>(m));
  CHECK(std::get<sd::RouteMatch>(m).id == sd::RouteId::kWorker);
  CHECK(std::get<sd::RouteMatch>(m).segments[2] == "a/b");
  CHECK(std::get<sd::RouteMatch>(route("HEAD", "/metrics")).id == sd::RouteId::kMetrics);

  auto e = route("DELETE", "/v1/jobs");
  REQUIRE(std::holds_alternative<sd::RestError>(e));
  CHECK(std::get<sd::RestError>(e).http_status == 405);
  CHECK(std::get<sd::RestError>(e).allow == "GET, HEAD");
  CHECK(std::get<sd::RestError>(route("GET", "/v1/nope")).http_status == 404);
  CHECK(std::get<sd::RestError>(route("GET", "/v1/jobs//workers")).http_status == 404);
  CHECK(std::get<sd::RestError>(route("GET", "relative")).http_status == 404);
  const sd::RestError bad = std::get<sd::RestError>(route("GET", "/v1/jobs/%zz"));
  CHECK(bad.http_status == 400);
  CHECK_THAT(bad.message, Catch::Contains("/v1/jobs/%zz"));
}

TEST_CASE("REST parameters: each parsed into the api request or refused by name") {
  auto call = [](absl::string_view method, absl::string_view target, absl::string_view body = "") {
    auto m = sd::MatchRoute(method, target);
    REQUIRE(std::holds_alternative<sd::RouteMatch>(m));
    return sd::ParseRestCall(std::get<sd::RouteMatch>(m), target, body);
  };
  auto events = call("GET", "/v1/jobs/j/events?since=7&limit=20");
  REQUIRE(events.ok());
  const auto& ev = std::get<v1::ListEventsRequest>(*events);
  CHECK(ev.job_id() == "j");
  CHECK(ev.since_sequence() == 7);
  CHECK(ev.limit() == 20);

  CHECK(Message(call("GET", "/v1/events?limit=10001").status()) ==
        "query parameter limit='10001' is not an integer from 0 to 10000");
  CHECK_THAT(Message(call("GET", "/v1/events?since_time=noon").status()),
             Catch::Contains("since_time='noon' is not an RFC 3339 time"));
  CHECK_THAT(Message(call("GET", "/v1/jobs?verbose=1").status()),
             Catch::Contains("unknown query parameter 'verbose'"));
  CHECK_THAT(Message(call("GET", "/v1/events?limit=1&limit=2").status()),
             Catch::Contains("'limit' given more than once"));
  CHECK(Message(call("GET", "/v1/jobs/j/workers/x1").status()) ==
        "rank 'x1' is not a non-negative integer");
  CHECK_THAT(Message(call("GET", "/v1/jobs/j/workers/4294967296").status()),
             Catch::Contains("out of range"));

  auto o = call("PUT", "/v1/jobs/j/workers/2/override",
                R"({"override": "force_exclude", "reason": "ECC"})");
  REQUIRE(o.ok());
  CHECK(std::get<v1::SetRankOverrideRequest>(*o).override() == v1::RANK_OVERRIDE_FORCE_EXCLUDE);
  CHECK(std::get<v1::SetRankOverrideRequest>(*o).rank() == 2);
  CHECK_THAT(Message(call("PUT", "/v1/jobs/j/workers/2/override", R"({"override": "out"})").status()),
             Catch::Contains("override 'out' is not one of"));
  CHECK_THAT(Message(call("PUT", "/v1/jobs/j/policy", R"({"limitt": 3})").status()),
             Catch::Contains("unknown field 'limitt'"));
  CHECK_THAT(Message(call("POST", "/v1/jobs/j/reset", "[]").status()),
             Catch::Contains("not valid reset"));
  CHECK(call("POST", "/v1/jobs/j/reset", " {} ").ok());
}

TEST_CASE("REST errors show client values C-escaped and cut, never raw") {
  auto call = [](absl::string_view method, absl::string_view target, absl::string_view body = "") {
    auto m = sd::MatchRoute(method, target);
    REQUIRE(std::holds_alternative<sd::RouteMatch>(m));
    return sd::ParseRestCall(std::get<sd::RouteMatch>(m), target, body);
  };
  auto error = [](absl::string_view method, absl::string_view target) {
    auto m = sd::MatchRoute(method, target);
    REQUIRE(std::holds_alternative<sd::RestError>(m));
    return std::get<sd::RestError>(m);
  };
  // No control byte of a client value reaches a message (or a log line).
  auto clean = [](const std::string& message) {
    return std::none_of(message.begin(), message.end(),
                        [](char c) { return static_cast<unsigned char>(c) < 0x20; });
  };
  std::string m = Message(call("GET", "/v1/jobs/j/workers/a%0Ab").status());
  CHECK(m == "rank 'a\\nb' is not a non-negative integer");
  m = Message(call("GET", "/v1/jobs?%0Ax=1").status());
  CHECK_THAT(m, Catch::Contains("unknown query parameter '\\nx'"));
  CHECK(clean(m));
  m = Message(call("GET", "/v1/events?since_time=12%0D").status());
  CHECK_THAT(m, Catch::Contains("since_time='12\\r'"));
  m = Message(call("PUT", "/v1/jobs/j/workers/2/override", "{\"override\": \"out\\u0007\"}").status());
  CHECK_THAT(m, Catch::Contains("override 'out\\x07' is not one of"));
  m = Message(call("PUT", "/v1/jobs/j/policy", "{\"a\\u0001\": 3}").status());
  CHECK_THAT(m, Catch::Contains("unknown field 'a\\x01'"));
  CHECK(clean(m));
  m = Message(call("PUT", "/v1/jobs/j/workers/2/override", R"({"override": 3})").status());
  CHECK(m == "field 'override' of the override body must be a string, not '3'");
  m = Message(call("PUT", "/v1/jobs/j/workers/2/override", R"({"reason": {"a": [true]}})").status());
  // Quoted escapes quotes too.
  CHECK_THAT(m, Catch::EndsWith("must be a string, not '{\\\"a\\\":[true]}'"));

  // Long values are cut with "...".
  m = Message(call("GET", "/v1/events?limit=" + std::string(5000, '9')).status());
  CHECK_THAT(m, Catch::Contains("'...") && Catch::Contains("0 to 10000"));
  CHECK(m.size() < 200);
  m = Message(call("GET", "/v1/jobs?" + std::string(5000, 'p') + "=1").status());
  CHECK(m.size() < 400);

  // Routing errors: the target and method as sent, escaped.
  sd::RestError e = error("GET", "/nope\xff\n");
  CHECK(e.http_status == 404);
  CHECK(e.message == "no such path: '/nope\\xff\\n'");
  e = error("G\x01T", "/v1/jobs");
  CHECK(e.http_status == 405);
  CHECK(e.message == "'G\\x01T' is not allowed on '/v1/jobs' (allowed: GET, HEAD)");
  e = error("GET", "/v1/jobs/%zz\x02");
  CHECK(e.http_status == 400);
  CHECK(e.message == "bad percent-encoding in path '/v1/jobs/%zz\\x02'");
  CHECK(Message(call("GET", "/v1/events?limit=%zz\x03").status()) ==
        "bad percent-encoding in the query string 'limit=%zz\\x03'");
  e = error("GET", "/" + std::string(5000, 'x'));
  CHECK(e.message.size() < 400);
}

TEST_CASE("token bucket: starts full, refills at the rate, never above the burst") {
  using namespace std::chrono_literals;
  const auto t0 = std::chrono::steady_clock::time_point() + 1h;
  // Rates and times chosen so that every token count is exact in binary.
  straggler::common::TokenBucket bucket(8, 50, t0);
  CHECK(bucket.Take(80, t0) == 50);  // the burst, not more
  CHECK(bucket.Take(1, t0) == 0);
  CHECK(bucket.Take(100, t0 + 2s) == 16);  // 2 s at 8/s
  CHECK(bucket.Take(100, t0 + 1s) == 0);   // time going backwards adds nothing
  CHECK(bucket.Take(100, t0 + 1h) == 50);  // a long pause refills to the burst only
  CHECK(bucket.Take(3, t0 + 1h + 187500us) == 1);  // 1.5 tokens: whole ones only
  CHECK(bucket.Take(2, t0 + 1h + 250000us) == 1);  // the half left plus 0.5 more

  straggler::common::TokenBucket unlimited(0, 1, t0);  // rate 0: no limit
  CHECK(unlimited.Take(1'000'000, t0) == 1'000'000);
}

TEST_CASE("log budget: the first N per interval are logged, the rest summed up once it ends") {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0{};
  straggler::common::LogBudget budget(3, std::chrono::seconds(10));
  int logged = 0;
  for (int i = 0; i < 10000; ++i) logged += budget.Take(t0 + std::chrono::milliseconds(i)) ? 1 : 0;
  CHECK(logged == 3);
  // Not summed up while the interval runs.
  CHECK(budget.TakeSuppressed(t0 + std::chrono::seconds(9)) == 0);
  CHECK(budget.TakeSuppressed(t0 + std::chrono::seconds(10)) == 9997);
  CHECK(budget.TakeSuppressed(t0 + std::chrono::seconds(11)) == 0);  // handed over once
  // A new interval logs again.
  CHECK(budget.Take(t0 + std::chrono::seconds(12)));
  CHECK(budget.TakeSuppressed(t0 + std::chrono::seconds(30)) == 0);  // nothing suppressed
}

// The wire mapping is made from PolicyFields() by name (policy_convert.cc):
// a row without its v1.PolicyConfig field, or of another type, would be
// dropped or crash the reflection; a wire field without a row would never
// reach the engine.
TEST_CASE("policy wire mapping: every PolicyFields row is the v1.PolicyConfig field of its name") {
  namespace pb = google::protobuf;
  const pb::Descriptor* message = v1::PolicyConfig::descriptor();
  for (const auto& f : straggler::engine::PolicyFields()) {
    INFO("policy field " << f.name);
    const pb::FieldDescriptor* wire = message->FindFieldByName(f.name);
    REQUIRE(wire != nullptr);
    const pb::FieldDescriptor::CppType want = std::visit(
        [](auto member) {
          using T = std::remove_reference_t<
              decltype(std::declval<straggler::engine::PolicyConfig&>().*member)>;
          if constexpr (std::is_same_v<T, uint32_t>) return pb::FieldDescriptor::CPPTYPE_UINT32;
          if constexpr (std::is_same_v<T, double>) return pb::FieldDescriptor::CPPTYPE_DOUBLE;
          if constexpr (std::is_same_v<T, bool>) return pb::FieldDescriptor::CPPTYPE_BOOL;
          return pb::FieldDescriptor::CPPTYPE_ENUM;
        },
        f.member);
    CHECK(wire->cpp_type() == want);
  }
  CHECK(static_cast<size_t>(message->field_count()) == straggler::engine::PolicyFields().size());
}

TEST_CASE("policy wire mapping: each field alone goes out with ToProto and back with MergePolicy") {
  using straggler::engine::PolicyConfig;
  size_t checked = 0;
  for (const auto& f : straggler::engine::PolicyFields()) {
    INFO("policy field " << f.name);
    // The defaults with this one field moved to another value within its
    // bounds; a value the cross-field rules refuse is skipped.
    PolicyConfig changed;
    bool numeric = true;
    std::visit(
        [&](auto member) {
          auto& v = changed.*member;
          using T = std::remove_reference_t<decltype(v)>;
          if constexpr (std::is_same_v<T, uint32_t>) {
            v = v + 1 <= f.max ? v + 1 : v - 1;
          } else if constexpr (std::is_same_v<T, double>) {
            v = v * 1.01 + 0.001 <= f.max ? v * 1.01 + 0.001 : (v + f.min) / 2;
          } else if constexpr (std::is_same_v<T, bool>) {
            v = !v;
          } else {
            numeric = false;
          }
        },
        f.member);
    if (!numeric || !changed.Validate().ok()) continue;
    v1::PolicyConfig wire;
    sd::ToProto(changed, &wire);
    // Sent alone (as SetPolicy sends one changed field) onto the defaults.
    v1::PolicyConfig alone;
    const auto* field = v1::PolicyConfig::descriptor()->FindFieldByName(f.name);
    REQUIRE(field != nullptr);
    const auto* r = v1::PolicyConfig::GetReflection();
    switch (field->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(&alone, field, r->GetUInt32(wire, field));
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(&alone, field, r->GetDouble(wire, field));
        break;
      default:
        r->SetBool(&alone, field, r->GetBool(wire, field));
    }
    absl::StatusOr<PolicyConfig> merged = sd::MergePolicy(alone, PolicyConfig{});
    INFO(merged.status().message());
    REQUIRE(merged.ok());
    // Every field equals `changed`: the one sent, and the defaults.
    for (const auto& g : straggler::engine::PolicyFields()) {
      INFO("compared field " << g.name);
      std::visit([&](auto member) { CHECK(((*merged).*member == changed.*member)); }, g.member);
    }
    ++checked;
  }
  CHECK(checked >= straggler::engine::PolicyFields().size() - 4);
}

// straggler.proto is the one table of enum names: stragglerctl's --kind,
// --recovery and events --kind take them from the descriptors.
TEST_CASE("enum names: short names from the descriptor, unspecified and unknown text refused") {
  const auto* kinds = v1::PolicyKind_descriptor();
  CHECK(v1::EnumValuePrefix(kinds) == "POLICY_KIND_");
  CHECK(v1::EnumShortName(kinds, v1::POLICY_KIND_PEER) == "peer");
  CHECK(v1::EnumShortName(kinds, v1::POLICY_KIND_UNSPECIFIED) == "");
  CHECK(v1::EnumShortName(kinds, 999) == "");
  // In the .proto's order; the kinds' list is checked against the engine's
  // (policy wire mapping, below), so a new kind changes no test.
  CHECK(v1::EnumShortNames(v1::RecoveryMode_descriptor()) ==
        std::vector<std::string>{"shadow", "probation"});
  CHECK(v1::ParseEnumShortName(kinds, "ewma") == std::optional<int>(v1::POLICY_KIND_EWMA));
  CHECK(v1::ParseEnumShortName(kinds, "unspecified") == std::nullopt);
  CHECK(v1::ParseEnumShortName(kinds, "EWMA") == std::nullopt);
  CHECK(v1::ParseEnumShortName(kinds, "") == std::nullopt);
  const auto* events = v1::EventKind_descriptor();
  CHECK(v1::EnumValuePrefix(events) == "EVENT_KIND_");
  CHECK(v1::ParseEnumShortName(events, "membership_withheld") ==
        std::optional<int>(v1::EVENT_KIND_MEMBERSHIP_WITHHELD));
}

// policy_convert.cc maps the two enums by name: an engine kind or mode
// without its v1 value of the same name would go out as unspecified.
TEST_CASE("policy wire mapping: every PolicyKind and RecoveryMode is the v1 value of its name") {
  using straggler::engine::PolicyConfig;
  for (auto kind : straggler::engine::kPolicyKinds) {
    const std::string name(straggler::engine::PolicyKindName(kind));
    INFO("kind " << name);
    const v1::PolicyKind wire = sd::ToProto(kind);
    CHECK(wire != v1::POLICY_KIND_UNSPECIFIED);
    CHECK(v1::EnumShortName(v1::PolicyKind_descriptor(), wire) == name);
    v1::PolicyConfig update;
    update.set_kind(wire);
    update.set_static_threshold_seconds(0.5);  // static needs one; the others ignore it
    auto merged = sd::MergePolicy(update, PolicyConfig{});
    INFO(merged.status().message());
    REQUIRE(merged.ok());
    CHECK(merged->kind == kind);
  }
  for (auto mode : straggler::engine::kRecoveryModes) {
    const std::string name(straggler::engine::RecoveryModeName(mode));
    INFO("recovery " << name);
    const v1::RecoveryMode wire = sd::ToProto(mode);
    CHECK(wire != v1::RECOVERY_MODE_UNSPECIFIED);
    CHECK(v1::EnumShortName(v1::RecoveryMode_descriptor(), wire) == name);
    v1::PolicyConfig update;
    update.set_recovery(wire);
    auto merged = sd::MergePolicy(update, PolicyConfig{});
    REQUIRE(merged.ok());
    CHECK(merged->recovery == mode);
  }
  // Every v1 value has its engine kind, and a number of neither is refused.
  CHECK(v1::EnumShortNames(v1::PolicyKind_descriptor()).size() ==
        std::size(straggler::engine::kPolicyKinds));
  CHECK(v1::EnumShortNames(v1::RecoveryMode_descriptor()).size() ==
        std::size(straggler::engine::kRecoveryModes));
  v1::PolicyConfig bad;
  bad.set_kind(static_cast<v1::PolicyKind>(99));
  CHECK(sd::MergePolicy(bad, PolicyConfig{}).status().message() == "kind=99 is not a PolicyKind");
  v1::PolicyConfig bad_mode;
  bad_mode.set_recovery(static_cast<v1::RecoveryMode>(9));
  CHECK(sd::MergePolicy(bad_mode, PolicyConfig{}).status().message() ==
        "recovery=9 is not a RecoveryMode");
}
