/* The small-M kernel of gemm/gemm_internal.h: y[M, N] = x[M, K] . W[N, K]^T for M <= 8
 * rows (decode), bf16 or block-scaled FP8, on mma.sync with the operands loaded straight
 * from global memory into fragment registers.
 *
 * At M <= 8 a GEMM is a stream of W: every weight byte is used by at most 8 MACs, so the
 * kernel's one job is keeping enough of W in flight. No shared-memory staging: each
 * thread loads 16 bytes of a weight row per load and feeds them to the MMA as they are.
 *
 * ---- Fragments without a shuffle ---------------------------------------------------------
 * The MMA is m16n8k16 (bf16) or m16n8k32 (e4m3) with W as A (16 weight rows) and x as B
 * (8 columns = up to 8 rows of x). Thread (g = lane / 4, q = lane % 4) of a warp owns
 * weight rows g and g + 8 and x row g; its A registers a0..a3 hold (row g, its first k
 * pair/quad), (row g + 8, same k), (row g, its second k pair/quad), (row g + 8, same), its
 * B registers b0, b1 hold x row g at its first and second k pair/quad. A dot product does
 * not care in which order K is walked, as long as W and x are walked alike: so the thread
 * loads 16 bytes of weight row g, 16 bytes of weight row g + 8 and 16 bytes of x row g,
 * all at the same K offset, and hands their 32-bit words .x/.y to one MMA and .z/.w to a
 * second, as if those were its k pairs (bf16) or quads (e4m3). Every product of the 16-byte
 * piece meets its partner and the MMA sums them: C[row][col] is the dot product over the
 * piece. The four threads of a group take 4 consecutive 16-byte pieces (64 bytes of a
 * row) per load; a unit of 128 bytes is two such loads.
 *
 * ---- Work per CTA ------------------------------------------------------------------------
 * A CTA covers 16 weight rows (grid.x) and one K range (grid.y = splits); each of its warps
 * takes units_per_warp consecutive units of that range and streams them in batches of
 * INA_GEMM_SMALL_M_BATCH_UNITS units (8 loads of 16 bytes per thread in flight), loading
 * the next batch's weights while it multiplies the current one. FP8: a unit is one 128-wide
 * scale block; its four MMAs sum from zero and the block is added to the accumulator
 * times w_scale[n / 128, kb] * x_scale[m, kb] (DeepGEMM's promotion, as the FP8 kernel);
 * the 16 rows of a CTA always lie in one 128-row scale block. bf16 accumulates directly.
 * Past the matrix (weight rows past n, x rows past m, K past k) the registers are zero.
 *
 * ---- Sums --------------------------------------------------------------------------------
 * The warps' 16 x 8 tiles add up through shared memory in warp order; with splits, each CTA
 * stores its tile as a partial sum and the CTA that arrives last at its tile (an atomic
 * counter) adds the partials in split order. Both orders are fixed, so the result does not
 * depend on timing. The epilogue adds beta * residual and stores bf16 or fp32.
 *
 * ---- Programmatic dependent launch -------------------------------------------------------
 * With plan->pdl the kernel is launched so that it may start while the previous kernel on
 * the stream finishes: it loads its first weights (never written by a kernel) and only
 * then waits for the previous grid (griddepcontrol.wait) before reading x, the scales,
 * the residual or the workspace. It lets the next kernel launch as soon as all its CTAs
 * run. Without the attribute both instructions are no-ops. */
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

constexpr int kTileN = INA_GEMM_SMALL_M_TILE_N;   /* weight rows per CTA */
constexpr int kTileM = INA_GEMM_SMALL_M_MAX_ROWS; /* x rows: the MMA's n8 */
constexpr int kUnitBytes = INA_GEMM_SMALL_M_UNIT_BYTES;
constexpr int kBatch = INA_GEMM_SMALL_M_BATCH_UNITS;
constexpr int kMaxWarps = INA_GEMM_SMALL_M_MAX_WARPS;
constexpr int kTileFloats = kTileN * kTileM;
constexpr int kSumLd = kTileN + 4; /* row of a warp's tile in shared memory: conflict-free */
constexpr int kPiecesPerUnit = kUnitBytes / 16 / 4; /* 16-byte loads per thread and row */
static_assert(kTileM == 8 && kTileN == 16, "one m16n8 MMA tile per warp");
static_assert(kPiecesPerUnit == 2, "a unit is two loads of 64 bytes per row");

struct Params {
  const uint8_t *x;
  int64_t ldx_bytes;
  const float *x_scale;
  int64_t x_scale_split;
  const uint8_t *w;
  int64_t k_bytes; /* bytes per weight row, also W's row stride */
  const float *w_scale;
  int64_t w_scale_ld;
  void *y;
  int64_t ldy;
  const void *residual;
  int64_t ldr;
  float beta;
  int rows;
  int64_t n, kblocks, units, units_per_warp;
  float *partials;
  int *counters;
};

/* One batch of a thread's operands: [unit][piece] for weight rows g and g + 8, x row g.
 * Activations and scales are read with plain loads, after the wait for the previous grid
 * (which may have written them while this grid was starting); weights, never written by
 * a kernel, through the non-coherent path. */
struct Weights {
  uint4 row0[kBatch][kPiecesPerUnit], row1[kBatch][kPiecesPerUnit];
};
struct Activations {
  uint4 x[kBatch][kPiecesPerUnit];
  float scale0[kBatch], scale1[kBatch]; /* FP8: w_scale * x_scale of x rows 2q and 2q + 1 */
};

/* 16 bytes of a weight row: read once, so kept out of L1, with a 256-byte L2 prefetch. */
__device__ __forceinline__ uint4 load_weight(const uint8_t *p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

/* The two MMAs of one 16-byte piece (see the header comment). */
template <bool kFp8>
__device__ __forceinline__ void mma_piece(float (&d)[4], const uint4 &w0, const uint4 &w1,
                                          const uint4 &x) {
  const uint32_t a_lo[4] = {w0.x, w1.x, w0.y, w1.y}, a_hi[4] = {w0.z, w1.z, w0.w, w1.w};
  if (kFp8) {
    ina_ptx::mma_e4m3(d, a_lo, x.x, x.y);
    ina_ptx::mma_e4m3(d, a_hi, x.z, x.w);
  } else {
    ina_ptx::mma_bf16(d, a_lo, x.x, x.y);
    ina_ptx::mma_bf16(d, a_hi, x.z, x.w);
  }
}

/* Where a thread reads: its weight rows and x row (clamped to row 0 when past the matrix,
 * then never loaded) and its units. */
struct Lane {
  const uint8_t *w0, *w1, *x;
  bool w0_ok, w1_ok, x_ok;
  int q;
  int64_t unit_end;
};

__device__ __forceinline__ bool piece_in(const Params &p, const Lane &l, int64_t unit, int piece,
                                         int64_t *offset) {
  *offset = unit * kUnitBytes + (int64_t)(piece * 4 + l.q) * 16;
  return unit < l.unit_end && *offset < p.k_bytes;
}

__device__ __forceinline__ void load_weights(const Params &p, const Lane &l, int64_t unit0,
                                             Weights &w) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int b = 0; b < kBatch; b++)
#pragma unroll
    for (int c = 0; c < kPiecesPerUnit; c++) {
      int64_t off;
      const bool in = piece_in(p, l, unit0 + b, c, &off);
      w.row0[b][c] = in && l.w0_ok ? load_weight(l.w0 + off) : zero;
      w.row1[b][c] = in && l.w1_ok ? load_weight(l.w1 + off) : zero;
    }
}

template <bool kFp8>
__device__ __forceinline__ void load_activations(const Params &p, const Lane &l, int64_t unit0,
                                                 const float *w_scale_row, Activations &a) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int b = 0; b < kBatch; b++) {
#pragma unroll
    for (int c = 0; c < kPiecesPerUnit; c++) {
      int64_t off;
      const bool in = piece_in(p, l, unit0 + b, c, &off);
      a.x[b][c] = in && l.x_ok ? *reinterpret_cast<const uint4 *>(l.x + off) : zero;
    }
    a.scale0[b] = a.scale1[b] = 0.0f;
    const int64_t kb = unit0 + b; /* FP8: a unit is a scale block */
    if (kFp8 && kb < l.unit_end) {
      const float ws = w_scale_row[kb];
      const int m0 = 2 * l.q, m1 = m0 + 1;
      if (m0 < p.rows)
        a.scale0[b] =
            ws * p.x_scale[ina_gemm_scale_offset(p.rows, p.x_scale_split, p.kblocks, m0, kb)];
      if (m1 < p.rows)
        a.scale1[b] =
            ws * p.x_scale[ina_gemm_scale_offset(p.rows, p.x_scale_split, p.kblocks, m1, kb)];
    }
  }
}

/* acc (rows g, g + 8 by x rows 2q, 2q + 1: registers 0, 2 hold x row 2q) += the batch. */
template <bool kFp8>
__device__ __forceinline__ void multiply(const Lane &l, int64_t unit0, const Weights &w,
                                         const Activations &a, float (&acc)[4]) {
#pragma unroll
  for (int b = 0; b < kBatch; b++) {
    if (unit0 + b >= l.unit_end) break; /* uniform over the warp */
    if (kFp8) {
      float block[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int c = 0; c < kPiecesPerUnit; c++)
        mma_piece<true>(block, w.row0[b][c], w.row1[b][c], a.x[b][c]);
      acc[0] = fmaf(block[0], a.scale0[b], acc[0]);
      acc[1] = fmaf(block[1], a.scale1[b], acc[1]);
      acc[2] = fmaf(block[2], a.scale0[b], acc[2]);
      acc[3] = fmaf(block[3], a.scale1[b], acc[3]);
    } else {
#pragma unroll
      for (int c = 0; c < kPiecesPerUnit; c++)
        mma_piece<false>(acc, w.row0[b][c], w.row1[b][c], a.x[b][c]);
    }
  }
}

/* y[m, n] = v + beta * residual[m, n]; a residual aliasing y is read before it is written. */
template <bool kOutF32>
__device__ __forceinline__ void store_one(const Params &p, int m, int64_t n, float v) {
  if (kOutF32) {
    if (p.residual) v += p.beta * static_cast<const float *>(p.residual)[m * p.ldr + n];
    static_cast<float *>(p.y)[m * p.ldy + n] = v;
  } else {
    if (p.residual)
      v += p.beta * ina_cuda::bf16_to_f32(static_cast<const uint16_t *>(p.residual)[m * p.ldr + n]);
    static_cast<uint16_t *>(p.y)[m * p.ldy + n] = ina_cuda::f32_to_bf16(v);
  }
}

template <bool kFp8, bool kOutF32>
__global__ void __launch_bounds__(kMaxWarps * 32) small_m_kernel(const Params p) {
  __shared__ float warp_tiles[kMaxWarps][kTileM * kSumLd];
  __shared__ int arrived_last;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, warps = blockDim.x / 32;
  const int g = lane / 4;
  const int64_t n0 = (int64_t)blockIdx.x * kTileN;
  const int split = blockIdx.y, splits = gridDim.y;

  Lane l;
  l.q = lane % 4;
  l.w0_ok = n0 + g < p.n;
  l.w1_ok = n0 + g + 8 < p.n;
  l.x_ok = g < p.rows;
  l.w0 = p.w + (l.w0_ok ? (n0 + g) * p.k_bytes : 0);
  l.w1 = p.w + (l.w1_ok ? (n0 + g + 8) * p.k_bytes : 0);
  l.x = p.x + (l.x_ok ? g * p.ldx_bytes : 0);
  const int64_t unit_begin = ((int64_t)split * warps + warp) * p.units_per_warp;
  l.unit_end = unit_begin + p.units_per_warp < p.units ? unit_begin + p.units_per_warp : p.units;
  const float *w_scale_row = kFp8 ? p.w_scale + (n0 / 128) * p.w_scale_ld : nullptr;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  Weights current;
  load_weights(p, l, unit_begin, current);
  ina_ptx::griddep_wait();
  ina_ptx::griddep_launch_dependents();
  for (int64_t u = unit_begin; u < l.unit_end; u += kBatch) {
    Activations a;
    load_activations<kFp8>(p, l, u, w_scale_row, a);
    Weights next;
    load_weights(p, l, u + kBatch, next); /* all zero (nothing loaded) past the slice */
    multiply<kFp8>(l, u, current, a, acc);
    current = next;
  }

  /* The warps' tiles, [x row][weight row], then their sum in warp order. */
  float *mine = warp_tiles[warp];
  mine[(2 * l.q) * kSumLd + g] = acc[0];
  mine[(2 * l.q + 1) * kSumLd + g] = acc[1];
  mine[(2 * l.q) * kSumLd + g + 8] = acc[2];
  mine[(2 * l.q + 1) * kSumLd + g + 8] = acc[3];
  __syncthreads();

  if (splits == 1) {
    for (int e = tid; e < kTileFloats; e += blockDim.x) {
      const int m = e / kTileN, nl = e % kTileN;
      if (m >= p.rows || n0 + nl >= p.n) continue;
      float v = warp_tiles[0][m * kSumLd + nl];
      for (int w = 1; w < warps; w++) v += warp_tiles[w][m * kSumLd + nl];
      store_one<kOutF32>(p, m, n0 + nl, v);
    }
    return;
  }

  /* Split-K: publish this CTA's tile, then let the last arrival finish it. */
  float *tile_partials = p.partials + (int64_t)blockIdx.x * splits * kTileFloats;
  for (int e = tid; e < kTileFloats; e += blockDim.x) {
    const int m = e / kTileN, nl = e % kTileN;
    float v = warp_tiles[0][m * kSumLd + nl];
    for (int w = 1; w < warps; w++) v += warp_tiles[w][m * kSumLd + nl];
    tile_partials[split * kTileFloats + e] = v;
  }
  __threadfence(); /* the partial is visible device-wide before the arrival is counted */
  __syncthreads();
  if (tid == 0) arrived_last = atomicAdd(p.counters + blockIdx.x, 1) == splits - 1;
  __syncthreads();
  if (!arrived_last) return;
  __threadfence(); /* order the reads below after the other CTAs' counted writes */
  for (int e = tid; e < kTileFloats; e += blockDim.x) {
    const int m = e / kTileN, nl = e % kTileN;
    if (m >= p.rows || n0 + nl >= p.n) continue;
    float v = 0.0f;
    for (int s = 0; s < splits; s++) v += __ldcg(tile_partials + s * kTileFloats + e);
    store_one<kOutF32>(p, m, n0 + nl, v);
  }
  if (tid == 0) p.counters[blockIdx.x] = 0; /* every split has arrived: ready for the next launch */
}

template <bool kFp8, bool kOutF32>
cudaError_t launch(const Params &p, const ina_gemm_small_m_plan_t &plan, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.gridDim = dim3((unsigned)plan.tiles, (unsigned)plan.splits);
  config.blockDim = dim3((unsigned)plan.warps * 32);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = plan.pdl ? attr : nullptr;
  config.numAttrs = plan.pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, small_m_kernel<kFp8, kOutF32>, p);
}

}  // namespace

extern "C" ina_status_t ina_gemm_small_m_launch(const ina_gemm_kernel_problem_t *prob, int fp8,
                                                const ina_gemm_small_m_plan_t *plan,
                                                float *partials, int *counters, void *stream) {
  ina_status_t st = INA_OK;
  Params p;
  const int64_t esize = fp8 ? 1 : 2;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t launched = cudaSuccess;
  INA_REQUIRE(prob->rows >= 1 && prob->rows <= kTileM && plan->warps >= 1 &&
                  plan->warps <= kMaxWarps && plan->splits >= 1 &&
                  plan->tiles == (prob->n + kTileN - 1) / kTileN && plan->units_per_warp > 0,
              INA_ERR_INTERNAL, "gemm small-M kernel: %lld rows, n %lld, plan %d warps x %d splits",
              (long long)prob->rows, (long long)prob->n, (int)plan->warps, (int)plan->splits);
  p.x = prob->x;
  p.ldx_bytes = prob->ldx * esize;
  p.x_scale = prob->x_scale;
  p.x_scale_split = prob->x_scale_split;
  p.w = prob->w;
  p.k_bytes = prob->k * esize;
  p.w_scale = prob->w_scale;
  p.kblocks = ina_gemm_kblocks(prob->k);
  p.w_scale_ld = (p.kblocks + 3) / 4 * 4;
  p.y = prob->y;
  p.ldy = prob->ldy;
  p.residual = prob->residual;
  p.ldr = prob->ldr;
  p.beta = prob->beta;
  p.rows = (int)prob->rows;
  p.n = prob->n;
  p.units = (p.k_bytes + kUnitBytes - 1) / kUnitBytes;
  p.units_per_warp = plan->units_per_warp;
  p.partials = partials;
  p.counters = counters;
  if (fp8)
    launched = prob->y_f32 ? launch<true, true>(p, *plan, s) : launch<true, false>(p, *plan, s);
  else
    launched = prob->y_f32 ? launch<false, true>(p, *plan, s) : launch<false, false>(p, *plan, s);
  INA_CUDA_CHECK(launched);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
