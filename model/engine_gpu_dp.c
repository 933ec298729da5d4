/* Attention data parallelism in the CUDA engine (ina_engine_options_t.attention_dp 2):
 * every rank of the expert-parallel group gets the same batch, computes attention and
 * the dense layers for the sequences of its stripe of the page pool (a stripe per rank,
 * ina_kv_seq_stripe: the same on every rank, as the pools are replicas), and meets the
 * others at each MoE layer, whose rows are gathered from every rank (engine_gpu.c,
 * moe_block). Here the host side: which sequences are ours, the shape every rank pads its
 * step to (collectives need the same counts everywhere, and a decode graph the same
 * bucket), and the logits rows of every rank back in batch order.
 *
 * Every rank sees the whole batch, so every rank computes every rank's counts itself:
 * nothing is exchanged on the host. Host C over the CUDA runtime. */
#define INA_LOG_SUBSYS "model"
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/check.h"
#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops.h"
#include "model/engine_gpu_internal.h"

ina_status_t gpu_dp_init(ina_engine_gpu_t *e) {
  ina_status_t st = INA_OK;
  gpu_dp_t *d = &e->dp;
  d->rank_tokens = calloc((size_t)e->dp_size, sizeof *d->rank_tokens);
  d->rank_seqs = calloc((size_t)e->dp_size, sizeof *d->rank_seqs);
  d->rank_rows = calloc((size_t)e->dp_size, sizeof *d->rank_rows);
  INA_CHECK_ALLOC(d->rank_tokens);
  INA_CHECK_ALLOC(d->rank_seqs);
  INA_CHECK_ALLOC(d->rank_rows);
fail:
  return st;
}

void gpu_dp_free(ina_engine_gpu_t *e) {
  gpu_dp_t *d = &e->dp;
  free(d->seqs);
  free(d->qo_indptr);
  free(d->owner);
  free(d->first_row);
  free(d->tokens);
  free(d->rank_tokens);
  free(d->rank_seqs);
  free(d->rank_rows);
  cudaFree(d->logits_all);
  cudaFree(d->logits_ordered);
  cudaFreeHost(d->order_host);
  cudaFree(d->order_dev);
  free(d->tokens_host);
  memset(d, 0, sizeof *d);
}

static ina_status_t grow(void **p, size_t bytes) {
  ina_status_t st = INA_OK;
  void *q = realloc(*p, bytes);
  INA_CHECK_ALLOC(q);
  *p = q;
fail:
  return st;
}

static ina_status_t reserve(gpu_dp_t *d, int32_t batch, int64_t tokens) {
  ina_status_t st = INA_OK;
  if (batch > d->batch_cap) {
    const size_t n = (size_t)batch + 1;
    INA_CHECK(grow((void **)&d->seqs, n * sizeof *d->seqs));
    INA_CHECK(grow((void **)&d->qo_indptr, n * sizeof *d->qo_indptr));
    INA_CHECK(grow((void **)&d->owner, n * sizeof *d->owner));
    INA_CHECK(grow((void **)&d->first_row, n * sizeof *d->first_row));
    d->batch_cap = batch;
  }
  if (tokens > d->token_cap) {
    INA_CHECK(grow((void **)&d->tokens, ((size_t)tokens + 1) * sizeof *d->tokens));
    d->token_cap = tokens;
  }
fail:
  return st;
}

static int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

ina_status_t gpu_dp_split(ina_engine_gpu_t *e, const ina_batch_t *b, int graphed, step_shape_t *sh) {
  ina_status_t st = INA_OK;
  gpu_dp_t *d = &e->dp;
  const int32_t n = e->dp_size, me = e->dp_rank;
  INA_CHECK(reserve(d, b->batch, b->qo_indptr[b->batch]));
  memset(d->rank_tokens, 0, (size_t)n * sizeof *d->rank_tokens);
  memset(d->rank_seqs, 0, (size_t)n * sizeof *d->rank_seqs);
  memset(d->rank_rows, 0, (size_t)n * sizeof *d->rank_rows);
  int32_t count = 0;
  d->qo_indptr[0] = 0;
  for (int32_t i = 0; i < b->batch; i++) {
    const int32_t len = b->qo_indptr[i + 1] - b->qo_indptr[i], r = ina_kv_seq_stripe(e->kv, b->seqs[i]);
    d->owner[i] = r;
    d->first_row[i] = d->rank_rows[r];
    d->rank_rows[r] += b->all_logits ? len : 1;
    d->rank_tokens[r] += len;
    d->rank_seqs[r]++;
    if (r != me) continue;
    d->seqs[count] = b->seqs[i];
    memcpy(d->tokens + d->qo_indptr[count], b->tokens + b->qo_indptr[i], (size_t)len * sizeof *d->tokens);
    d->qo_indptr[count + 1] = d->qo_indptr[count] + len;
    count++;
  }
  int64_t max_tokens = 0, max_seqs = 1;
  for (int32_t r = 0; r < n; r++) {
    if (d->rank_tokens[r] > max_tokens) max_tokens = d->rank_tokens[r];
    if (d->rank_seqs[r] > max_seqs) max_seqs = d->rank_seqs[r];
  }
  const ina_batch_t mine = {count, d->seqs, d->qo_indptr, d->tokens, b->all_logits};
  sh->mine = mine;
  sh->graphed = graphed;
  if (graphed) {
    /* Every rank replays the graph of the largest rank's bucket. */
    sh->rows = pow2_at_least(max_seqs);
    sh->seqs = (int32_t)sh->rows;
    sh->out_rows = sh->rows;
  } else {
    sh->rows = max_tokens;
    sh->seqs = (int32_t)max_seqs;
    sh->out_rows = b->all_logits ? sh->rows : max_seqs;
  }
fail:
  return st;
}

/* Room for every rank's out_rows logits rows, gathered and ordered. The device is idle
 * (between steps). */
static ina_status_t reserve_logits(ina_engine_gpu_t *e, int64_t out_rows) {
  ina_status_t st = INA_OK;
  gpu_dp_t *d = &e->dp;
  if (out_rows <= d->logits_rows) return INA_OK;
  int64_t rows = d->logits_rows > 0 ? d->logits_rows : 16;
  while (rows < out_rows) rows *= 2;
  cudaFree(d->logits_all);
  cudaFree(d->logits_ordered);
  cudaFreeHost(d->order_host);
  cudaFree(d->order_dev);
  d->logits_all = d->logits_ordered = NULL;
  d->order_host = d->order_dev = NULL;
  d->logits_rows = 0;
  const size_t all_rows = (size_t)e->dp_size * (size_t)rows;
  const size_t bytes = all_rows * (size_t)e->cfg->vocab_size * sizeof(float);
  INA_CUDA_CHECK(cudaMalloc((void **)&d->logits_all, bytes));
  INA_CUDA_CHECK(cudaMalloc((void **)&d->logits_ordered, bytes));
  INA_CUDA_CHECK(cudaHostAlloc((void **)&d->order_host, all_rows * sizeof(int32_t), cudaHostAllocDefault));
  INA_CUDA_CHECK(cudaMalloc((void **)&d->order_dev, all_rows * sizeof(int32_t)));
  d->logits_rows = rows;
fail:
  return st;
}

ina_status_t gpu_dp_order_logits(ina_engine_gpu_t *e, const ina_batch_t *b, const step_shape_t *sh,
                                 const float **out) {
  ina_status_t st = INA_OK;
  gpu_dp_t *d = &e->dp;
  const int64_t V = e->cfg->vocab_size;
  INA_CHECK(reserve_logits(e, sh->out_rows));
  INA_CHECK(gpu_split_mark(&e->split, SPLIT_EP_COMM, e->stream));
  INA_CHECK(ina_comm_all_gather(e->ep_comm, e->s.logits, d->logits_all, (size_t)(sh->out_rows * V), INA_DTYPE_F32,
                                e->stream));
  INA_CHECK(gpu_split_mark(&e->split, SPLIT_OTHER, e->stream));
  /* Batch order: each row's place in the gather (rank r's block starts at r * out_rows),
   * then one row gather on the device, which copies the f32 rows as pairs of bf16
   * values, bit for bit. */
  int64_t total = 0;
  for (int32_t i = 0; i < b->batch; i++) {
    const int64_t rows = b->all_logits ? b->qo_indptr[i + 1] - b->qo_indptr[i] : 1;
    const int64_t src = (int64_t)d->owner[i] * sh->out_rows + d->first_row[i];
    for (int64_t j = 0; j < rows; j++) d->order_host[total++] = (int32_t)(src + j);
  }
  INA_CUDA_CHECK(cudaMemcpyAsync(d->order_dev, d->order_host, (size_t)total * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 e->stream));
  INA_CHECK(ina_gpu_embedding(d->order_dev, total, d->logits_all, INA_DTYPE_BF16, e->dp_size * sh->out_rows, 2 * V,
                              (uint16_t *)d->logits_ordered, NULL, e->stream));
  *out = d->logits_ordered;
fail:
  return st;
}

ina_status_t gpu_dp_greedy_tokens(ina_engine_gpu_t *e, const step_shape_t *sh) {
  ina_status_t st = INA_OK;
  gpu_dp_t *d = &e->dp;
  const int64_t V = e->cfg->vocab_size, all = (int64_t)e->dp_size * sh->out_rows;
  if (all > d->tokens_cap) {
    int32_t *grown = realloc(d->tokens_host, (size_t)all * sizeof *grown);
    INA_CHECK_ALLOC(grown);
    d->tokens_host = grown;
    d->tokens_cap = all;
  }
  /* Greedy sampling of our rows: the argmax, -1 for a row of NaN only. */
  INA_CHECK(ina_gpu_sample(e->s.logits, INA_DTYPE_F32, sh->out_rows, V, V, e->greedy_params_dev, 0, e->tokens_dev,
                           NULL, e->stream));
  INA_CHECK(gpu_split_mark(&e->split, SPLIT_EP_COMM, e->stream));
  INA_CHECK(ina_comm_all_gather(e->ep_comm, e->tokens_dev, e->tokens_dev + sh->out_rows, (size_t)sh->out_rows,
                                INA_DTYPE_I32, e->stream));
  INA_CHECK(gpu_split_mark(&e->split, SPLIT_OTHER, e->stream));
  INA_CUDA_CHECK(cudaMemcpyAsync(d->tokens_host, e->tokens_dev + sh->out_rows, (size_t)all * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, e->stream));
fail:
  return st;
}

void gpu_dp_order_tokens(const ina_engine_gpu_t *e, const ina_batch_t *b, const step_shape_t *sh, int32_t *tokens) {
  const gpu_dp_t *d = &e->dp;
  int64_t row = 0;
  for (int32_t i = 0; i < b->batch; i++) {
    const int64_t rows = b->all_logits ? b->qo_indptr[i + 1] - b->qo_indptr[i] : 1;
    const int64_t src = (int64_t)d->owner[i] * sh->out_rows + d->first_row[i];
    for (int64_t j = 0; j < rows; j++) tokens[row++] = d->tokens_host[src + j];
  }
}
