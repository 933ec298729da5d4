#define INA_LOG_SUBSYS "mla"
#include "mla/mla_append_args.h"

#include <stdint.h>

#include "core/check.h"

/* Whether a byte address or byte stride is a multiple of `align`. */
static int aligned(const void *ptr, int64_t stride1, int64_t stride2, int64_t align) {
  return (uintptr_t)ptr % (uintptr_t)align == 0 && stride1 % align == 0 && stride2 % align == 0;
}

ina_status_t ina_mla_append_check_args(const ina_mla_append_params_t *p, const char *who) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(p != NULL, INA_ERR_INVALID_ARGUMENT, "%s: params is NULL", who);
  INA_REQUIRE(p->struct_size >= sizeof(ina_mla_append_params_t) && p->version == 1,
              INA_ERR_INVALID_ARGUMENT,
              "%s: params of size %zu version %u (expected %zu, version 1; use "
              "INA_MLA_APPEND_PARAMS_INIT)",
              who, p->struct_size, p->version, sizeof(ina_mla_append_params_t));
  const ina_mla_cache_t *c = &p->cache;
  const int64_t C = c->kv_lora_rank, R = c->rope_dim;
  INA_REQUIRE(p->num_tokens >= 0, INA_ERR_INVALID_ARGUMENT, "%s: num_tokens %d is negative", who,
              p->num_tokens);
  INA_REQUIRE(c->format == INA_MLA_CACHE_F32 || c->format == INA_MLA_CACHE_BF16 ||
                  c->format == INA_MLA_CACHE_FP8,
              INA_ERR_INVALID_ARGUMENT, "%s: unknown cache format %d", who, (int)c->format);
  INA_REQUIRE(C > 0 && R >= 2 && R % 2 == 0 && c->page_size > 0, INA_ERR_INVALID_ARGUMENT,
              "%s: cache kv_lora_rank %lld, rope_dim %lld (even, >= 2), page_size %d", who,
              (long long)C, (long long)R, c->page_size);
  INA_REQUIRE(c->format != INA_MLA_CACHE_FP8 || C % 128 == 0, INA_ERR_UNSUPPORTED,
              "%s: an FP8 cache needs kv_lora_rank divisible by 128 (got %lld)", who,
              (long long)C);
  INA_REQUIRE(p->kv_stride >= C + R, INA_ERR_INVALID_ARGUMENT,
              "%s: kv_stride %lld is shorter than a row of %lld + %lld values", who,
              (long long)p->kv_stride, (long long)C, (long long)R);
  INA_REQUIRE(p->rope_layout == INA_MLA_ROPE_PAIRS || p->rope_layout == INA_MLA_ROPE_HALVES,
              INA_ERR_INVALID_ARGUMENT, "%s: unknown rope layout %d", who, (int)p->rope_layout);
  INA_REQUIRE(p->positions_dtype == INA_DTYPE_I32 || p->positions_dtype == INA_DTYPE_I64,
              INA_ERR_INVALID_ARGUMENT, "%s: positions must be i32 or i64 (got %s)", who,
              ina_dtype_name(p->positions_dtype));
  INA_REQUIRE(p->eps >= 0.0f, INA_ERR_INVALID_ARGUMENT, "%s: eps %g is negative or NaN", who,
              (double)p->eps);
  if (p->num_tokens == 0) return INA_OK;

  INA_REQUIRE(p->kv && p->norm_weight && p->inv_freq && p->positions && p->page_ids && p->slots &&
                  c->latent && c->rope && (c->format != INA_MLA_CACHE_FP8 || c->scale),
              INA_ERR_INVALID_ARGUMENT, "%s: NULL input, index or cache pointer for %d tokens",
              who, p->num_tokens);
  const int64_t elem = c->format == INA_MLA_CACHE_F32 ? 4 : 2;
  INA_REQUIRE(aligned(p->kv, 0, 0, 2) && aligned(p->norm_weight, 0, 0, 2) &&
                  aligned(p->inv_freq, 0, 0, 4) &&
                  aligned(p->positions, 0, 0, (int64_t)ina_dtype_size(p->positions_dtype)) &&
                  aligned(p->page_ids, 0, 0, 4) && aligned(p->slots, 0, 0, 4),
              INA_ERR_INVALID_ARGUMENT, "%s: an input array is not aligned to its element size",
              who);
  INA_REQUIRE(aligned(c->rope, c->rope_page_stride, c->rope_token_stride, elem) &&
                  (c->format == INA_MLA_CACHE_FP8 ||
                   aligned(c->latent, c->latent_page_stride, c->latent_token_stride, elem)) &&
                  (c->format != INA_MLA_CACHE_FP8 ||
                   aligned(c->scale, c->scale_page_stride, c->scale_token_stride, 4)),
              INA_ERR_INVALID_ARGUMENT,
              "%s: a cache part's address or stride is not aligned to its element size", who);
fail:
  return st;
}
