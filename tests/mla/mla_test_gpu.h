/* Device side of the MLA GPU tests: a case's inputs on the GPU, a plan and a run, the
 * outputs back on the host. Header-only (static inline), over core/cuda.h. */
#ifndef INA_TESTS_MLA_MLA_TEST_GPU_H
#define INA_TESTS_MLA_MLA_TEST_GPU_H

#include "core/cuda.h"
#include "core/log.h"
#include "tests/mla/mla_test_case.h"

#define MLA_OUT_POISON 0xFFFFu /* bf16 NaN */

typedef struct mla_dev {
  void *buf[2], *q_nope, *q_pe, *out, *lse, *kv_indptr, *kv_indices, *ws;
  void *host_ws;
  size_t host_ws_bytes, device_ws_bytes;
  ina_mla_cache_t cache; /* device pointers */
} mla_dev_t;

static inline void mla_dev_free(mla_dev_t *d) {
  for (int i = 0; i < 2; i++) ina_cuda_free(d->buf[i]);
  ina_cuda_free(d->q_nope);
  ina_cuda_free(d->q_pe);
  ina_cuda_free(d->out);
  ina_cuda_free(d->lse);
  ina_cuda_free(d->kv_indptr);
  ina_cuda_free(d->kv_indices);
  ina_cuda_free(d->ws);
  free(d->host_ws);
  memset(d, 0, sizeof *d);
}

/* Host pointer p inside case buffer i -> the same offset in device buffer i. */
static inline void *mla_rebase(const mla_case_t *c, const mla_dev_t *d, const void *p) {
  if (!p) return NULL;
  for (int i = 0; i < 2; i++)
    if (c->buf[i] && (const uint8_t *)p >= c->buf[i] && (const uint8_t *)p < c->buf[i] + c->buf_bytes[i])
      return (uint8_t *)d->buf[i] + ((const uint8_t *)p - c->buf[i]);
  return NULL;
}

static inline ina_mla_plan_params_t mla_plan_params(const mla_case_t *c, int32_t num_sms) {
  ina_mla_plan_params_t p = INA_MLA_PLAN_PARAMS_INIT;
  p.batch = c->s.batch;
  p.max_batch = c->s.max_batch;
  p.max_q_len = c->s.max_q_len;
  p.qo_indptr = c->qo_indptr;
  p.kv_len = c->kv_len;
  p.num_heads = c->s.num_heads;
  p.kv_lora_rank = c->s.kv_lora_rank;
  p.rope_dim = c->s.rope_dim;
  p.page_size = c->s.page_size;
  p.num_sms = num_sms;
  return p;
}

static inline ina_mla_run_params_t mla_run_params(const mla_case_t *c, const mla_dev_t *d) {
  ina_mla_run_params_t r = INA_MLA_RUN_PARAMS_INIT;
  r.q_nope = d->q_nope;
  r.q_nope_token_stride = c->q_nope_ts;
  r.q_nope_head_stride = c->q_nope_hs;
  r.q_pe = d->q_pe;
  r.q_pe_token_stride = c->q_pe_ts;
  r.q_pe_head_stride = c->q_pe_hs;
  r.cache = d->cache;
  r.kv_indptr = d->kv_indptr;
  r.kv_indices = d->kv_indices;
  r.softmax_scale = c->s.softmax_scale;
  r.out = d->out;
  r.out_token_stride = c->out_ts;
  r.out_head_stride = c->out_hs;
  r.lse = d->lse;
  return r;
}

/* Allocates device buffers sized for `c` (or for `cap`, a larger case of the same bucket,
 * when not NULL) and the workspaces of the bucket. Returns INA_OK or the failing status. */
static inline ina_status_t mla_dev_alloc(mla_dev_t *d, const mla_case_t *cap, int32_t num_sms) {
  ina_status_t st = INA_OK;
  memset(d, 0, sizeof *d);
  ina_mla_plan_params_t pp = mla_plan_params(cap, num_sms);
  const int32_t H = cap->s.num_heads;
  const size_t tokens = (size_t)(cap->tokens > 0 ? cap->tokens : 1);
  for (int i = 0; i < 2; i++)
    if (cap->buf[i] && (st = ina_cuda_malloc(0, cap->buf_bytes[i], &d->buf[i])) != INA_OK) return st;
  if ((st = ina_cuda_malloc(0, 2 * (size_t)cap->q_nope_elems, &d->q_nope)) != INA_OK) return st;
  if ((st = ina_cuda_malloc(0, 2 * (size_t)cap->q_pe_elems, &d->q_pe)) != INA_OK) return st;
  if ((st = ina_cuda_malloc(0, 2 * (size_t)cap->out_elems, &d->out)) != INA_OK) return st;
  if ((st = ina_cuda_malloc(0, 4 * tokens * (size_t)H, &d->lse)) != INA_OK) return st;
  if ((st = ina_cuda_malloc(0, 4 * (size_t)(cap->s.max_batch + 1), &d->kv_indptr)) != INA_OK) return st;
  if ((st = ina_cuda_malloc(0, 4 * (size_t)(cap->num_pages + 1), &d->kv_indices)) != INA_OK) return st;
  if ((st = ina_mla_workspace_size(&pp, &d->host_ws_bytes, &d->device_ws_bytes)) != INA_OK) return st;
  d->host_ws = malloc(d->host_ws_bytes);
  if (!d->host_ws) return INA_ERR_OUT_OF_MEMORY;
  return ina_cuda_malloc(0, d->device_ws_bytes, &d->ws);
}

/* Copies c's inputs into d's buffers (which may be larger) and poisons the outputs. */
static inline ina_status_t mla_dev_upload(mla_dev_t *d, const mla_case_t *c) {
  ina_status_t st = INA_OK;
  const size_t tokens = (size_t)(c->tokens > 0 ? c->tokens : 1);
  for (int i = 0; i < 2; i++)
    if (c->buf[i] && (st = ina_cuda_memcpy_h2d(d->buf[i], c->buf[i], c->buf_bytes[i])) != INA_OK) return st;
  d->cache = c->cache;
  d->cache.latent = mla_rebase(c, d, c->cache.latent);
  d->cache.rope = mla_rebase(c, d, c->cache.rope);
  d->cache.scale = mla_rebase(c, d, c->cache.scale);
  if ((st = ina_cuda_memcpy_h2d(d->q_nope, c->q_nope, 2 * (size_t)c->q_nope_elems)) != INA_OK) return st;
  if ((st = ina_cuda_memcpy_h2d(d->q_pe, c->q_pe, 2 * (size_t)c->q_pe_elems)) != INA_OK) return st;
  if ((st = ina_cuda_memcpy_h2d(d->kv_indptr, c->kv_indptr, 4 * (size_t)(c->s.batch + 1))) != INA_OK) return st;
  if ((st = ina_cuda_memcpy_h2d(d->kv_indices, c->kv_indices, 4 * (size_t)(c->kv_indptr[c->s.batch] + 1))) != INA_OK)
    return st;
  uint16_t *out = malloc(2 * (size_t)c->out_elems);
  float *lse = malloc(4 * tokens * (size_t)c->s.num_heads);
  if (!out || !lse) {
    free(out);
    free(lse);
    return INA_ERR_OUT_OF_MEMORY;
  }
  for (int64_t i = 0; i < c->out_elems; i++) out[i] = MLA_OUT_POISON;
  test_poison_f32(lse, tokens * (size_t)c->s.num_heads);
  st = ina_cuda_memcpy_h2d(d->out, out, 2 * (size_t)c->out_elems);
  if (st == INA_OK) st = ina_cuda_memcpy_h2d(d->lse, lse, 4 * tokens * (size_t)c->s.num_heads);
  free(out);
  free(lse);
  /* A copy from pageable memory may still be in flight when cudaMemcpy returns; kernels
   * on other streams must not overtake it. */
  return st == INA_OK ? ina_cuda_synchronize() : st;
}

/* Elements of out outside [tokens, heads, kv_lora_rank] (stride padding) that a run
 * overwrote: must be 0. */
static inline int64_t mla_stray_writes(const mla_case_t *c, const uint16_t *out) {
  int64_t stray = 0;
  for (int64_t i = 0; i < c->out_elems; i++) {
    const int64_t t = i / c->out_ts, rem = i % c->out_ts, h = rem / c->out_hs, d = rem % c->out_hs;
    const int inside = t < c->tokens && h < c->s.num_heads && d < c->s.kv_lora_rank;
    if (!inside && out[i] != MLA_OUT_POISON) stray++;
  }
  return stray;
}

#endif
