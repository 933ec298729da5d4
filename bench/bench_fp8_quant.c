/* Block-scaled FP8 quantization (core/fp8_quant.h) on DeepSeek-V3 shapes: activations
 * [tokens, 7168] in 1x128 blocks for 1..8192 tokens, and weight matrices in 128x128
 * blocks. The kernel is memory-bound, so each shape reports its time, the bytes it must
 * move over that time, and the ratio to the read ceiling measured in the same run.
 *
 * Inputs rotate through a 512 MiB pool (10x the H200's L2) so that a run does not find
 * its input in L2 from an earlier run. Small shapes are timed as back-to-back launches
 * in one stream (launch throughput, not one launch's latency).
 *
 * Check, before timing each shape: one run on the first input set (random bf16, never
 * zero) into bytes and scales poisoned with 0xFF (NaN in e4m3 and in fp32), compared with
 * ina_fp8_quantize_blocks (core/dtype.h) on the host copy of the same input. The kernel
 * implements the same rule (scale_inv = amax / 448, q = e4m3_satfinite(x / scale_inv),
 * nearest even; core/fp8_quant_rule.h), so the error model is exact equality: the bound is
 * 0 differing bytes and 0 differing scales, every element of every shape. A failed check
 * prints the shape and the counts, no figure for the shape, and makes the program exit 1.
 *
 * Exit 0 on success, 1 when a check or a run failed, 77 without a device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/cuda.h"
#include "core/fp8_quant.h"
#include "core/log.h"

#define HIDDEN 7168
#define POOL_ELEMS ((int64_t)256 << 20) /* bf16 inputs: 512 MiB; fp8 outputs: 256 MiB */
#define SCALE_POOL_FLOATS (POOL_ELEMS / 128)
#define BATCH_BYTES_TARGET ((double)(256 << 20))
#define MAX_LAUNCHES_PER_BATCH 200

typedef struct {
  int64_t rows, cols;
  int block_rows;
  const char *what;
} shape_t;

typedef struct {
  const uint16_t *x;
  uint8_t *q;
  float *scale_inv;
  int64_t rows, cols, elems, scales, sets;
  int block_rows;
} run_ctx_t;

static ina_status_t enqueue_quant(void *ctx, int64_t iteration, void *stream) {
  const run_ctx_t *c = ctx;
  const int64_t set = iteration % c->sets;
  return ina_cuda_fp8_quantize_blocks(c->x + set * c->elems, c->rows, c->cols, c->block_rows,
                                      128, c->q + set * c->elems,
                                      c->scale_inv + set * c->scales, stream);
}

/* One run on set 0 into poisoned outputs, bit for bit against ina_fp8_quantize_blocks.
 * Returns 1 when the shape may be timed. */
static int check_shape(const char *what, const run_ctx_t *c) {
  uint16_t *x = malloc((size_t)c->elems * 2);
  uint8_t *q = malloc((size_t)c->elems);
  float *scale = malloc((size_t)c->scales * sizeof *scale);
  int64_t q_diff = 0, s_diff = 0, first = -1;
  int ok = 0;
  if (!x || !q || !scale) {
    ok = ina_bench_check_failed(what, "out of memory");
    goto done;
  }
  memset(q, 0xFF, (size_t)c->elems);
  memset(scale, 0xFF, (size_t)c->scales * sizeof *scale);
  if (ina_cuda_memcpy_h2d(c->q, q, (size_t)c->elems) != INA_OK ||
      ina_cuda_memcpy_h2d(c->scale_inv, scale, (size_t)c->scales * sizeof *scale) != INA_OK ||
      enqueue_quant((void *)c, 0, NULL) != INA_OK || ina_cuda_synchronize() != INA_OK ||
      ina_cuda_memcpy_d2h(x, c->x, (size_t)c->elems * 2) != INA_OK ||
      ina_cuda_memcpy_d2h(q, c->q, (size_t)c->elems) != INA_OK ||
      ina_cuda_memcpy_d2h(scale, c->scale_inv, (size_t)c->scales * sizeof *scale) != INA_OK) {
    ok = ina_bench_check_failed(what, "the run failed: %s", ina_last_error());
    goto done;
  }
  if (ina_bench_fp8_blocks_diff(x, c->rows, c->cols, c->block_rows, q, scale, &q_diff, &s_diff,
                                &first) != INA_OK) {
    ok = ina_bench_check_failed(what, "reference: %s", ina_last_error());
    goto done;
  }
  if (q_diff || s_diff)
    ok = ina_bench_check_failed(what,
                                "%lld of %lld bytes and %lld of %lld scales differ from "
                                "ina_fp8_quantize_blocks (first byte: row %lld, column %lld)",
                                (long long)q_diff, (long long)c->elems, (long long)s_diff,
                                (long long)c->scales, (long long)(first < 0 ? -1 : first / c->cols),
                                (long long)(first < 0 ? -1 : first % c->cols));
  else
    ok = ina_bench_check(what, "bytes_and_scales_differing_from_ina_fp8_quantize_blocks", 0, 0);
done:
  free(x);
  free(q);
  free(scale);
  return ok;
}

static int bench_shape(const shape_t *s, const run_ctx_t *pools, double ceiling_tbs) {
  run_ctx_t c = *pools;
  ina_bench_timing_t timing = {3, 30, 1};
  double ms = 0.0;
  char name[96], formula[256];
  c.rows = s->rows;
  c.cols = s->cols;
  c.block_rows = s->block_rows;
  c.elems = s->rows * s->cols;
  c.scales = ((s->rows + s->block_rows - 1) / s->block_rows) * ((s->cols + 127) / 128);
  c.sets = POOL_ELEMS / c.elems;
  if (SCALE_POOL_FLOATS / c.scales < c.sets) c.sets = SCALE_POOL_FLOATS / c.scales;
  if (c.sets < 1) {
    fprintf(stderr, "bench_fp8_quant: %s [%lld, %lld] does not fit the pool\n", s->what,
            (long long)s->rows, (long long)s->cols);
    return 1;
  }
  snprintf(name, sizeof name, "fp8_quant_%dx128_%lldx%lld", s->block_rows, (long long)s->rows,
           (long long)s->cols);
  if (!check_shape(name, &c)) return 0; /* no figure; main's exit status says it failed */
  /* Bytes that must move: bf16 in, fp8 out, one fp32 scale per block. */
  const double bytes = 3.0 * (double)c.elems + 4.0 * (double)c.scales;
  int launches = (int)(BATCH_BYTES_TARGET / bytes) + 1;
  timing.launches_per_batch = launches < MAX_LAUNCHES_PER_BATCH ? launches : MAX_LAUNCHES_PER_BATCH;
  if (ina_bench_time_ms(enqueue_quant, &c, &timing, &ms) != INA_OK) {
    fprintf(stderr, "bench_fp8_quant: %s: %s\n", s->what, ina_last_error());
    return 1;
  }
  const double tbs = bytes / (ms * 1e-3) / 1e12;

  snprintf(name, sizeof name, "fp8_quant_%dx128_%lldx%lld_time", s->block_rows,
           (long long)s->rows, (long long)s->cols);
  snprintf(formula, sizeof formula,
           "%s; median over %d batches of %d back-to-back launches (time / launches), %lld "
           "rotating input sets",
           s->what, timing.batches, timing.launches_per_batch, (long long)c.sets);
  ina_bench_result(name, ms * 1e3, "us", formula);
  snprintf(name, sizeof name, "fp8_quant_%dx128_%lldx%lld_bw", s->block_rows, (long long)s->rows,
           (long long)s->cols);
  snprintf(formula, sizeof formula,
           "(2*rows*cols bf16 in + rows*cols fp8 out + 4*%lld scales) = %.0f bytes / median time",
           (long long)c.scales, bytes);
  ina_bench_result(name, tbs, "TB/s", formula);
  snprintf(name, sizeof name, "fp8_quant_%dx128_%lldx%lld_ratio", s->block_rows,
           (long long)s->rows, (long long)s->cols);
  snprintf(formula, sizeof formula, "bw / read_ceiling (%.3f TB/s, same run)", ceiling_tbs);
  ina_bench_result(name, tbs / ceiling_tbs, "x", formula);
  return 0;
}

int main(void) {
  static const shape_t shapes[] = {
      {1, HIDDEN, 1, "activations, 1 token (decode)"},
      {8, HIDDEN, 1, "activations, 8 tokens"},
      {32, HIDDEN, 1, "activations, 32 tokens"},
      {64, HIDDEN, 1, "activations, 64 tokens"},
      {128, HIDDEN, 1, "activations, 128 tokens"},
      {256, HIDDEN, 1, "activations, 256 tokens"},
      {512, HIDDEN, 1, "activations, 512 tokens"},
      {1024, HIDDEN, 1, "activations, 1024 tokens"},
      {2048, HIDDEN, 1, "activations, 2048 tokens"},
      {4096, HIDDEN, 1, "activations, 4096 tokens"},
      {8192, HIDDEN, 1, "activations, 8192 tokens (prefill)"},
      {2048, HIDDEN, 128, "weight, expert gate/up [2048, 7168]"},
      {HIDDEN, 2048, 128, "weight, expert down [7168, 2048]"},
      {24576, 1536, 128, "weight, q_b_proj [24576, 1536]"},
      {HIDDEN, 16384, 128, "weight, o_proj [7168, 16384]"},
  };
  run_ctx_t pools = {0};
  void *x = NULL, *q = NULL, *s = NULL;
  int failed = 0;

  if (ina_bench_no_device("bench_fp8_quant")) return INA_BENCH_SKIP;
  const double ceiling = ina_bench_read_ceiling_tbs();
  if (ceiling <= 0.0) {
    fprintf(stderr, "bench_fp8_quant: read ceiling: %s\n", ina_last_error());
    return 1;
  }
  ina_bench_result("read_ceiling", ceiling, "TB/s",
                   "read-only reduction over rotating 1 GiB slices (bench_read_ceiling), same run");

  if (ina_cuda_malloc(0, (size_t)POOL_ELEMS * 2, &x) != INA_OK ||
      ina_cuda_malloc(0, (size_t)POOL_ELEMS, &q) != INA_OK ||
      ina_cuda_malloc(0, (size_t)SCALE_POOL_FLOATS * sizeof(float), &s) != INA_OK ||
      ina_bench_fill_random_bf16(x, (size_t)POOL_ELEMS, 0xF8ull, 4.0f) != INA_OK) {
    fprintf(stderr, "bench_fp8_quant: %s\n", ina_last_error());
    failed = 1;
  }
  pools.x = x;
  pools.q = q;
  pools.scale_inv = s;
  for (size_t i = 0; !failed && i < sizeof shapes / sizeof shapes[0]; i++)
    failed = bench_shape(&shapes[i], &pools, ceiling);
  if (!failed) ina_bench_print_json("fp8_quant");
  ina_cuda_free(x);
  ina_cuda_free(q);
  ina_cuda_free(s);
  const int checks_failed = ina_bench_checks_failed();
  printf("checks: %d of %d passed%s\n", ina_bench_checks_run() - checks_failed,
         ina_bench_checks_run(), checks_failed ? "; the failed shapes have no figures" : "");
  return failed || checks_failed ? 1 : 0;
}
