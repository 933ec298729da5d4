/* Grouped GEMMs for the routed experts of a MoE layer, with the group sizes on the device:
 *   for every group g:  y[r, :] = x[r, :] . W_g^T   for rows r in [offsets[g], offsets[g+1])
 * where W_g [n, k] is group g's weight. The rows come sorted by group (the MoE permutation
 * writes them so and its expert offsets are `offsets`); the host never learns how many rows
 * each group has, so a MoE layer runs without a host synchronization and can be captured in
 * a CUDA graph once and replayed with any routing.
 *
 * Modes (gemm/gemm.h's): INA_GEMM_BF16 (bf16 x and W) and INA_GEMM_FP8_BLOCK (e4m3 x with
 * one fp32 scale per 1 x 128 block, ROW-MAJOR [rows, ceil(k/128)] as
 * ina_cuda_fp8_quantize_blocks writes them; e4m3 W with 128 x 128 block scales packed by
 * ina_gemm_pack_w_scales). fp32 accumulation; bf16 out. Every group has the same n and k.
 *
 * The launch covers max_rows rows (a bound the caller knows on the host: tokens x top_k
 * for a MoE layer); the kernel reads offsets and skips what lies past offsets[num_groups].
 * Rows past offsets[num_groups] of y are left untouched.
 *
 * Constraints (INA_ERR_INVALID_ARGUMENT otherwise): num_groups >= 1, 0 <= max_rows < 2^31
 * (0 does nothing; the offsets are int32), n >= 1 and k >= 1 multiples of 16 (FP8) or 8 (bf16); x, y and the weights
 * 16-byte aligned, ldx and ldy (elements; 0 = dense) keeping rows 16-byte aligned. The
 * offsets must be non-decreasing from offsets[0] = 0 with offsets[num_groups] <= max_rows:
 * that is not checked (it lives on the device); rows outside [0, max_rows) are never
 * touched whatever the offsets hold.
 *
 * Asynchronous on `stream`; allocates nothing; graph-capturable. Thread safety: none
 * needed (no handle). Without CUDA in the build: INA_ERR_UNSUPPORTED. */
#ifndef INA_GEMM_GEMM_GROUPED_H
#define INA_GEMM_GEMM_GROUPED_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "gemm/gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_gemm_grouped_args {
  size_t struct_size; /* sizeof(ina_gemm_grouped_args_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  ina_gemm_mode_t mode;
  int32_t num_groups;
  int64_t max_rows;             /* rows the launch covers (host bound) */
  int64_t n, k;
  const int32_t *offsets;       /* device [num_groups + 1] */
  const void *x;                /* device [max_rows, k] bf16 or e4m3, row stride ldx */
  int64_t ldx;                  /* elements; 0: k */
  const float *x_scale;         /* FP8: device [max_rows, ceil(k/128)] row-major */
  const void *const *w;         /* device array [num_groups] of device [n, k] weights */
  const float *const *w_scale;  /* FP8: device array [num_groups] of packed weight scales */
  uint16_t *y;                  /* device [max_rows, n] bf16, row stride ldy */
  int64_t ldy;                  /* elements; 0: n */
  void *stream;                 /* a cudaStream_t; NULL = legacy default stream */
  /* Version 2. The group count the tile shape is chosen for (0: num_groups; else >=
   * num_groups). The tile shape decides how each row's sums are split among warps, so a
   * rank running only its share of a layer's experts passes the layer's expert count to
   * compute every row exactly as one GPU running all of them does. */
  int32_t plan_groups;
  /* Version 3. NULL: group g covers rows [offsets[g], offsets[g + 1]) (above). Else a
   * device [num_groups] array: group g covers [offsets[g], row_ends[g]), in any order and
   * with gaps between groups (an expert-parallel rank's slots over the rows of one
   * permutation); the groups' rows must not overlap, and the slot bound above still holds
   * because they cover at most max_rows rows. */
  const int32_t *row_ends;
} ina_gemm_grouped_args_t;

#define INA_GEMM_GROUPED_ARGS_INIT \
  {sizeof(ina_gemm_grouped_args_t), 3, INA_GEMM_BF16, 0, 0, 0, 0, NULL, NULL, 0, NULL, NULL, NULL, NULL, 0, NULL, 0, NULL}

/* Enqueues the grouped GEMM (see above). */
ina_status_t ina_gemm_grouped_run(const ina_gemm_grouped_args_t *args);

/* CPU reference on host copies of everything (x, x_scale, y host pointers; w and w_scale
 * host arrays of host pointers; offsets host): each row of each group in double, rounded
 * to fp32 and then to bf16 (nearest even). Same argument checks except alignment. */
ina_status_t ina_gemm_grouped_ref(const ina_gemm_grouped_args_t *args);

#ifdef __cplusplus
}
#endif
#endif
