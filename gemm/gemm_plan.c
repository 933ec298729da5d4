/* The launch plans of gemm/'s kernels (gemm/gemm_internal.h): ina's FP8 block-scaled
 * kernel, the small-M kernel and the grouped kernel's tiles. Host-only and pure, so the CPU
 * tests cover them.
 *
 * FP8 kernel. Tile: 128 weight rows per CTA (one weight-scale block, so one weight scale
 * per K block) by tile_m rows of x, the smallest of 8, 16, 32 that holds all rows (32
 * beyond: a 64-row tile needs more than 255 registers per thread and spills).
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

/* ---- the small-M kernel ------------------------------------------------------------------
 * A decode GEMM (M <= 8) only streams W through the chip, so the plan is about bytes in
 * flight: a warp keeps one batch of loads (16 rows x 256 bytes = 4 KB) in flight, and the
 * plan cuts K into enough slices that about INA_GEMM_SMALL_M_TARGET_WARPS_PER_SM warps per
 * SM stream at once. Slices go to the warps of one CTA first (they add up in shared
 * memory) and across CTAs only beyond INA_GEMM_SMALL_M_MAX_WARPS (the last-arriving CTA
 * adds their partials: an extra round trip through L2). */

#define SMALL_M_TILE_FLOATS (INA_GEMM_SMALL_M_TILE_N * INA_GEMM_SMALL_M_MAX_ROWS)

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int ina_gemm_small_m_fits(const ina_gemm_args_t *a, int check_operands) {
  const int64_t esize = a->mode == INA_GEMM_FP8_BLOCK ? 1 : 2;
  if (a->m < 1 || a->m > INA_GEMM_SMALL_M_MAX_ROWS || a->k < 1 || a->n < 1) return 0;
  if ((a->k * esize) % 16 != 0) return 0; /* W rows in whole 16-byte pieces */
  if (!check_operands) return 1;
  return (uintptr_t)a->x % 16 == 0 && (uintptr_t)a->w % 16 == 0 && (a->ldx * esize) % 16 == 0;
}

int ina_gemm_small_m_wins(ina_gemm_mode_t mode, int64_t m, int64_t n, int64_t k) {
  const int64_t esize = mode == INA_GEMM_FP8_BLOCK ? 1 : 2;
  if (m < 1 || m > INA_GEMM_SMALL_M_MAX_ROWS) return 0;
  if (n <= INA_GEMM_SMALL_M_MAX_WEIGHT_BYTES / (k * esize)) return 1; /* n k esize <= max */
  return mode == INA_GEMM_FP8_BLOCK && m % 4 != 0;
}

ina_status_t ina_gemm_small_m_plan_fixed(int64_t n, int64_t k_bytes, int32_t warps, int32_t splits,
                                         int32_t pdl, size_t partial_bytes, int64_t max_tiles,
                                         ina_gemm_small_m_plan_t *plan) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(plan != NULL && n > 0 && k_bytes > 0 && warps >= 1 &&
                  warps <= INA_GEMM_SMALL_M_MAX_WARPS && splits >= 1 && splits <= MAX_GRID_Y,
              INA_ERR_INVALID_ARGUMENT,
              "gemm small-M plan: n %lld, k bytes %lld, %d warps, %d splits", (long long)n,
              (long long)k_bytes, (int)warps, (int)splits);
  const int64_t tiles = ceil_div(n, INA_GEMM_SMALL_M_TILE_N);
  const int64_t units = ceil_div(k_bytes, INA_GEMM_SMALL_M_UNIT_BYTES);
  INA_REQUIRE(tiles <= INT32_MAX, INA_ERR_UNSUPPORTED,
              "gemm small-M kernel: n %lld needs %lld CTAs, over CUDA's grid limit", (long long)n,
              (long long)tiles);
  if (splits > 1)
    INA_REQUIRE(tiles <= max_tiles && (uint64_t)(tiles * splits * SMALL_M_TILE_FLOATS) *
                                              sizeof(float) <=
                                          (uint64_t)partial_bytes,
                INA_ERR_UNSUPPORTED,
                "gemm small-M kernel: split-K %d over %lld tiles needs more partial sums or "
                "counters than the handle has (%zu bytes, %lld tiles)",
                (int)splits, (long long)tiles, partial_bytes, (long long)max_tiles);
  plan->warps = warps;
  plan->splits = splits;
  plan->tiles = tiles;
  plan->units_per_warp = ceil_div(ceil_div(units, (int64_t)warps * splits),
                                  INA_GEMM_SMALL_M_BATCH_UNITS) *
                         INA_GEMM_SMALL_M_BATCH_UNITS;
  plan->pdl = pdl != 0;
fail:
  return st;
}

ina_status_t ina_gemm_small_m_plan(int64_t n, int64_t k_bytes, int sm_count, size_t partial_bytes,
                                   int64_t max_tiles, ina_gemm_small_m_plan_t *plan) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(plan != NULL && n > 0 && k_bytes > 0 && sm_count > 0, INA_ERR_INVALID_ARGUMENT,
              "gemm small-M plan: n %lld, k bytes %lld, %d SMs", (long long)n, (long long)k_bytes,
              sm_count);
  const int64_t tiles = ceil_div(n, INA_GEMM_SMALL_M_TILE_N);
  const int64_t batches =
      ceil_div(ceil_div(k_bytes, INA_GEMM_SMALL_M_UNIT_BYTES), INA_GEMM_SMALL_M_BATCH_UNITS);
  /* Slices per tile for the target, in whole batches each (a slice of 1.5 batches would
   * cost two round trips, as 2 do). */
  int64_t wanted = ceil_div((int64_t)INA_GEMM_SMALL_M_TARGET_WARPS_PER_SM * sm_count, tiles);
  if (wanted < INA_GEMM_SMALL_M_MIN_WARPS) wanted = INA_GEMM_SMALL_M_MIN_WARPS;
  if (wanted > batches) wanted = batches;
  const int64_t per_slice = batches / wanted;
  const int64_t slices = ceil_div(batches, per_slice);
  int64_t splits = ceil_div(slices, INA_GEMM_SMALL_M_MAX_WARPS);
  if (splits > 1 && (tiles > max_tiles || (uint64_t)(tiles * splits * SMALL_M_TILE_FLOATS) *
                                                  sizeof(float) >
                                              (uint64_t)partial_bytes))
    splits = 1;
  int64_t warps = ceil_div(slices, splits);
  if (warps > INA_GEMM_SMALL_M_MAX_WARPS) warps = INA_GEMM_SMALL_M_MAX_WARPS;
  INA_CHECK(ina_gemm_small_m_plan_fixed(n, k_bytes, (int32_t)warps, (int32_t)splits, 1,
                                        partial_bytes, max_tiles, plan));
fail:
  return st;
}

/* ---- the grouped kernel's tiles ------------------------------------------------------------ */

#define GROUPED_SMALL_TILE_M 16
#define GROUPED_LARGE_TILE_M 64
#define GROUPED_WIDE_TILE_N 128
#define GROUPED_NARROWEST_TILE_N 32

ina_status_t ina_gemm_grouped_tiles_fixed(int64_t max_rows, int32_t num_groups, int64_t n,
                                          int32_t tile_m, int32_t tile_n,
                                          ina_gemm_grouped_tiles_t *tiles) {
  ina_status_t st = INA_OK;
  const int valid_tile = (tile_m == GROUPED_SMALL_TILE_M &&
                          (tile_n == 128 || tile_n == 64 || tile_n == 32)) ||
                         (tile_m == GROUPED_LARGE_TILE_M && tile_n == 128);
  INA_REQUIRE(tiles != NULL && max_rows >= 0 && num_groups >= 1 && n >= 1 && valid_tile,
              INA_ERR_INVALID_ARGUMENT,
              "grouped gemm tiles: max_rows %lld, %d groups, n %lld, tile %d x %d",
              (long long)max_rows, (int)num_groups, (long long)n, (int)tile_m, (int)tile_n);
  tiles->tile_m = tile_m;
  tiles->tile_n = tile_n;
  /* At most one partial tile per group beyond max_rows / tile_m full ones, and no more
   * tiles than rows. */
  tiles->m_slots = (max_rows + (int64_t)num_groups * (tile_m - 1)) / tile_m;
  if (tiles->m_slots > max_rows) tiles->m_slots = max_rows;
  tiles->n_tiles = ceil_div(n, tile_n);
  tiles->n_fastest = tile_m == GROUPED_SMALL_TILE_M && tiles->m_slots <= MAX_GRID_Y;
fail:
  return st;
}

ina_status_t ina_gemm_grouped_tiles(int64_t max_rows, int32_t num_groups, int64_t n, int fp8, int sm_count,
                                    ina_gemm_grouped_tiles_t *tiles) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(sm_count > 0 && num_groups >= 1, INA_ERR_INVALID_ARGUMENT,
              "grouped gemm tiles: %d SMs, %d groups", sm_count, (int)num_groups);
  /* Large groups take 64-row tiles: 16-row tiles would split the average group, reading
   * its weight once per tile (the thresholds per mode are in gemm_internal.h). */
  const int64_t large = fp8 ? INA_GEMM_GROUPED_LARGE_TILE_ROWS_FP8 : INA_GEMM_GROUPED_LARGE_TILE_ROWS;
  const int32_t tile_m = max_rows >= large * num_groups ? GROUPED_LARGE_TILE_M : GROUPED_SMALL_TILE_M;
  int32_t tile_n = GROUPED_WIDE_TILE_N;
  INA_CHECK(ina_gemm_grouped_tiles_fixed(max_rows, num_groups, n, tile_m, tile_n, tiles));
  if (tile_m != GROUPED_SMALL_TILE_M) return INA_OK;
  /* M tiles that can hold rows: the slots (no more than the rows). */
  const int64_t busy_m_tiles = tiles->m_slots;
  if (busy_m_tiles * ceil_div(n, GROUPED_WIDE_TILE_N) <
      (int64_t)INA_GEMM_GROUPED_WIDE_CTAS_PER_SM * sm_count)
    tile_n = GROUPED_WIDE_TILE_N / 2;
  if (tile_n < GROUPED_WIDE_TILE_N &&
      busy_m_tiles * ceil_div(n, tile_n) * 100 <
          (int64_t)INA_GEMM_GROUPED_NARROW_CTAS_PER_100_SMS * sm_count)
    tile_n = GROUPED_NARROWEST_TILE_N;
  INA_CHECK(ina_gemm_grouped_tiles_fixed(max_rows, num_groups, n, tile_m, tile_n, tiles));
fail:
  return st;
}
