// The C ABI over straggler::Client. Every entry point catches everything:
// an exception crossing into C is undefined behaviour.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "c_api_internal.h"
#include "client_options.h"
#include "straggler/client.h"
#include "straggler/straggler_c.h"
#include "straggler/topology.h"

namespace {

using straggler::c_api::WriteError;

std::optional<double> Optional(double v) {
  if (std::isnan(v)) return std::nullopt;
  return v;
}

// Copies `view` into the caller's struct and buffer.
int FillMembership(const straggler::MembershipView& view, straggler_membership_t* out) {
  out->version = view.version;
  out->effective_iteration = view.effective_iteration;
  out->world_size = view.world_size;
  out->lead_iterations = view.lead_iterations;
  out->ok = view.ok ? 1 : 0;
  out->count = view.excluded.size();
  const size_t n = out->ranks == nullptr ? 0 : std::min(out->cap, view.excluded.size());
  for (size_t i = 0; i < n; ++i) out->ranks[i] = view.excluded[i].rank;
  return view.excluded.size() > n ? STRAGGLER_INCOMPLETE : STRAGGLER_OK;
}

straggler_client_t* CreateFrom(const straggler::ClientOptions& options, char* err,
                               size_t errlen) {
  return straggler::c_api::CreateHandle<straggler_client>(
      "straggler_client_create", err, errlen,
      [&](std::string* error) { return straggler::Client::Create(options, error); });
}

// Where `member` of straggler_options_t ends: its offset and its own size,
// so no field's type is spelled twice.
#define OPTIONS_FIELD_END(member) \
  (offsetof(straggler_options_t, member) + sizeof(straggler_options_t::member))

// The layouts of straggler_options_t that shipped, oldest first, each as
// where its fields end. Its sizeof in the caller's program is that end
// rounded up to the struct's alignment (LayoutSize; the first layout's
// pointers and uint64_t already set the alignment). Only a layout's field
// bytes of a caller's struct are read or written; the trailing padding of an
// older layout may be where a newer field begins, so it is never read.
constexpr size_t kOptionsLayouts[] = {
    OPTIONS_FIELD_END(backoff_max_ms),  // the first
    OPTIONS_FIELD_END(gpu_uuid),        // + cuda_visible_devices, gpu_uuid
    OPTIONS_FIELD_END(replica),         // + peer_group, has_replica, replica
    OPTIONS_FIELD_END(gpu_model),       // + gpu_model
    OPTIONS_FIELD_END(monitor_only),    // + monitor_only
};
#undef OPTIONS_FIELD_END
constexpr size_t LayoutSize(size_t fields_end) {
  constexpr size_t align = alignof(straggler_options_t);
  return (fields_end + align - 1) / align * align;
}
// FindLayout tells the layouts apart by their sizeof alone, so no two may
// share one: padding could merge two adjacent layouts (a narrow field
// appended inside the older one's trailing padding, or a 32-bit target's
// smaller pointers). A field appended so fails this; give the new layout a
// field that reaches past the old sizeof.
constexpr bool LayoutSizesStrictlyIncrease() {
  for (size_t i = 1; i < std::size(kOptionsLayouts); ++i)
    if (LayoutSize(kOptionsLayouts[i]) <= LayoutSize(kOptionsLayouts[i - 1])) return false;
  return true;
}
static_assert(LayoutSizesStrictlyIncrease(),
              "two layouts of straggler_options_t share a sizeof: FindLayout cannot tell them apart");
// A field appended to straggler_options_t without a row here fails this.
static_assert(LayoutSize(kOptionsLayouts[std::size(kOptionsLayouts) - 1]) ==
                  sizeof(straggler_options_t),
              "straggler_options_t grew: append its new layout to kOptionsLayouts");
#if defined(__x86_64__) || defined(__aarch64__)
static_assert(LayoutSize(kOptionsLayouts[0]) == 80 && LayoutSize(kOptionsLayouts[1]) == 96 &&
                  LayoutSize(kOptionsLayouts[2]) == 112 && LayoutSize(kOptionsLayouts[3]) == 120 &&
                  LayoutSize(kOptionsLayouts[4]) == 128,
              "the shipped LP64 sizes of straggler_options_t");
#endif

// Where the fields of the layout whose sizeof is `size` end; 0 when no
// layout's sizeof is `size`.
size_t FindLayout(size_t size) {
  for (size_t fields_end : kOptionsLayouts)
    if (LayoutSize(fields_end) == size) return fields_end;
  return 0;
}

std::string BadSizeError(const char* function, size_t size) {
  std::string known;
  for (size_t fields_end : kOptionsLayouts)
    known += (known.empty() ? "" : ", ") + std::to_string(LayoutSize(fields_end));
  std::string why = std::string(function) + ": options size " + std::to_string(size) +
                    " is not a size of straggler_options_t this library knows (" + known +
                    "); pass sizeof(straggler_options_t)";
  if (size > sizeof(straggler_options_t))
    why += " (built against a newer straggler_c.h than this library?)";
  return why;
}

// The caller's first `fields_end` bytes in a struct of the newest layout,
// every field beyond them zero: the default.
straggler_options_t Widened(const straggler_options_t* options, size_t fields_end) {
  straggler_options_t full;
  std::memset(&full, 0, sizeof full);
  std::memcpy(&full, options, fields_end);
  return full;
}

// straggler_step_t is doubles only, appended one after another; a caller's
// struct holds at least the first layout's. A field is read or written only
// when it lies entirely within the caller's size (straggler_c.h's growth
// rule), so a program built against an older header leaves the newer fields
// absent and one built against a newer header has its extra fields ignored.
constexpr size_t kStepFirstLayoutEnd = offsetof(straggler_step_t, work) + sizeof(double);
static_assert(sizeof(straggler_step_t) % sizeof(double) == 0 &&
                  alignof(straggler_step_t) == alignof(double),
              "straggler_step_t holds doubles only");

}  // namespace

extern "C" {

int straggler_options_init_sized(straggler_options_t* options, size_t size) {
  const size_t fields_end = FindLayout(size);
  if (options == nullptr || fields_end == 0) return STRAGGLER_EINVAL;
  straggler_options_t defaults;
  std::memset(&defaults, 0, sizeof defaults);
  const straggler::ClientOptions d;
  defaults.queue_capacity = d.queue_capacity;
  defaults.max_batch = d.max_batch;
  defaults.backoff_initial_ms = static_cast<uint32_t>(d.backoff_initial.count());
  defaults.backoff_max_ms = static_cast<uint32_t>(d.backoff_max.count());
  std::memcpy(options, &defaults, fields_end);
  return STRAGGLER_OK;
}

// The exported names that programs built before the sized calls existed
// call: their struct may have any layout, and the first is the only one
// every such struct holds. So init writes no further (writing the newest
// layout, as it once did, wrote past the end of an older struct), and create
// reads no further (past it lies the caller's other memory).
void(straggler_options_init)(straggler_options_t* options) {
  straggler_options_init_sized(options, LayoutSize(kOptionsLayouts[0]));
}

straggler_client_t*(straggler_client_create)(const straggler_options_t* options, char* err,
                                              size_t errlen) {
  return straggler_client_create_sized(options, LayoutSize(kOptionsLayouts[0]), err, errlen);
}

straggler_client_t* straggler_client_create_sized(const straggler_options_t* caller, size_t size,
                                                  char* err, size_t errlen) {
  if (caller == nullptr) {
    WriteError(err, errlen, "options is NULL");
    return nullptr;
  }
  try {
    const size_t fields_end = FindLayout(size);
    if (fields_end == 0) {
      WriteError(err, errlen, BadSizeError("straggler_client_create", size));
      return nullptr;
    }
    const straggler_options_t widened = Widened(caller, fields_end);
    const straggler_options_t* options = &widened;
    straggler::ClientOptions o;
    if (options->endpoint != nullptr) o.endpoint = options->endpoint;
    if (options->job_id != nullptr) o.job_id = options->job_id;
    if (options->ranks != nullptr)
      o.ranks.assign(options->ranks, options->ranks + options->num_ranks);
    o.world_size = options->world_size;
    o.local_rank = options->local_rank;
    if (options->node != nullptr) o.node = options->node;
    if (options->cuda_visible_devices != nullptr) o.cuda_visible_devices = options->cuda_visible_devices;
    if (options->gpu_uuid != nullptr) o.gpu_uuid = options->gpu_uuid;
    // A struct that ends before cuda_visible_devices (the first layout: every
    // program that calls the old straggler_client_create symbol) cannot give
    // either GPU field: they come from the environment, as in
    // ClientOptions::FromEnv (and as the topology fields below do).
    if (fields_end <= offsetof(straggler_options_t, cuda_visible_devices))
      straggler::detail::GpuFromEnv(&o);
    o.iterations_per_epoch = options->iterations_per_epoch;
    if (options->queue_capacity != 0) o.queue_capacity = options->queue_capacity;
    if (options->max_batch != 0) o.max_batch = options->max_batch;
    if (options->backoff_initial_ms != 0)
      o.backoff_initial = std::chrono::milliseconds(options->backoff_initial_ms);
    if (options->backoff_max_ms != 0)
      o.backoff_max = std::chrono::milliseconds(options->backoff_max_ms);
    // TLS always comes from STRAGGLER_TLS_CA/_CERT/_KEY: the struct keeps its
    // layout, and a deployment turns TLS on without rebuilding trainers.
    straggler::detail::TlsFromEnv(&o);
    // Topology: the struct's, else the launcher's environment (a C trainer
    // run under a Megatron-style launcher need not pass it through); a bad
    // STRAGGLER_REPLICA counts only where the struct gives no replica.
    std::string replica_error;
    straggler::detail::TopologyEnv env = straggler::detail::TopologyFromEnv(&replica_error);
    o.peer_group = options->peer_group != nullptr ? std::string(options->peer_group) : std::move(env.peer_group);
    o.gpu_model = options->gpu_model != nullptr ? std::string(options->gpu_model) : std::move(env.gpu_model);
    o.monitor_only = options->monitor_only != 0;  // 0 beyond an older struct
    if (options->has_replica != 0) {
      o.replica = options->replica;
    } else {
      o.replica = env.replica;
      o.env_error = std::move(replica_error);
    }
    return CreateFrom(o, err, errlen);
  } catch (...) {
    WriteError(err, errlen, "straggler_client_create: out of memory");
    return nullptr;
  }
}

straggler_client_t* straggler_client_create_from_env(char* err, size_t errlen) {
  try {
    return CreateFrom(straggler::ClientOptions::FromEnv(), err, errlen);
  } catch (...) {
    WriteError(err, errlen, "straggler_client_create_from_env: out of memory");
    return nullptr;
  }
}

void straggler_client_destroy(straggler_client_t* client) {
  try {
    delete client;
  } catch (...) {
    // A destructor that throws would terminate anyway; nothing to do in C.
  }
}

int straggler_report(straggler_client_t* client, uint32_t rank, uint64_t epoch, uint64_t iteration,
                     double compute_seconds) {
  if (client == nullptr) return STRAGGLER_EINVAL;
  // Report() is noexcept in practice (no allocation); the try is for form.
  try {
    return client->client->Report(rank, epoch, iteration, compute_seconds) ? STRAGGLER_OK
                                                                            : STRAGGLER_INCOMPLETE;
  } catch (...) {
    return STRAGGLER_INCOMPLETE;
  }
}

int straggler_report_ex(straggler_client_t* client, uint32_t rank, uint64_t epoch,
                        uint64_t iteration, double compute_seconds, double step_seconds,
                        double collective_wait_seconds) {
  if (client == nullptr) return STRAGGLER_EINVAL;
  try {
    return client->client->Report(rank, epoch, iteration, compute_seconds, Optional(step_seconds),
                                  Optional(collective_wait_seconds))
               ? STRAGGLER_OK
               : STRAGGLER_INCOMPLETE;
  } catch (...) {
    return STRAGGLER_INCOMPLETE;
  }
}

int straggler_step_init_sized(straggler_step_t* step, size_t size) {
  if (step == nullptr || size < kStepFirstLayoutEnd) return STRAGGLER_EINVAL;
  const size_t n = std::min(size, sizeof(straggler_step_t)) / sizeof(double);
  const double absent = std::nan("");
  for (size_t i = 0; i < n; ++i)  // the struct is doubles only
    std::memcpy(reinterpret_cast<char*>(step) + i * sizeof(double), &absent, sizeof absent);
  return STRAGGLER_OK;
}

int straggler_report_step_sized(straggler_client_t* client, uint32_t rank, uint64_t epoch,
                                uint64_t iteration, double compute_seconds,
                                const straggler_step_t* step, size_t size) {
  if (client == nullptr) return STRAGGLER_EINVAL;
  if (step == nullptr) return straggler_report(client, rank, epoch, iteration, compute_seconds);
  if (size < kStepFirstLayoutEnd) return STRAGGLER_EINVAL;
  straggler::StepDetails d;
  d.step_seconds = Optional(step->step_seconds);
  d.collective_wait_seconds = Optional(step->collective_wait_seconds);
  d.input_wait_seconds = Optional(step->input_wait_seconds);
  d.optimizer_seconds = Optional(step->optimizer_seconds);
  d.work = Optional(step->work);
  // The first layout holds every field so far; a field appended later is
  // read only where offsetof(straggler_step_t, field) + sizeof(double) <= size.
  static_assert(sizeof(straggler_step_t) == kStepFirstLayoutEnd,
                "straggler_step_t grew: read its new field only where it fits the caller's size");
  try {
    return client->client->Report(rank, epoch, iteration, compute_seconds, d)
               ? STRAGGLER_OK
               : STRAGGLER_INCOMPLETE;
  } catch (...) {
    return STRAGGLER_INCOMPLETE;
  }
}

int straggler_membership_for(straggler_client_t* client, uint64_t iteration, uint32_t timeout_ms,
                             uint32_t rank, straggler_membership_t* out) {
  if (client == nullptr || out == nullptr) return STRAGGLER_EINVAL;
  try {
    return FillMembership(
        client->client->MembershipFor(iteration, std::chrono::milliseconds(timeout_ms), rank), out);
  } catch (...) {
    return STRAGGLER_EINVAL;
  }
}

int straggler_readmission_after(straggler_client_t* client, uint64_t iteration, uint32_t rank,
                                straggler_membership_t* out) {
  if (client == nullptr || out == nullptr) return STRAGGLER_EINVAL;
  try {
    const std::optional<straggler::MembershipView> back =
        client->client->ReadmissionAfter(iteration, rank);
    return back ? FillMembership(*back, out) : STRAGGLER_NONE;
  } catch (...) {
    return STRAGGLER_EINVAL;
  }
}

int straggler_current_membership(const straggler_client_t* client, straggler_membership_t* out) {
  if (client == nullptr || out == nullptr) return STRAGGLER_EINVAL;
  try {
    return FillMembership(client->client->CurrentMembership(), out);
  } catch (...) {
    return STRAGGLER_EINVAL;
  }
}

int straggler_is_excluded(const straggler_membership_t* m, uint32_t rank) {
  if (m == nullptr) return -1;
  const size_t kept = m->ranks == nullptr ? 0 : std::min(m->cap, m->count);
  if (std::binary_search(m->ranks, m->ranks + kept, rank)) return 1;
  return kept < m->count ? -1 : 0;
}

int straggler_on_membership_change(straggler_client_t* client, straggler_membership_cb cb,
                                   void* user) {
  if (client == nullptr || cb == nullptr) return STRAGGLER_EINVAL;
  try {
    client->client->OnMembershipChange([cb, user](const straggler::MembershipView& view) {
      std::vector<uint32_t> ranks;
      ranks.reserve(view.excluded.size());
      for (const auto& e : view.excluded) ranks.push_back(e.rank);
      straggler_membership_t m{};
      m.ranks = ranks.data();
      m.cap = ranks.size();
      FillMembership(view, &m);
      cb(&m, user);
    });
    return STRAGGLER_OK;
  } catch (...) {
    return STRAGGLER_EINVAL;
  }
}

int straggler_flush(straggler_client_t* client, uint32_t timeout_ms) {
  if (client == nullptr) return STRAGGLER_EINVAL;
  try {
    return client->client->Flush(std::chrono::milliseconds(timeout_ms)) ? STRAGGLER_OK
                                                                         : STRAGGLER_INCOMPLETE;
  } catch (...) {
    return STRAGGLER_INCOMPLETE;
  }
}

int(straggler_stats)(const straggler_client_t* client, straggler_stats_t* out) {
  // The struct as it was before fields were appended: a program built then
  // passes a buffer of exactly this size.
  return straggler_stats_sized(client, out, offsetof(straggler_stats_t, upstream_unavailable));
}

int straggler_stats_sized(const straggler_client_t* client, straggler_stats_t* out, size_t size) {
  if (client == nullptr || out == nullptr) return STRAGGLER_EINVAL;
  if (size < offsetof(straggler_stats_t, upstream_unavailable)) return STRAGGLER_EINVAL;
  try {
    const straggler::ClientStats s = client->client->Stats();
    out->enqueued = s.enqueued;
    out->dropped = s.dropped;
    out->sent = s.sent;
    out->acked = s.acked;
    out->rejected = s.rejected;
    out->duplicates = s.duplicates;
    out->reconnects = s.reconnects;
    out->connected = s.connected ? 1 : 0;
    std::snprintf(out->last_rejection, sizeof(out->last_rejection), "%s",
                  s.last_rejection.c_str());
    // Appended fields: each only when the caller's struct has it.
    if (size >= offsetof(straggler_stats_t, upstream_unavailable) + sizeof(int))
      out->upstream_unavailable = s.upstream_unavailable ? 1 : 0;
    return STRAGGLER_OK;
  } catch (...) {
    return STRAGGLER_EINVAL;
  }
}

int straggler_topology_from_layout(uint32_t data, uint32_t pipeline, uint32_t tensor,
                                   uint32_t context, const char* order, uint32_t rank,
                                   straggler_topology_t* out, char* err, size_t errlen) {
  if (out == nullptr) {
    WriteError(err, errlen, "straggler_topology_from_layout: out is NULL");
    return STRAGGLER_EINVAL;
  }
  try {
    straggler::ParallelLayout layout;
    layout.data = data;
    layout.pipeline = pipeline;
    layout.tensor = tensor;
    layout.context = context;
    if (order != nullptr) layout.order = order;
    std::string error;
    const std::optional<straggler::RankTopology> t =
        straggler::TopologyFromLayout(layout, rank, &error);
    if (!t) {
      WriteError(err, errlen, error);
      return STRAGGLER_EINVAL;
    }
    // "stage" and a uint32 fit STRAGGLER_PEER_GROUP_MAX with room to spare.
    std::snprintf(out->peer_group, sizeof(out->peer_group), "%s", t->peer_group.c_str());
    out->replica = t->replica;
    out->stage = t->stage;
    out->tensor_rank = t->tensor_rank;
    out->context_rank = t->context_rank;
    WriteError(err, errlen, "");
    return STRAGGLER_OK;
  } catch (...) {
    WriteError(err, errlen, "straggler_topology_from_layout: out of memory");
    return STRAGGLER_EINVAL;
  }
}

}  // extern "C"
