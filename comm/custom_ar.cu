/* The custom all-reduce kernels (comm/custom_ar.h; host side in custom_ar.c, partition in
 * custom_ar_plan.h, element arithmetic in custom_ar_math.h).
 *
 * Each run is one kernel of plan.blocks CTAs x 512 threads. Phases, for CTA b:
 *   LL         write range b of `in` into every peer's LL lines ll[epoch & 1][me] (data and
 *              flag words in each 8-byte half) | sum range b of `in` and of the lines from
 *              every peer, in rank order, polling each line until its flags carry this
 *              run's value, then zero the line -> out (or epilogue rows)
 *   ONE_SHOT   copy range b of `in` into our stage[epoch & 1] | READY | sum range b of
 *              every rank's stage in rank order -> out (or epilogue rows)
 *   TWO_SHOT   copy range b of every stripe of `in` into our input region (skipped when
 *              `in` is that region) | READY | sum range b of our stripe from every rank's
 *              input region -> our reduced region (+ out) | MID | copy range b of every
 *              other stripe from its owner's reduced region -> out (or epilogue rows)
 *   FP8        TWO_SHOT by remote writes: quantize range b of stripe s of `in` (e4m3 +
 *              scales per 128 values) into rank s's fp8_recv slot [me], for every s | READY
 *              | dequantize range b of our stripe from our slots, sum in rank order,
 *              re-quantize into every rank's reduced region (+ out) | MID | dequantize range
 *              b of every other stripe from our own reduced region -> out (or epilogue rows)
 *
 * Synchronization. Counters ("flags") live in every rank's registered memory:
 * flags[kind][b][src] is written only by CTA b of rank src, with st.release.sys, and read
 * only by CTA b of the owner, with ld.acquire.sys. A barrier of CTA b at epoch e:
 *   __syncthreads()                    every thread's earlier accesses of this CTA (local or
 *                                      remote) are ordered before the releases below
 *   thread p < n: flags_p[kind][b][me] = e   (release, system scope), then waits until
 *                 flags_me[kind][b][p] >= e  (acquire, system scope)
 *   __syncthreads()                    the acquires are ordered before every thread's
 *                                      later accesses
 * so whatever CTA b of rank p did before its release happens-before whatever CTA b of this
 * rank does after the barrier (release/acquire at system scope, then CTA barriers, which
 * the PTX memory model composes into causality order). By the partition rule of
 * custom_ar_plan.h, CTA b only reads peer data written by the peers' CTA b before a barrier
 * both pass, so per-CTA barriers suffice.
 *
 * LL needs no barrier: a line's data and flag words share an 8-byte half, which a 16-byte
 * store writes and a 16-byte load reads whole, so a line whose two flags are this run's
 * value carries this run's data. The value is the epoch folded into [1, 2^32 - 1]; a
 * consumed line is zeroed, so a line holds either nothing or one unconsumed run's data.
 *
 * Epochs. CTA b keeps in epochs[b] (our memory, touched only by CTA b of our kernels) the
 * number of kernels it completed; a kernel uses e = epochs[b] + 1 and stores it at the end.
 * Every kernel has the same grid, every rank runs the same sequence of kernels, so e is
 * the same on every rank and in every CTA of a kernel, flags only grow, and a replayed
 * graph just continues counting: nothing is ever reset. A flag may already be past e (the
 * peer moved on), hence the >= test. 64-bit counters never wrap.
 *
 * Why buffers can be reused without more barriers (stream order: kernel e of a rank
 * starts after its kernel e-1 ended; seeing anything a peer wrote in kernel e proves its
 * kernel e-1 ended, and every kernel with data has at least one CTA that sees something
 * from every peer):
 *   stage[e & 1]  written before READY of kernel e. Its last readers were kernels <= e-2
 *                 of the peers, which ended before the peers signalled READY of kernel
 *                 e-1, which we waited for in kernel e-1.
 *   ll[e & 1]     written by the peers in kernel e without waiting. Our last reads of it
 *                 were in kernel e-2, which ended before our kernel e-1 wrote to the
 *                 peers, which they saw in their kernel e-1 before starting kernel e.
 *   input         the peers read it in TWO_SHOT phase 1, before their MID signal; we wait
 *                 for MID before our kernel ends, so afterwards the caller may overwrite
 *                 it, and our next copy-in may too.
 *   fp8_recv      written by the peers before READY of kernel e; we read it before our MID
 *                 signal of kernel e-1, which they waited for in kernel e-1.
 *   reduced       written after READY of kernel e (by us, and in FP8 by the peers); its
 *                 readers (phase 2 of kernels <= e-1, ours or the peers') ended before
 *                 the READY signals of kernel e.
 *
 * Deadlock freedom. A CTA spins only on the CTAs with its own index on the other ranks,
 * and the grid is at most the smallest SM count of the ranks while at least one CTA fits
 * on an SM (checked at creation: ina_car_min_blocks_per_sm), so once other work leaves the
 * GPUs every CTA of every rank is resident and every barrier completes; no CTA waits for a
 * CTA of its own grid that could still be queued behind it. Kernels are programmatic
 * dependents of the previous kernel in the stream (PDL): a CTA may become resident early,
 * but it waits for that kernel's completion (griddepcontrol.wait) before anything else,
 * so it never spins on a peer while the previous kernel still needs the SMs.
 *
 * Peer data is loaded with ld.global.cg (__ldcg): coherent, from L2, never the
 * non-coherent read-only path, which may serve data written during the kernel stale. */
#define INA_LOG_SUBSYS "custom_ar"
#include "comm/custom_ar_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "comm/custom_ar_math.h"
#include "core/cuda_check.h"
#include "core/cuda_math.cuh"
#include "core/ptx.cuh"

namespace {

using Args = ina_car_kernel_args_t;
using ina_cuda::bf16_hi;
using ina_cuda::bf16_lo;
using ina_cuda::pack_bf16;

constexpr int kThreads = INA_CAR_THREADS;
constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxRanks = INA_CAR_MAX_RANKS;
constexpr int kGranule = INA_CAR_GRANULE;
constexpr int kLane = 8;                            /* values per lane: one 16-byte bf16 vector */
constexpr int kLanesPerGranule = kGranule / kLane;  /* 16: a half-warp */
constexpr int kHalfWarps = kThreads / kLanesPerGranule;
constexpr int kUnroll = 2;                          /* vectors in flight per thread and rank */

constexpr int kOneShot = INA_CAR_ALGO_ONE_SHOT;
constexpr int kLL = INA_CAR_ALGO_LL;
constexpr int kTwoShot = INA_CAR_ALGO_TWO_SHOT;
constexpr int kBf16 = INA_CAR_MODE_BF16;
constexpr int kF32 = INA_CAR_MODE_F32;
constexpr int kFp8 = INA_CAR_MODE_FP8;

template <int kMode>
__host__ __device__ constexpr int elem_bytes() { return kMode == kF32 ? 4 : 2; }
template <int kMode>
__host__ __device__ constexpr int vec_elems() { return 16 / elem_bytes<kMode>(); }

/* ---- memory-model primitives ------------------------------------------------------------- */

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Records the timed-out wait in the mapped host record and ends the kernel with an error
 * (the context becomes unusable, which the host reports). Several CTAs may trip at once;
 * the record then holds one of them. */
__device__ __noinline__ void watchdog_trip(const Args &a, int kind, int peer, uint64_t epoch,
                                           uint64_t seen) {
  ina_car_watchdog_t *w = a.watchdog;
  if (w) {
    w->rank = a.rank;
    w->block = (int32_t)blockIdx.x;
    w->peer = peer;
    w->kind = kind;
    w->epoch = epoch;
    w->seen = seen;
    __threadfence_system();
    w->tripped = 1u;
    __threadfence_system();
  }
  __trap();
}

__device__ __forceinline__ void wait_flag(const Args &a, const uint64_t *flag, uint64_t epoch,
                                          int kind, int peer) {
  uint64_t seen = ld_acquire_sys(flag);
  if (seen >= epoch) return;
  const uint64_t start = global_timer_ns();
  for (uint32_t spin = 1;; spin++) {
    seen = ld_acquire_sys(flag);
    if (seen >= epoch) return;
    if (a.timeout_ns != 0 && (spin & 1023u) == 0 && global_timer_ns() - start > a.timeout_ns)
      watchdog_trip(a, kind, peer, epoch, seen);
  }
}

__device__ __forceinline__ uint64_t *flag_at(const Args &a, int owner, int kind, int src) {
  return reinterpret_cast<uint64_t *>(a.base[owner] +
                                      ina_car_flag_offset(&a.layout, kind, blockIdx.x, src));
}

/* The barrier of CTA blockIdx.x with the CTAs of the same index on every rank (see the top
 * of this file). Every thread of the CTA must call it. */
__device__ __forceinline__ void barrier(const Args &a, int kind, uint64_t epoch) {
  __syncthreads();
  if ((int)threadIdx.x < a.plan.nranks) {
    const int peer = threadIdx.x;
    st_release_sys(flag_at(a, peer, kind, a.rank), epoch);
    wait_flag(a, flag_at(a, a.rank, kind, peer), epoch, kind, peer);
  }
  __syncthreads();
}

/* ---- LL lines ------------------------------------------------------------------------------ */

/* The flag of epoch e: never 0, the value of a consumed line. */
__device__ __forceinline__ uint32_t ll_flag(uint64_t epoch) {
  return (uint32_t)(epoch % 0xFFFFFFFFull) + 1u;
}

__device__ __forceinline__ void ll_store(uint8_t *line, uint32_t w0, uint32_t w1, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(w0), "r"(flag),
               "r"(w1), "r"(flag)
               : "memory");
}

__device__ __forceinline__ uint4 ll_load(const uint8_t *line) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(line)
               : "memory");
  return v;
}

/* Waits until `line` (ours, written by `peer`) carries `flag`, zeroes it, and returns its
 * two data words. */
__device__ __forceinline__ uint2 ll_take(const Args &a, uint8_t *line, uint32_t flag, int peer) {
  uint4 v = ll_load(line);
  if (v.y != flag || v.w != flag) {
    const uint64_t start = global_timer_ns();
    for (uint32_t spin = 1;; spin++) {
      v = ll_load(line);
      if (v.y == flag && v.w == flag) break;
      if (a.timeout_ns != 0 && (spin & 1023u) == 0 && global_timer_ns() - start > a.timeout_ns)
        watchdog_trip(a, INA_CAR_WAIT_LL, peer, flag, v.y);
    }
  }
  ll_store(line, 0u, 0u, 0u);
  return make_uint2(v.x, v.z);
}

/* ---- local input and output (any element alignment) -------------------------------------- */

/* 16 bytes of `in` from element e (a multiple of the vector width); elements at or past
 * count read as zero, so padded units quantize and sum as zeros. */
template <int kMode>
__device__ __forceinline__ uint4 load_in(const Args &a, int64_t e) {
  constexpr int kBytes = elem_bytes<kMode>();
  constexpr int kV = vec_elems<kMode>();
  const int64_t count = a.plan.count;
  if (a.in_aligned && e + kV <= count)
    return __ldcg(reinterpret_cast<const uint4 *>(static_cast<const uint8_t *>(a.in) + e * kBytes));
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  if (kBytes == 4) {
    const uint32_t *p = static_cast<const uint32_t *>(a.in);
#pragma unroll
    for (int i = 0; i < 4; i++)
      if (e + i < count) w[i] = p[e + i];
  } else {
    const uint16_t *p = static_cast<const uint16_t *>(a.in);
#pragma unroll
    for (int i = 0; i < 8; i++)
      if (e + i < count) w[i / 2] |= (uint32_t)p[e + i] << (16 * (i % 2));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Stores the part of 16 bytes from element e that lies below count. */
template <int kMode>
__device__ __forceinline__ void store_out(const Args &a, int64_t e, uint4 v) {
  constexpr int kBytes = elem_bytes<kMode>();
  constexpr int kV = vec_elems<kMode>();
  const int64_t count = a.plan.count;
  if (a.out_aligned && e + kV <= count) {
    *reinterpret_cast<uint4 *>(static_cast<uint8_t *>(a.out) + e * kBytes) = v;
    return;
  }
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if (kBytes == 4) {
    uint32_t *p = static_cast<uint32_t *>(a.out);
#pragma unroll
    for (int i = 0; i < 4; i++)
      if (e + i < count) p[e + i] = w[i];
  } else {
    uint16_t *p = static_cast<uint16_t *>(a.out);
#pragma unroll
    for (int i = 0; i < 8; i++)
      if (e + i < count) p[e + i] = (uint16_t)(w[i / 2] >> (16 * (i % 2)));
  }
}

/* ---- vector arithmetic ------------------------------------------------------------------- */

__device__ __forceinline__ void unpack_bf16x8(uint4 v, float x[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    x[2 * i] = bf16_lo(w[i]);
    x[2 * i + 1] = bf16_hi(w[i]);
  }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float x[8]) {
  return make_uint4(pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]), pack_bf16(x[4], x[5]),
                    pack_bf16(x[6], x[7]));
}

/* Element-wise sum of one vector per rank, in rank order (custom_ar_math.h). */
template <int kMode>
__device__ __forceinline__ uint4 sum_ranks(const uint4 *x, int n) {
  if constexpr (kMode == kF32) {
    float acc[4] = {__uint_as_float(x[0].x), __uint_as_float(x[0].y), __uint_as_float(x[0].z),
                    __uint_as_float(x[0].w)};
#pragma unroll
    for (int r = 1; r < kMaxRanks; r++) {
      if (r < n) {
        acc[0] = ina_car_add(acc[0], __uint_as_float(x[r].x));
        acc[1] = ina_car_add(acc[1], __uint_as_float(x[r].y));
        acc[2] = ina_car_add(acc[2], __uint_as_float(x[r].z));
        acc[3] = ina_car_add(acc[3], __uint_as_float(x[r].w));
      }
    }
    return make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]), __float_as_uint(acc[2]),
                      __float_as_uint(acc[3]));
  } else {
    float acc[8], v[8];
    unpack_bf16x8(x[0], acc);
#pragma unroll
    for (int r = 1; r < kMaxRanks; r++) {
      if (r < n) {
        unpack_bf16x8(x[r], v);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = ina_car_add(acc[i], v[i]);
      }
    }
    return pack_bf16x8(acc);
  }
}

/* One vector at element e of `region` from every rank. */
template <int kMode>
__device__ __forceinline__ void load_ranks(const Args &a, uint64_t region, int64_t e, uint4 *x) {
  constexpr int kBytes = elem_bytes<kMode>();
#pragma unroll
  for (int r = 0; r < kMaxRanks; r++) {
    x[r] = make_uint4(0u, 0u, 0u, 0u);
    if (r < a.plan.nranks)
      x[r] = __ldcg(reinterpret_cast<const uint4 *>(a.base[r] + region + e * kBytes));
  }
}

/* Max over the 16 lanes of a half-warp; every lane of the warp must call it. */
__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int offset = kLanesPerGranule / 2; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

__device__ __forceinline__ float amax8(const float x[8]) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; i++) m = fmaxf(m, fabsf(x[i]));
  return m;
}

/* Eight e4m3 bytes of x / scale_inv, element i in byte i. */
__device__ __forceinline__ uint2 quantize8(const float x[8], float scale_inv) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; i++)
    w[i / 4] |= (uint32_t)ina_car_quantize(x[i], scale_inv) << (8 * (i % 4));
  return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ void dequantize8(uint2 q, float scale_inv, float x[8]) {
  const uint32_t w[2] = {q.x, q.y};
#pragma unroll
  for (int i = 0; i < 8; i++)
    x[i] = ina_car_fp8_value((uint8_t)(w[i / 4] >> (8 * (i % 4))), scale_inv);
}

/* Sum over the CTA in a fixed order (each warp's butterfly, then the warps'); every thread
 * gets the result. Starts with a barrier, so `scratch` (32 floats) can be reused. */
__device__ __forceinline__ float block_sum(float v, float *scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = ina_cuda::warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kWarps ? scratch[lane] : 0.0f;
  return ina_cuda::warp_sum(v);
}

/* ---- bf16 / f32 phases ------------------------------------------------------------------- */

/* in[e0, e1) -> our region at the same offsets. e0 is a multiple of the vector width. */
template <int kMode>
__device__ void copy_in(const Args &a, uint64_t region, int64_t e0, int64_t e1) {
  constexpr int kBytes = elem_bytes<kMode>();
  constexpr int kV = vec_elems<kMode>();
  uint8_t *dst = a.base[a.rank] + region;
  for (int64_t e = e0 + (int64_t)threadIdx.x * kV; e < e1; e += (int64_t)kThreads * kV)
    *reinterpret_cast<uint4 *>(dst + e * kBytes) = load_in<kMode>(a, e);
}

/* Sums elements [e0, e1) of `region` over the ranks; the sum goes to our reduced region
 * and/or to out. */
template <int kMode>
__device__ void reduce_range(const Args &a, uint64_t region, int64_t e0, int64_t e1,
                             bool to_reduced, bool to_out) {
  constexpr int kBytes = elem_bytes<kMode>();
  constexpr int kV = vec_elems<kMode>();
  constexpr int64_t kStride = (int64_t)kThreads * kV;
  uint8_t *reduced = a.base[a.rank] + a.layout.reduced;
  for (int64_t e = e0 + (int64_t)threadIdx.x * kV; e < e1; e += kStride * kUnroll) {
    uint4 x[kUnroll][kMaxRanks];
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
      if (e + u * kStride < e1) load_ranks<kMode>(a, region, e + u * kStride, x[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int64_t eu = e + u * kStride;
      if (eu >= e1) break;
      const uint4 s = sum_ranks<kMode>(x[u], a.plan.nranks);
      if (to_reduced) *reinterpret_cast<uint4 *>(reduced + eu * kBytes) = s;
      if (to_out) store_out<kMode>(a, eu, s);
    }
  }
}

/* Elements [e0, e1) of rank `owner`'s reduced region -> out. */
template <int kMode>
__device__ void gather_range(const Args &a, int owner, int64_t e0, int64_t e1) {
  constexpr int kBytes = elem_bytes<kMode>();
  constexpr int kV = vec_elems<kMode>();
  constexpr int kDepth = 4;
  constexpr int64_t kStride = (int64_t)kThreads * kV;
  const uint8_t *src = a.base[owner] + a.layout.reduced;
  for (int64_t e = e0 + (int64_t)threadIdx.x * kV; e < e1; e += kStride * kDepth) {
    uint4 x[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; u++)
      if (e + u * kStride < e1)
        x[u] = __ldcg(reinterpret_cast<const uint4 *>(src + (e + u * kStride) * kBytes));
#pragma unroll
    for (int u = 0; u < kDepth; u++)
      if (e + u * kStride < e1) store_out<kMode>(a, e + u * kStride, x[u]);
  }
}

/* ---- FP8 phases (half-warp per 128-value granule) ---------------------------------------- */

/* Half-warp h of the CTA takes granules g0 + h, g0 + h + 32, ...; the two halves of a warp
 * step together from g0 + 2 * warp (the loop bound is the same for the whole warp), so the
 * half-warp shuffles always see every lane. A half-warp whose granule is past g1 shuffles
 * zeros and stores nothing. */
__device__ __forceinline__ int64_t first_granule_pair(int64_t g0) {
  return g0 + 2 * (int64_t)(threadIdx.x / kWarp);
}
__device__ __forceinline__ int half_of_warp() { return (threadIdx.x / kLanesPerGranule) % 2; }

/* Where a stripe's granules live in an fp8_recv slot: values at e - first element, scales
 * after fp8_slot_elems values. */
struct Fp8Slot {
  uint8_t *values;
  float *scales;
  int64_t first_granule;
  __device__ uint8_t *value_at(int64_t e) const {
    return values + (e - first_granule * kGranule);
  }
  __device__ float *scale_at(int64_t g) const { return scales + (g - first_granule); }
};

__device__ __forceinline__ Fp8Slot fp8_slot(const Args &a, int owner, int src,
                                            int64_t first_granule) {
  uint8_t *values = a.base[owner] + ina_car_fp8_recv_slot(&a.layout, src);
  return Fp8Slot{values, reinterpret_cast<float *>(values + a.layout.fp8_slot_elems),
                 first_granule};
}

/* Granule pairs in flight per half-warp in the FP8 loops: enough loads outstanding to
 * keep HBM and NVLink busy with one CTA per SM. */
constexpr int kFp8Unroll = 2;

/* Granules [g0, g1) of `in` (in stripe `stripe`, which starts at granule s0) -> e4m3 values
 * and scales in rank `stripe`'s fp8_recv slot for us: remote writes, except our own
 * stripe. */
__device__ void fp8_push_share(const Args &a, int stripe, int64_t s0, int64_t g0, int64_t g1) {
  const int lane = threadIdx.x % kLanesPerGranule;
  const Fp8Slot dst = fp8_slot(a, stripe, a.rank, s0);
  for (int64_t pair = first_granule_pair(g0); pair < g1; pair += kHalfWarps * kFp8Unroll) {
    float x[kFp8Unroll][8];
#pragma unroll
    for (int u = 0; u < kFp8Unroll; u++) {
      const int64_t g = pair + u * kHalfWarps + half_of_warp();
#pragma unroll
      for (int i = 0; i < 8; i++) x[u][i] = 0.0f;
      if (g < g1) unpack_bf16x8(load_in<kBf16>(a, g * kGranule + lane * kLane), x[u]);
    }
#pragma unroll
    for (int u = 0; u < kFp8Unroll; u++) {
      const int64_t g = pair + u * kHalfWarps + half_of_warp();
      const float scale_inv = ina_fp8_rule_scale_inv(half_warp_max(amax8(x[u])));
      if (g < g1) {
        *reinterpret_cast<uint2 *>(dst.value_at(g * kGranule + lane * kLane)) =
            quantize8(x[u], scale_inv);
        if (lane == 0) *dst.scale_at(g) = scale_inv;
      }
    }
  }
}

/* Our stripe's granules [g0, g1) (the stripe starts at granule s0): dequantize every rank's
 * share from our slots, sum in rank order, re-quantize into every rank's reduced region;
 * with to_out also the bf16 result. */
__device__ void fp8_reduce_stripe(const Args &a, int64_t s0, int64_t g0, int64_t g1,
                                  bool to_out) {
  const int lane = threadIdx.x % kLanesPerGranule;
  const uint64_t scales_at = ina_car_fp8_scales_offset(&a.layout);
  for (int64_t pair = first_granule_pair(g0); pair < g1; pair += kHalfWarps * kFp8Unroll) {
    uint2 q[kFp8Unroll][kMaxRanks];
    float s[kFp8Unroll][kMaxRanks];
#pragma unroll
    for (int u = 0; u < kFp8Unroll; u++) {
      const int64_t g = pair + u * kHalfWarps + half_of_warp();
      const int64_t e = g * kGranule + lane * kLane;
#pragma unroll
      for (int r = 0; r < kMaxRanks; r++) {
        q[u][r] = make_uint2(0u, 0u);
        s[u][r] = 0.0f;
        if (g < g1 && r < a.plan.nranks) {
          const Fp8Slot src = fp8_slot(a, a.rank, r, s0);
          q[u][r] = __ldcg(reinterpret_cast<const uint2 *>(src.value_at(e)));
          s[u][r] = __ldcg(src.scale_at(g));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kFp8Unroll; u++) {
      const int64_t g = pair + u * kHalfWarps + half_of_warp();
      const int64_t e = g * kGranule + lane * kLane;
      float acc[8];
      dequantize8(q[u][0], s[u][0], acc);
#pragma unroll
      for (int r = 1; r < kMaxRanks; r++) {
        if (r < a.plan.nranks) {
          float v[8];
          dequantize8(q[u][r], s[u][r], v);
#pragma unroll
          for (int i = 0; i < 8; i++) acc[i] = ina_car_add(acc[i], v[i]);
        }
      }
      const float scale_inv = ina_fp8_rule_scale_inv(half_warp_max(amax8(acc)));
      if (g >= g1) continue;
      const uint2 out_q = quantize8(acc, scale_inv);
#pragma unroll
      for (int r = 0; r < kMaxRanks; r++) {
        if (r < a.plan.nranks) {
          uint8_t *reduced = a.base[r] + a.layout.reduced;
          *reinterpret_cast<uint2 *>(reduced + e) = out_q;
          if (lane == 0) reinterpret_cast<float *>(reduced + scales_at)[g] = scale_inv;
        }
      }
      if (to_out) {
        float v[8];
        dequantize8(out_q, scale_inv, v);
        store_out<kBf16>(a, e, pack_bf16x8(v));
      }
    }
  }
}

/* Granules [g0, g1) of our reduced region -> bf16 out. */
__device__ void fp8_gather(const Args &a, int64_t g0, int64_t g1) {
  constexpr int kDepth = 4;
  const uint8_t *values = a.base[a.rank] + a.layout.reduced;
  const float *scales =
      reinterpret_cast<const float *>(values + ina_car_fp8_scales_offset(&a.layout));
  const int64_t k1 = g1 * kLanesPerGranule;
  for (int64_t k = g0 * kLanesPerGranule + threadIdx.x; k < k1; k += kThreads * kDepth) {
    uint2 q[kDepth];
    float sc[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; u++) {
      const int64_t e = (k + u * kThreads) * kLane;
      if (k + u * kThreads < k1) {
        q[u] = __ldcg(reinterpret_cast<const uint2 *>(values + e));
        sc[u] = __ldcg(scales + e / kGranule);
      }
    }
#pragma unroll
    for (int u = 0; u < kDepth; u++) {
      if (k + u * kThreads < k1) {
        float v[8];
        dequantize8(q[u], sc[u], v);
        store_out<kBf16>(a, (k + u * kThreads) * kLane, pack_bf16x8(v));
      }
    }
  }
}

/* ---- LL phases ------------------------------------------------------------------------------ */

/* The line of our slot from `src` that carries the 8 payload bytes at element e (the next
 * line carries the next 8). */
template <int kMode>
__device__ __forceinline__ uint8_t *ll_lines(const Args &a, int owner, int parity, int src,
                                             int64_t e) {
  const int64_t line = e * elem_bytes<kMode>() / INA_CAR_LL_PAYLOAD_BYTES;
  return a.base[owner] + ina_car_ll_slot(&a.layout, parity, src) + line * INA_CAR_LL_LINE_BYTES;
}

/* 8 bytes of `in` from element e (a multiple of the line's elements); elements at or past
 * count read as zero. */
template <int kMode>
__device__ __forceinline__ uint2 load_in8(const Args &a, int64_t e) {
  constexpr int kBytes = elem_bytes<kMode>();
  constexpr int kH = INA_CAR_LL_PAYLOAD_BYTES / kBytes;
  const int64_t count = a.plan.count;
  if (a.in_aligned && e + kH <= count)
    return __ldcg(reinterpret_cast<const uint2 *>(static_cast<const uint8_t *>(a.in) + e * kBytes));
  uint32_t w[2] = {0u, 0u};
  if (kBytes == 4) {
    const uint32_t *p = static_cast<const uint32_t *>(a.in);
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (e + i < count) w[i] = p[e + i];
  } else {
    const uint16_t *p = static_cast<const uint16_t *>(a.in);
#pragma unroll
    for (int i = 0; i < 4; i++)
      if (e + i < count) w[i / 2] |= (uint32_t)p[e + i] << (16 * (i % 2));
  }
  return make_uint2(w[0], w[1]);
}

/* Stores the part of 8 bytes from element e that lies below count. */
template <int kMode>
__device__ __forceinline__ void store_out8(const Args &a, int64_t e, uint2 v) {
  constexpr int kBytes = elem_bytes<kMode>();
  constexpr int kH = INA_CAR_LL_PAYLOAD_BYTES / kBytes;
  const int64_t count = a.plan.count;
  if (a.out_aligned && e + kH <= count) {
    *reinterpret_cast<uint2 *>(static_cast<uint8_t *>(a.out) + e * kBytes) = v;
    return;
  }
  const uint32_t w[2] = {v.x, v.y};
  if (kBytes == 4) {
    uint32_t *p = static_cast<uint32_t *>(a.out);
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (e + i < count) p[e + i] = w[i];
  } else {
    uint16_t *p = static_cast<uint16_t *>(a.out);
#pragma unroll
    for (int i = 0; i < 4; i++)
      if (e + i < count) p[e + i] = (uint16_t)(w[i / 2] >> (16 * (i % 2)));
  }
}

/* in[e0, e1) -> every peer's lines from us, one line per thread and turn: the more
 * threads store and later poll at once, the sooner a range of lines has crossed. */
template <int kMode>
__device__ void ll_push(const Args &a, int parity, uint32_t flag, int64_t e0, int64_t e1) {
  constexpr int kH = INA_CAR_LL_PAYLOAD_BYTES / elem_bytes<kMode>();
  for (int64_t e = e0 + (int64_t)threadIdx.x * kH; e < e1; e += (int64_t)kThreads * kH) {
    const uint2 v = load_in8<kMode>(a, e);
#pragma unroll
    for (int r = 0; r < kMaxRanks; r++)
      if (r < a.plan.nranks && r != a.rank)
        ll_store(ll_lines<kMode>(a, r, parity, a.rank, e), v.x, v.y, flag);
  }
}

/* The sum over the ranks of the 16 bytes at element e: ours from `in`, the peers' from our
 * lines (consumed). */
template <int kMode>
__device__ __forceinline__ uint4 ll_sum(const Args &a, int parity, uint32_t flag, int64_t e) {
  uint4 x[kMaxRanks];
#pragma unroll
  for (int r = 0; r < kMaxRanks; r++) {
    x[r] = make_uint4(0u, 0u, 0u, 0u);
    if (r == a.rank) {
      x[r] = load_in<kMode>(a, e);
    } else if (r < a.plan.nranks) {
      uint8_t *line = ll_lines<kMode>(a, a.rank, parity, r, e);
      const uint2 lo = ll_take(a, line, flag, r);
      const uint2 hi = ll_take(a, line + INA_CAR_LL_LINE_BYTES, flag, r);
      x[r] = make_uint4(lo.x, lo.y, hi.x, hi.y);
    }
  }
  return sum_ranks<kMode>(x, a.plan.nranks);
}

/* out[e0, e1): a line per thread and turn, as pushed. The 8 bytes are summed as the low
 * half of a vector whose high half is zero. */
template <int kMode>
__device__ void ll_reduce(const Args &a, int parity, uint32_t flag, int64_t e0, int64_t e1) {
  constexpr int kH = INA_CAR_LL_PAYLOAD_BYTES / elem_bytes<kMode>();
  for (int64_t e = e0 + (int64_t)threadIdx.x * kH; e < e1; e += (int64_t)kThreads * kH) {
    uint4 x[kMaxRanks];
#pragma unroll
    for (int r = 0; r < kMaxRanks; r++) {
      uint2 v = make_uint2(0u, 0u);
      if (r == a.rank) v = load_in8<kMode>(a, e);
      else if (r < a.plan.nranks) v = ll_take(a, ll_lines<kMode>(a, a.rank, parity, r, e), flag, r);
      x[r] = make_uint4(v.x, v.y, 0u, 0u);
    }
    const uint4 s = sum_ranks<kMode>(x, a.plan.nranks);
    store_out8<kMode>(a, e, make_uint2(s.x, s.y));
  }
}

/* ---- fused epilogue ---------------------------------------------------------------------- */

/* Sources of the all-reduced bf16 row values: load(e) returns elements [e, e + 8). */
struct OneShotRows { /* sum over the ranks' staged copies */
  const Args *a;
  uint64_t stage;
  __device__ uint4 load(int64_t e) const {
    uint4 x[kMaxRanks];
    load_ranks<kBf16>(*a, stage, e, x);
    return sum_ranks<kBf16>(x, a->plan.nranks);
  }
};
struct Bf16Rows { /* a reduced bf16 region, or out itself after an NCCL all-reduce */
  const uint16_t *p;
  __device__ uint4 load(int64_t e) const { return __ldcg(reinterpret_cast<const uint4 *>(p + e)); }
};
struct LLRows { /* our input plus the peers' LL lines */
  const Args *a;
  int parity;
  uint32_t flag;
  __device__ uint4 load(int64_t e) const { return ll_sum<kBf16>(*a, parity, flag, e); }
};
struct Fp8Rows { /* a reduced FP8 region */
  const uint8_t *values;
  const float *scales;
  __device__ uint4 load(int64_t e) const {
    float v[8];
    dequantize8(__ldcg(reinterpret_cast<const uint2 *>(values + e)), __ldcg(scales + e / kGranule),
                v);
    return pack_bf16x8(v);
  }
};

__device__ __forceinline__ void load_weight8(const Args &a, int64_t c, float w[8]) {
  if (a.weight_f32) {
    const float4 *p = reinterpret_cast<const float4 *>(static_cast<const float *>(a.weight) + c);
    const float4 lo = __ldg(p), hi = __ldg(p + 1);
    w[0] = lo.x; w[1] = lo.y; w[2] = lo.z; w[3] = lo.w;
    w[4] = hi.x; w[5] = hi.y; w[6] = hi.z; w[7] = hi.w;
  } else {
    unpack_bf16x8(
        __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(a.weight) + c)), w);
  }
}

/* The 1 x 128 FP8 quantization of a lane's 8 output values (columns [c, c + 8) of `row`);
 * a half-warp covers one block. Every lane of the warp must call it; lanes past the row
 * carry zeros. */
__device__ __forceinline__ void store_y_fp8(const Args &a, int64_t row, int64_t c, uint4 y) {
  float x[8];
  unpack_bf16x8(y, x);
  const float scale_inv = ina_fp8_rule_scale_inv(half_warp_max(amax8(x)));
  if (c >= a.cols) return;
  *reinterpret_cast<uint2 *>(a.y_fp8 + row * a.cols + c) = quantize8(x, scale_inv);
  if (c % kGranule == 0)
    a.y_scale_inv[row * ((a.cols + kGranule - 1) / kGranule) + c / kGranule] = scale_inv;
}

/* One row: residual add, RMSNorm, outputs. Thread t owns the 8-value lanes t, t + 512, ...
 * of the row (kIters of them), so a half-warp's lanes are one 128-column block. Every
 * thread of the CTA must call it. */
template <int kIters, class Rows>
__device__ void epilogue_row(const Args &a, int64_t row, const Rows &rows, float *scratch) {
  const int64_t cols = a.cols, first = row * cols;
  uint4 v[kIters];
  float sum_squares = 0.0f;
#pragma unroll
  for (int it = 0; it < kIters; it++) {
    const int64_t c = ((int64_t)it * kThreads + threadIdx.x) * kLane;
    v[it] = make_uint4(0u, 0u, 0u, 0u);
    if (c < cols) v[it] = rows.load(first + c);
  }
#pragma unroll
  for (int it = 0; it < kIters; it++) {
    const int64_t c = ((int64_t)it * kThreads + threadIdx.x) * kLane;
    float x[8];
    unpack_bf16x8(v[it], x);
    if (c < cols && a.residual) {
      uint4 *rp = reinterpret_cast<uint4 *>(a.residual + first + c);
      float r[8];
      unpack_bf16x8(*rp, r);
#pragma unroll
      for (int i = 0; i < 8; i++) x[i] = __fadd_rn(r[i], x[i]);
      v[it] = pack_bf16x8(x);
      *rp = v[it];
      unpack_bf16x8(v[it], x);
    }
#pragma unroll
    for (int i = 0; i < 8; i++) sum_squares = __fmaf_rn(x[i], x[i], sum_squares);
  }
  sum_squares = block_sum(sum_squares, scratch);
  const float mean = __fdiv_rn(sum_squares, (float)cols);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, a.eps)));
#pragma unroll
  for (int it = 0; it < kIters; it++) {
    const int64_t c = ((int64_t)it * kThreads + threadIdx.x) * kLane;
    uint4 y = make_uint4(0u, 0u, 0u, 0u);
    if (c < cols) {
      float x[8], w[8];
      unpack_bf16x8(v[it], x);
      load_weight8(a, c, w);
#pragma unroll
      for (int i = 0; i < 8; i++) x[i] = __fmul_rn(w[i], __fmul_rn(x[i], inv));
      y = pack_bf16x8(x);
      *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(a.out) + first + c) = y;
    }
    if (a.y_fp8) store_y_fp8(a, row, c, y);
  }
}

template <int kIters, class Rows>
__device__ void epilogue_rows(const Args &a, int64_t u0, int64_t u1, const Rows &rows,
                              float *scratch) {
  for (int64_t row = u0; row < u1; row++) epilogue_row<kIters>(a, row, rows, scratch);
}

/* ---- the algorithms ---------------------------------------------------------------------- */

template <int kMode, int kIters>
__device__ void one_shot(const Args &a, uint64_t epoch, float *scratch) {
  const uint64_t stage = a.layout.stage[epoch & 1u];
  const int64_t ue = a.plan.unit_elems;
  int64_t u0 = 0, u1 = 0;
  ina_car_block_units(&a.plan, 0, blockIdx.x, &u0, &u1);
  copy_in<kMode>(a, stage, u0 * ue, u1 * ue);
  barrier(a, INA_CAR_FLAG_READY, epoch);
  if constexpr (kIters == 0) {
    reduce_range<kMode>(a, stage, u0 * ue, u1 * ue, false, true);
  } else {
    const OneShotRows rows = {&a, stage};
    epilogue_rows<kIters>(a, u0, u1, rows, scratch);
  }
}

template <int kMode, int kIters>
__device__ void two_shot(const Args &a, uint64_t epoch, float *scratch) {
  const int64_t ue = a.plan.unit_elems;
  const int n = a.plan.nranks, me = a.rank;
  int64_t u0 = 0, u1 = 0;
  if (!a.zero_copy) {
    for (int s = 0; s < n; s++) {
      ina_car_block_units(&a.plan, s, blockIdx.x, &u0, &u1);
      copy_in<kMode>(a, a.layout.input, u0 * ue, u1 * ue);
    }
  }
  barrier(a, INA_CAR_FLAG_READY, epoch);
  ina_car_block_units(&a.plan, me, blockIdx.x, &u0, &u1);
  reduce_range<kMode>(a, a.layout.input, u0 * ue, u1 * ue, true, kIters == 0);
  barrier(a, INA_CAR_FLAG_MID, epoch);
  for (int s = 0; s < n; s++) {
    ina_car_block_units(&a.plan, s, blockIdx.x, &u0, &u1);
    if constexpr (kIters == 0) {
      if (s != me) gather_range<kMode>(a, s, u0 * ue, u1 * ue);
    } else {
      const Bf16Rows rows = {reinterpret_cast<const uint16_t *>(a.base[s] + a.layout.reduced)};
      epilogue_rows<kIters>(a, u0, u1, rows, scratch);
    }
  }
}

template <int kIters>
__device__ void fp8_two_shot(const Args &a, uint64_t epoch, float *scratch) {
  const int64_t per_unit = a.plan.unit_elems / kGranule;
  const int n = a.plan.nranks, me = a.rank;
  int64_t u0 = 0, u1 = 0, s0 = 0, s1 = 0;
  for (int s = 0; s < n; s++) {
    ina_car_block_units(&a.plan, s, blockIdx.x, &u0, &u1);
    ina_car_stripe_units(&a.plan, s, &s0, &s1);
    fp8_push_share(a, s, s0 * per_unit, u0 * per_unit, u1 * per_unit);
  }
  barrier(a, INA_CAR_FLAG_READY, epoch);
  ina_car_block_units(&a.plan, me, blockIdx.x, &u0, &u1);
  ina_car_stripe_units(&a.plan, me, &s0, &s1);
  fp8_reduce_stripe(a, s0 * per_unit, u0 * per_unit, u1 * per_unit, kIters == 0);
  barrier(a, INA_CAR_FLAG_MID, epoch);
  const uint8_t *values = a.base[me] + a.layout.reduced;
  const float *scales =
      reinterpret_cast<const float *>(values + ina_car_fp8_scales_offset(&a.layout));
  const Fp8Rows rows = {values, scales};
  for (int s = 0; s < n; s++) {
    ina_car_block_units(&a.plan, s, blockIdx.x, &u0, &u1);
    if constexpr (kIters == 0) {
      if (s != me) fp8_gather(a, u0 * per_unit, u1 * per_unit);
    } else {
      epilogue_rows<kIters>(a, u0, u1, rows, scratch);
    }
  }
}

template <int kMode, int kIters>
__device__ void ll_one_shot(const Args &a, uint64_t epoch, float *scratch) {
  const int64_t ue = a.plan.unit_elems;
  const int parity = (int)(epoch & 1u);
  const uint32_t flag = ll_flag(epoch);
  int64_t u0 = 0, u1 = 0;
  ina_car_block_units(&a.plan, 0, blockIdx.x, &u0, &u1);
  if (kIters == 0 || a.in_place) {
    ll_push<kMode>(a, parity, flag, u0 * ue, u1 * ue);
    /* The epilogue maps elements to threads differently: with out == in, no thread may
     * write out before every thread has pushed its input. */
    __syncthreads();
  } else {
    /* Few rows leave most CTAs without a row; lines carry their own flags, so any CTA may
     * push them: spread the push over the grid. Not in place, where another CTA could
     * overwrite `in` with its normalized rows before this one has pushed it. */
    constexpr int kV = vec_elems<kMode>();
    int64_t v0 = 0, v1 = 0;
    ina_car_split(a.plan.units * ue / kV, a.plan.blocks, blockIdx.x, &v0, &v1);
    ll_push<kMode>(a, parity, flag, v0 * kV, v1 * kV);
  }
  if constexpr (kIters == 0) {
    ll_reduce<kMode>(a, parity, flag, u0 * ue, u1 * ue);
  } else {
    const LLRows rows = {&a, parity, flag};
    epilogue_rows<kIters>(a, u0, u1, rows, scratch);
  }
}

template <int kAlgo, int kMode, int kIters>
__global__ void __launch_bounds__(kThreads, 1) all_reduce_kernel(const __grid_constant__ Args a) {
  __shared__ float scratch[kWarp];
  /* Launched as a programmatic dependent: the launch overlaps the previous kernel, and
   * nothing (input, epochs, buffers) is touched before that kernel has completed. The
   * next kernel may launch at once: it waits the same way for this one. */
  ina_ptx::griddep_wait();
  ina_ptx::griddep_launch_dependents();
  uint64_t *epoch_slot =
      reinterpret_cast<uint64_t *>(a.base[a.rank] + ina_car_epoch_offset(&a.layout, blockIdx.x));
  const uint64_t epoch = *epoch_slot + 1;
  if constexpr (kMode == kFp8) fp8_two_shot<kIters>(a, epoch, scratch);
  else if constexpr (kAlgo == kLL) ll_one_shot<kMode, kIters>(a, epoch, scratch);
  else if constexpr (kAlgo == kOneShot) one_shot<kMode, kIters>(a, epoch, scratch);
  else two_shot<kMode, kIters>(a, epoch, scratch);
  __syncthreads(); /* every thread has read the epoch */
  if (threadIdx.x == 0) *epoch_slot = epoch;
}

/* The epilogue over rows of out after an NCCL all-reduce (in place). */
template <int kIters>
__global__ void __launch_bounds__(kThreads, 1) epilogue_kernel(const __grid_constant__ Args a,
                                                                int64_t rows) {
  __shared__ float scratch[kWarp];
  const Bf16Rows src = {static_cast<const uint16_t *>(a.out)};
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x)
    epilogue_row<kIters>(a, row, src, scratch);
}

/* Register-resident lanes per thread for a row of `cols` values: 1, 2 or 4. */
int epilogue_iters(int64_t cols) {
  const int64_t lanes = (cols + kLane - 1) / kLane;
  return lanes <= kThreads ? 1 : lanes <= 2 * kThreads ? 2 : 4;
}

using Kernel = void (*)(Args);

template <int kAlgo, int kMode>
Kernel pick(int iters) {
  if constexpr (kMode == kF32) {
    return all_reduce_kernel<kAlgo, kMode, 0>;
  } else {
    switch (iters) {
      case 0: return all_reduce_kernel<kAlgo, kMode, 0>;
      case 1: return all_reduce_kernel<kAlgo, kMode, 1>;
      case 2: return all_reduce_kernel<kAlgo, kMode, 2>;
      default: return all_reduce_kernel<kAlgo, kMode, 4>;
    }
  }
}

Kernel pick_kernel(int algo, int mode, int iters) {
  if (mode == kFp8) return pick<kTwoShot, kFp8>(iters);
  if (algo == kLL) return mode == kF32 ? pick<kLL, kF32>(0) : pick<kLL, kBf16>(iters);
  if (algo == kOneShot)
    return mode == kF32 ? pick<kOneShot, kF32>(0) : pick<kOneShot, kBf16>(iters);
  return mode == kF32 ? pick<kTwoShot, kF32>(0) : pick<kTwoShot, kBf16>(iters);
}

using EpilogueKernel = void (*)(Args, int64_t);

EpilogueKernel pick_epilogue(int iters) {
  switch (iters) {
    case 1: return epilogue_kernel<1>;
    case 2: return epilogue_kernel<2>;
    default: return epilogue_kernel<4>;
  }
}

}  // namespace

extern "C" ina_status_t ina_car_launch(const ina_car_kernel_args_t *a, void *stream) {
  ina_status_t st = INA_OK;
  Kernel kernel = nullptr;
  INA_REQUIRE(a != NULL, INA_ERR_INVALID_ARGUMENT, "custom_ar launch: NULL args");
  INA_REQUIRE(a->plan.blocks >= 1 && a->plan.blocks <= INA_CAR_MAX_BLOCKS &&
                  a->plan.nranks >= 1 && a->plan.nranks <= INA_CAR_MAX_RANKS,
              INA_ERR_INTERNAL, "custom_ar launch: grid %d or %d ranks out of range",
              a->plan.blocks, a->plan.nranks);
  kernel = pick_kernel(a->plan.algo, a->plan.mode, a->epilogue ? epilogue_iters(a->cols) : 0);
  {
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.gridDim = dim3((unsigned)a->plan.blocks);
    config.blockDim = dim3(kThreads);
    config.stream = static_cast<cudaStream_t>(stream);
    config.attrs = attr;
    config.numAttrs = 1;
    INA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, *a));
  }
fail:
  return st;
}

extern "C" ina_status_t ina_car_launch_epilogue(const ina_car_kernel_args_t *a, int64_t rows,
                                                void *stream) {
  ina_status_t st = INA_OK;
  EpilogueKernel kernel = nullptr;
  int64_t grid = 0;
  INA_REQUIRE(a != NULL && rows >= 0, INA_ERR_INVALID_ARGUMENT,
              "custom_ar epilogue launch: bad arguments");
  if (rows == 0) return INA_OK;
  grid = rows < 65535 ? rows : 65535;
  kernel = pick_epilogue(epilogue_iters(a->cols));
  kernel<<<(unsigned)grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(*a, rows);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}

extern "C" int ina_car_min_blocks_per_sm(void) {
  const Kernel kernels[] = {
      pick_kernel(kOneShot, kBf16, 0), pick_kernel(kOneShot, kBf16, 1),
      pick_kernel(kOneShot, kBf16, 2), pick_kernel(kOneShot, kBf16, 4),
      pick_kernel(kOneShot, kF32, 0),  pick_kernel(kTwoShot, kBf16, 0),
      pick_kernel(kTwoShot, kBf16, 1), pick_kernel(kTwoShot, kBf16, 2),
      pick_kernel(kTwoShot, kBf16, 4), pick_kernel(kTwoShot, kF32, 0),
      pick_kernel(kTwoShot, kFp8, 0),  pick_kernel(kTwoShot, kFp8, 1),
      pick_kernel(kTwoShot, kFp8, 2),  pick_kernel(kTwoShot, kFp8, 4),
      pick_kernel(kLL, kBf16, 0),      pick_kernel(kLL, kBf16, 1),
      pick_kernel(kLL, kBf16, 2),      pick_kernel(kLL, kBf16, 4),
      pick_kernel(kLL, kF32, 0),
  };
  int fewest = 1 << 30;
  for (Kernel k : kernels) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, reinterpret_cast<const void *>(k),
                                                      kThreads, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    if (n < fewest) fewest = n;
  }
  return fewest;
}
