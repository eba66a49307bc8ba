/* Compiled as C: straggler_options_t as programs built against older
 * straggler_c.h headers hold it. Each older struct is followed in memory by
 * a canary where a newer layout's fields would be: the library must neither
 * write there (straggler_options_init) nor read there
 * (straggler_client_create; the canary's bytes as a pointer would crash).
 * Called from client_stream_test.cc, which runs the fake daemon at
 * `endpoint` and checks the hello it received. Each function returns 0 when
 * every check passed, else the number of the failed step. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "straggler/straggler_c.h"

#define CANARY_BYTE 0xA5

/* straggler_options_t as the first straggler_c.h had it (2026-11-21). */
typedef struct first_options {
  const char* endpoint;
  const char* job_id;
  const uint32_t* ranks;
  size_t num_ranks;
  uint32_t world_size;
  uint32_t local_rank;
  const char* node;
  uint64_t iterations_per_epoch;
  size_t queue_capacity;
  size_t max_batch;
  uint32_t backoff_initial_ms;
  uint32_t backoff_max_ms;
} first_options_t;

/* The third layout (2026-11-27, before gpu_model was appended). */
typedef struct third_options {
  first_options_t first;
  const char* cuda_visible_devices;
  const char* gpu_uuid;
  const char* peer_group;
  int has_replica;
  uint32_t replica;
} third_options_t;

typedef struct guarded_first {
  first_options_t o;
  unsigned char canary[64];
} guarded_first_t;

typedef struct guarded_third {
  third_options_t o;
  unsigned char canary[64];
} guarded_third_t;

#if defined(__x86_64__) || defined(__aarch64__)
_Static_assert(sizeof(first_options_t) == 80 && sizeof(third_options_t) == 112,
               "the shipped LP64 sizes");
_Static_assert(offsetof(guarded_first_t, canary) == sizeof(first_options_t) &&
                   offsetof(guarded_third_t, canary) == sizeof(third_options_t),
               "the canary follows the struct at once");
#endif

static int CanaryIntact(const unsigned char* canary, size_t n) {
  size_t i;
  for (i = 0; i < n; ++i)
    if (canary[i] != CANARY_BYTE) return 0;
  return 1;
}

/* Sends one report of rank `rank` through `c` and waits until the daemon
 * acknowledged it; destroys c. 0 when it did. */
static int ReportOnce(straggler_client_t* c, uint32_t rank) {
  int rc = straggler_report(c, rank, 0, 0, 0.1) == STRAGGLER_OK &&
                   straggler_flush(c, 10000) == STRAGGLER_OK
               ? 0
               : 1;
  straggler_client_destroy(c);
  return rc;
}

/* A program built against the first header, rank 1 of 4 in job `job`. With
 * `sized` 0 it calls the exported straggler_options_init and
 * straggler_client_create as such a program does; with 1 the _sized calls
 * with its own sizeof. */
int straggler_c_first_layout(const char* endpoint, const char* job, int sized) {
  guarded_first_t g;
  const uint32_t ranks[1] = {1};
  char err[256];
  straggler_client_t* c;
  memset(&g, CANARY_BYTE, sizeof g);

  if (sized) {
    if (straggler_options_init_sized((straggler_options_t*)&g.o, sizeof g.o) != STRAGGLER_OK)
      return 1;
  } else {
    (straggler_options_init)((straggler_options_t*)&g.o);
  }
  if (!CanaryIntact(g.canary, sizeof g.canary)) return 2;
  if (g.o.endpoint != NULL || g.o.queue_capacity != 4096 || g.o.max_batch != 256 ||
      g.o.backoff_initial_ms != 100 || g.o.backoff_max_ms != 2000)
    return 3;

  g.o.endpoint = endpoint;
  g.o.job_id = job;
  g.o.ranks = ranks;
  g.o.num_ranks = 1;
  g.o.world_size = 4;
  g.o.local_rank = 2;
  c = sized ? straggler_client_create_sized((const straggler_options_t*)&g.o, sizeof g.o, err,
                                            sizeof err)
            : (straggler_client_create)((const straggler_options_t*)&g.o, err, sizeof err);
  if (c == NULL) {
    fprintf(stderr, "straggler_c_first_layout: %s\n", err);
    return 4;
  }
  if (!CanaryIntact(g.canary, sizeof g.canary)) return 5;
  return ReportOnce(c, 1) == 0 ? 0 : 6;
}

/* A program built against the third header: its topology fields arrive,
 * gpu_model (beyond its struct) is the default, STRAGGLER_GPU_MODEL's. */
int straggler_c_third_layout(const char* endpoint, const char* job) {
  guarded_third_t g;
  const uint32_t ranks[1] = {2};
  char err[256];
  straggler_client_t* c;
  memset(&g, CANARY_BYTE, sizeof g);
  if (straggler_options_init_sized((straggler_options_t*)&g.o, sizeof g.o) != STRAGGLER_OK)
    return 1;
  if (!CanaryIntact(g.canary, sizeof g.canary)) return 2;
  if (g.o.peer_group != NULL || g.o.has_replica != 0 || g.o.first.queue_capacity != 4096) return 3;
  g.o.first.endpoint = endpoint;
  g.o.first.job_id = job;
  g.o.first.ranks = ranks;
  g.o.first.num_ranks = 1;
  g.o.first.world_size = 4;
  g.o.peer_group = "stage1";
  g.o.has_replica = 1;
  g.o.replica = 3;
  c = straggler_client_create_sized((const straggler_options_t*)&g.o, sizeof g.o, err,
                                    sizeof err);
  if (c == NULL) {
    fprintf(stderr, "straggler_c_third_layout: %s\n", err);
    return 4;
  }
  if (!CanaryIntact(g.canary, sizeof g.canary)) return 5;
  return ReportOnce(c, 2) == 0 ? 0 : 6;
}

/* A program built against this header, through the macros: gpu_model and
 * monitor_only are part of its struct and arrive. */
int straggler_c_full_layout(const char* endpoint, const char* job, const char* gpu_model) {
  straggler_options_t o;
  const uint32_t ranks[1] = {3};
  char err[256];
  straggler_client_t* c;
  memset(&o, CANARY_BYTE, sizeof o);
  if (straggler_options_init(&o) != STRAGGLER_OK) return 1;
  if (o.gpu_model != NULL || o.peer_group != NULL || o.cuda_visible_devices != NULL ||
      o.monitor_only != 0)
    return 2;
  o.endpoint = endpoint;
  o.job_id = job;
  o.ranks = ranks;
  o.num_ranks = 1;
  o.world_size = 4;
  o.gpu_model = gpu_model;
  o.monitor_only = 1;
  c = straggler_client_create(&o, err, sizeof err);
  if (c == NULL) {
    fprintf(stderr, "straggler_c_full_layout: %s\n", err);
    return 3;
  }
  return ReportOnce(c, 3) == 0 ? 0 : 4;
}

/* `size` is no layout: init_sized refuses it and writes nothing, and
 * create_sized refuses it with why in `err`, even for valid options. */
int straggler_c_refuses_size(size_t size, char* err, size_t errlen) {
  straggler_options_t o;
  unsigned char untouched[sizeof(straggler_options_t)];
  const uint32_t ranks[1] = {0};
  straggler_client_t* c;
  memset(&o, 0x5A, sizeof o);
  memcpy(untouched, &o, sizeof o);
  if (straggler_options_init_sized(&o, size) != STRAGGLER_EINVAL) return 1;
  if (memcmp(untouched, &o, sizeof o) != 0) return 2;
  if (straggler_options_init_sized(NULL, sizeof o) != STRAGGLER_EINVAL) return 3;

  straggler_options_init(&o);
  o.endpoint = "127.0.0.1:1";
  o.job_id = "refused-size";
  o.ranks = ranks;
  o.num_ranks = 1;
  o.world_size = 1;
  c = straggler_client_create_sized(&o, size, err, errlen);
  if (c != NULL) {
    straggler_client_destroy(c);
    return 4;
  }
  return 0;
}
