/* Expert-parallel dispatch and combine (dispatch.h), with the MPI backend: all-to-all-v
 * of host buffers over the communicator.
 *
 * One layer's state lives in the exchange between ina_ep_dispatch and ina_ep_combine:
 *   send side   rows grouped by destination rank, tokens in order within a group;
 *               send_token[i] is the token of sent row i, send_meta[i * K + k] the slot
 *               its k-th entry takes at that rank (-1: elsewhere);
 *   recv side   rows grouped by source rank, in the order each source sent them;
 *               recv_meta likewise, and pair_of[i * K + k] the place of (row i, entry k)
 *               in the layout buffer (-1: none).
 * Combine walks the receive side in that order and sends one output row per entry >= 0;
 * the home rank walks its send side in the same order to put each back at (token, k).
 *
 * Failures stay collective: a rank whose own arguments are bad sends -1 as every count,
 * so that every rank fails the same dispatch instead of waiting for it. */
#define INA_LOG_SUBSYS "moe_ep"
#include "moe_ep/dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/dtype.h"

typedef struct buffer {
  void *p;
  size_t cap; /* bytes */
} buffer_t;

struct ina_ep_exchange {
  ina_comm_t *comm;
  int32_t rank, nranks;
  ina_ep_config_t cfg;
  size_t row_bytes, out_row_bytes; /* wire bytes of a dispatched row, of an output row */
  int64_t capacity;                /* MASKED rows per slot */
  /* the layer in flight */
  int dispatched;
  int64_t tokens, rows_sent, rows_recv;
  size_t *send_rows, *recv_rows;   /* [nranks] rows to / from each rank */
  size_t *send_n, *recv_n;         /* [nranks] element counts of one exchange */
  int64_t *count_out, *count_in;   /* [nranks] the counts exchange */
  buffer_t ids, send_token, send_meta, send_payload, recv_meta, recv_payload, pair_of;
  buffer_t rows, outs, back_send, back_recv, y_home, rows_f32;
  int64_t *first, *count;          /* [slots + 1], [slots] */
};

/* ---- small helpers ------------------------------------------------------------------- */

static ina_status_t reserve(buffer_t *b, size_t bytes) {
  ina_status_t st = INA_OK;
  if (bytes <= b->cap) return INA_OK;
  void *p = realloc(b->p, bytes);
  INA_CHECK_ALLOC(p);
  b->p = p;
  b->cap = bytes;
fail:
  return st;
}

static size_t dtype_bytes(ina_ep_payload_t p) { return p == INA_EP_PAYLOAD_F32 ? 4 : p == INA_EP_PAYLOAD_BF16 ? 2 : 1; }

static int64_t fp8_blocks(int64_t hidden) { return (hidden + INA_EP_FP8_BLOCK - 1) / INA_EP_FP8_BLOCK; }

static size_t payload_row_bytes(ina_ep_payload_t p, int64_t hidden) {
  if (p == INA_EP_PAYLOAD_FP8) return (size_t)hidden + (size_t)fp8_blocks(hidden) * sizeof(float);
  return (size_t)hidden * dtype_bytes(p);
}

/* The wire's element type: f32 and bf16 rows as themselves, fp8 rows (bytes and scales
 * packed) as one-byte elements. */
static ina_dtype_t wire_dtype(ina_ep_payload_t p) {
  return p == INA_EP_PAYLOAD_F32 ? INA_DTYPE_F32 : p == INA_EP_PAYLOAD_BF16 ? INA_DTYPE_BF16 : INA_DTYPE_FP8_E4M3;
}

static size_t wire_elems_per_row(ina_ep_payload_t p, int64_t hidden) {
  return p == INA_EP_PAYLOAD_FP8 ? payload_row_bytes(p, hidden) : (size_t)hidden;
}

static ina_status_t encode_row(ina_ep_payload_t p, const float *x, int64_t hidden, uint8_t *dst) {
  switch (p) {
    case INA_EP_PAYLOAD_F32: memcpy(dst, x, (size_t)hidden * sizeof(float)); return INA_OK;
    case INA_EP_PAYLOAD_BF16: return ina_from_f32(x, dst, INA_DTYPE_BF16, (size_t)hidden);
    case INA_EP_PAYLOAD_FP8: {
      float scales[64];
      float *s = fp8_blocks(hidden) <= 64 ? scales : NULL;
      ina_status_t st = INA_OK;
      if (!s) s = malloc((size_t)fp8_blocks(hidden) * sizeof *s);
      if (!s) return INA_ERR_OUT_OF_MEMORY;
      st = ina_fp8_quantize_blocks(x, 1, hidden, 1, INA_EP_FP8_BLOCK, dst, s);
      memcpy(dst + hidden, s, (size_t)fp8_blocks(hidden) * sizeof *s); /* unaligned: copied */
      if (s != scales) free(s);
      return st;
    }
  }
  return INA_ERR_INVALID_ARGUMENT;
}

static ina_status_t decode_row(ina_ep_payload_t p, const uint8_t *src, int64_t hidden, float *x) {
  switch (p) {
    case INA_EP_PAYLOAD_F32: memcpy(x, src, (size_t)hidden * sizeof(float)); return INA_OK;
    case INA_EP_PAYLOAD_BF16: ina_to_f32(src, INA_DTYPE_BF16, x, (size_t)hidden); return INA_OK;
    case INA_EP_PAYLOAD_FP8: {
      float scales[64];
      float *s = fp8_blocks(hidden) <= 64 ? scales : malloc((size_t)fp8_blocks(hidden) * sizeof(float));
      if (!s) return INA_ERR_OUT_OF_MEMORY;
      memcpy(s, src + hidden, (size_t)fp8_blocks(hidden) * sizeof *s);
      const ina_status_t st = ina_fp8_dequantize_blocks(src, s, 1, hidden, 1, INA_EP_FP8_BLOCK, x);
      if (s != scales) free(s);
      return st;
    }
  }
  return INA_ERR_INVALID_ARGUMENT;
}

/* All-to-all-v of packed buffers in rank order: send_n[p] elements to peer p, recv_n[p]
 * from it. One rank: a copy. */
static ina_status_t exchange(ina_ep_exchange_t *ex, const void *send, const size_t *send_n, void *recv,
                             const size_t *recv_n, ina_dtype_t dtype) {
  if (!ex->comm) {
    if (send_n[0]) memcpy(recv, send, send_n[0] * ina_dtype_size(dtype));
    return INA_OK;
  }
  return ina_comm_all_to_all_v(ex->comm, send, send_n, NULL, recv, recv_n, NULL, dtype, NULL);
}

/* ---- create ---------------------------------------------------------------------------- */

const char *ina_ep_backend_name(ina_ep_backend_t b) {
  return b == INA_EP_BACKEND_MPI ? "mpi" : b == INA_EP_BACKEND_NCCL ? "nccl" : b == INA_EP_BACKEND_NVLINK ? "nvlink" : "unknown";
}

const char *ina_ep_layout_name(ina_ep_layout_t l) {
  return l == INA_EP_LAYOUT_CONTIGUOUS ? "contiguous" : l == INA_EP_LAYOUT_MASKED ? "masked" : "unknown";
}

void ina_ep_exchange_destroy(ina_ep_exchange_t *ex) {
  if (!ex) return;
  buffer_t *b[] = {&ex->ids, &ex->send_token, &ex->send_meta, &ex->send_payload, &ex->recv_meta,
                   &ex->recv_payload, &ex->pair_of, &ex->rows, &ex->outs, &ex->back_send,
                   &ex->back_recv, &ex->y_home, &ex->rows_f32};
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) free(b[i]->p);
  free(ex->send_rows);
  free(ex->recv_rows);
  free(ex->send_n);
  free(ex->recv_n);
  free(ex->count_out);
  free(ex->count_in);
  free(ex->first);
  free(ex->count);
  free(ex);
}

ina_status_t ina_ep_exchange_create(ina_comm_t *comm, const ina_ep_config_t *config, ina_ep_exchange_t **out) {
  ina_status_t st = INA_OK;
  ina_ep_exchange_t *ex = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ep exchange: out is NULL");
  *out = NULL;
  INA_REQUIRE_VERSIONED(config, sizeof(ina_ep_config_t), "ina_ep_config_t", "INA_EP_CONFIG_INIT");
  const ina_ep_config_t *c = config;
  INA_REQUIRE(c->backend == INA_EP_BACKEND_MPI, INA_ERR_UNSUPPORTED,
              "ep exchange: the %s backend is not in this build (mpi is)", ina_ep_backend_name(c->backend));
  INA_REQUIRE(c->layout == INA_EP_LAYOUT_CONTIGUOUS || c->layout == INA_EP_LAYOUT_MASKED, INA_ERR_INVALID_ARGUMENT,
              "ep exchange: layout %d is neither contiguous nor masked", (int)c->layout);
  INA_REQUIRE(c->dispatch_payload >= INA_EP_PAYLOAD_F32 && c->dispatch_payload <= INA_EP_PAYLOAD_FP8,
              INA_ERR_INVALID_ARGUMENT, "ep exchange: dispatch payload %d is not f32, bf16 or fp8",
              (int)c->dispatch_payload);
  INA_REQUIRE(c->combine_payload == INA_EP_PAYLOAD_F32 || c->combine_payload == INA_EP_PAYLOAD_BF16,
              INA_ERR_INVALID_ARGUMENT, "ep exchange: combine payload %d is not f32 or bf16 (outputs are summed "
              "after the trip: fp8 would round each addend)", (int)c->combine_payload);
  INA_REQUIRE(c->hidden >= 1 && c->hidden <= (1 << 20), INA_ERR_INVALID_ARGUMENT,
              "ep exchange: hidden %lld is outside [1, 2^20]", (long long)c->hidden);
  INA_REQUIRE(c->top_k >= 1 && c->top_k <= 64, INA_ERR_INVALID_ARGUMENT, "ep exchange: top_k %d is outside [1, 64]",
              (int)c->top_k);
  INA_REQUIRE(c->slots_per_rank >= 1, INA_ERR_INVALID_ARGUMENT, "ep exchange: slots_per_rank %d < 1",
              (int)c->slots_per_rank);
  INA_REQUIRE(c->layout != INA_EP_LAYOUT_MASKED || c->max_tokens_per_rank >= 1, INA_ERR_INVALID_ARGUMENT,
              "ep exchange: the masked layout needs max_tokens_per_rank >= 1 (got %lld)",
              (long long)c->max_tokens_per_rank);
  ex = calloc(1, sizeof *ex);
  INA_CHECK_ALLOC(ex);
  ex->comm = comm;
  ex->rank = comm ? ina_comm_rank(comm) : 0;
  ex->nranks = comm ? ina_comm_size(comm) : 1;
  ex->cfg = *c;
  ex->row_bytes = payload_row_bytes(c->dispatch_payload, c->hidden);
  ex->out_row_bytes = payload_row_bytes(c->combine_payload, c->hidden);
  ex->capacity = c->layout == INA_EP_LAYOUT_MASKED ? c->max_tokens_per_rank * ex->nranks : 0;
  const size_t n = (size_t)ex->nranks;
  ex->send_rows = calloc(n, sizeof(size_t));
  ex->recv_rows = calloc(n, sizeof(size_t));
  ex->send_n = calloc(n, sizeof(size_t));
  ex->recv_n = calloc(n, sizeof(size_t));
  ex->count_out = calloc(n, sizeof(int64_t));
  ex->count_in = calloc(n, sizeof(int64_t));
  ex->first = calloc((size_t)c->slots_per_rank + 1, sizeof(int64_t));
  ex->count = calloc((size_t)c->slots_per_rank, sizeof(int64_t));
  INA_CHECK_ALLOC(ex->send_rows);
  INA_CHECK_ALLOC(ex->recv_rows);
  INA_CHECK_ALLOC(ex->send_n);
  INA_CHECK_ALLOC(ex->recv_n);
  INA_CHECK_ALLOC(ex->count_out);
  INA_CHECK_ALLOC(ex->count_in);
  INA_CHECK_ALLOC(ex->first);
  INA_CHECK_ALLOC(ex->count);
  *out = ex;
  return INA_OK;
fail:
  ina_ep_exchange_destroy(ex);
  return st;
}

/* ---- dispatch ------------------------------------------------------------------------- */

/* Where entry (t, k) goes: *rank and *slot, or *rank = -1 for an entry nobody computes. */
static ina_status_t destination(const ina_ep_exchange_t *ex, const ina_ep_replicas_t *rep, int64_t t, int32_t x,
                                int32_t *rank, int32_t *slot) {
  ina_status_t st = INA_OK;
  *rank = *slot = -1;
  if (x < 0) return INA_OK;
  INA_REQUIRE(x < rep->num_experts, INA_ERR_INVALID_ARGUMENT, "ep dispatch: token %lld chose expert %d, outside [0, %d)",
              (long long)t, (int)x, (int)rep->num_experts);
  const int32_t begin = rep->first[x], replicas = rep->first[x + 1] - begin;
  INA_REQUIRE(replicas >= 1, INA_ERR_INVALID_ARGUMENT, "ep dispatch: expert %d has no replica", (int)x);
  const int32_t j = begin + (int32_t)((t * ex->nranks + ex->rank) % replicas);
  *rank = rep->rank[j];
  *slot = rep->slot[j];
  INA_REQUIRE(*rank >= 0 && *rank < ex->nranks && *slot >= 0 && *slot < ex->cfg.slots_per_rank,
              INA_ERR_INVALID_ARGUMENT, "ep dispatch: expert %d's replica %d is at rank %d slot %d, outside %d ranks x %d slots",
              (int)x, (int)(j - begin), (int)*rank, (int)*slot, (int)ex->nranks, (int)ex->cfg.slots_per_rank);
fail:
  return st;
}

/* The send side: rows grouped by destination, each with its slot entries and payload. */
static ina_status_t plan_sends(ina_ep_exchange_t *ex, const ina_ep_replicas_t *rep, const float *x,
                               const int32_t *ids, int64_t tokens) {
  ina_status_t st = INA_OK;
  const int32_t n = ex->nranks, K = ex->cfg.top_k;
  int32_t *dest = NULL, *slots = NULL;
  int64_t *fill = NULL;
  INA_REQUIRE(ex->cfg.layout != INA_EP_LAYOUT_MASKED || tokens <= ex->cfg.max_tokens_per_rank, INA_ERR_INVALID_ARGUMENT,
              "ep dispatch: %lld tokens, more than the masked layout's %lld per rank", (long long)tokens,
              (long long)ex->cfg.max_tokens_per_rank);
  dest = malloc(((size_t)tokens * (size_t)K + 1) * sizeof *dest);
  slots = malloc(((size_t)tokens * (size_t)K + 1) * sizeof *slots);
  fill = calloc((size_t)n, sizeof *fill);
  INA_CHECK_ALLOC(dest);
  INA_CHECK_ALLOC(slots);
  INA_CHECK_ALLOC(fill);
  memset(ex->send_rows, 0, (size_t)n * sizeof *ex->send_rows);
  for (int64_t t = 0; t < tokens; t++)
    for (int32_t k = 0; k < K; k++) {
      INA_CHECK(destination(ex, rep, t, ids[t * K + k], &dest[t * K + k], &slots[t * K + k]));
      /* One row per (token, rank): count a rank at the first entry that reaches it. */
      const int32_t d = dest[t * K + k];
      int first = d >= 0;
      for (int32_t j = 0; j < k && first; j++) first = dest[t * K + j] != d;
      if (first) ex->send_rows[d]++;
    }
  ex->rows_sent = 0;
  for (int32_t r = 0; r < n; r++) {
    fill[r] = ex->rows_sent;
    ex->rows_sent += (int64_t)ex->send_rows[r];
  }
  INA_CHECK(reserve(&ex->send_token, ((size_t)ex->rows_sent + 1) * sizeof(int64_t)));
  INA_CHECK(reserve(&ex->send_meta, ((size_t)ex->rows_sent * (size_t)K + 1) * sizeof(int32_t)));
  INA_CHECK(reserve(&ex->send_payload, (size_t)ex->rows_sent * ex->row_bytes + 1));
  int64_t *tok = ex->send_token.p;
  int32_t *meta = ex->send_meta.p;
  uint8_t *payload = ex->send_payload.p;
  for (int64_t t = 0; t < tokens; t++)
    for (int32_t k = 0; k < K; k++) {
      const int32_t d = dest[t * K + k];
      int first = d >= 0;
      for (int32_t j = 0; j < k && first; j++) first = dest[t * K + j] != d;
      if (!first) continue;
      const int64_t i = fill[d]++;
      tok[i] = t;
      for (int32_t j = 0; j < K; j++) meta[i * K + j] = dest[t * K + j] == d ? slots[t * K + j] : -1;
      INA_CHECK(encode_row(ex->cfg.dispatch_payload, x + t * ex->cfg.hidden, ex->cfg.hidden,
                           payload + (size_t)i * ex->row_bytes));
    }
fail:
  free(dest);
  free(slots);
  free(fill);
  return st;
}

/* The receive side's layout: each (row, entry >= 0) gets its place. */
static ina_status_t lay_out(ina_ep_exchange_t *ex) {
  ina_status_t st = INA_OK;
  const int32_t K = ex->cfg.top_k, S = ex->cfg.slots_per_rank;
  const int64_t H = ex->cfg.hidden, R = ex->rows_recv;
  const int32_t *meta = ex->recv_meta.p;
  int64_t *fill = NULL;
  memset(ex->count, 0, (size_t)S * sizeof *ex->count);
  for (int64_t i = 0; i < R * K; i++) {
    INA_REQUIRE(meta[i] >= -1 && meta[i] < S, INA_ERR_INTERNAL, "ep dispatch: received row %lld names slot %d, outside %d",
                (long long)(i / K), (int)meta[i], (int)S);
    if (meta[i] >= 0) ex->count[meta[i]]++;
  }
  ex->first[0] = 0;
  for (int32_t s = 0; s < S; s++) {
    INA_REQUIRE(ex->cfg.layout != INA_EP_LAYOUT_MASKED || ex->count[s] <= ex->capacity, INA_ERR_INTERNAL,
                "ep dispatch: slot %d received %lld rows, more than its %lld", (int)s, (long long)ex->count[s],
                (long long)ex->capacity);
    ex->first[s + 1] = ex->cfg.layout == INA_EP_LAYOUT_MASKED ? (int64_t)(s + 1) * ex->capacity : ex->first[s] + ex->count[s];
  }
  const size_t places = (size_t)ex->first[S];
  INA_CHECK(reserve(&ex->pair_of, ((size_t)(R * K) + 1) * sizeof(int64_t)));
  INA_CHECK(reserve(&ex->rows, (places * (size_t)H + 1) * sizeof(float)));
  INA_CHECK(reserve(&ex->outs, (places * (size_t)H + 1) * sizeof(float)));
  INA_CHECK(reserve(&ex->rows_f32, ((size_t)H + 1) * sizeof(float)));
  fill = malloc(((size_t)S + 1) * sizeof *fill);
  INA_CHECK_ALLOC(fill);
  memcpy(fill, ex->first, (size_t)S * sizeof *fill);
  int64_t *pair_of = ex->pair_of.p;
  float *rows = ex->rows.p, *row = ex->rows_f32.p;
  const uint8_t *payload = ex->recv_payload.p;
  for (int64_t i = 0; i < R; i++) {
    INA_CHECK(decode_row(ex->cfg.dispatch_payload, payload + (size_t)i * ex->row_bytes, H, row));
    for (int32_t k = 0; k < K; k++) {
      const int32_t s = meta[i * K + k];
      pair_of[i * K + k] = s >= 0 ? fill[s]++ : -1;
      if (s >= 0) memcpy(rows + pair_of[i * K + k] * H, row, (size_t)H * sizeof(float));
    }
  }
fail:
  free(fill);
  return st;
}

ina_status_t ina_ep_dispatch(ina_ep_exchange_t *ex, const ina_ep_replicas_t *replicas, const float *x,
                             const int32_t *ids, int64_t tokens) {
  ina_status_t st = INA_OK, mine = INA_OK;
  INA_REQUIRE(ex != NULL && replicas != NULL && tokens >= 0 && (tokens == 0 || (x && ids)), INA_ERR_INVALID_ARGUMENT,
              "ep dispatch: exchange %p, replicas %p, %lld tokens, x %p, ids %p", (void *)ex, (const void *)replicas,
              (long long)tokens, (const void *)x, (const void *)ids);
  const int32_t n = ex->nranks, K = ex->cfg.top_k;
  ex->dispatched = 0;
  ex->tokens = tokens;
  mine = reserve(&ex->ids, ((size_t)tokens * (size_t)K + 1) * sizeof(int32_t));
  if (mine == INA_OK && tokens) memcpy(ex->ids.p, ids, (size_t)tokens * (size_t)K * sizeof(int32_t));
  if (mine == INA_OK) mine = plan_sends(ex, replicas, x, ids, tokens);
  char why[512] = "";
  if (mine != INA_OK) snprintf(why, sizeof why, "%s", ina_last_error());
  /* Counts, poisoned by a rank that failed: every rank then fails here together. */
  for (int32_t r = 0; r < n; r++) {
    ex->count_out[r] = mine == INA_OK ? (int64_t)ex->send_rows[r] : -1;
    ex->send_n[r] = ex->recv_n[r] = 1;
  }
  INA_CHECK(exchange(ex, ex->count_out, ex->send_n, ex->count_in, ex->recv_n, INA_DTYPE_I64));
  if (mine != INA_OK) {
    st = mine;
    ina_error(INA_LOG_SUBSYS, "%s", why);
    goto fail;
  }
  ex->rows_recv = 0;
  for (int32_t r = 0; r < n; r++) {
    INA_REQUIRE(ex->count_in[r] >= 0, INA_ERR_INTERNAL, "ep dispatch: rank %d failed this dispatch (see its log)", (int)r);
    ex->recv_rows[r] = (size_t)ex->count_in[r];
    ex->rows_recv += ex->count_in[r];
  }
  INA_CHECK(reserve(&ex->recv_meta, ((size_t)ex->rows_recv * (size_t)K + 1) * sizeof(int32_t)));
  INA_CHECK(reserve(&ex->recv_payload, (size_t)ex->rows_recv * ex->row_bytes + 1));
  for (int32_t r = 0; r < n; r++) {
    ex->send_n[r] = ex->send_rows[r] * (size_t)K;
    ex->recv_n[r] = ex->recv_rows[r] * (size_t)K;
  }
  INA_CHECK(exchange(ex, ex->send_meta.p, ex->send_n, ex->recv_meta.p, ex->recv_n, INA_DTYPE_I32));
  const size_t per_row = wire_elems_per_row(ex->cfg.dispatch_payload, ex->cfg.hidden);
  for (int32_t r = 0; r < n; r++) {
    ex->send_n[r] = ex->send_rows[r] * per_row;
    ex->recv_n[r] = ex->recv_rows[r] * per_row;
  }
  INA_CHECK(exchange(ex, ex->send_payload.p, ex->send_n, ex->recv_payload.p, ex->recv_n,
                     wire_dtype(ex->cfg.dispatch_payload)));
  INA_CHECK(lay_out(ex));
  ex->dispatched = 1;
fail:
  return st;
}

void ina_ep_received(const ina_ep_exchange_t *ex, ina_ep_received_t *out) {
  memset(out, 0, sizeof *out);
  if (!ex) return;
  out->layout = ex->cfg.layout;
  out->slots = ex->cfg.slots_per_rank;
  out->rows = ex->rows.p;
  out->first = ex->cfg.layout == INA_EP_LAYOUT_CONTIGUOUS ? ex->first : NULL;
  out->count = ex->count;
  out->capacity = ex->capacity;
}

float *ina_ep_outputs(ina_ep_exchange_t *ex) { return ex ? ex->outs.p : NULL; }

/* ---- combine -------------------------------------------------------------------------- */

void ina_ep_combine_sum(const int32_t *ids, const float *weights, const float *y, int64_t tokens, int32_t top_k,
                        int64_t hidden, float *out) {
  int32_t order[64];
  for (int64_t t = 0; t < tokens; t++) {
    const int32_t *id = ids + t * top_k;
    /* The entries by ascending expert (insertion sort: top_k <= 64). */
    int32_t m = 0;
    for (int32_t k = 0; k < top_k; k++) {
      if (id[k] < 0) continue;
      int32_t at = m++;
      while (at > 0 && id[order[at - 1]] > id[k]) {
        order[at] = order[at - 1];
        at--;
      }
      order[at] = k;
    }
    float *dst = out + t * hidden;
    memset(dst, 0, (size_t)hidden * sizeof *dst);
    for (int32_t j = 0; j < m; j++) {
      const int32_t k = order[j];
      const float w = weights[t * top_k + k];
      const float *src = y + (t * top_k + k) * hidden;
      for (int64_t d = 0; d < hidden; d++) dst[d] += src[d] * w;
    }
  }
}

ina_status_t ina_ep_combine(ina_ep_exchange_t *ex, const float *weights, float *out, ina_ep_stats_t *stats) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(ex != NULL && ex->dispatched, INA_ERR_INVALID_ARGUMENT, "ep combine: no dispatch to combine");
  INA_REQUIRE(ex->tokens == 0 || (weights && out), INA_ERR_INVALID_ARGUMENT, "ep combine: weights %p, out %p",
              (const void *)weights, (void *)out);
  const int32_t n = ex->nranks, K = ex->cfg.top_k;
  const int64_t H = ex->cfg.hidden;
  const ina_ep_payload_t p = ex->cfg.combine_payload;
  const int32_t *recv_meta = ex->recv_meta.p, *send_meta = ex->send_meta.p;
  const int64_t *pair_of = ex->pair_of.p, *send_token = ex->send_token.p;
  /* Back to each source: one output row per entry >= 0 of its rows, row then k order. */
  int64_t back_out = 0, back_in = 0, row = 0;
  for (int32_t r = 0; r < n; r++) {
    size_t entries = 0;
    for (size_t i = 0; i < ex->recv_rows[r]; i++, row++)
      for (int32_t k = 0; k < K; k++) entries += recv_meta[row * K + k] >= 0;
    ex->send_n[r] = entries;
    back_out += (int64_t)entries;
  }
  row = 0;
  for (int32_t r = 0; r < n; r++) {
    size_t entries = 0;
    for (size_t i = 0; i < ex->send_rows[r]; i++, row++)
      for (int32_t k = 0; k < K; k++) entries += send_meta[row * K + k] >= 0;
    ex->recv_n[r] = entries;
    back_in += (int64_t)entries;
  }
  INA_CHECK(reserve(&ex->back_send, (size_t)back_out * ex->out_row_bytes + 1));
  INA_CHECK(reserve(&ex->back_recv, (size_t)back_in * ex->out_row_bytes + 1));
  INA_CHECK(reserve(&ex->y_home, ((size_t)(ex->tokens * K * H) + 1) * sizeof(float)));
  {
    uint8_t *dst = ex->back_send.p;
    const float *outs = ex->outs.p;
    for (int64_t i = 0, at = 0; i < ex->rows_recv; i++)
      for (int32_t k = 0; k < K; k++)
        if (recv_meta[i * K + k] >= 0)
          INA_CHECK(encode_row(p, outs + pair_of[i * K + k] * H, H, dst + (size_t)(at++) * ex->out_row_bytes));
  }
  const size_t per_row = wire_elems_per_row(p, H);
  for (int32_t r = 0; r < n; r++) {
    ex->send_n[r] *= per_row;
    ex->recv_n[r] *= per_row;
  }
  INA_CHECK(exchange(ex, ex->back_send.p, ex->send_n, ex->back_recv.p, ex->recv_n, wire_dtype(p)));
  {
    /* Each home row's entries back at (token, k), in the order they were sent. */
    float *y = ex->y_home.p;
    const uint8_t *src = ex->back_recv.p;
    for (int64_t i = 0, at = 0; i < ex->rows_sent; i++)
      for (int32_t k = 0; k < K; k++)
        if (send_meta[i * K + k] >= 0)
          INA_CHECK(decode_row(p, src + (size_t)(at++) * ex->out_row_bytes, H, y + (send_token[i] * K + k) * H));
    ina_ep_combine_sum(ex->ids.p, weights, y, ex->tokens, K, H, out);
  }
  if (stats) {
    memset(stats, 0, sizeof *stats);
    stats->rows_sent = ex->rows_sent;
    int64_t back_remote = 0;
    row = 0;
    for (int32_t r = 0; r < n; r++) {
      if (r != ex->rank) {
        stats->rows_remote += (int64_t)ex->send_rows[r];
        stats->peers_sent += ex->send_rows[r] > 0;
        back_remote += (int64_t)(ex->send_n[r] / per_row);
      }
    }
    stats->dispatch_bytes = stats->rows_remote * (int64_t)ex->row_bytes;
    stats->meta_bytes = stats->rows_remote * K * (int64_t)sizeof(int32_t);
    stats->combine_bytes = back_remote * (int64_t)ex->out_row_bytes;
  }
  ex->dispatched = 0;
fail:
  return st;
}
