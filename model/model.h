/* A DeepSeek-V2/V3 model and the engine that runs it.
 *
 * ina_model_t holds the configuration and weights (from a Hugging Face checkpoint
 * directory, or seeded random weights of a built-in configuration). ina_engine_t holds
 * what running needs: the paged latent KV cache, a thread pool, RoPE tables. A model can
 * back several engines; it must outlive them.
 *
 * One call of ina_engine_forward runs one step over a batch of sequences, each adding
 * its own number of new tokens (a whole prompt, a prefill chunk, or one decode token):
 * continuous batching mixes them freely. Sequences with one new token and a cached
 * context use absorbed MLA over the latent cache; the others use the expanded form.
 *
 * Backends: the CPU engine (model/engine_cpu.c) and the CUDA engine (model/engine_gpu.c),
 * chosen by ina_engine_options_t.device; model/engine.c dispatches. Both validate a batch
 * the same way and keep the same page bookkeeping (the pool of ina_engine_page_pool).
 *
 * Ownership: create/destroy pairs; a failed create sets *out = NULL; destroy(NULL) is a
 * no-op. Thread safety: one thread drives an engine at a time. */
#ifndef INA_MODEL_MODEL_H
#define INA_MODEL_MODEL_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "kvcache/kv_seq.h"
#include "kvcache/page_pool.h"
#include "model/config.h"
#include "model/weights.h"
#include "moe_ep/expert_placement.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_model ina_model_t;

typedef struct ina_model_options {
  size_t struct_size;
  uint32_t version;
  uint64_t seed;      /* random weights */
  ina_dtype_t dtype;  /* random weights: f32, bf16 (default) or fp8_e4m3 */
  ina_shard_t shard;  /* experts held by this rank */
  /* Version 2. Random weights only: 1 leaves them unbuilt on the host; an engine on a
   * CUDA device then generates the same values (same seed, dtype) in its own memory,
   * which is how 16B-parameter benchmark models load in seconds. The host holds the
   * configuration alone: ina_model_weights has no tensor data, and a CPU engine refuses
   * the model. */
  int32_t random_on_device;
} ina_model_options_t;

#define INA_MODEL_OPTIONS_INIT \
  {sizeof(ina_model_options_t), 2, 0, INA_DTYPE_BF16, INA_SHARD_INIT, 0}

/* `spec` is a checkpoint directory, a built-in name ("tiny"), or "random:NAME". */
ina_status_t ina_model_open(const char *spec, const ina_model_options_t *options, ina_model_t **out);
/* The configuration `spec` names, without loading weights (to size a shard first). */
ina_status_t ina_model_spec_config(const char *spec, ina_model_config_t *out);
void ina_model_destroy(ina_model_t *model);
const ina_model_config_t *ina_model_config(const ina_model_t *model);
const ina_weights_t *ina_model_weights(const ina_model_t *model);
/* 1 when the model was loaded from a checkpoint directory, 0 for a built-in model's
 * seeded random weights. */
int ina_model_from_checkpoint(const ina_model_t *model);
/* 1 when the model's random weights were left for a device engine to generate
 * (ina_model_options_t.random_on_device), with their seed and dtype; else 0. */
int ina_model_random_on_device(const ina_model_t *model, uint64_t *seed, ina_dtype_t *dtype);
/* Bytes of weight data held (stored dtypes). */
int64_t ina_model_weight_bytes(const ina_model_t *model);

typedef struct ina_engine ina_engine_t;

typedef struct ina_engine_options {
  size_t struct_size;
  uint32_t version;
  int32_t page_size;   /* tokens per KV page (default 16) */
  int64_t max_tokens;  /* KV capacity in tokens over all sequences (default 65536) */
  int32_t num_threads; /* <= 0: INA_NUM_THREADS or all CPUs */
  int expanded_decode; /* 1: decode with the expanded form too (for testing absorption) */
  /* Version 2. Where the engine runs: -1 (default) the CPU backend (fp32 on the stored
   * weights); >= 0 the CUDA device of that ordinal (model/engine_gpu.c: bf16 activations,
   * weights uploaded as bf16 or kept FP8; INA_ERR_UNSUPPORTED in a build without CUDA or
   * for what that backend does not cover). num_threads and expanded_decode are CPU-only. */
  int32_t device;
  /* Version 3. CUDA backend: 1 (default) runs decode steps (one new token per sequence)
   * as replays of CUDA graphs captured per batch bucket; 0 runs every step eagerly. */
  int32_t cuda_graphs;
  /* Version 4. Expert parallelism: the communicator of the ranks that share
   * the routed experts, or NULL for one rank holding them all. Each rank's model holds one
   * contiguous expert range (ina_shard_t); the ranges, in rank order, must tile all
   * experts (checked at create, collectively). Every rank runs the same batches: tokens
   * are replicated, each rank runs its own experts, and the expert outputs travel to
   * every rank by one all-gather per MoE layer, where the CPU backend combines them in
   * the single-rank order, so its logits are bit-identical to one rank's. Borrowed: the
   * communicator must outlive the engine. */
  ina_comm_t *ep_comm;
  /* Tensor parallelism: the communicator of the ranks that split attention
   * heads and MLP intermediates (ina_shard_t tp_rank / tp_size must be this rank's place
   * in it), or NULL for one rank. The partial outputs of o_proj and of each MLP / MoE
   * block are summed by one all-reduce each; every rank runs the same batches. With both,
   * ep_comm joins the ranks of one tensor-parallel slice. Borrowed, as ep_comm.
   * The CUDA backend takes both as communicators whose all-reduce runs on its device
   * (NCCL): its tensor-parallel partial sums match one GPU's logits to rounding; its
   * expert-parallel ranks each compute their experts' rows and all-reduce the expert
   * outputs, which keeps expert parallelism alone bit for bit one GPU's
   * (model/engine_gpu.c). */
  ina_comm_t *tp_comm;
  /* Version 5. Bytes of routed-expert weights a rank may hold after a placement change
   * (ina_engine_apply_placement); 0: only the memory available (host or device) limits
   * it. */
  int64_t max_expert_bytes;
  /* Version 6. Attention data parallelism (CPU backend, with ep_comm): the ranks of
   * ep_comm compute attention and the dense layers for different sequences; at each MoE
   * layer their tokens are gathered in rank order, the layer runs over all of them as
   * with expert parallelism, and each rank keeps its own tokens' outputs. Logits are
   * bit-identical to one rank running the same sequences.
   *   0  off (default): every rank computes the whole batch.
   *   1  every rank passes its own batch. The ranks must step together: a rank with
   *      nothing to run calls ina_engine_forward with an empty batch (batch 0), and a
   *      batch one rank refuses (bad token ids, no pages) leaves the others waiting, so
   *      callers check their batches first.
   *   2  every rank passes the same batch (replicated schedulers): a sequence is
   *      computed by the rank its first page picks (page id mod ranks, stable while it
   *      lives, shared with its prefix), every rank's page bookkeeping grows alike, and
   *      the logits rows travel to every rank, which returns them all. The page pool
   *      then has a stripe per rank (kvcache/page_pool.h), so a sequence keeps to its
   *      rank's pages, and the CUDA backend stores only its own stripe: each GPU holds
   *      1 / ranks of max_tokens.
   * The CUDA backend takes mode 2: the MoE layers gather every rank's rows over ep_comm
   * (NCCL, in the decode graphs too), each rank's rows padded to the largest rank's. */
  int32_t attention_dp;
  /* Version 7. 1: the CUDA backend times the parts of every step on its device (CUDA events
   * between them, replayed graphs included), read by ina_engine_step_split; 0 (default)
   * off. Costs an event record per part (a few per layer). */
  int32_t step_split;
  /* Version 8. The CPU backend's arithmetic (ina_engine_numerics_t): fp32 on the stored
   * weights (the default), or rounded where the CUDA backend rounds, the oracle its tests
   * compare it with. The CUDA backend takes only INA_ENGINE_NUMERICS_F32 (its own). */
  int32_t numerics;
  /* Version 9. How the MoE layers of an expert-parallel group exchange tokens
   * (ina_engine_ep_exchange_t): AUTO (default) takes DISPATCH on the CPU backend under
   * attention_dp and ALLGATHER otherwise. DISPATCH (moe_ep/dispatch.h) sends each token
   * only to its experts' ranks and the outputs back; ALLGATHER gives every rank every
   * row. Both equal one rank bit for bit with the F32 payload. The CUDA backend takes
   * ALLGATHER only (DISPATCH: INA_ERR_UNSUPPORTED until its NVLink backend exists). */
  int32_t ep_exchange;
  /* DISPATCH only: the received rows' layout (ina_ep_layout_t: contiguous, or masked
   * with ep_max_tokens rows per rank and slot, every rank the same), and the rows'
   * payload (ina_ep_payload_t: F32 exact; BF16 exact on bf16 values; FP8 rounds). */
  int32_t ep_layout;
  int32_t ep_payload;
  int64_t ep_max_tokens;
  /* Version 10. Micro-batches of a step under the DISPATCH exchange: 1 (default, 0 too)
   * runs the batch whole; 2 runs two-batch overlap: the rank's sequences split in two
   * halves of about equal tokens, whose layers interleave so that one half's exchange
   * (started, then finished later: moe_ep/dispatch.h) travels while the other half
   * computes its attention or experts. Every rank of the group must take the same value;
   * logits are bit-identical to one batch's. Other exchanges take 1 only. */
  int32_t micro_batches;
  /* Version 11. DeepSeek-V3.2's index keys in the KV cache (ina_engine_index_keys_t):
   * bf16 (0, default), or FP8: DeepSeek's release indexer, FP8 e4m3 keys with one f32
   * scale per token (attention/dsa.h's INA_DSA_KEY_FP8) and each head's index query
   * quantized to FP8 alike, the products on FP8 tensor cores (attention/dsa_gpu.h's
   * INA_DSA_GPU_QUERY_FP8; the GPU engine needs an sm_90 GPU for it). The CPU engine
   * computes the same function (it stores the dequantized keys and rounds the query with
   * ina_dsa_index_query_round_fp8). Other models ignore it. */
  int32_t index_keys;
} ina_engine_options_t;

typedef enum ina_engine_index_keys {
  INA_ENGINE_INDEX_KEYS_BF16 = 0,
  INA_ENGINE_INDEX_KEYS_FP8 = 1,
} ina_engine_index_keys_t;

typedef enum ina_engine_ep_exchange {
  INA_ENGINE_EP_EXCHANGE_AUTO = 0,
  INA_ENGINE_EP_EXCHANGE_ALLGATHER = 1,
  INA_ENGINE_EP_EXCHANGE_DISPATCH = 2,
} ina_engine_ep_exchange_t;

/* "auto", "allgather", "dispatch"; "unknown" otherwise. */
const char *ina_engine_ep_exchange_name(int32_t exchange);

/* The command-line names of the two options above (--index-keys, --ep-exchange): "bf16"
 * or "fp8", and "allgather" or "dispatch", give their value; any other string (or NULL)
 * gives -1, for the caller's error message. */
int32_t ina_engine_index_keys_parse(const char *name);
int32_t ina_engine_ep_exchange_parse(const char *name);

/* What this rank's MoE layers sent to other ranks since the engine started (bytes on the
 * wire, payload and metadata), and how: exchange is the resolved kind (ALLGATHER with no
 * expert parallelism). */
typedef struct ina_engine_ep_traffic {
  int32_t exchange;
  int64_t layers;          /* MoE layer exchanges */
  int64_t rows_sent;       /* (token, destination rank) pairs sent to other ranks */
  int64_t dispatch_bytes;  /* rows on their way to the experts (with their slot entries) */
  int64_t combine_bytes;   /* outputs on their way back */
  int64_t wait_ns;         /* time blocked finishing the exchanges: what compute did not hide */
  int32_t micro_batches;   /* of each step (ina_engine_options_t.micro_batches) */
} ina_engine_ep_traffic_t;

ina_status_t ina_engine_ep_traffic(const ina_engine_t *engine, ina_engine_ep_traffic_t *out);

/* INA_ENGINE_NUMERICS_GPU rounds to bf16 exactly where the CUDA engine stores bf16:
 * weights (f32 checkpoints rounded, FP8 weights the GPU cannot multiply in FP8
 * dequantized and rounded), the residual stream, every op's output, the latent cache,
 * and e4m3-quantizes activations (1 x 128 blocks) where it runs an FP8 GEMM. Prefill
 * then attends in absorbed form, as the GPU does. Its rules live in engine_cpu_numerics.c. */
typedef enum ina_engine_numerics {
  INA_ENGINE_NUMERICS_F32 = 0,
  INA_ENGINE_NUMERICS_GPU = 1,
} ina_engine_numerics_t;

#define INA_ENGINE_OPTIONS_INIT \
  {sizeof(ina_engine_options_t), 11, 16, 65536, 0, 0, -1, 1, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

ina_status_t ina_engine_create(const ina_model_t *model, const ina_engine_options_t *options,
                               ina_engine_t **out);
void ina_engine_destroy(ina_engine_t *engine);
ina_page_pool_t *ina_engine_page_pool(ina_engine_t *engine);
const ina_model_config_t *ina_engine_config(const ina_engine_t *engine);

typedef struct ina_batch {
  int32_t batch;
  ina_kv_seq_t *const *seqs;  /* [batch]; grown by this step's tokens */
  const int32_t *qo_indptr;   /* [batch + 1]: new tokens of sequence i are tokens[qo_indptr[i]..) */
  const int32_t *tokens;      /* [qo_indptr[batch]] */
  int all_logits;             /* 1: logits of every new token; 0: of each sequence's last token */
} ina_batch_t;

/* Tokens routed to each routed expert since creation or the last reset, per MoE layer:
 * counts[m * n_routed_experts + x] for the m-th MoE layer (in layer order); *num_moe_layers
 * receives the number of MoE layers. capacity is the length of counts (too small:
 * INA_ERR_INVALID_ARGUMENT; counts may be NULL with capacity 0 to ask for the size).
 * reset != 0 zeroes the counters after reading. Any thread (the counters are locked).
 * Expert-parallel engines count every token (routing is replicated). The CUDA backend
 * counts on the device in every step (padding rows of a graph step excluded) and a read
 * returns the counts of the steps the device has finished. */
ina_status_t ina_engine_expert_load(ina_engine_t *engine, int reset, uint64_t *counts,
                                    int64_t capacity, int32_t *num_moe_layers);

/* The expert placement in force (moe_ep/expert_placement.h) into *out; the caller frees it
 * with ina_expert_placement_free. An engine without expert parallelism has ep 1. Driver
 * thread only (ina_engine_apply_placement changes it). */
ina_status_t ina_engine_get_placement(ina_engine_t *engine, ina_expert_placement_t *out);

/* Switch the routed experts to placement p, between steps (driver thread). Collective over
 * the engine's ep_comm and tp_comm: every rank calls it with the same p, which is checked
 * (ranks that disagree fail with INA_ERR_INVALID_ARGUMENT). p must be valid, with the
 * engine's ep, MoE layers and experts (INA_ERR_INVALID_ARGUMENT naming the offence), and
 * fit: each rank's new experts within the memory available and max_expert_bytes
 * (INA_ERR_OUT_OF_MEMORY). A rank receives the experts it lacks from the lowest rank that
 * holds them; then every rank switches, or, when any rank failed, none does and the engine
 * runs on as before. Outputs do not change: a replicated expert's tokens are split among
 * its replicas, which compute bit-identical rows. dry_run != 0 validates and checks the
 * memory only. *bytes_moved receives the expert bytes all ranks received (would
 * receive). A communicator failure is returned as it is and leaves the job unusable. The
 * CUDA backend moves experts between its expert-parallel GPUs the same way (device
 * memory checked, NCCL); without expert parallelism it accepts only the placement in
 * force (INA_ERR_UNSUPPORTED otherwise). */
ina_status_t ina_engine_apply_placement(ina_engine_t *engine, const ina_expert_placement_t *p,
                                        int dry_run, int64_t *bytes_moved);

/* Device time of the steps since creation or the last reset, split by part (the CUDA
 * backend created with step_split 1; INA_ERR_UNSUPPORTED otherwise). Each part is the
 * time between the events around it on the step's stream, so a collective's share holds
 * its wait for the slowest peer. The parts add up to the steps' device time from the
 * embedding to the logits. reset != 0 zeroes the sums after reading. Driver thread. */
typedef struct ina_engine_step_split {
  int64_t steps;       /* steps timed */
  double attention_ms; /* q/kv projections, KV append, RoPE, MLA, o_proj */
  double moe_ms;       /* router, permutation, routed and shared experts, weighted combine */
  double ep_comm_ms;   /* expert parallelism: the expert outputs' sum, attention DP's gathers */
  double tp_comm_ms;   /* tensor parallelism: the all-reduces with their residual add + RMSNorm */
  double other_ms;     /* embedding, RMSNorm without TP, dense MLPs, the LM head, the logits */
} ina_engine_step_split_t;
ina_status_t ina_engine_step_split(ina_engine_t *engine, int reset, ina_engine_step_split_t *out);

/* A host buffer for the logits of `rows` rows ([rows, vocab] f32) that this engine's
 * forward writes fastest: page-locked memory for the CUDA backend (its copy from the
 * device then runs at the link's speed, several times a pageable copy's), plain memory
 * for the CPU one. NULL when out of memory. Free it with ina_engine_logits_free on the
 * same engine, before the engine is destroyed. */
float *ina_engine_logits_alloc(ina_engine_t *engine, int64_t rows);
void ina_engine_logits_free(ina_engine_t *engine, float *logits);

/* Run one step. logits: [qo_indptr[batch], vocab] when all_logits, else [batch, vocab].
 * Token ids outside [0, vocab) give INA_ERR_INVALID_ARGUMENT; INA_ERR_OUT_OF_PAGES leaves
 * every sequence as it was. */
ina_status_t ina_engine_forward(ina_engine_t *engine, const ina_batch_t *batch, float *logits);

/* The same step, returning instead of each logits row its greedy token: tokens[row] =
 * ina_argmax_f32 of that row (model/sampler.h: the first largest logit, NaN skipped), or
 * -1 when every logit of the row is NaN (where a greedy ina_sampler_sample fails), with
 * the rows of ina_engine_forward's logits. The CUDA backend chooses on the device
 * (ina_gpu_sample at temperature 0: the same tokens) and copies only the tokens to the
 * host, not the [rows, vocab] f32 logits. */
ina_status_t ina_engine_forward_greedy(ina_engine_t *engine, const ina_batch_t *batch, int32_t *tokens);

/* Called during a forward, on the calling thread, once layer `layer`'s KV entries of the
 * step's new tokens are written (the step's pages are already taken then), so that a
 * transfer can send that layer while the later ones compute (prefill/decode
 * disaggregation). The CPU engine calls it, except with two-batch overlap (its layers
 * interleave two halves); the CUDA engine never does (its layers finish on the device).
 * fn NULL: none. Driver thread only (between forwards). */
typedef void (*ina_engine_layer_fn)(int32_t layer, void *user_data);

/* Where the engine's KV entries live, for a transfer that reads or writes them in place
 * (prefill/decode disaggregation): one buffer laid out as the page pool says,
 * [num_layers][num_pages][page_size][entry_elems] of its dtype (kvcache/page_pool.h),
 * in host memory for the CPU engine (*on_device 0) and in the CUDA device's for the CUDA
 * engine (*on_device 1, *device its ordinal; entries are written by the engine's
 * forwards, complete when a forward has returned). INA_ERR_UNSUPPORTED where the
 * entries are not one such buffer (the CUDA engine under attention DP keeps only its
 * stripe). */
ina_status_t ina_engine_kv_storage(ina_engine_t *engine, void **base, size_t *bytes, int *on_device,
                                   int32_t *device);
void ina_engine_set_layer_hook(ina_engine_t *engine, ina_engine_layer_fn fn, void *user_data);

#ifdef __cplusplus
}
#endif
#endif
