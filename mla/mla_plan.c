/* The host scheduler of MLA attention (mla/mla.h): validates a step's lengths, cuts the
 * work into chunks that give every CTA of the fixed persistent grid about the same
 * number of KV tokens, and writes the schedule of mla/mla_schedule.h.
 *
 * Balancing. Every unit (request, row tile) costs its KV length plus
 * INA_MLA_CHUNK_COST. Laid end to end in a fixed order, the units span a cost line of
 * length T; CTA c owns the stretch [c * T / N, (c + 1) * T / N). A unit that crosses a
 * boundary is cut there (rounded to the nearest multiple of INA_MLA_KV_BLOCK), so one
 * long request among short ones is spread over many CTAs instead of holding one. The
 * boundaries are absolute positions, so rounding errors do not accumulate: each CTA
 * gets T / N give or take a block and one chunk cost.
 *
 * Order. Units go tile-major (every request's tile 0, then every request's tile 1, ...):
 * with many heads, the row tiles of one request then sit at the same place in the
 * stretches of different CTAs, which run at the same time and share the request's KV
 * blocks through L2 instead of each reading them from memory.
 *
 * Groups. In grouped buckets (mla_schedule.h) the cost line holds groups of
 * INA_MLA_GROUP_TILES row tiles instead of single tiles: a group costs its KV length (that
 * of its last tile) plus one chunk cost, since the wgmma kernel reads each KV block once
 * for all of its rows, and a cut splits all of its tiles at the same position.
 *
 * Cost. The plan runs on the host every step (target: 20 us at batch 256), and most of
 * its time goes into storing the items, 32 bytes each, thousands of them at batch 256
 * with 128 heads. The rest is kept small: a request's groups are shaped once per q_len,
 * a group that fits whole in what is left of the current CTA's stretch (most of them)
 * takes a short path, and only a group cut at a CTA boundary takes the walk with
 * per-tile state and then gets its partial slots. */
#define INA_LOG_SUBSYS "mla"
#include <stddef.h>
#include <string.h>

#include "core/check.h"
#include "mla/mla.h"
#include "mla/mla_schedule.h"

/* The generic kernel keeps a query tile, a KV block and the output tile in shared
 * memory as fp32; this bounds its dims (DeepSeek's 512 + 64 fits). */
#define INA_MLA_GENERIC_MAX_DIM 640

static size_t align_up(size_t x) { return (x + INA_MLA_WS_ALIGN - 1) / INA_MLA_WS_ALIGN * INA_MLA_WS_ALIGN; }

ina_status_t ina_mla_sched_layout(int32_t max_batch, int32_t max_q_len, int32_t num_heads,
                                  int32_t kv_lora_rank, int32_t rope_dim, int32_t num_ctas,
                                  ina_mla_sched_layout_t *out) {
  ina_status_t st = INA_OK;
  ina_mla_sched_layout_t l;
  memset(&l, 0, sizeof l);
  INA_REQUIRE(out && max_batch > 0 && max_q_len > 0 && num_heads > 0 && kv_lora_rank > 0 &&
                  num_ctas > 0,
              INA_ERR_INVALID_ARGUMENT, "mla: bad bucket (max_batch %d, max_q_len %d, heads %d, "
              "kv_lora_rank %d, CTAs %d)", max_batch, max_q_len, num_heads, kv_lora_rank, num_ctas);
  const int64_t units = (int64_t)max_batch * ina_mla_tiles(max_q_len, num_heads);
  INA_REQUIRE(units + (int64_t)INA_MLA_GROUP_TILES * num_ctas < INT32_MAX / 2, INA_ERR_INVALID_ARGUMENT,
              "mla: bucket too large: %lld row tiles (max_batch %d x max_q_len %d x heads %d)",
              (long long)units, max_batch, max_q_len, num_heads);
  l.num_ctas = num_ctas;
  l.max_batch = max_batch;
  l.group_tiles = ina_mla_group_tiles(max_q_len, num_heads, kv_lora_rank, rope_dim);
  l.max_items = (int32_t)units + l.group_tiles * num_ctas;
  l.max_merges = l.group_tiles * num_ctas;
  l.max_slots = 2 * l.group_tiles * num_ctas;
  l.kv_lora_rank = kv_lora_rank;
  size_t at = 0;
  l.header = at;
  at = align_up(at + sizeof(ina_mla_sched_header_t));
  l.cta_indptr = at;
  at = align_up(at + sizeof(int32_t) * (size_t)(num_ctas + 1));
  l.requests = at;
  at = align_up(at + sizeof(ina_mla_sched_request_t) * (size_t)max_batch);
  l.token_request = at;
  at = align_up(at + sizeof(int32_t) * (size_t)max_batch);
  l.merges = at;
  at = align_up(at + sizeof(ina_mla_sched_merge_t) * (size_t)l.max_merges);
  l.items = at;
  at = align_up(at + sizeof(ina_mla_sched_item_t) * (size_t)l.max_items);
  l.schedule_bytes = at;
  l.partial_o = at;
  at = align_up(at + sizeof(float) * (size_t)l.max_slots * INA_MLA_TILE_ROWS * (size_t)kv_lora_rank);
  l.partial_lse = at;
  at = align_up(at + sizeof(float) * (size_t)l.max_slots * INA_MLA_TILE_ROWS);
  l.device_bytes = at;
  *out = l;
fail:
  return st;
}

/* The bucket's own checks, shared by ina_mla_workspace_size, ina_mla_plan and the
 * sparse plan; resolves num_sms = 0 to the current device's count. */
ina_status_t ina_mla_check_bucket(const ina_mla_plan_params_t *p, int32_t *num_sms) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(p != NULL, INA_ERR_INVALID_ARGUMENT, "mla plan: params is NULL");
  INA_REQUIRE(p->struct_size == sizeof(ina_mla_plan_params_t) && p->version == 1,
              INA_ERR_INVALID_ARGUMENT,
              "mla plan: params struct_size %zu / version %u do not match this build (%zu / 1); "
              "initialize them with INA_MLA_PLAN_PARAMS_INIT",
              p->struct_size, p->version, sizeof(ina_mla_plan_params_t));
  INA_REQUIRE(p->max_batch >= 1, INA_ERR_INVALID_ARGUMENT, "mla plan: max_batch %d < 1", p->max_batch);
  INA_REQUIRE(p->max_q_len >= 1, INA_ERR_INVALID_ARGUMENT, "mla plan: max_q_len %d < 1", p->max_q_len);
  INA_REQUIRE(p->max_q_len <= (1 << 20), INA_ERR_INVALID_ARGUMENT,
              "mla plan: max_q_len %d > %d (query rows are counted in 32 bits)", p->max_q_len, 1 << 20);
  INA_REQUIRE(p->num_heads >= 1 && p->num_heads <= 128, INA_ERR_INVALID_ARGUMENT,
              "mla plan: num_heads %d outside 1..128", p->num_heads);
  INA_REQUIRE(p->kv_lora_rank >= 1 && p->rope_dim >= 0, INA_ERR_INVALID_ARGUMENT,
              "mla plan: bad dims kv_lora_rank %d, rope_dim %d", p->kv_lora_rank, p->rope_dim);
  INA_REQUIRE((int64_t)p->kv_lora_rank + p->rope_dim <= INA_MLA_GENERIC_MAX_DIM ||
                  (p->kv_lora_rank == 512 && p->rope_dim == 64),
              INA_ERR_UNSUPPORTED,
              "mla plan: kv_lora_rank %d + rope_dim %d exceeds %d, the most the generic kernel "
              "holds", p->kv_lora_rank, p->rope_dim, INA_MLA_GENERIC_MAX_DIM);
  INA_REQUIRE(p->page_size >= 1, INA_ERR_INVALID_ARGUMENT, "mla plan: page_size %d < 1", p->page_size);
  INA_REQUIRE(p->num_sms >= 0, INA_ERR_INVALID_ARGUMENT, "mla plan: num_sms %d < 0", p->num_sms);
  *num_sms = p->num_sms;
  if (*num_sms == 0) INA_CHECK(ina_mla_device_num_sms(num_sms));
fail:
  return st;
}

ina_status_t ina_mla_workspace_size(const ina_mla_plan_params_t *p, size_t *host_bytes,
                                    size_t *device_bytes) {
  ina_status_t st = INA_OK;
  int32_t num_sms = 0;
  ina_mla_sched_layout_t l;
  INA_REQUIRE(host_bytes && device_bytes, INA_ERR_INVALID_ARGUMENT,
              "mla workspace size: NULL output");
  *host_bytes = 0;
  *device_bytes = 0;
  INA_CHECK(ina_mla_check_bucket(p, &num_sms));
  INA_CHECK(ina_mla_sched_layout(p->max_batch, p->max_q_len, p->num_heads, p->kv_lora_rank,
                                 p->rope_dim, num_sms * INA_MLA_CTAS_PER_SM, &l));
  *host_bytes = l.schedule_bytes;
  *device_bytes = l.device_bytes;
fail:
  return st;
}

/* The step's lengths against the bucket. */
static ina_status_t check_step(const ina_mla_plan_params_t *p) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(p->batch >= 0 && p->batch <= p->max_batch, INA_ERR_INVALID_ARGUMENT,
              "mla plan: batch %d outside 0..max_batch %d", p->batch, p->max_batch);
  if (p->batch == 0) return INA_OK;
  INA_REQUIRE(p->qo_indptr && p->kv_len, INA_ERR_INVALID_ARGUMENT,
              "mla plan: qo_indptr or kv_len is NULL with batch %d", p->batch);
  INA_REQUIRE(p->qo_indptr[0] == 0, INA_ERR_INVALID_ARGUMENT, "mla plan: qo_indptr[0] = %d, not 0",
              p->qo_indptr[0]);
  for (int32_t b = 0; b < p->batch; b++) {
    const int64_t q_len = (int64_t)p->qo_indptr[b + 1] - p->qo_indptr[b];
    INA_REQUIRE(q_len >= 0, INA_ERR_INVALID_ARGUMENT,
                "mla plan: qo_indptr decreases at request %d (%d -> %d)", b, p->qo_indptr[b],
                p->qo_indptr[b + 1]);
    INA_REQUIRE(q_len <= p->max_q_len, INA_ERR_INVALID_ARGUMENT,
                "mla plan: request %d has q_len %lld > max_q_len %d of the bucket", b,
                (long long)q_len, p->max_q_len);
    INA_REQUIRE(p->kv_len[b] >= q_len, INA_ERR_INVALID_ARGUMENT,
                "mla plan: request %d has q_len %lld > kv_len %d (the queries are the last "
                "kv_len tokens)", b, (long long)q_len, p->kv_len[b]);
  }
fail:
  return st;
}

/* Builds the schedule in host_ws; the state of the walk along the cost line. The counts
 * live here and reach the header at the end: kept in the workspace, they would have to
 * be reloaded after every item stored (the same memory, as far as the compiler knows). */
typedef struct builder {
  const ina_mla_sched_layout_t *l;
  int32_t *cta_indptr;
  ina_mla_sched_item_t *items;
  ina_mla_sched_merge_t *merges;
  int32_t num_items, num_merges;
  int64_t total; /* T: the cost line's length */
  int64_t pos;   /* cost placed so far */
  int32_t cta;   /* CTA being filled */
  int64_t bound; /* where its stretch ends: (cta + 1) * total / num_ctas, */
  int64_t share, share_rem, bound_rem; /* kept without a division per CTA */
  int32_t slots; /* partial-result slots handed out */
  int32_t max_splits;
} builder_t;

/* The head count with its reciprocal: the query token of a row is row / heads, and the
 * plan takes it for the last row of a tile, so without a divide instruction:
 * row / heads = (row * recip) >> 34 with recip = 2^34 / heads + 1, exact for rows below
 * 2^27 (max_q_len <= 2^20, heads <= 128): the rounding error row * (recip - 2^34 / heads)
 * / 2^34 stays below 2^-7 <= 1 / heads. */
typedef struct heads {
  int32_t n;
  uint64_t recip;
} heads_t;

static heads_t heads_of(int32_t n) {
  const heads_t h = {n, ((uint64_t)1 << 34) / (uint64_t)n + 1};
  return h;
}

/* KV end of row tile `tile` of a request with q_len tokens, minus the request's kv_len:
 * ina_mla_tile_kv_end (which the kernels use) with the division above, a value <= 0
 * that does not depend on kv_len; decode (one query token) needs none. */
static inline int32_t tile_end_offset(int32_t q_len, int32_t tile, heads_t heads) {
  if (q_len == 1) return 0;
  const int32_t rows = q_len * heads.n;
  int32_t last = (tile + 1) * INA_MLA_TILE_ROWS;
  if (last > rows) last = rows;
  const int32_t token = (int32_t)(((uint64_t)(last - 1) * heads.recip) >> 34);
  return token + 1 - q_len;
}

/* Stretch ends: bound(c) = floor((c + 1) * T / N) = (c + 1) * share + floor((c + 1) *
 * share_rem / N), the last term advanced by carrying the remainder. */
static void first_cta(builder_t *s) {
  const int32_t n = s->l->num_ctas;
  s->share = s->total / n;
  s->share_rem = s->total % n;
  s->bound = s->share;
  s->bound_rem = s->share_rem;
}

static void next_cta(builder_t *s) {
  s->cta++;
  s->cta_indptr[s->cta] = s->num_items;
  s->bound += s->share;
  s->bound_rem += s->share_rem;
  if (s->bound_rem >= s->l->num_ctas) {
    s->bound_rem -= s->l->num_ctas;
    s->bound++;
  }
}

/* How the groups of a request look: a function of its q_len alone (with the bucket's
 * heads and group size), so the plan works it out once for a run of requests with the
 * same q_len rather than once per request. Steps usually give every request one q_len
 * (1 for decode, 2 for MTP), which makes that once per step. */
typedef struct group_shape {
  int32_t q_len;     /* the q_len it describes; -1 before the first */
  int32_t tiles;     /* row tiles of the group (G, or fewer in a request's last group) */
  int32_t end_offset[INA_MLA_GROUP_TILES]; /* tile i's KV end minus kv_len: <= 0, non-decreasing */
} group_shape_t;

/* Group gi of a request with q_len tokens (num_tiles row tiles, gi * G < num_tiles). */
static void shape_group(group_shape_t *gs, int32_t q_len, int32_t num_tiles, int32_t gi, int32_t G,
                        heads_t heads) {
  const int32_t first = gi * G;
  gs->q_len = q_len;
  gs->tiles = num_tiles - first < G ? num_tiles - first : G;
  for (int32_t i = 0; i < gs->tiles; i++) gs->end_offset[i] = tile_end_offset(q_len, first + i, heads);
}

/* The group's tiles [first_tile, first_tile + tiles) and their KV ends (non-decreasing:
 * later rows see more); a single tile in ungrouped plans. Its chunks are runs of
 * consecutive items, one item per tile with positions in the chunk: since the ends do
 * not decrease, the tiles from the first that ends past the chunk's begin to the last.
 * A tile drops out of the runs once they start past its end and never comes back. */
typedef struct group {
  int32_t request, first_tile, tiles;
  int32_t end[INA_MLA_GROUP_TILES];
  int32_t starts[INA_MLA_GROUP_TILES]; /* chunks placed so far whose run starts at tile i */
} group_t;

/* The group's chunk [begin, end): its run of items, the first carrying the count. The
 * items go through a local pointer and the count is updated once per chunk, because a
 * store through s->items could, as far as the compiler knows, change the builder's
 * fields, which would then be reloaded after each item. */
static inline ina_status_t emit(builder_t *s, group_t *g, int32_t begin, int32_t end) {
  ina_status_t st = INA_OK;
  int32_t first = 0;
  while (g->end[first] <= begin) first++; /* stops at the last tile: begin < its end */
  const int32_t n = g->tiles - first;
  INA_REQUIRE(s->num_items + n <= s->l->max_items, INA_ERR_INTERNAL,
              "mla plan: %d work items exceed the workspace's %d", s->num_items + n, s->l->max_items);
  ina_mla_sched_item_t *out = s->items + s->num_items;
  for (int32_t k = 0; k < n; k++) {
    const int32_t tile_end = g->end[first + k] < end ? g->end[first + k] : end;
    const ina_mla_sched_item_t it = {g->request, g->first_tile + first + k, begin, tile_end, -1, k == 0 ? n : 0,
                                     {0, 0}};
    out[k] = it;
  }
  s->num_items += n;
  g->starts[first]++;
fail:
  return st;
}

/* Partial slots and merges of a group that was cut, for its tiles in several chunks
 * (at least the last), in tile order; each such tile's chunks get consecutive slots.
 * Tile i is in chunks 0 .. chunks(i) - 1, chunks(i) being the runs that start at or
 * before it: its item in chunk c gets slot first_slot(i) + c. The runs lie in
 * items[first_item ..) in the order they start. */
static ina_status_t assign_slots(builder_t *s, const group_t *g, int32_t first_item) {
  ina_status_t st = INA_OK;
  const int32_t tiles = g->tiles;
  ina_mla_sched_item_t *it = s->items + first_item;
  if (g->end[0] == g->end[tiles - 1]) {
    /* Equal ends (decode, 64 or 128 heads, ungrouped plans): every tile is in all m
     * chunks, each run holds every tile, and tile i gets slots slots + i * m ... The
     * common case, so it skips the per-tile bookkeeping of the general one below. */
    const int32_t m = g->starts[0];
    INA_REQUIRE(s->num_merges + tiles <= s->l->max_merges && s->slots + tiles * m <= s->l->max_slots,
                INA_ERR_INTERNAL, "mla plan: %d split units of %d chunks exceed the workspace (%d of %d merges, "
                "%d of %d slots used)", tiles, m, s->num_merges, s->l->max_merges, s->slots, s->l->max_slots);
    for (int32_t i = 0; i < tiles; i++) {
      const ina_mla_sched_merge_t merge = {g->request, g->first_tile + i, s->slots + i * m, m};
      s->merges[s->num_merges + i] = merge;
    }
    for (int32_t c = 0; c < m; c++)
      for (int32_t i = 0; i < tiles; i++) (it++)->slot = s->slots + i * m + c;
    s->num_merges += tiles;
    s->slots += tiles * m;
    if (m > s->max_splits) s->max_splits = m;
    return INA_OK;
  }
  int32_t first_slot[INA_MLA_GROUP_TILES];
  int32_t chunks = 0; /* of tile i */
  for (int32_t i = 0; i < tiles; i++) {
    chunks += g->starts[i];
    first_slot[i] = -1; /* a tile in one chunk: its item writes the output */
    if (chunks <= 1) continue;
    INA_REQUIRE(s->num_merges < s->l->max_merges && s->slots + chunks <= s->l->max_slots,
                INA_ERR_INTERNAL, "mla plan: split unit %d exceeds the workspace (%d merges, %d + %d slots)",
                s->num_merges, s->l->max_merges, s->slots, chunks);
    const ina_mla_sched_merge_t merge = {g->request, g->first_tile + i, s->slots, chunks};
    s->merges[s->num_merges++] = merge;
    first_slot[i] = s->slots;
    s->slots += chunks;
  }
  if (chunks > s->max_splits) s->max_splits = chunks; /* the last tile is in every chunk */
  int32_t c = 0;
  for (int32_t first = 0; first < tiles; first++)
    for (int32_t run = 0; run < g->starts[first]; run++, c++)
      for (int32_t i = first; i < tiles; i++) (it++)->slot = first_slot[i] + c;
fail:
  return st;
}

/* Places a group with KV range [0, len) (len = its last tile's end) on the cost line,
 * cutting it at CTA boundaries. */
static ina_status_t place_group(builder_t *s, group_t *g) {
  ina_status_t st = INA_OK;
  const int32_t first_item = s->num_items;
  const int32_t last_cta = s->l->num_ctas - 1;
  const int32_t len = g->end[g->tiles - 1];
  int32_t begin = 0;
  for (;;) {
    /* The unit's fixed cost is charged with its first chunk only: the cost line stays
     * exactly T long, so the last CTA is not left with the extra cost of every cut. */
    const int64_t cost = begin == 0 ? INA_MLA_CHUNK_COST : 0;
    const int64_t room = s->bound - s->pos - cost; /* tokens that fit */
    const int32_t remaining = len - begin;
    if (s->cta == last_cta || remaining <= room) {
      INA_CHECK(emit(s, g, begin, len));
      s->pos += cost + remaining;
      break;
    }
    /* Cut at the block boundary nearest to where the CTA's stretch ends. */
    const int64_t blocks = (room + INA_MLA_KV_BLOCK / 2) / INA_MLA_KV_BLOCK;
    const int64_t cut = room > 0 ? begin + blocks * INA_MLA_KV_BLOCK : begin;
    if (cut >= len) { /* the rest overshoots the stretch by under half a block */
      INA_CHECK(emit(s, g, begin, len));
      s->pos += cost + remaining;
      break;
    }
    if (cut > begin) {
      INA_CHECK(emit(s, g, begin, (int32_t)cut));
      s->pos += cost + (cut - begin);
      begin = (int32_t)cut;
    }
    next_cta(s);
  }
  while (s->cta < last_cta && s->pos >= s->bound) next_cta(s);
  if (begin > 0) INA_CHECK(assign_slots(s, g, first_item)); /* cut: tiles past the first cut are split */
fail:
  return st;
}

/* The first step of place_group for a group that fits whole in what is left of the
 * CTA's stretch (or lands in the last CTA): most groups of a large batch. It writes the
 * group's items from its shape, without the per-tile state of place_group; its items
 * write the output (slot -1). */
static inline ina_status_t place_whole_group(builder_t *s, const group_shape_t *gs, int32_t request,
                                             int32_t first_tile, int32_t kv_len) {
  ina_status_t st = INA_OK;
  const int32_t tiles = gs->tiles;
  INA_REQUIRE(s->num_items + tiles <= s->l->max_items, INA_ERR_INTERNAL,
              "mla plan: %d work items exceed the workspace's %d", s->num_items + tiles, s->l->max_items);
  ina_mla_sched_item_t *out = s->items + s->num_items; /* a local pointer, as in emit */
  for (int32_t k = 0; k < tiles; k++) {
    const ina_mla_sched_item_t it = {request, first_tile + k, 0, kv_len + gs->end_offset[k], -1, k == 0 ? tiles : 0,
                                     {0, 0}};
    out[k] = it;
  }
  s->num_items += tiles;
  s->pos += INA_MLA_CHUNK_COST + kv_len + gs->end_offset[tiles - 1];
  while (s->cta < s->l->num_ctas - 1 && s->pos >= s->bound) next_cta(s);
fail:
  return st;
}

/* Schedules the requests already written into host_ws (batch of them, total_tokens
 * query tokens) for the bucket's layout `l`, copies the used part to device_ws when there
 * is one and fills *info's schedule fields. Shared by ina_mla_plan and the sparse plan
 * (mla_sparse_plan.c), which differ only in what they take a request to be. */
ina_status_t ina_mla_schedule_requests(const ina_mla_sched_layout_t *lp, int32_t num_heads,
                                       int32_t batch, int32_t total_tokens, void *host_ws,
                                       void *device_ws, void *stream, ina_mla_plan_info_t *info) {
  ina_status_t st = INA_OK;
  int32_t max_groups = 0;
  const ina_mla_sched_layout_t l = *lp;
  builder_t s;
  memset(&s, 0, sizeof s);

  char *ws = host_ws;
  s.l = &l;
  s.cta_indptr = (int32_t *)(ws + l.cta_indptr);
  s.items = (ina_mla_sched_item_t *)(ws + l.items);
  s.merges = (ina_mla_sched_merge_t *)(ws + l.merges);
  const ina_mla_sched_request_t *requests = (const ina_mla_sched_request_t *)(ws + l.requests);
  ina_mla_sched_header_t *header = (ina_mla_sched_header_t *)(ws + l.header);

  /* The cost line's length: a request's groups cost groups * (INA_MLA_CHUNK_COST +
   * kv_len) plus the end offsets of their last tiles, the latter a function of q_len,
   * recomputed only when q_len changes. */
  const int32_t G = l.group_tiles;
  const heads_t heads = heads_of(num_heads);
  int32_t known_q_len = -1, known_groups = 0;
  int64_t known_offsets = 0; /* sum over the groups of their last tile's end offset */
  for (int32_t b = 0; b < batch; b++) {
    const ina_mla_sched_request_t *r = &requests[b];
    if (r->q_len != known_q_len) {
      known_q_len = r->q_len;
      known_groups = (r->num_tiles + G - 1) / G;
      known_offsets = 0;
      for (int32_t gi = 0; gi < known_groups; gi++) {
        const int32_t last = (gi + 1) * G < r->num_tiles ? (gi + 1) * G - 1 : r->num_tiles - 1;
        known_offsets += tile_end_offset(r->q_len, last, heads);
      }
    }
    if (known_groups > max_groups) max_groups = known_groups;
    s.total += (int64_t)known_groups * (INA_MLA_CHUNK_COST + r->kv_len) + known_offsets;
  }

  s.cta_indptr[0] = 0;
  first_cta(&s);
  for (int32_t gi = 0; gi < max_groups; gi++) {
    group_shape_t shape = {.q_len = -1};
    for (int32_t b = 0; b < batch; b++) {
      const ina_mla_sched_request_t *r = &requests[b];
      if (gi * G >= r->num_tiles) continue;
      if (r->q_len != shape.q_len) shape_group(&shape, r->q_len, r->num_tiles, gi, G, heads);
      /* place_group's first step, taken here for a group that fits whole */
      const int32_t len = r->kv_len + shape.end_offset[shape.tiles - 1];
      if (s.cta == l.num_ctas - 1 || len <= s.bound - s.pos - INA_MLA_CHUNK_COST) {
        INA_CHECK(place_whole_group(&s, &shape, b, gi * G, r->kv_len));
      } else {
        group_t g = {.request = b, .first_tile = gi * G, .tiles = shape.tiles};
        for (int32_t i = 0; i < g.tiles; i++) g.end[i] = r->kv_len + shape.end_offset[i];
        INA_CHECK(place_group(&s, &g));
      }
    }
  }
  /* Split units had their count taken in assign_slots; the others are in one chunk. */
  if (s.num_items > 0 && s.max_splits < 1) s.max_splits = 1;
  while (s.cta < l.num_ctas - 1) next_cta(&s);
  s.cta_indptr[l.num_ctas] = s.num_items;
  const ina_mla_sched_header_t hd = {batch, total_tokens, s.num_items, s.num_merges};
  *header = hd;

  if (device_ws) {
    const size_t used = l.items + sizeof(ina_mla_sched_item_t) * (size_t)s.num_items;
    INA_CHECK(ina_mla_copy_schedule(device_ws, host_ws, used, stream));
  }
  info->num_ctas = l.num_ctas;
  info->num_splits_max = s.max_splits;
  info->total_tokens = total_tokens;
  info->device_bytes = l.device_bytes;
fail:
  return st;
}

ina_status_t ina_mla_plan(const ina_mla_plan_params_t *p, void *host_ws, void *device_ws,
                          void *stream, ina_mla_plan_info_t *info) {
  ina_status_t st = INA_OK;
  int32_t num_sms = 0;
  ina_mla_sched_layout_t l;
  INA_REQUIRE(info != NULL && host_ws != NULL, INA_ERR_INVALID_ARGUMENT,
              "mla plan: %s is NULL", info ? "host_ws" : "info");
  memset(info, 0, sizeof *info);
  INA_CHECK(ina_mla_check_bucket(p, &num_sms));
  INA_CHECK(check_step(p));
  INA_CHECK(ina_mla_sched_layout(p->max_batch, p->max_q_len, p->num_heads, p->kv_lora_rank,
                                 p->rope_dim, num_sms * INA_MLA_CTAS_PER_SM, &l));
  ina_mla_sched_request_t *requests = (ina_mla_sched_request_t *)((char *)host_ws + l.requests);
  for (int32_t b = 0; b < p->batch; b++) {
    ina_mla_sched_request_t *r = &requests[b];
    const int32_t q_len = p->qo_indptr[b + 1] - p->qo_indptr[b];
    r->q_begin = p->qo_indptr[b];
    r->q_len = q_len;
    r->kv_len = p->kv_len[b];
    r->num_tiles = ina_mla_tiles(q_len, p->num_heads);
  }
  INA_CHECK(ina_mla_schedule_requests(&l, p->num_heads, p->batch,
                                      p->batch > 0 ? p->qo_indptr[p->batch] : 0, host_ws,
                                      device_ws, stream, info));
  info->batch = p->batch;
  info->max_batch = p->max_batch;
  info->max_q_len = p->max_q_len;
  info->num_heads = p->num_heads;
  info->kv_lora_rank = p->kv_lora_rank;
  info->rope_dim = p->rope_dim;
  info->page_size = p->page_size;
  info->path = p->kv_lora_rank == 512 && p->rope_dim == 64 ? INA_MLA_PATH_FAST : INA_MLA_PATH_GENERIC;
fail:
  if (st != INA_OK && info) memset(info, 0, sizeof *info);
  return st;
}
