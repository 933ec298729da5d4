/* The launch plan of ina's FP8 block-scaled kernel (gemm/gemm_internal.h): host-only and
 * pure, so the CPU test covers it.
 *
 * Tile: 128 weight rows per CTA (one weight-scale block, so one weight scale per K block)
 * by tile_m rows of x, the smallest of 8, 16, 32 that holds all rows (32 beyond: a 64-row
 * tile needs more than 255 registers per thread and spills).
 * Split-K: at decode sizes the grid is tiles_n (N / 128) CTAs, e.g. 16 for N = 2048, far
 * fewer than the SMs; such a GEMM only moves W through the chip, so more CTAs in flight
 * mean more bandwidth. When the tiles fill less than one wave, each tile's K blocks are
 * cut into `splits` ranges so that about two CTAs per SM run (two fit in shared memory),
 * each range keeping at least two K blocks for the copy pipeline to overlap. */
#define INA_LOG_SUBSYS "gemm"
#include "core/check.h"
#include "gemm/gemm_internal.h"
#include "gemm/gemm_scale_layout.h"

#define MAX_GRID_Y 65535

static int32_t tile_rows_for(int64_t rows) {
  if (rows <= 8) return 8;
  if (rows <= 16) return 16;
  return 32;
}

ina_status_t ina_gemm_kernel_plan(int64_t rows, int64_t n, int64_t k, int sm_count,
                                  size_t partial_bytes, int64_t max_tiles,
                                  ina_gemm_kernel_plan_t *plan) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(plan != NULL && rows > 0 && n > 0 && k > 0 && sm_count > 0, INA_ERR_INVALID_ARGUMENT,
              "gemm kernel plan: rows %lld, n %lld, k %lld, %d SMs", (long long)rows, (long long)n,
              (long long)k, sm_count);
  plan->tile_m = tile_rows_for(rows);
  plan->tiles_n = (n + INA_GEMM_KERNEL_TILE_N - 1) / INA_GEMM_KERNEL_TILE_N;
  plan->tiles_m = (rows + plan->tile_m - 1) / plan->tile_m;
  plan->splits = 1;
  INA_REQUIRE(plan->tiles_m <= MAX_GRID_Y && plan->tiles_n <= INT32_MAX, INA_ERR_UNSUPPORTED,
              "gemm kernel: %lld rows x n %lld need a %lld x %lld grid, over CUDA's limits",
              (long long)rows, (long long)n, (long long)plan->tiles_n, (long long)plan->tiles_m);

  const int64_t tiles = plan->tiles_n * plan->tiles_m;
  const int64_t kblocks = ina_gemm_kblocks(k);
  if (tiles >= sm_count || tiles > max_tiles) return INA_OK;
  int64_t splits = (2 * (int64_t)sm_count + tiles - 1) / tiles;
  if (splits > kblocks / 2) splits = kblocks / 2;
  if (splits > INA_GEMM_KERNEL_MAX_SPLITS) splits = INA_GEMM_KERNEL_MAX_SPLITS;
  const int64_t tile_bytes =
      (int64_t)plan->tile_m * INA_GEMM_KERNEL_TILE_N * (int64_t)sizeof(float);
  while (splits > 1 && (uint64_t)(tiles * splits * tile_bytes) > (uint64_t)partial_bytes) splits--;
  plan->splits = splits > 1 ? (int32_t)splits : 1;
fail:
  return st;
}
