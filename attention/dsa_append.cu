/* The index-key append of attention/dsa_gpu.h: each row of k into its (page, slot) of the
 * paged index-key cache, as bf16 or quantized to FP8, one warp per row.
 *
 * The FP8 arithmetic is the host rule's (ina_dsa_index_key_quantize_fp8, i.e. core's
 * ina_fp8_quantize_blocks with the whole key as one block), operation for operation, so
 * the bytes are the reference's:
 *   - amax is a maximum of exact values (bf16 widened to f32), so the order in which the
 *     warp combines them does not matter; it is taken on the magnitude bits (for finite
 *     non-negative floats the integer order is the value order), which no denormal flush
 *     can touch;
 *   - the scale is core/fp8_quant_rule.h's ina_fp8_rule_scale_inv (amax / 448 as an IEEE
 *     division, 1 for an all-zero key, 2^-149 when the quotient underflows to zero);
 *   - each byte is cvt.rn.satfinite.e4m3 of the IEEE quotient value / scale (__fdiv_rn), as
 *     ina_f32_to_fp8_e4m3(x, 1) rounds and saturates (mla/mla_append.cu does the same).
 * The key is read twice (the amax, then the bytes), the second time from L1; a row is a
 * few hundred bytes, so the kernel is bound by launch latency at any batch an append
 * sees. Lane l handles values l, l + 32, ...: loads and stores coalesce across the warp. */
#define INA_LOG_SUBSYS "dsa_gpu"
#include <cuda_fp8.h>
#include <stdint.h>

#include "attention/dsa_gpu.h"
#include "core/cuda_check.h"
#include "core/fp8_quant_rule.h"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerCta = 4;
constexpr int kThreads = kWarpsPerCta * kWarpSize;

struct AppendArgs {
  int32_t num_tokens, head_dim, page_size;
  const uint16_t *k;
  int64_t k_stride;
  const int32_t *page_ids, *slots;
  char *keys;
  int64_t page_stride, token_stride, scale_offset, scale_stride;
};

template <bool kFp8>
__global__ void __launch_bounds__(kThreads) dsa_append_kernel(const AppendArgs a) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t token = (int64_t)blockIdx.x * kWarpsPerCta + threadIdx.x / kWarpSize;
  if (token >= a.num_tokens) return; /* whole warps leave together */
  const int64_t page = a.page_ids[token], slot = a.slots[token];
  if (page < 0 || slot < 0 || slot >= a.page_size) return;
  const uint16_t *x = a.k + token * a.k_stride;
  char *page_bytes = a.keys + page * a.page_stride;
  char *dst = page_bytes + slot * a.token_stride;
  if (!kFp8) {
    uint16_t *out = reinterpret_cast<uint16_t *>(dst);
    for (int d = lane; d < a.head_dim; d += kWarpSize) out[d] = __ldg(&x[d]);
    return;
  }
  /* |value| of a widened bf16 is its bits without the sign, shifted up. */
  uint32_t amax_bits = 0;
  for (int d = lane; d < a.head_dim; d += kWarpSize)
    amax_bits = max(amax_bits, ((uint32_t)__ldg(&x[d]) << 16) & 0x7FFFFFFFu);
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1)
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, offset));
  const float scale = ina_fp8_rule_scale_inv(__uint_as_float(amax_bits));
  uint8_t *out = reinterpret_cast<uint8_t *>(dst);
  for (int d = lane; d < a.head_dim; d += kWarpSize) {
    const float v = __uint_as_float((uint32_t)__ldg(&x[d]) << 16);
    out[d] = (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
  }
  if (lane < 4) { /* the scale, little-endian, one byte a lane: any alignment */
    uint8_t *s = reinterpret_cast<uint8_t *>(page_bytes + a.scale_offset + slot * a.scale_stride);
    s[lane] = (uint8_t)(__float_as_uint(scale) >> (8 * lane));
  }
}

bool aligned2(int64_t x) { return x % 2 == 0; }

}  // namespace

extern "C" ina_status_t ina_dsa_gpu_append(const ina_dsa_gpu_append_params_t *p, void *stream) {
  ina_status_t st = INA_OK;
  AppendArgs a = {};
  unsigned grid = 0;
  bool fp8 = false;
  int64_t key_bytes = 0;
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_gpu_append_params_t, cache) + sizeof(ina_dsa_index_cache_t),
                        "dsa gpu append params", "INA_DSA_GPU_APPEND_PARAMS_INIT");
  INA_REQUIRE(p->num_tokens >= 0, INA_ERR_INVALID_ARGUMENT, "dsa gpu append: num_tokens %d < 0",
              p->num_tokens);
  INA_REQUIRE(p->cache.format != INA_DSA_KEY_F32, INA_ERR_UNSUPPORTED,
              "dsa gpu append: f32 index keys have no GPU kernel (bf16 or FP8)");
  INA_REQUIRE(p->cache.format == INA_DSA_KEY_BF16 || p->cache.format == INA_DSA_KEY_FP8,
              INA_ERR_INVALID_ARGUMENT, "dsa gpu append: cache.format %d is not a key format",
              (int)p->cache.format);
  fp8 = p->cache.format == INA_DSA_KEY_FP8;
  INA_REQUIRE(p->cache.page_size >= 1, INA_ERR_INVALID_ARGUMENT, "dsa gpu append: cache.page_size %d < 1",
              p->cache.page_size);
  INA_REQUIRE(p->cache.head_dim >= 1, INA_ERR_INVALID_ARGUMENT, "dsa gpu append: cache.head_dim %d < 1",
              p->cache.head_dim);
  INA_REQUIRE(p->k_stride == 0 || p->k_stride >= p->cache.head_dim, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu append: k_stride %lld is shorter than head_dim %d", (long long)p->k_stride,
              p->cache.head_dim);
  key_bytes = fp8 ? (int64_t)p->cache.head_dim : 2 * (int64_t)p->cache.head_dim;
  INA_REQUIRE(p->cache.token_stride >= key_bytes, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu append: cache.token_stride %lld is shorter than a key (%lld bytes)",
              (long long)p->cache.token_stride, (long long)key_bytes);
  INA_REQUIRE(p->cache.page_stride >= 1, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu append: cache.page_stride %lld < 1", (long long)p->cache.page_stride);
  INA_REQUIRE(!fp8 || p->cache.scale_stride >= 4, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu append: an FP8 cache needs scale_stride >= 4, not %lld (describe it with "
              "ina_dsa_index_cache_fp8_inline or _fp8_paged, not _dense)",
              (long long)p->cache.scale_stride);
  INA_REQUIRE(fp8 || (aligned2((int64_t)(uintptr_t)p->cache.keys) && aligned2(p->cache.page_stride) &&
                      aligned2(p->cache.token_stride)),
              INA_ERR_UNSUPPORTED,
              "dsa gpu append: bf16 key rows must be 2-byte aligned (cache.keys %% 2 = %lld, "
              "page_stride %lld, token_stride %lld)", (long long)((uintptr_t)p->cache.keys % 2),
              (long long)p->cache.page_stride, (long long)p->cache.token_stride);
  INA_REQUIRE(aligned2((int64_t)(uintptr_t)p->k), INA_ERR_UNSUPPORTED,
              "dsa gpu append: k must be 2-byte aligned");
  if (p->num_tokens == 0) return INA_OK;
  INA_REQUIRE(p->k && p->page_ids && p->slots && p->cache.keys, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu append: %s is NULL", !p->k ? "k" : !p->page_ids ? "page_ids" : !p->slots ? "slots"
                                                                                          : "cache.keys");

  a.num_tokens = p->num_tokens;
  a.head_dim = p->cache.head_dim;
  a.page_size = p->cache.page_size;
  a.k = p->k;
  a.k_stride = p->k_stride ? p->k_stride : p->cache.head_dim;
  a.page_ids = p->page_ids;
  a.slots = p->slots;
  a.keys = static_cast<char *>(const_cast<void *>(p->cache.keys));
  a.page_stride = p->cache.page_stride;
  a.token_stride = p->cache.token_stride;
  a.scale_offset = p->cache.scale_offset;
  a.scale_stride = p->cache.scale_stride;
  grid = (unsigned)((p->num_tokens + kWarpsPerCta - 1) / kWarpsPerCta);
  if (fp8)
    dsa_append_kernel<true><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  else
    dsa_append_kernel<false><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
