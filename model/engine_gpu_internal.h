/* The CUDA engine's state, shared by the files of the CUDA backend (engine_gpu.c: the
 * step; engine_gpu_placement.c: expert placements). Internal to model/; host C over the
 * CUDA runtime, built only with CUDA. */
#ifndef INA_MODEL_ENGINE_GPU_INTERNAL_H
#define INA_MODEL_ENGINE_GPU_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "comm/custom_ar.h"
#include "gemm/gemm.h"
#include "gpu_ops/gpu_ops.h"
#include "kvcache/kv_seq.h"
#include "mla/mla.h"
#include "mla/mla_absorb.h"
#include "model/engine_backend.h"
#include "model/engine_gpu.h"

#define MAX_STEP_BUFFERS 40
/* Decode buckets with a graph: batch 1, 2, 4, ... up to MAX_GRAPH_BATCH. */
#define MAX_GRAPH_BATCH 512
#define MAX_GRAPHS 10

/* Device buffers of one step, for up to `cap` tokens. */
typedef struct gpu_step {
  int64_t cap;       /* tokens */
  int64_t rows;      /* expert rows: cap * top_k (cap without MoE) */
  uint16_t *x;       /* bf16 [cap, hidden]: the residual stream */
  uint16_t *delta;   /* bf16 [cap, hidden]: a block's output, added by the next norm */
  uint16_t *h;       /* bf16 [cap, hidden]: normalized input of a block */
  uint16_t *qa;      /* bf16 [cap, q_lora_rank] */
  uint16_t *q;       /* bf16 [cap, heads, qk_head_dim] */
  uint16_t *kv;      /* bf16 [cap, kv_lora_rank + rope] */
  uint16_t *q_abs;   /* bf16 [cap, heads, kv_lora_rank] */
  uint16_t *o_lat;   /* bf16 [cap, heads, kv_lora_rank] */
  uint16_t *attn;    /* bf16 [cap, heads, v_head_dim] */
  uint16_t *g, *u, *a; /* bf16 [rows, widest intermediate] */
  uint16_t *xe, *ye; /* bf16 [rows, hidden]: expert inputs / outputs in sorted-slot order */
  uint16_t *shared;  /* bf16 [cap, hidden] */
  uint16_t *fin;     /* bf16 [cap, hidden]: final-normed rows that get logits */
  float *router_logits;            /* f32 [cap, experts] */
  int32_t *topk_ids;               /* [cap, top_k] */
  float *topk_weights;             /* [cap, top_k] */
  int32_t *expert_counts, *expert_offsets; /* [experts], [experts + 1] */
  int32_t *sorted_token, *slot_of; /* [cap * top_k] */
  void *permute_ws;
  size_t permute_ws_bytes;
  uint8_t *q8;       /* e4m3 [rows, fp8_max_k]: FP8 GEMM input */
  float *q8_scale;   /* [rows * ceil(fp8_max_k / 128)] */
  float *logits;     /* f32 [cap, vocab] */
  void *owned[MAX_STEP_BUFFERS];
  int32_t num_owned;
} gpu_step_t;

/* A captured decode step for batches up to `bucket`. */
typedef struct step_graph {
  int32_t bucket;
  cudaGraphExec_t exec;
} step_graph_t;

/* One MoE layer's expert slots on an expert-parallel rank (engine_gpu_placement.c). */
typedef struct gpu_slot_layer {
  int32_t slots;             /* this rank's slots in the placement in force */
  gpu_mlp_t *w;              /* [slots]: each slot's weights (zeroed for an empty slot) */
  void **owned;              /* [slots * 6]: the slots' buffers (gate, up, down: weight then
                              * scales), received or handed over by the upload at start-up;
                              * freed when no slot of the next placement keeps them */
  int32_t *info;             /* host [slots * 3]: expert (-1 empty), replica, replicas */
  int32_t *info_dev;         /* its device copy (ina_gpu_moe_slot_rows) */
  const void **tab_w[3];     /* device [slots]: the slots' weights for the grouped GEMM */
  const float **tab_s[3];    /* device [slots]: their FP8 scales */
  int tables_owned;          /* 0: the uploaded weights' tables (gpu_layer_t) */
} gpu_slot_layer_t;

struct ina_engine_gpu {
  const ina_model_t *model;
  const ina_model_config_t *cfg;
  int32_t device;
  cudaStream_t stream;
  gpu_weights_t w;
  ina_gemm_t *gemm;
  ina_mla_absorb_t *absorb;
  int32_t absorb_max_tokens;
  ina_page_pool_t *kv;
  void *cache;            /* [layers][num_pages][page_size][C + R] bf16 */
  size_t cache_page_bytes, cache_layer_bytes;
  float *inv_freq;        /* device [rope / 2] */
  float attention_factor, softmax_scale;
  ina_router_config_t router;
  int32_t heads;          /* attention heads of this rank (num_heads / tp) */
  int32_t tp_size;
  int64_t max_expert_bytes; /* ina_engine_options_t.max_expert_bytes */
  ina_comm_t *tp_comm;    /* NULL: one rank */
  ina_comm_t *ep_comm;    /* NULL: this rank holds every routed expert */
  ina_custom_ar_t *tp_ar, *ep_ar; /* their all-reduces; NULL for one rank */
  int32_t local_experts;  /* routed experts held: w.expert_end - w.expert_begin */
  int32_t ep_size;
  int32_t *ep_ranges;     /* [2 * ep_size]: every expert-parallel rank's [begin, end) */
  /* Tokens routed per (MoE layer, expert), counted on the device by every step (graphs
   * included) and read by any thread through load_stream; load_base (under load_mu)
   * holds the counts at the last reset. */
  uint64_t *expert_load_dev; /* [num_moe_layers, experts] */
  uint64_t *load_base;
  int32_t *moe_index;        /* [num_layers]: the layer's MoE index, -1 for dense layers */
  /* Expert placement: the one in force (ep 1 without expert parallelism) and, with expert
   * parallelism, this rank's slots per MoE layer and a step's slot rows (device
   * [max_slots] each). */
  ina_expert_placement_t placement;
  gpu_slot_layer_t *slot_layers;
  int32_t *slot_begins, *slot_ends;
  int32_t max_slots;
  int32_t num_moe_layers;
  cudaStream_t load_stream;
  pthread_mutex_t load_mu;
  int load_mu_ready;
  gpu_step_t s;
  /* host inputs of a step: pinned staging and its device mirror (int32 values) */
  int32_t *stage_host, *stage_dev;
  int64_t stage_cap;
  void *mla_host_ws, *mla_dev_ws;
  size_t mla_host_cap, mla_dev_cap;
  int32_t *offsets_host;  /* pinned [experts + 1] */
  ina_page_table_t table;
  /* host scratch per sequence: attention lengths and the copy-on-write check */
  int32_t *kv_len, *cow_page, *cow_index, *cow_tokens;
  int32_t seq_cap;
  /* decode graphs */
  int use_graphs;            /* options: cuda_graphs, and every MoE layer grouped */
  step_graph_t graphs[MAX_GRAPHS];
  int32_t num_graphs;
};

/* Drops the captured decode graphs (they are captured again when next needed). */
void gpu_drop_graphs(ina_engine_gpu_t *e);

/* engine_gpu_placement.c. The placement the engine starts with (contiguous ranges, or ep
 * 1) and, with expert parallelism, its slot layers over the uploaded experts. */
ina_status_t gpu_placement_init(ina_engine_gpu_t *e);
void gpu_placement_free(ina_engine_gpu_t *e);

#endif
