#define INA_LOG_SUBSYS "mla"
#include "mla/mla_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

typedef struct mla_job {
  const ina_mla_ref_params_t *p;
  int32_t *token_request; /* request of each query token */
  int32_t max_kv;
  float *scratch; /* per worker: scores [max_kv] + entry [entry] + acc [kv_lora] */
  int64_t scratch_per_worker;
} mla_job_t;

/* Token t of request b as f32: latent (kv_lora_rank values) then rope (rope_dim). */
static void read_entry(const ina_mla_ref_params_t *p, int32_t b, int32_t t, float *out) {
  const ina_mla_cache_t *c = &p->cache;
  const int64_t page = p->kv_indices[p->kv_indptr[b] + t / c->page_size], slot = t % c->page_size;
  const char *latent = (const char *)c->latent + page * c->latent_page_stride + slot * c->latent_token_stride;
  const char *rope = (const char *)c->rope + page * c->rope_page_stride + slot * c->rope_token_stride;
  const int32_t C = c->kv_lora_rank, R = c->rope_dim;
  switch (c->format) {
  case INA_MLA_CACHE_F32:
    ina_to_f32(latent, INA_DTYPE_F32, out, (size_t)C);
    ina_to_f32(rope, INA_DTYPE_F32, out + C, (size_t)R);
    break;
  case INA_MLA_CACHE_BF16:
    ina_to_f32(latent, INA_DTYPE_BF16, out, (size_t)C);
    ina_to_f32(rope, INA_DTYPE_BF16, out + C, (size_t)R);
    break;
  case INA_MLA_CACHE_FP8: {
    const float *scale = (const float *)((const char *)c->scale + page * c->scale_page_stride +
                                         slot * c->scale_token_stride);
    ina_to_f32(latent, INA_DTYPE_FP8_E4M3, out, (size_t)C);
    for (int32_t i = 0; i < C; i++) out[i] *= scale[i / 128];
    ina_to_f32(rope, INA_DTYPE_BF16, out + C, (size_t)R);
    break;
  }
  }
}

/* One (token, head) pair per item. */
static void mla_items(void *ctx, int64_t begin, int64_t end, int worker) {
  const mla_job_t *j = ctx;
  const ina_mla_ref_params_t *p = j->p;
  const int32_t C = p->kv_lora_rank, R = p->rope_dim;
  float *scores = j->scratch + worker * j->scratch_per_worker;
  float *entry = scores + j->max_kv;
  float *acc = entry + C + R;
  for (int64_t item = begin; item < end; item++) {
    const int64_t tok = item / p->num_heads;
    const int32_t h = (int32_t)(item % p->num_heads);
    const int32_t b = j->token_request[tok];
    const int32_t q_len = p->qo_indptr[b + 1] - p->qo_indptr[b];
    const int32_t visible = p->kv_len[b] - q_len + (int32_t)(tok - p->qo_indptr[b]) + 1;
    const float *qn = p->q_nope + (tok * p->num_heads + h) * C;
    const float *qp = p->q_pe + (tok * p->num_heads + h) * R;
    float *out = p->out + (tok * p->num_heads + h) * C;
    float max_score = -INFINITY;
    for (int32_t t = 0; t < visible; t++) {
      read_entry(p, b, t, entry);
      double s = 0;
      for (int32_t c = 0; c < C; c++) s += (double)qn[c] * entry[c];
      for (int32_t r = 0; r < R; r++) s += (double)qp[r] * entry[C + r];
      scores[t] = (float)(s * p->softmax_scale);
      if (scores[t] > max_score) max_score = scores[t];
    }
    double denom = 0;
    for (int32_t c = 0; c < C; c++) acc[c] = 0;
    for (int32_t t = 0; t < visible; t++) {
      const double w = exp((double)scores[t] - max_score);
      denom += w;
      read_entry(p, b, t, entry);
      for (int32_t c = 0; c < C; c++) acc[c] += (float)w * entry[c];
    }
    for (int32_t c = 0; c < C; c++) out[c] = visible > 0 ? (float)(acc[c] / denom) : 0.0f;
    if (p->lse) p->lse[tok * p->num_heads + h] = visible > 0 ? (float)(max_score + log(denom)) : -INFINITY;
  }
}

ina_status_t ina_mla_attention_ref(const ina_mla_ref_params_t *p, ina_threadpool_t *pool) {
  ina_status_t st = INA_OK;
  mla_job_t job = {p, NULL, 0, NULL, 0};
  INA_REQUIRE(p && p->batch >= 0 && p->num_heads > 0 && p->kv_lora_rank > 0 && p->rope_dim >= 0 &&
                  p->cache.page_size > 0 && p->cache.kv_lora_rank == p->kv_lora_rank &&
                  p->cache.rope_dim == p->rope_dim,
              INA_ERR_INVALID_ARGUMENT, "mla: invalid sizes or cache descriptor");
  INA_REQUIRE(p->cache.format != INA_MLA_CACHE_FP8 || p->kv_lora_rank % 128 == 0, INA_ERR_UNSUPPORTED,
              "mla: an FP8 cache needs kv_lora_rank divisible by 128 (got %d)", p->kv_lora_rank);
  const int32_t tokens = p->qo_indptr[p->batch];
  job.token_request = malloc((size_t)(tokens > 0 ? tokens : 1) * sizeof(int32_t));
  INA_CHECK_ALLOC(job.token_request);
  for (int32_t b = 0; b < p->batch; b++) {
    const int32_t q_len = p->qo_indptr[b + 1] - p->qo_indptr[b];
    INA_REQUIRE(q_len >= 0 && q_len <= p->kv_len[b], INA_ERR_INVALID_ARGUMENT,
                "mla: request %d has %d query tokens but kv length %d", b, q_len, p->kv_len[b]);
    INA_REQUIRE((int64_t)(p->kv_indptr[b + 1] - p->kv_indptr[b]) * p->cache.page_size >= p->kv_len[b],
                INA_ERR_INVALID_ARGUMENT, "mla: request %d: %d pages of %d cannot hold %d tokens", b,
                p->kv_indptr[b + 1] - p->kv_indptr[b], p->cache.page_size, p->kv_len[b]);
    for (int32_t i = p->qo_indptr[b]; i < p->qo_indptr[b + 1]; i++) job.token_request[i] = b;
    if (p->kv_len[b] > job.max_kv) job.max_kv = p->kv_len[b];
  }
  const int workers = ina_threadpool_size(pool);
  job.scratch_per_worker = job.max_kv + 2 * (int64_t)p->kv_lora_rank + p->rope_dim;
  job.scratch = malloc((size_t)workers * (size_t)job.scratch_per_worker * sizeof(float));
  INA_CHECK_ALLOC(job.scratch);
  ina_parallel_for(pool, (int64_t)tokens * p->num_heads, 1, mla_items, &job);
fail:
  free(job.scratch);
  free(job.token_request);
  return st;
}
