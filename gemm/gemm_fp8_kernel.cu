/* ina's FP8 block-scaled GEMM kernel (gemm/gemm_internal.h): the rows cuBLASLt cannot
 * take (M % 4 of them, or all of a GEMM cuBLASLt refuses), on mma.sync.
 *
 * Roles: the weight is the MMA's A operand (16 weight rows x 32 K), x the B operand (32 K
 * x 8 rows of x), so the 8-wide MMA dimension runs over the few rows of x a decode step
 * has. Both operands are K-contiguous in memory ("TN"), so ldmatrix (non-transposed)
 * yields the e4m3 fragments of m16n8k32 directly: an 8x8 b16 matrix is 8 rows of 16
 * bytes, and lane l receives bytes 4(l%4)..+3 of row l/4, which is the A/B fragment
 * layout of m16n8k32 for 8-bit types.
 *
 * CTA: 4 warps over 128 weight rows (32 each, two m16 tiles) by tile_m rows of x (n8
 * tiles). K advances one 128-wide scale block per pipeline stage (cp.async, 3-4 stages,
 * smem rows padded to 144 bytes so the 8 row addresses of an ldmatrix fall in distinct
 * banks). Each K block is accumulated from zero in fp32 ("inner") and then added to the
 * main accumulator times w_scale[n/128, kb] * x_scale[m, kb]; the weight scale is one per
 * CTA and block since a CTA covers exactly one 128-row weight block. Ragged edges (rows of
 * x or W past the matrix, a partial last K block) are zero-filled by cp.async, so they
 * contribute nothing, and are not stored.
 *
 * Epilogue: the tile goes through shared memory so that each thread stores 8 consecutive
 * outputs (16 bytes of bf16), adding beta * residual. With split-K, each CTA writes its
 * fp32 tile to the partial-sum workspace; the CTA that arrives last at its tile (an
 * atomic counter) adds all partials in split order, so the result does not depend on
 * arrival order, stores the outputs and resets the counter for the next launch. */
#define INA_LOG_SUBSYS "gemm"
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/cuda_check.h"
#include "core/cuda_math.cuh"
#include "core/ptx.cuh"
#include "gemm/gemm_internal.h"
#include "gemm/gemm_scale_layout.h"

namespace {

using ina_ptx::cp_async16;
using ina_ptx::cp_async4;
using ina_ptx::cp_async_commit;
using ina_ptx::cp_async_wait;
using ina_ptx::ldmatrix_x2;
using ina_ptx::ldmatrix_x4;
using ina_ptx::mma_e4m3;
using ina_ptx::smem_addr;

constexpr int kTileN = INA_GEMM_KERNEL_TILE_N; /* weight rows per CTA */
constexpr int kBlockK = 128;                   /* K per pipeline stage: one scale block */
constexpr int kRowBytes = kBlockK + 16;        /* padded shared-memory row */
constexpr int kChunksPerRow = kBlockK / 16;    /* 16-byte copies per row */
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = kTileN / kWarps; /* 32: two m16 tiles per warp */
constexpr int kOutLd = kTileN + 4;         /* output tile row, floats: conflict-free stores */

template <int kTileM>
struct Shape {
  static constexpr int kNTiles = kTileM / 8;
  static constexpr int kStages = kTileM <= 16 ? 4 : 3;
  static constexpr int kWBytes = kTileN * kRowBytes;
  static constexpr int kXBytes = kTileM * kRowBytes;
  /* x scales of the stage's K block, then the weight scale, padded to 16 bytes. */
  static constexpr int kScaleBytes = (kTileM + 4) * 4;
  static constexpr int kStageBytes = kWBytes + kXBytes + kScaleBytes;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kOutBytes = kTileM * kOutLd * 4;
  static constexpr int kSmemBytes = kPipeBytes > kOutBytes ? kPipeBytes : kOutBytes;
  static_assert(kStageBytes % 16 == 0, "stages must stay 16-byte aligned");
};

struct Params {
  const uint8_t *x;
  int64_t ldx;
  const float *x_scale;
  int64_t x_scale_split;
  const uint8_t *w;
  const float *w_scale;
  int64_t w_scale_ld;
  void *y;
  int64_t ldy;
  const void *residual;
  int64_t ldr;
  float beta;
  int64_t rows, n, k, kblocks;
  float *partials;
  int *counters;
};

using ina_cuda::bf16_to_f32;

/* y[m, n..n+7] = v + beta * residual[m, n..n+7]; n is a multiple of 8 and the row starts
 * are 16-byte aligned (checked by the caller). A residual aliasing y is read before the
 * same thread writes it. */
template <bool kOutF32>
__device__ __forceinline__ void store8(const Params &p, int64_t m, int64_t n, float (&v)[8]) {
  if (p.residual) {
    if (kOutF32) {
      const float4 *r =
          reinterpret_cast<const float4 *>(static_cast<const float *>(p.residual) + m * p.ldr + n);
      const float4 r0 = r[0], r1 = r[1];
      v[0] += p.beta * r0.x, v[1] += p.beta * r0.y, v[2] += p.beta * r0.z, v[3] += p.beta * r0.w;
      v[4] += p.beta * r1.x, v[5] += p.beta * r1.y, v[6] += p.beta * r1.z, v[7] += p.beta * r1.w;
    } else {
      const uint4 r = *reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(p.residual) +
                                                       m * p.ldr + n);
      const uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int i = 0; i < 4; i++) {
        v[2 * i] += p.beta * bf16_to_f32(words[i] & 0xFFFFu);
        v[2 * i + 1] += p.beta * bf16_to_f32(words[i] >> 16);
      }
    }
  }
  if (kOutF32) {
    float4 *y = reinterpret_cast<float4 *>(static_cast<float *>(p.y) + m * p.ldy + n);
    y[0] = make_float4(v[0], v[1], v[2], v[3]);
    y[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
      words[i] = *reinterpret_cast<const uint32_t *>(&pair);
    }
    *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(p.y) + m * p.ldy + n) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}

/* Enqueues the copies of K block kb into the pipeline stage at `stage_base`. */
template <int kTileM>
__device__ __forceinline__ void load_stage(const Params &p, uint8_t *stage_base, int64_t kb,
                                           int64_t n0, int64_t m0, int tid) {
  using S = Shape<kTileM>;
  uint8_t *w_tile = stage_base;
  uint8_t *x_tile = w_tile + S::kWBytes;
  float *scales = reinterpret_cast<float *>(x_tile + S::kXBytes);
  const int64_t k0 = kb * kBlockK;
#pragma unroll
  for (int i = 0; i < kTileN * kChunksPerRow / kThreads; i++) {
    const int c = tid + i * kThreads, r = c / kChunksPerRow, ch = c % kChunksPerRow;
    const int64_t n = n0 + r, kk = k0 + ch * 16;
    const bool valid = n < p.n && kk < p.k;
    cp_async16(smem_addr(w_tile + r * kRowBytes + ch * 16), valid ? p.w + n * p.k + kk : p.w, valid ? 16 : 0);
  }
  for (int c = tid; c < kTileM * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, ch = c % kChunksPerRow;
    const int64_t m = m0 + r, kk = k0 + ch * 16;
    const bool valid = m < p.rows && kk < p.k;
    cp_async16(smem_addr(x_tile + r * kRowBytes + ch * 16), valid ? p.x + m * p.ldx + kk : p.x, valid ? 16 : 0);
  }
  if (tid < kTileM) {
    const int64_t m = m0 + tid;
    const bool valid = m < p.rows;
    const float *src =
        valid ? p.x_scale + ina_gemm_scale_offset(p.rows, p.x_scale_split, p.kblocks, m, kb)
              : p.x_scale;
    cp_async4(smem_addr(scales + tid), src, valid ? 4 : 0);
  } else if (tid == kThreads - 1) {
    cp_async4(smem_addr(scales + kTileM), p.w_scale + (int64_t)blockIdx.x * p.w_scale_ld + kb, 4);
  }
}

/* One K block from the stage at `stage_base`: four k32 MMA steps from zero, then the
 * scaled add into acc. */
template <int kTileM>
__device__ __forceinline__ void compute_stage(const uint8_t *stage_base,
                                              float (&acc)[2][kTileM / 8][4], int warp, int lane) {
  using S = Shape<kTileM>;
  constexpr int kNT = S::kNTiles;
  const int quad = lane % 4; /* fragment columns: x rows 2 quad and 2 quad + 1 of a tile */
  const uint8_t *x_tile = stage_base + S::kWBytes;
  const float *scales = reinterpret_cast<const float *>(x_tile + S::kXBytes);
  const uint32_t w_base = smem_addr(stage_base), x_base = smem_addr(x_tile);
  float inner[2][kNT][4];
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int j = 0; j < kNT; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) inner[mi][j][r] = 0.0f;
#pragma unroll
  for (int step = 0; step < kBlockK / 32; step++) {
    /* A: matrices (rows 0-7, k 0-15), (rows 8-15, k 0-15), (rows 0-7, k 16-31),
     * (rows 8-15, k 16-31) of each m16 tile = fragment registers a0..a3. */
    uint32_t a[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++) {
      const int row = warp * kWarpRows + mi * 16 + lane % 8 + 8 * ((lane / 8) % 2);
      const int col = step * 32 + 16 * (lane / 16);
      ldmatrix_x4(a[mi], w_base + row * kRowBytes + col);
    }
    /* B: per n8 tile, matrices (k 0-15) and (k 16-31) = fragment registers b0, b1. */
    uint32_t b[kNT][2];
    if constexpr (kNT == 1) {
      ldmatrix_x2(b[0][0], b[0][1],
                  x_base + (lane % 8) * kRowBytes + step * 32 + 16 * ((lane / 8) % 2));
    } else {
#pragma unroll
      for (int j = 0; j < kNT; j += 2) {
        uint32_t r[4];
        const int row = 8 * (j + lane / 16) + lane % 8;
        ldmatrix_x4(r, x_base + row * kRowBytes + step * 32 + 16 * ((lane / 8) % 2));
        b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
      }
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
      for (int j = 0; j < kNT; j++) mma_e4m3(inner[mi][j], a[mi], b[j][0], b[j][1]);
  }
  /* Registers 0 and 2 hold x row 8j + 2 quad, registers 1 and 3 the next row. */
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

template <int kTileM, bool kOutF32>
__global__ void __launch_bounds__(kThreads) fp8_block_gemm_kernel(const Params p) {
  using S = Shape<kTileM>;
  constexpr int kNT = S::kNTiles;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int arrived_last;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int quad = lane % 4, group = lane / 4; /* mma fragment coordinates */
  const int64_t n0 = (int64_t)blockIdx.x * kTileN;
  const int64_t m0 = (int64_t)blockIdx.y * kTileM;
  const int split = blockIdx.z, splits = gridDim.z;
  const int64_t kb_begin = p.kblocks * split / splits;
  const int num_kb = (int)(p.kblocks * (split + 1) / splits - kb_begin);

  float acc[2][kNT][4];
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int j = 0; j < kNT; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) acc[mi][j][r] = 0.0f;

        /* Pipeline: stage i % kStages holds K block i; every iteration commits one copy group
         * (possibly empty), so "all but kStages - 2 groups done" means block i has landed. */
#pragma unroll
  for (int s = 0; s < S::kStages - 1; s++) {
    if (s < num_kb) load_stage<kTileM>(p, smem + s * S::kStageBytes, kb_begin + s, n0, m0, tid);
    cp_async_commit();
  }
  for (int i = 0; i < num_kb; i++) {
    cp_async_wait<S::kStages - 2>();
    __syncthreads(); /* block i visible to all; everyone is done with block i - 1's stage */
    const int next = i + S::kStages - 1;
    if (next < num_kb)
      load_stage<kTileM>(p, smem + (next % S::kStages) * S::kStageBytes, kb_begin + next, n0, m0,
                         tid);
    cp_async_commit();
    compute_stage<kTileM>(smem + (i % S::kStages) * S::kStageBytes, acc, warp, lane);
  }
  cp_async_wait<0>();
  __syncthreads(); /* the pipeline's shared memory becomes the output tile */

  float *tile = reinterpret_cast<float *>(smem);
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int j = 0; j < kNT; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const int n_local = warp * kWarpRows + mi * 16 + group + 8 * (r / 2);
        const int m_local = 8 * j + 2 * quad + r % 2;
        tile[m_local * kOutLd + n_local] = acc[mi][j][r];
      }
  __syncthreads();

  constexpr int kChunksPerTileRow = kTileN / 8;
  constexpr int kChunks = kTileM * kChunksPerTileRow;
  if (splits == 1) {
    for (int c = tid; c < kChunks; c += kThreads) {
      const int m_local = c / kChunksPerTileRow, n_local = (c % kChunksPerTileRow) * 8;
      const int64_t m = m0 + m_local, n = n0 + n_local;
      if (m >= p.rows || n >= p.n) continue;
      const float4 lo = *reinterpret_cast<const float4 *>(tile + m_local * kOutLd + n_local);
      const float4 hi = *reinterpret_cast<const float4 *>(tile + m_local * kOutLd + n_local + 4);
      float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      store8<kOutF32>(p, m, n, v);
    }
    return;
  }

  /* Split-K: publish this CTA's partial tile, then let the last arrival finish the tile. */
  constexpr int kTileFloats = kTileM * kTileN;
  const int64_t tile_id = (int64_t)blockIdx.y * gridDim.x + blockIdx.x;
  float *tile_partials = p.partials + tile_id * splits * kTileFloats;
  float *mine = tile_partials + (int64_t)split * kTileFloats;
  for (int c = tid; c < kTileFloats / 4; c += kThreads) {
    const int m_local = c / (kTileN / 4), n_local = (c % (kTileN / 4)) * 4;
    *reinterpret_cast<float4 *>(mine + m_local * kTileN + n_local) =
        *reinterpret_cast<const float4 *>(tile + m_local * kOutLd + n_local);
  }
  __threadfence(); /* the partial is visible device-wide before the arrival is counted */
  __syncthreads();
  if (tid == 0) arrived_last = atomicAdd(p.counters + tile_id, 1) == splits - 1;
  __syncthreads();
  if (!arrived_last) return;
  __threadfence(); /* order the reads below after the other CTAs' counted writes */
  for (int c = tid; c < kChunks; c += kThreads) {
    const int m_local = c / kChunksPerTileRow, n_local = (c % kChunksPerTileRow) * 8;
    const int64_t m = m0 + m_local, n = n0 + n_local;
    if (m >= p.rows || n >= p.n) continue;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int s = 0; s < splits; s++) {
      const float4 *src = reinterpret_cast<const float4 *>(tile_partials + s * kTileFloats +
                                                           m_local * kTileN + n_local);
      const float4 lo = __ldcg(src), hi = __ldcg(src + 1);
      v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w;
      v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
    }
    store8<kOutF32>(p, m, n, v);
  }
  if (tid == 0) p.counters[tile_id] = 0; /* every split has arrived: ready for the next launch */
}

template <int kTileM, bool kOutF32>
cudaError_t allow_smem() {
  return cudaFuncSetAttribute(fp8_block_gemm_kernel<kTileM, kOutF32>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Shape<kTileM>::kSmemBytes);
}

template <int kTileM>
void launch_tile(const Params &p, bool out_f32, dim3 grid, cudaStream_t stream) {
  if (out_f32)
    fp8_block_gemm_kernel<kTileM, true><<<grid, kThreads, Shape<kTileM>::kSmemBytes, stream>>>(p);
  else
    fp8_block_gemm_kernel<kTileM, false><<<grid, kThreads, Shape<kTileM>::kSmemBytes, stream>>>(p);
}

}  // namespace

extern "C" ina_status_t ina_gemm_kernel_init(void) {
  ina_status_t st = INA_OK;
  INA_CUDA_CHECK((allow_smem<8, false>()));
  INA_CUDA_CHECK((allow_smem<8, true>()));
  INA_CUDA_CHECK((allow_smem<16, false>()));
  INA_CUDA_CHECK((allow_smem<16, true>()));
  INA_CUDA_CHECK((allow_smem<32, false>()));
  INA_CUDA_CHECK((allow_smem<32, true>()));
fail:
  return st;
}

extern "C" ina_status_t ina_gemm_kernel_launch(const ina_gemm_kernel_problem_t *prob,
                                               const ina_gemm_kernel_plan_t *plan, float *partials,
                                               int *counters, void *stream) {
  ina_status_t st = INA_OK;
  Params p;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 grid((unsigned)plan->tiles_n, (unsigned)plan->tiles_m, (unsigned)plan->splits);
  p.x = prob->x;
  p.ldx = prob->ldx;
  p.x_scale = prob->x_scale;
  p.x_scale_split = prob->x_scale_split;
  p.w = prob->w;
  p.w_scale = prob->w_scale;
  p.kblocks = ina_gemm_kblocks(prob->k);
  p.w_scale_ld = (p.kblocks + 3) / 4 * 4;
  p.y = prob->y;
  p.ldy = prob->ldy;
  p.residual = prob->residual;
  p.ldr = prob->ldr;
  p.beta = prob->beta;
  p.rows = prob->rows;
  p.n = prob->n;
  p.k = prob->k;
  p.partials = partials;
  p.counters = counters;
  switch (plan->tile_m) {
    case 8:
      launch_tile<8>(p, prob->y_f32 != 0, grid, s);
      break;
    case 16:
      launch_tile<16>(p, prob->y_f32 != 0, grid, s);
      break;
    case 32:
      launch_tile<32>(p, prob->y_f32 != 0, grid, s);
      break;
    default:
      INA_REQUIRE(0, INA_ERR_INTERNAL, "gemm kernel: no instantiation for tile_m %d", plan->tile_m);
  }
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
