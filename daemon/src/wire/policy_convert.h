// The policy conversions between straggler.v1 and the engine: what SetPolicy
// (gRPC and REST, api.h) and the state database's restore do with a
// PolicyConfig message. Apart from the rest of convert.h so that the input
// library (straggler_daemon_input), and with it the fuzz targets, holds the
// same conversion the services run; convert.h re-exports these.
//
//   absl::StatusOr<engine::PolicyConfig> p = MergePolicy(request.policy(), current);
//
// Pure functions; no shared state.
#pragma once

#include "absl/status/statusor.h"
#include "straggler/engine/policy.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::daemon {

namespace v1 = ::straggler::v1;

v1::PolicyKind ToProto(engine::PolicyKind k);
v1::RecoveryMode ToProto(engine::RecoveryMode m);

// Every field set.
void ToProto(const engine::PolicyConfig& p, v1::PolicyConfig* out);

// `base` with the fields set in `update` replaced, validated against the
// PolicyFields() bounds (engine/policy.h). INVALID_ARGUMENT names the field
// and the value ("threshold_factor=0.5 must be > 1", "kind=7 is not a
// PolicyKind").
absl::StatusOr<engine::PolicyConfig> MergePolicy(const v1::PolicyConfig& update,
                                                 engine::PolicyConfig base);

}  // namespace straggler::daemon
