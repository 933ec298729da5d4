/* Grouped GEMMs of gemm/gemm_grouped.h on mma.sync: one launch runs every group (routed
 * expert) of a MoE layer, with the rows per group known only to the device.
 *
 * ---- Work per CTA ----------------------------------------------------------------------
 * A tile is kTileM rows of one group by kTileN weight rows (128, 64 or 32; for FP8 inside
 * one 128-row scale block, so one weight scale per CTA and K block). The grid is fixed by
 * host-known numbers only, so it can be captured once in a CUDA graph:
 *   M-tile slots = min(max_rows, floor((max_rows + num_groups * (kTileM - 1)) / kTileM)),
 *            a bound on sum_g ceil(rows_g / kTileM) for any rows_g summing to at most
 *            max_rows (every tile holds a row; at most one partial tile per group);
 *   weight tiles = ceil(n / kTileN).
 * CTA (slot s, weight tile t) reads the offsets and takes the s-th M tile in group order:
 * each pass over 128 groups counts each group's tiles, ceil(rows_g / kTileM), in one
 * thread, a block-wide prefix sum places them, and the thread whose group holds tile s
 * publishes (group, first row, end row). A slot past the last tile exits before loading
 * anything, so groups with no rows cost nothing beyond that early exit. The offsets are
 * clamped to [0, max_rows] first, so no offsets can make a CTA touch a row outside the
 * launch.
 * Grid order (p.n_fastest). 64-row tiles: grid (slots, weight tiles), slots
 * fastest, so the M tiles of one group and weight tile are resident together and share
 * the weight tile through L2. Decode (kTileM 16): grid (weight tiles, slots), weight
 * tiles fastest, so the CTAs of the first slots, the ones that hold rows when some groups
 * are empty, are dispatched first instead of each waiting behind the early exits of the
 * empty slots before it in the grid's order (one token, 60 slots before the bound by
 * max_rows: 17.1 -> 12.3 us, FP8, n = 1408, 128-wide tiles).
 *
 * ---- Tile height and width (gemm_plan.c: ina_gemm_grouped_tiles) -------------------------
 * kTileM = 16 when the average group has fewer than 16 rows in bf16, 64 in FP8 (max_rows /
 * num_groups: decode, e.g. 64 tokens x top-6 over 64 experts, about 6 rows each), else 64
 * (larger bf16 decode batches and prefill; gemm_internal.h has the measurements). Decode is bound by reading each expert's weight once: a 16-row
 * tile keeps the wasted tensor work small (at 6 rows, 10 of 16 MMA columns idle instead of
 * 58 of 64) and rarely splits a group in two tiles, each of which would read the weight
 * again. From 16 rows on average most groups would split, so bf16 64-row tiles read each
 * weight once (batch 256: 24 rows per expert); prefill groups hold hundreds of rows, and 64-row
 * tiles read each weight tile 4 times less often and quadruple the MMA work per byte of
 * shared memory loaded.
 * kTileN = 128, unless so few M tiles can hold rows that the CTAs would not fill the SMs
 * evenly (one token: 6 rows over 6 experts make 6 busy M tiles, 66 CTAs at n = 1408):
 * then 64 or 32 weight rows per CTA multiply the CTAs that stream weights by 2 or 4 (the
 * measured thresholds are in gemm_internal.h). The four warps then split each stage's
 * four 32-byte K steps among them (kWarpsK = 128 / kTileN warps per weight-row group of
 * 32) and add their tiles up in shared memory in warp order at the end; the narrower
 * stages are shallower, so the pipeline is deeper (5 or 8 stages) to keep the same bytes
 * in flight.
 *
 * ---- Inner loop (as gemm_fp8_kernel.cu) -------------------------------------------------
 * The weight is the MMA's A operand (16 weight rows), x the B operand (8 rows of x), both
 * K-contiguous, fetched by non-transposed ldmatrix from rows padded to 144 bytes. One
 * pipeline stage holds 128 bytes of K of every row (128 e4m3 values = one FP8 scale block,
 * or 64 bf16 values), filled by cp.async, 3 stages deep; ragged edges (rows past the group
 * or the weight, K past the end) are zero-filled and contribute nothing. One ldmatrix
 * address pattern serves both modes: a 32-byte step of K is one m16n8k32 e4m3 MMA or one
 * m16n8k16 bf16 MMA with identical fragment layouts. FP8 sums each K block from zero in
 * fp32 and adds it to the accumulator times x_scale[row, kb] * w_scale[n / 128, kb]
 * (DeepGEMM's promotion); bf16 accumulates directly.
 *
 * ---- Epilogue --------------------------------------------------------------------------
 * The fp32 tile goes through shared memory (one copy per K-warp, added in warp order) so
 * that each thread stores 8 consecutive bf16 (16 bytes) of one row of y; only rows of the
 * tile's group and columns below n are written. */
#define INA_LOG_SUBSYS "gemm"
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "core/cuda_check.h"
#include "core/cuda_math.cuh"
#include "core/ptx.cuh"
#include "gemm/gemm_grouped.h"
#include "gemm/gemm_internal.h"

namespace {

using ina_ptx::cp_async16;
using ina_ptx::cp_async4;
using ina_ptx::cp_async_commit;
using ina_ptx::cp_async_wait;
using ina_ptx::ldmatrix_x4;
using ina_ptx::mma_bf16;
using ina_ptx::mma_e4m3;
using ina_ptx::smem_addr;

using ina_cuda::pack_bf16;

constexpr int kScaleBlock = 128;                /* FP8 weight rows sharing a scale */
constexpr int kKBytesPerStage = 128;            /* K bytes per pipeline stage */
constexpr int kStepsPerStage = kKBytesPerStage / 32; /* 32-byte MMA steps */
constexpr int kRowBytes = kKBytesPerStage + 16; /* padded shared-memory row */
constexpr int kCopiesPerRow = kKBytesPerStage / 16;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 32; /* weight rows per warp: two m16 tiles */
constexpr int kMaxGridY = 65535;

template <int kTileM, int kTileN>
struct Shape {
  static constexpr int kNTiles = kTileM / 8;
  static constexpr int kWarpsN = kTileN / kWarpRows;      /* warps over the weight rows */
  static constexpr int kWarpsK = kWarps / kWarpsN;        /* warps over a stage's K steps */
  static constexpr int kStepsPerWarp = kStepsPerStage / kWarpsK;
  static constexpr int kStages = kTileN == 128 ? 3 : kTileN == 64 ? 5 : 8;
  static constexpr int kOutLd = kTileN + 4; /* output tile row, floats: conflict-free */
  static constexpr int kWBytes = kTileN * kRowBytes;
  static constexpr int kXBytes = kTileM * kRowBytes;
  /* FP8: x scales of the stage's K block, then the weight scale, padded to 16 bytes. */
  static constexpr int kScaleBytes = (kTileM + 4) * 4;
  static constexpr int kStageBytes = kWBytes + kXBytes + kScaleBytes;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kOutBytes = kWarpsK * kTileM * kOutLd * 4;
  static constexpr int kSmemBytes = kPipeBytes > kOutBytes ? kPipeBytes : kOutBytes;
  static_assert(kStageBytes % 16 == 0, "stages must stay 16-byte aligned");
  static_assert(kWarpsN * kWarpsK == kWarps && kStepsPerWarp * kWarpsK == kStepsPerStage,
                "the warps cover the tile's rows and every K step exactly once");
  static_assert(kScaleBlock % kTileN == 0, "a tile lies in one FP8 weight-scale block");
  static_assert(kTileN * kCopiesPerRow % kThreads == 0, "whole weight copies per thread");
};

struct Params {
  const int32_t *offsets;
  const int32_t *row_ends; /* NULL: offsets[g + 1] */
  int num_groups;
  int max_rows;
  int64_t n;
  int64_t k_bytes;     /* bytes of K per row: k (FP8) or 2 k (bf16) */
  int num_stages_k;    /* pipeline stages covering K: ceil(k_bytes / 128) */
  const uint8_t *x;
  int64_t ldx_bytes;
  const float *x_scale; /* FP8: [max_rows, kblocks] */
  int64_t kblocks, w_scale_ld;
  const void *const *w;
  const float *const *w_scale;
  uint16_t *y;
  int64_t ldy;
  int n_fastest; /* grid.x runs over the weight tiles, grid.y over the M-tile slots */
};

/* The tile a CTA computes. */
struct Tile {
  int group;
  int row_begin, row_end; /* rows of this tile: [row_begin, min(row_begin + kTileM, row_end)) */
};

__device__ __forceinline__ int clamp_row(int r, int max_rows) {
  return r < 0 ? 0 : r > max_rows ? max_rows : r;
}

/* Finds M tile `slot` in group order (see the header comment); false when the slot lies
 * past the last tile. Called by every thread of the CTA; the result is uniform. */
template <int kTileM>
__device__ bool find_tile(const Params &p, int64_t slot, Tile *tile) {
  __shared__ long long warp_totals[kWarps];
  __shared__ Tile found;
  __shared__ int is_found;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) is_found = 0;
  long long before = 0; /* tiles of the groups of earlier passes */
  for (int base = 0; base < p.num_groups; base += kThreads) {
    const int g = base + tid;
    int begin = 0, end = 0;
    long long tiles = 0;
    if (g < p.num_groups) {
      begin = clamp_row(p.offsets[g], p.max_rows);
      end = clamp_row(p.row_ends ? p.row_ends[g] : p.offsets[g + 1], p.max_rows);
      if (end > begin) tiles = (end - begin + kTileM - 1) / kTileM;
    }
    long long inclusive = tiles;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const long long v = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
      if (lane >= d) inclusive += v;
    }
    if (lane == 31) warp_totals[warp] = inclusive;
    __syncthreads();
    long long first = before + inclusive - tiles, pass_total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; w++) {
      if (w < warp) first += warp_totals[w];
      pass_total += warp_totals[w];
    }
    if (tiles > 0 && slot >= first && slot < first + tiles) {
      found.group = g;
      found.row_begin = begin + (int)(slot - first) * kTileM;
      found.row_end = end;
      is_found = 1;
    }
    before += pass_total;
    __syncthreads(); /* `found` visible; warp_totals read before the next pass writes it */
    if (is_found || before > slot) break;
  }
  if (!is_found) return false;
  *tile = found;
  return true;
}

/* Enqueues the copies of K stage `ks` (bytes 128 ks .. 128 ks + 127 of every row). */
template <int kTileM, int kTileN, bool kFp8>
__device__ __forceinline__ void load_stage(const Params &p, uint8_t *stage_base, int ks,
                                           const Tile &t, const uint8_t *w, const float *w_scale,
                                           int n_tile, int tid) {
  using S = Shape<kTileM, kTileN>;
  uint8_t *w_tile = stage_base;
  uint8_t *x_tile = w_tile + S::kWBytes;
  float *scales = reinterpret_cast<float *>(x_tile + S::kXBytes);
  const int64_t k0 = (int64_t)ks * kKBytesPerStage;
  const int64_t n0 = (int64_t)n_tile * kTileN;
#pragma unroll
  for (int i = 0; i < kTileN * kCopiesPerRow / kThreads; i++) {
    const int c = tid + i * kThreads, r = c / kCopiesPerRow, ch = c % kCopiesPerRow;
    const int64_t n = n0 + r, kk = k0 + ch * 16;
    const bool valid = n < p.n && kk < p.k_bytes;
    cp_async16(smem_addr(w_tile + r * kRowBytes + ch * 16), valid ? w + n * p.k_bytes + kk : w, valid ? 16 : 0);
  }
#pragma unroll
  for (int i = 0; i < (kTileM * kCopiesPerRow + kThreads - 1) / kThreads; i++) {
    const int c = tid + i * kThreads;
    if (c >= kTileM * kCopiesPerRow) break;
    const int r = c / kCopiesPerRow, ch = c % kCopiesPerRow;
    const int64_t m = (int64_t)t.row_begin + r, kk = k0 + ch * 16;
    const bool valid = m < t.row_end && kk < p.k_bytes;
    cp_async16(smem_addr(x_tile + r * kRowBytes + ch * 16), valid ? p.x + m * p.ldx_bytes + kk : p.x, valid ? 16 : 0);
  }
  if (kFp8) {
    if (tid < kTileM) {
      const int64_t m = (int64_t)t.row_begin + tid;
      const bool valid = m < t.row_end;
      cp_async4(smem_addr(scales + tid), valid ? p.x_scale + m * p.kblocks + ks : p.x_scale, valid ? 4 : 0);
    } else if (tid == kThreads - 1) {
      /* The tile's scale block: n0 / 128 = n_tile / (128 / kTileN). */
      const int64_t block_row = n_tile / (kScaleBlock / kTileN);
      cp_async4(smem_addr(scales + kTileM), w_scale + block_row * p.w_scale_ld + ks, 4);
    }
  }
}

/* One stage: this warp's share of the four 32-byte K steps (steps warp_k, warp_k +
 * kWarpsK, ...). FP8 sums them from zero and adds the scaled block to acc; bf16
 * accumulates into acc directly. */
template <int kTileM, int kTileN, bool kFp8>
__device__ __forceinline__ void compute_stage(const uint8_t *stage_base,
                                              float (&acc)[2][kTileM / 8][4], int warp_n,
                                              int warp_k, int lane) {
  using S = Shape<kTileM, kTileN>;
  constexpr int kNT = S::kNTiles;
  const uint8_t *x_tile = stage_base + S::kWBytes;
  const uint32_t w_base = smem_addr(stage_base), x_base = smem_addr(x_tile);
  float inner[2][kNT][4];
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int j = 0; j < kNT; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) inner[mi][j][r] = 0.0f;
#pragma unroll
  for (int i = 0; i < S::kStepsPerWarp; i++) {
    const int step = warp_k + i * S::kWarpsK;
    /* A: (rows 0-7, bytes 0-15), (rows 8-15, bytes 0-15), (rows 0-7, bytes 16-31),
     * (rows 8-15, bytes 16-31) of each m16 tile = fragment registers a0..a3 of both MMAs. */
    uint32_t a[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++) {
      const int row = warp_n * kWarpRows + mi * 16 + lane % 8 + 8 * ((lane / 8) % 2);
      const int col = step * 32 + 16 * (lane / 16);
      ldmatrix_x4(a[mi], w_base + row * kRowBytes + col);
    }
    /* B: per n8 tile, bytes 0-15 and 16-31 of the step = fragment registers b0, b1. */
    uint32_t b[kNT][2];
#pragma unroll
    for (int j = 0; j < kNT; j += 2) {
      uint32_t r[4];
      const int row = 8 * (j + lane / 16) + lane % 8;
      ldmatrix_x4(r, x_base + row * kRowBytes + step * 32 + 16 * ((lane / 8) % 2));
      b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
      for (int j = 0; j < kNT; j++) {
        if (kFp8)
          mma_e4m3(inner[mi][j], a[mi], b[j][0], b[j][1]);
        else
          mma_bf16(acc[mi][j], a[mi], b[j][0], b[j][1]);
      }
  }
  if (!kFp8) return;
  /* Registers 0 and 2 hold x row 8j + 2 quad, registers 1 and 3 the next row. */
  const float *scales = reinterpret_cast<const float *>(x_tile + S::kXBytes);
  const int quad = lane % 4;
  const float w_scale = scales[kTileM];
#pragma unroll
  for (int j = 0; j < kNT; j++) {
    const float s0 = w_scale * scales[8 * j + 2 * quad];
    const float s1 = w_scale * scales[8 * j + 2 * quad + 1];
#pragma unroll
    for (int mi = 0; mi < 2; mi++) {
      acc[mi][j][0] = fmaf(inner[mi][j][0], s0, acc[mi][j][0]);
      acc[mi][j][1] = fmaf(inner[mi][j][1], s1, acc[mi][j][1]);
      acc[mi][j][2] = fmaf(inner[mi][j][2], s0, acc[mi][j][2]);
      acc[mi][j][3] = fmaf(inner[mi][j][3], s1, acc[mi][j][3]);
    }
  }
}

template <int kTileM, int kTileN, bool kFp8>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(const Params p) {
  using S = Shape<kTileM, kTileN>;
  constexpr int kNT = S::kNTiles;
  constexpr int kOutLd = S::kOutLd;
  extern __shared__ __align__(16) uint8_t smem[];

  /* Which grid dimension runs over the weight tiles: see ina_gemm_grouped_tiles_t. */
  const int64_t slot = p.n_fastest ? blockIdx.y : blockIdx.x;
  const int n_tile = p.n_fastest ? blockIdx.x : blockIdx.y;
  Tile t;
  if (!find_tile<kTileM>(p, slot, &t)) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_n = S::kWarpsK == 1 ? warp : warp % S::kWarpsN;
  const int warp_k = S::kWarpsK == 1 ? 0 : warp / S::kWarpsN;
  const int quad = lane % 4, group = lane / 4; /* mma fragment coordinates */
  const int64_t n0 = (int64_t)n_tile * kTileN;
  const uint8_t *w = static_cast<const uint8_t *>(p.w[t.group]);
  const float *w_scale = kFp8 ? p.w_scale[t.group] : nullptr;

  float acc[2][kNT][4];
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int j = 0; j < kNT; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) acc[mi][j][r] = 0.0f;

  /* Pipeline: stage i % kStages holds K stage i; every iteration commits one copy group
   * (possibly empty), so "all but kStages - 2 groups done" means stage i has landed. */
#pragma unroll
  for (int s = 0; s < S::kStages - 1; s++) {
    if (s < p.num_stages_k)
      load_stage<kTileM, kTileN, kFp8>(p, smem + s * S::kStageBytes, s, t, w, w_scale, n_tile,
                                       tid);
    cp_async_commit();
  }
  for (int i = 0; i < p.num_stages_k; i++) {
    cp_async_wait<S::kStages - 2>();
    __syncthreads(); /* stage i visible to all; everyone is done with stage i - 1's buffer */
    const int next = i + S::kStages - 1;
    if (next < p.num_stages_k)
      load_stage<kTileM, kTileN, kFp8>(p, smem + (next % S::kStages) * S::kStageBytes, next, t, w,
                                       w_scale, n_tile, tid);
    cp_async_commit();
    compute_stage<kTileM, kTileN, kFp8>(smem + (i % S::kStages) * S::kStageBytes, acc, warp_n,
                                        warp_k, lane);
  }
  cp_async_wait<0>();
  __syncthreads(); /* the pipeline's shared memory becomes the output tile */

  /* One output tile per K-warp, added in warp order below. */
  constexpr int kOutFloats = kTileM * kOutLd;
  float *tiles = reinterpret_cast<float *>(smem);
  float *tile = tiles + warp_k * kOutFloats;
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int j = 0; j < kNT; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const int n_local = warp_n * kWarpRows + mi * 16 + group + 8 * (r / 2);
        const int m_local = 8 * j + 2 * quad + r % 2;
        tile[m_local * kOutLd + n_local] = acc[mi][j][r];
      }
  __syncthreads();

  constexpr int kChunksPerTileRow = kTileN / 8;
  for (int c = tid; c < kTileM * kChunksPerTileRow; c += kThreads) {
    const int m_local = c / kChunksPerTileRow, n_local = (c % kChunksPerTileRow) * 8;
    const int64_t m = (int64_t)t.row_begin + m_local, n = n0 + n_local;
    if (m >= t.row_end || n >= p.n) continue; /* n is a multiple of 8: chunks are whole */
    const float *src = tiles + m_local * kOutLd + n_local;
    float4 lo = *reinterpret_cast<const float4 *>(src);
    float4 hi = *reinterpret_cast<const float4 *>(src + 4);
#pragma unroll
    for (int wk = 1; wk < S::kWarpsK; wk++) {
      const float4 l2 = *reinterpret_cast<const float4 *>(src + wk * kOutFloats);
      const float4 h2 = *reinterpret_cast<const float4 *>(src + wk * kOutFloats + 4);
      lo.x += l2.x, lo.y += l2.y, lo.z += l2.z, lo.w += l2.w;
      hi.x += h2.x, hi.y += h2.y, hi.z += h2.z, hi.w += h2.w;
    }
    *reinterpret_cast<uint4 *>(p.y + m * p.ldy + n) =
        make_uint4(pack_bf16(lo.x, lo.y), pack_bf16(lo.z, lo.w), pack_bf16(hi.x, hi.y),
                   pack_bf16(hi.z, hi.w));
  }
}

/* Devices whose shared-memory limit was raised, one bit per kernel instantiation: the
 * attribute is per device and the first run on a device sets it (racing first runs set
 * it twice, harmlessly). */
constexpr int kMaxTrackedDevices = 64;
std::atomic<unsigned> g_smem_raised[kMaxTrackedDevices];

/* The instantiations: (16, 128), (16, 64), (16, 32), (64, 128), each bf16 and FP8. */
template <int kTileM, int kTileN>
constexpr int instance_index() {
  return kTileM == 64 ? 3 : kTileN == 128 ? 0 : kTileN == 64 ? 1 : 2;
}

template <int kTileM, int kTileN, bool kFp8>
cudaError_t launch(const Params &p, dim3 grid, cudaStream_t stream) {
  using S = Shape<kTileM, kTileN>;
  constexpr unsigned kBit = 1u << (instance_index<kTileM, kTileN>() * 2 + kFp8);
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const bool tracked = device >= 0 && device < kMaxTrackedDevices;
  if (!tracked || !(g_smem_raised[device].load(std::memory_order_acquire) & kBit)) {
    e = cudaFuncSetAttribute(grouped_gemm_kernel<kTileM, kTileN, kFp8>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
    if (e != cudaSuccess) return e;
    if (tracked) g_smem_raised[device].fetch_or(kBit, std::memory_order_release);
  }
  grouped_gemm_kernel<kTileM, kTileN, kFp8><<<grid, kThreads, S::kSmemBytes, stream>>>(p);
  return cudaSuccess;
}

template <bool kFp8>
cudaError_t launch_tiles(const Params &p, const ina_gemm_grouped_tiles_t &tiles, dim3 grid,
                         cudaStream_t stream) {
  if (tiles.tile_m == 64) return launch<64, 128, kFp8>(p, grid, stream);
  if (tiles.tile_n == 64) return launch<16, 64, kFp8>(p, grid, stream);
  if (tiles.tile_n == 32) return launch<16, 32, kFp8>(p, grid, stream);
  return launch<16, 128, kFp8>(p, grid, stream);
}

}  // namespace

extern "C" ina_status_t ina_gemm_grouped_run_tiles(const ina_gemm_grouped_args_t *args,
                                                   const ina_gemm_grouped_tiles_t *tiles) {
  ina_status_t st = INA_OK;
  ina_gemm_grouped_args_t a;
  ina_gemm_grouped_tiles_t checked;
  Params p;
  dim3 grid;
  cudaStream_t stream = NULL;
  cudaError_t launched = cudaSuccess;
  const bool fp8 = args && args->mode == INA_GEMM_FP8_BLOCK;
  const int64_t x_size = fp8 ? 1 : 2;
  INA_CHECK(ina_gemm_grouped_check_args(args, "ina_gemm_grouped_run", 1, &a));
  INA_REQUIRE(tiles != NULL, INA_ERR_INVALID_ARGUMENT, "ina_gemm_grouped_run: tiles is NULL");
  if (a.max_rows == 0) goto fail;
  /* The grid follows from the tile and the arguments; the caller may ask for more slots
   * than the bound (they exit early), never fewer. */
  INA_CHECK(ina_gemm_grouped_tiles_fixed(a.max_rows, a.num_groups, a.n, tiles->tile_m,
                                         tiles->tile_n, &checked));
  INA_REQUIRE(tiles->m_slots >= checked.m_slots, INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_grouped_run: %lld M-tile slots, fewer than the %lld max_rows %lld can "
              "need",
              (long long)tiles->m_slots, (long long)checked.m_slots, (long long)a.max_rows);
  checked.m_slots = tiles->m_slots;
  INA_REQUIRE(checked.m_slots <= (tiles->n_fastest ? kMaxGridY : INT32_MAX) &&
                  checked.n_tiles <= (tiles->n_fastest ? INT32_MAX : kMaxGridY),
              INA_ERR_UNSUPPORTED,
              "ina_gemm_grouped_run: grid of %lld M tiles x %lld N tiles (max_rows %lld, "
              "%d groups, n %lld) exceeds CUDA's limits",
              (long long)checked.m_slots, (long long)checked.n_tiles, (long long)a.max_rows,
              (int)a.num_groups, (long long)a.n);
  p.offsets = a.offsets;
  p.row_ends = a.row_ends;
  p.num_groups = a.num_groups;
  p.max_rows = (int)a.max_rows;
  p.n = a.n;
  p.k_bytes = a.k * x_size;
  p.num_stages_k = (int)((p.k_bytes + kKBytesPerStage - 1) / kKBytesPerStage);
  p.x = static_cast<const uint8_t *>(a.x);
  p.ldx_bytes = a.ldx * x_size;
  p.x_scale = a.x_scale;
  p.kblocks = (a.k + 127) / 128;
  p.w_scale_ld = (p.kblocks + 3) / 4 * 4;
  p.w = a.w;
  p.w_scale = a.w_scale;
  p.y = a.y;
  p.ldy = a.ldy;
  p.n_fastest = tiles->n_fastest != 0;
  grid = p.n_fastest ? dim3((unsigned)checked.n_tiles, (unsigned)checked.m_slots)
                     : dim3((unsigned)checked.m_slots, (unsigned)checked.n_tiles);
  stream = static_cast<cudaStream_t>(a.stream);
  launched = fp8 ? launch_tiles<true>(p, checked, grid, stream)
                 : launch_tiles<false>(p, checked, grid, stream);
  INA_CUDA_CHECK(launched);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}

extern "C" ina_status_t ina_gemm_grouped_run(const ina_gemm_grouped_args_t *args) {
  ina_status_t st = INA_OK;
  ina_gemm_grouped_args_t a;
  ina_gemm_grouped_tiles_t tiles;
  int device = 0, sm_count = 0;
  INA_CHECK(ina_gemm_grouped_check_args(args, "ina_gemm_grouped_run", 1, &a));
  if (a.max_rows == 0) goto fail;
  INA_CUDA_CHECK(cudaGetDevice(&device));
  INA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  /* The tile shape of plan_groups groups; its slot bound covers num_groups <= plan_groups. */
  INA_CHECK(ina_gemm_grouped_tiles(a.max_rows, a.plan_groups, a.n, a.mode == INA_GEMM_FP8_BLOCK, sm_count, &tiles));
  INA_CHECK(ina_gemm_grouped_run_tiles(args, &tiles));
fail:
  return st;
}
