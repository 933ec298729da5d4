/* The schedule of MLA attention: what ina_mla_plan writes into the workspaces and the
 * kernels of ina_mla_run read. Internal to mla/ (not a public header): plain C so the
 * host scheduler (mla_plan.c) and the CUDA kernels (mla_*.cu) share one layout.
 *
 * Work is cut into units and chunks:
 *   row tile  the query rows of one request, flattened as row = token * heads + head
 *             (token relative to the request), in groups of INA_MLA_TILE_ROWS; a tile
 *             needs the KV positions below the causal limit of its last row.
 *   unit      (request, row tile) with its KV range [0, kv_end).
 *   chunk     a piece [kv_begin, kv_end) of a unit's KV range, processed by one CTA as
 *             one work item. Cuts lie on multiples of INA_MLA_KV_BLOCK.
 *   group     with many query rows per request (ina_mla_group_tiles > 1: the wgmma kernel's
 *             buckets), G consecutive row tiles of a request (rows [64 g, 64 g + 64) for
 *             G = 4) are placed and cut together: each cut of the group's KV range gives
 *             one item per tile that still has positions there, emitted consecutively in
 *             tile order into one CTA's list, the first carrying the count
 *             (item.group_items). A kernel may process them as one 64-row tile that reads
 *             each KV block once; the other kernels just see ordinary items.
 * A unit processed in one chunk writes the final output; a unit cut into several chunks
 * ("split") has each chunk write a partial result (fp32 o normalized by its own softmax
 * sum, and its lse) into a slot, and the combine kernel merges the slots by LSE.
 *
 * Workspace layout (byte offsets from ina_mla_sched_layout; every part aligned to
 * INA_MLA_WS_ALIGN). The schedule part is the host workspace and the prefix of the
 * device workspace; partial results live only on the device:
 *   header                       ina_mla_sched_header_t
 *   cta_indptr [num_ctas + 1]    work items of CTA c: items[cta_indptr[c] .. [c+1])
 *   requests   [max_batch]       ina_mla_sched_request_t
 *   token_request [max_batch]    sparse plans (ina_mla_sparse_plan): the step's request
 *                                of each query token, whose pages its selected positions
 *                                name (there every query token is a request of its own)
 *   merges     [max_merges]      ina_mla_sched_merge_t, the first header.num_merges used
 *   items      [max_items]       ina_mla_sched_item_t, the first header.num_items used
 *   partial_o  [max_slots][INA_MLA_TILE_ROWS][kv_lora_rank] f32     (device only)
 *   partial_lse [max_slots][INA_MLA_TILE_ROWS] f32                  (device only)
 * Every size depends on the bucket alone (max_batch, max_q_len, heads, kv_lora_rank,
 * SM count), never on the lengths of a step, so the kernels' grids and the pointers in
 * a captured CUDA graph stay valid from one plan to the next.
 *
 * Thread safety: plain data and pure functions. */
#ifndef INA_MLA_MLA_SCHEDULE_H
#define INA_MLA_MLA_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The inline helpers below run on the host and in the kernels. */
#ifdef __CUDACC__
#define INA_MLA_HOST_DEVICE __host__ __device__
#else
#define INA_MLA_HOST_DEVICE
#endif

#define INA_MLA_TILE_ROWS 16  /* query rows per unit: the M of one mma.sync tile */
#define INA_MLA_GROUP_TILES 4 /* row tiles per group in grouped plans: the M of one wgmma tile */
#define INA_MLA_GROUP_MIN_ROWS 64 /* query rows per request (bucket) from which plans group */
#define INA_MLA_KV_BLOCK 64   /* cut granularity: a multiple of every kernel's KV block */
#define INA_MLA_CHUNK_COST 64 /* fixed cost of a chunk (query load, output write) in tokens */
#define INA_MLA_CTAS_PER_SM 2 /* the fast kernel fits two CTAs in an SM's shared memory */
#define INA_MLA_WS_ALIGN 256

/* Kernel variants reported in ina_mla_plan_info_t.path. */
#define INA_MLA_PATH_GENERIC 0 /* any dims: simple fp32 kernel */
#define INA_MLA_PATH_FAST 1    /* kv_lora_rank 512, rope 64: mma.sync tensor cores */

typedef struct ina_mla_sched_header {
  int32_t batch;
  int32_t total_tokens;
  int32_t num_items;
  int32_t num_merges;
} ina_mla_sched_header_t;

typedef struct ina_mla_sched_request {
  int32_t q_begin; /* qo_indptr[b] */
  int32_t q_len;
  int32_t kv_len;
  int32_t num_tiles; /* ina_mla_tiles(q_len, heads) */
} ina_mla_sched_request_t;

typedef struct ina_mla_sched_item {
  int32_t request;
  int32_t tile;
  int32_t kv_begin;
  int32_t kv_end;
  int32_t slot; /* partial-result slot, or -1: the unit is not split, write the output */
  /* Items of this chunk's group, this one first (the next group_items - 1 items are the
   * group's later tiles in this chunk, in tile order, same kv_begin, non-decreasing
   * kv_end); 0 on those later items. Always 1 in ungrouped plans. */
  int32_t group_items;
  int32_t reserved[2];
} ina_mla_sched_item_t;

typedef struct ina_mla_sched_merge {
  int32_t request;
  int32_t tile;
  int32_t first_slot; /* the unit's chunks wrote slots first_slot .. + num_splits - 1 */
  int32_t num_splits;
} ina_mla_sched_merge_t;

typedef struct ina_mla_sched_layout {
  int32_t num_ctas;
  int32_t max_batch;
  int32_t group_tiles; /* ina_mla_group_tiles of the bucket: 1 or INA_MLA_GROUP_TILES */
  int32_t max_items;  /* units of the bucket + one extra chunk per tile of a group per CTA boundary */
  int32_t max_merges; /* at most one split group (group_tiles units) per CTA boundary */
  int32_t max_slots;  /* at most two partial chunks per split unit and CTA boundary */
  int32_t kv_lora_rank;
  size_t header, cta_indptr, requests, token_request, merges, items; /* byte offsets */
  size_t schedule_bytes;                              /* host workspace size */
  size_t partial_o, partial_lse;                      /* byte offsets, device only */
  size_t device_bytes;                                /* device workspace size */
} ina_mla_sched_layout_t;

/* Layout for a bucket; INA_ERR_INVALID_ARGUMENT when it does not fit in 32-bit counts. */
ina_status_t ina_mla_sched_layout(int32_t max_batch, int32_t max_q_len, int32_t num_heads,
                                  int32_t kv_lora_rank, int32_t rope_dim, int32_t num_ctas,
                                  ina_mla_sched_layout_t *out);

/* Row tiles per group of a bucket: INA_MLA_GROUP_TILES for DeepSeek's dims (512 + 64)
 * when a request may have INA_MLA_GROUP_MIN_ROWS query rows or more (many heads, or
 * several query tokens), where reading each KV block once for 64 rows pays; else 1. A
 * function of the bucket alone, like every size of the layout. */
INA_MLA_HOST_DEVICE static inline int32_t ina_mla_group_tiles(int32_t max_q_len, int32_t num_heads,
                                                              int32_t kv_lora_rank, int32_t rope_dim) {
  const int grouped = kv_lora_rank == 512 && rope_dim == 64 &&
                      (int64_t)max_q_len * num_heads >= INA_MLA_GROUP_MIN_ROWS;
  return grouped ? INA_MLA_GROUP_TILES : 1;
}

/* Row tiles of a request with q_len query tokens. */
INA_MLA_HOST_DEVICE static inline int32_t ina_mla_tiles(int32_t q_len, int32_t num_heads) {
  return (q_len * num_heads + INA_MLA_TILE_ROWS - 1) / INA_MLA_TILE_ROWS;
}

/* KV positions row `row` of a request (row = token * heads + head) may see: causal, the
 * request's q_len tokens being the last of its kv_len. */
INA_MLA_HOST_DEVICE static inline int32_t ina_mla_row_limit(int32_t row, int32_t num_heads, int32_t q_len,
                                        int32_t kv_len) {
  return kv_len - q_len + row / num_heads + 1;
}

/* KV positions a row tile needs: the limit of its last row. */
INA_MLA_HOST_DEVICE static inline int32_t ina_mla_tile_kv_end(int32_t tile, int32_t num_heads, int32_t q_len,
                                          int32_t kv_len) {
  const int32_t rows = q_len * num_heads; /* the plan keeps max_q_len * heads in int32 */
  int32_t last = (tile + 1) * INA_MLA_TILE_ROWS;
  if (last > rows) last = rows;
  return ina_mla_row_limit(last - 1, num_heads, q_len, kv_len);
}

/* ---- the host scheduler's pieces (mla_plan.c) -------------------------------------- */

struct ina_mla_plan_params;
struct ina_mla_plan_info;

/* The checks of a bucket's params (struct version, heads, dims, page size, SM count);
 * resolves *num_sms from p->num_sms, 0 meaning the current device's. */
ina_status_t ina_mla_check_bucket(const struct ina_mla_plan_params *p, int32_t *num_sms);

/* Cuts the `batch` requests already written at l->requests of host_ws (total_tokens
 * query tokens) into the work items of the layout's CTAs, writes the schedule there,
 * copies its used part to device_ws (when not NULL) on `stream`, and sets info's
 * num_ctas, num_splits_max, total_tokens and device_bytes. */
ina_status_t ina_mla_schedule_requests(const ina_mla_sched_layout_t *l, int32_t num_heads,
                                       int32_t batch, int32_t total_tokens, void *host_ws,
                                       void *device_ws, void *stream,
                                       struct ina_mla_plan_info *info);

/* ---- device side, implemented in the CUDA sources (stubs without CUDA) ------------- */

/* SM count of the current device. */
ina_status_t ina_mla_device_num_sms(int32_t *out);
/* Asynchronous host-to-device copy of the schedule on `stream` (a cudaStream_t). */
ina_status_t ina_mla_copy_schedule(void *device_ws, const void *host_ws, size_t bytes,
                                   void *stream);

#ifdef __cplusplus
}
#endif
#endif
