/* Host side of gemm/gemm_grouped.h that builds everywhere: the argument checks (shared
 * with the CUDA launcher in gemm_grouped.cu through gemm_internal.h) and the CPU
 * reference, plain loops in double.
 *
 * The reference works row by row from the host offsets, so unlike the device it can
 * check them: offsets[0] = 0, non-decreasing, offsets[num_groups] <= max_rows.
 *
 * FP8: every product of two e4m3 values and every sum of 128 of them is exact in double
 * (gemm_ref.c says why), so each 128-wide K block is summed exactly, whatever the order,
 * and then scaled by x_scale * w_scale: one rounding per K block. */
#define INA_LOG_SUBSYS "gemm"
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/dtype.h"
#include "gemm/gemm_grouped.h"
#include "gemm/gemm_internal.h"

/* Size of version 1 of ina_gemm_grouped_args_t (through its last field). */
#define GROUPED_ARGS_V1_SIZE (offsetof(ina_gemm_grouped_args_t, stream) + sizeof(void *))
#define GROUPED_ARGS_V2_SIZE (offsetof(ina_gemm_grouped_args_t, plan_groups) + sizeof(int32_t))
#define GROUPED_ARGS_V3_SIZE (offsetof(ina_gemm_grouped_args_t, row_ends) + sizeof(const int32_t *))
/* Rows are int32 on the device (the offsets); dimensions stay below this so that every
 * product below fits in int64. */
#define MAX_DIM ((int64_t)1 << 31)
#define ALIGN_BYTES 16

static int aligned(const void *p, size_t bytes) { return (uintptr_t)p % bytes == 0; }

/* The device path's alignment rules (gemm_grouped.h: "16-byte aligned ..."), plus the
 * natural alignment of the int32, float and pointer arrays the kernel reads. */
static ina_status_t check_alignment(const ina_gemm_grouped_args_t *a, const char *who) {
  ina_status_t st = INA_OK;
  const int64_t x_size = a->mode == INA_GEMM_FP8_BLOCK ? 1 : 2;
  INA_REQUIRE(aligned(a->x, ALIGN_BYTES) && aligned(a->y, ALIGN_BYTES), INA_ERR_INVALID_ARGUMENT,
              "%s: x %p and y %p must be 16-byte aligned", who, a->x, (void *)a->y);
  INA_REQUIRE((a->ldx * x_size) % ALIGN_BYTES == 0 && (a->ldy * 2) % ALIGN_BYTES == 0,
              INA_ERR_INVALID_ARGUMENT,
              "%s: row strides must keep rows 16-byte aligned (ldx %lld elements of %lld bytes, "
              "ldy %lld bf16)",
              who, (long long)a->ldx, (long long)x_size, (long long)a->ldy);
  INA_REQUIRE(aligned(a->offsets, sizeof(int32_t)) && aligned(a->w, sizeof(void *)),
              INA_ERR_INVALID_ARGUMENT, "%s: misaligned offsets %p or weight array %p", who,
              (const void *)a->offsets, (const void *)a->w);
  if (a->mode == INA_GEMM_FP8_BLOCK)
    INA_REQUIRE(aligned(a->x_scale, sizeof(float)) && aligned(a->w_scale, sizeof(void *)),
                INA_ERR_INVALID_ARGUMENT, "%s: misaligned x_scale %p or weight-scale array %p",
                who, (const void *)a->x_scale, (const void *)a->w_scale);
fail:
  return st;
}

ina_status_t ina_gemm_grouped_check_args(const ina_gemm_grouped_args_t *args, const char *who,
                                         int device_rules, ina_gemm_grouped_args_t *out) {
  ina_status_t st = INA_OK;
  ina_gemm_grouped_args_t a;
  memset(&a, 0, sizeof a);
  INA_REQUIRE(args != NULL, INA_ERR_INVALID_ARGUMENT, "%s: args is NULL", who);
  INA_REQUIRE(args->struct_size >= GROUPED_ARGS_V1_SIZE && args->version >= 1,
              INA_ERR_INVALID_ARGUMENT,
              "%s: args struct_size %zu / version %u not from INA_GEMM_GROUPED_ARGS_INIT", who,
              args->struct_size, (unsigned)args->version);
  memcpy(&a, args, GROUPED_ARGS_V1_SIZE);
  a.struct_size = sizeof a;
  a.plan_groups = args->struct_size >= GROUPED_ARGS_V2_SIZE ? args->plan_groups : 0;
  a.row_ends = args->struct_size >= GROUPED_ARGS_V3_SIZE ? args->row_ends : NULL;
  INA_REQUIRE(a.mode == INA_GEMM_BF16 || a.mode == INA_GEMM_FP8_BLOCK, INA_ERR_INVALID_ARGUMENT,
              "%s: unknown mode %d", who, (int)a.mode);
  INA_REQUIRE(a.num_groups >= 1, INA_ERR_INVALID_ARGUMENT, "%s: num_groups %d < 1", who,
              (int)a.num_groups);
  if (a.plan_groups == 0) a.plan_groups = a.num_groups;
  INA_REQUIRE(a.plan_groups >= a.num_groups, INA_ERR_INVALID_ARGUMENT,
              "%s: plan_groups %d below num_groups %d", who, (int)a.plan_groups, (int)a.num_groups);
  INA_REQUIRE(a.max_rows >= 0 && a.max_rows < MAX_DIM, INA_ERR_INVALID_ARGUMENT,
              "%s: max_rows %lld outside [0, 2^31)", who, (long long)a.max_rows);
  INA_REQUIRE(a.n >= 1 && a.n <= MAX_DIM && a.k >= 1 && a.k <= MAX_DIM, INA_ERR_INVALID_ARGUMENT,
              "%s: shape n %lld, k %lld out of range", who, (long long)a.n, (long long)a.k);
  const int64_t multiple = a.mode == INA_GEMM_FP8_BLOCK ? 16 : 8;
  INA_REQUIRE(a.n % multiple == 0 && a.k % multiple == 0, INA_ERR_INVALID_ARGUMENT,
              "%s: %s needs n (%lld) and k (%lld) to be multiples of %lld", who,
              a.mode == INA_GEMM_FP8_BLOCK ? "FP8" : "bf16", (long long)a.n, (long long)a.k,
              (long long)multiple);
  if (a.ldx == 0) a.ldx = a.k;
  if (a.ldy == 0) a.ldy = a.n;
  INA_REQUIRE(a.ldx >= a.k && a.ldx <= MAX_DIM && a.ldy >= a.n && a.ldy <= MAX_DIM,
              INA_ERR_INVALID_ARGUMENT,
              "%s: row strides ldx %lld, ldy %lld do not fit rows of k %lld / n %lld", who,
              (long long)a.ldx, (long long)a.ldy, (long long)a.k, (long long)a.n);
  if (a.max_rows == 0) goto done; /* nothing is dereferenced */
  INA_REQUIRE(a.offsets && a.x && a.w && a.y, INA_ERR_INVALID_ARGUMENT,
              "%s: NULL offsets %p, x %p, w %p or y %p", who, (const void *)a.offsets, a.x,
              (const void *)a.w, (void *)a.y);
  INA_REQUIRE(a.mode != INA_GEMM_FP8_BLOCK || (a.x_scale && a.w_scale), INA_ERR_INVALID_ARGUMENT,
              "%s: FP8 needs x_scale (%p) and w_scale (%p)", who, (const void *)a.x_scale,
              (const void *)a.w_scale);
  if (device_rules) INA_CHECK(check_alignment(&a, who));
done:
  *out = a;
fail:
  return st;
}

/* ---- CPU reference -------------------------------------------------------------------- */

static inline double bf16_value(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* out[j] = x_row . W[j, :] for bf16 operands. Four partial sums keep the loop fast; their
 * order only moves the last bits of a double. */
static void row_bf16(const ina_gemm_grouped_args_t *a, const uint16_t *w, const uint16_t *x,
                     double *xrow, double *out) {
  for (int64_t kk = 0; kk < a->k; kk++) xrow[kk] = bf16_value(x[kk]);
  for (int64_t j = 0; j < a->n; j++) {
    const uint16_t *wr = w + j * a->k;
    double s[4] = {0, 0, 0, 0};
    for (int64_t kk = 0; kk < a->k; kk += 4) /* k is a multiple of 8 */
      for (int u = 0; u < 4; u++) s[u] += xrow[kk + u] * bf16_value(wr[kk + u]);
    out[j] = (s[0] + s[1]) + (s[2] + s[3]);
  }
}

/* out[j] = sum over K blocks of (exact block sum) * x_scale[kb] * w_scale[j / 128, kb]. */
static void row_fp8(const ina_gemm_grouped_args_t *a, const uint8_t *w, const float *w_scale,
                    const uint8_t *x, const float *x_scale, const double *e4m3, double *xrow,
                    double *out) {
  const int64_t kblocks = (a->k + 127) / 128, kblocks4 = (kblocks + 3) / 4 * 4;
  for (int64_t kk = 0; kk < a->k; kk++) xrow[kk] = e4m3[x[kk]];
  for (int64_t j = 0; j < a->n; j++) {
    const uint8_t *wr = w + j * a->k;
    const float *ws = w_scale + (j / INA_GEMM_BLOCK) * kblocks4;
    double s = 0.0;
    for (int64_t kb = 0; kb < kblocks; kb++) {
      const int64_t begin = kb * INA_GEMM_BLOCK;
      const int64_t end = begin + INA_GEMM_BLOCK < a->k ? begin + INA_GEMM_BLOCK : a->k;
      double part[4] = {0, 0, 0, 0};
      for (int64_t kk = begin; kk < end; kk += 4) /* k is a multiple of 16 */
        for (int u = 0; u < 4; u++) part[u] += xrow[kk + u] * e4m3[wr[kk + u]];
      const double block = (part[0] + part[1]) + (part[2] + part[3]); /* exact */
      s += block * (double)x_scale[kb] * (double)ws[kb];
    }
    out[j] = s;
  }
}

/* Group g's rows: [offsets[g], offsets[g + 1]), or up to row_ends[g] when given. */
static int32_t group_end(const ina_gemm_grouped_args_t *a, int32_t g) {
  return a->row_ends ? a->row_ends[g] : a->offsets[g + 1];
}

/* With row_ends: each group a range inside [0, max_rows), and a weight where it has rows. */
static ina_status_t check_ranges(const ina_gemm_grouped_args_t *a) {
  ina_status_t st = INA_OK;
  for (int32_t g = 0; g < a->num_groups; g++) {
    INA_REQUIRE(a->offsets[g] >= 0 && a->offsets[g] <= a->row_ends[g] && a->row_ends[g] <= a->max_rows,
                INA_ERR_INVALID_ARGUMENT, "ina_gemm_grouped_ref: group %d covers rows [%d, %d) of %lld",
                (int)g, (int)a->offsets[g], (int)a->row_ends[g], (long long)a->max_rows);
    INA_REQUIRE(a->offsets[g] == a->row_ends[g] || (a->w[g] != NULL && (a->mode != INA_GEMM_FP8_BLOCK ||
                                                                          a->w_scale[g] != NULL)),
                INA_ERR_INVALID_ARGUMENT, "ina_gemm_grouped_ref: group %d has rows but no weight", (int)g);
  }
fail:
  return st;
}

/* The host offsets must describe sorted groups inside [0, max_rows). */
static ina_status_t check_offsets(const ina_gemm_grouped_args_t *a) {
  ina_status_t st = INA_OK;
  if (a->row_ends) return check_ranges(a);
  INA_REQUIRE(a->offsets[0] == 0, INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_grouped_ref: offsets[0] is %d, not 0", (int)a->offsets[0]);
  for (int32_t g = 0; g < a->num_groups; g++)
    INA_REQUIRE(a->offsets[g + 1] >= a->offsets[g], INA_ERR_INVALID_ARGUMENT,
                "ina_gemm_grouped_ref: offsets decrease at group %d (%d -> %d)", (int)g,
                (int)a->offsets[g], (int)a->offsets[g + 1]);
  INA_REQUIRE(a->offsets[a->num_groups] <= a->max_rows, INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_grouped_ref: offsets[%d] = %d exceeds max_rows %lld", (int)a->num_groups,
              (int)a->offsets[a->num_groups], (long long)a->max_rows);
  for (int32_t g = 0; g < a->num_groups; g++) {
    INA_REQUIRE(a->w[g] != NULL, INA_ERR_INVALID_ARGUMENT, "ina_gemm_grouped_ref: w[%d] is NULL",
                (int)g);
    INA_REQUIRE(a->mode != INA_GEMM_FP8_BLOCK || a->w_scale[g] != NULL, INA_ERR_INVALID_ARGUMENT,
                "ina_gemm_grouped_ref: w_scale[%d] is NULL", (int)g);
  }
fail:
  return st;
}

ina_status_t ina_gemm_grouped_ref(const ina_gemm_grouped_args_t *args) {
  ina_status_t st = INA_OK;
  ina_gemm_grouped_args_t a;
  double *xrow = NULL, *out = NULL;
  double e4m3[256];
  INA_CHECK(ina_gemm_grouped_check_args(args, "ina_gemm_grouped_ref", 0, &a));
  if (a.max_rows == 0) goto fail;
  INA_CHECK(check_offsets(&a));
  xrow = malloc((size_t)a.k * sizeof *xrow);
  out = malloc((size_t)a.n * sizeof *out);
  INA_CHECK_ALLOC(xrow);
  INA_CHECK_ALLOC(out);
  for (int v = 0; v < 256; v++) e4m3[v] = ina_fp8_e4m3_to_f32((uint8_t)v);
  const int64_t kblocks = (a.k + 127) / 128;
  for (int32_t g = 0; g < a.num_groups; g++) {
    for (int64_t r = a.offsets[g]; r < group_end(&a, g); r++) {
      if (a.mode == INA_GEMM_FP8_BLOCK)
        row_fp8(&a, (const uint8_t *)a.w[g], a.w_scale[g], (const uint8_t *)a.x + r * a.ldx,
                a.x_scale + r * kblocks, e4m3, xrow, out);
      else
        row_bf16(&a, (const uint16_t *)a.w[g], (const uint16_t *)a.x + r * a.ldx, xrow, out);
      uint16_t *y = a.y + r * a.ldy;
      for (int64_t j = 0; j < a.n; j++) y[j] = ina_f32_to_bf16((float)out[j]);
    }
  }
fail:
  free(xrow);
  free(out);
  return st;
}
