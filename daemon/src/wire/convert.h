// The one place where engine types and straggler.v1 wire messages meet. Each
// conversion exists once; the query/admin core (api.h, behind gRPC and REST)
// and the ingest service call these.
//
//   v1::Membership m;
//   ToProto(job.engine.membership(), job.id, &m);
//   absl::StatusOr<engine::PolicyConfig> p = MergePolicy(request.policy(), current);
//
// Pure functions; no shared state.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "registry/job_registry.h"
#include "straggler/engine/job_engine.h"
#include "straggler/v1/straggler.pb.h"
#include "straggler/common/validate.h"

namespace straggler::daemon {

namespace v1 = ::straggler::v1;

void ToProto(engine::Time t, google::protobuf::Timestamp* out);

v1::WorkerState ToProto(engine::WorkerState s);
v1::ExclusionReason ToProto(engine::ExclusionReason r);
v1::RankOverride ToProto(engine::RankOverride o);
v1::EventKind ToProto(engine::EventKind k);
v1::PolicyKind ToProto(engine::PolicyKind k);
v1::RecoveryMode ToProto(engine::RecoveryMode m);
v1::LikelyCause ToProto(LikelyCause c);
// RANK_OVERRIDE_UNSPECIFIED is not an instruction: INVALID_ARGUMENT.
absl::StatusOr<engine::RankOverride> FromProto(v1::RankOverride o);
// INVALID_ARGUMENT for EVENT_KIND_UNSPECIFIED or a number no kind has.
absl::StatusOr<engine::EventKind> FromProto(v1::EventKind k);

// FromProto of Timestamp, IterationReport and StreamHello: validate.h.

// `job` supplies the id and the daemon incarnation stamped on the version.
void ToProto(const engine::Membership& m, const Job& job, v1::Membership* out);
void ToProto(const engine::WorkerView& w, const Job& job, v1::Worker* out);  // job.mu held
void ToProto(const Job& job, v1::Job* out);                                  // job.mu held
void ToProto(const JournalEntry& e, v1::Event* out);

// Every field set.
void ToProto(const engine::PolicyConfig& p, v1::PolicyConfig* out);
// `base` with the fields set in `update` replaced, validated. INVALID_ARGUMENT
// names the value ("threshold_factor=0.5 must be > 1").
absl::StatusOr<engine::PolicyConfig> MergePolicy(const v1::PolicyConfig& update,
                                                 engine::PolicyConfig base);

// Directives carry at most this many rejections; the counts carry the rest.
inline constexpr int kMaxDirectiveRejections = 8;

// A newer directive folded into a pending one: memberships are the union
// (ascending by version) capped to the newest kMembershipHistory versions (the
// engine keeps no more either, and a peer that stopped reading must cost
// bounded memory), acknowledgement is the newer one, progress is the union
// per rank (the higher iteration: a directive carries only the ranks its batch
// touched), counts add up over the batches the merged directive acknowledges.
// Used by every coalescing directive write slot (daemon streams, agent
// downstream streams).
void MergeDirective(v1::Directive& pending, v1::Directive&& newer);

}  // namespace straggler::daemon
