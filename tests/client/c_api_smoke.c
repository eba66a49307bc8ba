/* Compiled as C: proves straggler_c.h is valid C and usable without C++. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "straggler/straggler_c.h"

/* Called from c_api_test.cc. Creates a client for `endpoint` (expected to be
 * unreachable) with a tiny queue, reports `n` iterations of rank 1, checks
 * the counters and destroys the client. Returns 0 when every check passed,
 * else the number of the failed step. */
int straggler_c_smoke(const char* endpoint, int n) {
  char err[256];
  uint32_t ranks[1] = {1};
  straggler_options_t o;
  straggler_stats_t s;
  uint32_t excluded[4];
  straggler_membership_t m;
  straggler_client_t* c;
  int queued = 0, dropped = 0, i;

  straggler_options_init(&o);
  if (o.queue_capacity != 4096 || o.max_batch != 256) return 1;

  /* Invalid options: NULL and a message naming the value. */
  o.job_id = "c-smoke";
  o.ranks = ranks;
  o.num_ranks = 1;
  o.world_size = 1; /* rank 1 >= world_size 1 */
  if (straggler_client_create(&o, err, sizeof err) != NULL) return 2;
  if (strstr(err, "rank 1 >= world_size=1") == NULL) return 3;

  o.world_size = 4;
  o.endpoint = endpoint;
  o.queue_capacity = 4;
  o.max_batch = 1;
  o.backoff_initial_ms = 2000;
  o.backoff_max_ms = 2000;
  c = straggler_client_create(&o, err, sizeof err);
  if (c == NULL) return 4;

  for (i = 0; i < n; ++i) {
    int rc = straggler_report_ex(c, 1, 0, (uint64_t)i, 0.1, NAN, 0.01);
    if (rc == STRAGGLER_OK) ++queued;
    else if (rc == STRAGGLER_INCOMPLETE) ++dropped;
    else return 5;
  }
  if (straggler_report(c, 3, 0, 0, 0.1) != STRAGGLER_INCOMPLETE) return 6; /* not served */
  if (straggler_report(NULL, 1, 0, 0, 0.1) != STRAGGLER_EINVAL) return 7;

  if (straggler_stats(c, &s) != STRAGGLER_OK) return 8;
  if (s.enqueued != (uint64_t)queued || s.dropped != (uint64_t)dropped) return 9;
  if (s.enqueued + s.dropped != (uint64_t)n) return 10;
  /* Nothing is acknowledged, so at most the queue (4) plus the in-flight
   * buffer (4, one batch per report) can hold reports. */
  if (s.enqueued > 8 || s.dropped < (uint64_t)n - 8) return 11;
  if (s.acked != 0 || s.connected != 0) return 12;

  /* Before any decision: version 0, nobody excluded, certain below the lead. */
  memset(&m, 0, sizeof m);
  m.ranks = excluded;
  m.cap = 4;
  if (straggler_membership_for(c, 0, 0, 1, &m) != STRAGGLER_OK) return 13;
  if (!m.ok || m.version != 0 || m.world_size != 4 || m.count != 0) return 14;
  if (straggler_is_excluded(&m, 1) != 0) return 15;
  /* Later iterations need the daemon: times out with the best known. */
  if (straggler_membership_for(c, 100, 20, 1, &m) != STRAGGLER_OK) return 16;
  if (m.ok || m.version != 0) return 17;
  if (straggler_current_membership(c, &m) != STRAGGLER_OK || m.version != 0) return 18;

  if (straggler_flush(c, 10) != STRAGGLER_INCOMPLETE) return 19;
  straggler_client_destroy(c);
  straggler_client_destroy(NULL);
  return 0;
}
