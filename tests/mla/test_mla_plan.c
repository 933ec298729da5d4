/* The MLA scheduler (ina_mla_plan, mla/mla_schedule.h) without a GPU: plans into a host
 * workspace only (device_ws = NULL) and checks the schedule's invariants on fresh random
 * batches and fixed edge cases:
 *   - every KV position of every (request, row tile) unit is covered by exactly one chunk,
 *     chunks start on block boundaries, and only the causal range of the tile is covered;
 *   - per-CTA lists are consistent (indptr monotone, every item of a CTA in its range);
 *   - split units (and only they) have a merge entry and distinct partial slots, in order;
 *   - groups: buckets with >= 64 query rows per request (and 512 + 64 dims) group 4 row
 *     tiles; each chunk of a group is one run of items in one CTA's list, led by the item
 *     carrying the count, holding exactly the group's tiles that still have positions at
 *     the chunk's start, in tile order, with the same start; ungrouped plans have runs of 1;
 *   - balance: every CTA's cost (KV positions + a fixed cost per chunk, once per group
 *     chunk) stays within one block and one chunk cost of the even share;
 *   - one 32k request among 127 of 64 positions is spread over many CTAs;
 *   - the grid and the workspace sizes depend on the bucket only, not on the lengths;
 *   - invalid inputs fail with INA_ERR_INVALID_ARGUMENT / INA_ERR_UNSUPPORTED and a
 *     message that names the offending request or value. */
#include <time.h>

#include "tests/test_util.h"

#include "core/cuda.h"
#include "core/log.h"
#include "mla/mla.h"
#include "mla/mla_schedule.h"

typedef struct schedule_view {
  ina_mla_sched_layout_t l;
  const ina_mla_sched_header_t *header;
  const int32_t *cta_indptr;
  const ina_mla_sched_request_t *requests;
  const ina_mla_sched_item_t *items;
  const ina_mla_sched_merge_t *merges;
} schedule_view_t;

static ina_mla_plan_params_t params(int32_t batch, int32_t max_batch, int32_t max_q_len, int32_t heads,
                                    const int32_t *qo_indptr, const int32_t *kv_len, int32_t num_sms) {
  ina_mla_plan_params_t p = INA_MLA_PLAN_PARAMS_INIT;
  p.batch = batch;
  p.max_batch = max_batch;
  p.max_q_len = max_q_len;
  p.qo_indptr = qo_indptr;
  p.kv_len = kv_len;
  p.num_heads = heads;
  p.num_sms = num_sms;
  return p;
}

static schedule_view_t view(const ina_mla_plan_params_t *p, const void *ws, int32_t num_ctas) {
  schedule_view_t v;
  const char *b = ws;
  memset(&v, 0, sizeof v);
  CHECK_OK(ina_mla_sched_layout(p->max_batch, p->max_q_len, p->num_heads, p->kv_lora_rank, p->rope_dim, num_ctas,
                                &v.l));
  v.header = (const ina_mla_sched_header_t *)(b + v.l.header);
  v.cta_indptr = (const int32_t *)(b + v.l.cta_indptr);
  v.requests = (const ina_mla_sched_request_t *)(b + v.l.requests);
  v.items = (const ina_mla_sched_item_t *)(b + v.l.items);
  v.merges = (const ina_mla_sched_merge_t *)(b + v.l.merges);
  return v;
}

/* Causal KV end of a tile, computed here from first principles. */
static int32_t tile_end(int32_t tile, int32_t heads, int32_t q_len, int32_t kv_len) {
  int64_t last_row = (int64_t)(tile + 1) * 16 - 1;
  if (last_row >= (int64_t)q_len * heads) last_row = (int64_t)q_len * heads - 1;
  return kv_len - q_len + (int32_t)(last_row / heads) + 1;
}

/* Row tiles per group the plan must use: 4 for 512 + 64 with 64+ query rows per request. */
static int32_t expected_group(const ina_mla_plan_params_t *p) {
  return p->kv_lora_rank == 512 && p->rope_dim == 64 && (int64_t)p->max_q_len * p->num_heads >= 64 ? 4 : 1;
}

typedef struct stats {
  double max_over_share; /* max CTA cost / (T / N) */
  int32_t items, merges, max_splits;
} stats_t;

/* Plans `p` and checks every invariant; returns what the report prints. */
static stats_t plan_and_check(const ina_mla_plan_params_t *p, const char *what) {
  stats_t out = {0, 0, 0, 0};
  size_t host_bytes = 0, device_bytes = 0;
  ina_mla_plan_info_t info;
  CHECK_OK(ina_mla_workspace_size(p, &host_bytes, &device_bytes));
  void *ws = malloc(host_bytes);
  CHECK(ws != NULL);
  if (!ws) return out;
  memset(ws, 0xA5, host_bytes); /* stale bytes: the plan must not rely on zeroed memory */
  ina_status_t st = ina_mla_plan(p, ws, NULL, NULL, &info);
  CHECKF(st == INA_OK, "%s: plan failed: %s", what, ina_last_error());
  if (st != INA_OK) {
    free(ws);
    return out;
  }
  const int32_t N = info.num_ctas, H = p->num_heads;
  CHECKF(N == p->num_sms * INA_MLA_CTAS_PER_SM, "%s: %d CTAs for %d SMs", what, N, p->num_sms);
  CHECK(info.device_bytes == device_bytes && info.batch == p->batch && info.num_heads == H);
  schedule_view_t v = view(p, ws, N);
  CHECK(v.l.schedule_bytes == host_bytes && v.l.device_bytes == device_bytes);
  const ina_mla_sched_header_t *hd = v.header;
  const int32_t tokens = p->batch > 0 ? p->qo_indptr[p->batch] : 0;
  CHECK(hd->batch == p->batch && hd->total_tokens == tokens && info.total_tokens == tokens);
  CHECK(hd->num_items >= 0 && hd->num_items <= v.l.max_items);
  CHECK(hd->num_merges >= 0 && hd->num_merges <= v.l.max_merges);

  /* CTA lists */
  CHECK(v.cta_indptr[0] == 0 && v.cta_indptr[N] == hd->num_items);
  for (int32_t c = 0; c < N; c++) CHECKF(v.cta_indptr[c] <= v.cta_indptr[c + 1], "%s: cta_indptr decreases at %d", what, c);

  /* Requests */
  for (int32_t b = 0; b < p->batch; b++)
    CHECK(v.requests[b].q_begin == p->qo_indptr[b] &&
          v.requests[b].q_len == p->qo_indptr[b + 1] - p->qo_indptr[b] && v.requests[b].kv_len == p->kv_len[b]);

  /* Coverage: each unit's chunks, taken in schedule order, tile [0, tile_end) exactly. */
  int32_t max_tiles = 0;
  for (int32_t b = 0; b < p->batch; b++) {
    const int32_t t = ina_mla_tiles(p->qo_indptr[b + 1] - p->qo_indptr[b], H);
    if (t > max_tiles) max_tiles = t;
  }
  const size_t units = (size_t)p->batch * (size_t)(max_tiles > 0 ? max_tiles : 1);
  int32_t *next = calloc(units, sizeof(int32_t));   /* next expected kv_begin */
  int32_t *splits = calloc(units, sizeof(int32_t)); /* chunks seen */
  int32_t *first_slot = malloc(units * sizeof(int32_t));
  uint8_t *slot_used = calloc((size_t)v.l.max_slots, 1);
  CHECK(next && splits && first_slot && slot_used);
  if (!next || !splits || !first_slot || !slot_used) goto done;
  const int32_t G = expected_group(p);
  CHECKF(v.l.group_tiles == G, "%s: %d tiles per group, expected %d", what, v.l.group_tiles, G);
  int64_t total = 0; /* a group costs what its last tile does */
  for (int32_t b = 0; b < p->batch; b++) {
    const int32_t q = p->qo_indptr[b + 1] - p->qo_indptr[b], tiles = ina_mla_tiles(q, H);
    for (int32_t t = 0; t < tiles; t++)
      if (t % G == G - 1 || t == tiles - 1) total += INA_MLA_CHUNK_COST + tile_end(t, H, q, p->kv_len[b]);
  }
  const double share = (double)total / N;
  for (int32_t c = 0; c < N; c++) {
    int64_t cost = 0;
    int32_t run_end = v.cta_indptr[c]; /* end of the current group chunk's run of items */
    for (int32_t i = v.cta_indptr[c]; i < v.cta_indptr[c + 1]; i++) {
      const ina_mla_sched_item_t *it = &v.items[i];
      if (i == run_end) { /* a run's lead: check the run and charge its cost once */
        const int32_t n = it->group_items;
        CHECKF(n >= 1 && n <= G && i + n <= v.cta_indptr[c + 1], "%s: item %d leads a run of %d items (CTA %d "
               "ends at %d, groups of %d)", what, i, n, c, v.cta_indptr[c + 1], G);
        if (n < 1 || n > G || i + n > v.cta_indptr[c + 1]) break;
        run_end = i + n;
        const ina_mla_sched_item_t *last = &v.items[i + n - 1];
        for (int32_t k = 1; k < n; k++) {
          const ina_mla_sched_item_t *f = &v.items[i + k];
          CHECKF(f->group_items == 0 && f->request == it->request && f->tile == it->tile + k &&
                     f->kv_begin == it->kv_begin && f->kv_end >= v.items[i + k - 1].kv_end,
                 "%s: item %d is not member %d of the run led by item %d", what, i + k, k, i);
        }
        if (it->request >= 0 && it->request < p->batch) {
          const int32_t q = p->qo_indptr[it->request + 1] - p->qo_indptr[it->request], tiles = ina_mla_tiles(q, H);
          const int32_t kv = p->kv_len[it->request], first = it->tile - it->tile % G;
          const int32_t group_last = first + G - 1 < tiles - 1 ? first + G - 1 : tiles - 1;
          /* exactly the group's tiles that still have positions at the chunk's start */
          CHECKF(last->tile == group_last && (it->tile == first || tile_end(it->tile - 1, H, q, kv) <= it->kv_begin),
                 "%s: run at item %d holds tiles %d..%d of group %d..%d at position %d", what, i, it->tile,
                 last->tile, first, group_last, it->kv_begin);
        }
        cost += INA_MLA_CHUNK_COST + (last->kv_end - it->kv_begin);
      }
      CHECKF(it->request >= 0 && it->request < p->batch, "%s: item %d request %d", what, i, it->request);
      if (it->request < 0 || it->request >= p->batch) continue;
      const int32_t q = p->qo_indptr[it->request + 1] - p->qo_indptr[it->request];
      CHECKF(it->tile >= 0 && it->tile < ina_mla_tiles(q, H), "%s: item %d tile %d", what, i, it->tile);
      if (it->tile < 0 || it->tile >= ina_mla_tiles(q, H)) continue;
      const size_t u = (size_t)it->request * (size_t)max_tiles + (size_t)it->tile;
      const int32_t end = tile_end(it->tile, H, q, p->kv_len[it->request]);
      CHECKF(it->kv_begin == next[u], "%s: unit (%d, %d): chunk starts at %d, expected %d", what,
             it->request, it->tile, it->kv_begin, next[u]);
      CHECKF(it->kv_begin % INA_MLA_KV_BLOCK == 0, "%s: chunk begins at %d, not a block boundary", what, it->kv_begin);
      CHECKF(it->kv_end > it->kv_begin && it->kv_end <= end, "%s: unit (%d, %d): chunk [%d, %d) of [0, %d)",
             what, it->request, it->tile, it->kv_begin, it->kv_end, end);
      if (splits[u] == 0) first_slot[u] = it->slot;
      else CHECKF(it->slot == first_slot[u] + splits[u], "%s: unit (%d, %d): slots not consecutive", what,
                  it->request, it->tile);
      if (it->slot >= 0 && it->slot < v.l.max_slots) {
        CHECKF(!slot_used[it->slot], "%s: slot %d used twice", what, it->slot);
        slot_used[it->slot] = 1;
      }
      CHECK(it->slot >= -1 && it->slot < v.l.max_slots);
      next[u] = it->kv_end;
      splits[u]++;
    }
    const double bound = share + 1 + INA_MLA_KV_BLOCK + INA_MLA_CHUNK_COST;
    CHECKF(cost <= bound, "%s: CTA %d costs %lld, more than the even share %.1f + a block + a chunk", what, c,
           (long long)cost, share);
    if (share > 0 && cost / share > out.max_over_share) out.max_over_share = cost / share;
  }
  int32_t split_units = 0;
  for (int32_t b = 0; b < p->batch; b++) {
    const int32_t q = p->qo_indptr[b + 1] - p->qo_indptr[b];
    for (int32_t t = 0; t < ina_mla_tiles(q, H); t++) {
      const size_t u = (size_t)b * (size_t)max_tiles + (size_t)t;
      CHECKF(next[u] == tile_end(t, H, q, p->kv_len[b]), "%s: unit (%d, %d) covered up to %d of %d", what, b, t,
             next[u], tile_end(t, H, q, p->kv_len[b]));
      if (splits[u] > out.max_splits) out.max_splits = splits[u];
      if (splits[u] == 1) CHECKF(first_slot[u] == -1, "%s: unsplit unit (%d, %d) has slot %d", what, b, t, first_slot[u]);
      if (splits[u] > 1) {
        CHECKF(first_slot[u] >= 0, "%s: split unit (%d, %d) writes no partials", what, b, t);
        split_units++;
      }
    }
  }
  CHECKF(hd->num_merges == split_units, "%s: %d merges for %d split units", what, hd->num_merges, split_units);
  for (int32_t m = 0; m < hd->num_merges; m++) {
    const ina_mla_sched_merge_t *mg = &v.merges[m];
    const int ok = mg->request >= 0 && mg->request < p->batch && mg->tile >= 0 && mg->tile < max_tiles;
    CHECKF(ok, "%s: merge %d names unit (%d, %d)", what, m, mg->request, mg->tile);
    if (!ok) continue;
    const size_t u = (size_t)mg->request * (size_t)max_tiles + (size_t)mg->tile;
    CHECKF(mg->num_splits == splits[u] && mg->first_slot == first_slot[u], "%s: merge %d disagrees with its items",
           what, m);
  }
  CHECK(info.num_splits_max == out.max_splits);
  out.items = hd->num_items;
  out.merges = hd->num_merges;
done:
  free(next);
  free(splits);
  free(first_slot);
  free(slot_used);
  free(ws);
  return out;
}

typedef enum { DIST_UNIFORM, DIST_SKEWED, DIST_SHORT, DIST_EQUAL } dist_t;

static void random_batch(test_rng_t *rng, int32_t batch, int32_t max_q, dist_t dist, int32_t kv_max,
                         int32_t *qo_indptr, int32_t *kv_len) {
  const int32_t long_one = batch > 0 ? (int32_t)test_rng_int(rng, 0, batch - 1) : 0;
  qo_indptr[0] = 0;
  for (int32_t b = 0; b < batch; b++) {
    int32_t q = (int32_t)test_rng_int(rng, 0, max_q);
    int32_t kv = 0;
    switch (dist) {
    case DIST_UNIFORM: kv = (int32_t)test_rng_int(rng, q, kv_max > q ? kv_max : q); break;
    case DIST_SKEWED: kv = b == long_one ? kv_max : (int32_t)test_rng_int(rng, q, 64 > q ? 64 : q); break;
    case DIST_SHORT: kv = q + (int32_t)test_rng_int(rng, 0, 5); break;
    case DIST_EQUAL: kv = kv_max; break;
    }
    qo_indptr[b + 1] = qo_indptr[b] + q;
    kv_len[b] = kv;
  }
}

static void random_plans(test_rng_t *rng) {
  static const int32_t heads[] = {1, 3, 16, 128};
  static const int32_t sms[] = {1, 7, 132, 264};
  static const int32_t max_qs[] = {1, 2, 16, 64};
  int32_t qo[257], kv[256];
  double worst = 0;
  for (int trial = 0; trial < 300; trial++) {
    const int32_t max_batch = (int32_t)test_rng_int(rng, 1, 256);
    const int32_t batch = (int32_t)test_rng_int(rng, 0, max_batch);
    const int32_t H = heads[test_rng_int(rng, 0, 3)], max_q = max_qs[test_rng_int(rng, 0, 3)];
    const dist_t dist = (dist_t)test_rng_int(rng, 0, 3);
    const int32_t kv_max = (int32_t)test_rng_int(rng, max_q, 40000);
    random_batch(rng, batch, max_q, dist, kv_max, qo, kv);
    ina_mla_plan_params_t p = params(batch, max_batch, max_q, H, qo, kv, sms[test_rng_int(rng, 0, 3)]);
    if (test_rng_int(rng, 0, 3) == 0) p.page_size = (int32_t)test_rng_int(rng, 1, 128);
    char what[128];
    snprintf(what, sizeof what, "trial %d (batch %d/%d, heads %d, max_q %d, dist %d, kv_max %d, SMs %d)", trial,
             batch, max_batch, H, max_q, (int)dist, kv_max, p.num_sms);
    stats_t s = plan_and_check(&p, what);
    /* With enough work per CTA the worst CTA stays near the even share. */
    if (s.max_over_share > worst && batch > 0 && qo[batch] * H > 16 * p.num_sms) worst = s.max_over_share;
  }
  printf("  300 random plans: worst CTA / even share %.3f (for plans with work for every CTA)\n", worst);
}

/* One 32k request among 127 of 64 positions, 16 heads, decode, 132 SMs. */
static void skewed_case(void) {
  int32_t qo[129], kv[128];
  for (int32_t b = 0; b < 128; b++) {
    qo[b] = b;
    kv[b] = b == 37 ? 32768 : 64;
  }
  qo[128] = 128;
  ina_mla_plan_params_t p = params(128, 128, 1, 16, qo, kv, 132);
  stats_t s = plan_and_check(&p, "32k among 127 x 64");
  CHECKF(s.max_splits >= 64, "the 32k request is cut into only %d chunks", s.max_splits);
  CHECKF(s.max_over_share < 1.5, "worst CTA carries %.2f x the even share", s.max_over_share);
  printf("  32k among 127 x 64: %d items, %d merges, 32k request in %d chunks, worst CTA %.3f x share\n",
         s.items, s.merges, s.max_splits, s.max_over_share);
}

/* Bucket-only sizes: same grid and workspace for any lengths, any batch up to max. */
static void bucket_independence(test_rng_t *rng) {
  int32_t qo[65], kv[64];
  size_t host0 = 0, dev0 = 0;
  int32_t ctas0 = -1;
  for (int trial = 0; trial < 20; trial++) {
    const int32_t batch = (int32_t)test_rng_int(rng, 0, 64);
    random_batch(rng, batch, 4, (dist_t)test_rng_int(rng, 0, 3), 20000, qo, kv);
    ina_mla_plan_params_t p = params(batch, 64, 4, 16, qo, kv, 132);
    size_t host = 0, dev = 0;
    ina_mla_plan_info_t info;
    CHECK_OK(ina_mla_workspace_size(&p, &host, &dev));
    void *ws = malloc(host);
    CHECK(ws != NULL);
    if (!ws) return;
    CHECK_OK(ina_mla_plan(&p, ws, NULL, NULL, &info));
    free(ws);
    if (trial == 0) {
      host0 = host;
      dev0 = dev;
      ctas0 = info.num_ctas;
    }
    CHECK(host == host0 && dev == dev0 && info.num_ctas == ctas0 && info.max_batch == 64 && info.max_q_len == 4);
  }
}

/* Fixed edge cases: empty batch, q_len 0 requests, kv_len == q_len, one position. */
static void edge_cases(void) {
  int32_t qo[5] = {0, 0, 3, 3, 4}, kv[4] = {5, 3, 0, 1};
  ina_mla_plan_params_t p = params(4, 4, 3, 16, qo, kv, 132);
  stats_t s = plan_and_check(&p, "q_len 0 / kv_len == q_len / one position");
  CHECK(s.items >= 4); /* request 1: 3 tiles; request 3: 1 tile */
  p = params(0, 4, 3, 16, qo, kv, 132);
  s = plan_and_check(&p, "empty batch");
  CHECK(s.items == 0 && s.merges == 0);
  /* Long prefill chunk: 1000 query tokens, 128 heads, on one SM. */
  int32_t qo2[2] = {0, 1000}, kv2[1] = {1500};
  p = params(1, 1, 1000, 128, qo2, kv2, 1);
  s = plan_and_check(&p, "1000-token chunk, 128 heads, 1 SM");
  /* 8000 units in 2000 groups of 4 tiles; each CTA boundary cuts at most one group: at
   * most 4 more chunks and 4 split units */
  const int32_t cuts = 4 * (INA_MLA_CTAS_PER_SM - 1);
  CHECK(s.items >= 8000 && s.items <= 8000 + cuts && s.merges <= cuts);
  /* 4096 query tokens of 127 heads: tile ends straddle tokens at every remainder, up
   * to row 520191 (the plan divides rows by the head count with a reciprocal) */
  int32_t qo4[3] = {0, 4096, 4097}, kv4[2] = {5000, 3};
  p = params(2, 2, 4096, 127, qo4, kv4, 3);
  s = plan_and_check(&p, "4096-token chunk, 127 heads, 3 SMs");
  CHECK(s.items >= 32512 + 8); /* request 1: one token, 8 tiles */
  /* 16 heads with 4 query tokens: 64 rows, one group of 4 causal tiles per request */
  int32_t qo3[4] = {0, 4, 8, 11}, kv3[3] = {300, 4, 129};
  p = params(3, 3, 4, 16, qo3, kv3, 2);
  s = plan_and_check(&p, "MTP 16 heads x 4 tokens, 2 SMs");
  /* 8 heads x 4 tokens: 32 rows, not grouped */
  p = params(3, 3, 4, 8, qo3, kv3, 2);
  s = plan_and_check(&p, "8 heads x 4 tokens, 2 SMs");
}

/* Groups that end exactly on a CTA boundary, and groups of equal ends cut into many
 * chunks: decode, 128 heads (two groups of 4 tiles per request), one SM (2 CTAs). Two
 * requests of equal length fill CTA 0 with their first groups to the last position (the
 * next CTA must start there, not one group later), their second groups fill CTA 1. */
static void boundary_cases(void) {
  int32_t qo[3] = {0, 1, 2}, kv[2] = {1000, 1000};
  ina_mla_plan_params_t p = params(2, 2, 1, 128, qo, kv, 1);
  size_t hb = 0, db = 0;
  ina_mla_plan_info_t info;
  CHECK_OK(ina_mla_workspace_size(&p, &hb, &db));
  void *ws = malloc(hb);
  CHECK(ws != NULL);
  if (!ws) return;
  memset(ws, 0xA5, hb);
  CHECK_OK(ina_mla_plan(&p, ws, NULL, NULL, &info));
  const schedule_view_t v = view(&p, ws, info.num_ctas);
  CHECK(info.num_ctas == 2 && info.num_splits_max == 1 && v.header->num_merges == 0);
  CHECKF(v.cta_indptr[0] == 0 && v.cta_indptr[1] == 8 && v.cta_indptr[2] == 16,
         "exact fit: CTA lists [%d, %d, %d), expected [0, 8, 16)", v.cta_indptr[0], v.cta_indptr[1], v.cta_indptr[2]);
  for (int32_t i = 0; i < 16 && i < v.header->num_items; i++) {
    const ina_mla_sched_item_t *it = &v.items[i];
    const int32_t request = i / 4 % 2, tile = i / 8 * 4 + i % 4;
    CHECKF(it->request == request && it->tile == tile && it->kv_begin == 0 && it->kv_end == 1000 && it->slot == -1 &&
               it->group_items == (i % 4 == 0 ? 4 : 0) && it->reserved[0] == 0 && it->reserved[1] == 0,
           "exact fit: item %d is (%d, %d, [%d, %d), slot %d, run %d), expected (%d, %d, [0, 1000), -1, %d)", i,
           it->request, it->tile, it->kv_begin, it->kv_end, it->slot, it->group_items, request, tile,
           i % 4 == 0 ? 4 : 0);
  }
  free(ws);
  plan_and_check(&p, "two groups per CTA, exact fit");
  /* One long request among short ones, equal tile ends (128 heads, decode or 2 tokens),
   * 14 CTAs: each of its groups (a quarter or half of the cost line) is cut into several
   * chunks of every tile. */
  int32_t qo2[9], kv2[8];
  for (int32_t q = 1; q <= 2; q++) {
    for (int32_t b = 0; b <= 8; b++) qo2[b] = b * q;
    for (int32_t b = 0; b < 8; b++) kv2[b] = b == 3 ? 50000 : 100 + b;
    p = params(8, 8, q, 128, qo2, kv2, 7);
    const stats_t st = plan_and_check(&p, "50k among 7 short ones, 128 heads");
    CHECKF(st.max_splits >= 4 && st.merges % 4 == 0, "q_len %d: the 50k request is cut into only %d chunks, %d "
           "split units", q, st.max_splits, st.merges);
  }
}

/* Steps whose requests change q_len from one to the next (1, 2, 0, 3, ...), with head
 * counts whose groups have unequal tile ends (17 heads x 4 tokens: rows of a token
 * straddle tiles) and equal ones (64, 128), on grids that cut many groups. */
static void mixed_q_len_cases(test_rng_t *rng) {
  static const int32_t heads[] = {17, 64, 128, 16};
  int32_t qo[65], kv[64];
  for (int trial = 0; trial < 40; trial++) {
    const int32_t H = heads[trial % 4], batch = (int32_t)test_rng_int(rng, 1, 64);
    qo[0] = 0;
    for (int32_t b = 0; b < batch; b++) {
      const int32_t q = b % 5 == 4 ? 0 : (int32_t)test_rng_int(rng, 1, 4);
      qo[b + 1] = qo[b] + q;
      kv[b] = trial % 2 ? 4096 : (int32_t)test_rng_int(rng, q > 0 ? q : 1, 20000);
    }
    const int32_t sms = trial % 3 == 0 ? 1 : (trial % 3 == 1 ? 7 : 132);
    ina_mla_plan_params_t p = params(batch, 64, 4, H, qo, kv, sms);
    char what[96];
    snprintf(what, sizeof what, "mixed q_len trial %d (batch %d, heads %d, SMs %d)", trial, batch, H, sms);
    plan_and_check(&p, what);
  }
}

/* Expects `st` to be `code` with the last error containing `needle`. */
static void expect_error(ina_status_t st, ina_status_t code, const char *needle, const char *what) {
  CHECKF(st == code, "%s: status %d, expected %d", what, (int)st, (int)code);
  CHECKF(strstr(ina_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what, ina_last_error(), needle);
}

static void validation(void) {
  int32_t qo[4] = {0, 2, 1, 3}, kv[3] = {4, 4, 4};
  size_t hb = 0, db = 0;
  ina_mla_plan_params_t p = params(3, 4, 4, 16, qo, kv, 132);
  ina_mla_plan_info_t info;
  CHECK_OK(ina_mla_workspace_size(&p, &hb, &db));
  void *ws = malloc(hb);
  CHECK(ws != NULL);
  if (!ws) return;
  ina_log_set_quiet_errors(1);
  expect_error(ina_mla_plan(&p, ws, NULL, NULL, &info), INA_ERR_INVALID_ARGUMENT, "request 1", "qo_indptr decreasing");
  CHECK(info.num_ctas == 0); /* a failed plan leaves no usable info */
  qo[2] = 4;
  qo[3] = 5;
  kv[1] = 1;
  expect_error(ina_mla_plan(&p, ws, NULL, NULL, &info), INA_ERR_INVALID_ARGUMENT, "kv_len 1", "q_len > kv_len");
  kv[1] = 4;
  p.max_q_len = 1;
  expect_error(ina_mla_plan(&p, ws, NULL, NULL, &info), INA_ERR_INVALID_ARGUMENT, "max_q_len", "q_len > max_q_len");
  p.max_q_len = 4;
  p.batch = 5;
  expect_error(ina_mla_plan(&p, ws, NULL, NULL, &info), INA_ERR_INVALID_ARGUMENT, "max_batch", "batch > max_batch");
  p.batch = 3;
  qo[0] = 1;
  expect_error(ina_mla_plan(&p, ws, NULL, NULL, &info), INA_ERR_INVALID_ARGUMENT, "qo_indptr[0]", "qo_indptr[0] != 0");
  qo[0] = 0;
  CHECK_OK(ina_mla_plan(&p, ws, NULL, NULL, &info));
  p.num_heads = 129;
  expect_error(ina_mla_workspace_size(&p, &hb, &db), INA_ERR_INVALID_ARGUMENT, "129", "129 heads");
  p.num_heads = 0;
  expect_error(ina_mla_plan(&p, ws, NULL, NULL, &info), INA_ERR_INVALID_ARGUMENT, "num_heads", "0 heads");
  p.num_heads = 16;
  p.page_size = 0;
  expect_error(ina_mla_plan(&p, ws, NULL, NULL, &info), INA_ERR_INVALID_ARGUMENT, "page_size", "page size 0");
  p.page_size = 64;
  p.kv_lora_rank = 700;
  expect_error(ina_mla_plan(&p, ws, NULL, NULL, &info), INA_ERR_UNSUPPORTED, "700", "dims beyond the generic kernel");
  p.kv_lora_rank = 512;
  p.struct_size = 8;
  expect_error(ina_mla_plan(&p, ws, NULL, NULL, &info), INA_ERR_INVALID_ARGUMENT, "INA_MLA_PLAN_PARAMS_INIT",
               "bad struct_size");
  p.struct_size = sizeof p;
  expect_error(ina_mla_plan(&p, NULL, NULL, NULL, &info), INA_ERR_INVALID_ARGUMENT, "host_ws", "NULL host_ws");
  p.qo_indptr = NULL;
  expect_error(ina_mla_plan(&p, ws, NULL, NULL, &info), INA_ERR_INVALID_ARGUMENT, "NULL", "NULL qo_indptr");
  if (ina_cuda_device_count() == 0) { /* num_sms = 0 asks the device: there is none */
    p = params(3, 4, 4, 16, qo, kv, 0);
    CHECK(ina_mla_workspace_size(&p, &hb, &db) != INA_OK);
  }
  ina_log_set_quiet_errors(0);
  free(ws);
}

/* Sparse plans (ina_mla_sparse_plan): a step's query tokens become one-token requests
 * whose KV length is min(topk, visible). The schedule must be the dense plan's of exactly
 * those requests (which plan_and_check validates in full), byte for byte, and
 * token_request must name each token's request. The dims are the dense plan's: DeepSeek's
 * 512 + 64 (the fast path) and the generic kernel's smaller ones, with the path the dense
 * plan reports. Then the dims at the generic kernel's limit, and the sparse plan's own
 * refusals. */
static void sparse_plans(test_rng_t *rng) {
  static const int32_t dims[][2] = {{512, 64}, {32, 8}, {64, 16}, {128, 16}, {256, 0}, {576, 64}};
  for (int trial = 0; trial < 72; trial++) {
    const int32_t batch = (int32_t)test_rng_int(rng, 0, 12), heads = trial % 3 == 0 ? 128 : trial % 3 == 1 ? 16 : 3;
    const int32_t C = dims[(trial / 3) % 6][0], R = dims[(trial / 3) % 6][1];
    const int32_t topk = trial % 2 ? 2048 : (int32_t)test_rng_int(rng, 1, 100);
    const int32_t num_sms = (int32_t)test_rng_int(rng, 1, 140);
    int32_t qo_indptr[13] = {0}, kv_len[12], vqo[13 * 8], vkv[12 * 8];
    for (int32_t b = 0; b < batch; b++) {
      const int32_t q_len = (int32_t)test_rng_int(rng, 0, 8);
      qo_indptr[b + 1] = qo_indptr[b] + q_len;
      kv_len[b] = q_len + (int32_t)test_rng_int(rng, 0, 5000);
    }
    const int32_t tokens = qo_indptr[batch], max_tokens = tokens + (int32_t)test_rng_int(rng, 1, 9);
    vqo[0] = 0;
    for (int32_t b = 0; b < batch; b++) {
      const int32_t q_len = qo_indptr[b + 1] - qo_indptr[b];
      for (int32_t j = 0; j < q_len; j++) {
        const int32_t visible = kv_len[b] - q_len + j + 1;
        vkv[qo_indptr[b] + j] = visible < topk ? visible : topk;
        vqo[qo_indptr[b] + j + 1] = qo_indptr[b] + j + 1;
      }
    }
    ina_mla_sparse_plan_params_t sp = INA_MLA_SPARSE_PLAN_PARAMS_INIT;
    sp.batch = batch;
    sp.max_tokens = max_tokens;
    sp.qo_indptr = qo_indptr;
    sp.kv_len = kv_len;
    sp.topk = topk;
    sp.num_heads = heads;
    sp.kv_lora_rank = C;
    sp.rope_dim = R;
    sp.num_sms = num_sms;
    ina_mla_plan_params_t dp = params(tokens, max_tokens, 1, heads, vqo, vkv, num_sms);
    dp.kv_lora_rank = C;
    dp.rope_dim = R;
    char what[128];
    snprintf(what, sizeof what, "sparse trial %d (%d tokens, %d heads, top-k %d, dims %d + %d)", trial, tokens,
             heads, topk, C, R);
    plan_and_check(&dp, what);
    size_t sh = 0, sd = 0, dh = 0, dd = 0;
    CHECK_OK(ina_mla_sparse_workspace_size(&sp, &sh, &sd));
    CHECK_OK(ina_mla_workspace_size(&dp, &dh, &dd));
    CHECKF(sh == dh && sd == dd, "%s: workspace %zu / %zu, the dense bucket's %zu / %zu", what, sh, sd, dh, dd);
    char *a = malloc(sh), *b = malloc(sh);
    CHECK(a && b);
    if (a && b) {
      memset(a, 0x5A, sh);
      memset(b, 0x5A, sh);
      ina_mla_plan_info_t si, di;
      CHECK_OK(ina_mla_sparse_plan(&sp, a, NULL, NULL, &si));
      CHECK_OK(ina_mla_plan(&dp, b, NULL, NULL, &di));
      const schedule_view_t v = view(&dp, b, di.num_ctas);
      const size_t used = v.l.items + sizeof(ina_mla_sched_item_t) * (size_t)v.header->num_items;
      CHECKF(memcmp(a, b, v.l.token_request) == 0 && memcmp(a + v.l.merges, b + v.l.merges, used - v.l.merges) == 0,
             "%s: the schedule differs from the dense plan of its one-token requests", what);
      CHECKF(si.sparse_topk == topk && di.sparse_topk == 0 && si.batch == tokens && si.total_tokens == tokens &&
                 si.num_ctas == di.num_ctas && si.num_splits_max == di.num_splits_max && si.max_q_len == 1 &&
                 si.path == di.path && si.kv_lora_rank == C && si.rope_dim == R,
             "%s: plan info", what);
      CHECKF(si.path == (C == 512 && R == 64 ? INA_MLA_PATH_FAST : INA_MLA_PATH_GENERIC), "%s: path %d", what,
             si.path);
      const int32_t *token_request = (const int32_t *)(a + v.l.token_request);
      for (int32_t r = 0; r < batch; r++)
        for (int32_t t = qo_indptr[r]; t < qo_indptr[r + 1]; t++)
          CHECKF(token_request[t] == r, "%s: token %d names request %d, not %d", what, t, token_request[t], r);
    }
    free(a);
    free(b);
  }
  /* refusals, each with *info zeroed */
  const int32_t qo[3] = {0, 2, 5}, kv[2] = {4, 9};
  ina_mla_sparse_plan_params_t base = INA_MLA_SPARSE_PLAN_PARAMS_INIT;
  base.batch = 2;
  base.max_tokens = 5;
  base.qo_indptr = qo;
  base.kv_len = kv;
  base.topk = 16;
  base.num_heads = 16;
  base.num_sms = 4;
  size_t hb = 0, db = 0;
  CHECK_OK(ina_mla_sparse_workspace_size(&base, &hb, &db));
  void *ws = malloc(hb);
  CHECK(ws != NULL);
  /* Dims at the edge of the generic kernel (kv_lora_rank + rope_dim <= 640): accepted on
   * the generic path up to the limit, INA_ERR_UNSUPPORTED past it, as ina_mla_plan. The
   * rank-256 bucket is no larger than base's, so base's workspace holds its schedule. */
  static const struct {
    int32_t C, R;
    ina_status_t want;
  } edge[] = {{576, 64, INA_OK}, {512, 128, INA_OK}, {640, 0, INA_OK}, {1, 0, INA_OK}, {256, 64, INA_OK},
              {577, 64, INA_ERR_UNSUPPORTED}, {600, 64, INA_ERR_UNSUPPORTED}, {512, 129, INA_ERR_UNSUPPORTED},
              {641, 0, INA_ERR_UNSUPPORTED}, {0, 64, INA_ERR_INVALID_ARGUMENT}, {64, -1, INA_ERR_INVALID_ARGUMENT}};
  ina_log_set_quiet_errors(1);
  for (size_t e = 0; e < sizeof edge / sizeof edge[0] && ws; e++) {
    ina_mla_sparse_plan_params_t p = base;
    p.kv_lora_rank = edge[e].C;
    p.rope_dim = edge[e].R;
    ina_mla_plan_params_t dp = params(5, 5, 1, 16, NULL, NULL, 4);
    dp.kv_lora_rank = edge[e].C;
    dp.rope_dim = edge[e].R;
    size_t sh = 0, sd = 0, dh = 0, dd = 0;
    const ina_status_t sw = ina_mla_sparse_workspace_size(&p, &sh, &sd);
    const ina_status_t dw = ina_mla_workspace_size(&dp, &dh, &dd);
    CHECKF(sw == edge[e].want && dw == edge[e].want && sh == dh && sd == dd,
           "sparse dims %d + %d: workspace status %d (dense %d), expected %d", edge[e].C, edge[e].R, (int)sw,
           (int)dw, (int)edge[e].want);
    ina_mla_plan_info_t info;
    memset(&info, 0x33, sizeof info);
    void *pws = sh > hb ? malloc(sh) : ws;
    const ina_status_t st = pws ? ina_mla_sparse_plan(&p, pws, NULL, NULL, &info) : INA_ERR_OUT_OF_MEMORY;
    CHECKF(st == edge[e].want, "sparse dims %d + %d: plan status %d, expected %d", edge[e].C, edge[e].R, (int)st,
           (int)edge[e].want);
    if (st == INA_OK)
      CHECKF(info.path == INA_MLA_PATH_GENERIC && info.kv_lora_rank == edge[e].C && info.rope_dim == edge[e].R &&
                 info.sparse_topk == 16 && info.num_ctas == 8,
             "sparse dims %d + %d: info (path %d)", edge[e].C, edge[e].R, info.path);
    else
      CHECKF(info.num_ctas == 0 && info.sparse_topk == 0, "sparse dims %d + %d: info not zeroed", edge[e].C,
             edge[e].R);
    if (pws != ws) free(pws);
  }
  ina_log_set_quiet_errors(0);
  for (int k = 0; k < 5 && ws; k++) {
    ina_mla_sparse_plan_params_t p = base;
    const int32_t short_kv[2] = {1, 9};
    const char *why = "";
    if (k == 0) p.max_tokens = 4, why = "5 tokens over max_tokens 4";
    if (k == 1) p.topk = 0, why = "topk 0";
    if (k == 2) p.kv_lora_rank = 600, why = "kv_lora_rank 600 + rope 64, past the generic kernel's 640";
    if (k == 3) p.kv_len = short_kv, why = "q_len 2 > kv_len 1";
    if (k == 4) p.version = 2, why = "version 2";
    ina_mla_plan_info_t info;
    memset(&info, 0x33, sizeof info);
    const ina_status_t st = ina_mla_sparse_plan(&p, ws, NULL, NULL, &info);
    CHECKF(st != INA_OK && info.num_ctas == 0 && info.sparse_topk == 0, "sparse plan accepted %s", why);
  }
  free(ws);
}

int main(void) {
  test_rng_t rng = {test_seed("test_mla_plan")};
  sparse_plans(&rng);
  validation();
  edge_cases();
  skewed_case();
  boundary_cases();
  mixed_q_len_cases(&rng);
  bucket_independence(&rng);
  random_plans(&rng);
  return test_finish("test_mla_plan");
}
