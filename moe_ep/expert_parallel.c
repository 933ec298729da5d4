/* Expert parallelism of the CPU engine (moe_ep/expert_parallel.h). */
#define INA_LOG_SUBSYS "model"
#include "moe_ep/expert_parallel.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* The placement where each rank holds the range it was loaded with, from the ranges of
 * every rank (first_expert[r] .. first_expert[r + 1]). */
static ina_status_t placement_from_ranges(const int32_t *first_expert, int32_t nranks,
                                          int32_t num_moe_layers, int32_t num_experts,
                                          ina_expert_placement_t *out) {
  ina_status_t st = INA_OK;
  int32_t slots = 1;
  for (int32_t r = 0; r < nranks; r++)
    if (first_expert[r + 1] - first_expert[r] > slots) slots = first_expert[r + 1] - first_expert[r];
  INA_CHECK(ina_expert_placement_init(nranks, slots, num_moe_layers, num_experts, out));
  for (int32_t l = 0; l < num_moe_layers; l++)
    for (int32_t r = 0; r < nranks; r++)
      for (int32_t x = first_expert[r]; x < first_expert[r + 1]; x++)
        out->slot_expert[ina_expert_placement_index(out, l, r, x - first_expert[r])] = x;
fail:
  return st;
}

ina_status_t ina_ep_group_init(ina_comm_t *comm, int32_t expert_begin, int32_t expert_end,
                               int32_t num_experts, int32_t num_moe_layers, ina_ep_group_t *out) {
  ina_status_t st = INA_OK;
  int32_t *ranges = NULL, *first_expert = NULL;
  ina_expert_placement_t start = {0};
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "expert parallelism: out is NULL");
  memset(out, 0, sizeof *out);
  out->comm = comm;
  out->nranks = comm ? ina_comm_size(comm) : 1;
  out->rank = comm ? ina_comm_rank(comm) : 0;
  ranges = malloc(2 * (size_t)out->nranks * sizeof *ranges);
  first_expert = malloc(((size_t)out->nranks + 1) * sizeof *first_expert);
  INA_CHECK_ALLOC(ranges);
  INA_CHECK_ALLOC(first_expert);
  {
    const int32_t mine[2] = {expert_begin, expert_end};
    if (comm) INA_CHECK(ina_comm_all_gather(comm, mine, ranges, 2, INA_DTYPE_I32, NULL));
    else memcpy(ranges, mine, sizeof mine);
  }
  /* Every rank sees the same table, so every rank reaches the same verdict. */
  first_expert[0] = 0;
  for (int32_t r = 0; r < out->nranks; r++) {
    const int32_t begin = ranges[2 * r], end = ranges[2 * r + 1];
    INA_REQUIRE(begin == first_expert[r] && end >= begin && end <= num_experts,
                INA_ERR_INVALID_ARGUMENT,
                "expert parallelism: rank %d of %d holds experts [%d, %d), but the ranks' "
                "ranges must tile [0, %d) in rank order (this one should start at %d)",
                r, out->nranks, begin, end, num_experts, first_expert[r]);
    first_expert[r + 1] = end;
  }
  INA_REQUIRE(first_expert[out->nranks] == num_experts, INA_ERR_INVALID_ARGUMENT,
              "expert parallelism: the %d ranks hold experts [0, %d) of %d; every expert needs "
              "a rank",
              out->nranks, first_expert[out->nranks], num_experts);
  INA_CHECK(placement_from_ranges(first_expert, out->nranks, num_moe_layers, num_experts, &start));
  {
    ina_ep_group_t tables;
    INA_CHECK(ina_ep_group_prepare(out, &start, &tables));
    ina_ep_group_swap(out, &tables);
  }
fail:
  free(ranges);
  free(first_expert);
  ina_expert_placement_free(&start);
  if (st != INA_OK) ina_ep_group_free(out);
  return st;
}

void ina_ep_group_free(ina_ep_group_t *g) {
  if (!g) return;
  ina_expert_placement_free(&g->placement);
  free(g->replica_first);
  free(g->replica_rank);
  free(g->replica_slot);
  g->replica_first = g->replica_rank = g->replica_slot = NULL;
}

ina_status_t ina_ep_group_prepare(const ina_ep_group_t *g, const ina_expert_placement_t *p,
                                  ina_ep_group_t *out) {
  ina_status_t st = INA_OK;
  memset(out, 0, sizeof *out);
  out->comm = g->comm;
  out->rank = g->rank;
  out->nranks = g->nranks;
  INA_REQUIRE(p->ep == g->nranks, INA_ERR_INVALID_ARGUMENT,
              "expert parallelism: a placement over %d ranks for a group of %d", p->ep, g->nranks);
  INA_CHECK(ina_expert_placement_validate(p));
  INA_CHECK(ina_expert_placement_copy(p, &out->placement));
  const size_t E = (size_t)p->num_experts, L = (size_t)p->num_moe_layers;
  const size_t per_layer = (size_t)p->ep * (size_t)p->slots_per_rank;
  out->replica_first = calloc(L * (E + 1) + 1, sizeof *out->replica_first);
  out->replica_rank = malloc((L * per_layer + 1) * sizeof *out->replica_rank);
  out->replica_slot = malloc((L * per_layer + 1) * sizeof *out->replica_slot);
  INA_CHECK_ALLOC(out->replica_first);
  INA_CHECK_ALLOC(out->replica_rank);
  INA_CHECK_ALLOC(out->replica_slot);
  for (size_t l = 0; l < L; l++) {
    int32_t *first = out->replica_first + l * (E + 1);
    int32_t *rank = out->replica_rank + l * per_layer, *slot = out->replica_slot + l * per_layer;
    const int32_t *map = p->slot_expert + l * per_layer;
    /* Counting sort of the filled slots by expert; (rank, slot) order is map order. */
    for (size_t i = 0; i < per_layer; i++)
      if (map[i] >= 0) first[map[i] + 1]++;
    for (size_t x = 0; x < E; x++) first[x + 1] += first[x];
    for (size_t i = 0; i < per_layer; i++) {
      if (map[i] < 0) continue;
      /* first[x] walks forward as replicas are placed and is restored below. */
      const int32_t at = first[map[i]]++;
      rank[at] = (int32_t)(i / (size_t)p->slots_per_rank);
      slot[at] = (int32_t)(i % (size_t)p->slots_per_rank);
    }
    for (size_t x = E; x > 0; x--) first[x] = first[x - 1];
    first[0] = 0;
  }
fail:
  if (st != INA_OK) ina_ep_group_free(out);
  return st;
}

void ina_ep_group_swap(ina_ep_group_t *a, ina_ep_group_t *b) {
  const ina_ep_group_t t = *a;
  a->placement = b->placement;
  a->replica_first = b->replica_first;
  a->replica_rank = b->replica_rank;
  a->replica_slot = b->replica_slot;
  b->placement = t.placement;
  b->replica_first = t.replica_first;
  b->replica_rank = t.replica_rank;
  b->replica_slot = t.replica_slot;
}

ina_status_t ina_ep_walk_pieces(const ina_ep_group_t *g, int32_t layer, const int64_t *pair_first,
                                ina_status_t (*visit)(const ina_ep_piece_t *piece, void *arg),
                                void *arg) {
  ina_status_t st = INA_OK;
  const int32_t E = g->placement.num_experts;
  const size_t per_layer = (size_t)g->placement.ep * (size_t)g->placement.slots_per_rank;
  const int32_t *first = g->replica_first + (size_t)layer * ((size_t)E + 1);
  const int32_t *rank = g->replica_rank + (size_t)layer * per_layer;
  const int32_t *slot = g->replica_slot + (size_t)layer * per_layer;
  for (int32_t x = 0; x < E; x++) {
    const int64_t begin = pair_first[x], n = pair_first[x + 1] - begin;
    const int64_t R = first[x + 1] - first[x];
    for (int64_t j = 0; j < R; j++) {
      const ina_ep_piece_t piece = {rank[first[x] + j], slot[first[x] + j], x,
                                    begin + n * j / R, begin + n * (j + 1) / R};
      if (piece.pair_end > piece.pair_begin) INA_CHECK(visit(&piece, arg));
    }
  }
fail:
  return st;
}

/* ---- sharing the rows ---------------------------------------------------------------- */

typedef struct share_job {
  int32_t rank;    /* pieces of this rank only; -1 all */
  int64_t hidden;
  size_t *counts;  /* [nranks]: floats each rank contributes */
  float *y;        /* the layer's rows */
  float *packed;   /* rows in piece order, rank by rank */
  size_t *cursor;  /* [nranks]: where the next piece of each rank goes in packed */
  int unpack;      /* 0: y -> packed (own pieces); 1: packed -> y (every other piece) */
} share_job_t;

static ina_status_t count_piece(const ina_ep_piece_t *piece, void *arg) {
  share_job_t *j = arg;
  j->counts[piece->rank] += (size_t)((piece->pair_end - piece->pair_begin) * j->hidden);
  return INA_OK;
}

static ina_status_t move_piece(const ina_ep_piece_t *piece, void *arg) {
  share_job_t *j = arg;
  const size_t n = (size_t)((piece->pair_end - piece->pair_begin) * j->hidden);
  float *rows = j->y + piece->pair_begin * j->hidden;
  float *at = j->packed + j->cursor[piece->rank];
  j->cursor[piece->rank] += n;
  if (!j->unpack && piece->rank == j->rank) memcpy(at, rows, n * sizeof *rows);
  if (j->unpack && piece->rank != j->rank) memcpy(rows, at, n * sizeof *rows);
  return INA_OK;
}

ina_status_t ina_ep_share_outputs(const ina_ep_group_t *g, int32_t layer, const int64_t *pair_first,
                                  int64_t hidden, float *y) {
  ina_status_t st = INA_OK;
  size_t *counts = NULL, *displs = NULL, *send_counts = NULL, *send_displs = NULL, *cursor = NULL;
  float *packed = NULL, *mine = NULL;
  if (!g->comm || g->nranks == 1) return INA_OK;
  const size_t n = (size_t)g->nranks;
  counts = calloc(n, sizeof *counts);
  displs = calloc(n, sizeof *displs);
  send_counts = calloc(n, sizeof *send_counts);
  send_displs = calloc(n, sizeof *send_displs); /* all 0: the same block to every rank */
  cursor = calloc(n, sizeof *cursor);
  INA_CHECK_ALLOC(counts);
  INA_CHECK_ALLOC(displs);
  INA_CHECK_ALLOC(send_counts);
  INA_CHECK_ALLOC(send_displs);
  INA_CHECK_ALLOC(cursor);
  share_job_t job = {g->rank, hidden, counts, y, NULL, cursor, 0};
  INA_CHECK(ina_ep_walk_pieces(g, layer, pair_first, count_piece, &job));
  size_t total = 0;
  for (size_t r = 0; r < n; r++) {
    displs[r] = total;
    total += counts[r];
  }
  packed = malloc((total ? total : 1) * sizeof *packed);
  INA_CHECK_ALLOC(packed);
  /* Our rows, packed, go to every rank (an all-gather with uneven blocks). */
  memcpy(cursor, displs, n * sizeof *cursor);
  job.packed = packed;
  INA_CHECK(ina_ep_walk_pieces(g, layer, pair_first, move_piece, &job));
  const size_t own = counts[g->rank];
  mine = malloc((own ? own : 1) * sizeof *mine);
  INA_CHECK_ALLOC(mine);
  if (own) memcpy(mine, packed + displs[g->rank], own * sizeof *mine);
  for (size_t r = 0; r < n; r++) send_counts[r] = own;
  INA_CHECK(ina_comm_all_to_all_v(g->comm, mine, send_counts, send_displs, packed, counts, displs,
                                  INA_DTYPE_F32, NULL));
  memcpy(cursor, displs, n * sizeof *cursor);
  job.unpack = 1;
  INA_CHECK(ina_ep_walk_pieces(g, layer, pair_first, move_piece, &job));
fail:
  free(counts);
  free(displs);
  free(send_counts);
  free(send_displs);
  free(cursor);
  free(packed);
  free(mine);
  return st;
}
