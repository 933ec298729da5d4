/* Pieces of gemm/ shared between its files: argument checking, the plans and launchers of
 * ina's FP8 block-scaled kernel (gemm_fp8_kernel.cu), the small-M kernel (gemm_small_m.cu)
 * and the grouped kernel's tiles (gemm_grouped.cu). Internal header, plain C.
 * Thread safety: the plans are pure; the launchers are as thread-safe as a kernel launch. */
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

/* ---- the small-M kernel (gemm_small_m.cu; plan and fit in gemm_plan.c) --------------- */

/* The kernel's row limit: the 8 columns of one mma.sync n8 tile. */
#define INA_GEMM_SMALL_M_MAX_ROWS 8
/* ina_gemm_run's AUTO path sends a GEMM of 1..8 rows whose operands suit the small-M kernel
 * (ina_gemm_small_m_fits) there when ina_gemm_small_m_wins says so: always for weights of
 * at most INA_GEMM_SMALL_M_MAX_WEIGHT_BYTES, beyond that only FP8 GEMMs whose rows are not a
 * multiple of 4 (the rest of cuBLASLt's share would run on the FP8 kernel, a second pass
 * over W). Measured on one H200 (bench_gemm --small-m, CUDA-graph replays, 2026-11-30):
 * on the DeepSeek-V2-Lite projections (1.2-12.6 MB of weights) the kernel took 3.2-6.4 us
 * at M = 1 and 8 against cuBLASLt's 5.2-6.5 us (bf16) and cuBLASLt's or the FP8 kernel's
 * 5.3-9.0 us (FP8), never slower; on the LM head (102400 x 2048, 210 / 420 MB) cuBLASLt
 * won at M = 8 (bf16 102.4 against 109.9 us, FP8 62.6 against 67.5 us) and tied at M = 1
 * in bf16 (100.3 against 101.1 us), while the kernel beat the FP8 kernel at M = 1 (61.8
 * against 68.8 us). Between 12.6 MB and 210 MB nothing was measured: those stay on the
 * paths they had. */
#define INA_GEMM_SMALL_M_MAX_WEIGHT_BYTES ((int64_t)16 << 20)
/* Weight rows per CTA: the 16 rows of one m16 MMA tile. */
#define INA_GEMM_SMALL_M_TILE_N 16
/* K is cut into units of 128 bytes per weight row: 64 bf16 or 128 e4m3 values, the latter
 * exactly one FP8 scale block. A warp loads INA_GEMM_SMALL_M_BATCH_UNITS units (8 loads of
 * 16 bytes per thread) before it multiplies them. */
#define INA_GEMM_SMALL_M_UNIT_BYTES 128
#define INA_GEMM_SMALL_M_BATCH_UNITS 2
#define INA_GEMM_SMALL_M_MAX_WARPS 16
/* The plan aims at this many warps, each with a batch of loads in flight, per SM; CTAs of
 * fewer warps than INA_GEMM_SMALL_M_MIN_WARPS are widened (more, shorter K slices) when K
 * allows. Measured (bench_gemm --small-m, H200): on all six DeepSeek-V2-Lite decode shapes
 * at M = 1 and 8 the plan's choice (4 to 16 warps, no split) was the fastest of the plans
 * tried (4, 8, 16 warps; 8 and 16 warps x 2 splits; 4 warps x 4 splits) or within 1% of
 * it, e.g. q_proj bf16
 * M = 1: 8 warps 6.0 us, 16 warps 7.7 us, 8 warps x 2 splits 9.0 us; splitting across CTAs
 * never paid. PDL saved 0.1-0.6 us per GEMM between back-to-back GEMMs (q_proj FP8 M = 1:
 * 4.8 against 5.2 us). */
#define INA_GEMM_SMALL_M_TARGET_WARPS_PER_SM 8
#define INA_GEMM_SMALL_M_MIN_WARPS 4

/* Grid of one small-M launch: `tiles` CTAs of 16 weight rows along N (grid.x) times
 * `splits` along K (grid.y); each CTA's `warps` warps take consecutive K slices of
 * units_per_warp units. Warps add up in shared memory and splits in the partial-sum
 * workspace (last-arriving CTA), both in a fixed order. With pdl, the kernel is launched
 * with programmatic dependent launch: it loads its first weights before waiting for the
 * previous kernel on the stream, and lets the next one start early. */
typedef struct ina_gemm_small_m_plan {
  int32_t warps;          /* 1..INA_GEMM_SMALL_M_MAX_WARPS */
  int32_t splits;         /* >= 1 */
  int64_t tiles;          /* ceil(n / 16) */
  int64_t units_per_warp; /* a multiple of INA_GEMM_SMALL_M_BATCH_UNITS */
  int32_t pdl;            /* 1: programmatic dependent launch */
} ina_gemm_small_m_plan_t;

/* Whether the small-M kernel can take `a` (m, k, mode; with check_operands also the 16-byte
 * alignment of x, W and x's row stride, which the kernel loads in 16-byte pieces). `a` as
 * ina_gemm_check_args leaves it (strides filled in). */
int ina_gemm_small_m_fits(const ina_gemm_args_t *a, int check_operands);
/* Whether AUTO prefers the small-M kernel for an m x n x k GEMM of `mode` that it fits (the
 * measured rule above). */
int ina_gemm_small_m_wins(ina_gemm_mode_t mode, int64_t m, int64_t n, int64_t k);

/* The plan for an n x k GEMM of k_bytes bytes per weight row on sm_count SMs, with at most
 * partial_bytes of partial sums and max_tiles counters for a split launch. */
ina_status_t ina_gemm_small_m_plan(int64_t n, int64_t k_bytes, int sm_count, size_t partial_bytes,
                                   int64_t max_tiles, ina_gemm_small_m_plan_t *plan);
/* A plan of given warps and splits (tests, benchmarks); INA_ERR_UNSUPPORTED when the
 * split's partial sums or counters do not fit. */
ina_status_t ina_gemm_small_m_plan_fixed(int64_t n, int64_t k_bytes, int32_t warps, int32_t splits,
                                         int32_t pdl, size_t partial_bytes, int64_t max_tiles,
                                         ina_gemm_small_m_plan_t *plan);

/* Enqueues the small-M kernel on every row of `p` (p->rows <= 8, x_scale_split as for the
 * FP8 kernel; fp8 selects the mode). partials and counters as for ina_gemm_kernel_launch. */
ina_status_t ina_gemm_small_m_launch(const ina_gemm_kernel_problem_t *p, int fp8,
                                     const ina_gemm_small_m_plan_t *plan, float *partials,
                                     int *counters, void *stream);

/* ina_gemm_run with every row on the small-M kernel (gemm.c): plan NULL takes the handle's
 * plan for the shape. INA_ERR_UNSUPPORTED when the kernel cannot take the GEMM. For tests
 * and benchmarks. */
ina_status_t ina_gemm_run_small_m(const ina_gemm_t *h, const ina_gemm_args_t *args,
                                  const ina_gemm_small_m_plan_t *plan);

/* ---- the grouped GEMM's tiles (gemm_grouped.cu; plan in gemm_plan.c) ------------------ */

/* The grouped kernel's CTA covers tile_m rows of one group by tile_n weight rows. With few
 * rows per group (tile_m 16), "busy CTAs" = (M tiles that can hold rows: min(slots,
 * max_rows)) x ceil(n / tile_n) decides the width: 128 while they reach
 * INA_GEMM_GROUPED_WIDE_CTAS_PER_SM per SM, else 64, and 32 when even 64-wide tiles give
 * fewer than INA_GEMM_GROUPED_NARROW_CTAS_PER_100_SMS per 100 SMs. Only host-known numbers
 * enter, so a captured graph stays valid for any routing. Measured on one H200
 * (bench_gemm_grouped, 64 experts of DeepSeek-V2-Lite, graph replays, 2026-11-30):
 *   1 token (6 rows; busy CTAs at 64 wide: 132 / 192 / 264 for n = 1408 / 2048 / 2816):
 *     32 wide was best at n = 1408 (bf16 13.7 against 15.1 us at 64; FP8 a tie), 64 wide
 *     at n = 2048 (FP8 11.3 against 12.5 us; bf16 a tie) and n = 2816 (FP8 14.8 against
 *     18.7 us, bf16 23.0 against 25.0 us), so 32 wide below 140 per 100 SMs (185);
 *   8 tokens (48 rows; busy CTAs at 128 wide: 528 / 768 / 1056): 64 wide beat 128 by up
 *     to 9% at n = 1408 and 2048 (FP8 32.4 against 35.0 and 35.5 us) and was within 2% at
 *     n = 2816, while at 64 tokens (924 / 1344 / 1848) 128 wide won or tied within 4%
 *     (FP8, n = 1408: 54.4 against 56.4 us): so 64 wide below 6 per SM (792). */
/* Average rows per group (max_rows / groups) from which the grouped GEMM takes 64-row
 * tiles, bf16 and FP8. A decode step of B tokens at top-k over E experts gives B k / E rows
 * per expert (V2-Lite, batch 256: 24): with 16-row tiles most experts then span two or
 * more tiles, each reading the expert's weight again (bench_decode, batch 256, bf16: the
 * grouped GEMMs took 12.3 of an 18.9 ms step, 2.3 TB/s of expert weights). Measured on one
 * H200 (bench_gemm_grouped, V2-Lite experts, 2026-11-30), 16 x 128 against 64 x 128 tiles:
 *   bf16, 256 tokens (24 rows per expert): 161 -> 120 us (n 1408), 296 -> 238 (n 2816),
 *     151 -> 118 (down); 128 tokens (12 rows): 101 against 109 us, so 16 rows;
 *   FP8, 256 tokens: 91 against 108 us, 176 against 205, 90 against 105, and at 128 tokens
 *     twice as slow: the FP8 64-row tile, with its per-block promotion of 8 MMA columns
 *     per warp, runs at about 85 TFLOP/s at these row counts, below the weight's load time
 *     once the tile is mostly padding, so FP8 keeps 16-row tiles up to 64 rows. */
#define INA_GEMM_GROUPED_LARGE_TILE_ROWS 16
#define INA_GEMM_GROUPED_LARGE_TILE_ROWS_FP8 64
#define INA_GEMM_GROUPED_WIDE_CTAS_PER_SM 6
#define INA_GEMM_GROUPED_NARROW_CTAS_PER_100_SMS 140

typedef struct ina_gemm_grouped_tiles {
  int32_t tile_m;    /* 16 or 64 */
  int32_t tile_n;    /* 128, or 64 / 32 with tile_m 16 */
  int64_t m_slots;   /* bounds the M tiles any routing of max_rows rows makes: the smaller
                        of max_rows (a tile holds a row) and (max_rows + num_groups *
                        (tile_m - 1)) / tile_m (at most one partial tile per group) */
  int64_t n_tiles;   /* ceil(n / tile_n) */
  int32_t n_fastest; /* 1: grid (n_tiles, m_slots), the busy first slots dispatched first
                        (tile_m 16, when the slots fit grid.y); 0: grid (m_slots, n_tiles),
                        the M tiles of one group and weight tile together (tile_m 64) */
} ina_gemm_grouped_tiles_t;

/* The tiles ina_gemm_grouped_run uses for bf16 (fp8 0) or block-scaled FP8 (fp8 1). */
ina_status_t ina_gemm_grouped_tiles(int64_t max_rows, int32_t num_groups, int64_t n, int fp8, int sm_count,
                                    ina_gemm_grouped_tiles_t *tiles);
/* The grid for given tiles (tile_m 16 with tile_n 128, 64 or 32; tile_m 64 with 128). */
ina_status_t ina_gemm_grouped_tiles_fixed(int64_t max_rows, int32_t num_groups, int64_t n,
                                          int32_t tile_m, int32_t tile_n,
                                          ina_gemm_grouped_tiles_t *tiles);
/* ina_gemm_grouped_run with the given tiles (gemm_grouped.cu; tests, benchmarks): tile_m,
 * tile_n and n_fastest as given, m_slots at least what ina_gemm_grouped_tiles_fixed says
 * (more only add CTAs that exit early). */
ina_status_t ina_gemm_grouped_run_tiles(const struct ina_gemm_grouped_args *args,
                                        const ina_gemm_grouped_tiles_t *tiles);

#ifdef __cplusplus
}
#endif
#endif
