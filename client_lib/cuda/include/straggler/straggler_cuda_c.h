/* libstraggler_cuda's C ABI: straggler::CudaComputeTimer for trainers written
 * in C or bound from other languages. Link straggler::cuda (built only when
 * CUDA was found).
 *
 *   char err[256];
 *   straggler_cuda_timer_t* t = straggler_cuda_timer_create(client, NULL, err, sizeof err);
 *   if (!t) fprintf(stderr, "straggler: no GPU timing: %s\n", err);
 *   for (...) {
 *     straggler_cuda_timer_begin(t, (void*)stream, epoch, it);
 *     ...queue forward/backward on stream...
 *     straggler_cuda_timer_end(t, (void*)stream);   // reported when the GPU is done
 *   }
 *   straggler_cuda_timer_destroy(t);                 // before straggler_client_destroy
 *
 * Conventions as in straggler_c.h. Thread safety: begin/end from one thread
 * at a time; stats from any thread; destroy last, once, before the client. */
#ifndef STRAGGLER_STRAGGLER_CUDA_C_H_
#define STRAGGLER_STRAGGLER_CUDA_C_H_

#include <stddef.h>
#include <stdint.h>

#include <straggler/straggler_c.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct straggler_cuda_timer straggler_cuda_timer_t;

/* Zero fields mean "default" (see straggler/cuda_timer.h). */
typedef struct straggler_cuda_timer_options {
  int has_rank;                 /* 0: the client's first rank */
  uint32_t rank;
  int device;                   /* -1 (set by init): the current device */
  size_t max_pending;           /* 0 = 64 */
  uint32_t poll_interval_us;    /* 0 = 500 */
  uint32_t drain_timeout_ms;    /* 0 = 1000 */
} straggler_cuda_timer_options_t;

#define STRAGGLER_CUDA_LAST_ERROR_MAX 256

typedef struct straggler_cuda_timer_stats {
  uint64_t begun;
  uint64_t reported;
  uint64_t report_dropped;
  uint64_t dropped_full;
  uint64_t unmatched;
  uint64_t errors;
  uint64_t abandoned;
  char last_error[STRAGGLER_CUDA_LAST_ERROR_MAX];  /* NUL-terminated, may be truncated */
} straggler_cuda_timer_stats_t;

void straggler_cuda_timer_options_init(straggler_cuda_timer_options_t* options);

/* `options` may be NULL (defaults). NULL on failure, with why in `err`
 * (e.g. no CUDA device). */
straggler_cuda_timer_t* straggler_cuda_timer_create(straggler_client_t* client,
                                                    const straggler_cuda_timer_options_t* options,
                                                    char* err, size_t errlen);
void straggler_cuda_timer_destroy(straggler_cuda_timer_t* timer);

/* `stream` is a cudaStream_t (NULL = legacy default stream). Never block.
 * 0 when recorded, STRAGGLER_INCOMPLETE when not timed, STRAGGLER_EINVAL for
 * a NULL timer. */
int straggler_cuda_timer_begin(straggler_cuda_timer_t* timer, void* stream, uint64_t epoch,
                               uint64_t iteration);
int straggler_cuda_timer_end(straggler_cuda_timer_t* timer, void* stream);

int straggler_cuda_timer_stats(const straggler_cuda_timer_t* timer,
                               straggler_cuda_timer_stats_t* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRAGGLER_STRAGGLER_CUDA_C_H_ */
