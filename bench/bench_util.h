/* Shared pieces of the kernel benchmarks: timing with CUDA events, the device's measured
 * memory ceilings, random device data, the checks of results before timing, and result
 * reporting.
 *
 * Every benchmark prints one line per figure, `name value unit formula` (the formula is
 * the rest of the line and says how the value was computed), then one JSON line
 * `{"bench": ..., "device": ..., "results": [{"name", "value", "unit", "formula"}, ...]}`
 * for scripts. Benchmarks exit 77 when no CUDA device is present.
 *
 * Without CUDA in the build the device functions return INA_ERR_UNSUPPORTED (or 0 for the
 * ceiling). Thread safety: none; benchmarks are single-threaded programs. */
#ifndef INA_BENCH_BENCH_UTIL_H
#define INA_BENCH_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define INA_BENCH_SKIP 77

/* ---- device presence ---------------------------------------------------------------- */

/* Prints "<program>: no CUDA device, skipped" and returns 1 when there is no device;
 * otherwise prints the device's name and returns 0. */
int ina_bench_no_device(const char *program);

/* ---- timing ------------------------------------------------------------------------- */

/* Enqueues one run of the code under test on `stream` (a cudaStream_t). `iteration`
 * counts every run, warm-up included, so the callee can rotate among input sets. */
typedef ina_status_t (*ina_bench_enqueue_fn)(void *ctx, int64_t iteration, void *stream);

typedef struct ina_bench_timing {
  int warmup_batches;     /* untimed batches first (module load, clocks, caches) */
  int batches;            /* timed batches; the median is reported */
  int launches_per_batch; /* back-to-back runs between two events; time is divided by it */
} ina_bench_timing_t;

/* Times `enqueue` on a private stream with CUDA events and stores the median over batches
 * of (batch time / launches_per_batch) in *median_ms. Each batch is synchronized before
 * the next starts. */
ina_status_t ina_bench_time_ms(ina_bench_enqueue_fn enqueue, void *ctx,
                               const ina_bench_timing_t *timing, double *median_ms);

/* Captures `calls` back-to-back runs of `enqueue` (iterations 0 .. calls - 1) on `stream`
 * (a cudaStream_t that is not the legacy default stream) into one CUDA graph, then times
 * replays of it with ina_bench_time_ms (`timing`'s warm-up and timed batches, one replay
 * per batch) and stores the median replay time / calls in *median_ms. */
ina_status_t ina_bench_time_graph_ms(ina_bench_enqueue_fn enqueue, void *ctx, int calls,
                                     const ina_bench_timing_t *timing, void *stream,
                                     double *median_ms);

/* Enqueues one kernel of `blocks` x `threads` that does nothing: captured back to back in
 * a graph, the floor under any one-kernel operation's latency. */
ina_status_t ina_bench_launch_empty(int blocks, int threads, void *stream);

/* ---- memory ceilings ---------------------------------------------------------------- */

typedef struct ina_bench_ceilings {
  double read_tbs;      /* read-only reduction over a buffer far larger than L2, TB/s */
  double copy_tbs;      /* device-to-device cudaMemcpy, bytes read + written, TB/s */
  int64_t read_bytes;   /* bytes read per timed read run */
  int64_t copy_bytes;   /* bytes copied per timed copy run (2x this is counted) */
  int64_t buffer_bytes; /* the buffer the runs rotate over */
  int runs;             /* timed runs per figure (median) */
  char read_variant[64]; /* which read kernel configuration gave read_tbs */
} ina_bench_ceilings_t;

/* Measures both ceilings on the current device (several seconds). */
ina_status_t ina_bench_measure_ceilings(ina_bench_ceilings_t *out);

/* The read ceiling in TB/s, measured on first use and remembered for the process;
 * 0 when it cannot be measured (no device; the reason is in ina_last_error()). Report
 * other benchmarks' bandwidth as a ratio to it, measured in the same run. */
double ina_bench_read_ceiling_tbs(void);

/* ---- data --------------------------------------------------------------------------- */

/* Fills n bf16 values (bit patterns, device memory) with uniform random values in
 * [-scale, scale), none exactly zero unless scale is; deterministic in seed. Synchronous. */
ina_status_t ina_bench_fill_random_bf16(uint16_t *dev, size_t n, uint64_t seed, float scale);

/* ---- host helpers (bench_host.c) ---------------------------------------------------- */

/* Seconds on the monotonic clock. */
double ina_bench_now_s(void);
/* The next value of a splitmix64 stream. */
uint64_t ina_bench_splitmix64(uint64_t *state);
/* n token ids in [0, vocab) from the stream. */
void ina_bench_random_tokens(uint64_t *state, int32_t vocab, int32_t *tokens, int64_t n);
/* NaN everywhere, so values a step did not write fail a finiteness check. */
void ina_bench_poison_nan(float *x, int64_t n);
/* The median of v[0..n) (n >= 1), which is sorted in place. */
double ina_bench_median(double *v, int n);
/* "1,8,64" -> at most `max` values in [lo, hi] into out; 0 on success. */
int ina_bench_parse_list(const char *text, int64_t lo, int64_t hi, int64_t *out, int max, int *count);

/* ---- checks before timing (bench_host.c) -------------------------------------------- */

/* A benchmark compares the first result of every configuration it times with a plain-C
 * reference on the same inputs, into outputs poisoned with NaN, before timing it. Each
 * comparison is reported by ina_bench_check (or ina_bench_check_failed): a passing one as
 * `check <what> <measure> <value> <= <bound>: ok` on stdout, a failing one on stderr with
 * the case, the measure, the value and the bound; the benchmark then prints no figure for
 * that case and exits 1 at the end (ina_bench_checks_failed() > 0). */

/* ||got - ref|| / ||ref|| over n values, in double. A NaN or infinity in either gives
 * +inf (never within a bound); ||ref|| = 0 gives 0 when got is all zero, else +inf. */
double ina_bench_rel_l2(const float *got, const double *ref, int64_t n);
/* The same with an f32 reference. */
double ina_bench_rel_l2_f32(const float *got, const float *ref, int64_t n);
/* bf16 bit patterns -> f32, n values. */
void ina_bench_bf16_to_f32(const uint16_t *in, float *out, int64_t n);
/* How many of x[0..n) are NaN or infinite. */
int64_t ina_bench_count_nonfinite(const float *x, int64_t n);
/* How many of n bf16 values are not `pattern` (e.g. the poison a run must not overwrite). */
int64_t ina_bench_count_not_bf16(const uint16_t *x, int64_t n, uint16_t pattern);
/* Ascending distinct indices of [lo, hi) for a sampled check: all of them when there are
 * at most `max`, else lo, hi - 1 and max - 2 others drawn from the splitmix64 stream
 * (max >= 2). Returns how many were written to out. */
int ina_bench_sample_range(int64_t lo, int64_t hi, int max, uint64_t *state, int64_t *out);

/* Compares block-quantized e4m3 q [rows, cols] and its fp32 scale_inv (row-major
 * [ceil(rows / block_rows), ceil(cols / 128)], as ina_cuda_fp8_quantize_blocks writes
 * them) with ina_fp8_quantize_blocks of x (bf16 bits, rows x cols): *q_diff bytes and
 * *scale_diff scales differ (NaN bytes equal whatever their sign), *first is the first
 * differing byte's index (-1 when none). Host memory; allocates scratch. */
ina_status_t ina_bench_fp8_blocks_diff(const uint16_t *x, int64_t rows, int64_t cols,
                                       int block_rows, const uint8_t *q, const float *scale_inv,
                                       int64_t *q_diff, int64_t *scale_diff, int64_t *first);

/* Reports one comparison: passes when value <= bound (NaN never passes). `measure` names
 * what value is (e.g. "rel_l2_vs_ina_gemm_ref_row"). Returns 1 when it passed. */
int ina_bench_check(const char *what, const char *measure, double value, double bound);
/* Reports a check that failed for a reason given as printf-style text (e.g. "3 of 7168
 * outputs are NaN"); returns 0. */
int ina_bench_check_failed(const char *what, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Checks reported so far, and how many of them failed. */
int ina_bench_checks_run(void);
int ina_bench_checks_failed(void);
/* quiet != 0: passing checks print nothing (the ranks other than 0 of a multi-rank
 * benchmark); failures are always printed. */
void ina_bench_check_set_quiet(int quiet);

/* ---- reporting ---------------------------------------------------------------------- */

/* Prints `name value unit formula` and keeps the figure for the JSON line. */
void ina_bench_result(const char *name, double value, const char *unit, const char *formula);
/* Prints the JSON line of every figure reported so far. */
void ina_bench_print_json(const char *bench);
/* Prints s as a JSON string literal. */
void ina_bench_json_string(const char *s);

#ifdef __cplusplus
}
#endif
#endif
