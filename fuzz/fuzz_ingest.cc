// libFuzzer target: what an ingest stream's client controls. The input is a
// serialized ReportBatch; it goes through the daemon's own checks and
// conversions (validate.h) and, when its hello passes, through a job engine
// like IngestService's (every report, then a tick), so that both the checks
// and the engine's handling of whatever they let through are exercised.
// A crash, sanitizer finding or broken invariant below is a bug.
#include <cstddef>
#include <cstdint>
#include <optional>

#include <google/protobuf/stubs/logging.h>

#include "require.h"
#include "straggler/engine/job_engine.h"
#include "straggler/v1/straggler.pb.h"
#include "straggler/common/validate.h"

namespace v1 = straggler::v1;
using straggler::engine::Time;

namespace {

// Larger jobs are valid but only cost the fuzzer time per input.
constexpr uint32_t kMaxRanks = 256;

void Require(bool ok, const char* what) { straggler::fuzz::Require(ok, "fuzz_ingest", what); }

}  // namespace

// protobuf logs every string field with invalid UTF-8 it refuses to parse:
// expected here, and slow at fuzzing speed.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  v1::ReportBatch batch;
  if (!batch.ParseFromArray(data, static_cast<int>(size))) return 0;

  for (const v1::RankTelemetry& t : batch.telemetry()) {
    absl::Status s = straggler::common::ValidateTelemetry(t.gpu());
    Require(s.ok() || !s.message().empty(), "a telemetry refusal without a message");
  }
  if (!batch.has_hello()) return 0;
  const straggler::common::StreamHello hello = straggler::common::FromProto(batch.hello());
  const absl::Status valid = straggler::common::ValidateHello(hello, kMaxRanks);
  if (!valid.ok()) {
    Require(valid.code() == absl::StatusCode::kInvalidArgument, "hello refused with another code");
    Require(!valid.message().empty(), "a hello refusal without a message");
    return 0;
  }
  Require(straggler::common::ValidateJobId("job_id", hello.job_id).ok(),
          "an accepted hello's job id fails");
  Require(hello.world_size > 0 && hello.world_size <= kMaxRanks, "world_size out of bounds");

  // The daemon's own clock: reports carry no time the engine trusts.
  Time now = Time(1'700'000'000'000'000'000);
  straggler::engine::JobEngine engine(hello.world_size, straggler::engine::PolicyConfig(), now);
  // What JobRegistry::AdmitLocked does with a hello's fields.
  for (uint32_t r : hello.ranks) engine.Announce(r, now);
  if (hello.iterations_per_epoch > 0) engine.SetIterationsPerEpoch(hello.iterations_per_epoch);
  straggler::engine::Membership held;
  held.version = hello.known_membership_version;
  held.effective_iteration = hello.known_effective_iteration;
  held.excluded = hello.known_excluded;
  // What JobRegistry::CheckClaimsLocked refuses (docs/runs.md, "What a
  // hello may claim").
  if (const absl::Status claims = engine.CheckClaims(held, hello.reported_iteration);
      !claims.ok()) {
    Require(claims.code() == absl::StatusCode::kInvalidArgument && !claims.message().empty(),
            "a claim refused without INVALID_ARGUMENT and a message");
    return 0;
  }
  if (hello.reported_iteration) engine.NoteReportedIteration(*hello.reported_iteration);
  if (hello.known_membership_version > 0) engine.AdoptVersionFloor(held, now);
  std::optional<uint64_t> max_accepted;
  engine.BeginBatch();
  for (const v1::IterationReport& r : batch.reports()) {
    now += Time(1'000'000);
    straggler::engine::IngestResult result = engine.Ingest(straggler::common::FromProto(r), now);
    Require(result.accepted || !result.message.empty(), "a rejected report without a message");
    Require(!result.accepted || r.rank() < hello.world_size, "a report of a rank out of range");
    if (result.accepted) max_accepted = std::max(max_accepted.value_or(0), r.iteration());
  }
  engine.EndBatch(now);
  // IngestService's first-report re-check: a false reported_iteration must
  // not leave the membership out of the reports' reach.
  constexpr uint64_t kJump = straggler::engine::JobEngine::kMaxIterationJump;
  if (hello.reported_iteration && max_accepted && *hello.reported_iteration > *max_accepted &&
      *hello.reported_iteration - *max_accepted > kJump) {
    engine.DropClaims(now);
    constexpr uint64_t kMaxLead = 1000;  // policy.lead_iterations' upper bound
    Require(engine.membership().effective_iteration <=
                *max_accepted + kMaxLead + straggler::engine::JobEngine::kMaxAgreementInterval + 1,
            "a false claim kept the membership out of the reports' reach");
  }
  engine.Tick(now + Time(3'600'000'000'000));
  // A hello needs no token: nothing it says (a held FORCED exclusion
  // included) may become an operator's override.
  for (uint32_t r = 0; r < hello.world_size; ++r) {
    Require(engine.Worker(r).override == straggler::engine::RankOverride::kNone,
            "a hello set a rank override");
  }
  // A floor at or above 2^62 (version or iteration) is absurd and ignored.
  constexpr uint64_t kAbsurd = uint64_t{1} << 62;
  Require(engine.membership().version >= hello.known_membership_version ||
              hello.known_membership_version >= kAbsurd ||
              hello.known_effective_iteration >= kAbsurd,
          "membership below the version floor a client holds");
  return 0;
}
