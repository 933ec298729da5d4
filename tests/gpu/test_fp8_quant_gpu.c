/* GPU block-scaled FP8 quantization (core/fp8_quant.h) against the CPU reference
 * (ina_fp8_quantize_blocks on the same bf16 values widened to f32): bytes and scales must
 * match bit for bit, on fixed edge shapes and fresh random ragged ones, for 1x128 and
 * 128x128 blocks, on the vectorized and the unaligned paths. Outputs are poisoned before
 * each run and guarded past their ends, so unwritten and out-of-bounds bytes show.
 * Skipped (exit 77) without a CUDA device. */

#include "tests/gpu_test_util.h"

#include <stdint.h>
#include <string.h>

#include "core/cuda.h"
#include "core/dtype.h"
#include "core/fp8_quant.h"
#include "core/log.h"

#define GUARD_BYTES 256
#define POISON_BYTE 0xFF /* e4m3 -NaN: never produced from finite inputs */
#define MAX_REPORTED_MISMATCHES 8

/* What fills a block: the kinds that stress scale and rounding corner cases. */
typedef enum {
  BLOCK_NORMAL,    /* normal values with a per-block magnitude 2^-20 .. 2^20 */
  BLOCK_ZERO,      /* +0 and -0 only: scale 1 */
  BLOCK_TIES,      /* amax exactly 448 (scale 1) and multiples of 1/16: rounding ties */
  BLOCK_TINY,      /* bf16 subnormals */
  BLOCK_HUGE,      /* near the top of the bf16 range */
  BLOCK_KIND_COUNT
} block_kind_t;

typedef struct {
  int64_t rows, cols;
  int block_rows;
  int x_offset; /* elements past a 16-byte boundary: > 0 forces the unaligned path */
  int q_offset; /* bytes past an 8-byte boundary */
  int special;  /* 0: finite data; 1: one NaN; 2: one +infinity */
} case_t;

static block_kind_t pick_kind(test_rng_t *rng) {
  int r = (int)test_rng_int(rng, 0, 99);
  if (r < 70) return BLOCK_NORMAL;
  if (r < 78) return BLOCK_ZERO;
  if (r < 88) return BLOCK_TIES;
  if (r < 94) return BLOCK_TINY;
  return BLOCK_HUGE;
}

static uint16_t random_value(block_kind_t kind, int exponent, int first_of_block,
                             test_rng_t *rng) {
  int negative = (int)(test_rng_next(rng) & 1);
  switch (kind) {
  case BLOCK_ZERO: return negative ? 0x8000u : 0x0000u;
  case BLOCK_TIES:
    if (first_of_block) return ina_f32_to_bf16(negative ? -448.0f : 448.0f);
    return ina_f32_to_bf16((float)test_rng_int(rng, -256, 256) / 16.0f);
  case BLOCK_TINY: return (uint16_t)((negative ? 0x8000u : 0u) | test_rng_int(rng, 1, 0x7F));
  case BLOCK_HUGE: return ina_f32_to_bf16(test_rng_normal(rng) * 0x1p120f);
  case BLOCK_NORMAL:
  case BLOCK_KIND_COUNT: break;
  }
  return ina_f32_to_bf16(ldexpf(test_rng_normal(rng), exponent));
}

/* Fills x (bf16 bits) block by block with random kinds and magnitudes. */
static void fill_input(uint16_t *x, const case_t *c, test_rng_t *rng) {
  int64_t nbr = (c->rows + c->block_rows - 1) / c->block_rows, nbc = (c->cols + 127) / 128;
  for (int64_t br = 0; br < nbr; br++) {
    for (int64_t bc = 0; bc < nbc; bc++) {
      block_kind_t kind = pick_kind(rng);
      int exponent = (int)test_rng_int(rng, -20, 20);
      for (int64_t r = br * c->block_rows; r < c->rows && r < (br + 1) * c->block_rows; r++)
        for (int64_t col = bc * 128; col < c->cols && col < (bc + 1) * 128; col++)
          x[r * c->cols + col] = random_value(kind, exponent,
                                              r == br * c->block_rows && col == bc * 128, rng);
    }
  }
  if (c->special && c->rows * c->cols > 0) {
    int64_t at = test_rng_int(rng, 0, c->rows * c->cols - 1);
    x[at] = c->special == 1 ? 0x7FC0u : 0x7F80u; /* quiet NaN, +infinity */
  }
}

static int is_e4m3_nan(uint8_t b) { return (b & 0x7Fu) == 0x7Fu; }

static void run_case(const case_t *c, test_rng_t *rng) {
  const int64_t n = c->rows * c->cols;
  const int64_t nscales = ((c->rows + c->block_rows - 1) / c->block_rows) * ((c->cols + 127) / 128);
  const size_t x_bytes = (size_t)n * 2 + 16, q_bytes = (size_t)n + 8 + GUARD_BYTES,
               s_bytes = (size_t)nscales * 4 + GUARD_BYTES;
  uint16_t *x = calloc((size_t)n + 8, sizeof *x);
  float *xf = malloc(((size_t)n + 1) * sizeof *xf);
  uint8_t *q_ref = malloc((size_t)n + 1), *q_gpu = malloc(q_bytes), *poison_q = malloc(q_bytes);
  float *s_ref = malloc(((size_t)nscales + 1) * sizeof *s_ref);
  uint8_t *s_gpu = malloc(s_bytes), *poison_s = malloc(s_bytes);
  void *dx = NULL, *dq = NULL, *ds = NULL;
  char what[128];
  snprintf(what, sizeof what, "[%lld x %lld] block %dx128 x+%d q+%d special %d",
           (long long)c->rows, (long long)c->cols, c->block_rows, c->x_offset, c->q_offset,
           c->special);
  CHECK(x && xf && q_ref && q_gpu && poison_q && s_ref && s_gpu && poison_s);
  if (!(x && xf && q_ref && q_gpu && poison_q && s_ref && s_gpu && poison_s)) goto done;

  fill_input(x + c->x_offset, c, rng);
  ina_to_f32(x + c->x_offset, INA_DTYPE_BF16, xf, (size_t)n);
  CHECK_OK(ina_fp8_quantize_blocks(xf, c->rows, c->cols, c->block_rows, 128, q_ref, s_ref));

  memset(poison_q, POISON_BYTE, q_bytes);
  test_poison_f32((float *)poison_s, s_bytes / 4);
  CHECK_OK(ina_cuda_malloc(0, x_bytes, &dx));
  CHECK_OK(ina_cuda_malloc(0, q_bytes, &dq));
  CHECK_OK(ina_cuda_malloc(0, s_bytes, &ds));
  if (!dx || !dq || !ds) goto done;
  CHECK_OK(ina_cuda_memcpy_h2d(dx, x, x_bytes));
  CHECK_OK(ina_cuda_memcpy_h2d(dq, poison_q, q_bytes));
  CHECK_OK(ina_cuda_memcpy_h2d(ds, poison_s, s_bytes));

  CHECK_OK(ina_cuda_fp8_quantize_blocks((const uint16_t *)dx + c->x_offset, c->rows, c->cols,
                                        c->block_rows, 128, (uint8_t *)dq + c->q_offset,
                                        (float *)ds, NULL));
  CHECK_OK(ina_cuda_synchronize());
  CHECK_OK(ina_cuda_memcpy_d2h(q_gpu, dq, q_bytes));
  CHECK_OK(ina_cuda_memcpy_d2h(s_gpu, ds, s_bytes));

  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    uint8_t got = q_gpu[c->q_offset + i], want = q_ref[i];
    /* NaN bytes may differ in sign only (documented); finite data never makes NaN. */
    if (got == want || (c->special && is_e4m3_nan(got) && is_e4m3_nan(want))) continue;
    if (bad++ < MAX_REPORTED_MISMATCHES)
      fprintf(stderr, "%s: q[%lld, %lld] = 0x%02x, reference 0x%02x (x = %g, scale_inv %g)\n",
              what, (long long)(i / c->cols), (long long)(i % c->cols), got, want, xf[i],
              s_ref[(i / c->cols / c->block_rows) * ((c->cols + 127) / 128) + i % c->cols / 128]);
  }
  CHECKF(bad == 0, "%s: %lld of %lld bytes differ", what, (long long)bad, (long long)n);

  bad = 0;
  for (int64_t b = 0; b < nscales; b++) {
    float got;
    memcpy(&got, s_gpu + 4 * b, 4);
    if (memcmp(&got, &s_ref[b], 4) == 0) continue;
    if (bad++ < MAX_REPORTED_MISMATCHES)
      fprintf(stderr, "%s: scale_inv[%lld] = %a, reference %a\n", what, (long long)b, got,
              s_ref[b]);
  }
  CHECKF(bad == 0, "%s: %lld of %lld scales differ", what, (long long)bad, (long long)nscales);

  /* Nothing before or after the outputs may be touched. */
  CHECKF(memcmp(q_gpu, poison_q, (size_t)c->q_offset) == 0, "%s: bytes before q written", what);
  CHECKF(memcmp(q_gpu + c->q_offset + n, poison_q, q_bytes - (size_t)c->q_offset - (size_t)n) == 0,
         "%s: bytes past q written", what);
  CHECKF(memcmp(s_gpu + 4 * nscales, poison_s + 4 * nscales, s_bytes - 4 * (size_t)nscales) == 0,
         "%s: bytes past scale_inv written", what);

done:
  ina_cuda_free(dx);
  ina_cuda_free(dq);
  ina_cuda_free(ds);
  free(x);
  free(xf);
  free(q_ref);
  free(q_gpu);
  free(poison_q);
  free(s_ref);
  free(s_gpu);
  free(poison_s);
}

static void test_fixed_shapes(test_rng_t *rng) {
  static const case_t cases[] = {
      /* activations, 1 x 128 */
      {1, 1, 1, 0, 0, 0},      {1, 7, 1, 0, 0, 0},      {1, 127, 1, 0, 0, 0},
      {1, 128, 1, 0, 0, 0},    {1, 129, 1, 0, 0, 0},    {2, 8, 1, 0, 0, 0},
      {5, 1000, 1, 0, 0, 0},   {3, 7168, 1, 0, 0, 0},   {33, 7168, 1, 0, 0, 0},
      {17, 2049, 1, 0, 0, 0},  {64, 7168, 1, 1, 0, 0},  {64, 7168, 1, 0, 3, 0},
      {1024, 7168, 1, 0, 0, 0}, {7, 512, 1, 0, 0, 1},   {7, 512, 1, 0, 0, 2},
      /* weights, 128 x 128 */
      {1, 1, 128, 0, 0, 0},    {128, 128, 128, 0, 0, 0}, {129, 129, 128, 0, 0, 0},
      {127, 1000, 128, 0, 0, 0}, {300, 7, 128, 0, 0, 0}, {256, 512, 128, 3, 0, 0},
      {256, 512, 128, 0, 5, 0}, {2048, 7168, 128, 0, 0, 0}, {200, 300, 128, 0, 0, 1},
      {200, 300, 128, 0, 0, 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], rng);
}

static void test_random_shapes(test_rng_t *rng) {
  for (int i = 0; i < 40; i++) {
    case_t c = {0};
    c.block_rows = i % 2 ? 128 : 1;
    c.rows = test_rng_int(rng, 1, c.block_rows == 1 ? 300 : 700);
    /* Half the shapes keep cols a multiple of 8 (the vector path), half are arbitrary. */
    c.cols = test_rng_int(rng, 1, 3000);
    if (i % 4 < 2) c.cols = (c.cols + 7) / 8 * 8;
    if (test_rng_int(rng, 0, 3) == 0) c.x_offset = (int)test_rng_int(rng, 1, 7);
    if (test_rng_int(rng, 0, 3) == 0) c.q_offset = (int)test_rng_int(rng, 1, 7);
    run_case(&c, rng);
  }
}

/* Argument checks run before anything touches the device. */
static void test_arguments(void) {
  void *d = NULL;
  CHECK_OK(ina_cuda_malloc(0, 4096, &d));
  if (!d) return;
  uint16_t *x = d;
  uint8_t *q = (uint8_t *)d + 1024;
  float *s = (float *)((uint8_t *)d + 2048);
  ina_log_set_quiet_errors(1);
  CHECK(ina_cuda_fp8_quantize_blocks(NULL, 1, 128, 1, 128, q, s, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_cuda_fp8_quantize_blocks(x, 1, 128, 1, 128, NULL, s, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_cuda_fp8_quantize_blocks(x, 1, 128, 1, 128, q, NULL, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_cuda_fp8_quantize_blocks(x, -1, 128, 1, 128, q, s, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_cuda_fp8_quantize_blocks(x, 1, -128, 1, 128, q, s, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_cuda_fp8_quantize_blocks(x, 1, 128, 1, 64, q, s, NULL) == INA_ERR_UNSUPPORTED);
  CHECK(ina_cuda_fp8_quantize_blocks(x, 1, 128, 64, 128, q, s, NULL) == INA_ERR_UNSUPPORTED);
  CHECK(ina_cuda_fp8_quantize_blocks(x, 1, 128, 0, 128, q, s, NULL) == INA_ERR_UNSUPPORTED);
  CHECK(strstr(ina_last_error(), "0 x 128") != NULL);
  ina_log_set_quiet_errors(0);
  /* Empty matrices are a no-op, even with NULL buffers. */
  CHECK_OK(ina_cuda_fp8_quantize_blocks(NULL, 0, 128, 1, 128, NULL, NULL, NULL));
  CHECK_OK(ina_cuda_fp8_quantize_blocks(NULL, 5, 0, 128, 128, NULL, NULL, NULL));
  CHECK_OK(ina_cuda_synchronize());
  ina_cuda_free(d);
}

int main(void) {
  const int skip = test_require_gpus("test_fp8_quant_gpu", 1);
  if (skip) return skip;
  test_rng_t rng = {test_seed("test_fp8_quant_gpu")};
  char name[128];
  printf("device: %s\n", ina_cuda_device_name(0, name, sizeof name));
  test_arguments();
  test_fixed_shapes(&rng);
  test_random_shapes(&rng);
  return test_finish("test_fp8_quant_gpu");
}
