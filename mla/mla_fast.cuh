/* What the two mma.sync MLA kernels share (mla_decode.cu for a bf16 cache,
 * mla_decode_fp8.cu for the packed FP8 one): kv_lora_rank 512 + rope 64, 16-row query
 * tiles, 4 warps, 32-position KV blocks gathered with cp.async through the page table.
 *
 * Both kernels split a block's work the same way:
 *   S = Q K^T   split over K: warp w takes latent dims [128w, 128w + 128) and rope dims
 *               [16w, 16w + 16); the four partial 16 x 32 score tiles meet in shared
 *               memory and every warp sums them in the same order (so all warps hold
 *               identical scores).
 *   softmax     online, base 2 with the scale folded into the exponent (softmax_block).
 *   O += P V    split over N: warp w owns output dims [128w, 128w + 128).
 * They differ in how K and V reach the tensor cores (ldmatrix of bf16 rows, or e4m3
 * bytes converted in registers) and so in which output dims a thread's accumulators
 * hold. CUDA C++, internal to mla/. */
#ifndef INA_MLA_MLA_FAST_CUH
#define INA_MLA_MLA_FAST_CUH

#include <math.h>

#include "core/ptx.cuh"
#include "mla/mla_device.cuh"

namespace ina_mla {
namespace fast {

constexpr int kLatent = 512;
constexpr int kRope = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
/* KV positions per staged block. 32 (not the schedule's 64) keeps a CTA's shared memory
 * under half the SM's, so two CTAs share an SM and one computes while the other waits. */
constexpr int kBlock = 32;
constexpr int kNTiles = kBlock / 8;  /* n-tiles of the score tile */
constexpr int kKSteps = kBlock / 16; /* k-steps of P V */
static_assert(INA_MLA_KV_BLOCK % kBlock == 0, "schedule cuts fall on block boundaries");
static_assert(INA_MLA_TILE_ROWS == 16, "one m16 tile of query rows");
/* Partial score tiles of the 4 warps, in accumulator order: [warp][n-tile][lane] float4. */
constexpr int kPartialBytes = kWarps * kNTiles * 32 * 16;

/* ---- PTX wrappers (core/ptx.cuh) ------------------------------------------------------ */

using ina_ptx::cp_async16;
using ina_ptx::cp_async_commit;
using ina_ptx::cp_async_wait;
using ina_ptx::smem_addr;

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) { ina_ptx::ldmatrix_x4(r, addr); }
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) { ina_ptx::ldmatrix_x4_trans(r, addr); }

/* c += a * b on m16n8k16, fp32 accumulators; kHalf picks f16 inputs, else bf16. */
template <bool kHalf>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if (kHalf)
    ina_ptx::mma_f16(c, a, b0, b1);
  else
    ina_ptx::mma_bf16(c, a, b0, b1);
}

template <bool kHalf>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if (kHalf) {
    __half2 h = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t *>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t *>(&h);
  }
  return r;
}

/* ---- walking the KV blocks of a CTA's items ---------------------------------------- */

/* The next KV block to load: walks the CTA's items in the order the compute loop
 * consumes them. The page ids of the block's positions are fetched one block ahead (when
 * the cursor moves), so issuing the copies never waits on a page-table load. Eight
 * threads share a position. */
constexpr int kPasses = kBlock / (kThreads / 8); /* positions per thread and block */

template <bool kSparse>
struct Cursor {
  int item, item_end; /* index into the schedule's items; end of this CTA's list */
  int start, kv_end;  /* the block's first position; the item's chunk end */
  int request;        /* the item's schedule request */
  int page_base;      /* where its page list starts (request_pages) */
  int page[kPasses];  /* page id of this thread's positions, -1 past the chunk end */
  int pos[kPasses];   /* sparse plans: their cache positions (kv_position) */
  /* Sparse plans: the cache positions of the next block of the item, read one block
   * early, so that a block's page ids wait on one load (the page table), not on the
   * index row and then the page table. */
  int pos_ahead[kPasses];

  __device__ bool valid() const { return item < item_end; }
  /* At the first block of the CTA's items [it_begin, it_end). */
  __device__ void begin(const Args &a, int it_begin, int it_end) {
    item = it_begin;
    item_end = it_end;
    load_item(a);
  }
  /* Position of pass `pass` of this thread within the block. */
  __device__ static int token(int pass) { return pass * (kThreads / 8) + (threadIdx.x >> 3); }
  /* have_ahead: pos_ahead holds this block's positions (read at the previous block). */
  __device__ void fetch_pages(const Args &a, bool have_ahead) {
#pragma unroll
    for (int pass = 0; pass < kPasses; pass++) {
      const int t = start + token(pass);
      const bool in = valid() && t < kv_end;
      int p = t;
      if (kSparse) {
        p = have_ahead ? pos_ahead[pass] : in ? kv_position<kSparse>(a, request, t) : 0;
        pos[pass] = p;
        const int t_next = t + kBlock;
        pos_ahead[pass] = valid() && t_next < kv_end ? kv_position<kSparse>(a, request, t_next) : 0;
      }
      page[pass] = in ? __ldg(a.kv_indices + page_base + page_index(a, p)) : -1;
    }
  }
  __device__ void load_item(const Args &a) {
    if (valid()) {
      const ina_mla_sched_item_t &it = a.items[item];
      start = it.kv_begin;
      kv_end = it.kv_end;
      request = it.request;
      page_base = request_pages<kSparse>(a, request);
    }
    fetch_pages(a, false);
  }
  __device__ void advance(const Args &a) {
    start += kBlock;
    if (start >= kv_end) {
      item++;
      load_item(a);
    } else {
      fetch_pages(a, true);
    }
  }
  /* Byte address of part `base` of this thread's position in pass `pass` (page >= 0). */
  __device__ const char *entry(const Args &a, const void *base, int64_t page_stride, int64_t token_stride,
                               int pass) const {
    const int64_t slot = page_slot(a, kSparse ? pos[pass] : start + token(pass));
    return static_cast<const char *>(base) + page[pass] * page_stride + slot * token_stride;
  }
};

/* ---- per-item state and the online softmax ----------------------------------------- */

/* Per-thread state of one work item: query fragments, running softmax, output. */
struct ItemState {
  uint32_t q[9][4]; /* A fragments: 8 latent k-steps and 1 rope k-step */
  float o[16][4];   /* C fragments of this warp's 128 output dims (layout: the kernel's) */
  float m[2], l[2]; /* rows g and g + 8: running max (base 2) and this thread's part of the sum */
  int limit[2];     /* KV positions the two rows see in this chunk */
  int unmasked;     /* positions below this are seen by every row of the tile */
};

__device__ __forceinline__ void begin_item(const ina_mla_sched_request_t &req,
                                           const ina_mla_sched_item_t &item, int num_heads,
                                           ItemState &st) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    st.m[h] = -INFINITY;
    st.l[h] = 0.0f;
    st.limit[h] = row_kv_limit(req, item.tile, g + 8 * h, num_heads, item.kv_end);
  }
  st.unmasked = row_kv_limit(req, item.tile, 0, num_heads, item.kv_end); /* row 0 sees least */
#pragma unroll
  for (int j = 0; j < 16; j++) st.o[j][0] = st.o[j][1] = st.o[j][2] = st.o[j][3] = 0.0f;
}

/* Sums the warps' partial scores s (16 x 32, this warp's K slice) and turns them into
 * probabilities: online softmax in base 2 with the scale folded into the exponent (scale
 * > 0, so the raw maximum is the scaled one), the output rescaled only when some row's
 * maximum moved. Element e of n-tile j is position blk + 8j + 2 tig + (e & 1), row g
 * (e < 2) or g + 8; masking (causal rows, chunk end) is needed only in a tile's last
 * blocks. The partial tiles are read after one barrier; the caller's barrier at the top
 * of the next block keeps those reads ahead of the next block's writes. */
__device__ __forceinline__ void softmax_block(const Args &a, float4 *partials, int blk, float s[kNTiles][4],
                                              ItemState &st) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, tig = lane & 3;
#pragma unroll
  for (int j = 0; j < kNTiles; j++)
    partials[(w * kNTiles + j) * 32 + lane] = make_float4(s[j][0], s[j][1], s[j][2], s[j][3]);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kNTiles; j++) {
    float4 v = partials[j * 32 + lane];
#pragma unroll
    for (int ww = 1; ww < kWarps; ww++) {
      const float4 u = partials[(ww * kNTiles + j) * 32 + lane];
      v.x += u.x;
      v.y += u.y;
      v.z += u.z;
      v.w += u.w;
    }
    s[j][0] = v.x;
    s[j][1] = v.y;
    s[j][2] = v.z;
    s[j][3] = v.w;
  }

  if (blk + kBlock > st.unmasked) {
#pragma unroll
    for (int j = 0; j < kNTiles; j++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        if (blk + 8 * j + 2 * tig + (e & 1) >= st.limit[e >> 1]) s[j][e] = -INFINITY;
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kNTiles; j++) {
    mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
  }
  float neg_use[2], alpha[2], rowsum[2] = {0.0f, 0.0f};
  bool moved = false;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float m_new = fmaxf(st.m[h], mx[h] * a.scale_log2);
    const float use = m_new == -INFINITY ? 0.0f : m_new; /* a row with nothing seen yet */
    neg_use[h] = -use;
    alpha[h] = fast_exp2(st.m[h] - use);
    moved |= m_new != st.m[h];
    st.m[h] = m_new;
  }
#pragma unroll
  for (int j = 0; j < kNTiles; j++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      s[j][e] = fast_exp2(fmaf(s[j][e], a.scale_log2, neg_use[e >> 1]));
      rowsum[e >> 1] += s[j][e];
    }
  }
#pragma unroll
  for (int h = 0; h < 2; h++) st.l[h] = st.l[h] * alpha[h] + rowsum[h];
  /* alpha = 1 unless the maximum moved: after the first blocks of a chunk that is rare. */
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
      st.o[j][0] *= alpha[0];
      st.o[j][1] *= alpha[0];
      st.o[j][2] *= alpha[1];
      st.o[j][3] *= alpha[1];
    }
  }
}

/* Row results of an item: for rows g (h = 0) and g + 8 (h = 1), the factor that
 * normalizes the accumulators and the lse. out_scale undoes a constant factor the kernel
 * kept in its accumulators. */
struct RowResult {
  float inv[2], lse[2];
};

__device__ __forceinline__ RowResult finish_rows(ItemState &st, float out_scale) {
  RowResult r;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
    r.inv[h] = st.l[h] > 0.0f ? out_scale / st.l[h] : 0.0f;
    r.lse[h] = st.l[h] > 0.0f ? (st.m[h] + __log2f(st.l[h])) * kLn2 : -INFINITY;
  }
  return r;
}

/* Writes the item's result: bf16 out + lse, or an fp32 partial and its lse. Thread part:
 * for rows g and g + 8, kPairs pairs of adjacent output dims, pair i at warp dim
 * Layout::dim(i) with values Layout::value(st, i, h, e) (e = 0, 1). */
template <class Layout>
__device__ __forceinline__ void write_item(const Args &a, const ina_mla_sched_request_t &req,
                                           const ina_mla_sched_item_t &item, ItemState &st, float out_scale) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
  const RowResult res = finish_rows(st, out_scale);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int local = g + 8 * h;
    const float inv = res.inv[h];
    if (item.slot >= 0) {
      float *dst = a.partial_o + ((int64_t)item.slot * INA_MLA_TILE_ROWS + local) * kLatent + 128 * w;
#pragma unroll
      for (int i = 0; i < 16; i++)
        *reinterpret_cast<float2 *>(dst + Layout::dim(i, tig)) =
            make_float2(Layout::value(st, i, h, 0) * inv, Layout::value(st, i, h, 1) * inv);
      if (w == 0 && tig == 0) a.partial_lse[item.slot * INA_MLA_TILE_ROWS + local] = res.lse[h];
    } else {
      const Row r = tile_row(req, item.tile, local, a.num_heads);
      if (!r.valid) continue;
      __nv_bfloat16 *dst = a.out + r.token * a.out_ts + r.head * a.out_hs + 128 * w;
#pragma unroll
      for (int i = 0; i < 16; i++)
        *reinterpret_cast<__nv_bfloat162 *>(dst + Layout::dim(i, tig)) =
            __floats2bfloat162_rn(Layout::value(st, i, h, 0) * inv, Layout::value(st, i, h, 1) * inv);
      if (a.lse && w == 0 && tig == 0) a.lse[(int64_t)r.token * a.num_heads + r.head] = res.lse[h];
    }
  }
}

}  // namespace fast
}  // namespace ina_mla

#endif
