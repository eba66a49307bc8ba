/* libstraggler's C ABI: the same capabilities as straggler/client.h for
 * trainers written in C, or bound from other languages (ctypes, cgo, JNI).
 *
 *   char err[256];
 *   straggler_client_t* c = straggler_client_create_from_env(err, sizeof err);
 *   if (!c) { fprintf(stderr, "straggler: %s\n", err); ... train without it ... }
 *   uint32_t excluded[64];
 *   straggler_membership_t m = { .ranks = excluded, .cap = 64 };
 *   for (uint64_t it = 0; ...; ++it) {
 *     straggler_membership_for(c, it, 5000, rank, &m);  // who reduces at `it`
 *     double t = ...forward_backward()...;
 *     straggler_report(c, rank, epoch, it, t);           // never blocks
 *     if (m.ok && !straggler_is_excluded(&m, rank)) allreduce_among(&m);
 *   }
 *   straggler_client_destroy(c);
 *
 * Conventions: functions never throw or abort on bad arguments; they return
 * a negative value (STRAGGLER_EINVAL) for a NULL client or output pointer.
 * Strings passed in are copied; the caller keeps ownership.
 *
 * Thread safety: every function except straggler_client_destroy may be
 * called from any thread concurrently on the same client.
 * straggler_client_destroy must be the last call on a client, made once. */
#ifndef STRAGGLER_STRAGGLER_C_H_
#define STRAGGLER_STRAGGLER_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STRAGGLER_OK 0
/* straggler_report*: the report was not queued (queue full or rank not
 * served). straggler_flush: timed out. straggler_membership_*: the excluded
 * list did not fit in the caller's buffer (count says how many there are). */
#define STRAGGLER_INCOMPLETE 1
#define STRAGGLER_EINVAL (-1)
/* straggler_readmission_after: no version readmitting the rank is known. */
#define STRAGGLER_NONE 2

typedef struct straggler_client straggler_client_t;

/* Options. Call straggler_options_init() first, then set what you need;
 * zero/NULL fields mean "default". TLS is not in the struct: both
 * constructors take it from STRAGGLER_TLS_CA, STRAGGLER_TLS_CERT and
 * STRAGGLER_TLS_KEY (docs/security.md).
 *
 * The struct only grows at its end. straggler_options_init and
 * straggler_client_create are macros that pass sizeof(straggler_options_t)
 * as this program sees it, so the library reads and writes exactly the
 * caller's struct and gives the fields it lacks their defaults
 * (docs/client.md#c-abi). A new field is appended, never inserted, and
 * gets a row in c_api.cc's table of layouts. */
typedef struct straggler_options {
  const char* endpoint;            /* "host:port", "dns:///h:p", "unix:///path"; NULL = 127.0.0.1:7070 */
  const char* job_id;              /* required */
  const uint32_t* ranks;           /* ranks this client reports for (usually one) */
  size_t num_ranks;
  uint32_t world_size;             /* required, > every rank */
  uint32_t local_rank;
  const char* node;                /* NULL = host name */
  uint64_t iterations_per_epoch;   /* 0 = unknown */
  size_t queue_capacity;           /* 0 = 4096; rounded up to a power of two */
  size_t max_batch;                /* 0 = 256 reports per batch */
  uint32_t backoff_initial_ms;     /* 0 = 100 */
  uint32_t backoff_max_ms;         /* 0 = 2000 */
  /* The GPU this process computes on (ClientOptions::cuda_visible_devices and
   * gpu_uuid): NULL = unknown. A struct too old to hold them (the first
   * layout) gets CUDA_VISIBLE_DEVICES and STRAGGLER_GPU_UUID instead.
   * Appended last so earlier fields keep their offsets. */
  const char* cuda_visible_devices;
  const char* gpu_uuid;
  /* The rank's place in a hybrid-parallel job (ClientOptions::peer_group and
   * replica, docs/topology.md): peer_group NULL = STRAGGLER_PEER_GROUP, else
   * the default group ""; has_replica 0 = STRAGGLER_REPLICA, else a replica
   * of its own; 1 = `replica` (the rank's data-parallel index). */
  const char* peer_group;
  int has_replica;
  uint32_t replica;
  /* The GPU's model (ClientOptions::gpu_model): NULL = STRAGGLER_GPU_MODEL,
   * else unknown. Ranks of different models are never peers in detection. */
  const char* gpu_model;
  /* 1: this trainer does not act on membership (ClientOptions::monitor_only,
   * docs/membership.md "Monitoring only"): the daemon shows a slow rank as a
   * straggler it never excludes. The first straggler_membership_for or
   * straggler_readmission_after clears it. 0 (and a struct too old to hold
   * it) = acts on membership. */
  int monitor_only;
} straggler_options_t;

/* A rank's topology from a Megatron-style layout (straggler/topology.h). */
#define STRAGGLER_PEER_GROUP_MAX 64
typedef struct straggler_topology {
  char peer_group[STRAGGLER_PEER_GROUP_MAX + 1]; /* "stage<p>", NUL-terminated */
  uint32_t replica;      /* data-parallel index */
  uint32_t stage;        /* pipeline index */
  uint32_t tensor_rank;  /* tensor-parallel index */
  uint32_t context_rank; /* context-parallel index */
} straggler_topology_t;

/* A membership version. The caller provides `ranks` (may be NULL when `cap`
 * is 0); the library writes at most `cap` excluded ranks, ascending, and
 * sets `count` to the number excluded (count > cap: truncated). In a
 * membership-change callback `ranks` points to library memory valid only
 * during the call, and count == cap. */
typedef struct straggler_membership {
  uint64_t version;                /* 0 = nobody excluded, before any decision */
  uint64_t effective_iteration;    /* in force from this iteration on */
  uint32_t world_size;
  uint32_t lead_iterations;
  int ok;                          /* 0: straggler_membership_for timed out; best known */
  uint32_t* ranks;                 /* excluded ranks (buffer) */
  size_t cap;                      /* capacity of `ranks` */
  size_t count;                    /* excluded ranks in this version */
} straggler_membership_t;

#define STRAGGLER_LAST_REJECTION_MAX 256

typedef struct straggler_stats {
  uint64_t enqueued;               /* accepted into the queue */
  uint64_t dropped;                /* queue full */
  uint64_t sent;                   /* written to the stream at least once */
  uint64_t acked;                  /* accepted by the daemon */
  uint64_t rejected;               /* rejected by the daemon */
  uint64_t duplicates;             /* already taken by the daemon (resent after a reconnect) */
  uint64_t reconnects;
  int connected;                   /* 1 while a stream to the daemon is up */
  char last_rejection[STRAGGLER_LAST_REJECTION_MAX];  /* NUL-terminated, may be truncated */
  /* Fields below were appended later; straggler_stats_sized fills them when
   * the size passed holds them (straggler_stats passes this header's size;
   * a program built against the shorter struct keeps working with a newer
   * library). */
  int upstream_unavailable;        /* 1 while the straggler-agent this client talks to says
                                      its stream to the daemon is down; 0 with no agent */
} straggler_stats_t;

/* The topology of `rank` in a layout of `data` replicas x `pipeline` stages x
 * `tensor` x `context` ranks per stage, ranks ordered as Megatron-LM's
 * RankGenerator `order` ("tp-cp-ep-dp-pp" when NULL; first name fastest).
 * 0, or STRAGGLER_EINVAL with why in `err` (a size of 0, a bad order, a rank
 * outside the layout; `err` may be NULL) and *out untouched. */
int straggler_topology_from_layout(uint32_t data, uint32_t pipeline, uint32_t tensor,
                                   uint32_t context, const char* order, uint32_t rank,
                                   straggler_topology_t* out, char* err, size_t errlen);

/* Fills the first `size` bytes of *options with the defaults; `size` is
 * the caller's sizeof(straggler_options_t), the size of one of its layouts
 * (the struct as some version of this header had it). 0, or
 * STRAGGLER_EINVAL with nothing written for a NULL `options` or a size that
 * is no layout this library knows. Call it as straggler_options_init(&o). */
int straggler_options_init_sized(straggler_options_t* options, size_t size);

/* Creates a client and starts its background sender, reading the first
 * `size` bytes of *options (as straggler_options_init_sized; fields beyond
 * them take their defaults). Returns NULL on invalid options, a size that is
 * no known layout (the error names it), or out of memory, and writes why to
 * `err` (NUL-terminated, truncated to `errlen`; `err` may be NULL). An
 * unreachable endpoint is not an error: the client keeps retrying in the
 * background. Call it as straggler_client_create(&o, err, sizeof err). */
straggler_client_t* straggler_client_create_sized(const straggler_options_t* options, size_t size,
                                                  char* err, size_t errlen);

/* The functions that programs built before the _sized calls existed call
 * (the parentheses keep the macros below from expanding). They cannot know
 * which layout their caller has, so they assume the first one, which every
 * caller's struct holds: the fields up to backoff_max_ms; the GPU fields
 * come from CUDA_VISIBLE_DEVICES and STRAGGLER_GPU_UUID, and the topology
 * fields take their defaults (the environment's, where a field says so).
 * Bindings that call the library by symbol (ctypes, cgo) call the _sized
 * functions with their struct's size instead. */
void(straggler_options_init)(straggler_options_t* options);
straggler_client_t*(straggler_client_create)(const straggler_options_t* options, char* err,
                                              size_t errlen);

#define straggler_options_init(options) \
  straggler_options_init_sized((options), sizeof(straggler_options_t))
#define straggler_client_create(options, err, errlen) \
  straggler_client_create_sized((options), sizeof(straggler_options_t), (err), (errlen))

/* A client as straggler_client_create makes, with its options from the
 * environment as ClientOptions::FromEnv reads them (RANK, WORLD_SIZE,
 * LOCAL_RANK, STRAGGLER_ENDPOINT, STRAGGLER_JOB_ID (else torchrun's
 * TORCHELASTIC_RUN_ID; neither: NULL, err naming STRAGGLER_JOB_ID), STRAGGLER_NODE,
 * STRAGGLER_ITERATIONS_PER_EPOCH, STRAGGLER_PEER_GROUP, STRAGGLER_REPLICA,
 * STRAGGLER_GPU_MODEL, CUDA_VISIBLE_DEVICES, STRAGGLER_GPU_UUID, the TLS
 * files; the full list: docs/configuration.md, "Trainers"). */
straggler_client_t* straggler_client_create_from_env(char* err, size_t errlen);

/* Flushes for at most one second, closes the stream and frees the client.
 * NULL is a no-op. */
void straggler_client_destroy(straggler_client_t* client);

/* Queues one iteration's compute time (forward + backward, without waits in
 * collectives). Never blocks. 0 when queued, STRAGGLER_INCOMPLETE when
 * dropped, STRAGGLER_EINVAL for a NULL client. */
int straggler_report(straggler_client_t* client, uint32_t rank, uint64_t epoch, uint64_t iteration,
                     double compute_seconds);

/* Same with the optional step and collective-wait times; NaN = absent. */
int straggler_report_ex(straggler_client_t* client, uint32_t rank, uint64_t epoch,
                        uint64_t iteration, double compute_seconds, double step_seconds,
                        double collective_wait_seconds);

/* A step's optional details (straggler::StepDetails, docs/client.md "Work
 * and phases"): NaN = absent. Call straggler_step_init(&s) first (every field
 * NaN), then set what was measured. The times are apart from compute_seconds
 * and from each other; work is > 0 in the job's unit (tokens, samples, ...);
 * the daemon refuses a report with a work <= 0 or a negative or infinite
 * phase, naming the value (straggler_stats' last_rejection).
 *
 * The struct only grows at its end. straggler_step_init and
 * straggler_report_step are macros that pass sizeof(straggler_step_t) as this
 * program sees it; the library reads and writes only the fields that lie
 * entirely within that size: a field the program's struct lacks is absent,
 * and fields of a newer header than the library's are not read (as a daemon
 * of the previous release ignores new report fields). Sizes below the first
 * layout's (5 doubles, 40 bytes) are STRAGGLER_EINVAL. */
typedef struct straggler_step {
  double step_seconds;             /* this step's start to the next's, waits included */
  double collective_wait_seconds;  /* blocked in collectives on slower peers */
  double input_wait_seconds;       /* blocked on the data loader and the copy to the device */
  double optimizer_seconds;        /* the optimizer step */
  double work;                     /* > 0, in the job's unit */
} straggler_step_t;

/* Sets the first `size` bytes' fields of *step to NaN (absent). 0, or
 * STRAGGLER_EINVAL for a NULL step or a size below the first layout. */
int straggler_step_init_sized(straggler_step_t* step, size_t size);

/* straggler_report with a step's details (`step` NULL: none). Never blocks.
 * Returns as straggler_report; STRAGGLER_EINVAL also for a size below the
 * first layout. */
int straggler_report_step_sized(straggler_client_t* client, uint32_t rank, uint64_t epoch,
                                uint64_t iteration, double compute_seconds,
                                const straggler_step_t* step, size_t size);

#define straggler_step_init(step) straggler_step_init_sized((step), sizeof(straggler_step_t))
#define straggler_report_step(client, rank, epoch, iteration, compute_seconds, step)          \
  straggler_report_step_sized((client), (rank), (epoch), (iteration), (compute_seconds), (step), \
                              sizeof(straggler_step_t))

/* The membership in force at `iteration` for `rank`, waiting up to
 * `timeout_ms` until it is certain (see Client::MembershipFor); on timeout
 * out->ok is 0 and the rest is the best known answer. Set out->ranks and
 * out->cap before the call. Returns 0, STRAGGLER_INCOMPLETE when the excluded
 * list was truncated, or STRAGGLER_EINVAL. */
int straggler_membership_for(straggler_client_t* client, uint64_t iteration, uint32_t timeout_ms,
                             uint32_t rank, straggler_membership_t* out);

/* For `rank` excluded at `iteration`: the first version received after the
 * one in force there that includes it again (Client::ReadmissionAfter). Its
 * effective_iteration is where the rank rejoins, and straggler_membership_for
 * is certain there at once for it, so a rank that fell behind while excluded
 * can skip straight to it. Returns as straggler_membership_for, or
 * STRAGGLER_NONE (out untouched) when `rank` is not excluded at `iteration`
 * or no version readmitting it has been received yet. */
int straggler_readmission_after(straggler_client_t* client, uint64_t iteration, uint32_t rank,
                                straggler_membership_t* out);

/* The newest membership received (lock-free). Returns as
 * straggler_membership_for. */
int straggler_current_membership(const straggler_client_t* client, straggler_membership_t* out);

/* 1 when `rank` is excluded in `m`, 0 when not, -1 when it cannot tell
 * (the list was truncated and `rank` is not among the part kept) or m is
 * NULL. */
int straggler_is_excluded(const straggler_membership_t* m, uint32_t rank);

/* Registers `cb`, called on the client's background thread for every new
 * membership version, in ascending order, with `user` passed through. The
 * callback must be quick and must not destroy the client. */
typedef void (*straggler_membership_cb)(const straggler_membership_t* membership, void* user);
int straggler_on_membership_change(straggler_client_t* client, straggler_membership_cb cb,
                                   void* user);

/* Waits up to `timeout_ms` until every report queued so far was
 * acknowledged. 0 when all were, STRAGGLER_INCOMPLETE on timeout. */
int straggler_flush(straggler_client_t* client, uint32_t timeout_ms);

/* The symbol programs built before straggler_stats_sized existed call: it
 * copies the fields up to last_rejection (their struct's end). Newly built
 * programs call it through the macro below, which passes their struct's size
 * and so gets every field. */
int(straggler_stats)(const straggler_client_t* client, straggler_stats_t* out);

/* Copies every field of straggler_stats_t that lies entirely within the
 * first `size` bytes of *out; pass sizeof(straggler_stats_t). Fields beyond
 * `size` (appended in a later version than the caller was built with) are
 * not touched. STRAGGLER_EINVAL for a NULL client or out, or a size smaller
 * than the fields straggler_stats fills. */
int straggler_stats_sized(const straggler_client_t* client, straggler_stats_t* out, size_t size);

#define straggler_stats(client, out) \
  straggler_stats_sized((client), (out), sizeof(straggler_stats_t))

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRAGGLER_STRAGGLER_C_H_ */
