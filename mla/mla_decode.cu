/* The fast MLA attention kernel for a bf16 cache: kv_lora_rank 512, rope 64, written for
 * memory-bound decode with few heads (16 per rank under TP8). The FP8 cache has its own
 * kernel (mla_decode_fp8.cu); what both share is in mla_fast.cuh.
 *
 * Two persistent CTAs per SM (4 warps each) walk their lists of work items
 * (mla_schedule.h): a 16-row query tile of one request against a chunk of its KV. KV
 * blocks of 32 tokens are gathered token by token through the page table with cp.async
 * into shared memory, two blocks ahead, across item boundaries, so the memory pipe never
 * drains between items.
 *
 * Per block, on mma.sync m16n8k16 bf16 tensor cores (fp32 accumulation): S = Q K^T with
 * warp w's 9 query fragments (latent dims [128w, +128), rope dims [16w, +16)) held in
 * registers for the whole item and K fragments from ldmatrix; the softmax of
 * mla_fast.cuh; O += P V with P straight from the score accumulators and V from the
 * same shared tile through ldmatrix.trans. Warp w's accumulator o[j] holds output dims
 * 128w + 8j + 2 tig + (0, 1). */
#define INA_LOG_SUBSYS "mla"
#include "mla/mla_fast.cuh"

namespace ina_mla {
namespace {

using namespace fast;

constexpr int kDim = kLatent + kRope;
/* A staged KV block: [32 tokens][576 x 16-bit + 8 pad]. The pad makes the row stride
 * 1168 bytes (292 words, 4 mod 32), so the 8 rows of an ldmatrix hit distinct banks. */
constexpr int kRowBytes = (kDim + 8) * 2;
constexpr int kTileBytes = kBlock * kRowBytes;
constexpr int kStages = 2;
constexpr int kSmemBytes = kStages * kTileBytes + kPartialBytes;

/* Issues the copies of the cursor's block into `stage` as one cp.async group (an empty
 * group once the list is done, so group counting stays uniform) and advances. Eight
 * threads share a position: each warp instruction moves 128 contiguous bytes of 4
 * positions. */
template <bool kSparse>
__device__ __forceinline__ void issue_block(const Args &a, Cursor<kSparse> &cur, char *stage) {
  if (cur.valid()) {
    const int sub = threadIdx.x & 7;
    const ina_mla_cache_t &c = a.cache;
#pragma unroll
    for (int pass = 0; pass < kPasses; pass++) {
      const bool ok = cur.page[pass] >= 0;
      const char *lat = static_cast<const char *>(c.latent), *rope = lat;
      if (ok) {
        lat = cur.entry(a, c.latent, c.latent_page_stride, c.latent_token_stride, pass);
        rope = cur.entry(a, c.rope, c.rope_page_stride, c.rope_token_stride, pass);
      }
      const int bytes = ok ? 16 : 0;
      const uint32_t dst = smem_addr(stage + Cursor<kSparse>::token(pass) * kRowBytes);
      /* 72 chunks: 64 latent, 8 rope */
#pragma unroll
      for (int i = 0; i < 9; i++) {
        const int ch = sub + 8 * i;
        cp_async16(dst + 16 * ch, ch < 64 ? lat + 16 * ch : rope + 16 * (ch - 64), bytes);
      }
    }
  }
  cp_async_commit();
  if (cur.valid()) cur.advance(a);
}

__device__ __forceinline__ void load_query(const Args &a, const ina_mla_sched_request_t &req, int tile,
                                           ItemState &st) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const Row r = tile_row(req, tile, g + 8 * half, a.num_heads);
    const __nv_bfloat16 *qn = a.q_nope + r.token * a.q_nope_ts + r.head * a.q_nope_hs;
    const __nv_bfloat16 *qp = a.q_pe + r.token * a.q_pe_ts + r.head * a.q_pe_hs;
#pragma unroll
    for (int ks = 0; ks < 9; ks++) {
      const __nv_bfloat16 *src = ks < 8 ? qn + 128 * w + 16 * ks + 2 * tig : qp + 16 * w + 2 * tig;
      uint32_t lo = 0, hi = 0;
      if (r.valid) {
        lo = __ldg(reinterpret_cast<const unsigned int *>(src));
        hi = __ldg(reinterpret_cast<const unsigned int *>(src + 8));
      }
      st.q[ks][half] = lo;     /* a0 / a1: k = 2 tig, 2 tig + 1 */
      st.q[ks][2 + half] = hi; /* a2 / a3: k = 2 tig + 8, 2 tig + 9 */
    }
  }
}

/* One staged block: scores, online softmax, P V. `blk` is the block's first token. */
__device__ __forceinline__ void compute_block(const Args &a, const char *tile, float4 *partials, int blk,
                                              ItemState &st) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const uint32_t base = smem_addr(tile);

  /* S partial (16 x 32) over this warp's K slice. ldmatrix (no trans) of [token][dim] rows gives
   * B fragments of K^T: matrices (tokens +0, dims +0), (+0, +8), (+8, +0), (+8, +8). */
  float s[kNTiles][4], s_odd[kNTiles][4]; /* even and odd k-steps: two chains of dependent mma */
#pragma unroll
  for (int j = 0; j < kNTiles; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[j][e] = s_odd[j][e] = 0.0f;
  const uint32_t qk_lane = base + ((lane >> 4) * 8 + (lane & 7)) * kRowBytes + ((lane >> 3) & 1) * 16;
#pragma unroll
  for (int ks = 0; ks < 9; ks++) {
    const int kdim = ks < 8 ? 128 * w + 16 * ks : kLatent + 16 * w;
#pragma unroll
    for (int p = 0; p < kNTiles / 2; p++) {
      uint32_t b[4];
      ldsm_x4(qk_lane + 16 * p * kRowBytes + 2 * kdim, b);
      float(*acc)[4] = ks & 1 ? s_odd : s;
      mma<false>(acc[2 * p], st.q[ks], b[0], b[1]);
      mma<false>(acc[2 * p + 1], st.q[ks], b[2], b[3]);
    }
  }
#pragma unroll
  for (int j = 0; j < kNTiles; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[j][e] += s_odd[j][e];

  softmax_block(a, partials, blk, s, st);

  /* O += P V over this warp's 128 output dims. The score accumulators of n-tiles 2kk and
   * 2kk + 1 are the A fragment of k-step kk; ldmatrix.trans of [token][dim] rows gives
   * B fragments of V: matrices (tokens +0, dims +0), (+8, +0), (+0, +8), (+8, +8). */
  const uint32_t pv_lane = base + (((lane >> 3) & 1) * 8 + (lane & 7)) * kRowBytes + (lane >> 4) * 16;
#pragma unroll
  for (int kk = 0; kk < kKSteps; kk++) {
    uint32_t pa[4];
    pa[0] = pack2<false>(s[2 * kk][0], s[2 * kk][1]);
    pa[1] = pack2<false>(s[2 * kk][2], s[2 * kk][3]);
    pa[2] = pack2<false>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[3] = pack2<false>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int q = 0; q < 8; q++) {
      uint32_t b[4];
      ldsm_x4_trans(pv_lane + 16 * kk * kRowBytes + 2 * (128 * w + 16 * q), b);
      mma<false>(st.o[2 * q], pa, b[0], b[1]);
      mma<false>(st.o[2 * q + 1], pa, b[2], b[3]);
    }
  }
}

/* o[i] holds dims 8i + 2 tig + (0, 1) of the warp's 128. */
struct OutLayout {
  __device__ static int dim(int i, int tig) { return 8 * i + 2 * tig; }
  __device__ static float value(const ItemState &st, int i, int h, int e) { return st.o[i][2 * h + e]; }
};

template <bool kSparse>
__global__ void __launch_bounds__(kThreads, INA_MLA_CTAS_PER_SM) mla_fast_kernel(const Args a) {
  allow_dependent_launch(); /* the combine pass may be scheduled behind this grid */
  extern __shared__ __align__(128) char smem[];
  float4 *partials = reinterpret_cast<float4 *>(smem + kStages * kTileBytes);

  const int it_begin = a.cta_indptr[blockIdx.x], it_end = a.cta_indptr[blockIdx.x + 1];
  if (it_begin >= it_end) return;

  Cursor<kSparse> cur;
  cur.begin(a, it_begin, it_end);
#pragma unroll
  for (int s = 0; s < kStages; s++) issue_block(a, cur, smem + s * kTileBytes);

  int seq = 0;
  for (int it = it_begin; it < it_end; it++) {
    const ina_mla_sched_item_t item = a.items[it];
    const ina_mla_sched_request_t req = a.requests[item.request];
    ItemState st;
    load_query(a, req, item.tile, st);
    begin_item(req, item, a.num_heads, st);
    for (int blk = item.kv_begin; blk < item.kv_end; blk += kBlock, seq++) {
      char *stage = smem + (seq % kStages) * kTileBytes;
      cp_async_wait<kStages - 1>();
      __syncthreads(); /* the block is visible; the previous block's readers are done */
      compute_block(a, stage, partials, blk, st);
      __syncthreads(); /* every warp is done with the stage */
      issue_block(a, cur, stage);
    }
    write_item<OutLayout>(a, req, item, st, 1.0f);
  }
  cp_async_wait<0>();
}

}  // namespace

cudaError_t launch_fast(const Args &a, bool fp8, int num_ctas, cudaStream_t stream) {
  if (fp8) return launch_fast_fp8(a, num_ctas, stream);
  void (*kernel)(const Args) = a.sel ? mla_fast_kernel<true> : mla_fast_kernel<false>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<num_ctas, kThreads, kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ina_mla
