/* The paged latent cache of MLA: where each token's entry lives, in every format the
 * kernels and the references read.
 *
 * A token's entry has three parts: the normalized compressed kv ("latent",
 * kv_lora_rank values, also the value of absorbed attention), the rope'd key (rope_dim
 * values) and, for FP8 latents, one fp32 scale per 128 latent values. Part X of token
 * slot s of page p starts at
 *     X + p * X_page_stride + s * X_token_stride        (byte offsets)
 * so one interleaved buffer (bf16: latent 512 + rope 64 = 1152 bytes per token, rope =
 * latent + 1024) and separate buffers are described alike.
 *
 * Formats:
 *   INA_MLA_CACHE_F32:  latent f32, rope f32 (the CPU engine's cache)
 *   INA_MLA_CACHE_BF16: latent bf16, rope bf16
 *   INA_MLA_CACHE_FP8:  latent fp8 e4m3 with scale_inv per 128 values (value = fp8 x
 *                       scale), rope bf16. The packed entry is 656 bytes for 512 + 64:
 *                       [512 e4m3 | 4 f32 scales | 64 bf16 rope], see
 *                       ina_mla_cache_fp8_packed.
 * Thread safety: plain data. */
#ifndef INA_MLA_MLA_CACHE_H
#define INA_MLA_MLA_CACHE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ina_mla_cache_format {
  INA_MLA_CACHE_F32 = 0,
  INA_MLA_CACHE_BF16 = 1,
  INA_MLA_CACHE_FP8 = 2,
} ina_mla_cache_format_t;

typedef struct ina_mla_cache {
  ina_mla_cache_format_t format;
  int32_t page_size;
  int32_t kv_lora_rank; /* multiple of 128 for FP8 */
  int32_t rope_dim;
  void *latent;
  int64_t latent_page_stride, latent_token_stride; /* bytes */
  void *rope;
  int64_t rope_page_stride, rope_token_stride; /* bytes */
  void *scale; /* FP8 only: kv_lora_rank / 128 f32 per token */
  int64_t scale_page_stride, scale_token_stride; /* bytes */
} ina_mla_cache_t;

/* One interleaved buffer of [num_pages][page_size][latent | rope] in f32 or bf16. */
static inline ina_mla_cache_t ina_mla_cache_interleaved(ina_mla_cache_format_t format, void *base,
                                                        int32_t page_size, int32_t kv_lora_rank,
                                                        int32_t rope_dim) {
  const int64_t elem = format == INA_MLA_CACHE_F32 ? 4 : 2;
  const int64_t token = (int64_t)(kv_lora_rank + rope_dim) * elem;
  ina_mla_cache_t c = {format, page_size, kv_lora_rank, rope_dim,
                       base, token * page_size, token,
                       (char *)base + kv_lora_rank * elem, token * page_size, token,
                       0, 0, 0};
  return c;
}

/* Bytes of one packed FP8 entry: latent e4m3, then the scales, then the bf16 rope. */
static inline int64_t ina_mla_cache_fp8_entry_bytes(int32_t kv_lora_rank, int32_t rope_dim) {
  return kv_lora_rank + 4 * (kv_lora_rank / 128) + 2 * (int64_t)rope_dim;
}

/* One packed buffer of [num_pages][page_size][fp8 entry]. */
static inline ina_mla_cache_t ina_mla_cache_fp8_packed(void *base, int32_t page_size,
                                                       int32_t kv_lora_rank, int32_t rope_dim) {
  const int64_t token = ina_mla_cache_fp8_entry_bytes(kv_lora_rank, rope_dim);
  char *b = (char *)base;
  ina_mla_cache_t c = {INA_MLA_CACHE_FP8, page_size, kv_lora_rank, rope_dim,
                       b, token * page_size, token,
                       b + kv_lora_rank + 4 * (kv_lora_rank / 128), token * page_size, token,
                       b + kv_lora_rank, token * page_size, token};
  return c;
}

#ifdef __cplusplus
}
#endif
#endif
