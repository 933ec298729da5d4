/* Expert-parallel dispatch and combine (dispatch.h), with the MPI backend: one message
 * to each peer per phase over comm/a2a.h (non-blocking, sized by its sender: no counts
 * round), host buffers.
 *
 * Wire, one message per (phase, peer), this rank's own handed back without a copy:
 *   dispatch   int64 rows (-1: the sender failed this dispatch), then rows x K int32
 *              slot entries (-1 where that chosen expert is elsewhere), then the rows'
 *              payload; segments padded to 8 bytes;
 *   combine    int64 entries (-1: the sender failed), then one output row per entry >= 0
 *              of the rows it received from that peer, in row then k order.
 *
 * One layer's state lives in the exchange from dispatch start to combine finish:
 *   send side   rows grouped by destination rank, tokens in order within a group;
 *               send_token[i] is the token of sent row i; its slot entries sit in the
 *               dispatch message to its destination;
 *   recv side   rows grouped by source rank, in the order each source sent them (the
 *               dispatch messages received, kept until the next dispatch start); and
 *               pair_of[i * K + k] the place of (row i, entry k) in the layout buffer.
 * Combine walks the receive side in that order and sends one output row per entry >= 0;
 * the home rank walks its send side in the same order to put each back at (token, k).
 *
 * Failures stay collective: a rank whose own part fails (bad routing, no memory) still
 * sends its messages, with -1 as the header, so that every rank fails the same finish
 * instead of waiting for it; the communicator stays usable. */
#define INA_LOG_SUBSYS "moe_ep"
#include "moe_ep/dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/a2a.h"
#include "core/check.h"
#include "core/dtype.h"

typedef struct buffer {
  void *p;
  size_t cap; /* bytes */
} buffer_t;

typedef enum phase {
  PHASE_IDLE = 0,       /* no layer, or a layer combined */
  PHASE_DISPATCHING,    /* dispatch started */
  PHASE_DISPATCHED,     /* dispatch finished: the rows are laid out */
  PHASE_COMBINING,      /* combine started */
} phase_t;

struct ina_ep_exchange {
  ina_comm_t *comm;
  int32_t rank, nranks;
  ina_ep_config_t cfg;
  size_t row_bytes, out_row_bytes; /* wire bytes of a dispatched row, of an output row */
  int64_t capacity;                /* MASKED rows per slot */
  ina_comm_a2a_t *wire_dispatch, *wire_combine;
  /* the layer in flight */
  phase_t phase;
  ina_status_t mine;               /* this rank's own failure in the phase in flight */
  char why[512];                   /* its message, logged at finish */
  int64_t tokens, rows_sent, rows_recv;
  int64_t wait_ns;                 /* time blocked in this layer's finishes */
  size_t *send_rows, *recv_rows;   /* [nranks] rows to / from each rank */
  size_t *send_bytes, *back_bytes; /* [nranks] message bytes of the dispatch, of the combine */
  const void **send_at, **back_at; /* [nranks] the messages */
  const int32_t **recv_meta;       /* [nranks] slot entries in each received message */
  const uint8_t **recv_payload;    /* [nranks] payload in each received message */
  const int32_t **send_meta;       /* [nranks] slot entries in each sent message */
  int64_t *back_expected;          /* [nranks] output rows each peer owes this rank */
  buffer_t ids, send_token, send_msg, back_msg, pair_of;
  buffer_t rows, outs, y_home, rows_f32;
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

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

static const int64_t poison_header = -1;

/* Every message of a phase replaced by a -1 header: the peers fail this phase too. */
static void poison(ina_ep_exchange_t *ex, const void **at, size_t *bytes) {
  for (int32_t r = 0; r < ex->nranks; r++) {
    at[r] = &poison_header;
    bytes[r] = sizeof poison_header;
  }
}

static void record_failure(ina_ep_exchange_t *ex, ina_status_t st) {
  ex->mine = st;
  snprintf(ex->why, sizeof ex->why, "%s", ina_last_error());
}

static int64_t header_of(const void *msg, size_t bytes) {
  int64_t h = -2; /* a message too short for its header */
  if (bytes >= sizeof h) memcpy(&h, msg, sizeof h);
  return h;
}

/* One phase's messages through the wire: posted (start) or received (finish). */
static ina_status_t wire_start(ina_ep_exchange_t *ex, ina_comm_a2a_t *wire, const void **at, const size_t *bytes) {
  if (!ex->comm) return INA_OK;
  return ina_comm_a2a_start(wire, at, bytes);
}

static ina_status_t wire_finish(ina_ep_exchange_t *ex, ina_comm_a2a_t *wire, const void **sent, const size_t *sent_bytes,
                                const void *const **got, const size_t **got_bytes) {
  const int64_t t0 = now_ns();
  ina_status_t st = INA_OK;
  if (ex->comm) {
    st = ina_comm_a2a_finish(wire, got, got_bytes);
  } else { /* one rank: its own message */
    *got = (const void *const *)sent;
    *got_bytes = sent_bytes;
  }
  ex->wait_ns += now_ns() - t0;
  return st;
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
  ina_comm_a2a_destroy(ex->wire_dispatch);
  ina_comm_a2a_destroy(ex->wire_combine);
  buffer_t *b[] = {&ex->ids, &ex->send_token, &ex->send_msg, &ex->back_msg, &ex->pair_of,
                   &ex->rows, &ex->outs, &ex->y_home, &ex->rows_f32};
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) free(b[i]->p);
  free(ex->send_rows);
  free(ex->recv_rows);
  free(ex->send_bytes);
  free(ex->back_bytes);
  free(ex->send_at);
  free(ex->back_at);
  free(ex->recv_meta);
  free(ex->recv_payload);
  free(ex->send_meta);
  free(ex->back_expected);
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
  ex->send_bytes = calloc(n, sizeof(size_t));
  ex->back_bytes = calloc(n, sizeof(size_t));
  ex->send_at = calloc(n, sizeof(void *));
  ex->back_at = calloc(n, sizeof(void *));
  ex->recv_meta = calloc(n, sizeof(void *));
  ex->recv_payload = calloc(n, sizeof(void *));
  ex->send_meta = calloc(n, sizeof(void *));
  ex->back_expected = calloc(n, sizeof(int64_t));
  ex->first = calloc((size_t)c->slots_per_rank + 1, sizeof(int64_t));
  ex->count = calloc((size_t)c->slots_per_rank, sizeof(int64_t));
  INA_CHECK_ALLOC(ex->send_rows);
  INA_CHECK_ALLOC(ex->recv_rows);
  INA_CHECK_ALLOC(ex->send_bytes);
  INA_CHECK_ALLOC(ex->back_bytes);
  INA_CHECK_ALLOC(ex->send_at);
  INA_CHECK_ALLOC(ex->back_at);
  INA_CHECK_ALLOC(ex->recv_meta);
  INA_CHECK_ALLOC(ex->recv_payload);
  INA_CHECK_ALLOC(ex->send_meta);
  INA_CHECK_ALLOC(ex->back_expected);
  INA_CHECK_ALLOC(ex->first);
  INA_CHECK_ALLOC(ex->count);
  if (comm) {
    INA_CHECK(ina_comm_a2a_create(comm, &ex->wire_dispatch));
    INA_CHECK(ina_comm_a2a_create(comm, &ex->wire_combine));
  }
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

/* Row d of token t's entries: 1 when entry k is the first of t's entries to reach rank d. */
static int first_to(const int32_t *dest_t, int32_t k) {
  if (dest_t[k] < 0) return 0;
  for (int32_t j = 0; j < k; j++)
    if (dest_t[j] == dest_t[k]) return 0;
  return 1;
}

/* The send side: one message per destination, its rows' slot entries and payload. */
static ina_status_t plan_sends(ina_ep_exchange_t *ex, const ina_ep_replicas_t *rep, const float *x,
                               const int32_t *ids, int64_t tokens) {
  ina_status_t st = INA_OK;
  const int32_t n = ex->nranks, K = ex->cfg.top_k;
  int32_t *dest = NULL, *slots = NULL;
  int64_t *fill = NULL, *base = NULL;
  size_t *offset = NULL;
  INA_REQUIRE(ex->cfg.layout != INA_EP_LAYOUT_MASKED || tokens <= ex->cfg.max_tokens_per_rank, INA_ERR_INVALID_ARGUMENT,
              "ep dispatch: %lld tokens, more than the masked layout's %lld per rank", (long long)tokens,
              (long long)ex->cfg.max_tokens_per_rank);
  dest = malloc(((size_t)tokens * (size_t)K + 1) * sizeof *dest);
  slots = malloc(((size_t)tokens * (size_t)K + 1) * sizeof *slots);
  fill = calloc((size_t)n, sizeof *fill);
  offset = calloc((size_t)n, sizeof *offset);
  base = calloc((size_t)n, sizeof *base);
  INA_CHECK_ALLOC(base);
  INA_CHECK_ALLOC(dest);
  INA_CHECK_ALLOC(slots);
  INA_CHECK_ALLOC(fill);
  INA_CHECK_ALLOC(offset);
  memset(ex->send_rows, 0, (size_t)n * sizeof *ex->send_rows);
  for (int64_t t = 0; t < tokens; t++) {
    for (int32_t k = 0; k < K; k++)
      INA_CHECK(destination(ex, rep, t, ids[t * K + k], &dest[t * K + k], &slots[t * K + k]));
    for (int32_t k = 0; k < K; k++)
      if (first_to(dest + t * K, k)) ex->send_rows[dest[t * K + k]]++;
  }
  ex->rows_sent = 0;
  size_t total = 0;
  for (int32_t r = 0; r < n; r++) {
    fill[r] = base[r] = ex->rows_sent;
    ex->rows_sent += (int64_t)ex->send_rows[r];
    offset[r] = total;
    ex->send_bytes[r] = sizeof(int64_t) + ex->send_rows[r] * ((size_t)K * sizeof(int32_t) + ex->row_bytes);
    total += pad8(ex->send_bytes[r]);
  }
  INA_CHECK(reserve(&ex->send_token, ((size_t)ex->rows_sent + 1) * sizeof(int64_t)));
  INA_CHECK(reserve(&ex->send_msg, total + 8));
  uint8_t *msg = ex->send_msg.p;
  for (int32_t r = 0; r < n; r++) {
    const int64_t rows = (int64_t)ex->send_rows[r];
    memcpy(msg + offset[r], &rows, sizeof rows);
    ex->send_at[r] = msg + offset[r];
    ex->send_meta[r] = (const int32_t *)(msg + offset[r] + sizeof(int64_t));
  }
  /* Global row i (grouped by destination) is row i - base[d] of destination d's message. */
  int64_t *tok = ex->send_token.p;
  for (int64_t t = 0; t < tokens; t++)
    for (int32_t k = 0; k < K; k++) {
      if (!first_to(dest + t * K, k)) continue;
      const int32_t d = dest[t * K + k];
      const int64_t i = fill[d]++, row = i - base[d];
      tok[i] = t;
      int32_t *meta = (int32_t *)ex->send_meta[d];
      uint8_t *payload = (uint8_t *)(meta + ex->send_rows[d] * (size_t)K);
      for (int32_t j = 0; j < K; j++) meta[row * K + j] = dest[t * K + j] == d ? slots[t * K + j] : -1;
      INA_CHECK(encode_row(ex->cfg.dispatch_payload, x + t * ex->cfg.hidden, ex->cfg.hidden,
                           payload + (size_t)row * ex->row_bytes));
    }
fail:
  free(dest);
  free(slots);
  free(fill);
  free(base);
  free(offset);
  return st;
}

/* The received messages: each peer's rows, checked against its header. */
static ina_status_t read_dispatched(ina_ep_exchange_t *ex, const void *const *got, const size_t *got_bytes) {
  ina_status_t st = INA_OK;
  const int32_t K = ex->cfg.top_k;
  ex->rows_recv = 0;
  for (int32_t r = 0; r < ex->nranks; r++) {
    const int64_t rows = header_of(got[r], got_bytes[r]);
    INA_REQUIRE(rows != -1, INA_ERR_INTERNAL, "ep dispatch: rank %d failed this dispatch (see its log)", (int)r);
    const size_t want = sizeof(int64_t) + (size_t)(rows > 0 ? rows : 0) * ((size_t)K * sizeof(int32_t) + ex->row_bytes);
    INA_REQUIRE(rows >= 0 && got_bytes[r] == want, INA_ERR_INTERNAL,
                "ep dispatch: rank %d sent %zu bytes for %lld rows (expected %zu)", (int)r, got_bytes[r], (long long)rows,
                want);
    ex->recv_rows[r] = (size_t)rows;
    ex->recv_meta[r] = (const int32_t *)((const uint8_t *)got[r] + sizeof(int64_t));
    ex->recv_payload[r] = (const uint8_t *)(ex->recv_meta[r] + (size_t)rows * (size_t)K);
    ex->rows_recv += rows;
  }
fail:
  return st;
}

/* The receive side's layout: each (row, entry >= 0) gets its place. Rows are numbered
 * over the peers in rank order, each peer's in the order it sent them. */
static ina_status_t lay_out(ina_ep_exchange_t *ex) {
  ina_status_t st = INA_OK;
  const int32_t K = ex->cfg.top_k, S = ex->cfg.slots_per_rank;
  const int64_t H = ex->cfg.hidden, R = ex->rows_recv;
  int64_t *fill = NULL;
  memset(ex->count, 0, (size_t)S * sizeof *ex->count);
  for (int32_t r = 0; r < ex->nranks; r++)
    for (size_t i = 0; i < ex->recv_rows[r] * (size_t)K; i++) {
      const int32_t s = ex->recv_meta[r][i];
      INA_REQUIRE(s >= -1 && s < S, INA_ERR_INTERNAL, "ep dispatch: rank %d's row %zu names slot %d, outside %d", (int)r,
                  i / (size_t)K, (int)s, (int)S);
      if (s >= 0) ex->count[s]++;
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
  for (int32_t r = 0, g = 0; r < ex->nranks; r++)
    for (size_t i = 0; i < ex->recv_rows[r]; i++, g++) {
      INA_CHECK(decode_row(ex->cfg.dispatch_payload, ex->recv_payload[r] + i * ex->row_bytes, H, row));
      for (int32_t k = 0; k < K; k++) {
        const int32_t s = ex->recv_meta[r][i * (size_t)K + (size_t)k];
        pair_of[(int64_t)g * K + k] = s >= 0 ? fill[s]++ : -1;
        if (s >= 0) memcpy(rows + pair_of[(int64_t)g * K + k] * H, row, (size_t)H * sizeof(float));
      }
    }
fail:
  free(fill);
  return st;
}

ina_status_t ina_ep_dispatch_start(ina_ep_exchange_t *ex, const ina_ep_replicas_t *replicas, const float *x,
                                   const int32_t *ids, int64_t tokens) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(ex != NULL && replicas != NULL && tokens >= 0 && (tokens == 0 || (x && ids)), INA_ERR_INVALID_ARGUMENT,
              "ep dispatch: exchange %p, replicas %p, %lld tokens, x %p, ids %p", (void *)ex, (const void *)replicas,
              (long long)tokens, (const void *)x, (const void *)ids);
  INA_REQUIRE(ex->phase == PHASE_IDLE, INA_ERR_INVALID_ARGUMENT,
              "ep dispatch: the previous layer is still in flight (finish it, or drain the exchange)");
  const int32_t K = ex->cfg.top_k;
  ex->tokens = tokens;
  ex->wait_ns = 0;
  ex->mine = reserve(&ex->ids, ((size_t)tokens * (size_t)K + 1) * sizeof(int32_t));
  if (ex->mine == INA_OK && tokens) memcpy(ex->ids.p, ids, (size_t)tokens * (size_t)K * sizeof(int32_t));
  if (ex->mine == INA_OK) ex->mine = plan_sends(ex, replicas, x, ids, tokens);
  if (ex->mine != INA_OK) {
    record_failure(ex, ex->mine);
    poison(ex, ex->send_at, ex->send_bytes);
  }
  ex->phase = PHASE_DISPATCHING;
  st = wire_start(ex, ex->wire_dispatch, ex->send_at, ex->send_bytes);
  if (st != INA_OK) ex->phase = PHASE_IDLE;
fail:
  return st;
}

ina_status_t ina_ep_dispatch_finish(ina_ep_exchange_t *ex) {
  ina_status_t st = INA_OK;
  const void *const *got = NULL;
  const size_t *got_bytes = NULL;
  INA_REQUIRE(ex != NULL && ex->phase == PHASE_DISPATCHING, INA_ERR_INVALID_ARGUMENT,
              "ep dispatch finish: no dispatch in flight");
  ex->phase = PHASE_IDLE;
  INA_CHECK(wire_finish(ex, ex->wire_dispatch, ex->send_at, ex->send_bytes, &got, &got_bytes));
  if (ex->mine != INA_OK) {
    ina_error(INA_LOG_SUBSYS, "%s", ex->why);
    st = ex->mine;
    goto fail;
  }
  INA_CHECK(read_dispatched(ex, got, got_bytes));
  INA_CHECK(lay_out(ex));
  ex->phase = PHASE_DISPATCHED;
fail:
  return st;
}

ina_status_t ina_ep_dispatch(ina_ep_exchange_t *ex, const ina_ep_replicas_t *replicas, const float *x,
                             const int32_t *ids, int64_t tokens) {
  ina_status_t st = INA_OK;
  INA_CHECK(ina_ep_dispatch_start(ex, replicas, x, ids, tokens));
  INA_CHECK(ina_ep_dispatch_finish(ex));
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
  out->hidden = ex->cfg.hidden;
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

static int64_t entries_of(const int32_t *meta, size_t rows, int32_t K) {
  int64_t n = 0;
  for (size_t i = 0; i < rows * (size_t)K; i++) n += meta[i] >= 0;
  return n;
}

/* The outputs back to their sources: one message per source, its rows' entries. */
static ina_status_t plan_back(ina_ep_exchange_t *ex) {
  ina_status_t st = INA_OK;
  const int32_t n = ex->nranks, K = ex->cfg.top_k;
  const int64_t H = ex->cfg.hidden;
  size_t total = 0;
  for (int32_t r = 0; r < n; r++) {
    ex->back_bytes[r] = sizeof(int64_t) + (size_t)entries_of(ex->recv_meta[r], ex->recv_rows[r], K) * ex->out_row_bytes;
    total += pad8(ex->back_bytes[r]);
  }
  INA_CHECK(reserve(&ex->back_msg, total + 8));
  uint8_t *msg = ex->back_msg.p;
  const float *outs = ex->outs.p;
  const int64_t *pair_of = ex->pair_of.p;
  size_t offset = 0;
  for (int32_t r = 0, g = 0; r < n; r++) {
    const int64_t entries = (int64_t)((ex->back_bytes[r] - sizeof(int64_t)) / ex->out_row_bytes);
    memcpy(msg + offset, &entries, sizeof entries);
    ex->back_at[r] = msg + offset;
    uint8_t *dst = msg + offset + sizeof(int64_t);
    for (size_t i = 0; i < ex->recv_rows[r]; i++, g++)
      for (int32_t k = 0; k < K; k++)
        if (ex->recv_meta[r][i * (size_t)K + (size_t)k] >= 0) {
          INA_CHECK(encode_row(ex->cfg.combine_payload, outs + pair_of[(int64_t)g * K + k] * H, H, dst));
          dst += ex->out_row_bytes;
        }
    offset += pad8(ex->back_bytes[r]);
  }
fail:
  return st;
}

ina_status_t ina_ep_combine_start(ina_ep_exchange_t *ex) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(ex != NULL && ex->phase == PHASE_DISPATCHED, INA_ERR_INVALID_ARGUMENT, "ep combine: no dispatch to combine");
  for (int32_t r = 0; r < ex->nranks; r++) ex->back_expected[r] = entries_of(ex->send_meta[r], ex->send_rows[r], ex->cfg.top_k);
  ex->mine = plan_back(ex);
  if (ex->mine != INA_OK) {
    record_failure(ex, ex->mine);
    poison(ex, ex->back_at, ex->back_bytes);
  }
  ex->phase = PHASE_COMBINING;
  st = wire_start(ex, ex->wire_combine, ex->back_at, ex->back_bytes);
  if (st != INA_OK) ex->phase = PHASE_IDLE;
fail:
  return st;
}

static void fill_stats(const ina_ep_exchange_t *ex, ina_ep_stats_t *stats) {
  memset(stats, 0, sizeof *stats);
  stats->rows_sent = ex->rows_sent;
  int64_t back_remote = 0;
  for (int32_t r = 0; r < ex->nranks; r++) {
    if (r == ex->rank) continue;
    stats->rows_remote += (int64_t)ex->send_rows[r];
    stats->peers_sent += ex->send_rows[r] > 0;
    back_remote += (int64_t)((ex->back_bytes[r] - sizeof(int64_t)) / ex->out_row_bytes);
  }
  stats->dispatch_bytes = stats->rows_remote * (int64_t)ex->row_bytes;
  stats->meta_bytes = stats->rows_remote * ex->cfg.top_k * (int64_t)sizeof(int32_t) +
                      2 * (int64_t)(ex->nranks - 1) * (int64_t)sizeof(int64_t);
  stats->combine_bytes = back_remote * (int64_t)ex->out_row_bytes;
  stats->wait_ns = ex->wait_ns;
}

ina_status_t ina_ep_combine_finish(ina_ep_exchange_t *ex, const float *weights, float *out, ina_ep_stats_t *stats) {
  ina_status_t st = INA_OK;
  const void *const *got = NULL;
  const size_t *got_bytes = NULL;
  INA_REQUIRE(ex != NULL && ex->phase == PHASE_COMBINING, INA_ERR_INVALID_ARGUMENT, "ep combine finish: no combine in flight");
  ex->phase = PHASE_IDLE;
  INA_CHECK(wire_finish(ex, ex->wire_combine, ex->back_at, ex->back_bytes, &got, &got_bytes));
  if (ex->mine != INA_OK) {
    ina_error(INA_LOG_SUBSYS, "%s", ex->why);
    st = ex->mine;
    goto fail;
  }
  INA_REQUIRE(ex->tokens == 0 || (weights && out), INA_ERR_INVALID_ARGUMENT, "ep combine: weights %p, out %p",
              (const void *)weights, (void *)out);
  const int32_t K = ex->cfg.top_k;
  const int64_t H = ex->cfg.hidden;
  for (int32_t r = 0; r < ex->nranks; r++) {
    const int64_t entries = header_of(got[r], got_bytes[r]);
    INA_REQUIRE(entries != -1, INA_ERR_INTERNAL, "ep combine: rank %d failed this combine (see its log)", (int)r);
    INA_REQUIRE(entries == ex->back_expected[r] &&
                    got_bytes[r] == sizeof(int64_t) + (size_t)entries * ex->out_row_bytes,
                INA_ERR_INTERNAL, "ep combine: rank %d sent %zu bytes for %lld outputs (expected %lld)", (int)r,
                got_bytes[r], (long long)entries, (long long)ex->back_expected[r]);
  }
  INA_CHECK(reserve(&ex->y_home, ((size_t)(ex->tokens * K * H) + 1) * sizeof(float)));
  {
    /* Each home row's entries back at (token, k), in the order they were sent. */
    float *y = ex->y_home.p;
    const int64_t *send_token = ex->send_token.p;
    for (int32_t r = 0, g = 0; r < ex->nranks; r++) {
      const uint8_t *src = (const uint8_t *)got[r] + sizeof(int64_t);
      for (size_t i = 0; i < ex->send_rows[r]; i++, g++)
        for (int32_t k = 0; k < K; k++)
          if (ex->send_meta[r][i * (size_t)K + (size_t)k] >= 0) {
            INA_CHECK(decode_row(ex->cfg.combine_payload, src, H, y + (send_token[g] * K + k) * H));
            src += ex->out_row_bytes;
          }
    }
    ina_ep_combine_sum(ex->ids.p, weights, y, ex->tokens, K, H, out);
  }
  if (stats) fill_stats(ex, stats);
fail:
  return st;
}

ina_status_t ina_ep_combine(ina_ep_exchange_t *ex, const float *weights, float *out, ina_ep_stats_t *stats) {
  ina_status_t st = INA_OK;
  INA_CHECK(ina_ep_combine_start(ex));
  INA_CHECK(ina_ep_combine_finish(ex, weights, out, stats));
fail:
  return st;
}

ina_status_t ina_ep_exchange_drain(ina_ep_exchange_t *ex) {
  if (!ex) return INA_OK;
  const void *const *got = NULL;
  const size_t *got_bytes = NULL;
  ina_status_t st = INA_OK;
  if (ex->phase == PHASE_DISPATCHING) st = wire_finish(ex, ex->wire_dispatch, ex->send_at, ex->send_bytes, &got, &got_bytes);
  if (ex->phase == PHASE_COMBINING) st = wire_finish(ex, ex->wire_combine, ex->back_at, ex->back_bytes, &got, &got_bytes);
  ex->phase = PHASE_IDLE;
  return st;
}
