/* The Hopper MLA attention kernel (sm_90a wgmma): kv_lora_rank 512, rope 64, bf16 cache,
 * for buckets with many query rows per request (128 heads in decode, or several query
 * tokens of 16+ heads), where attention is bound by the tensor cores, not by memory.
 *
 * Work. The plan groups 4 row tiles of a request (mla_schedule.h); a CTA takes such a
 * group's chunk as one 64-row query tile, so every KV block it stages serves 64 rows
 * (the mma.sync kernel re-reads it per 16 rows). Persistent CTAs walk their lists of
 * groups; one CTA per SM (the tiles need 216 KB of shared memory), so each CTA takes two
 * consecutive lists of the plan (made for two CTAs per SM): one wave, in which the two
 * groups of a 128-head request, half a cost line apart, run at the same time and share
 * their KV blocks through L2.
 *
 * Shared memory (all tiles 128-byte swizzled, mla_wgmma.cuh):
 *   Q        64 x 576 bf16, loaded once per group            72 KB
 *   KV[2]    two stages of 64 positions x 576 bf16           144 KB
 *   P        64 x 64 bf16 probabilities of the current block   8 KB
 *   alpha, inv_l [64] f32: per-row rescale of the block, 1 / softmax sum at a group's end
 *   full[2], q_full: mbarriers completed by the cp.async copies of a stage / of Q
 *   p_free: mbarrier completed by WG1 when it is done with P and alpha (see P_FREE)
 *
 * Two warpgroups (warp w of each owns rows 16w .. 16w + 15, which is row tile w of the
 * group, so each warp writes one schedule item's rows):
 *   WG0  S = Q K^T (36 x wgmma m64n64k16, both operands from shared memory), masking,
 *        online softmax in registers (base 2, scale folded into the exponent), P to
 *        shared memory for WG1, then O[:, 0:256] += P V with P straight from its
 *        registers (4 x wgmma m64n256k16, V = the first 256 latent columns of the same
 *        KV stage read MN-major).
 *   WG1  the loads (cp.async gathers through the page table, each stage signalled by
 *        its mbarrier; Q per group), and O[:, 256:512] += P V with P from shared memory,
 *        rescaled by WG0's alpha.
 * WG0 issues 3/4 of the tensor work; WG1's quarter runs beside WG0's P V and the next
 * block's scores.
 *
 * Known limits (what to change for more speed): WG0 runs S, softmax and its P V one
 * after the other, so the tensor cores idle during the softmax; S with both operands in
 * shared memory at N = 64 reads 4 KB per instruction, near the shared-memory bandwidth;
 * with two stages a block's copies are issued only one block ahead, so load latency
 * shows whenever a block computes faster than it loads.
 *
 * Hand-offs between the warpgroups, each used strictly alternately:
 *   P_READY   WG0 arrives after writing P and alpha of block n; WG1 waits.
 *   P_FREE    an mbarrier (phase n for block n): WG1's threads arrive when their P V of
 *             block n is done; WG0 waits on it before writing P and alpha of block n + 1.
 *             An mbarrier, not a named-barrier arrive, because compute-sanitizer's
 *             racecheck models mbarrier release/acquire but not bar.arrive (it reported
 *             WG1's alpha reads against WG0's next writes); a bar.sync on both sides
 *             would also satisfy it but made WG0 wait for WG1's load issue (-6%).
 *   STAGE_FREE[s]  WG0 arrives when it no longer reads stage s (and, at a group's last
 *             block, Q); WG1 waits before loading block n + 2 (or the next group's Q)
 *             into it. One barrier per stage: WG0 cannot reach block n + 2 before WG1 has
 *             loaded it, so no barrier is ever arrived at twice ahead of its waiter.
 * A unit processed in one chunk writes bf16 out and lse; a split one an fp32 partial and
 * its lse, per 16-row item, for the combine kernel, exactly like the other kernels.
 *
 * The FP8 cache (kFp8; 512 e4m3 latents with one fp32 scale per 128, bf16 rope). The
 * tensor cores cannot take e4m3 as V (MN-major), and a scale folded into the tile would
 * round every K and V value again, so WG1 turns each block's e4m3 into f16 tiles (exact)
 * and keeps the scales apart, in a table per stage ([block of 128 dims][position]); the
 * query's latent part is turned into f16 in its tile too (rope stays bf16). Then:
 *   S   the rope's 4 k-steps (bf16), then per scale block b its 8 k-steps (f16) into a
 *       second accumulator, added to S times scale[t][b] (one wgmma wait per block b);
 *   PV  output columns 128 b .. 128 b + 127 take P'_b = p * scale[t][b] * 2^10 as f16 A
 *       fragments (2^10 keeps small probabilities in f16's normal range; the output is
 *       multiplied back, which bounds latent magnitudes by ~28000, as in mla_decode_fp8.cu):
 *       two m64n128 instructions per warpgroup and k-step, from registers. WG0 builds its
 *       P'_0, P'_1 from its scores; the P tile holds p * 2^10 in f16, from which WG1
 *       builds P'_2, P'_3.
 * WG1 loads a block's 64 positions into registers at once (the 128 accumulators leave
 * room for that, not more), converts and stores them; the rope comes by cp.async, so a
 * stage's mbarrier counts two arrivals per loading thread. Measured on 128 heads (bench/
 * RESULTS.md): neither the four waits, nor the conversions, nor the loads' latency is
 * what keeps it at ~0.73 of the bf16 variant. */
#define INA_LOG_SUBSYS "mla"
#include <math.h>

#include "mla/mla_device.cuh"
#include "mla/mla_wgmma.cuh"

/* wgmma exists on sm_90a alone: the device code is compiled for that target (and seen by
 * the host pass); the other device passes (PTX for later GPUs) get a kernel that traps. */
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define INA_MLA_WGMMA_CODE 1
#else
#define INA_MLA_WGMMA_CODE 0
#endif

namespace ina_mla {
namespace {

/* (maybe_unused: the device passes without the wgmma code reference few of these) */
[[maybe_unused]] constexpr int kLatent = 512;
[[maybe_unused]] constexpr int kDim = 576;                     /* latent + rope */
[[maybe_unused]] constexpr int kChunks = kDim / 8;             /* 16-byte chunks per row */
[[maybe_unused]] constexpr int kRows = INA_MLA_GROUP_TILES * INA_MLA_TILE_ROWS;
[[maybe_unused]] constexpr int kBlock = 64;                    /* KV positions per stage */
[[maybe_unused]] constexpr int kTileBytes = kChunks * 16 * 64; /* 64 rows x 576 bf16 */
[[maybe_unused]] constexpr int kBlockBytes = 64 * wg::kSwizzleRowBytes; /* one 64-column block of a tile */
[[maybe_unused]] constexpr int kThreads = 256;
[[maybe_unused]] constexpr int kWgThreads = 128;
[[maybe_unused]] constexpr int kOCols = 256; /* output columns per warpgroup */
[[maybe_unused]] constexpr int kListsPerCta = INA_MLA_CTAS_PER_SM; /* plan lists per CTA */
static_assert(kRows == 64 && kBlock == 64, "one m64 tile of rows, one 64-position block per stage");
static_assert(INA_MLA_KV_BLOCK % kBlock == 0, "schedule cuts fall on block boundaries");

[[maybe_unused]] constexpr int kSmemQ = 0;
[[maybe_unused]] constexpr int kSmemKV = kTileBytes;
[[maybe_unused]] constexpr int kSmemP = 3 * kTileBytes;
[[maybe_unused]] constexpr int kSmemAlpha = kSmemP + kRows * wg::kSwizzleRowBytes;
[[maybe_unused]] constexpr int kSmemInvL = kSmemAlpha + kRows * 4;
[[maybe_unused]] constexpr int kSmemBars = kSmemInvL + kRows * 4; /* full[0], full[1], q_full, p_free */
[[maybe_unused]] constexpr int kSmemUsed = kSmemBars + 4 * 8;
[[maybe_unused]] constexpr int kSmemBytes = kSmemUsed + 1024; /* room to align the base to 1024 bytes */
/* FP8 cache: each stage's scales as [4 blocks][64 positions] f32 after the barriers. The
 * 1024 bytes of alignment room no longer fit under the 227 KB a CTA may have, so the
 * kernel takes all of it and checks that its base needed at most what is left (a kernel
 * without static shared memory gets its dynamic window 1024-aligned on sm_90). */
[[maybe_unused]] constexpr int kSmemScales = kSmemUsed;
[[maybe_unused]] constexpr int kStageScaleBytes = 4 * kBlock * 4;
[[maybe_unused]] constexpr int kSmemUsedFp8 = kSmemScales + 2 * kStageScaleBytes;
[[maybe_unused]] constexpr int kSmemBytesFp8 = 227 * 1024;
static_assert(kSmemUsedFp8 <= kSmemBytesFp8 && kSmemBytes <= kSmemBytesFp8, "shared memory of one CTA per SM");
/* P' = p * scale * kPScale as f16 in the FP8 variant (mla_device.cuh). */
[[maybe_unused]] constexpr float kPScale = kFp8PScale;

enum : int { kBarPReady = 1, kBarStageFree = 3 /* + stage */ };

#if INA_MLA_WGMMA_CODE
/* A group's chunk: schedule items [lead, lead + count), rows of tiles tile0 .. tile0 + 3. */
struct Group {
  int lead, count, lead_tile;
  int request, tile0;
  int kv_begin, kv_end;
};

__device__ __forceinline__ Group load_group(const Args &a, int it) {
  const ina_mla_sched_item_t lead = a.items[it];
  Group g;
  g.lead = it;
  g.count = lead.group_items > 0 ? lead.group_items : 1;
  g.lead_tile = lead.tile;
  g.request = lead.request;
  g.tile0 = lead.tile - lead.tile % INA_MLA_GROUP_TILES;
  g.kv_begin = lead.kv_begin;
  g.kv_end = a.items[it + g.count - 1].kv_end; /* the latest tile sees the most */
  return g;
}

/* KV blocks this CTA processes, over all its groups. */
__device__ __forceinline__ int count_blocks(const Args &a, int it, int it_end) {
  int total = 0;
  while (it < it_end) {
    const Group g = load_group(a, it);
    total += (g.kv_end - g.kv_begin + kBlock - 1) / kBlock;
    it += g.count;
  }
  return total;
}

struct Smem {
  char *base;
  uint32_t addr; /* shared-window address of base */
  __device__ uint32_t q() const { return addr + kSmemQ; }
  __device__ uint32_t kv(int stage) const { return addr + kSmemKV + stage * kTileBytes; }
  __device__ uint32_t p() const { return addr + kSmemP; }
  __device__ uint32_t full(int stage) const { return addr + kSmemBars + 8 * stage; }
  __device__ uint32_t q_full() const { return addr + kSmemBars + 16; }
  __device__ uint32_t p_free() const { return addr + kSmemBars + 24; }
  __device__ float *alpha() const { return reinterpret_cast<float *>(base + kSmemAlpha); }
  __device__ float *inv_l() const { return reinterpret_cast<float *>(base + kSmemInvL); }
  /* FP8: the scales of a stage, [block of 128 latent dims][position] */
  __device__ float *scales(int stage) const {
    return reinterpret_cast<float *>(base + kSmemScales + stage * kStageScaleBytes);
  }
};

/* ---- loads (WG1) ------------------------------------------------------------------ */

/* The next KV block to load: walks the CTA's groups in the order they are computed. The
 * page ids of this thread's 4 positions are fetched one block ahead, so issuing the
 * copies never waits on the page table. */
template <bool kSparse>
struct KvLoader {
  int it, it_end;
  Group g;
  int start, page_base;
  int page[4];
  int pos[4]; /* sparse plans: cache positions of this thread's 4 (kv_position) */

  __device__ bool valid() const { return it < it_end; }
  __device__ void fetch_pages(const Args &a, int ltid) {
#pragma unroll
    for (int pass = 0; pass < 4; pass++) {
      const int t = start + pass * 16 + (ltid >> 3);
      const bool in = valid() && t < g.kv_end;
      const int p = in ? kv_position<kSparse>(a, g.request, t) : 0;
      if (kSparse) pos[pass] = p;
      page[pass] = in ? __ldg(a.kv_indices + page_base + page_index(a, p)) : -1;
    }
  }
  __device__ void begin_group(const Args &a, int ltid) {
    if (valid()) {
      g = load_group(a, it);
      start = g.kv_begin;
      page_base = request_pages<kSparse>(a, g.request);
    }
    fetch_pages(a, ltid);
  }
  __device__ void advance(const Args &a, int ltid) {
    start += kBlock;
    if (start >= g.kv_end) {
      it += g.count;
      begin_group(a, ltid);
    } else {
      fetch_pages(a, ltid);
    }
  }
};

/* Copies the loader's block into a stage (positions past the chunk read as zeros) and
 * signals the stage's mbarrier when this thread's copies have landed. Eight threads share
 * a position: each warp instruction moves 128 contiguous bytes of 4 positions. */
template <bool kSparse>
__device__ __forceinline__ void issue_block(const Args &a, KvLoader<kSparse> &ld, uint32_t stage, uint32_t bar,
                                            int ltid) {
  const int sub = ltid & 7;
  const ina_mla_cache_t &c = a.cache;
#pragma unroll
  for (int pass = 0; pass < 4; pass++) {
    const int tok = pass * 16 + (ltid >> 3);
    const int64_t page = ld.page[pass];
    const bool ok = page >= 0;
    const char *lat = static_cast<const char *>(c.latent), *rope = lat;
    if (ok) {
      const int64_t slot = page_slot(a, kSparse ? ld.pos[pass] : ld.start + tok);
      lat += page * c.latent_page_stride + slot * c.latent_token_stride;
      rope = static_cast<const char *>(c.rope) + page * c.rope_page_stride + slot * c.rope_token_stride;
    }
#pragma unroll
    for (int i = 0; i < kChunks / 8; i++) {
      const int ch = sub + 8 * i;
      const char *src = ch < 64 ? lat + 16 * ch : rope + 16 * (ch - 64);
      wg::cp_async16(stage + wg::swizzled_offset(tok, ch, 64), ok ? src : lat, ok ? 16 : 0);
    }
  }
  wg::cp_async_arrive(bar);
  ld.advance(a, ltid);
}

/* Copies the 64 query rows of a group into the Q tile (rows past the request as zeros). */
__device__ __forceinline__ void copy_query(const Args &a, const Group &g, uint32_t q, int ltid) {
  const ina_mla_sched_request_t req = a.requests[g.request];
  const int sub = ltid & 7;
#pragma unroll
  for (int pass = 0; pass < 4; pass++) {
    const int r = pass * 16 + (ltid >> 3);
    const Row row = tile_row(req, g.tile0 + r / INA_MLA_TILE_ROWS, r % INA_MLA_TILE_ROWS, a.num_heads);
    const __nv_bfloat16 *qn = a.q_nope + row.token * a.q_nope_ts + row.head * a.q_nope_hs;
    const __nv_bfloat16 *qp = a.q_pe + row.token * a.q_pe_ts + row.head * a.q_pe_hs;
#pragma unroll
    for (int i = 0; i < kChunks / 8; i++) {
      const int ch = sub + 8 * i;
      const __nv_bfloat16 *src = ch < 64 ? qn + 8 * ch : qp + 8 * (ch - 64);
      wg::cp_async16(q + wg::swizzled_offset(r, ch, 64), row.valid ? src : a.q_nope, row.valid ? 16 : 0);
    }
  }
}

/* The Q tile of a group for the bf16 variant; its mbarrier completes when the copies land. */
__device__ __forceinline__ void issue_query(const Args &a, const Group &g, uint32_t q, uint32_t bar,
                                            int ltid) {
  copy_query(a, g, q, ltid);
  wg::cp_async_arrive(bar);
}

/* ---- loads of the FP8 variant (WG1) ------------------------------------------------- */

__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

__device__ __forceinline__ uint4 ldg16(const char *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }

/* The FP8 block into a stage: the tensor cores cannot read e4m3 as the V of P V, so the
 * latent values are turned into f16 here (exactly) with their scales kept apart, in the
 * stage's scale table; the bf16 rope goes in by cp.async as in the bf16 variant. Eight
 * threads share a position as there: 128 contiguous bytes of 4 positions per warp
 * instruction. The stage's mbarrier counts two arrivals per thread: its cp.async copies
 * landed, and its stores were made visible to the tensor cores (the async proxy). */
template <bool kSparse>
__device__ __forceinline__ void issue_block_fp8(const Args &a, KvLoader<kSparse> &ld, uint32_t stage, float *scales,
                                                uint32_t bar, int ltid) {
  const int sub = ltid & 7;
  const ina_mla_cache_t &c = a.cache;
  /* All 64 positions' loads in flight at once (64 registers beside the accumulators),
   * then their conversions and stores. */
  uint4 raw[4][4];
  float sc[4];
#pragma unroll
  for (int pass = 0; pass < 4; pass++) {
    const int tok = pass * 16 + (ltid >> 3);
    const int64_t page = ld.page[pass];
    const bool ok = page >= 0;
    const char *lat = static_cast<const char *>(c.latent), *rope = lat, *scale = lat;
    if (ok) {
      const int64_t slot = page_slot(a, kSparse ? ld.pos[pass] : ld.start + tok);
      lat += page * c.latent_page_stride + slot * c.latent_token_stride;
      rope = static_cast<const char *>(c.rope) + page * c.rope_page_stride + slot * c.rope_token_stride;
      scale = static_cast<const char *>(c.scale) + page * c.scale_page_stride + slot * c.scale_token_stride;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) raw[pass][i] = ok ? ldg16(lat + 16 * (sub + 8 * i)) : make_uint4(0, 0, 0, 0);
    sc[pass] = ok && sub < 4 ? __ldg(reinterpret_cast<const float *>(scale) + sub) : 0.0f;
    wg::cp_async16(stage + wg::swizzled_offset(tok, kLatent / 8 + sub, 64), ok ? rope + 16 * sub : lat, ok ? 16 : 0);
  }
  wg::cp_async_arrive(bar);
  ld.advance(a, ltid); /* the next block's page ids, while the loads are in flight */
#pragma unroll
  for (int pass = 0; pass < 4; pass++) {
    const int tok = pass * 16 + (ltid >> 3);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      /* 16 e4m3 values, dims 16 j .. 16 j + 15, are the tile's 8-value chunks 2 j, 2 j + 1 */
      const int j = sub + 8 * i;
      const uint4 v = raw[pass][i];
      st_shared_v4(stage + wg::swizzled_offset(tok, 2 * j, 64), e4m3x2_to_f16x2(v.x), e4m3x2_to_f16x2(v.x >> 16),
                   e4m3x2_to_f16x2(v.y), e4m3x2_to_f16x2(v.y >> 16));
      st_shared_v4(stage + wg::swizzled_offset(tok, 2 * j + 1, 64), e4m3x2_to_f16x2(v.z), e4m3x2_to_f16x2(v.z >> 16),
                   e4m3x2_to_f16x2(v.w), e4m3x2_to_f16x2(v.w >> 16));
    }
    if (sub < 4) scales[sub * kBlock + tok] = sc[pass];
  }
  wg::fence_proxy_async();
  wg::mbar_arrive(bar);
}

/* The group's 64 query rows for the FP8 variant: the latent part as f16 (the type of the
 * latent products), the rope part as bf16. The rows are copied as the bf16 variant copies
 * them, then each thread turns the latent chunks it copied into f16 in place (same size),
 * so no registers hold a row in flight beside the accumulators. */
__device__ __forceinline__ void issue_query_fp8(const Args &a, const Group &g, uint32_t q, uint32_t bar, int ltid) {
  const int sub = ltid & 7;
  copy_query(a, g, q, ltid);
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#pragma unroll
  for (int pass = 0; pass < 4; pass++) {
    const int r = pass * 16 + (ltid >> 3);
#pragma unroll
    for (int i = 0; i < kLatent / 64; i++) {
      const uint32_t at = q + wg::swizzled_offset(r, sub + 8 * i, 64);
      uint32_t x, y, z, w;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "r"(at) : "memory");
      st_shared_v4(at, bf16x2_to_f16x2(x), bf16x2_to_f16x2(y), bf16x2_to_f16x2(z), bf16x2_to_f16x2(w));
    }
  }
  wg::fence_proxy_async();
  wg::mbar_arrive(bar);
}

/* ---- results ------------------------------------------------------------------------ */

/* Writes this warp's 16 rows (row tile tile0 + warp) of one warpgroup's 256 output columns,
 * normalized by inv[h] (rows g, g + 8), if that tile has an item in the group's chunk;
 * WG0 also writes the lse. */
__device__ __forceinline__ void write_rows(const Args &a, const Group &g, int col0, const float (&o)[128],
                                           const float (&inv)[2], const float *lse) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, gq = lane >> 2, t4 = lane & 3;
  const int tile = g.tile0 + w, k = tile - g.lead_tile;
  if (k < 0 || k >= g.count) return;
  const ina_mla_sched_item_t item = a.items[g.lead + k];
  const ina_mla_sched_request_t req = a.requests[g.request];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int local = gq + 8 * h;
    if (item.slot >= 0) {
      float *dst = a.partial_o + ((int64_t)item.slot * INA_MLA_TILE_ROWS + local) * kLatent + col0 + 2 * t4;
#pragma unroll
      for (int j = 0; j < kOCols / 8; j++)
        *reinterpret_cast<float2 *>(dst + 8 * j) = make_float2(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
      if (lse && t4 == 0) a.partial_lse[item.slot * INA_MLA_TILE_ROWS + local] = lse[h];
    } else {
      const Row r = tile_row(req, tile, local, a.num_heads);
      if (!r.valid) continue;
      __nv_bfloat16 *dst = a.out + r.token * a.out_ts + r.head * a.out_hs + col0 + 2 * t4;
#pragma unroll
      for (int j = 0; j < kOCols / 8; j++)
        *reinterpret_cast<__nv_bfloat162 *>(dst + 8 * j) =
            __floats2bfloat162_rn(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
      if (lse && a.lse && t4 == 0) a.lse[(int64_t)r.token * a.num_heads + r.head] = lse[h];
    }
  }
}

using ina_cuda::pack_bf16;

/* ---- WG0: scores, softmax, left half of P V ------------------------------------------ */

template <bool kFp8>
__device__ __forceinline__ void run_scores(const Args &a, const Smem &sm, int it, int it_end, int total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gq = lane >> 2, t4 = lane & 3;
  float o[128];
  int n = 0;
  for (int group = 0; it < it_end; group++) {
    const Group g = load_group(a, it);
    const ina_mla_sched_request_t req = a.requests[g.request];
    const int next = it + g.count;
    const bool has_next = next < it_end;
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; h++) limit[h] = row_kv_limit(req, g.tile0 + w, gq + 8 * h, a.num_heads, g.kv_end);
    /* positions below this are seen by every row of the tile (row 0 sees least) */
    const int unmasked = row_kv_limit(req, g.tile0, 0, a.num_heads, g.kv_end);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, inv[2] = {0.0f, 0.0f};
    float lse[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.0f;
    wg::mbar_wait(sm.q_full(), group & 1);
    wg::fence_proxy_async();

    for (int blk = g.kv_begin; blk < g.kv_end; blk += kBlock, n++) {
      const int stage = n & 1;
      const bool last = blk + kBlock >= g.kv_end;
      wg::mbar_wait(sm.full(stage), (n >> 1) & 1);
      wg::fence_proxy_async();

      /* S = Q K^T over 36 k16 steps: step ks reads columns [16 ks, 16 ks + 16), in 64-column
       * block ks / 4 at byte 32 (ks % 4) of each swizzled row: a constant added to the
       * descriptors' address field (addresses stay below 2^18, so it never carries out). */
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; i++) s[i] = 0.0f;
      const uint64_t desc_q = wg::desc_k_major(sm.q()), desc_kv = wg::desc_k_major(sm.kv(stage));
      const float *scales = kFp8 ? sm.scales(stage) : nullptr;
      wg::fence_regs(s);
      wg::wgmma_fence();
      if constexpr (!kFp8) {
#pragma unroll
        for (int ks = 0; ks < kDim / 16; ks++) {
          const uint32_t off = ((ks >> 2) * kBlockBytes + (ks & 3) * 32) >> 4;
          wg::wgmma_m64n64_ss(s, desc_q + off, desc_kv + off, ks > 0);
        }
        wg::wgmma_commit();
        wg::wgmma_wait<0>();
        wg::fence_regs(s);
      } else {
        /* The rope (bf16) into s, then each 128-dim latent block (f16) into part, added to
         * s times its scale per position: scale block b is k-steps 8 b .. 8 b + 7. */
#pragma unroll
        for (int ks = kLatent / 16; ks < kDim / 16; ks++) {
          const uint32_t off = ((ks >> 2) * kBlockBytes + (ks & 3) * 32) >> 4;
          wg::wgmma_m64n64_ss(s, desc_q + off, desc_kv + off, ks > kLatent / 16);
        }
        wg::wgmma_commit();
        float part[32]; /* one 128-dim block's latent scores, before its scales */
#pragma unroll
        for (int i = 0; i < 32; i++) part[i] = 0.0f;
#pragma unroll
        for (int b = 0; b < 4; b++) {
          wg::fence_regs(part);
          wg::wgmma_fence();
#pragma unroll
          for (int k = 0; k < 8; k++) {
            const int ks = 8 * b + k;
            const uint32_t off = ((ks >> 2) * kBlockBytes + (ks & 3) * 32) >> 4;
            wg::wgmma_m64n64_ss_f16(part, desc_q + off, desc_kv + off, k > 0);
          }
          wg::wgmma_commit();
          wg::wgmma_wait<0>();
          wg::fence_regs(part);
          wg::fence_regs(s);
#pragma unroll
          for (int j = 0; j < 8; j++) {
            const float2 sc = *reinterpret_cast<const float2 *>(scales + b * kBlock + 8 * j + 2 * t4);
            s[4 * j] = fmaf(part[4 * j], sc.x, s[4 * j]);
            s[4 * j + 1] = fmaf(part[4 * j + 1], sc.y, s[4 * j + 1]);
            s[4 * j + 2] = fmaf(part[4 * j + 2], sc.x, s[4 * j + 2]);
            s[4 * j + 3] = fmaf(part[4 * j + 3], sc.y, s[4 * j + 3]);
          }
        }
      }

      /* Element 4j + e is position blk + 8j + 2 t4 + (e & 1) of row gq (e < 2) or gq + 8. */
      if (blk + kBlock > unmasked) {
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
          for (int e = 0; e < 4; e++)
            if (blk + 8 * j + 2 * t4 + (e & 1) >= limit[e >> 1]) s[4 * j + e] = -INFINITY;
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 8; j++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
      }
      float neg_use[2], alpha[2], rowsum[2] = {0.0f, 0.0f};
      bool moved = false;
#pragma unroll
      for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float m_new = fmaxf(m[h], mx[h] * a.scale_log2);
        const float use = m_new == -INFINITY ? 0.0f : m_new; /* a row with nothing seen yet */
        neg_use[h] = -use;
        alpha[h] = m_new != m[h] ? fast_exp2(m[h] - use) : 1.0f;
        moved |= m_new != m[h];
        m[h] = m_new;
      }
#pragma unroll
      for (int i = 0; i < 32; i++) {
        s[i] = fast_exp2(fmaf(s[i], a.scale_log2, neg_use[(i >> 1) & 1]));
        rowsum[(i >> 1) & 1] += s[i];
      }
#pragma unroll
      for (int h = 0; h < 2; h++) l[h] = l[h] * alpha[h] + rowsum[h];

      /* P of the block as bf16: A fragments for this warpgroup, the swizzled tile for WG1.
       * n-tiles 2kk and 2kk + 1 form the A fragment of k-step kk. FP8: per latent block b
       * of this warpgroup's columns (0 and 1), P'_b = p * scale_b * kPScale as f16 (pa[b]),
       * and the tile holds p * kPScale as f16, which WG1 scales by its blocks 2 and 3. */
      uint32_t pa[kFp8 ? 2 : 1][4][4];
      const int row0 = 16 * w + gq, row1 = row0 + 8;
      char *p_row0 = sm.base + kSmemP + row0 * 128 + 4 * t4, *p_row1 = sm.base + kSmemP + row1 * 128 + 4 * t4;
      if constexpr (!kFp8) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
          pa[0][kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
          pa[0][kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
          pa[0][kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
          pa[0][kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
        }
        if (n > 0) wg::mbar_wait(sm.p_free(), (n - 1) & 1); /* WG1 is done with the previous P */
#pragma unroll
        for (int j = 0; j < 8; j++) {
          *reinterpret_cast<uint32_t *>(p_row0 + ((j ^ (row0 & 7)) << 4)) = pa[0][j >> 1][(j & 1) * 2];
          *reinterpret_cast<uint32_t *>(p_row1 + ((j ^ (row1 & 7)) << 4)) = pa[0][j >> 1][(j & 1) * 2 + 1];
        }
      } else {
        if (n > 0) wg::mbar_wait(sm.p_free(), (n - 1) & 1);
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
          for (int b = 0; b < 2; b++) {
            const float2 sc = *reinterpret_cast<const float2 *>(scales + b * kBlock + 8 * j + 2 * t4);
            const float x = sc.x * kPScale, y = sc.y * kPScale;
            pa[b][j >> 1][(j & 1) * 2] = pack_f16(s[4 * j] * x, s[4 * j + 1] * y);
            pa[b][j >> 1][(j & 1) * 2 + 1] = pack_f16(s[4 * j + 2] * x, s[4 * j + 3] * y);
          }
          *reinterpret_cast<uint32_t *>(p_row0 + ((j ^ (row0 & 7)) << 4)) =
              pack_f16(s[4 * j] * kPScale, s[4 * j + 1] * kPScale);
          *reinterpret_cast<uint32_t *>(p_row1 + ((j ^ (row1 & 7)) << 4)) =
              pack_f16(s[4 * j + 2] * kPScale, s[4 * j + 3] * kPScale);
        }
      }
      if (last) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
          float sum = l[h];
          sum += __shfl_xor_sync(0xffffffffu, sum, 1);
          sum += __shfl_xor_sync(0xffffffffu, sum, 2);
          inv[h] = sum > 0.0f ? (kFp8 ? 1.0f / kPScale : 1.0f) / sum : 0.0f;
          lse[h] = sum > 0.0f ? (m[h] + __log2f(sum)) * kLn2 : -INFINITY;
        }
      }
      if (t4 == 0) {
        sm.alpha()[row0] = alpha[0];
        sm.alpha()[row1] = alpha[1];
        if (last) {
          sm.inv_l()[row0] = inv[0];
          sm.inv_l()[row1] = inv[1];
        }
      }
      wg::fence_proxy_async(); /* P is read by WG1's wgmma */
      wg::bar_arrive(kBarPReady, kThreads);

      /* Rescale only when some row's maximum moved: after a chunk's first blocks, rare. */
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int j = 0; j < 32; j++) {
          o[4 * j] *= alpha[0];
          o[4 * j + 1] *= alpha[0];
          o[4 * j + 2] *= alpha[1];
          o[4 * j + 3] *= alpha[1];
        }
      }
      /* O[:, 0:256] += P V: V rows (positions) 16 kk .. 16 kk + 15 start 2048 kk bytes in;
       * its 256 columns are the stage's first four 64-column blocks. */
      wg::fence_regs(o);
      wg::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        const uint32_t v = sm.kv(stage) + kk * 16 * 128;
        if constexpr (!kFp8) {
          wg::wgmma_m64n256_rs_tb(o, pa[0][kk], wg::desc_mn_major(v, kBlockBytes));
        } else { /* columns 0 .. 127 are scale block 0, 128 .. 255 block 1 */
          wg::wgmma_m64n128_rs_tb_f16<0>(o, pa[0][kk], wg::desc_mn_major(v, kBlockBytes));
          wg::wgmma_m64n128_rs_tb_f16<64>(o, pa[1][kk], wg::desc_mn_major(v + 2 * kBlockBytes, kBlockBytes));
        }
      }
      wg::wgmma_commit();
      wg::wgmma_wait<0>();
      wg::fence_regs(o);
      if (n + 2 < total || (last && has_next)) wg::bar_arrive(kBarStageFree + stage, kThreads);
    }
    write_rows(a, g, 0, o, inv, lse);
    it = next;
  }
}

/* ---- WG1: loads, right half of P V --------------------------------------------------- */

template <bool kFp8>
__device__ __forceinline__ void load_query(const Args &a, const Smem &sm, const Group &g, int ltid) {
  if constexpr (kFp8) issue_query_fp8(a, g, sm.q(), sm.q_full(), ltid);
  else issue_query(a, g, sm.q(), sm.q_full(), ltid);
}

template <bool kSparse, bool kFp8>
__device__ __forceinline__ void load_block(const Args &a, const Smem &sm, KvLoader<kSparse> &ld, int stage,
                                           int ltid) {
  if constexpr (kFp8) issue_block_fp8(a, ld, sm.kv(stage), sm.scales(stage), sm.full(stage), ltid);
  else issue_block(a, ld, sm.kv(stage), sm.full(stage), ltid);
}

template <bool kSparse, bool kFp8>
__device__ __forceinline__ void run_values(const Args &a, const Smem &sm, int it, int it_end, int total) {
  const int ltid = threadIdx.x - kWgThreads, lane = threadIdx.x & 31, w = ltid >> 5, gq = lane >> 2, t4 = lane & 3;
  KvLoader<kSparse> ld;
  ld.it = it;
  ld.it_end = it_end;
  ld.begin_group(a, ltid);
  load_query<kFp8>(a, sm, load_group(a, it), ltid);
  load_block<kSparse, kFp8>(a, sm, ld, 0, ltid);
  if (total > 1) load_block<kSparse, kFp8>(a, sm, ld, 1, ltid);

  float o[128];
  int n = 0;
  while (it < it_end) {
    const Group g = load_group(a, it);
    const int next = it + g.count;
    const bool has_next = next < it_end;
    float inv[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.0f;

    for (int blk = g.kv_begin; blk < g.kv_end; blk += kBlock, n++) {
      const int stage = n & 1;
      const bool last = blk + kBlock >= g.kv_end;
      /* No proxy fence here: WG0 fenced after observing the same stage, before P_READY
       * (and one here would also wait for this thread's copies of the next block). */
      wg::mbar_wait(sm.full(stage), (n >> 1) & 1);
      wg::bar_sync(kBarPReady, kThreads);
      const int row0 = 16 * w + gq, row1 = row0 + 8;
      const float alpha0 = sm.alpha()[row0], alpha1 = sm.alpha()[row1];
      if (__any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) {
#pragma unroll
        for (int j = 0; j < 32; j++) {
          o[4 * j] *= alpha0;
          o[4 * j + 1] *= alpha0;
          o[4 * j + 2] *= alpha1;
          o[4 * j + 3] *= alpha1;
        }
      }
      if (last) {
        inv[0] = sm.inv_l()[row0];
        inv[1] = sm.inv_l()[row1];
      }
      /* O[:, 256:512] += P V: P k-step kk at byte 32 kk of its swizzled rows; V columns
       * 256.. are the stage's 64-column blocks 4..7. */
      /* FP8: P'_b = (p * kPScale from the tile) * scale_b as f16 A fragments, for scale
       * blocks 2 (columns 256 .. 383) and 3; the same fragment layout as WG0's. */
      uint32_t pb[kFp8 ? 2 : 1][4][4];
      if constexpr (kFp8) {
        const float *scales = sm.scales(stage);
#pragma unroll
        for (int j = 0; j < 8; j++) {
          const float2 p0 = unpack_f16(
              *reinterpret_cast<const uint32_t *>(sm.base + kSmemP + row0 * 128 + ((j ^ (row0 & 7)) << 4) + 4 * t4));
          const float2 p1 = unpack_f16(
              *reinterpret_cast<const uint32_t *>(sm.base + kSmemP + row1 * 128 + ((j ^ (row1 & 7)) << 4) + 4 * t4));
#pragma unroll
          for (int b = 0; b < 2; b++) {
            const float2 sc = *reinterpret_cast<const float2 *>(scales + (b + 2) * kBlock + 8 * j + 2 * t4);
            pb[b][j >> 1][(j & 1) * 2] = pack_f16(p0.x * sc.x, p0.y * sc.y);
            pb[b][j >> 1][(j & 1) * 2 + 1] = pack_f16(p1.x * sc.x, p1.y * sc.y);
          }
        }
      }
      wg::fence_regs(o);
      wg::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        const uint32_t v = sm.kv(stage) + 4 * kBlockBytes + kk * 16 * 128;
        if constexpr (!kFp8) {
          wg::wgmma_m64n256_ss_tb(o, wg::desc_k_major(sm.p() + kk * 32), wg::desc_mn_major(v, kBlockBytes));
        } else {
          wg::wgmma_m64n128_rs_tb_f16<0>(o, pb[0][kk], wg::desc_mn_major(v, kBlockBytes));
          wg::wgmma_m64n128_rs_tb_f16<64>(o, pb[1][kk], wg::desc_mn_major(v + 2 * kBlockBytes, kBlockBytes));
        }
      }
      wg::wgmma_commit();
      wg::wgmma_wait<0>();
      wg::fence_regs(o);
      if (n + 1 < total) wg::mbar_arrive(sm.p_free()); /* done with P and alpha of block n */
      if (n + 2 < total || (last && has_next)) {
        wg::bar_sync(kBarStageFree + stage, kThreads); /* WG0 is done with the stage (and Q) */
        if (n + 2 < total) load_block<kSparse, kFp8>(a, sm, ld, stage, ltid);
        if (last && has_next) load_query<kFp8>(a, sm, load_group(a, next), ltid);
      }
    }
    write_rows(a, g, kOCols, o, inv, nullptr);
    it = next;
  }
}

#endif  // INA_MLA_WGMMA_CODE

template <bool kSparse, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) mla_wgmma_kernel(const Args a, int num_lists) {
#if defined(__CUDA_ARCH__) && INA_MLA_WGMMA_CODE
  allow_dependent_launch(); /* the combine pass may be scheduled behind this grid */
  extern __shared__ __align__(128) char smem_raw[];
  Smem sm;
  {
    const uint32_t raw = wg::smem_u32(smem_raw);
    const uint32_t pad = (1024 - (raw & 1023)) & 1023;
    sm.base = smem_raw + pad;
    sm.addr = raw + pad;
    if (kFp8 && pad + kSmemUsedFp8 > kSmemBytesFp8) __trap(); /* see kSmemBytesFp8 */
  }
  const int first_list = kListsPerCta * blockIdx.x;
  const int last_list = min(first_list + kListsPerCta, num_lists);
  const int it_begin = a.cta_indptr[first_list], it_end = a.cta_indptr[last_list];
  if (it_begin >= it_end) return;
  const int total = count_blocks(a, it_begin, it_end);
  if (threadIdx.x == 0) {
    const int loaders = kFp8 ? 2 * kWgThreads : kWgThreads; /* FP8: copies, then stores */
    wg::mbar_init(sm.full(0), loaders);
    wg::mbar_init(sm.full(1), loaders);
    wg::mbar_init(sm.q_full(), kWgThreads);
    wg::mbar_init(sm.p_free(), kWgThreads);
  }
  __syncthreads();
  if (threadIdx.x < kWgThreads) run_scores<kFp8>(a, sm, it_begin, it_end, total);
  else run_values<kSparse, kFp8>(a, sm, it_begin, it_end, total);
#else
  __trap(); /* launched only on sm_90 devices, which run the sm_90a code above */
#endif
}

}  // namespace

bool wgmma_supported() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
  return major == 9 && minor == 0;
}

cudaError_t launch_wgmma(const Args &a, int num_ctas, cudaStream_t stream) {
  const bool fp8 = a.cache.format == INA_MLA_CACHE_FP8;
  void (*kernel)(const Args, int) = fp8 ? (a.sel ? mla_wgmma_kernel<true, true> : mla_wgmma_kernel<false, true>)
                                        : (a.sel ? mla_wgmma_kernel<true, false> : mla_wgmma_kernel<false, false>);
  const int bytes = fp8 ? kSmemBytesFp8 : kSmemBytes;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  const int grid = (num_ctas + kListsPerCta - 1) / kListsPerCta;
  kernel<<<grid, kThreads, bytes, stream>>>(a, num_ctas);
  return cudaGetLastError();
}

}  // namespace ina_mla
