// libFuzzer target: a SetPolicy request as a caller with a token controls it,
// through the conversion both entry points run. The first input byte picks
// the entry point and the job's current policy; the rest is the body:
//   - byte & 1 == 0: REST, the JSON body of PUT /v1/jobs/{job}/policy, routed
//     and parsed by rest_route.h as HttpServer does;
//   - byte & 1 == 1: gRPC, a serialized SetPolicyRequest;
//   - (byte >> 1) % 3: the job's policy before the call (the default, a
//     static one, an ewma one with probation).
// Both then go through MergePolicy (wire/policy_convert.h) and the engine's
// SetPolicy, as api::SetPolicy does. Invariants (issue 15): every accepted
// policy lies within the PolicyFields() bounds, is finite and reads back the
// same through the wire; every refusal is INVALID_ARGUMENT and names the
// field ("threshold_factor=0.5 must be > 1").
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>

#include <google/protobuf/stubs/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "api/rest_route.h"
#include "policy_bounds.h"
#include "require.h"
#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"
#include "straggler/v1/straggler.pb.h"
#include "wire/policy_convert.h"

namespace sd = straggler::daemon;
namespace engine = straggler::engine;
namespace v1 = straggler::v1;

namespace {

constexpr const char* kTarget = "fuzz_policy";
constexpr absl::string_view kPath = "/v1/jobs/job-1/policy";

void Require(bool ok, const char* what) { straggler::fuzz::Require(ok, kTarget, what); }

engine::PolicyConfig Base(uint8_t pick) {
  engine::PolicyConfig p;
  if (pick == 1) {
    p.kind = engine::PolicyKind::kStatic;
    p.static_threshold_seconds = 0.5;
  } else if (pick == 2) {
    p.kind = engine::PolicyKind::kEwma;
    p.recovery = engine::RecoveryMode::kProbation;
    p.limit = 8;
    p.rejoin_mark = 7;  // a smaller `limit` in the update must be refused
  }
  return p;
}

// A refusal of the policy names the field it refuses: "<field>=<value> ...".
bool NamesAField(absl::string_view message) {
  for (const engine::PolicyField& f : engine::PolicyFields()) {
    if (absl::StartsWith(message, absl::StrCat(f.name, "="))) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 refusals: expected
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const absl::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const engine::PolicyConfig base = Base(static_cast<uint8_t>((mode >> 1) % 3));

  v1::SetPolicyRequest request;
  if ((mode & 1) == 0) {
    auto matched = sd::MatchRoute("PUT", kPath);
    Require(std::holds_alternative<sd::RouteMatch>(matched), "the policy route does not match");
    absl::StatusOr<sd::RestCall> call =
        sd::ParseRestCall(std::get<sd::RouteMatch>(matched), kPath, body);
    if (!call.ok()) {  // not a PolicyConfig JSON object: refused before any policy
      Require(call.status().code() == absl::StatusCode::kInvalidArgument,
              "a policy body refused with another code");
      Require(!call.status().message().empty(), "a policy body refused without a message");
      return 0;
    }
    const auto* parsed = std::get_if<v1::SetPolicyRequest>(&*call);
    Require(parsed != nullptr, "PUT .../policy parsed into another request");
    Require(parsed->job_id() == "job-1", "the job id of the path was lost");
    request = *parsed;
  } else if (!request.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return 0;  // gRPC refuses what does not parse before the service sees it
  }

  absl::StatusOr<engine::PolicyConfig> merged = sd::MergePolicy(request.policy(), base);
  if (!merged.ok()) {
    Require(merged.status().code() == absl::StatusCode::kInvalidArgument,
            "a policy refused with another code");
    Require(NamesAField(merged.status().message()), "a policy refusal that names no field");
    return 0;
  }
  Require(merged->Validate().ok(), "an accepted policy fails Validate");
  straggler::fuzz::RequireWithinBounds(*merged, kTarget);
  if (!request.policy().has_limit() && !request.policy().has_rejoin_mark()) {
    Require(merged->limit == base.limit && merged->rejoin_mark == base.rejoin_mark,
            "a field the request did not set changed");
  }

  // What the daemon stores and serves back (GetJob, the state database):
  // every field set, merged over anything, gives the same policy.
  v1::PolicyConfig wire;
  sd::ToProto(*merged, &wire);
  absl::StatusOr<engine::PolicyConfig> again = sd::MergePolicy(wire, engine::PolicyConfig());
  Require(again.ok(), "an accepted policy is refused when sent back");
  Require(engine::PolicyChanges(*merged, *again).empty(),
          "an accepted policy does not read back the same");

  // api::SetPolicy hands the merged policy to the job's engine.
  const engine::Time now(1'700'000'000'000'000'000);
  engine::JobEngine job(4, base, now);
  const absl::Status set = job.SetPolicy(*merged, now);
  Require(set.ok(), "the engine refuses a policy MergePolicy accepted");
  job.Tick(now + engine::SaturatingNanoseconds(merged->unresponsive_after_seconds) +
           engine::Time(1));
  return 0;
}
