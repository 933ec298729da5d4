/* The routed-expert weights of one rank's slots (moe_ep/expert_slots.h). */
#define INA_LOG_SUBSYS "model"
#include "moe_ep/expert_slots.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

enum { TENSOR_HEAD_WORDS = 5, LINEAR_HEAD_WORDS = 2, BUFFER_ALIGN = 64 };

static ina_linear_t *proj(ina_mlp_weights_t *m, int i) {
  return i == 0 ? &m->gate : i == 1 ? &m->up : &m->down;
}

static ina_tensor_t *part(ina_linear_t *l, int j) {
  return j == 0 ? &l->weight : j == 1 ? &l->scale_inv : &l->bias;
}

static size_t words_of(size_t bytes) { return (bytes + 7) / 8; }

/* ---- set bookkeeping ----------------------------------------------------------------- */

static ina_status_t slots_alloc(int32_t num_moe_layers, int32_t slots_per_rank,
                                ina_expert_slots_t *out) {
  ina_status_t st = INA_OK;
  const size_t n = (size_t)num_moe_layers * (size_t)slots_per_rank + 1;
  memset(out, 0, sizeof *out);
  out->num_moe_layers = num_moe_layers;
  out->slots_per_rank = slots_per_rank;
  out->w = calloc(n, sizeof *out->w);
  out->owned = calloc(n, sizeof *out->owned);
  INA_CHECK_ALLOC(out->w);
  INA_CHECK_ALLOC(out->owned);
fail:
  if (st != INA_OK) ina_expert_slots_release(out, NULL);
  return st;
}

void ina_expert_slots_release(ina_expert_slots_t *s, const ina_expert_slots_t *keep) {
  if (!s) return;
  if (s->owned)
    for (int32_t l = 0; l < s->num_moe_layers; l++)
      for (int32_t i = 0; i < s->slots_per_rank; i++) {
        void *buf = s->owned[(int64_t)l * s->slots_per_rank + i];
        int shared = 0;
        /* A buffer never changes layer, so only keep's same layer can share it. */
        if (buf && keep && l < keep->num_moe_layers)
          for (int32_t k = 0; k < keep->slots_per_rank && !shared; k++)
            shared = keep->owned[(int64_t)l * keep->slots_per_rank + k] == buf;
        if (!shared) free(buf);
      }
  free(s->w);
  free(s->owned);
  memset(s, 0, sizeof *s);
}

ina_status_t ina_expert_slots_from_model(const ina_weights_t *w, const int32_t *moe_layers,
                                         const ina_expert_placement_t *p, int32_t rank,
                                         ina_expert_slots_t *out) {
  ina_status_t st = INA_OK;
  INA_CHECK(slots_alloc(p->num_moe_layers, p->slots_per_rank, out));
  for (int32_t m = 0; m < p->num_moe_layers; m++)
    for (int32_t s = 0; s < p->slots_per_rank; s++) {
      const int32_t x = ina_expert_placement_slot(p, m, rank, s);
      if (x < 0) continue;
      INA_REQUIRE(x >= w->expert_begin && x < w->expert_end, INA_ERR_INVALID_ARGUMENT,
                  "expert slots: MoE layer %d, slot %d holds expert %d, which this rank's model "
                  "does not hold (it holds [%d, %d))",
                  m, s, x, w->expert_begin, w->expert_end);
      out->w[(int64_t)m * p->slots_per_rank + s] =
          w->layers[moe_layers[m]].experts[x - w->expert_begin];
    }
fail:
  if (st != INA_OK) ina_expert_slots_release(out, NULL);
  return st;
}

/* ---- sizes --------------------------------------------------------------------------- */

static size_t expert_data_bytes(const ina_mlp_weights_t *m) {
  size_t bytes = 0;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) bytes += ina_tensor_nbytes(part(proj((ina_mlp_weights_t *)m, i), j));
  return bytes;
}

static size_t expert_words(const ina_mlp_weights_t *m) {
  size_t words = 0;
  for (int i = 0; i < 3; i++) {
    words += LINEAR_HEAD_WORDS;
    for (int j = 0; j < 3; j++)
      words += TENSOR_HEAD_WORDS + words_of(ina_tensor_nbytes(part(proj((ina_mlp_weights_t *)m, i), j)));
  }
  return words;
}

static int slot_filled(const ina_mlp_weights_t *m) { return !ina_tensor_is_empty(&m->gate.weight); }

ina_status_t ina_expert_slots_expert_bytes(const ina_expert_slots_t *s, ina_comm_t *comm,
                                           int64_t *bytes) {
  ina_status_t st = INA_OK;
  int64_t *all = NULL;
  const int32_t L = s->num_moe_layers, n = comm ? ina_comm_size(comm) : 1;
  all = calloc((size_t)n * (size_t)L + 1, sizeof *all);
  INA_CHECK_ALLOC(all);
  for (int32_t m = 0; m < L; m++) {
    bytes[m] = 0;
    for (int32_t i = 0; i < s->slots_per_rank && !bytes[m]; i++) {
      const ina_mlp_weights_t *w = ina_expert_slots_at(s, m, i);
      if (slot_filled(w)) bytes[m] = (int64_t)expert_data_bytes(w);
    }
  }
  if (comm && L > 0) {
    INA_CHECK(ina_comm_all_gather(comm, bytes, all, (size_t)L, INA_DTYPE_I64, NULL));
    for (int32_t m = 0; m < L; m++)
      for (int32_t r = 0; r < n; r++)
        if (all[(int64_t)r * L + m] > bytes[m]) bytes[m] = all[(int64_t)r * L + m];
  }
fail:
  free(all);
  return st;
}


int64_t ina_expert_slots_incoming_bytes(const ina_expert_placement_t *from,
                                        const ina_expert_placement_t *to, int32_t rank,
                                        const int64_t *bytes) {
  int64_t total = 0;
  for (int32_t m = 0; m < to->num_moe_layers; m++)
    for (int32_t s = 0; s < to->slots_per_rank; s++) {
      const int32_t x = ina_expert_placement_slot(to, m, rank, s);
      if (x >= 0 && ina_expert_placement_find_slot(from, m, rank, x) < 0) total += bytes[m];
    }
  return total;
}

/* ---- the wire format ----------------------------------------------------------------- */

static ina_status_t pack_expert(const ina_mlp_weights_t *m, int64_t *out, size_t *at) {
  ina_status_t st = INA_OK;
  for (int i = 0; i < 3; i++) {
    ina_linear_t *l = proj((ina_mlp_weights_t *)m, i);
    out[(*at)++] = l->block_rows;
    out[(*at)++] = l->block_cols;
    for (int j = 0; j < 3; j++) {
      const ina_tensor_t *t = part(l, j);
      const size_t bytes = ina_tensor_nbytes(t);
      INA_REQUIRE(bytes == 0 || (ina_tensor_is_contiguous(t) && t->ndim <= 2), INA_ERR_INTERNAL,
                  "expert slots: an expert tensor is not a contiguous matrix");
      out[(*at)++] = t->dtype;
      out[(*at)++] = bytes ? t->ndim : 0;
      out[(*at)++] = bytes && t->ndim > 0 ? t->shape[0] : 0;
      out[(*at)++] = bytes && t->ndim > 1 ? t->shape[1] : 0;
      out[(*at)++] = (int64_t)bytes;
      if (bytes) {
        out[*at + words_of(bytes) - 1] = 0; /* padding */
        memcpy(out + *at, t->data, bytes);
      }
      *at += words_of(bytes);
    }
  }
fail:
  return st;
}

/* One expert from `words` [0, n) starting at *at into a new buffer (*buffer). */
static ina_status_t unpack_expert(const int64_t *words, size_t n, size_t *at, ina_mlp_weights_t *m,
                                  void **buffer) {
  ina_status_t st = INA_OK;
  int64_t head[3][3][TENSOR_HEAD_WORDS], blocks[3][2];
  size_t data_at[3][3], total = 0;
  *buffer = NULL;
  memset(m, 0, sizeof *m);
  /* First pass: read and check the headers, and size the buffer. */
  size_t pos = *at;
  for (int i = 0; i < 3; i++) {
    INA_REQUIRE(pos + LINEAR_HEAD_WORDS <= n, INA_ERR_FORMAT, "expert move: message truncated");
    blocks[i][0] = words[pos++];
    blocks[i][1] = words[pos++];
    INA_REQUIRE(blocks[i][0] >= 0 && blocks[i][0] <= INT32_MAX && blocks[i][1] >= 0 &&
                    blocks[i][1] <= INT32_MAX,
                INA_ERR_FORMAT, "expert move: bad block size");
    for (int j = 0; j < 3; j++) {
      INA_REQUIRE(pos + TENSOR_HEAD_WORDS <= n, INA_ERR_FORMAT, "expert move: message truncated");
      memcpy(head[i][j], words + pos, sizeof head[i][j]);
      pos += TENSOR_HEAD_WORDS;
      const int64_t *h = head[i][j];
      size_t expect = 0;
      INA_REQUIRE(h[0] >= 0 && h[0] < INA_DTYPE_COUNT && h[1] >= 0 && h[1] <= 2 && h[2] >= 0 &&
                      h[3] >= 0 && h[4] >= 0,
                  INA_ERR_FORMAT, "expert move: bad tensor header");
      if (h[4] > 0)
        INA_REQUIRE(ina_shape_nbytes((ina_dtype_t)h[0], (int)h[1], h + 2, &expect) &&
                        expect == (size_t)h[4],
                    INA_ERR_FORMAT, "expert move: tensor of %lld bytes does not match its shape",
                    (long long)h[4]);
      INA_REQUIRE(words_of((size_t)h[4]) <= n - pos, INA_ERR_FORMAT, "expert move: message truncated");
      data_at[i][j] = pos;
      pos += words_of((size_t)h[4]);
      total += ((size_t)h[4] + BUFFER_ALIGN - 1) / BUFFER_ALIGN * BUFFER_ALIGN;
    }
  }
  *buffer = aligned_alloc(BUFFER_ALIGN, total ? total : BUFFER_ALIGN);
  INA_CHECK_ALLOC(*buffer);
  /* Second pass: the tensors, each at an aligned place of the buffer. */
  uint8_t *dst = *buffer;
  for (int i = 0; i < 3; i++) {
    ina_linear_t *l = proj(m, i);
    l->block_rows = (int32_t)blocks[i][0];
    l->block_cols = (int32_t)blocks[i][1];
    for (int j = 0; j < 3; j++) {
      const int64_t *h = head[i][j];
      if (h[4] == 0) continue;
      memcpy(dst, words + data_at[i][j], (size_t)h[4]);
      *part(l, j) = ina_tensor_wrap(dst, (ina_dtype_t)h[0], (int)h[1], h + 2, INA_CPU);
      dst += ((size_t)h[4] + BUFFER_ALIGN - 1) / BUFFER_ALIGN * BUFFER_ALIGN;
    }
  }
  *at = pos;
fail:
  if (st != INA_OK) {
    free(*buffer);
    *buffer = NULL;
    memset(m, 0, sizeof *m);
  }
  return st;
}

/* ---- the move ------------------------------------------------------------------------ */

/* Visits, in the order both ends use, every new slot (dest, slot) of MoE layer m whose
 * expert x dest does not hold in `from`, with the rank that sends it. */
typedef struct transfer {
  int32_t dest, slot, expert, source;
} transfer_t;

static int32_t list_transfers(const ina_expert_placement_t *from, const ina_expert_placement_t *to,
                              int32_t m, transfer_t *out) {
  int32_t n = 0;
  for (int32_t d = 0; d < to->ep; d++)
    for (int32_t s = 0; s < to->slots_per_rank; s++) {
      const int32_t x = ina_expert_placement_slot(to, m, d, s);
      if (x < 0 || ina_expert_placement_find_slot(from, m, d, x) >= 0) continue;
      out[n++] = (transfer_t){d, s, x, ina_expert_placement_source(from, m, x)};
    }
  return n;
}

/* 1 on every rank when any rank passes bad != 0. */
static ina_status_t any_rank(ina_comm_t *comm, int bad, int *out) {
  ina_status_t st = INA_OK;
  const int32_t v = bad != 0;
  int32_t *all = NULL;
  *out = v;
  if (!comm) return INA_OK;
  /* (The sum all-reduce is for floats; integers are gathered.) */
  all = malloc((size_t)ina_comm_size(comm) * sizeof *all);
  INA_CHECK_ALLOC(all);
  INA_CHECK(ina_comm_all_gather(comm, &v, all, 1, INA_DTYPE_I32, NULL));
  for (int r = 0; r < ina_comm_size(comm); r++) *out |= all[r] != 0;
fail:
  free(all);
  return st;
}

typedef struct layer_buffers {
  size_t *send_counts, *recv_counts, *send_displs, *recv_displs, *cursor;
  int64_t *send, *recv;
  transfer_t *transfers;
} layer_buffers_t;

static void layer_buffers_free(layer_buffers_t *b) {
  free(b->send_counts);
  free(b->recv_counts);
  free(b->send_displs);
  free(b->recv_displs);
  free(b->cursor);
  free(b->send);
  free(b->recv);
  free(b->transfers);
  memset(b, 0, sizeof *b);
}

static ina_status_t another_rank_failed(int32_t m) {
  ina_error(INA_LOG_SUBSYS, "expert move: MoE layer %d: another rank failed (see its log)", m);
  return INA_ERR_OUT_OF_MEMORY;
}

/* One layer's exchange: every rank calls it for every layer, whatever failed before
 * (*local_error != INA_OK still takes part, sending and keeping nothing). Returns non-OK
 * only when the communicator failed, which ends the move everywhere. */
static ina_status_t move_layer(ina_comm_t *comm, int32_t rank, int32_t m,
                               const ina_expert_placement_t *from, const ina_expert_slots_t *have,
                               const ina_expert_placement_t *to, ina_expert_slots_t *out,
                               int64_t *bytes_received, ina_status_t *local_error) {
  ina_status_t st = INA_OK;
  const int32_t n = to->ep;
  layer_buffers_t b = {0};
  int any_failed = 0;
  /* Carried slots first: the same tensors, and the same buffer when it is owned. */
  for (int32_t s = 0; s < to->slots_per_rank && *local_error == INA_OK; s++) {
    const int32_t x = ina_expert_placement_slot(to, m, rank, s);
    const int32_t old = x < 0 ? -1 : ina_expert_placement_find_slot(from, m, rank, x);
    if (old < 0) continue;
    out->w[(int64_t)m * to->slots_per_rank + s] = *ina_expert_slots_at(have, m, old);
    out->owned[(int64_t)m * to->slots_per_rank + s] = have->owned[(int64_t)m * have->slots_per_rank + old];
  }
  b.send_counts = calloc((size_t)n, sizeof *b.send_counts);
  b.recv_counts = calloc((size_t)n, sizeof *b.recv_counts);
  b.send_displs = calloc((size_t)n, sizeof *b.send_displs);
  b.recv_displs = calloc((size_t)n, sizeof *b.recv_displs);
  b.cursor = calloc((size_t)n, sizeof *b.cursor);
  b.transfers = malloc(((size_t)n * (size_t)to->slots_per_rank + 1) * sizeof *b.transfers);
  int bad = *local_error != INA_OK || !b.send_counts || !b.recv_counts || !b.send_displs ||
            !b.recv_displs || !b.cursor || !b.transfers;
  INA_CHECK(any_rank(comm, bad, &any_failed));
  if (any_failed) {
    if (*local_error == INA_OK) *local_error = another_rank_failed(m);
    goto fail;
  }
  const int32_t count = list_transfers(from, to, m, b.transfers);
  /* What we send to each rank, in words. */
  for (int32_t t = 0; t < count; t++)
    if (b.transfers[t].source == rank) {
      const int32_t slot = ina_expert_placement_find_slot(from, m, rank, b.transfers[t].expert);
      b.send_counts[b.transfers[t].dest] += expert_words(ina_expert_slots_at(have, m, slot));
    }
  if (comm) {
    size_t *ones = b.cursor; /* 1 word per peer, packed */
    for (int32_t r = 0; r < n; r++) ones[r] = 1;
    INA_CHECK(ina_comm_all_to_all_v(comm, b.send_counts, ones, NULL, b.recv_counts, ones, NULL,
                                    INA_DTYPE_I64, NULL));
  }
  size_t send_total = 0, recv_total = 0;
  for (int32_t r = 0; r < n; r++) {
    b.send_displs[r] = send_total;
    b.recv_displs[r] = recv_total;
    send_total += b.send_counts[r];
    recv_total += b.recv_counts[r];
  }
  b.send = malloc((send_total + 1) * sizeof *b.send);
  b.recv = malloc((recv_total + 1) * sizeof *b.recv);
  bad = !b.send || !b.recv;
  if (b.send) {
    memcpy(b.cursor, b.send_displs, (size_t)n * sizeof *b.cursor);
    for (int32_t t = 0; t < count && !bad; t++) {
      const transfer_t *tr = &b.transfers[t];
      if (tr->source != rank) continue;
      const int32_t slot = ina_expert_placement_find_slot(from, m, rank, tr->expert);
      const ina_mlp_weights_t *w = ina_expert_slots_at(have, m, slot);
      if (pack_expert(w, b.send, &b.cursor[tr->dest]) != INA_OK) bad = 1;
    }
  }
  INA_CHECK(any_rank(comm, bad, &any_failed));
  if (any_failed) {
    if (*local_error == INA_OK && bad) {
      ina_error(INA_LOG_SUBSYS, "expert move: MoE layer %d: no memory for %zu + %zu words of "
                "transfer buffers", m, send_total, recv_total);
      *local_error = INA_ERR_OUT_OF_MEMORY;
    }
    if (*local_error == INA_OK) *local_error = another_rank_failed(m);
    goto fail;
  }
  if (comm)
    INA_CHECK(ina_comm_all_to_all_v(comm, b.send, b.send_counts, b.send_displs, b.recv, b.recv_counts,
                                    b.recv_displs, INA_DTYPE_I64, NULL));
  else
    memcpy(b.recv, b.send, send_total * sizeof *b.send);
  /* Ours, from each source in the order it packed them. */
  memcpy(b.cursor, b.recv_displs, (size_t)n * sizeof *b.cursor);
  for (int32_t t = 0; t < count; t++) {
    const transfer_t *tr = &b.transfers[t];
    if (tr->dest != rank || *local_error != INA_OK) continue;
    const int64_t at = (int64_t)m * to->slots_per_rank + tr->slot;
    const size_t end = b.recv_displs[tr->source] + b.recv_counts[tr->source];
    *local_error = unpack_expert(b.recv, end, &b.cursor[tr->source], &out->w[at], &out->owned[at]);
    if (*local_error == INA_OK) *bytes_received += (int64_t)expert_data_bytes(&out->w[at]);
  }
fail:
  layer_buffers_free(&b);
  return st;
}

ina_status_t ina_expert_slots_move(ina_comm_t *comm, int32_t rank, const ina_expert_placement_t *from,
                                   const ina_expert_slots_t *have, const ina_expert_placement_t *to,
                                   ina_expert_slots_t *out, int64_t *bytes_received) {
  ina_status_t st = INA_OK, local = INA_OK;
  INA_REQUIRE(from->ep == to->ep && from->num_moe_layers == to->num_moe_layers &&
                  from->num_experts == to->num_experts,
              INA_ERR_INVALID_ARGUMENT, "expert move: the placements differ in shape");
  local = slots_alloc(to->num_moe_layers, to->slots_per_rank, out);
  for (int32_t m = 0; m < to->num_moe_layers; m++)
    INA_CHECK(move_layer(comm, rank, m, from, have, to, out, bytes_received, &local));
  st = local;
fail:
  if (st != INA_OK) ina_expert_slots_release(out, have);
  return st;
}
