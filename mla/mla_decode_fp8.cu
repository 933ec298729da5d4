/* The fast MLA attention kernel for the packed FP8 cache (kv_lora_rank 512 as e4m3 with
 * one fp32 scale per 128 latent values, rope 64 in bf16): the schedule, the block loop and
 * the softmax of the bf16 kernel (mla_fast.cuh), with the cache read as it is stored.
 *
 * Where the time goes. An FP8 block is 656 bytes a position instead of 1152, so the
 * kernel must do its extra work, turning e4m3 into tensor-core operands, without a
 * pass over shared memory of its own: the bytes are loaded straight into registers in
 * the fragment layout, converted there (e4m3 -> f16 is exact), and fed to f16 mma.sync.
 * The scales never touch the latent values:
 *   - warp w's K slice, latent dims [128w, 128w + 128), is exactly scale block w, so the
 *     warp's latent partial score of position t is multiplied by scale[t][w] once (the
 *     rope part, bf16, is added unscaled);
 *   - warp w's output dims are the same block, so P V uses P'[row][t] = P[row][t] *
 *     scale[t][w] as the A operand. P' is kept as f16 times a constant 2^10 (undone at
 *     the end) so that small probabilities stay in f16's normal range; the bound that
 *     follows: latent magnitudes below 28000.
 *
 * Fragment layouts. A dot product does not care in which order its terms come, so both
 * GEMMs read the bytes in an order that suits the loads:
 *   S   a thread loads 8 consecutive bytes of position t (dims d .. d + 7 of a 32-dim
 *       chunk, d = 8 tig) and uses them as the B fragments of two k-steps; the query
 *       fragments are loaded in the same permuted order (a 16-byte run per row).
 *   PV  a thread loads 4 bytes (dims 4g .. 4g + 3 of a chunk) of each of the positions
 *       2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9 of a k-step and pairs bytes of adjacent
 *       positions with prmt; the n-tile jj of chunk c then holds dims 32c + 4g + jj,
 *       so a thread's accumulators hold dims 32c + 8 tig + (0 .. 7) of each chunk.
 *
 * Shared memory per stage: latent [32][512] e4m3, 16-byte chunks XOR-swizzled by
 * position (both load patterns hit 32 distinct banks), rope [32][64 bf16 + 8 pad] for
 * ldmatrix, scales [32][4] f32. Four stages (the blocks are small) keep about as many
 * bytes in flight as the bf16 kernel's two. */
#define INA_LOG_SUBSYS "mla"
#include <cuda_fp8.h>

#include "mla/mla_fast.cuh"

namespace ina_mla {
namespace {

using namespace fast;

constexpr int kLatBytes = kBlock * kLatent;           /* [32][512] e4m3 */
constexpr int kRopeRow = (kRope + 8) * 2;             /* 144 B: 9 16-byte units, odd, for ldmatrix */
constexpr int kRopeBytes = kBlock * kRopeRow;
constexpr int kScaleBytes = kBlock * 16;              /* [32][4] f32 */
constexpr int kStageBytes = kLatBytes + kRopeBytes + kScaleBytes;
constexpr int kStages = 4;
constexpr int kSmemBytes = kStages * kStageBytes + kPartialBytes;
/* P' = P * scale * kPScale in f16 (see above); the output is multiplied back. */
constexpr float kPScale = kFp8PScale;

/* XOR applied to the 16-byte unit index of a position's latent row. With f(r) =
 * (r1 << 1) | (r0 ^ r2) of the position's low three bits, the four positions of each
 * load pattern (S: 4 consecutive positions; PV: positions 2 tig + const, tig = 0..3)
 * get four different swizzles {0, 2, 4, 6}, which spread their two neighbouring 16-byte
 * units over all eight units of a 128-byte bank line. */
__device__ __forceinline__ int swizzle(int pos) {
  const int r = pos & 7;
  return 2 * ((((r >> 1) & 1) << 1) | ((r ^ (r >> 2)) & 1));
}

template <bool kSparse>
__device__ __forceinline__ void issue_block(const Args &a, Cursor<kSparse> &cur, char *stage) {
  if (cur.valid()) {
    const int sub = threadIdx.x & 7;
    const ina_mla_cache_t &c = a.cache;
#pragma unroll
    for (int pass = 0; pass < kPasses; pass++) {
      const int tok = Cursor<kSparse>::token(pass);
      const bool ok = cur.page[pass] >= 0;
      const char *lat = static_cast<const char *>(c.latent), *rope = lat, *scale = lat;
      if (ok) {
        lat = cur.entry(a, c.latent, c.latent_page_stride, c.latent_token_stride, pass);
        rope = cur.entry(a, c.rope, c.rope_page_stride, c.rope_token_stride, pass);
        scale = cur.entry(a, c.scale, c.scale_page_stride, c.scale_token_stride, pass);
      }
      const int bytes = ok ? 16 : 0;
      const uint32_t lat_dst = smem_addr(stage + tok * kLatent);
      const uint32_t rope_dst = smem_addr(stage + kLatBytes + tok * kRopeRow);
      const uint32_t scale_dst = smem_addr(stage + kLatBytes + kRopeBytes + tok * 16);
      const int swz = swizzle(tok);
      /* 41 units of 16 bytes: 32 latent, 8 rope, 1 scale */
#pragma unroll
      for (int i = 0; i < 6; i++) {
        const int ch = sub + 8 * i;
        if (ch < 32) cp_async16(lat_dst + 16 * (ch ^ swz), lat + 16 * ch, bytes);
        else if (ch < 40) cp_async16(rope_dst + 16 * (ch - 32), rope + 16 * (ch - 32), bytes);
        else if (ch == 40) cp_async16(scale_dst, scale, bytes);
      }
    }
  }
  cp_async_commit();
  if (cur.valid()) cur.advance(a);
}


__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

/* Latent query fragments in the S order: k-step 2c + x of warp w covers dims
 * 128w + 32c + 8 tig + 4x + (0 .. 3), as a0/a1 = dims +0, +1 and a2/a3 = dims +2, +3
 * (rows g and g + 8); converted to f16. The rope k-step is the bf16 kernel's. */
__device__ __forceinline__ void load_query(const Args &a, const ina_mla_sched_request_t &req, int tile,
                                           ItemState &st) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const Row r = tile_row(req, tile, g + 8 * half, a.num_heads);
    const __nv_bfloat16 *qn = a.q_nope + r.token * a.q_nope_ts + r.head * a.q_nope_hs + 128 * w + 8 * tig;
    const __nv_bfloat16 *qp = a.q_pe + r.token * a.q_pe_ts + r.head * a.q_pe_hs + 16 * w + 2 * tig;
#pragma unroll
    for (int c = 0; c < 4; c++) {
      uint32_t v[4] = {0, 0, 0, 0};
      if (r.valid)
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = __ldg(reinterpret_cast<const unsigned int *>(qn + 32 * c + 2 * i));
#pragma unroll
      for (int x = 0; x < 2; x++) {
        st.q[2 * c + x][half] = bf16x2_to_f16x2(v[2 * x]);
        st.q[2 * c + x][2 + half] = bf16x2_to_f16x2(v[2 * x + 1]);
      }
    }
    uint32_t lo = 0, hi = 0;
    if (r.valid) {
      lo = __ldg(reinterpret_cast<const unsigned int *>(qp));
      hi = __ldg(reinterpret_cast<const unsigned int *>(qp + 8));
    }
    st.q[8][half] = lo;
    st.q[8][2 + half] = hi;
  }
}

__device__ __forceinline__ void compute_block(const Args &a, const char *stage, float4 *partials, int blk,
                                              ItemState &st) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
  const char *lat = stage;
  const float *scales = reinterpret_cast<const float *>(stage + kLatBytes + kRopeBytes);

  /* Scale block w of the thread's score columns: position 8j + 2 tig + e. */
  float sc[kNTiles][2];
#pragma unroll
  for (int j = 0; j < kNTiles; j++)
#pragma unroll
    for (int e = 0; e < 2; e++) sc[j][e] = scales[(8 * j + 2 * tig + e) * 4 + w];

  /* Latent scores: B fragments of position 8j + g from 8 bytes at dims 32c + 8 tig; the
   * two k-steps of a load accumulate apart (two chains of dependent mma instead of one). */
  float s[kNTiles][4], sl[kNTiles][4], sl_odd[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[j][e] = sl[j][e] = sl_odd[j][e] = 0.0f;
  const int swz_s = swizzle(g);
#pragma unroll
  for (int c = 0; c < 4; c++) {
    const int unit = (8 * w + 2 * c + (tig >> 1)) ^ swz_s;
#pragma unroll
    for (int j = 0; j < kNTiles; j++) {
      const uint2 raw = *reinterpret_cast<const uint2 *>(lat + (8 * j + g) * kLatent + 16 * unit + 8 * (tig & 1));
      mma<true>(sl[j], st.q[2 * c], e4m3x2_to_f16x2(raw.x), e4m3x2_to_f16x2(raw.x >> 16));
      mma<true>(sl_odd[j], st.q[2 * c + 1], e4m3x2_to_f16x2(raw.y), e4m3x2_to_f16x2(raw.y >> 16));
    }
  }
  /* Rope scores (bf16, unscaled), as in the bf16 kernel. */
  const uint32_t rope_lane = smem_addr(stage + kLatBytes) + ((lane >> 4) * 8 + (lane & 7)) * kRopeRow +
                             ((lane >> 3) & 1) * 16 + 2 * 16 * w;
#pragma unroll
  for (int p = 0; p < kNTiles / 2; p++) {
    uint32_t b[4];
    ldsm_x4(rope_lane + 16 * p * kRopeRow, b);
    mma<false>(s[2 * p], st.q[8], b[0], b[1]);
    mma<false>(s[2 * p + 1], st.q[8], b[2], b[3]);
  }
#pragma unroll
  for (int j = 0; j < kNTiles; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[j][e] = fmaf(sl[j][e] + sl_odd[j][e], sc[j][e & 1], s[j][e]);

  softmax_block(a, partials, blk, s, st);

  /* O += P' V. k-step kk covers positions 16kk + (0 .. 15); B fragments of n-tile jj of
   * chunk c: b0 = positions (2 tig, 2 tig + 1), b1 = (2 tig + 8, 2 tig + 9), dim 32c + 4g + jj. */
  const int swz_even = swizzle(2 * tig), swz_odd = swizzle(2 * tig + 1);
#pragma unroll
  for (int kk = 0; kk < kKSteps; kk++) {
    uint32_t pa[4];
    pa[0] = pack2<true>(s[2 * kk][0] * (sc[2 * kk][0] * kPScale), s[2 * kk][1] * (sc[2 * kk][1] * kPScale));
    pa[1] = pack2<true>(s[2 * kk][2] * (sc[2 * kk][0] * kPScale), s[2 * kk][3] * (sc[2 * kk][1] * kPScale));
    pa[2] = pack2<true>(s[2 * kk + 1][0] * (sc[2 * kk + 1][0] * kPScale),
                        s[2 * kk + 1][1] * (sc[2 * kk + 1][1] * kPScale));
    pa[3] = pack2<true>(s[2 * kk + 1][2] * (sc[2 * kk + 1][0] * kPScale),
                        s[2 * kk + 1][3] * (sc[2 * kk + 1][1] * kPScale));
    const char *row0 = lat + (16 * kk + 2 * tig) * kLatent + 4 * (g & 3);
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const int unit = 8 * w + 2 * c + (g >> 2);
      const uint32_t w0 = *reinterpret_cast<const uint32_t *>(row0 + 16 * (unit ^ swz_even));
      const uint32_t w1 = *reinterpret_cast<const uint32_t *>(row0 + kLatent + 16 * (unit ^ swz_odd));
      const uint32_t w2 = *reinterpret_cast<const uint32_t *>(row0 + 8 * kLatent + 16 * (unit ^ swz_even));
      const uint32_t w3 = *reinterpret_cast<const uint32_t *>(row0 + 9 * kLatent + 16 * (unit ^ swz_odd));
      /* byte jj of each word, paired across positions: bytes 0, 1 of w01_lo = (w0.b0, w1.b0) */
      const uint32_t w01_lo = prmt(w0, w1, 0x5140), w01_hi = prmt(w0, w1, 0x7362);
      const uint32_t w23_lo = prmt(w2, w3, 0x5140), w23_hi = prmt(w2, w3, 0x7362);
      mma<true>(st.o[4 * c + 0], pa, e4m3x2_to_f16x2(w01_lo), e4m3x2_to_f16x2(w23_lo));
      mma<true>(st.o[4 * c + 1], pa, e4m3x2_to_f16x2(w01_lo >> 16), e4m3x2_to_f16x2(w23_lo >> 16));
      mma<true>(st.o[4 * c + 2], pa, e4m3x2_to_f16x2(w01_hi), e4m3x2_to_f16x2(w23_hi));
      mma<true>(st.o[4 * c + 3], pa, e4m3x2_to_f16x2(w01_hi >> 16), e4m3x2_to_f16x2(w23_hi >> 16));
    }
  }
}

/* o[4c + jj][2h + x] holds dim 32c + 8 tig + 4x + jj (row g + 8h); pair i of the writer
 * is dims 32(i / 4) + 8 tig + 2(i % 4) + (0, 1). */
struct OutLayout {
  __device__ static int dim(int i, int tig) { return 32 * (i >> 2) + 8 * tig + 2 * (i & 3); }
  __device__ static float value(const ItemState &st, int i, int h, int e) {
    return st.o[4 * (i >> 2) + 2 * (i & 1) + e][2 * h + ((i & 3) >> 1)];
  }
};

template <bool kSparse>
__global__ void __launch_bounds__(kThreads, INA_MLA_CTAS_PER_SM) mla_fast_fp8_kernel(const Args a) {
  allow_dependent_launch(); /* the combine pass may be scheduled behind this grid */
  extern __shared__ __align__(128) char smem[];
  float4 *partials = reinterpret_cast<float4 *>(smem + kStages * kStageBytes);

  const int it_begin = a.cta_indptr[blockIdx.x], it_end = a.cta_indptr[blockIdx.x + 1];
  if (it_begin >= it_end) return;

  Cursor<kSparse> cur;
  cur.begin(a, it_begin, it_end);
#pragma unroll
  for (int s = 0; s < kStages - 1; s++) issue_block(a, cur, smem + s * kStageBytes);

  int seq = 0;
  for (int it = it_begin; it < it_end; it++) {
    const ina_mla_sched_item_t item = a.items[it];
    const ina_mla_sched_request_t req = a.requests[item.request];
    ItemState st;
    load_query(a, req, item.tile, st);
    begin_item(req, item, a.num_heads, st);
    for (int blk = item.kv_begin; blk < item.kv_end; blk += kBlock, seq++) {
      cp_async_wait<kStages - 2>();
      /* The block is visible to all, and every warp is done with the previous block, whose
       * stage the copies below refill: they run kStages - 1 blocks ahead. */
      __syncthreads();
      issue_block(a, cur, smem + ((seq + kStages - 1) % kStages) * kStageBytes);
      compute_block(a, smem + (seq % kStages) * kStageBytes, partials, blk, st);
    }
    write_item<OutLayout>(a, req, item, st, 1.0f / kPScale);
  }
  cp_async_wait<0>();
}

}  // namespace

cudaError_t launch_fast_fp8(const Args &a, int num_ctas, cudaStream_t stream) {
  void (*kernel)(const Args) = a.sel ? mla_fast_fp8_kernel<true> : mla_fast_fp8_kernel<false>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<num_ctas, kThreads, kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ina_mla
