// Rules of the wire contract (straggler.proto) that protobuf cannot express,
// shared by the daemon's input validation (common/src/validate.cc) and the
// client library's early checks (ClientOptions::Validate), so that a value
// the client accepts is one the daemon accepts: a trainer with a bad job id
// fails at Client::Create, naming the value, instead of on every reconnect.
//
// Header-only, constexpr, no dependencies; safe from any thread.
#pragma once

#include <cstddef>
#include <string_view>

namespace straggler::v1::rules {

// Job ids: 1 to kMaxJobIdBytes bytes of A-Z a-z 0-9 . _ - (what Kubernetes,
// Slurm and torchrun ids use; safe in URLs, Prometheus labels and logs).
inline constexpr std::size_t kMaxJobIdBytes = 128;
inline constexpr std::string_view kJobIdAllowed = "A-Z a-z 0-9 . _ -";

constexpr bool IsJobIdChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// Printable ASCII, space included (node names, client versions, GPU models),
// and how errors name the rule (as kJobIdAllowed names IsJobIdChar's).
constexpr bool IsPrintableAscii(char c) { return c >= 0x20 && c <= 0x7e; }
inline constexpr std::string_view kPrintableAsciiAllowed = "printable ASCII";

// The rule of every bounded wire string: at most `max` bytes, each one that
// `allowed` accepts. A value that breaks it is either too long or has a
// first refused byte; the daemon (common::CheckIdText, CheckPrintable) and
// the client (ClientOptions::Validate) both find it here and word it
// themselves (the daemon as an absl::Status).
struct TextFault {
  bool too_long = false;                          // more than `max` bytes
  std::size_t bad_byte = std::string_view::npos;  // index of the first refused byte
};

// The length is checked first: a too long value is not searched.
template <typename Allowed>
constexpr TextFault FindTextFault(std::string_view value, std::size_t max, Allowed allowed) {
  if (value.size() > max) return {true, std::string_view::npos};
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (!allowed(value[i])) return {false, i};
  }
  return {};
}

// Peer groups (RankDevice.peer_group, docs/topology.md): 0 to
// kMaxPeerGroupBytes bytes of the job-id characters (IsJobIdChar); "" is
// the default group every rank is in unless it says.
inline constexpr std::size_t kMaxPeerGroupBytes = 64;

// GPU models (RankDevice.gpu_model, docs/topology.md): 0 to
// kMaxGpuModelBytes bytes of printable ASCII, space included ("NVIDIA H100
// 80GB HBM3", as torch.cuda.get_device_name() says; IsPrintableAscii);
// "" = unknown. Ranks naming different models are never peers.
inline constexpr std::size_t kMaxGpuModelBytes = 96;

// IterationReport.work (issue 31): the step's work in the job's own unit,
// finite and > 0 (a step of no work has no time per unit of work).
// IterationReport.input_wait_seconds and optimizer_seconds: finite and >= 0.
// NaN fails both (every comparison with it is false). The daemon refuses a
// report that breaks them (JobEngine::Ingest, which also bounds the phases
// by the job's policy); the C++ Report() does not check (it never
// branches on values), and trace CSVs are read by the same rules.
constexpr bool IsValidWork(double v) { return v > 0 && v <= 1.7976931348623157e308; }
constexpr bool IsValidPhaseSeconds(double v) { return v >= 0 && v <= 1.7976931348623157e308; }
inline constexpr std::string_view kWorkAllowed = "a finite number > 0";
inline constexpr std::string_view kPhaseSecondsAllowed = "a finite number >= 0";

// A redirect's trailing metadata (docs/cluster.md, "Redirects"): a replica
// that does not own a job ends the job's call with UNAVAILABLE and names the
// owner under these keys (lower case, as gRPC requires); clients and agents
// reconnect to kOwnerGrpcMetadata's address.
inline constexpr char kOwnerGrpcMetadata[] = "straggler-owner";       // host:port (gRPC)
inline constexpr char kOwnerHttpMetadata[] = "straggler-owner-http";  // host:port (HTTP)
inline constexpr char kOwnerIdMetadata[] = "straggler-owner-id";      // the replica's id

}  // namespace straggler::v1::rules
