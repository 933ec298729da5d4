/* The plan of sparse MLA (mla/mla.h, ina_mla_sparse_plan): every query token of the step
 * becomes a request of its own for the scheduler of mla_plan.c, one query token whose
 * "KV" is the list of positions it selected. Its length is min(topk, visible): the
 * entries the kernels read. No causal limit applies inside the list (every selected
 * position is visible to the token by contract), which is what a request with q_len 1
 * gives: its one row sees the whole list. The token's real request goes into the
 * schedule's token_request array, for its page list.
 *
 * A token's work is its selected positions plus the fixed chunk cost, so the scheduler
 * balances tokens across CTAs as it balances requests, and cuts a long list (prefill
 * with a large top-k, or many heads) over several CTAs, merged by the combine pass.
 *
 * Dims. The plan takes those of the dense plan: 512 + 64 for the tensor-core kernels,
 * anything up to kv_lora_rank + rope_dim = 640 for the generic fp32 kernel. Each kernel
 * sees a sparse plan only through the schedule (requests of one query token, so the
 * causal limit of a row is the whole list and a tile's rows are that token's heads),
 * token_request (the page list) and kv_position (the list's t-th entry), and the combine
 * pass merges split tokens as it merges split requests. */
#define INA_LOG_SUBSYS "mla"
#include <string.h>

#include "core/check.h"
#include "mla/mla.h"
#include "mla/mla_schedule.h"

/* The dense bucket that the sparse one maps to: max_tokens one-token requests. */
static ina_status_t dense_bucket(const ina_mla_sparse_plan_params_t *p, ina_mla_plan_params_t *d) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(p != NULL, INA_ERR_INVALID_ARGUMENT, "mla sparse plan: params is NULL");
  INA_REQUIRE(p->struct_size == sizeof(ina_mla_sparse_plan_params_t) && p->version == 1,
              INA_ERR_INVALID_ARGUMENT,
              "mla sparse plan: params struct_size %zu / version %u do not match this build (%zu / "
              "1); initialize them with INA_MLA_SPARSE_PLAN_PARAMS_INIT",
              p->struct_size, p->version, sizeof(ina_mla_sparse_plan_params_t));
  INA_REQUIRE(p->max_tokens >= 1, INA_ERR_INVALID_ARGUMENT, "mla sparse plan: max_tokens %d < 1",
              p->max_tokens);
  INA_REQUIRE(p->topk >= 1, INA_ERR_INVALID_ARGUMENT, "mla sparse plan: topk %d < 1", p->topk);
  /* The dims are ina_mla_check_bucket's to judge: every kernel takes a sparse plan (the
   * generic one reads the selection as the fast ones do), so the sparse plan accepts
   * what the dense one does. */
  ina_mla_plan_params_t b = INA_MLA_PLAN_PARAMS_INIT;
  b.max_batch = p->max_tokens;
  b.max_q_len = 1;
  b.num_heads = p->num_heads;
  b.kv_lora_rank = p->kv_lora_rank;
  b.rope_dim = p->rope_dim;
  b.page_size = p->page_size;
  b.num_sms = p->num_sms;
  *d = b;
fail:
  return st;
}

ina_status_t ina_mla_sparse_workspace_size(const ina_mla_sparse_plan_params_t *p,
                                           size_t *host_bytes, size_t *device_bytes) {
  ina_status_t st = INA_OK;
  ina_mla_plan_params_t d;
  INA_REQUIRE(host_bytes && device_bytes, INA_ERR_INVALID_ARGUMENT,
              "mla sparse workspace size: NULL output");
  *host_bytes = 0;
  *device_bytes = 0;
  INA_CHECK(dense_bucket(p, &d));
  INA_CHECK(ina_mla_workspace_size(&d, host_bytes, device_bytes));
fail:
  return st;
}

ina_status_t ina_mla_sparse_plan(const ina_mla_sparse_plan_params_t *p, void *host_ws,
                                 void *device_ws, void *stream, ina_mla_plan_info_t *info) {
  ina_status_t st = INA_OK;
  int32_t num_sms = 0, tokens = 0;
  ina_mla_plan_params_t d;
  ina_mla_sched_layout_t l;
  INA_REQUIRE(info != NULL && host_ws != NULL, INA_ERR_INVALID_ARGUMENT,
              "mla sparse plan: %s is NULL", info ? "host_ws" : "info");
  memset(info, 0, sizeof *info);
  INA_CHECK(dense_bucket(p, &d));
  INA_CHECK(ina_mla_check_bucket(&d, &num_sms));
  INA_REQUIRE(p->batch >= 0, INA_ERR_INVALID_ARGUMENT, "mla sparse plan: batch %d < 0", p->batch);
  if (p->batch > 0) {
    INA_REQUIRE(p->qo_indptr && p->kv_len, INA_ERR_INVALID_ARGUMENT,
                "mla sparse plan: qo_indptr or kv_len is NULL with batch %d", p->batch);
    INA_REQUIRE(p->qo_indptr[0] == 0, INA_ERR_INVALID_ARGUMENT,
                "mla sparse plan: qo_indptr[0] = %d, not 0", p->qo_indptr[0]);
    for (int32_t b = 0; b < p->batch; b++) {
      const int64_t q_len = (int64_t)p->qo_indptr[b + 1] - p->qo_indptr[b];
      INA_REQUIRE(q_len >= 0, INA_ERR_INVALID_ARGUMENT,
                  "mla sparse plan: qo_indptr decreases at request %d (%d -> %d)", b,
                  p->qo_indptr[b], p->qo_indptr[b + 1]);
      INA_REQUIRE(p->kv_len[b] >= q_len, INA_ERR_INVALID_ARGUMENT,
                  "mla sparse plan: request %d has q_len %lld > kv_len %d (the queries are the "
                  "last kv_len tokens)", b, (long long)q_len, p->kv_len[b]);
    }
    tokens = p->qo_indptr[p->batch];
    INA_REQUIRE(tokens <= p->max_tokens, INA_ERR_INVALID_ARGUMENT,
                "mla sparse plan: %d query tokens exceed the bucket's max_tokens %d", tokens,
                p->max_tokens);
  }
  INA_CHECK(ina_mla_sched_layout(d.max_batch, 1, d.num_heads, d.kv_lora_rank, d.rope_dim,
                                 num_sms * INA_MLA_CTAS_PER_SM, &l));
  {
    char *ws = host_ws;
    ina_mla_sched_request_t *requests = (ina_mla_sched_request_t *)(ws + l.requests);
    int32_t *token_request = (int32_t *)(ws + l.token_request);
    const int32_t tiles = ina_mla_tiles(1, p->num_heads);
    for (int32_t b = 0; b < p->batch; b++) {
      const int32_t q_begin = p->qo_indptr[b], q_len = p->qo_indptr[b + 1] - q_begin;
      for (int32_t j = 0; j < q_len; j++) {
        const int32_t s = q_begin + j, visible = p->kv_len[b] - q_len + j + 1;
        const ina_mla_sched_request_t r = {s, 1, visible < p->topk ? visible : p->topk, tiles};
        requests[s] = r;
        token_request[s] = b;
      }
    }
  }
  INA_CHECK(ina_mla_schedule_requests(&l, p->num_heads, tokens, tokens, host_ws, device_ws, stream,
                                      info));
  info->batch = tokens;
  info->max_batch = d.max_batch;
  info->max_q_len = 1;
  info->num_heads = p->num_heads;
  info->kv_lora_rank = p->kv_lora_rank;
  info->rope_dim = p->rope_dim;
  info->page_size = p->page_size;
  info->path = p->kv_lora_rank == 512 && p->rope_dim == 64 ? INA_MLA_PATH_FAST : INA_MLA_PATH_GENERIC;
  info->sparse_topk = p->topk;
fail:
  if (st != INA_OK && info) memset(info, 0, sizeof *info);
  return st;
}
