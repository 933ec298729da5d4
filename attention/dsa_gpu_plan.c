/* The host plan of the GPU lightning indexer (attention/dsa_gpu.h): validates a step
 * against its bucket and writes the per-token rows (request, visible length) the score
 * and top-k kernels read. Plain C, so planning and its validation also work in builds
 * without CUDA (with device_ws NULL). */
#define INA_LOG_SUBSYS "dsa_gpu"
#include "attention/dsa_gpu.h"

#include <stddef.h>
#include <string.h>

#include "core/check.h"

static size_t schedule_bytes(int32_t tokens) {
  return sizeof(ina_dsa_gpu_ws_header_t) + sizeof(ina_dsa_gpu_token_row_t) * (size_t)tokens;
}

/* Checks of the bucket and the shape (everything but the step's lengths). */
static ina_status_t check_shape(const ina_dsa_gpu_plan_params_t *p) {
  ina_status_t st = INA_OK;
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_gpu_plan_params_t, score_stride) + sizeof(int32_t),
                        "dsa gpu plan params", "INA_DSA_GPU_PLAN_PARAMS_INIT");
  INA_REQUIRE(p->max_tokens >= 1 && p->max_kv_len >= 1, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu: bucket max_tokens %d / max_kv_len %d (each must be >= 1)", p->max_tokens,
              p->max_kv_len);
  INA_REQUIRE(p->page_size >= 1, INA_ERR_INVALID_ARGUMENT, "dsa gpu: page_size %d < 1", p->page_size);
  INA_REQUIRE(p->num_heads >= 1, INA_ERR_INVALID_ARGUMENT, "dsa gpu: num_heads %d < 1", p->num_heads);
  INA_REQUIRE(p->num_heads <= INA_DSA_GPU_MAX_HEADS, INA_ERR_UNSUPPORTED,
              "dsa gpu: num_heads %d: the score kernels take at most %d index heads",
              p->num_heads, INA_DSA_GPU_MAX_HEADS);
  INA_REQUIRE(p->head_dim >= 1, INA_ERR_INVALID_ARGUMENT, "dsa gpu: head_dim %d < 1", p->head_dim);
  INA_REQUIRE(p->head_dim <= INA_DSA_GPU_MAX_HEAD_DIM, INA_ERR_UNSUPPORTED,
              "dsa gpu: head_dim %d: the score kernels take at most %d dims", p->head_dim,
              INA_DSA_GPU_MAX_HEAD_DIM);
  INA_REQUIRE(p->topk >= 1, INA_ERR_INVALID_ARGUMENT, "dsa gpu: topk (k) %d < 1", p->topk);
  INA_REQUIRE(p->topk <= INA_DSA_GPU_MAX_TOPK, INA_ERR_UNSUPPORTED,
              "dsa gpu: topk %d: the selection sorts at most %d entries in shared memory", p->topk,
              INA_DSA_GPU_MAX_TOPK);
  INA_REQUIRE(p->score_stride == 0 || p->score_stride >= p->max_kv_len, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu: score_stride %d is shorter than the bucket's max_kv_len %d",
              p->score_stride, p->max_kv_len);
  const int64_t stride = p->score_stride ? p->score_stride : p->max_kv_len;
  INA_REQUIRE(stride <= (int64_t)INA_DSA_GPU_MAX_SCORE_STRIDE, INA_ERR_UNSUPPORTED,
              "dsa gpu: score_stride %lld exceeds the score grid's %d positions",
              (long long)stride, INA_DSA_GPU_MAX_SCORE_STRIDE);
fail:
  return st;
}

ina_status_t ina_dsa_gpu_workspace_size(const ina_dsa_gpu_plan_params_t *p, size_t *host_bytes,
                                        size_t *device_bytes) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(host_bytes && device_bytes, INA_ERR_INVALID_ARGUMENT, "dsa gpu: %s is NULL",
              !host_bytes ? "host_bytes" : "device_bytes");
  *host_bytes = *device_bytes = 0;
  INA_CHECK(check_shape(p));
  *host_bytes = *device_bytes = schedule_bytes(p->max_tokens);
fail:
  return st;
}

ina_status_t ina_dsa_gpu_plan(const ina_dsa_gpu_plan_params_t *p, void *host_ws, void *device_ws,
                              void *stream, ina_dsa_gpu_plan_info_t *info) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(info != NULL, INA_ERR_INVALID_ARGUMENT, "dsa gpu: info is NULL");
  memset(info, 0, sizeof *info);
  INA_CHECK(check_shape(p));
  INA_REQUIRE(host_ws != NULL, INA_ERR_INVALID_ARGUMENT, "dsa gpu: host_ws is NULL");
  INA_REQUIRE(p->batch >= 0, INA_ERR_INVALID_ARGUMENT, "dsa gpu: batch %d < 0", p->batch);
  INA_REQUIRE(p->qo_indptr != NULL, INA_ERR_INVALID_ARGUMENT, "dsa gpu: qo_indptr is NULL");
  INA_REQUIRE(p->batch == 0 || p->kv_len != NULL, INA_ERR_INVALID_ARGUMENT, "dsa gpu: kv_len is NULL");
  INA_REQUIRE(p->qo_indptr[0] == 0, INA_ERR_INVALID_ARGUMENT, "dsa gpu: qo_indptr[0] is %d, not 0",
              p->qo_indptr[0]);
  int32_t step_max_kv = 0;
  for (int32_t b = 0; b < p->batch; b++) {
    const int32_t lo = p->qo_indptr[b], hi = p->qo_indptr[b + 1];
    INA_REQUIRE(hi >= lo, INA_ERR_INVALID_ARGUMENT,
                "dsa gpu: qo_indptr decreases at request %d (%d -> %d)", b, lo, hi);
    INA_REQUIRE(hi <= p->max_tokens, INA_ERR_INVALID_ARGUMENT,
                "dsa gpu: request %d ends at query token %d, past the bucket's max_tokens %d", b,
                hi, p->max_tokens);
    INA_REQUIRE(p->kv_len[b] >= hi - lo, INA_ERR_INVALID_ARGUMENT,
                "dsa gpu: request %d has %d query tokens but kv_len %d", b, hi - lo, p->kv_len[b]);
    INA_REQUIRE(p->kv_len[b] <= p->max_kv_len, INA_ERR_INVALID_ARGUMENT,
                "dsa gpu: request %d has kv_len %d, past the bucket's max_kv_len %d", b,
                p->kv_len[b], p->max_kv_len);
    if (p->kv_len[b] > step_max_kv) step_max_kv = p->kv_len[b];
  }
  const int32_t tokens = p->qo_indptr[p->batch];
  ina_dsa_gpu_ws_header_t h = {INA_DSA_GPU_MAGIC, tokens, p->batch, step_max_kv};
  memcpy(host_ws, &h, sizeof h);
  ina_dsa_gpu_token_row_t *rows = (ina_dsa_gpu_token_row_t *)((char *)host_ws + sizeof h);
  for (int32_t b = 0; b < p->batch; b++) {
    const int32_t q_len = p->qo_indptr[b + 1] - p->qo_indptr[b];
    for (int32_t j = 0; j < q_len; j++) {
      rows[p->qo_indptr[b] + j].request = b;
      rows[p->qo_indptr[b] + j].visible = p->kv_len[b] - q_len + j + 1;
    }
  }
  /* Only this step's rows travel; the kernels stop at total_tokens. */
  if (device_ws) INA_CHECK(ina_dsa_gpu_copy_schedule(device_ws, host_ws, schedule_bytes(tokens), stream));
  info->magic = INA_DSA_GPU_MAGIC;
  info->batch = p->batch;
  info->total_tokens = tokens;
  info->step_max_kv_len = step_max_kv;
  info->max_tokens = p->max_tokens;
  info->max_kv_len = p->max_kv_len;
  info->page_size = p->page_size;
  info->num_heads = p->num_heads;
  info->head_dim = p->head_dim;
  info->topk = p->topk;
  info->score_stride = p->score_stride ? p->score_stride : p->max_kv_len;
  info->host_bytes = info->device_bytes = schedule_bytes(p->max_tokens);
fail:
  if (st != INA_OK && info) memset(info, 0, sizeof *info);
  return st;
}
