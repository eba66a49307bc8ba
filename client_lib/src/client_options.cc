// ClientOptions: the environment lookup (FromEnv) and the checks (Validate)
// that Client::Create runs before it starts anything.
#include "client_options.h"

#include "straggler/stream/channel_pool.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "parse_unsigned.h"
#include "report_queue.h"
#include "straggler/v1/wire_rules.h"

namespace straggler {

namespace {

namespace pb = ::straggler::v1;
using detail::ParseUnsigned;

// True when `name` is set and parses; records the first parse error.
template <typename T>
bool ReadEnvUnsigned(const char* name, T* out, std::string* error) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  if (ParseUnsigned(std::string_view(v), out)) return true;
  if (error->empty())
    *error = std::string(name) + "='" + v + "' is not an unsigned integer (max " +
             std::to_string(std::numeric_limits<T>::max()) + ")";
  return false;
}

std::string RunIdFromEnv() {
  // torchrun sets TORCHELASTIC_RUN_ID to the literal "none" without
  // --rdzv_id or --standalone: that names no launch.
  for (const char* name : {"STRAGGLER_RUN_ID", "TORCHELASTIC_RUN_ID"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0' && std::string_view(v) != "none") return v;
  }
  return {};
}

// STRAGGLER_JOB_ID, else the launch's rendezvous id under torchrun (issue 28:
// a job id missing there stopped every rank of a monitoring-only job). torchrun
// sets TORCHELASTIC_RUN_ID to its --rdzv_id (a UUID with --standalone), or to
// "none"; a value the daemon would refuse as a job id is passed over too, so
// that Validate names STRAGGLER_JOB_ID rather than a variable nobody set here.
std::string JobIdFromEnv() {
  if (const char* v = std::getenv("STRAGGLER_JOB_ID"); v != nullptr && *v != '\0') return v;
  const char* v = std::getenv("TORCHELASTIC_RUN_ID");
  if (v == nullptr || *v == '\0' || std::string_view(v) == "none") return {};
  const pb::rules::TextFault fault =
      pb::rules::FindTextFault(v, pb::rules::kMaxJobIdBytes, pb::rules::IsJobIdChar);
  if (fault.too_long || fault.bad_byte != std::string_view::npos) return {};
  return v;
}

}  // namespace

namespace detail {

TopologyEnv TopologyFromEnv(std::string* error) {
  TopologyEnv t;
  if (const char* v = std::getenv("STRAGGLER_PEER_GROUP"); v != nullptr) t.peer_group = v;
  if (const char* v = std::getenv("STRAGGLER_GPU_MODEL"); v != nullptr) t.gpu_model = v;
  // Set but empty = unset, as a launcher template may leave it.
  if (const char* v = std::getenv("STRAGGLER_REPLICA"); v != nullptr && *v != '\0') {
    uint32_t replica = 0;
    if (ReadEnvUnsigned("STRAGGLER_REPLICA", &replica, error)) t.replica = replica;
  }
  return t;
}

// The daemon's rule for a bounded wire string (straggler/v1/wire_rules.h
// FindTextFault, bytes that `allowed` accepts, described as `allowed_text`):
// "" when `value` keeps it, else why, naming `name` and where the value came
// from.
template <typename Allowed>
static std::string CheckWireString(std::string_view name, const std::string& value,
                                   size_t max_bytes, Allowed allowed,
                                   std::string_view allowed_text, std::string_view source) {
  const pb::rules::TextFault fault = pb::rules::FindTextFault(value, max_bytes, allowed);
  if (fault.too_long)
    return std::string(name) + " '" + absl::CHexEscape(value.substr(0, 32)) + "...' is " +
           std::to_string(value.size()) + " bytes; at most " + std::to_string(max_bytes) +
           std::string(source);
  if (fault.bad_byte != std::string_view::npos)
    return std::string(name) + " '" + absl::CHexEscape(value) + "' has '" +
           absl::CHexEscape(value.substr(fault.bad_byte, 1)) + "' at byte " +
           std::to_string(fault.bad_byte) + "; allowed: " + std::string(allowed_text) +
           std::string(source);
  return {};
}

std::string ValidatePeerGroup(const std::string& group) {
  // The daemon's rule (straggler/v1/wire_rules.h), as for job_id.
  return CheckWireString("peer_group", group, pb::rules::kMaxPeerGroupBytes,
                         pb::rules::IsJobIdChar, pb::rules::kJobIdAllowed,
                         " (STRAGGLER_PEER_GROUP)");
}

ChannelSecurity SecurityOf(const ClientOptions& o) {
  return ChannelSecurity{o.tls_ca_file, o.tls_cert_file, o.tls_key_file};
}

void TlsFromEnv(ClientOptions* o) {
  ChannelSecurity tls = ChannelSecurityFromEnv();
  o->tls_ca_file = std::move(tls.ca_file);
  o->tls_cert_file = std::move(tls.cert_file);
  o->tls_key_file = std::move(tls.key_file);
}

void GpuFromEnv(ClientOptions* o) {
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr) o->cuda_visible_devices = v;
  if (const char* v = std::getenv("STRAGGLER_GPU_UUID"); v != nullptr) o->gpu_uuid = v;
}

std::string HostName() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return std::string(buf.data());
}

}  // namespace detail

ClientOptions ClientOptions::FromEnv() {
  ClientOptions o;
  std::string error;
  if (const char* v = std::getenv("STRAGGLER_ENDPOINT"); v != nullptr && *v != '\0') o.endpoint = v;
  o.job_id = JobIdFromEnv();
  if (const char* v = std::getenv("STRAGGLER_NODE"); v != nullptr) o.node = v;
  detail::GpuFromEnv(&o);
  detail::TopologyEnv topology = detail::TopologyFromEnv(&error);
  o.peer_group = std::move(topology.peer_group);
  o.gpu_model = std::move(topology.gpu_model);
  o.replica = topology.replica;
  o.run_id = RunIdFromEnv();
  detail::TlsFromEnv(&o);
  uint32_t rank = 0;
  if (ReadEnvUnsigned("RANK", &rank, &error)) o.ranks = {rank};
  ReadEnvUnsigned("WORLD_SIZE", &o.world_size, &error);
  ReadEnvUnsigned("LOCAL_RANK", &o.local_rank, &error);
  ReadEnvUnsigned("STRAGGLER_ITERATIONS_PER_EPOCH", &o.iterations_per_epoch, &error);
  o.env_error = std::move(error);
  return o;
}

std::string ClientOptions::Validate() const {
  if (!env_error.empty()) return env_error;
  if (endpoint.empty()) return "endpoint is empty (set STRAGGLER_ENDPOINT)";
  // Several replicas: "a:7070,b:7070" (docs/cluster.md, "Clients").
  if (auto list = stream::SplitEndpoints(endpoint); !list.ok()) return std::string(list.status().message());
  if (job_id.empty())
    return "job_id is empty (set STRAGGLER_JOB_ID; under torchrun, --rdzv_id or --standalone "
           "name the job through TORCHELASTIC_RUN_ID)";
  // The daemon's rule (straggler/v1/wire_rules.h): refused here, once, rather
  // than by the daemon on every reconnect.
  if (std::string problem = detail::CheckWireString("job_id", job_id, pb::rules::kMaxJobIdBytes,
                                                    pb::rules::IsJobIdChar,
                                                    pb::rules::kJobIdAllowed, "");
      !problem.empty())
    return problem;
  // "" is the job's default run (docs/runs.md), not a bad id.
  if (std::string problem = detail::CheckWireString("run_id", run_id, pb::rules::kMaxJobIdBytes,
                                                    pb::rules::IsJobIdChar,
                                                    pb::rules::kJobIdAllowed, "");
      !problem.empty())
    return problem;
  if (std::string problem = detail::SecurityOf(*this).Validate(); !problem.empty()) return problem;
  if (world_size == 0) return "world_size=0: must be > 0 (set WORLD_SIZE)";
  if (std::string problem = detail::ValidatePeerGroup(peer_group); !problem.empty()) return problem;
  if (std::string problem = detail::CheckWireString(
          "gpu_model", gpu_model, pb::rules::kMaxGpuModelBytes, pb::rules::IsPrintableAscii,
          pb::rules::kPrintableAsciiAllowed, " (STRAGGLER_GPU_MODEL)");
      !problem.empty())
    return problem;
  if (replica && *replica >= world_size)
    return "replica=" + std::to_string(*replica) + " >= world_size=" + std::to_string(world_size) +
           ": a replica is a data-parallel index (STRAGGLER_REPLICA)";
  if (ranks.empty()) return "ranks is empty: name at least one rank (set RANK)";
  std::vector<uint32_t> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] >= world_size)
      return "rank " + std::to_string(sorted[i]) + " >= world_size=" + std::to_string(world_size);
    if (i > 0 && sorted[i] == sorted[i - 1])
      return "rank " + std::to_string(sorted[i]) + " listed twice";
  }
  if (queue_capacity == 0 || queue_capacity > detail::BoundedQueue<int>::kMaxCapacity)
    return "queue_capacity=" + std::to_string(queue_capacity) + ": must be in [1, " +
           std::to_string(detail::BoundedQueue<int>::kMaxCapacity) + "]";
  if (max_batch == 0) return "max_batch=0: must be > 0";
  if (backoff_initial.count() <= 0)
    return "backoff_initial=" + std::to_string(backoff_initial.count()) + "ms: must be > 0";
  if (backoff_max < backoff_initial)
    return "backoff_max=" + std::to_string(backoff_max.count()) + "ms < backoff_initial=" +
           std::to_string(backoff_initial.count()) + "ms";
  if (backoff_max.count() > std::numeric_limits<int>::max())
    return "backoff_max=" + std::to_string(backoff_max.count()) + "ms is too large";
  if (max_send_delay.count() < 1 || max_send_delay > std::chrono::hours(1))
    return "max_send_delay=" + std::to_string(max_send_delay.count()) +
           "ms: must be between 1 ms and 1 h";
  return {};
}

}  // namespace straggler
