/* The fast MLA attention kernel: kv_lora_rank 512, rope 64, bf16 or packed-FP8 cache,
 * written for memory-bound decode with few heads (16 per rank under TP8).
 *
 * Two persistent CTAs per SM (4 warps each) walk their lists of work items
 * (mla_schedule.h): a 16-row query tile of one request against a chunk of its KV. KV
 * blocks of 32 tokens are gathered token by token through the page table with cp.async
 * into shared memory, two blocks ahead (bf16) or three raw blocks ahead (FP8), across
 * item boundaries, so the memory pipe never drains between items.
 *
 * Per block, on mma.sync m16n8k16 tensor cores (fp32 accumulation):
 *   S = Q K^T   split over K: warp w takes latent dims [128w, 128w + 128) and rope dims
 *               [16w, 16w + 16), its 9 query fragments held in registers for the whole
 *               item; the four partial 16 x 32 score tiles meet in shared memory and every
 *               warp sums them in the same order (so all warps hold identical scores).
 *   softmax     online, base 2 with the scale folded into the exponent; masking (causal
 *               rows, chunk end) only in a tile's last blocks; the output is rescaled only
 *               when a row's maximum moved. Each warp keeps the running max and sum of its
 *               rows (identical across warps).
 *   O += P V    split over N: warp w owns output dims [128w, 128w + 128); P goes from the
 *               score accumulators straight into A fragments, V comes from the same
 *               shared tile as K through ldmatrix.trans.
 * A unit in one chunk writes bf16 out and lse; a split unit writes an fp32 partial
 * (normalized) and its lse to a slot for the combine kernel.
 *
 * FP8 cache: raw entries are staged as they are stored (512 e4m3 | 4 f32 scales | 64 bf16
 * rope) and dequantized with their scales into an f16 tile (f16 keeps 3 more mantissa bits
 * than bf16 and holds every e4m3 value exactly; the product with the scale is rounded
 * once). The latent products then run on f16 tensor cores with the query's latent part
 * converted to f16 once per item; the rope stays bf16. Limits of that choice: latent
 * values and query values must stay below 65504 in magnitude. */
#define INA_LOG_SUBSYS "mla"
#include <cuda_fp8.h>
#include <math.h>

#include "mla/mla_device.cuh"

namespace ina_mla {
namespace {

constexpr int kLatent = 512;
constexpr int kDim = 576; /* latent + rope */
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
/* KV positions per staged block. 32 (not the schedule's 64) keeps a CTA's shared memory
 * under half the SM's, so two CTAs share an SM and one computes while the other waits. */
constexpr int kBlock = 32;
constexpr int kNTiles = kBlock / 8;  /* n-tiles of the score tile */
constexpr int kKSteps = kBlock / 16; /* k-steps of P V */
static_assert(INA_MLA_KV_BLOCK % kBlock == 0, "schedule cuts fall on block boundaries");
static_assert(INA_MLA_TILE_ROWS == 16, "one m16 tile of query rows");

/* A staged KV block: [32 tokens][576 x 16-bit + 8 pad]. The pad makes the row stride
 * 1168 bytes (292 words, 4 mod 32), so the 8 rows of an ldmatrix hit distinct banks. */
constexpr int kRowBytes = (kDim + 8) * 2;
constexpr int kTileBytes = kBlock * kRowBytes;
constexpr int kBf16Stages = 2;
/* FP8 raw entry in shared memory: 512 e4m3 | 4 f32 scales | 64 bf16 rope. */
constexpr int kFp8EntryBytes = 512 + 16 + 128;
constexpr int kFp8RawBytes = kBlock * kFp8EntryBytes;
constexpr int kFp8RawStages = 3;
/* Partial score tiles of the 4 warps, in accumulator order: [warp][n-tile][lane] float4. */
constexpr int kPartialBytes = kWarps * kNTiles * 32 * 16;

constexpr int smem_bytes(bool fp8) {
  return fp8 ? kFp8RawStages * kFp8RawBytes + kTileBytes + kPartialBytes
             : kBf16Stages * kTileBytes + kPartialBytes;
}

/* ---- PTX wrappers ------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* 16 bytes global -> shared; src_bytes = 0 writes zeros (positions past the chunk). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t r[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t r[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

/* c += a * b on m16n8k16, fp32 accumulators; kHalf picks f16 inputs, else bf16. */
template <bool kHalf>
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  if (kHalf) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
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

/* bf16 pair -> f16 pair (exact for magnitudes in f16's normal range). */
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v) {
  const float lo = __uint_as_float(v << 16), hi = __uint_as_float(v & 0xFFFF0000u);
  return pack2<true>(lo, hi);
}

/* ---- loading KV blocks --------------------------------------------------------------- */

/* The next KV block to load: walks the CTA's items in the order the compute loop
 * consumes them. The page ids of the block's positions are fetched one block ahead (when
 * the cursor moves), so issuing the copies never waits on a page-table load. */
constexpr int kPasses = kBlock / (kThreads / 8); /* positions per thread and block */

struct Cursor {
  int item, item_end; /* index into the schedule's items; end of this CTA's list */
  int start, kv_end;  /* the block's first position; the item's chunk end */
  int page_base;      /* kv_indptr[request] */
  int page[kPasses];  /* page id of this thread's positions, -1 past the chunk end */

  __device__ bool valid() const { return item < item_end; }
  __device__ void fetch_pages(const Args &a) {
    const int page_size = a.cache.page_size;
#pragma unroll
    for (int pass = 0; pass < kPasses; pass++) {
      const int t = start + pass * (kThreads / 8) + (threadIdx.x >> 3);
      page[pass] = valid() && t < kv_end ? __ldg(a.kv_indices + page_base + t / page_size) : -1;
    }
  }
  __device__ void load_item(const Args &a) {
    if (valid()) {
      const ina_mla_sched_item_t &it = a.items[item];
      start = it.kv_begin;
      kv_end = it.kv_end;
      page_base = __ldg(a.kv_indptr + it.request);
    }
    fetch_pages(a);
  }
  __device__ void advance(const Args &a) {
    start += kBlock;
    if (start >= kv_end) {
      item++;
      load_item(a);
    } else {
      fetch_pages(a);
    }
  }
};

/* Issues the copies of the cursor's block into `stage` as one cp.async group (an empty
 * group once the list is done, so group counting stays uniform) and advances. Eight
 * threads share a position: each warp instruction moves 128 contiguous bytes of 4
 * positions. */
template <bool kFp8>
__device__ __forceinline__ void issue_block(const Args &a, Cursor &cur, char *stage) {
  if (cur.valid()) {
    const int sub = threadIdx.x & 7;
    const ina_mla_cache_t &c = a.cache;
#pragma unroll
    for (int pass = 0; pass < kPasses; pass++) {
      const int tok = pass * (kThreads / 8) + (threadIdx.x >> 3);
      const int64_t page = cur.page[pass];
      const bool ok = page >= 0;
      const int64_t slot = (cur.start + tok) % c.page_size;
      const char *lat = static_cast<const char *>(c.latent), *rope = lat, *scale = lat;
      if (ok) {
        lat += page * c.latent_page_stride + slot * c.latent_token_stride;
        rope = static_cast<const char *>(c.rope) + page * c.rope_page_stride + slot * c.rope_token_stride;
        if (kFp8)
          scale = static_cast<const char *>(c.scale) + page * c.scale_page_stride + slot * c.scale_token_stride;
      }
      const int bytes = ok ? 16 : 0;
      if (kFp8) {
        const uint32_t dst = smem_addr(stage + tok * kFp8EntryBytes);
        /* 41 chunks: 32 latent, 1 scale, 8 rope */
#pragma unroll
        for (int i = 0; i < 6; i++) {
          const int ch = sub + 8 * i;
          if (ch < 32) cp_async16(dst + 16 * ch, lat + 16 * ch, bytes);
          else if (ch == 32) cp_async16(dst + 16 * ch, scale, bytes);
          else if (ch < 41) cp_async16(dst + 16 * ch, rope + 16 * (ch - 33), bytes);
        }
      } else {
        const uint32_t dst = smem_addr(stage + tok * kRowBytes);
        /* 72 chunks: 64 latent, 8 rope */
#pragma unroll
        for (int i = 0; i < 9; i++) {
          const int ch = sub + 8 * i;
          cp_async16(dst + 16 * ch, ch < 64 ? lat + 16 * ch : rope + 16 * (ch - 64), bytes);
        }
      }
    }
  }
  cp_async_commit();
  if (cur.valid()) cur.advance(a);
}

/* 8 e4m3 values (one 8-byte word pair) times their block scale -> 8 f16 values. */
__device__ __forceinline__ uint4 dequant8(uint32_t w0, uint32_t w1, float scale) {
  /* One f16 product when the scale and every product stay normal f16 numbers
   * (|e4m3| <= 448, so scale <= 128 keeps products below 65504); otherwise in f32. */
  const bool f16_ok = scale >= 6.103515625e-05f && scale <= 128.0f;
  const __half2 hs = __float2half2_rn(scale);
  const uint32_t w[2] = {w0, w1};
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(w[i >> 1] >> (16 * (i & 1)));
    __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
    if (f16_ok) {
      h = __hmul2(h, hs);
    } else {
      const float2 f = __half22float2(h);
      h = __floats2half2_rn(f.x * scale, f.y * scale);
    }
    out[i] = *reinterpret_cast<uint32_t *>(&h);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

/* Raw FP8 block -> f16 latent (dequantized) and bf16 rope in the compute tile. Four
 * threads per position: thread part p takes latent chunks p, p + 4, ... (16 values each,
 * so chunk p + 4i lies in scale block i / 2) and rope chunks p and p + 4. */
__device__ __forceinline__ void dequant_block(const char *raw, char *tile) {
  static_assert(kThreads == 4 * kBlock, "four threads per position");
  const int tok = threadIdx.x >> 2, part = threadIdx.x & 3;
  const char *src = raw + tok * kFp8EntryBytes;
  char *dst = tile + tok * kRowBytes;
  const float4 scales = *reinterpret_cast<const float4 *>(src + kLatent);
  const float sc[4] = {scales.x, scales.y, scales.z, scales.w};
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int ch = part + 4 * i;
    const uint4 v = *reinterpret_cast<const uint4 *>(src + 16 * ch);
    *reinterpret_cast<uint4 *>(dst + 32 * ch) = dequant8(v.x, v.y, sc[i >> 1]);
    *reinterpret_cast<uint4 *>(dst + 32 * ch + 16) = dequant8(v.z, v.w, sc[i >> 1]);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int ch = part + 4 * i;
    *reinterpret_cast<uint4 *>(dst + 2 * kLatent + 16 * ch) =
        *reinterpret_cast<const uint4 *>(src + kLatent + 16 + 16 * ch);
  }
}

/* ---- the kernel ------------------------------------------------------------------ */

/* Per-thread state of one work item: query fragments, running softmax, output. */
struct ItemState {
  uint32_t q[9][4]; /* A fragments: 8 latent k-steps (f16 for FP8) and 1 rope k-step */
  float o[16][4];   /* C fragments of output dims [128w + 8j, +8) */
  float m[2], l[2]; /* rows g and g + 8: running max (base 2) and this thread's part of the sum */
  int limit[2];     /* KV positions the two rows see in this chunk */
  int unmasked;     /* positions below this are seen by every row of the tile */
};

template <bool kFp8>
__device__ __forceinline__ void load_query(const Args &a, const ina_mla_sched_request_t &req,
                                           int tile, ItemState &st) {
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
      if (kFp8 && ks < 8) {
        lo = bf16x2_to_f16x2(lo);
        hi = bf16x2_to_f16x2(hi);
      }
      st.q[ks][half] = lo;     /* a0 / a1: k = 2 tig, 2 tig + 1 */
      st.q[ks][2 + half] = hi; /* a2 / a3: k = 2 tig + 8, 2 tig + 9 */
    }
  }
}

/* One staged block: scores, online softmax, P V. `blk` is the block's first token. */
template <bool kFp8>
__device__ __forceinline__ void compute_block(const Args &a, const char *tile, float4 *partials,
                                              int blk, ItemState &st) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, tig = lane & 3;
  const uint32_t base = smem_addr(tile);

  /* S partial (16 x 32) over this warp's K slice. ldmatrix (no trans) of [token][dim] rows gives
   * B fragments of K^T: matrices (tokens +0, dims +0), (+0, +8), (+8, +0), (+8, +8). */
  float s[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
  const uint32_t qk_lane = base + ((lane >> 4) * 8 + (lane & 7)) * kRowBytes + ((lane >> 3) & 1) * 16;
#pragma unroll
  for (int ks = 0; ks < 9; ks++) {
    const int kdim = ks < 8 ? 128 * w + 16 * ks : kLatent + 16 * w;
#pragma unroll
    for (int p = 0; p < kNTiles / 2; p++) {
      uint32_t b[4];
      ldsm_x4(qk_lane + 16 * p * kRowBytes + 2 * kdim, b);
      if (kFp8 && ks < 8) {
        mma<true>(s[2 * p], st.q[ks], b[0], b[1]);
        mma<true>(s[2 * p + 1], st.q[ks], b[2], b[3]);
      } else {
        mma<false>(s[2 * p], st.q[ks], b[0], b[1]);
        mma<false>(s[2 * p + 1], st.q[ks], b[2], b[3]);
      }
    }
  }

  /* Sum the four warps' partials in a fixed order: every warp gets identical scores. */
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

  /* Online softmax in base 2 with the scale folded into the exponent (scale > 0, so the
   * raw maximum is the scaled one). Element e of n-tile j is position
   * blk + 8j + 2 tig + (e & 1), row g (e < 2) or g + 8; masking (causal rows, chunk end)
   * is needed only in a tile's last blocks. */
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
  /* Rescale the output only when some row's maximum moved (alpha = 1 otherwise): after
   * the first blocks of a chunk that is rare. */
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
      st.o[j][0] *= alpha[0];
      st.o[j][1] *= alpha[0];
      st.o[j][2] *= alpha[1];
      st.o[j][3] *= alpha[1];
    }
  }

  /* O += P V over this warp's 128 output dims. The score accumulators of n-tiles 2kk and
   * 2kk + 1 are the A fragment of k-step kk; ldmatrix.trans of [token][dim] rows gives
   * B fragments of V: matrices (tokens +0, dims +0), (+8, +0), (+0, +8), (+8, +8). */
  const uint32_t pv_lane = base + (((lane >> 3) & 1) * 8 + (lane & 7)) * kRowBytes + (lane >> 4) * 16;
#pragma unroll
  for (int kk = 0; kk < kKSteps; kk++) {
    uint32_t pa[4];
    pa[0] = pack2<kFp8>(s[2 * kk][0], s[2 * kk][1]);
    pa[1] = pack2<kFp8>(s[2 * kk][2], s[2 * kk][3]);
    pa[2] = pack2<kFp8>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[3] = pack2<kFp8>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int q = 0; q < 8; q++) {
      uint32_t b[4];
      ldsm_x4_trans(pv_lane + 16 * kk * kRowBytes + 2 * (128 * w + 16 * q), b);
      mma<kFp8>(st.o[2 * q], pa, b[0], b[1]);
      mma<kFp8>(st.o[2 * q + 1], pa, b[2], b[3]);
    }
  }
}

/* Normalizes and writes the item's result: bf16 out + lse, or an fp32 partial. */
__device__ __forceinline__ void write_item(const Args &a, const ina_mla_sched_request_t &req,
                                           const ina_mla_sched_item_t &item, ItemState &st) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int local = g + 8 * h;
    const float inv = st.l[h] > 0.0f ? 1.0f / st.l[h] : 0.0f;
    const float lse = st.l[h] > 0.0f ? (st.m[h] + __log2f(st.l[h])) * kLn2 : -INFINITY;
    if (item.slot >= 0) {
      float *dst = a.partial_o + ((int64_t)item.slot * INA_MLA_TILE_ROWS + local) * kLatent + 128 * w + 2 * tig;
#pragma unroll
      for (int j = 0; j < 16; j++)
        *reinterpret_cast<float2 *>(dst + 8 * j) = make_float2(st.o[j][2 * h] * inv, st.o[j][2 * h + 1] * inv);
      if (w == 0 && tig == 0) a.partial_lse[item.slot * INA_MLA_TILE_ROWS + local] = lse;
    } else {
      const Row r = tile_row(req, item.tile, local, a.num_heads);
      if (!r.valid) continue;
      __nv_bfloat16 *dst = a.out + r.token * a.out_ts + r.head * a.out_hs + 128 * w + 2 * tig;
#pragma unroll
      for (int j = 0; j < 16; j++)
        *reinterpret_cast<__nv_bfloat162 *>(dst + 8 * j) =
            __floats2bfloat162_rn(st.o[j][2 * h] * inv, st.o[j][2 * h + 1] * inv);
      if (a.lse && w == 0 && tig == 0) a.lse[(int64_t)r.token * a.num_heads + r.head] = lse;
    }
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, INA_MLA_CTAS_PER_SM) mla_fast_kernel(const Args a) {
  extern __shared__ __align__(128) char smem[];
  constexpr int kStages = kFp8 ? kFp8RawStages : kBf16Stages;
  constexpr int kStageBytes = kFp8 ? kFp8RawBytes : kTileBytes;
  char *fp8_tile = smem + kStages * kStageBytes;
  float4 *partials = reinterpret_cast<float4 *>(smem + kStages * kStageBytes + (kFp8 ? kTileBytes : 0));
  const int lane = threadIdx.x & 31, g = lane >> 2;

  const int it_begin = a.cta_indptr[blockIdx.x], it_end = a.cta_indptr[blockIdx.x + 1];
  if (it_begin >= it_end) return;

  Cursor cur;
  cur.item = it_begin;
  cur.item_end = it_end;
  cur.load_item(a);
#pragma unroll
  for (int s = 0; s < kStages; s++) issue_block<kFp8>(a, cur, smem + s * kStageBytes);

  int seq = 0;
  for (int it = it_begin; it < it_end; it++) {
    const ina_mla_sched_item_t item = a.items[it];
    const ina_mla_sched_request_t req = a.requests[item.request];
    ItemState st;
    load_query<kFp8>(a, req, item.tile, st);
#pragma unroll
    for (int h = 0; h < 2; h++) {
      st.m[h] = -INFINITY;
      st.l[h] = 0.0f;
      st.limit[h] = row_kv_limit(req, item.tile, g + 8 * h, a.num_heads, item.kv_end);
    }
    st.unmasked = row_kv_limit(req, item.tile, 0, a.num_heads, item.kv_end); /* row 0 sees least */
#pragma unroll
    for (int j = 0; j < 16; j++) st.o[j][0] = st.o[j][1] = st.o[j][2] = st.o[j][3] = 0.0f;

    for (int blk = item.kv_begin; blk < item.kv_end; blk += kBlock, seq++) {
      char *stage = smem + (seq % kStages) * kStageBytes;
      cp_async_wait<kStages - 1>();
      __syncthreads(); /* the block is visible; the previous block's readers are done */
      if (kFp8) {
        dequant_block(stage, fp8_tile);
        __syncthreads(); /* the tile is visible; the raw stage is free */
        issue_block<kFp8>(a, cur, stage);
        compute_block<kFp8>(a, fp8_tile, partials, blk, st);
      } else {
        compute_block<kFp8>(a, stage, partials, blk, st);
        __syncthreads(); /* every warp is done with the stage */
        issue_block<kFp8>(a, cur, stage);
      }
    }
    write_item(a, req, item, st);
  }
  cp_async_wait<0>();
}

}  // namespace

cudaError_t launch_fast(const Args &a, bool fp8, int num_ctas, cudaStream_t stream) {
  const int bytes = smem_bytes(fp8);
  cudaError_t e = fp8 ? cudaFuncSetAttribute(mla_fast_kernel<true>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)
                      : cudaFuncSetAttribute(mla_fast_kernel<false>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  if (fp8) mla_fast_kernel<true><<<num_ctas, kThreads, bytes, stream>>>(a);
  else mla_fast_kernel<false><<<num_ctas, kThreads, bytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ina_mla
