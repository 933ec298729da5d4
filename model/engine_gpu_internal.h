/* The CUDA engine's state, shared by the files of the CUDA backend (engine_gpu.c: the
 * step; engine_gpu_placement.c: expert placements). Internal to model/; host C over the
 * CUDA runtime, built only with CUDA. */
#ifndef INA_MODEL_ENGINE_GPU_INTERNAL_H
#define INA_MODEL_ENGINE_GPU_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "attention/dsa_gpu.h"
#include "comm/custom_ar.h"
#include "gemm/gemm.h"
#include "gpu_ops/gpu_ops.h"
#include "kvcache/kv_seq.h"
#include "mla/mla.h"
#include "mla/mla_absorb.h"
#include "model/engine_backend.h"
#include "model/engine_gpu.h"
#include "moe_ep/moe_gpu.h"

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
  /* V3.2's indexer (NULL without): query heads, key, head weights, selected positions */
  uint16_t *iq;      /* bf16 [cap, index heads, index dim] */
  uint16_t *ik;      /* bf16 [cap, index dim] */
  float *iw;         /* f32 [cap, index heads] */
  int32_t *sel;      /* [cap, index_topk] */
  uint16_t *g, *u, *a; /* bf16 [rows, widest intermediate] */
  uint16_t *xe, *ye; /* bf16 [rows, hidden]: expert inputs / outputs in sorted-slot order */
  uint16_t *shared;  /* bf16 [cap, hidden] */
  uint16_t *fin;     /* bf16 [cap, hidden]: final-normed rows that get logits */
  /* Attention data parallelism: every rank's rows of h and their page ids (padding rows
   * negative), gathered in rank order for the MoE layers; the MoE buffers below hold
   * dp_size * cap token rows. NULL without. */
  uint16_t *h_all;   /* bf16 [dp_size * cap, hidden] */
  int32_t *page_ids_all; /* [dp_size * cap] */
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

/* The parts of a step whose device time ina_engine_step_split reports. */
typedef enum gpu_split_part {
  SPLIT_ATTENTION,
  SPLIT_MOE,
  SPLIT_EP_COMM,
  SPLIT_TP_COMM,
  SPLIT_OTHER,
  SPLIT_PARTS
} gpu_split_part_t;

/* Step split timing (engine_gpu_split.c): events[i] marks where part[i] begins; count
 * marks per step (the same for every step of an engine). */
typedef struct gpu_split {
  int on;
  cudaEvent_t *events;
  uint8_t *part;
  int32_t cap, count;
  int32_t forward_marks; /* those of enqueue_forward (a graph replays them) */
  int64_t steps;
  double ms[SPLIT_PARTS];
} gpu_split_t;

ina_status_t gpu_split_init(gpu_split_t *s, int32_t num_layers);
void gpu_split_free(gpu_split_t *s);
/* A step's marks start again (eager enqueue or graph capture). */
void gpu_split_begin(gpu_split_t *s);
/* Part `part` begins here on `stream` (nothing when off). */
ina_status_t gpu_split_mark(gpu_split_t *s, gpu_split_part_t part, cudaStream_t stream);
/* After the step synchronized: its intervals added to the sums. */
ina_status_t gpu_split_end_step(gpu_split_t *s);

/* Attention data parallelism's host state (engine_gpu_dp.c): this rank's sequences of
 * the step's batch, and what every rank computes. Host arrays grow as needed. */
typedef struct gpu_dp {
  ina_kv_seq_t **seqs;       /* [batch_cap]: our sequences, in batch order */
  int32_t *qo_indptr;        /* [batch_cap + 1]: their new tokens' rows */
  int32_t *owner;            /* [batch_cap]: each sequence's rank */
  int64_t *first_row;        /* [batch_cap]: its first logits row among its rank's */
  int32_t batch_cap;
  int32_t *tokens;           /* [token_cap]: our new tokens */
  int64_t token_cap;
  int64_t *rank_tokens, *rank_seqs, *rank_rows; /* [dp_size]: new tokens, sequences, logits rows */
  float *logits_all;         /* device [dp_size * logits_rows, vocab]: every rank's logits rows */
  float *logits_ordered;     /* device, as large: those rows in batch order */
  int64_t logits_rows;       /* rows per rank they have room for */
  int32_t *order_host, *order_dev; /* pinned / device [dp_size * logits_rows]: each batch
                                    * row's place in logits_all */
  int32_t *tokens_host;      /* [tokens_cap]: every rank's greedy tokens, as gathered */
  int64_t tokens_cap;
} gpu_dp_t;

/* What a step computes on this rank: its batch (the whole one, or its sequences under
 * attention DP), padded alike on every rank to `rows` token rows, `seqs` sequences for
 * the attention plan and the last-row list, and `out_rows` logits rows. */
typedef struct step_shape {
  ina_batch_t mine;
  int graphed;      /* a decode step replayed from the graph of bucket `rows` */
  int64_t rows;
  int32_t seqs;
  int64_t out_rows;
} step_shape_t;

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
  int32_t mutation; /* ina_engine_mutation_t of model/engine_test_hooks.h: a test's deliberate bug */
  ina_router_config_t router;
  int32_t heads;          /* attention heads of this rank (num_heads / tp) */
  int32_t tp_size;
  int64_t max_expert_bytes; /* ina_engine_options_t.max_expert_bytes */
  ina_comm_t *tp_comm;    /* NULL: one rank */
  ina_comm_t *ep_comm;    /* NULL: this rank holds every routed expert */
  ina_custom_ar_t *tp_ar, *ep_ar; /* their all-reduces; NULL for one rank */
  int32_t local_experts;  /* routed experts held: w.expert_end - w.expert_begin */
  int32_t ep_size, ep_rank;
  int32_t *ep_ranges;
  /* Attention data parallelism (attention_dp 2): the expert-parallel ranks split the
   * batch's sequences (dp_size = ep_size, dp_rank = ep_rank); else 1 and 0. */
  int32_t dp_size, dp_rank;
  gpu_dp_t dp;     /* [2 * ep_size]: every expert-parallel rank's [begin, end) */
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
  /* DeepSeek-V3.2's sparse attention (has_indexer): the indexer's step plan workspaces,
   * and its score rows [cap, dsa_kv_cap], dsa_kv_cap a power of two >= every kv_len so
   * far (the score and top-k grids depend on it: graphs are dropped when it grows). */
  int has_indexer;
  int fp8_index_keys; /* options: index keys in FP8 (e4m3 + f32 scale), else bf16 */
  void *dsa_host_ws, *dsa_dev_ws;
  size_t dsa_host_cap, dsa_dev_cap;
  float *dsa_scores;
  int64_t dsa_scores_cap; /* elements */
  int32_t dsa_kv_cap;
  int32_t *offsets_host;  /* pinned [experts + 1] */
  int32_t *tokens_dev;    /* [tokens_cap]: a greedy step's tokens */
  ina_gpu_sampling_row_t *greedy_params_dev; /* [tokens_cap]: temperature 0 */
  int64_t tokens_cap;
  ina_page_table_t table;
  /* host scratch per sequence: attention lengths and the copy-on-write check */
  int32_t *kv_len, *cow_page, *cow_index, *cow_tokens;
  int32_t seq_cap;
  gpu_split_t split;
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

/* engine_gpu_dp.c, attention data parallelism (e->dp_size > 1). */
ina_status_t gpu_dp_init(ina_engine_gpu_t *e);
void gpu_dp_free(ina_engine_gpu_t *e);
/* This rank's sequences of batch b (grown already: their first pages pick their ranks)
 * into sh->mine, and the rows, sequences and logits rows every rank computes. */
ina_status_t gpu_dp_split(ina_engine_gpu_t *e, const ina_batch_t *b, int graphed, step_shape_t *sh);
/* After the step's forward is enqueued (its logits rows in s.logits): every rank's rows
 * gathered over ep_comm and put in batch order on the device (*out), on the step's
 * stream. */
ina_status_t gpu_dp_order_logits(ina_engine_gpu_t *e, const ina_batch_t *b, const step_shape_t *sh,
                                 const float **out);
/* The greedy alternative: each rank's tokens of its logits rows (e->tokens_dev, then
 * every rank's after them), gathered and copied to e->dp.tokens_host, on the step's
 * stream; after it synchronized, gpu_dp_order_tokens puts them in batch order. */
ina_status_t gpu_dp_greedy_tokens(ina_engine_gpu_t *e, const step_shape_t *sh);
void gpu_dp_order_tokens(const ina_engine_gpu_t *e, const ina_batch_t *b, const step_shape_t *sh, int32_t *tokens);

#endif
