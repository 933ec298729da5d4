/* Helpers shared by the gpu_ops tests: start-up (--quick, device check, seed), device
 * buffers with poisoned contents and guard bytes past their end, bf16 data and
 * tolerance checks. Header-only (static inline), over core/cuda.h and tests/test_util.h. */
#ifndef INA_TESTS_GPU_OPS_GPU_OPS_TEST_H
#define INA_TESTS_GPU_OPS_GPU_OPS_TEST_H


#include "tests/gpu_test_util.h"

#include <stdint.h>
#include <string.h>

#include "core/cuda.h"
#include "core/dtype.h"
#include "core/log.h"

/* Bytes past every device buffer that must stay as poisoned. */
#define GPU_TEST_GUARD 256

/* Nonzero under --quick: fewer and smaller cases. */
static int gpu_test_quick = 0;

/* Parses the arguments (--quick) and checks for a device. Returns 0 when the test can
 * run, having seeded *rng from test_seed and printed the device; otherwise the exit
 * status for main to return (test_require_gpus: TEST_SKIP, or 1 under INA_REQUIRE_GPU). */
static inline int gpu_test_start(const char *name, int argc, char **argv, test_rng_t *rng) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      gpu_test_quick = 1;
    } else {
      fprintf(stderr, "%s: unknown argument '%s' (accepted: --quick)\n", name, argv[i]);
      exit(2);
    }
  }
  const int skip = test_require_gpus(name, 1);
  if (skip) return skip;
  char device[128];
  printf("%s: device %s%s\n", name, ina_cuda_device_name(0, device, sizeof device),
         gpu_test_quick ? ", quick" : "");
  rng->s = test_seed(name);
  return 0;
}

/* A device buffer of `bytes` plus guard bytes, filled with `fill` (the poison). */
typedef struct dev_buf {
  void *p;
  size_t bytes;
  uint8_t fill;
} dev_buf_t;

static inline dev_buf_t dev_buf_make(size_t bytes, uint8_t fill) {
  dev_buf_t b = {NULL, bytes, fill};
  const size_t total = bytes + GPU_TEST_GUARD;
  uint8_t *host = malloc(total);
  CHECK(host != NULL);
  if (!host) return b;
  memset(host, fill, total);
  CHECK_OK(ina_cuda_malloc(0, total, &b.p));
  if (b.p) CHECK_OK(ina_cuda_memcpy_h2d(b.p, host, total));
  free(host);
  return b;
}

/* A device copy of host data (plus poisoned guard bytes). */
static inline dev_buf_t dev_buf_from(const void *host, size_t bytes, uint8_t fill) {
  dev_buf_t b = dev_buf_make(bytes, fill);
  if (b.p && bytes) CHECK_OK(ina_cuda_memcpy_h2d(b.p, host, bytes));
  return b;
}

/* Downloads the buffer's data and checks that its guard bytes are untouched. */
static inline void dev_buf_read(const dev_buf_t *b, void *host, const char *what) {
  const size_t total = b->bytes + GPU_TEST_GUARD;
  uint8_t *all = malloc(total);
  CHECK(all != NULL);
  if (!all || !b->p) {
    free(all);
    return;
  }
  CHECK_OK(ina_cuda_memcpy_d2h(all, b->p, total));
  if (host && b->bytes) memcpy(host, all, b->bytes);
  size_t touched = 0;
  for (size_t i = b->bytes; i < total; i++) touched += all[i] != b->fill;
  CHECKF(touched == 0, "%s: %zu guard bytes past the end were written", what, touched);
  free(all);
}

static inline void dev_buf_free(dev_buf_t *b) {
  ina_cuda_free(b->p);
  b->p = NULL;
}

/* bf16 values of a normal distribution times `scale`. */
static inline void fill_bf16(uint16_t *x, size_t n, float scale, test_rng_t *rng) {
  for (size_t i = 0; i < n; i++) x[i] = ina_f32_to_bf16(test_rng_normal(rng) * scale);
}

static inline void widen_bf16(const uint16_t *x, float *out, size_t n) {
  ina_to_f32(x, INA_DTYPE_BF16, out, n);
}

/* Checks a bf16 GPU result against an fp32 reference: relative L2 error within
 * `rel_l2` (docs/NUMERICS.md: bf16 paths <= 1e-2) and every element within the reference's
 * bf16 rounding (2^-8 relative, which allows for a last-bit difference before the
 * rounding) plus `abs_tol`. NaN in either fails. */
static inline void check_bf16_close(const uint16_t *got_bf16, const float *ref, size_t n,
                                    double rel_l2, double abs_tol, const char *what) {
  float *got = malloc((n ? n : 1) * sizeof *got);
  CHECK(got != NULL);
  if (!got) return;
  widen_bf16(got_bf16, got, n);
  const double err = test_rel_l2(got, ref, n);
  CHECKF(err <= rel_l2, "%s: relative L2 error %.3g over the bound %.3g", what, err, rel_l2);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs((double)got[i] - (double)ref[i]);
    if (!(d <= 0x1p-8 * fabs((double)ref[i]) + abs_tol)) {
      if (bad++ < 5)
        fprintf(stderr, "%s: element %zu = %.9g, reference %.9g\n", what, i, got[i], ref[i]);
    }
  }
  CHECKF(bad == 0, "%s: %zu of %zu elements outside the bf16 tolerance", what, bad, n);
  free(got);
}

#endif
