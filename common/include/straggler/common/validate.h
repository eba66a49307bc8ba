// The checks on what a client sends in an ingest stream, and the wire ->
// value conversions they run on: job ids, hellos, reports and GPU telemetry.
// Kept apart from the registry and services (this file needs only the
// engine and the generated protos) so that the fuzz targets under fuzz/ can
// exercise exactly the code the daemon runs on untrusted input.
//
//   StreamHello hello = FromProto(batch.hello());
//   if (absl::Status s = ValidateHello(hello, limits.max_ranks_per_job); !s.ok()) ...
//   // "hello.job_id 'a b' has ' ' at byte 1; allowed: A-Z a-z 0-9 . _ -, 1 to 128 bytes"
//
// Every error is INVALID_ARGUMENT and names the field and the offending value
// (bytes outside printable ASCII shown C-escaped, long values cut).
// Pure functions; no shared state.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "straggler/engine/job_engine.h"
#include "straggler/v1/straggler.pb.h"
#include "straggler/v1/wire_rules.h"

namespace straggler::common {

namespace v1 = ::straggler::v1;

// Job ids: see straggler/v1/wire_rules.h (the client checks the same rule).
inline constexpr size_t kMaxJobIdBytes = v1::rules::kMaxJobIdBytes;
// StreamHello.node and client_version (printable ASCII) and the reason of
// SetRankOverride (no control characters) are at most these sizes.
inline constexpr size_t kMaxNodeBytes = 255;
inline constexpr size_t kMaxClientVersionBytes = 128;
inline constexpr size_t kMaxReasonBytes = 1024;
// ListEvents returns at most this many events per call (REST: a larger
// limit is an error; gRPC: clamped).
inline constexpr uint32_t kMaxEventLimit = 10000;
// GpuTelemetry.uuid ("GPU-" or "MIG-" and a UUID; MIG ids are longer).
inline constexpr size_t kMaxGpuUuidBytes = 96;

// A rank's declared place in a hybrid-parallel job (RankDevice.peer_group
// and replica; checked and kept by rank_topology.h, docs/topology.md).
struct DeclaredTopology {
  std::string peer_group;           // "" = the default group
  std::optional<uint32_t> replica;  // nullopt = a replica of its own
  std::string gpu_model;            // "" = unknown
  bool operator==(const DeclaredTopology&) const = default;
};

// One RankDevice of a hello: what the rank's client process declared.
struct TopologyClaim {
  uint32_t rank = 0;
  uint64_t incarnation = 0;  // the client process (0 = unknown)
  DeclaredTopology topology;
};

// What a stream's first message says, without wire types.
struct StreamHello {
  std::string job_id;
  std::string node;
  std::string client_version;
  std::vector<uint32_t> ranks;
  // Ranks whose client does not act on membership (monitoring only), sorted
  // and unique; ValidateHello requires each to be one of `ranks`.
  std::vector<uint32_t> monitor_only_ranks;
  uint32_t world_size = 0;
  uint64_t iterations_per_epoch = 0;
  // The newest membership the client holds (from an earlier daemon
  // incarnation, possibly): 0 = none.
  uint64_t known_membership_version = 0;
  uint64_t known_effective_iteration = 0;
  uint64_t known_incarnation = 0;  // daemon run that made that version; 0 = unknown
  std::vector<engine::ExcludedRank> known_excluded;  // that version's excluded ranks
  // known_excluded[i].reason as sent (FromProto turns a value it does not
  // know into kNone): ValidateHello names it. Empty for a hello built in
  // code, where known_excluded's reasons are checked instead.
  std::vector<int> known_excluded_wire_reasons;
  // The highest iteration the stream's ranks reported; nullopt = none yet.
  std::optional<uint64_t> reported_iteration;
  std::string run_id;  // "" = the job's default run (docs/runs.md)
  // (rank, client incarnation) from hello.devices, incarnation != 0 only.
  std::vector<std::pair<uint32_t, uint64_t>> rank_incarnations;
  // Every hello.devices entry's topology, unchecked (RankTopologies::Apply
  // checks it per rank, so a bad one costs that rank's claim only).
  std::vector<TopologyClaim> topologies;
};

// `field` names the value in the message ("hello.job_id", "job_id").
absl::Status ValidateJobId(absl::string_view field, absl::string_view job_id);

// The checks every hello passes, whether it opens a stream or adds ranks to
// one (JobRegistry::Attach, AddRanksLocked), and what the node agent checks
// before it opens a job's upstream stream: the job id, node and
// client_version as above, 0 < world_size <= max_ranks_per_job, at least one
// rank, every rank < world_size; each known_excluded rank < world_size, with a
// reason the daemon publishes (STRAGGLER, UNRESPONSIVE, FORCED,
// PROBATION_END) and a detail of at most kMaxReasonBytes without control
// characters (it is republished to every client and shown by stragglerctl);
// every monitor_only rank one of `ranks`.
absl::Status ValidateHello(const StreamHello& hello, uint32_t max_ranks_per_job);

// A stream opens with its hello: the first ReportBatch of an ingest stream
// (to the daemon, or to a node agent) must carry one.
absl::Status RequireHello(const v1::ReportBatch& first);

// A measured value that is negative, NaN, or a utilisation above 1, or a
// uuid that is too long or not printable (a broken sender; the sample is
// dropped, nothing else of the batch).
absl::Status ValidateTelemetry(const v1::GpuTelemetry& t);

// Host telemetry (docs/agent.md#host-telemetry): a share outside [0, 1], a
// negative or NaN period or rate, or a detail longer than
// kMaxHostDetailBytes or not printable. Dropped like a bad GPU sample.
inline constexpr size_t kMaxHostDetailBytes = 512;
absl::Status ValidateHostTelemetry(const v1::HostTelemetry& t);
absl::Status ValidateProcessTelemetry(const v1::ProcessTelemetry& p);

// SetRankOverride's reason (kept in the state database and logged): at most
// kMaxReasonBytes, no ASCII control characters (protobuf has checked UTF-8).
absl::Status ValidateReason(absl::string_view reason);

// The two text rules the wire uses (straggler/v1/wire_rules.h), with the
// daemon's wording. CheckPrintable: at most `max` bytes of printable ASCII
// ("FIELD 'v' has byte 0x01 at 4; allowed: printable ASCII"); CheckIdText:
// at most `max` bytes of the job-id characters ("FIELD 'v' has '/' at byte
// 2; allowed: A-Z a-z 0-9 . _ -" then `suffix`). Too long: "FIELD 'v...'...
// is N bytes; at most MAX". OK when the value passes.
absl::Status CheckPrintable(absl::string_view field, absl::string_view value, size_t max);
absl::Status CheckIdText(absl::string_view field, absl::string_view value, size_t max,
                         absl::string_view suffix = "");

// `value` for an error message: C-escaped, cut to `max` bytes with "...".
std::string Quoted(absl::string_view value, size_t max = 64);

engine::Time FromProto(const google::protobuf::Timestamp& t);  // saturates past 2262
engine::Report FromProto(const v1::IterationReport& r);
engine::ExclusionReason FromProto(v1::ExclusionReason r);
// The entry as the wire has it (not validated: ValidateHello checks a hello's).
engine::ExcludedRank FromProto(const v1::ExcludedRank& e);
StreamHello FromProto(const v1::StreamHello& h);  // ranks, monitor_only_ranks sorted and unique

}  // namespace straggler::common
