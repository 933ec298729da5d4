/* Pieces of gemm/ shared between its files: argument checking, the plan and launcher of
 * ina's FP8 block-scaled kernel (gemm_fp8_kernel.cu). Internal header, plain C.
 * Thread safety: the functions are pure except the launcher, which is as thread-safe as
 * a kernel launch. */
#ifndef INA_GEMM_GEMM_INTERNAL_H
#define INA_GEMM_GEMM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "gemm/gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Size of version 1 of ina_gemm_args_t (through its last field). */
#define INA_GEMM_ARGS_V1_SIZE (offsetof(ina_gemm_args_t, stream) + sizeof(void *))

/* What ina_gemm_check_args checks beyond modes, shapes and strides. */
enum {
  INA_GEMM_CHECK_POINTERS = 1,  /* the operands a GEMM with m > 0 reads and writes are set */
  INA_GEMM_CHECK_ALIGNMENT = 2, /* the device path's alignment rules (16 bytes for FP8) */
};

/* Checks `args` (`who` names the caller in messages) and copies it to *out with the
 * version-1 fields, the default strides filled in. checks: INA_GEMM_CHECK_* flags. */
ina_status_t ina_gemm_check_args(const ina_gemm_args_t *args, const char *who, int checks,
                                 ina_gemm_args_t *out);

/* Checks grouped GEMM `args` (`who` names the caller in messages) and copies its
 * version-1 fields to *out with the default strides filled in. device_rules: also the
 * device's alignment rules. Used by ina_gemm_grouped_ref and the launcher. */
struct ina_gemm_grouped_args;
ina_status_t ina_gemm_grouped_check_args(const struct ina_gemm_grouped_args *args, const char *who,
                                         int device_rules, struct ina_gemm_grouped_args *out);

/* Bytes per element of a GEMM output dtype (2 or 4). */
size_t ina_gemm_out_size(ina_dtype_t dtype);

/* ---- ina's FP8 kernel --------------------------------------------------------------- */

/* Weight rows per CTA: one 128-row scale block. */
#define INA_GEMM_KERNEL_TILE_N 128

/* One FP8 GEMM for the kernel: `rows` rows of x and y (already offset to the first one).
 * Activation scales are in the two-block layout of gemm_scale_layout.h with split
 * x_scale_split (rows below it M-major in one block, the rest in another). */
typedef struct ina_gemm_kernel_problem {
  int64_t rows, n, k;
  const uint8_t *x;
  int64_t ldx;
  const float *x_scale;
  int64_t x_scale_split;
  const uint8_t *w;     /* [n, k] contiguous */
  const float *w_scale; /* [ceil(n/128), L4] */
  int y_f32;            /* output dtype: 1 = fp32, 0 = bf16 */
  void *y;
  int64_t ldy;
  const void *residual; /* NULL or like y */
  int64_t ldr;
  float beta;
} ina_gemm_kernel_problem_t;

/* Grid of one kernel launch: tiles of tile_m rows x 128 weight rows, each K range cut
 * into `splits` parts whose partial sums the last-arriving CTA of a tile adds up in a
 * fixed order (deterministic). */
typedef struct ina_gemm_kernel_plan {
  int32_t tile_m; /* 8, 16 or 32 */
  int32_t splits; /* >= 1 */
  int64_t tiles_n, tiles_m;
} ina_gemm_kernel_plan_t;

/* Largest split-K factor the kernel plans. */
#define INA_GEMM_KERNEL_MAX_SPLITS 32

/* Chooses the tile and split-K factor for `rows` x n x k on a device with sm_count SMs,
 * with at most partial_bytes of partial sums and counters for at most max_tiles tiles
 * when splitting. Fails with INA_ERR_UNSUPPORTED when the grid would exceed CUDA's
 * limits. */
ina_status_t ina_gemm_kernel_plan(int64_t rows, int64_t n, int64_t k, int sm_count,
                                  size_t partial_bytes, int64_t max_tiles,
                                  ina_gemm_kernel_plan_t *plan);

/* Raises the shared-memory limit of every kernel instantiation on the current device;
 * once per handle (gemm_fp8_kernel.cu). */
ina_status_t ina_gemm_kernel_init(void);

/* Enqueues one launch. partials: plan's tiles * splits * tile_m * 128 floats (unused when
 * splits == 1); counters: one zeroed int per tile, left zeroed again by the launch. */
ina_status_t ina_gemm_kernel_launch(const ina_gemm_kernel_problem_t *p,
                                    const ina_gemm_kernel_plan_t *plan, float *partials,
                                    int *counters, void *stream);

#ifdef __cplusplus
}
#endif
#endif
