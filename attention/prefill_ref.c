#define INA_LOG_SUBSYS "attention"
#include "attention/prefill_ref.h"

#include <math.h>
#include <stdlib.h>

#include "core/check.h"

typedef struct prefill_job {
  const ina_prefill_ref_params_t *p;
  float *scratch; /* per worker: scores [kv_len] + acc [v_dim] */
} prefill_job_t;

static void prefill_items(void *ctx, int64_t begin, int64_t end, int worker) {
  const prefill_job_t *j = ctx;
  const ina_prefill_ref_params_t *p = j->p;
  const int32_t H = p->num_heads, D = p->qk_dim, V = p->v_dim;
  float *scores = j->scratch + (size_t)worker * (size_t)(p->kv_len + V);
  float *acc = scores + p->kv_len;
  for (int64_t item = begin; item < end; item++) {
    const int32_t i = (int32_t)(item / H), h = (int32_t)(item % H);
    const int32_t visible = p->kv_len - p->q_len + i + 1;
    const float *q = p->q + ((int64_t)i * H + h) * D;
    float max_score = -INFINITY;
    for (int32_t t = 0; t < visible; t++) {
      const float *k = p->k + ((int64_t)t * H + h) * D;
      double s = 0;
      for (int32_t d = 0; d < D; d++) s += (double)q[d] * k[d];
      scores[t] = (float)(s * p->scale);
      if (scores[t] > max_score) max_score = scores[t];
    }
    double denom = 0;
    for (int32_t d = 0; d < V; d++) acc[d] = 0;
    for (int32_t t = 0; t < visible; t++) {
      const double w = exp((double)scores[t] - max_score);
      const float *v = p->v + ((int64_t)t * H + h) * V;
      denom += w;
      for (int32_t d = 0; d < V; d++) acc[d] += (float)w * v[d];
    }
    float *out = p->out + ((int64_t)i * H + h) * V;
    for (int32_t d = 0; d < V; d++) out[d] = visible > 0 ? (float)(acc[d] / denom) : 0.0f;
    if (p->lse) p->lse[(int64_t)i * H + h] = visible > 0 ? (float)(max_score + log(denom)) : -INFINITY;
  }
}

ina_status_t ina_attention_prefill_ref(const ina_prefill_ref_params_t *p, ina_threadpool_t *pool) {
  ina_status_t st = INA_OK;
  prefill_job_t job = {p, NULL};
  INA_REQUIRE(p && p->q_len >= 0 && p->q_len <= p->kv_len && p->num_heads > 0 && p->qk_dim > 0 &&
                  p->v_dim > 0,
              INA_ERR_INVALID_ARGUMENT, "prefill attention: invalid sizes (q_len %d, kv_len %d)",
              p ? p->q_len : -1, p ? p->kv_len : -1);
  const int workers = ina_threadpool_size(pool);
  job.scratch = malloc((size_t)workers * (size_t)(p->kv_len + p->v_dim) * sizeof(float));
  INA_CHECK_ALLOC(job.scratch);
  ina_parallel_for(pool, (int64_t)p->q_len * p->num_heads, 1, prefill_items, &job);
fail:
  free(job.scratch);
  return st;
}
