// The one place where engine values and straggler.v1 wire messages meet. Each
// conversion exists once; the query/admin core (api.h, behind gRPC and REST),
// the ingest service and the registry call these. A whole Job (and its
// workers, memberships, events) as messages: registry/job_proto.h.
//
//   v1::WorkerState s = ToProto(engine::WorkerState::kHealthy);
//   absl::StatusOr<engine::PolicyConfig> p = MergePolicy(request.policy(), current);
//
// Pure functions; no shared state.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "registry/attribution.h"
#include "straggler/engine/job_engine.h"
#include "straggler/v1/straggler.pb.h"
#include "straggler/common/validate.h"
#include "wire/policy_convert.h"

namespace straggler::daemon {

namespace v1 = ::straggler::v1;

void ToProto(engine::Time t, google::protobuf::Timestamp* out);

v1::WorkerState ToProto(engine::WorkerState s);
v1::ExclusionReason ToProto(engine::ExclusionReason r);
v1::RankOverride ToProto(engine::RankOverride o);
v1::EventKind ToProto(engine::EventKind k);
v1::LikelyCause ToProto(LikelyCause c);
// RANK_OVERRIDE_UNSPECIFIED is not an instruction: INVALID_ARGUMENT.
absl::StatusOr<engine::RankOverride> FromProto(v1::RankOverride o);
// INVALID_ARGUMENT for EVENT_KIND_UNSPECIFIED or a number no kind has.
absl::StatusOr<engine::EventKind> FromProto(v1::EventKind k);

// FromProto of Timestamp, IterationReport, ExclusionReason and StreamHello
// (straggler/common/validate.h), in the same overload set as the above.
using common::FromProto;

// A job, its workers, its memberships and its events: registry/job_proto.h.

// PolicyKind, RecoveryMode and PolicyConfig to proto, and MergePolicy:
// wire/policy_convert.h (in the input library, which the fuzz targets link).

// kMaxDirectiveRejections and MergeDirective: straggler/common/directive.h.

}  // namespace straggler::daemon
