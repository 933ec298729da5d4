/* The CUDA engine: one forward step of DeepSeek-V2/V3 over a ragged batch on one GPU,
 * the counterpart of engine_cpu.c built from the tested GPU parts:
 *   embedding -> per layer: RMSNorm (fused residual add) -> q (q_a -> norm -> q_b, or
 *   q_proj) -> kv_a -> append (kv norm + rope + paged cache write) -> rope on q_pe ->
 *   W_UK absorption -> MLA attention over the paged latent cache -> W_UV absorption ->
 *   o_proj -> RMSNorm (fused residual add) -> dense MLP, or MoE (router GEMM in fp32,
 *   router, permutation, per-expert GEMMs, weighted combine plus shared experts) ->
 *   final norm -> LM head in fp32 -> logits copied to the host.
 *
 * Numerics (docs/NUMERICS.md): bf16 activations between ops, fp32 accumulation inside them; the
 * residual stream is bf16 (as HF's bf16 model). Every step, prefill included, uses
 * absorbed MLA over the latent cache (mathematically the expanded form).
 *
 * Host side per step: validate the batch and grow the sequences exactly as the CPU
 * engine (engine.c), build positions, cache slots and the page table, upload them in one
 * copy from a pinned staging buffer, plan attention once for all layers. The routed
 * experts run on the grouped GEMM (gemm/gemm_grouped.h), which reads each expert's rows
 * from the device, so a step never waits on the host before its logits; a layer whose
 * experts the grouped GEMM cannot take (mixed FP8 and bf16, odd dims) reads the counts
 * back and launches one GEMM per expert instead.
 *
 * CUDA graphs. A decode step (one new token per sequence) of batch B runs as the replay
 * of a graph captured for the bucket of B (the next power of two): the step's inputs sit
 * at fixed places of the staging buffer, the attention plan is made for the bucket
 * (max_batch) and the rows past B are padding that computes harmlessly (token 0, no
 * cache write, no attention). Every buffer a graph reads keeps its address while the
 * graph lives; growing one drops the graphs, which are captured again when next needed.
 * Prefill and mixed steps run eagerly.
 *
 * Parallelism (engine options tp_comm, ep_comm; NCCL communicators of this device): as
 * the CPU engine, every rank runs the same batch. With tensor parallelism a rank holds
 * its slice of the heads and of every MLP's intermediates, and the partial outputs of
 * o_proj, of each dense MLP and of each MoE block are summed by an all-reduce on the
 * step's stream (comm/custom_ar.h: LL / one-shot over NVLink within a node, NCCL
 * otherwise) fused with the residual add and the next RMSNorm; the sums run in another order than one GPU's, so logits agree to
 * rounding, not bit for bit. With expert parallelism a rank holds a range of the routed
 * experts: the permutation is the one-GPU one, its grouped GEMM computes the rows of its
 * own experts into zeroed expert outputs, and one all-reduce of those outputs over the
 * EP group gives every rank every row exactly; the shared experts and the combine then
 * run everywhere as on one GPU, so expert parallelism alone is bit for bit one GPU's.
 * With attention data parallelism (engine_gpu_dp.c) the expert-parallel ranks split the
 * batch's sequences, each padded to the largest rank's rows; each MoE layer gathers
 * every rank's rows and runs as above over all of them, and each rank combines its own;
 * the logits rows are gathered at the end. The collectives are captured into the decode
 * graphs like any other kernel (NCCL supports stream capture); every rank replays the
 * same bucket's graph. With step_split, events between the parts of a step time them
 * (engine_gpu_split.c).
 *
 * Device memory: weights (engine_gpu_weights.c), the latent cache [layers][num_pages]
 * [page_size][kv_lora_rank + rope] bf16 (under attention DP only this rank's stripe of
 * the pool: page p at p / ranks), and step buffers sized for the largest step seen so far
 * (grown, never shrunk). The page pool keeps only the bookkeeping
 * (store_entries 0); a copy on write of a shared last page is done here, on the device. */
#define INA_LOG_SUBSYS "model"
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/custom_ar.h"
#include "core/check.h"
#include "core/cuda.h"
#include "core/cuda_check.h"
#include "core/log.h"
#include "core/fp8_quant.h"
#include "gemm/gemm.h"
#include "gemm/gemm_grouped.h"
#include "gpu_ops/gpu_ops.h"
#include "mla/mla.h"
#include "mla/mla_absorb.h"
#include "mla/mla_append.h"
#include "model/engine_backend.h"
#include "model/engine_gpu.h"
#include "model/engine_test_hooks.h"
#include "moe_ep/moe_gpu.h"

/* HF builds q_a_layernorm and kv_a_layernorm without an eps argument: the latent norms
 * use the RMSNorm default, not rms_norm_eps (as engine_cpu.c). */
#define LATENT_NORM_EPS 1e-6f

#include "model/engine_gpu_internal.h"


void gpu_drop_graphs(ina_engine_gpu_t *e) {
  for (int32_t i = 0; i < e->num_graphs; i++) cudaGraphExecDestroy(e->graphs[i].exec);
  e->num_graphs = 0;
}

/* ---- create / destroy --------------------------------------------------------------- */

static ina_status_t check_shapes(const ina_model_config_t *c) {
  ina_status_t st = INA_OK;
  const int32_t QK = ina_cfg_qk_head_dim(c);
  INA_REQUIRE(c->kv_lora_rank % 8 == 0 && QK % 8 == 0 && c->v_head_dim % 8 == 0 && c->qk_nope_head_dim % 8 == 0,
              INA_ERR_UNSUPPORTED,
              "gpu engine: the absorption GEMMs need kv_lora_rank (%d), qk_nope + qk_rope (%d), "
              "qk_nope_head_dim (%d) and v_head_dim (%d) to be multiples of 8",
              c->kv_lora_rank, QK, c->qk_nope_head_dim, c->v_head_dim);
  if (c->n_routed_experts > 0)
    INA_REQUIRE(c->n_routed_experts <= 256 && c->num_experts_per_tok <= 32 && c->n_group <= 32,
                INA_ERR_UNSUPPORTED,
                "gpu engine: the GPU router takes at most 256 experts, top-k 32 and 32 groups "
                "(model: %d experts, top-k %d, %d groups)",
                c->n_routed_experts, c->num_experts_per_tok, c->n_group);
  if (ina_cfg_has_indexer(c))
    INA_REQUIRE(c->q_lora_rank > 0 && c->index_topk <= INA_DSA_GPU_MAX_TOPK, INA_ERR_UNSUPPORTED,
                "gpu engine: DeepSeek-V3.2's indexer needs a q LoRA (q_lora_rank %d) and index_topk <= %d (%d)",
                c->q_lora_rank, INA_DSA_GPU_MAX_TOPK, c->index_topk);
fail:
  return st;
}

/* bf16 elements of V3.2's index key in a cache entry: head_dim bf16, or head_dim e4m3
 * bytes and the f32 scale, padded so that entries stay 16-byte aligned (the attention
 * and index-score kernels copy rows 16 bytes at a time). 0 without an indexer. */
static int32_t index_key_elems(const ina_engine_gpu_t *e) {
  const ina_model_config_t *c = e->cfg;
  if (!e->has_indexer) return 0;
  if (!e->fp8_index_keys) return c->index_head_dim;
  const int64_t entry = (int64_t)(c->kv_lora_rank + c->qk_rope_head_dim) * 2 + c->index_head_dim + 4;
  return (int32_t)(((entry + 15) / 16 * 16) / 2 - (c->kv_lora_rank + c->qk_rope_head_dim));
}

/* The engine's place in tensor and expert parallelism, checked against the shard the
 * model holds (the same rules as the CPU engine). */
static ina_status_t take_comms(ina_engine_gpu_t *e, const ina_weights_t *w, const ina_engine_options_t *o) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  e->tp_comm = ina_engine_options_tp_comm(o);
  e->ep_comm = ina_engine_options_ep_comm(o);
  INA_REQUIRE((!e->tp_comm || ina_comm_backend(e->tp_comm) == INA_COMM_BACKEND_NCCL) &&
                  (!e->ep_comm || ina_comm_backend(e->ep_comm) == INA_COMM_BACKEND_NCCL),
              INA_ERR_INVALID_ARGUMENT,
              "gpu engine: tp_comm and ep_comm must be NCCL communicators (their all-reduce "
              "runs on the device's memory)");
  const int32_t tp_size = e->tp_comm ? ina_comm_size(e->tp_comm) : 1;
  const int32_t tp_rank = e->tp_comm ? ina_comm_rank(e->tp_comm) : 0;
  INA_REQUIRE(w->tp_size == tp_size && w->tp_rank == tp_rank, INA_ERR_INVALID_ARGUMENT,
              "gpu engine: the model holds tensor-parallel slice %d of %d, but this rank is %d of %d in "
              "tp_comm%s",
              w->tp_rank, w->tp_size, tp_rank, tp_size, e->tp_comm ? "" : " (none given: one rank)");
  e->heads = c->num_heads / tp_size;
  e->tp_size = tp_size;
  INA_REQUIRE(e->ep_comm || (w->expert_begin == 0 && w->expert_end == c->n_routed_experts),
              INA_ERR_UNSUPPORTED,
              "gpu engine: this model holds experts [%d, %d) of %d; without an expert-parallel "
              "communicator (ep_comm) the engine needs all of them",
              w->expert_begin, w->expert_end, c->n_routed_experts);
  e->local_experts = w->expert_end - w->expert_begin;
  if (e->ep_comm) {
    /* The ranks' ranges must tile the experts, in rank order: gathered, checked alike
     * everywhere. */
    const int32_t n = ina_comm_size(e->ep_comm), mine[2] = {w->expert_begin, w->expert_end};
    int32_t *all = e->ep_ranges = malloc(2 * (size_t)n * sizeof *all), *dev = NULL;
    INA_CHECK_ALLOC(all);
    e->ep_size = n;
    e->ep_rank = ina_comm_rank(e->ep_comm);
    /* The communicator works on device memory (NCCL). */
    INA_CUDA_CHECK(cudaMalloc((void **)&dev, (2 + 2 * (size_t)n) * sizeof *dev));
    st = cudaMemcpy(dev, mine, sizeof mine, cudaMemcpyHostToDevice) == cudaSuccess
             ? ina_comm_all_gather(e->ep_comm, dev, dev + 2, 2, INA_DTYPE_I32, e->stream)
             : INA_ERR_CUDA;
    if (st == INA_OK && cudaMemcpyAsync(all, dev + 2, 2 * (size_t)n * sizeof *all, cudaMemcpyDeviceToHost,
                                        e->stream) != cudaSuccess)
      st = INA_ERR_CUDA;
    if (cudaStreamSynchronize(e->stream) != cudaSuccess && st == INA_OK) st = INA_ERR_CUDA;
    cudaFree(dev);
    int32_t next = 0, bad = -1;
    for (int32_t r = 0; r < n && st == INA_OK; r++) {
      if (all[2 * r] != next && bad < 0) bad = r;
      next = all[2 * r + 1];
    }
    if (next != c->n_routed_experts && bad < 0) bad = n - 1;
    INA_CHECK(st);
    INA_REQUIRE(bad < 0, INA_ERR_INVALID_ARGUMENT,
                "gpu engine: the expert ranges of the %d expert-parallel ranks do not tile the %d "
                "experts in rank order (rank %d)",
                n, c->n_routed_experts, bad);
  }
  {
    /* Sums up to 16 MiB go through the custom all-reduce (a decode step's are KiBs);
     * larger ones, and ranks on other nodes, through NCCL. */
    ina_custom_ar_config_t cfg = INA_CUSTOM_AR_CONFIG_INIT;
    cfg.max_bytes = (size_t)16 << 20;
    if (e->tp_comm && tp_size > 1) INA_CHECK(ina_custom_ar_create(e->tp_comm, &cfg, &e->tp_ar));
    if (e->ep_comm && ina_comm_size(e->ep_comm) > 1) INA_CHECK(ina_custom_ar_create(e->ep_comm, &cfg, &e->ep_ar));
  }
fail:
  return st;
}

/* The per-expert token counters (zeros) and what reading them needs. */
static ina_status_t create_load_counters(ina_engine_gpu_t *e) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  e->moe_index = malloc((size_t)c->num_layers * sizeof *e->moe_index);
  INA_CHECK_ALLOC(e->moe_index);
  for (int32_t l = 0; l < c->num_layers; l++) e->moe_index[l] = ina_cfg_layer_is_moe(c, l) ? e->num_moe_layers++ : -1;
  const size_t n = (size_t)e->num_moe_layers * (size_t)c->n_routed_experts + 1;
  e->load_base = calloc(n, sizeof *e->load_base);
  INA_CHECK_ALLOC(e->load_base);
  INA_CUDA_CHECK(cudaMalloc((void **)&e->expert_load_dev, n * sizeof *e->expert_load_dev));
  INA_CUDA_CHECK(cudaMemset(e->expert_load_dev, 0, n * sizeof *e->expert_load_dev));
  INA_CUDA_CHECK(cudaStreamCreateWithFlags(&e->load_stream, cudaStreamNonBlocking));
  pthread_mutex_init(&e->load_mu, NULL);
  e->load_mu_ready = 1;
fail:
  return st;
}

static ina_status_t create_absorb(ina_engine_gpu_t *e, int32_t max_tokens) {
  ina_status_t st = INA_OK;
  ina_mla_absorb_dims_t d = INA_MLA_ABSORB_DIMS_INIT;
  gpu_drop_graphs(e); /* they hold the old handle's buffers */
  ina_mla_absorb_destroy(e->absorb);
  e->absorb = NULL;
  e->absorb_max_tokens = 0;
  d.num_heads = e->heads;
  d.qk_nope_head_dim = e->cfg->qk_nope_head_dim;
  d.v_head_dim = e->cfg->v_head_dim;
  d.kv_lora_rank = e->cfg->kv_lora_rank;
  d.max_tokens = max_tokens;
  INA_CHECK(ina_mla_absorb_create(&d, &e->absorb));
  e->absorb_max_tokens = max_tokens;
fail:
  return st;
}

ina_status_t ina_engine_gpu_create(const ina_model_t *model, const ina_engine_options_t *options, int32_t device,
                                   ina_engine_gpu_t **out) {
  ina_status_t st = INA_OK;
  ina_engine_gpu_t *e = NULL;
  float *inv_freq = NULL;
  char name[128];
  *out = NULL;
  INA_REQUIRE(options->page_size >= 1 && options->max_tokens >= 1, INA_ERR_INVALID_ARGUMENT,
              "engine: page_size (%d) and max_tokens (%lld) must be positive", options->page_size,
              (long long)options->max_tokens);
  {
    const int count = ina_cuda_device_count();
    INA_REQUIRE(count > 0, INA_ERR_UNSUPPORTED, "gpu engine: no CUDA device (device %d requested)", device);
    INA_REQUIRE(device < count, INA_ERR_INVALID_ARGUMENT, "gpu engine: device %d out of range (%d devices)",
                device, count);
  }
  e = calloc(1, sizeof *e);
  INA_CHECK_ALLOC(e);
  e->model = model;
  e->cfg = ina_model_config(model);
  e->device = device;
  const ina_model_config_t *c = e->cfg;
  const ina_weights_t *w = ina_model_weights(model);
  INA_CHECK(check_shapes(c));
  INA_CUDA_CHECK(cudaSetDevice(device));
  INA_CUDA_CHECK(cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking));
  INA_CHECK(take_comms(e, w, options));
  e->has_indexer = ina_cfg_has_indexer(c);
  e->fp8_index_keys = e->has_indexer && ina_engine_options_index_keys(options) == INA_ENGINE_INDEX_KEYS_FP8;
  {
    const int dp = ina_engine_options_attention_dp(options);
    INA_REQUIRE(dp == 0 || dp == 2, INA_ERR_UNSUPPORTED,
                "gpu engine: attention_dp %d; the CUDA backend takes 0 (off) or 2 (every rank passes the same "
                "batch, split by sequence)",
                dp);
    INA_REQUIRE(!dp || e->ep_comm, INA_ERR_INVALID_ARGUMENT,
                "gpu engine: attention_dp needs ep_comm (the ranks that split the sequences)");
    e->dp_size = dp && e->ep_size > 1 ? e->ep_size : 1;
    e->dp_rank = e->dp_size > 1 ? e->ep_rank : 0;
    if (e->dp_size > 1) INA_CHECK(gpu_dp_init(e));
    /* V3.2 under tensor or attention data parallelism has not run on GPUs yet. */
    INA_REQUIRE(!e->has_indexer || (e->tp_size == 1 && e->dp_size == 1), INA_ERR_UNSUPPORTED,
                "gpu engine: DeepSeek-V3.2 (sparse attention) runs with tp 1 and without attention DP on the CUDA "
                "backend (tp %d, dp %d)",
                e->tp_size, e->dp_size);
  }
  if (ina_engine_options_step_split(options)) INA_CHECK(gpu_split_init(&e->split, c->num_layers));
  {
    uint64_t seed = 0;
    ina_dtype_t dtype = INA_DTYPE_BF16;
    if (ina_model_random_on_device(model, &seed, &dtype)) {
      /* The shard the model was made for: w is its shell, without tensor data. */
      ina_shard_t shard = INA_SHARD_INIT;
      shard.tp_rank = w->tp_rank;
      shard.tp_size = w->tp_size;
      shard.expert_begin = w->expert_begin;
      shard.expert_end = w->expert_end;
      INA_CHECK(ina_gpu_weights_random(c, &shard, seed, dtype, e->stream, &e->w));
    } else
      INA_CHECK(ina_gpu_weights_upload(w, c, e->stream, &e->w));
  }
  INA_CHECK(ina_gemm_create(NULL, &e->gemm));
  INA_CHECK(create_absorb(e, 256));
  {
    ina_page_pool_config_t pc = INA_PAGE_POOL_CONFIG_INIT;
    const int64_t pages = (options->max_tokens + options->page_size - 1) / options->page_size;
    INA_REQUIRE(pages <= INT32_MAX, INA_ERR_INVALID_ARGUMENT, "engine: max_tokens too large");
    pc.page_size = options->page_size;
    pc.num_pages = (int32_t)pages;
    pc.num_layers = c->num_layers;
    /* A token's entry: the latent and rope key, then V3.2's index key (attention/dsa.h:
     * it sits beside the latent, so prefix sharing, copy on write and page transfers
     * carry it). */
    pc.entry_elems = c->kv_lora_rank + c->qk_rope_head_dim + index_key_elems(e);
    pc.dtype = INA_DTYPE_BF16;
    pc.store_entries = 0; /* the entries live in e->cache, on the device */
    /* Attention DP: each rank's sequences take the pages of its stripe, and only those
     * are on its device (page p at p / dp_size). */
    pc.stripes = e->dp_size;
    INA_CHECK(ina_page_pool_create(&pc, &e->kv));
    const int64_t local_pages = (pages + e->dp_size - 1) / e->dp_size;
    e->cache_page_bytes = (size_t)options->page_size * (size_t)pc.entry_elems * sizeof(uint16_t);
    e->cache_layer_bytes = e->cache_page_bytes * (size_t)local_pages;
    INA_CUDA_CHECK(cudaMalloc(&e->cache, e->cache_layer_bytes * (size_t)c->num_layers));
    /* Zeros, not whatever the memory held: a benchmark may size sequences through the pool
     * without computing their entries. */
    INA_CUDA_CHECK(cudaMemset(e->cache, 0, e->cache_layer_bytes * (size_t)c->num_layers));
  }
  inv_freq = malloc((size_t)c->qk_rope_head_dim / 2 * sizeof(float));
  INA_CHECK_ALLOC(inv_freq);
  ina_cfg_rope_inv_freq(c, inv_freq, &e->attention_factor);
  INA_CUDA_CHECK(cudaMalloc((void **)&e->inv_freq, (size_t)c->qk_rope_head_dim / 2 * sizeof(float)));
  INA_CUDA_CHECK(cudaMemcpy(e->inv_freq, inv_freq, (size_t)c->qk_rope_head_dim / 2 * sizeof(float),
                            cudaMemcpyHostToDevice));
  e->softmax_scale = (float)ina_cfg_softmax_scale(c);
  INA_CHECK(create_load_counters(e));
  INA_CHECK(gpu_placement_init(e));
  e->router = ina_cfg_router_config(c);
  e->use_graphs = ina_engine_options_cuda_graphs(options);
  e->max_expert_bytes = ina_engine_options_max_expert_bytes(options);
  for (int32_t l = 0; l < c->num_layers; l++)
    if (e->w.layers[l].is_moe && !e->w.layers[l].grouped_w[0]) e->use_graphs = 0;
  if (c->n_routed_experts > 0)
    INA_CUDA_CHECK(cudaHostAlloc((void **)&e->offsets_host, (size_t)(c->n_routed_experts + 1) * sizeof(int32_t),
                                 cudaHostAllocDefault));
  INA_LOG_I(INA_LOG_SUBSYS, "gpu engine on %s: %.1f MiB of weights, %.1f MiB of latent cache%s, decode steps %s",
            ina_cuda_device_name(device, name, sizeof name), (double)e->w.device_bytes / (1 << 20),
            (double)(e->cache_layer_bytes * (size_t)c->num_layers) / (1 << 20),
            e->dp_size > 1 ? ", attention data parallel" : "",
            e->use_graphs                             ? "replayed from CUDA graphs"
            : !ina_engine_options_cuda_graphs(options) ? "eager (CUDA graphs off)"
                                                       : "eager (a MoE layer's experts do not fit the grouped GEMM)");
  free(inv_freq);
  *out = e;
  return INA_OK;
fail:
  free(inv_freq);
  ina_engine_gpu_destroy(e);
  return st;
}

static void step_free(gpu_step_t *s) {
  for (int32_t i = 0; i < s->num_owned; i++) cudaFree(s->owned[i]);
  memset(s, 0, sizeof *s);
}

void ina_engine_gpu_destroy(ina_engine_gpu_t *e) {
  if (!e) return;
  if (e->stream) (void)cudaStreamSynchronize(e->stream);
  gpu_drop_graphs(e);
  step_free(&e->s);
  gpu_placement_free(e);
  gpu_dp_free(e);
  gpu_split_free(&e->split);
  ina_gpu_weights_free(&e->w);
  free(e->ep_ranges);
  cudaFree(e->expert_load_dev);
  if (e->load_stream) cudaStreamDestroy(e->load_stream);
  if (e->load_mu_ready) pthread_mutex_destroy(&e->load_mu);
  free(e->load_base);
  free(e->moe_index);
  ina_custom_ar_destroy(e->ep_ar);
  ina_custom_ar_destroy(e->tp_ar);
  ina_gemm_destroy(e->gemm);
  ina_mla_absorb_destroy(e->absorb);
  ina_page_pool_destroy(e->kv);
  cudaFree(e->cache);
  cudaFree(e->inv_freq);
  cudaFreeHost(e->stage_host);
  cudaFree(e->stage_dev);
  cudaFreeHost(e->mla_host_ws);
  cudaFree(e->mla_dev_ws);
  cudaFreeHost(e->dsa_host_ws);
  cudaFree(e->dsa_dev_ws);
  cudaFree(e->dsa_scores);
  cudaFreeHost(e->offsets_host);
  cudaFree(e->tokens_dev);
  cudaFree(e->greedy_params_dev);
  ina_page_table_release(&e->table);
  free(e->kv_len);
  free(e->cow_page);
  free(e->cow_index);
  free(e->cow_tokens);
  if (e->stream) cudaStreamDestroy(e->stream);
  (void)cudaGetLastError(); /* leave no error of the teardown behind */
  free(e);
}

ina_page_pool_t *ina_engine_gpu_page_pool(ina_engine_gpu_t *e) { return e->kv; }

ina_status_t ina_engine_gpu_kv_storage(ina_engine_gpu_t *e, void **base, size_t *bytes, int32_t *device) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e->dp_size == 1, INA_ERR_UNSUPPORTED,
              "engine: under attention DP the device holds only its stripe of the KV pages");
  *base = e->cache;
  *bytes = e->cache_layer_bytes * (size_t)e->cfg->num_layers;
  *device = e->device;
fail:
  return st;
}

ina_status_t ina_engine_gpu_expert_load(ina_engine_gpu_t *e, int reset, uint64_t *counts, int64_t capacity,
                                        int32_t *num_moe_layers) {
  ina_status_t st = INA_OK;
  const int64_t n = (int64_t)e->num_moe_layers * e->cfg->n_routed_experts;
  *num_moe_layers = e->num_moe_layers;
  if (capacity == 0 && counts == NULL) return INA_OK;
  INA_REQUIRE(counts != NULL && capacity >= n, INA_ERR_INVALID_ARGUMENT,
              "expert load: room for %lld counters, %d MoE layers x %d experts need %lld", (long long)capacity,
              e->num_moe_layers, e->cfg->n_routed_experts, (long long)n);
  pthread_mutex_lock(&e->load_mu);
  /* A read of the counters as they stand: steps in flight may still add to them. */
  if (cudaSetDevice(e->device) != cudaSuccess ||
      cudaMemcpyAsync(counts, e->expert_load_dev, (size_t)n * sizeof *counts, cudaMemcpyDeviceToHost,
                      e->load_stream) != cudaSuccess ||
      cudaStreamSynchronize(e->load_stream) != cudaSuccess) {
    pthread_mutex_unlock(&e->load_mu);
    INA_REQUIRE(0, INA_ERR_CUDA, "expert load: reading the counters failed (%s)",
                cudaGetErrorString(cudaGetLastError()));
  }
  for (int64_t i = 0; i < n; i++) {
    const uint64_t now = counts[i];
    counts[i] = now - e->load_base[i];
    if (reset) e->load_base[i] = now;
  }
  pthread_mutex_unlock(&e->load_mu);
fail:
  return st;
}

const ina_model_config_t *ina_engine_gpu_config(const ina_engine_gpu_t *e) { return e->cfg; }

/* ---- buffers ------------------------------------------------------------------------ */

static ina_status_t step_alloc(ina_engine_gpu_t *e, int64_t cap) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  gpu_step_t *s = &e->s;
  const int64_t Hd = c->hidden_size, H = e->heads, C = c->kv_lora_rank, R = c->qk_rope_head_dim;
  const int64_t E = c->n_routed_experts, K = E > 0 ? c->num_experts_per_tok : 1;
  const int64_t inter = e->w.max_expert_inter > 0 ? e->w.max_expert_inter : 1;
  /* The MoE layers run every attention-DP rank's rows. */
  const int64_t moe_tokens = cap * e->dp_size, rows = moe_tokens * K, fp8_k = e->w.fp8_max_k;
  gpu_drop_graphs(e);
  step_free(s);
  s->cap = cap;
  s->rows = rows;
#define DEV(field, bytes)                                                                \
  do {                                                                                   \
    const size_t n_ = (size_t)(bytes);                                                   \
    INA_CUDA_CHECK(cudaMalloc((void **)&s->field, n_ > 0 ? n_ : 16));                    \
    s->owned[s->num_owned++] = (void *)s->field;                                         \
    /* zeros: the padding rows of a graph step read rows no step wrote */               \
    INA_CUDA_CHECK(cudaMemset((void *)s->field, 0, n_ > 0 ? n_ : 16));                   \
  } while (0)
  DEV(x, cap * Hd * 2);
  DEV(delta, cap * Hd * 2);
  DEV(h, cap * Hd * 2);
  DEV(qa, cap * (c->q_lora_rank > 0 ? c->q_lora_rank : 1) * 2);
  DEV(q, cap * H * ina_cfg_qk_head_dim(c) * 2);
  DEV(kv, cap * (C + R) * 2);
  DEV(q_abs, cap * H * C * 2);
  DEV(o_lat, cap * H * C * 2);
  DEV(attn, cap * H * c->v_head_dim * 2);
  if (e->has_indexer) {
    DEV(iq, cap * c->index_n_heads * c->index_head_dim * 2);
    DEV(ik, cap * c->index_head_dim * 2);
    DEV(iw, cap * c->index_n_heads * 4);
    DEV(sel, cap * c->index_topk * 4);
  }
  DEV(g, rows * inter * 2);
  DEV(u, rows * inter * 2);
  DEV(a, rows * inter * 2);
  DEV(shared, cap * Hd * 2);
  DEV(fin, cap * Hd * 2);
  DEV(logits, cap * (int64_t)c->vocab_size * 4);
  if (fp8_k > 0) {
    DEV(q8, rows * fp8_k);
    DEV(q8_scale, rows * ((fp8_k + INA_GEMM_BLOCK - 1) / INA_GEMM_BLOCK) * 4);
  }
  if (E > 0) {
    DEV(xe, rows * Hd * 2);
    DEV(ye, rows * Hd * 2);
    DEV(router_logits, moe_tokens * E * 4);
    DEV(topk_ids, rows * 4);
    DEV(topk_weights, rows * 4);
    DEV(expert_counts, E * 4);
    DEV(expert_offsets, (E + 1) * 4);
    DEV(sorted_token, rows * 4);
    DEV(slot_of, rows * 4);
    s->permute_ws_bytes = ina_gpu_moe_permute_workspace_size(moe_tokens, (int32_t)K, (int32_t)E);
    DEV(permute_ws, s->permute_ws_bytes);
  }
  if (e->dp_size > 1) {
    DEV(h_all, moe_tokens * Hd * 2);
    DEV(page_ids_all, moe_tokens * 4);
  }
#undef DEV
  return INA_OK;
fail:
  step_free(s);
  return st;
}

static int64_t round_up_pow2(int64_t n, int64_t floor) {
  int64_t p = floor;
  while (p < n) p *= 2;
  return p;
}

/* Grow whatever a step of T tokens over `batch` sequences and `pages` page-table entries
 * needs. The device is idle here (every step ends synchronized). */
static ina_status_t ensure_capacity(ina_engine_gpu_t *e, int64_t T, int32_t batch) {
  ina_status_t st = INA_OK;
  if (T > e->s.cap) INA_CHECK(step_alloc(e, round_up_pow2(T, 16)));
  if (T > e->absorb_max_tokens) {
    INA_REQUIRE(T <= INT32_MAX / 2, INA_ERR_INVALID_ARGUMENT, "forward: %lld tokens in one step", (long long)T);
    INA_CHECK(create_absorb(e, (int32_t)round_up_pow2(T, 256)));
  }
  if (batch > e->seq_cap) {
    const int32_t cap = (int32_t)round_up_pow2(batch, 16);
    int32_t **arrays[4] = {&e->kv_len, &e->cow_page, &e->cow_index, &e->cow_tokens};
    for (int i = 0; i < 4; i++) {
      int32_t *grown = realloc(*arrays[i], (size_t)cap * sizeof(int32_t));
      INA_CHECK_ALLOC(grown);
      *arrays[i] = grown;
    }
    e->seq_cap = cap;
  }
fail:
  return st;
}

/* ---- host inputs of a step ---------------------------------------------------------- */

/* Where page p of the pool is in this device's cache: p itself, or under attention DP its
 * place among this rank's stripe (every page this rank reads or writes is of it). */
static int32_t device_page(const ina_engine_gpu_t *e, int32_t p) { return p / e->dp_size; }


/* Offsets (in int32 values) of the step's inputs in the staging buffers. */
typedef struct stage_layout {
  int64_t tokens, positions, page_ids, slots, last_rows, kv_indptr, kv_indices, total;
} stage_layout_t;

static stage_layout_t stage_layout(int64_t T, int32_t batch, int64_t pages) {
  stage_layout_t l;
  l.tokens = 0;
  l.positions = T;
  l.page_ids = 2 * T;
  l.slots = 3 * T;
  l.last_rows = 4 * T;
  l.kv_indptr = l.last_rows + batch;
  l.kv_indices = l.kv_indptr + batch + 1;
  l.total = l.kv_indices + pages;
  return l;
}

/* Fill the pinned staging buffer (the sequences already grown) and copy it to the device.
 * rows >= the step's T tokens and seqs >= its batch: a graph step lays its inputs out for
 * its bucket, an attention-DP step for the largest rank's shape; the tokens and sequences
 * past the step's are padding that writes no cache entry (page id -1) and attends to
 * nothing. */
static ina_status_t stage_inputs(ina_engine_gpu_t *e, const ina_batch_t *b, int64_t rows, int32_t seqs,
                                 stage_layout_t *out) {
  ina_status_t st = INA_OK;
  const int32_t page_size = ina_page_pool_page_size(e->kv);
  const int64_t T = b->qo_indptr[b->batch];
  const stage_layout_t l = stage_layout(rows, seqs, e->table.indptr[b->batch]);
  if (l.total > e->stage_cap) {
    const int64_t cap = round_up_pow2(l.total, 1024);
    gpu_drop_graphs(e); /* they read the old staging buffer */
    cudaFreeHost(e->stage_host);
    cudaFree(e->stage_dev);
    e->stage_host = NULL;
    e->stage_dev = NULL;
    e->stage_cap = 0;
    INA_CUDA_CHECK(cudaHostAlloc((void **)&e->stage_host, (size_t)cap * sizeof(int32_t), cudaHostAllocDefault));
    INA_CUDA_CHECK(cudaMalloc((void **)&e->stage_dev, (size_t)cap * sizeof(int32_t)));
    e->stage_cap = cap;
  }
  int32_t *h = e->stage_host;
  memcpy(h + l.tokens, b->tokens, (size_t)T * sizeof(int32_t));
  for (int32_t i = 0; i < b->batch; i++) {
    const int32_t q0 = b->qo_indptr[i], n = b->qo_indptr[i + 1] - q0;
    const int64_t first = b->seqs[i]->num_tokens - n; /* position of the first new token */
    for (int32_t j = 0; j < n; j++) {
      int32_t page, slot;
      ina_kv_seq_locate(b->seqs[i], page_size, first + j, &page, &slot);
      h[l.positions + q0 + j] = (int32_t)(first + j);
      h[l.page_ids + q0 + j] = device_page(e, page);
      h[l.slots + q0 + j] = slot;
    }
    h[l.last_rows + i] = n > 0 ? b->qo_indptr[i + 1] - 1 : 0;
  }
  for (int64_t j = T; j < rows; j++) {
    h[l.tokens + j] = 0;
    h[l.positions + j] = 0;
    h[l.page_ids + j] = -1;
    h[l.slots + j] = -1;
  }
  memcpy(h + l.kv_indptr, e->table.indptr, (size_t)(b->batch + 1) * sizeof(int32_t));
  for (int32_t i = b->batch; i < seqs; i++) {
    h[l.last_rows + i] = 0;
    h[l.kv_indptr + i + 1] = e->table.indptr[b->batch];
  }
  for (int32_t i = 0; i < e->table.indptr[b->batch]; i++) {
    /* Every page of our sequences is of our stripe (kv_seq takes a sequence's pages from
     * one stripe); another would be a bookkeeping bug, not a cache access. */
    INA_REQUIRE(e->dp_size == 1 || e->table.indices[i] % e->dp_size == e->dp_rank, INA_ERR_INTERNAL,
                "gpu engine: page %d of this step is not of rank %d's stripe", e->table.indices[i], e->dp_rank);
    h[l.kv_indices + i] = device_page(e, e->table.indices[i]);
  }
  INA_CUDA_CHECK(cudaMemcpyAsync(e->stage_dev, h, (size_t)l.total * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 e->stream));
  *out = l;
fail:
  return st;
}

/* Before the sequences grow: the partial last page of each, which ina_kv_seq_append
 * replaces by a fresh copy when it is shared (copy on write). */
static void remember_last_pages(ina_engine_gpu_t *e, const ina_batch_t *b) {
  const int32_t page_size = ina_page_pool_page_size(e->kv);
  for (int32_t i = 0; i < b->batch; i++) {
    const ina_kv_seq_t *q = b->seqs[i];
    const int32_t partial = (int32_t)(q->num_tokens % page_size);
    e->cow_page[i] = q->num_pages > 0 && partial > 0 ? q->pages[q->num_pages - 1] : -1;
    e->cow_index[i] = q->num_pages - 1;
    e->cow_tokens[i] = partial;
  }
}

/* After they grew: copy the entries of every replaced last page on the device, in
 * every layer (the pool stores no entries, so its own copy did nothing). */
static ina_status_t copy_replaced_pages(ina_engine_gpu_t *e, const ina_batch_t *b) {
  ina_status_t st = INA_OK;
  const size_t entry_bytes = e->cache_page_bytes / (size_t)ina_page_pool_page_size(e->kv);
  for (int32_t i = 0; i < b->batch; i++) {
    if (e->cow_page[i] < 0) continue;
    const int32_t now = b->seqs[i]->pages[e->cow_index[i]];
    if (now == e->cow_page[i]) continue;
    /* Under attention DP only the owner has the entries (the copy is of its stripe too). */
    if (e->dp_size > 1 && e->dp.owner[i] != e->dp_rank) continue;
    for (int32_t l = 0; l < e->cfg->num_layers; l++) {
      char *base = (char *)e->cache + (size_t)l * e->cache_layer_bytes;
      INA_CUDA_CHECK(cudaMemcpyAsync(base + (size_t)device_page(e, now) * e->cache_page_bytes,
                                     base + (size_t)device_page(e, e->cow_page[i]) * e->cache_page_bytes,
                                     (size_t)e->cow_tokens[i] * entry_bytes, cudaMemcpyDeviceToDevice, e->stream));
    }
  }
fail:
  return st;
}

/* A plan's pinned host and device workspaces, grown to the bytes asked (graphs read the
 * old device one: dropped). */
static ina_status_t ensure_workspaces(ina_engine_gpu_t *e, void **host, size_t *host_cap, size_t host_bytes,
                                      void **dev, size_t *dev_cap, size_t dev_bytes) {
  ina_status_t st = INA_OK;
  if (host_bytes > *host_cap) {
    INA_CUDA_CHECK(cudaStreamSynchronize(e->stream)); /* the last step's copy may still read it */
    cudaFreeHost(*host);
    *host = NULL;
    *host_cap = 0;
    INA_CUDA_CHECK(cudaHostAlloc(host, host_bytes, cudaHostAllocDefault));
    *host_cap = host_bytes;
  }
  if (dev_bytes > *dev_cap) {
    gpu_drop_graphs(e);
    cudaFree(*dev);
    *dev = NULL;
    *dev_cap = 0;
    INA_CUDA_CHECK(cudaMalloc(dev, dev_bytes));
    *dev_cap = dev_bytes;
  }
fail:
  return st;
}

/* V3.2's positions kept per query: index_topk, one fewer under its mutation. */
static int32_t index_topk(const ina_engine_gpu_t *e) {
  return e->cfg->index_topk - (e->mutation == INA_MUTATION_INDEX_TOPK_LESS && e->cfg->index_topk > 1);
}

/* The cached tokens sequence i's queries attend to: all of them, or under the mutation
 * that drops the newest key, one fewer for a decode row after context of its own (the
 * CPU engine's rule). */
static int32_t planned_kv_len(const ina_engine_gpu_t *e, const ina_batch_t *b, int32_t i) {
  const int32_t n = (int32_t)b->seqs[i]->num_tokens;
  const int decode = b->qo_indptr[i + 1] - b->qo_indptr[i] == 1 && n > 1;
  return n - (e->mutation == INA_MUTATION_DECODE_SKIP_NEWEST && decode ? 1 : 0);
}

/* V3.2's step plans for `max_tokens` query rows (the bucket): the indexer's (score and
 * top-k over score rows of dsa_kv_cap positions, grown here) and sparse MLA's. */
static ina_status_t plan_sparse(ina_engine_gpu_t *e, const ina_batch_t *b, int32_t max_tokens,
                                ina_dsa_gpu_plan_info_t *dsa, ina_mla_plan_info_t *mla) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  const int32_t page_size = ina_page_pool_page_size(e->kv);
  size_t host_bytes = 0, dev_bytes = 0;
  int32_t longest = 1;
  for (int32_t i = 0; i < b->batch; i++) {
    e->kv_len[i] = planned_kv_len(e, b, i);
    if (e->kv_len[i] > longest) longest = e->kv_len[i];
  }
  if (longest > e->dsa_kv_cap) {
    gpu_drop_graphs(e); /* their score and top-k grids are the old cap's */
    e->dsa_kv_cap = (int32_t)round_up_pow2(longest, 256);
  }
  if ((int64_t)max_tokens * e->dsa_kv_cap > e->dsa_scores_cap) {
    gpu_drop_graphs(e);
    cudaFree(e->dsa_scores);
    e->dsa_scores = NULL;
    e->dsa_scores_cap = 0;
    const int64_t n = (int64_t)round_up_pow2(max_tokens, 16) * e->dsa_kv_cap;
    INA_CUDA_CHECK(cudaMalloc((void **)&e->dsa_scores, (size_t)n * sizeof(float)));
    e->dsa_scores_cap = n;
  }
  {
    ina_dsa_gpu_plan_params_t p = INA_DSA_GPU_PLAN_PARAMS_INIT;
    p.batch = b->batch;
    p.qo_indptr = b->qo_indptr;
    p.kv_len = e->kv_len;
    p.max_tokens = max_tokens;
    p.max_kv_len = e->dsa_kv_cap;
    p.page_size = page_size;
    p.num_heads = c->index_n_heads;
    p.head_dim = c->index_head_dim;
    p.topk = index_topk(e);
    p.score_stride = e->dsa_kv_cap;
    INA_CHECK(ina_dsa_gpu_workspace_size(&p, &host_bytes, &dev_bytes));
    INA_CHECK(ensure_workspaces(e, &e->dsa_host_ws, &e->dsa_host_cap, host_bytes, &e->dsa_dev_ws, &e->dsa_dev_cap,
                                dev_bytes));
    INA_CHECK(ina_dsa_gpu_plan(&p, e->dsa_host_ws, e->dsa_dev_ws, e->stream, dsa));
  }
  {
    ina_mla_sparse_plan_params_t p = INA_MLA_SPARSE_PLAN_PARAMS_INIT;
    p.batch = b->batch;
    p.max_tokens = max_tokens;
    p.qo_indptr = b->qo_indptr;
    p.kv_len = e->kv_len;
    p.topk = index_topk(e);
    p.num_heads = e->heads;
    p.kv_lora_rank = c->kv_lora_rank;
    p.rope_dim = c->qk_rope_head_dim;
    p.page_size = page_size;
    INA_CHECK(ina_mla_sparse_workspace_size(&p, &host_bytes, &dev_bytes));
    INA_CHECK(ensure_workspaces(e, &e->mla_host_ws, &e->mla_host_cap, host_bytes, &e->mla_dev_ws, &e->mla_dev_cap,
                                dev_bytes));
    INA_CHECK(ina_mla_sparse_plan(&p, e->mla_host_ws, e->mla_dev_ws, e->stream, mla));
  }
fail:
  return st;
}

/* Plan attention for the step (the same schedule serves every layer), for a bucket of
 * max_batch sequences (the step's batch when it runs eagerly). */
static ina_status_t plan_attention(ina_engine_gpu_t *e, const ina_batch_t *b, int32_t max_batch,
                                   ina_mla_plan_info_t *info) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  ina_mla_plan_params_t p = INA_MLA_PLAN_PARAMS_INIT;
  size_t host_bytes = 0, dev_bytes = 0;
  int32_t max_q = 1;
  for (int32_t i = 0; i < b->batch; i++) {
    const int32_t n = b->qo_indptr[i + 1] - b->qo_indptr[i];
    e->kv_len[i] = planned_kv_len(e, b, i);
    if (n > max_q) max_q = n;
  }
  p.batch = b->batch;
  p.max_batch = max_batch;
  p.max_q_len = max_q;
  p.qo_indptr = b->qo_indptr;
  p.kv_len = e->kv_len;
  p.num_heads = e->heads;
  p.kv_lora_rank = c->kv_lora_rank;
  p.rope_dim = c->qk_rope_head_dim;
  p.page_size = ina_page_pool_page_size(e->kv);
  INA_CHECK(ina_mla_workspace_size(&p, &host_bytes, &dev_bytes));
  INA_CHECK(ensure_workspaces(e, &e->mla_host_ws, &e->mla_host_cap, host_bytes, &e->mla_dev_ws, &e->mla_dev_cap,
                              dev_bytes));
  INA_CHECK(ina_mla_plan(&p, e->mla_host_ws, e->mla_dev_ws, e->stream, info));
fail:
  return st;
}

/* ---- ops ---------------------------------------------------------------------------- */

/* y[m, n] = x[m, k] . W^T (+ residual, which may be y), x bf16 dense. FP8 weights
 * quantize x first (1 x 128 blocks, the GEMM's scale layout for this m). */
static ina_status_t linear(ina_engine_gpu_t *e, const gpu_linear_t *L, const uint16_t *x, int64_t m, void *y,
                           ina_dtype_t out_dtype, const void *residual) {
  ina_status_t st = INA_OK;
  ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
  if (m == 0) return INA_OK;
  a.m = m;
  a.n = L->n;
  a.k = L->k;
  a.w = L->w;
  a.out_dtype = out_dtype;
  a.y = y;
  a.residual = residual;
  a.beta = 1.0f;
  a.stream = e->stream;
  if (L->fp8) {
    INA_CHECK(ina_gemm_quantize_x(x, 0, m, L->k, e->s.q8, 0, e->s.q8_scale, e->stream));
    a.mode = INA_GEMM_FP8_BLOCK;
    a.x = e->s.q8;
    a.x_scale = e->s.q8_scale;
    a.w_scale = L->w_scale;
  } else {
    a.mode = INA_GEMM_BF16;
    a.x = x;
  }
  INA_CHECK(ina_gemm_run(e->gemm, &a));
fail:
  return st;
}

/* y = rmsnorm(x (+ residual, written back)) * weight over [rows, cols], all dense. */
static ina_status_t rmsnorm(ina_engine_gpu_t *e, int64_t rows, int64_t cols, const uint16_t *x, uint16_t *residual,
                            const float *weight, float eps, uint16_t *y) {
  ina_gpu_rmsnorm_params_t p = INA_GPU_RMSNORM_PARAMS_INIT;
  p.rows = rows;
  p.cols = cols;
  p.x = x;
  p.residual = residual;
  p.weight = weight;
  p.weight_dtype = INA_DTYPE_F32;
  p.eps = eps;
  p.y = y;
  return ina_gpu_rmsnorm(&p, e->stream);
}

/* A block's output s.delta into the residual stream s.x, and s.h = RMSNorm(s.x) * weight
 * for the next block. With tensor parallelism s.delta holds this rank's partial sums: the
 * custom all-reduce adds them up and applies the same residual add and norm in its fused
 * epilogue (bit for bit ina_gpu_rmsnorm's), one kernel instead of two. */
static ina_status_t add_and_norm(ina_engine_gpu_t *e, int64_t T, const float *weight, float eps) {
  gpu_step_t *s = &e->s;
  const int64_t Hd = e->cfg->hidden_size;
  if (!e->tp_ar) return rmsnorm(e, T, Hd, s->delta, s->x, weight, eps, s->h);
  if (T == 0) return INA_OK;
  ina_custom_ar_args_t a = INA_CUSTOM_AR_ARGS_INIT;
  a.mode = INA_CUSTOM_AR_BF16;
  a.count = (size_t)(T * Hd);
  a.in = s->delta;
  a.out = s->h;
  a.rows = T;
  a.cols = Hd;
  a.residual = s->x;
  a.norm_weight = weight;
  a.norm_weight_dtype = INA_DTYPE_F32;
  a.eps = eps;
  a.stream = e->stream;
  return ina_custom_ar_run(e->tp_ar, &a);
}

/* out = down(SiLU(gate(in)) * up(in)) for `rows` dense rows. */
static ina_status_t mlp(ina_engine_gpu_t *e, const gpu_mlp_t *m, const uint16_t *in, int64_t rows, uint16_t *out) {
  ina_status_t st = INA_OK;
  const int64_t inter = m->gate.n;
  INA_CHECK(linear(e, &m->gate, in, rows, e->s.g, INA_DTYPE_BF16, NULL));
  INA_CHECK(linear(e, &m->up, in, rows, e->s.u, INA_DTYPE_BF16, NULL));
  INA_CHECK(ina_gpu_silu_mul(rows, inter, e->s.g, e->s.u, inter, e->s.a, NULL, NULL, e->stream));
  INA_CHECK(linear(e, &m->down, e->s.a, rows, out, INA_DTYPE_BF16, NULL));
fail:
  return st;
}

/* x[n] summed in place over the ranks of a group, on the step's stream (a no-op without
 * one): the custom intra-node all-reduce, which falls back to NCCL across nodes and for
 * messages past its buffers. */
static ina_status_t sum_over(ina_custom_ar_t *ar, uint16_t *x, int64_t n, cudaStream_t stream) {
  if (!ar || n == 0) return INA_OK;
  ina_custom_ar_args_t a = INA_CUSTOM_AR_ARGS_INIT;
  a.mode = INA_CUSTOM_AR_BF16;
  a.count = (size_t)n;
  a.in = x;
  a.out = x;
  a.stream = stream;
  return ina_custom_ar_run(ar, &a);
}

/* ---- test mutations (model/engine_test_hooks.h) ------------------------------------ */

/* Experts 0 and 1 of the first MoE layer trade weights (the mutation's, and its undo):
 * the host array of the per-expert path and the grouped GEMM's pointer tables. */
static ina_status_t swap_first_experts(ina_engine_gpu_t *e) {
  ina_status_t st = INA_OK;
  for (int32_t l = 0; l < e->cfg->num_layers; l++) {
    if (e->moe_index[l] != 0) continue;
    gpu_layer_t *L = &e->w.layers[l];
    const gpu_mlp_t t = L->experts[0];
    L->experts[0] = L->experts[1];
    L->experts[1] = t;
    for (int i = 0; i < 3; i++) {
      const gpu_linear_t *part[2] = {i == 0 ? &L->experts[0].gate : i == 1 ? &L->experts[0].up : &L->experts[0].down,
                                     i == 0 ? &L->experts[1].gate : i == 1 ? &L->experts[1].up : &L->experts[1].down};
      if (L->grouped_w[i]) {
        const void *w[2] = {part[0]->w, part[1]->w};
        INA_CUDA_CHECK(cudaMemcpy((void *)L->grouped_w[i], w, sizeof w, cudaMemcpyHostToDevice));
      }
      if (L->grouped_scale[i]) {
        const float *sc[2] = {part[0]->w_scale, part[1]->w_scale};
        INA_CUDA_CHECK(cudaMemcpy((void *)L->grouped_scale[i], sc, sizeof sc, cudaMemcpyHostToDevice));
      }
    }
    break;
  }
fail:
  return st;
}

/* Layer 0's kv_a_proj scales as the GPU's FP8 GEMM reads them: the checkpoint's grid, or
 * (the mutation) block (i, j) taking block (j, i) where that exists, as
 * model/engine_cpu_numerics.c reads it. Nothing to do for a weight that is not FP8 (the
 * mutation changes nothing there, as on the CPU); refused where the device holds the
 * weight dequantized to bf16, whose scales are applied already. */
static ina_status_t upload_kv_a_scales(ina_engine_gpu_t *e, int transposed) {
  ina_status_t st = INA_OK;
  float *grid = NULL, *packed = NULL;
  const ina_weights_t *w = ina_model_weights(e->model);
  const ina_linear_t *lin = w && w->layers ? &w->layers[0].kv_a_proj : NULL;
  const gpu_linear_t *g = &e->w.layers[0].kv_a_proj;
  if (!lin || lin->weight.dtype != INA_DTYPE_FP8_E4M3) return INA_OK;
  INA_REQUIRE(g->fp8 && lin->scale_inv.data && lin->scale_inv.ndim == 2, INA_ERR_UNSUPPORTED,
              "gpu engine: layer 0's kv_a_proj runs dequantized (or its scales are not on the host): the "
              "transposed-scale mutation cannot be applied");
  {
    const int64_t rows_b = lin->scale_inv.shape[0], cols_b = lin->scale_inv.shape[1];
    const float *sc = (const float *)lin->scale_inv.data;
    grid = malloc((size_t)(rows_b * cols_b) * sizeof *grid);
    packed = malloc((size_t)ina_gemm_w_scale_count(g->n, g->k) * sizeof *packed);
    INA_CHECK_ALLOC(grid && packed ? grid : NULL);
    for (int64_t i = 0; i < rows_b; i++)
      for (int64_t j = 0; j < cols_b; j++)
        grid[i * cols_b + j] = transposed && j < rows_b && i < cols_b ? sc[j * cols_b + i] : sc[i * cols_b + j];
    INA_CHECK(ina_gemm_pack_w_scales(grid, g->n, g->k, packed));
    INA_CUDA_CHECK(cudaMemcpy(g->w_scale, packed, (size_t)ina_gemm_w_scale_count(g->n, g->k) * sizeof *packed,
                              cudaMemcpyHostToDevice));
  }
fail:
  free(grid);
  free(packed);
  return st;
}

/* The mutations this engine applies, each where the CPU engine applies its twin, except
 * that the softmax-scale ones reach every query row: one attention kernel serves prefill
 * and decode here. Routed experts x 0.95 ride on the router's routed_scaling_factor; rope
 * theta reloads the frequency table; the expert swap trades experts 0 and 1 of the first
 * MoE layer (this engine must hold both, in no expert-parallel slot layout; without MoE
 * layers it changes nothing, as on the CPU); the transposed FP8 scales are uploaded
 * anew for layer 0's kv_a_proj. Captured decode graphs hold the old values, so they are
 * dropped. */
ina_status_t ina_engine_gpu_set_mutation(ina_engine_gpu_t *e, int32_t mutation) {
  ina_status_t st = INA_OK;
  float inv_freq[256];
  const ina_model_config_t *c = e->cfg;
  INA_REQUIRE(mutation >= 0 && mutation < INA_MUTATION_COUNT, INA_ERR_INVALID_ARGUMENT,
              "gpu engine: mutation %d out of range", mutation);
  const int can_swap = e->num_moe_layers == 0 || (e->w.expert_begin == 0 && e->w.expert_end >= 2 && !e->slot_layers);
  INA_REQUIRE(mutation != INA_MUTATION_EXPERT_SWAP || can_swap, INA_ERR_UNSUPPORTED,
              "gpu engine: the expert swap needs experts 0 and 1 held in the plain layout");
  INA_REQUIRE(c->qk_rope_head_dim / 2 <= (int32_t)(sizeof inv_freq / sizeof *inv_freq), INA_ERR_INTERNAL,
              "gpu engine: rope dim %d past the mutation's table", c->qk_rope_head_dim);
  if ((e->mutation == INA_MUTATION_FP8_SCALE_TRANSPOSED) != (mutation == INA_MUTATION_FP8_SCALE_TRANSPOSED))
    INA_CHECK(upload_kv_a_scales(e, mutation == INA_MUTATION_FP8_SCALE_TRANSPOSED));
  if ((e->mutation == INA_MUTATION_EXPERT_SWAP) != (mutation == INA_MUTATION_EXPERT_SWAP))
    INA_CHECK(swap_first_experts(e));
  e->mutation = mutation;
  e->router = ina_cfg_router_config(c);
  if (mutation == INA_MUTATION_ROUTED_SCALE) e->router.routed_scaling_factor *= 0.95f;
  {
    ina_model_config_t cc = *c; /* rope_theta ignored: the frequencies of the default base */
    if (mutation == INA_MUTATION_ROPE_THETA) cc.rope_theta = 10000.0;
    ina_cfg_rope_inv_freq(&cc, inv_freq, &e->attention_factor);
    INA_CUDA_CHECK(cudaMemcpy(e->inv_freq, inv_freq, (size_t)c->qk_rope_head_dim / 2 * sizeof(float),
                              cudaMemcpyHostToDevice));
  }
  gpu_drop_graphs(e);
fail:
  return st;
}

static float latent_eps(const ina_engine_gpu_t *e) {
  return e->mutation == INA_MUTATION_LATENT_EPS ? 1e-5f : LATENT_NORM_EPS;
}

/* The mutations' softmax scale: x 0.95, or 1 / sqrt(qk_head_dim) without YaRN's mscale^2. */
static float attention_scale(const ina_engine_gpu_t *e) {
  const ina_model_config_t *c = e->cfg;
  if (e->mutation == INA_MUTATION_DECODE_SCALE) return 0.95f * e->softmax_scale;
  if (e->mutation == INA_MUTATION_DECODE_NO_MSCALE)
    return 1.0f / sqrtf((float)(c->qk_nope_head_dim + c->qk_rope_head_dim));
  return e->softmax_scale;
}

/* ---- one layer ---------------------------------------------------------------------- */

typedef struct step_inputs {
  const int32_t *positions, *page_ids, *slots, *kv_indptr, *kv_indices; /* device */
  ina_mla_plan_info_t plan;  /* dense, or V3.2's sparse plan */
  ina_dsa_gpu_plan_info_t dsa; /* V3.2: the indexer's */
  int padded; /* the step may hold padding rows (page id -1): a graph bucket, attention DP */
} step_inputs_t;

/* Layer l's cache entries: [pages][page_size][latent | rope key (| V3.2's index key)] bf16. */
static char *layer_cache(const ina_engine_gpu_t *e, int32_t l) { return (char *)e->cache + (size_t)l * e->cache_layer_bytes; }

static int64_t entry_bytes(const ina_engine_gpu_t *e) {
  return (int64_t)e->cache_page_bytes / ina_page_pool_page_size(e->kv);
}

static ina_mla_cache_t latent_cache(const ina_engine_gpu_t *e, int32_t l) {
  const ina_model_config_t *c = e->cfg;
  ina_mla_cache_t m = ina_mla_cache_interleaved(INA_MLA_CACHE_BF16, layer_cache(e, l), ina_page_pool_page_size(e->kv),
                                                c->kv_lora_rank, c->qk_rope_head_dim);
  m.latent_token_stride = m.rope_token_stride = entry_bytes(e);
  m.latent_page_stride = m.rope_page_stride = (int64_t)e->cache_page_bytes;
  return m;
}

/* The index keys after the latent and rope key of each entry: bf16, or FP8 inline
 * (e4m3 bytes, then the f32 scale). */
static ina_dsa_index_cache_t index_cache(const ina_engine_gpu_t *e, int32_t l) {
  const ina_model_config_t *c = e->cfg;
  char *keys = layer_cache(e, l) + (size_t)(c->kv_lora_rank + c->qk_rope_head_dim) * sizeof(uint16_t);
  const int32_t page_size = ina_page_pool_page_size(e->kv);
  ina_dsa_index_cache_t k = e->fp8_index_keys ? ina_dsa_index_cache_fp8_inline(keys, page_size, c->index_head_dim)
                                              : ina_dsa_index_cache_dense(INA_DSA_KEY_BF16, keys, page_size,
                                                                          c->index_head_dim);
  k.token_stride = entry_bytes(e);
  k.page_stride = (int64_t)e->cache_page_bytes;
  if (e->fp8_index_keys) k.scale_stride = entry_bytes(e);
  return k;
}

/* V3.2's lightning indexer (Hugging Face's DeepseekV32Indexer) into s.sel: its query heads
 * wq_b(qa) and key LayerNorm(wk(h)) roped on their first qk_rope_head_dim dims in the
 * half-split layout (whatever MLA's layout), the key appended to the token's cache entry;
 * each head's weight weights_proj(h) in fp32 (hi + lo); the scores over the visible
 * cached keys and the index_topk best of each row (attention/dsa_gpu.h). The weights'
 * index_heads^-0.5 rides on the softmax scale (relu is positively homogeneous). Every
 * intermediate is bf16 but the weights and scores, as model/engine_cpu_numerics.c
 * mirrors. */
static ina_status_t index_select(ina_engine_gpu_t *e, int32_t l, int64_t T, const step_inputs_t *in) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  const gpu_layer_t *L = &e->w.layers[l];
  gpu_step_t *s = &e->s;
  const int32_t nI = c->index_n_heads, D = c->index_head_dim, R = c->qk_rope_head_dim;
  INA_CHECK(linear(e, &L->index_wq_b, s->qa, T, s->iq, INA_DTYPE_BF16, NULL));
  INA_CHECK(linear(e, &L->index_wk, s->h, T, s->ik, INA_DTYPE_BF16, NULL));
  {
    ina_gpu_layernorm_params_t p = INA_GPU_LAYERNORM_PARAMS_INIT;
    p.rows = T;
    p.cols = D;
    p.x = s->ik;
    p.weight = L->index_k_norm;
    p.bias = L->index_k_norm_bias;
    p.eps = 1e-6f;
    p.y = s->ik;
    INA_CHECK(ina_gpu_layernorm(&p, e->stream));
  }
  for (int key = 0; key < (e->mutation == INA_MUTATION_INDEX_KEY_NO_ROPE ? 1 : 2); key++) {
    ina_gpu_rope_params_t p = INA_GPU_ROPE_PARAMS_INIT;
    p.tokens = T;
    p.heads = key ? 1 : nI;
    p.x = key ? s->ik : s->iq;
    p.token_stride = key ? D : (int64_t)nI * D;
    p.head_stride = D;
    p.rope_offset = 0;
    p.rope_dim = R;
    p.inv_freq = e->inv_freq;
    p.attention_factor = e->attention_factor;
    p.pairs_layout = 0;
    p.positions = in->positions;
    p.positions_dtype = INA_DTYPE_I32;
    INA_CHECK(ina_gpu_rope(&p, e->stream));
  }
  {
    ina_dsa_gpu_append_params_t p = INA_DSA_GPU_APPEND_PARAMS_INIT;
    p.num_tokens = (int32_t)T;
    p.k = s->ik;
    p.page_ids = in->page_ids;
    p.slots = in->slots;
    p.cache = index_cache(e, l);
    INA_CHECK(ina_dsa_gpu_append(&p, e->stream));
  }
  {
    const gpu_linear_t hi = {nI, c->hidden_size, 0, L->index_w_hi, NULL};
    INA_CHECK(linear(e, &hi, s->h, T, s->iw, INA_DTYPE_F32, NULL));
    if (L->index_w_lo) {
      const gpu_linear_t lo = {nI, c->hidden_size, 0, L->index_w_lo, NULL};
      INA_CHECK(linear(e, &lo, s->h, T, s->iw, INA_DTYPE_F32, s->iw));
    }
  }
  {
    ina_dsa_gpu_score_run_params_t p = INA_DSA_GPU_SCORE_RUN_PARAMS_INIT;
    p.q = s->iq;
    p.weights = s->iw;
    p.cache = index_cache(e, l);
    p.kv_indptr = in->kv_indptr;
    p.kv_indices = in->kv_indices;
    p.softmax_scale = (float)(1.0 / sqrt((double)D * (double)nI));
    p.scores = e->dsa_scores;
    p.query_format = e->fp8_index_keys ? INA_DSA_GPU_QUERY_FP8 : INA_DSA_GPU_QUERY_BF16; /* DeepSeek's release */
    INA_CHECK(ina_dsa_gpu_score_run(&in->dsa, e->dsa_dev_ws, &p, e->stream));
  }
  {
    ina_dsa_gpu_topk_run_params_t p = INA_DSA_GPU_TOPK_RUN_PARAMS_INIT;
    p.scores = e->dsa_scores;
    p.indices = s->sel;
    INA_CHECK(ina_dsa_gpu_topk_run(&in->dsa, e->dsa_dev_ws, &p, e->stream));
  }
fail:
  return st;
}

/* s.h (normalized) -> s.delta (attention output). */
static ina_status_t attention_block(ina_engine_gpu_t *e, int32_t l, int64_t T, const step_inputs_t *in) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  const gpu_layer_t *L = &e->w.layers[l];
  gpu_step_t *s = &e->s;
  const int64_t H = e->heads, C = c->kv_lora_rank, R = c->qk_rope_head_dim, V = c->v_head_dim;
  const int64_t nope = c->qk_nope_head_dim, QK = nope + R;
  const ina_mla_cache_t cache = latent_cache(e, l);

  if (c->q_lora_rank > 0) {
    INA_CHECK(linear(e, &L->q_a_proj, s->h, T, s->qa, INA_DTYPE_BF16, NULL));
    INA_CHECK(rmsnorm(e, T, c->q_lora_rank, s->qa, NULL, L->q_a_norm, latent_eps(e), s->qa));
    INA_CHECK(linear(e, &L->q_b_proj, s->qa, T, s->q, INA_DTYPE_BF16, NULL));
  } else {
    INA_CHECK(linear(e, &L->q_proj, s->h, T, s->q, INA_DTYPE_BF16, NULL));
  }
  INA_CHECK(linear(e, &L->kv_a_proj, s->h, T, s->kv, INA_DTYPE_BF16, NULL));
  {
    ina_mla_append_params_t p = INA_MLA_APPEND_PARAMS_INIT;
    p.num_tokens = (int32_t)T;
    p.kv = s->kv;
    p.kv_stride = C + R;
    p.norm_weight = L->kv_a_norm;
    p.eps = latent_eps(e);
    p.inv_freq = e->inv_freq;
    p.attention_factor = e->attention_factor;
    p.rope_layout = c->rope_layout == INA_ROPE_PAIRS ? INA_MLA_ROPE_PAIRS : INA_MLA_ROPE_HALVES;
    p.positions = in->positions;
    p.positions_dtype = INA_DTYPE_I32;
    p.page_ids = in->page_ids;
    p.slots = in->slots;
    p.cache = cache;
    INA_CHECK(ina_mla_append(&p, e->stream));
  }
  {
    ina_gpu_rope_params_t p = INA_GPU_ROPE_PARAMS_INIT;
    p.tokens = T;
    p.heads = (int32_t)H;
    p.x = s->q;
    p.token_stride = H * QK;
    p.head_stride = QK;
    p.rope_offset = (int32_t)nope;
    p.rope_dim = (int32_t)R;
    p.inv_freq = e->inv_freq;
    p.attention_factor = e->attention_factor;
    p.pairs_layout = c->rope_layout == INA_ROPE_PAIRS;
    p.positions = in->positions;
    p.positions_dtype = INA_DTYPE_I32;
    INA_CHECK(ina_gpu_rope(&p, e->stream));
  }
  if (e->has_indexer) INA_CHECK(index_select(e, l, T, in));
  INA_CHECK(ina_mla_absorb_q(e->absorb, L->kv_b, (int32_t)T, s->q, H * QK, QK, s->q_abs, H * C, C, e->stream));
  {
    ina_mla_run_params_t p = INA_MLA_RUN_PARAMS_INIT;
    p.q_nope = s->q_abs;
    p.q_nope_token_stride = H * C;
    p.q_nope_head_stride = C;
    p.q_pe = s->q + nope;
    p.q_pe_token_stride = H * QK;
    p.q_pe_head_stride = QK;
    p.cache = cache;
    p.kv_indptr = in->kv_indptr;
    p.kv_indices = in->kv_indices;
    p.softmax_scale = attention_scale(e);
    p.out = s->o_lat;
    p.out_token_stride = H * C;
    p.out_head_stride = C;
    p.lse = NULL;
    p.indices = e->has_indexer ? s->sel : NULL;
    INA_CHECK(ina_mla_run(&in->plan, e->mla_dev_ws, &p, e->stream));
  }
  INA_CHECK(ina_mla_absorb_v(e->absorb, L->kv_b, (int32_t)T, s->o_lat, H * C, C, s->attn, H * V, V, e->stream));
  INA_CHECK(linear(e, &L->o_proj, s->attn, T, s->delta, INA_DTYPE_BF16, NULL));
fail:
  return st;
}

/* One grouped GEMM of the routed experts: y[rows, n] = x[rows, k] . W_e^T per expert's rows
 * (part 0 gate, 1 up, 2 down). FP8 experts quantize x first (1 x 128 blocks, row-major
 * scales). */
static ina_status_t grouped_linear(ina_engine_gpu_t *e, const gpu_layer_t *L, const gpu_slot_layer_t *S, int part,
                                   int64_t n, int64_t k, const uint16_t *x, int64_t rows, uint16_t *y) {
  ina_status_t st = INA_OK;
  ina_gemm_grouped_args_t a = INA_GEMM_GROUPED_ARGS_INIT;
  a.mode = L->grouped_fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
  a.num_groups = e->cfg->n_routed_experts;
  a.max_rows = rows;
  a.n = n;
  a.k = k;
  a.offsets = e->s.expert_offsets;
  a.w = L->grouped_w[part];
  if (S) {
    /* Expert parallelism: this rank's slots, each over its run of rows (slot_rows), tiles
     * planned as on one GPU so that every row is computed alike. */
    a.num_groups = S->slots;
    a.offsets = e->slot_begins;
    a.row_ends = e->slot_ends;
    a.plan_groups = e->cfg->n_routed_experts;
    a.w = S->tab_w[part];
  }
  a.y = y;
  a.stream = e->stream;
  if (L->grouped_fp8) {
    INA_CHECK(ina_cuda_fp8_quantize_blocks(x, rows, k, 1, INA_GEMM_BLOCK, e->s.q8, e->s.q8_scale, e->stream));
    a.x = e->s.q8;
    a.x_scale = e->s.q8_scale;
    a.w_scale = S ? S->tab_s[part] : L->grouped_scale[part];
  } else {
    a.x = x;
  }
  INA_CHECK(ina_gemm_grouped_run(&a));
fail:
  return st;
}

/* s.xe (expert inputs in sorted-slot order) -> s.ye, with the experts' row counts read on
 * the device only. */
static ina_status_t experts_grouped(ina_engine_gpu_t *e, const gpu_layer_t *L, const gpu_slot_layer_t *S,
                                    int64_t rows) {
  ina_status_t st = INA_OK;
  gpu_step_t *s = &e->s;
  const int64_t Hd = e->cfg->hidden_size, inter = e->cfg->moe_intermediate_size / e->tp_size;
  if (S) {
    INA_CHECK(ina_gpu_moe_slot_rows(s->expert_offsets, e->cfg->n_routed_experts, S->info_dev, S->slots,
                                    e->slot_begins, e->slot_ends, e->stream));
  }
  INA_CHECK(grouped_linear(e, L, S, 0, inter, Hd, s->xe, rows, s->g));
  INA_CHECK(grouped_linear(e, L, S, 1, inter, Hd, s->xe, rows, s->u));
  INA_CHECK(ina_gpu_silu_mul(rows, inter, s->g, s->u, inter, s->a, NULL, NULL, e->stream));
  INA_CHECK(grouped_linear(e, L, S, 2, Hd, inter, s->a, rows, s->ye));
fail:
  return st;
}

/* The same, one GEMM per expert (or slot) with rows: reads the row counts back to the
 * host (a synchronization), for layers the grouped GEMM does not take. */
static ina_status_t experts_one_by_one(ina_engine_gpu_t *e, int32_t l, const gpu_slot_layer_t *S, int64_t rows) {
  ina_status_t st = INA_OK;
  const gpu_layer_t *L = &e->w.layers[l];
  gpu_step_t *s = &e->s;
  const int64_t Hd = e->cfg->hidden_size, inter = e->cfg->moe_intermediate_size / e->tp_size;
  const int32_t all = e->cfg->n_routed_experts, groups = S ? S->slots : all;
  INA_CUDA_CHECK(cudaMemcpyAsync(e->offsets_host, s->expert_offsets, (size_t)(all + 1) * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, e->stream));
  INA_CUDA_CHECK(cudaStreamSynchronize(e->stream));
  const int32_t *off = e->offsets_host;
  INA_REQUIRE(off[all] <= rows, INA_ERR_INTERNAL, "gpu engine: layer %d routed %d rows, at most %lld expected", l,
              off[all], (long long)rows);
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1 && rows > 0) INA_CHECK(ina_gpu_silu_mul(rows, inter, s->g, s->u, inter, s->a, NULL, NULL, e->stream));
    for (int32_t g = 0; g < groups; g++) {
      /* Group g's rows: expert g's, or slot g's run of its expert's (slot_rows' cut). */
      int64_t b = 0, n = 0;
      const gpu_mlp_t *m = NULL;
      if (S) {
        const int32_t x = S->info[3 * g], j = S->info[3 * g + 1], r = S->info[3 * g + 2];
        if (x < 0) continue;
        const int64_t all_n = off[x + 1] - off[x];
        b = off[x] + all_n * j / r;
        n = off[x] + all_n * (j + 1) / r - b;
        m = &S->w[g];
      } else {
        b = off[g];
        n = off[g + 1] - b;
        m = &L->experts[g];
      }
      if (n == 0) continue;
      if (pass == 0) {
        INA_CHECK(linear(e, &m->gate, s->xe + b * Hd, n, s->g + b * inter, INA_DTYPE_BF16, NULL));
        INA_CHECK(linear(e, &m->up, s->xe + b * Hd, n, s->u + b * inter, INA_DTYPE_BF16, NULL));
      } else {
        INA_CHECK(linear(e, &m->down, s->a + b * inter, n, s->ye + b * Hd, INA_DTYPE_BF16, NULL));
      }
    }
  }
fail:
  return st;
}

/* s.h (normalized) -> s.delta: routed experts weighted and summed, plus shared experts.
 * Under attention DP the routed experts run over every rank's T rows, gathered in rank
 * order (so every rank routes and permutes alike, as without DP), and each rank combines
 * its own rows: the same values as one GPU computing all the rows. */
static ina_status_t moe_block(ina_engine_gpu_t *e, int32_t l, int64_t T, const int32_t *page_ids, int padded) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  const gpu_layer_t *L = &e->w.layers[l];
  gpu_step_t *s = &e->s;
  const int64_t Hd = c->hidden_size;
  const int32_t E = c->n_routed_experts, K = c->num_experts_per_tok;
  const int64_t Ta = T * e->dp_size, mine = T * e->dp_rank; /* all rows; our first */
  const uint16_t *h = s->h;
  const int32_t *row_mask = page_ids;
  if (e->dp_size > 1) {
    /* Every rank's rows; their page ids were gathered once for the step (enqueue_forward). */
    INA_CHECK(gpu_split_mark(&e->split, SPLIT_EP_COMM, e->stream));
    INA_CHECK(ina_comm_all_gather(e->ep_comm, s->h, s->h_all, (size_t)(T * Hd), INA_DTYPE_BF16, e->stream));
    INA_CHECK(gpu_split_mark(&e->split, SPLIT_MOE, e->stream));
    h = s->h_all;
    row_mask = s->page_ids_all;
  }
  /* The router in fp32 out: hi (+ lo for an f32 router, see engine_gpu.h). */
  const gpu_linear_t hi = {E, Hd, 0, L->router_hi, NULL}, lo = {E, Hd, 0, L->router_lo, NULL};
  INA_CHECK(linear(e, &hi, h, Ta, s->router_logits, INA_DTYPE_F32, NULL));
  if (L->router_lo) INA_CHECK(linear(e, &lo, h, Ta, s->router_logits, INA_DTYPE_F32, s->router_logits));
  INA_CHECK(ina_gpu_router(&e->router, s->router_logits, L->router_bias, Ta, s->topk_ids, s->topk_weights, e->stream));
  /* Padding rows go to no expert: they would cost expert reads (a whole rank's share of
   * them under attention DP at small batches) for rows nobody keeps. */
  if (padded) INA_CHECK(ina_gpu_moe_drop_rows(s->topk_ids, Ta, K, row_mask, e->stream));
  /* Load statistics: the step's real rows only (padding rows have no cache page); every
   * rank counts every rank's rows, as without DP. */
  INA_CHECK(ina_gpu_moe_count(s->topk_ids, Ta, K, row_mask, E, e->expert_load_dev + (int64_t)e->moe_index[l] * E,
                              e->stream));
  {
    ina_gpu_moe_permute_params_t p = INA_GPU_MOE_PERMUTE_PARAMS_INIT;
    p.tokens = Ta;
    p.top_k = K;
    p.num_experts = E;
    p.ids = s->topk_ids;
    p.expert_counts = s->expert_counts;
    p.expert_offsets = s->expert_offsets;
    p.sorted_token = s->sorted_token;
    p.slot_of = s->slot_of;
    p.workspace = s->permute_ws;
    p.workspace_bytes = s->permute_ws_bytes;
    INA_CHECK(ina_gpu_moe_permute(&p, e->stream));
  }
  /* Every token takes top_k slots (a padding row's are dropped: the slots past the last
   * expert's stay unused), so a bound on the rows is known here; only their split among
   * the experts lives on the device. Gather each slot's input row (the embedding gather
   * with h as the table). */
  const int64_t rows = Ta * K;
  INA_CHECK(ina_gpu_embedding(s->sorted_token, rows, h, INA_DTYPE_BF16, Ta, Hd, s->xe, NULL, e->stream));
  /* Expert parallelism: our experts' rows, zeros elsewhere, then the sum over the group
   * gives every rank every row, exactly (one rank holds each row). */
  if (e->ep_comm) INA_CUDA_CHECK(cudaMemsetAsync(s->ye, 0, (size_t)(rows * Hd) * sizeof(uint16_t), e->stream));
  const gpu_slot_layer_t *S = e->slot_layers ? &e->slot_layers[e->moe_index[l]] : NULL;
  if (S ? S->tab_w[0] != NULL : L->grouped_w[0] != NULL)
    INA_CHECK(experts_grouped(e, L, S, rows));
  else
    INA_CHECK(experts_one_by_one(e, l, S, rows));
  if (e->ep_ar) {
    INA_CHECK(gpu_split_mark(&e->split, SPLIT_EP_COMM, e->stream));
    INA_CHECK(sum_over(e->ep_ar, s->ye, rows * Hd, e->stream));
    INA_CHECK(gpu_split_mark(&e->split, SPLIT_MOE, e->stream));
  }
  const int shared = L->has_shared && e->mutation != INA_MUTATION_NO_SHARED;
  if (shared) INA_CHECK(mlp(e, &L->mlp, s->h, T, s->shared));
  INA_CHECK(ina_gpu_moe_combine(T, K, Hd, s->ye, rows, s->slot_of + mine * K, s->topk_weights + mine * K,
                                shared ? s->shared : NULL, s->delta, e->stream));
fail:
  return st;
}

/* ---- the step ----------------------------------------------------------------------- */

/* Enqueues the forward pass of T token rows up to the logits of `out_rows` rows in s.logits:
 * every row (all_rows) or the rows listed at last_rows_dev. Waits for nothing. */
static ina_status_t enqueue_forward(ina_engine_gpu_t *e, int64_t T, int64_t out_rows, int all_rows,
                                    const step_inputs_t *in, const int32_t *tokens_dev,
                                    const int32_t *last_rows_dev) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  gpu_step_t *s = &e->s;
  const int64_t Hd = c->hidden_size;
  const float eps = (float)c->rms_norm_eps;
  /* The part a norm belongs to: the TP all-reduce it is fused with, else the rest. */
  const gpu_split_part_t norm_part = e->tp_ar ? SPLIT_TP_COMM : SPLIT_OTHER;
  gpu_split_begin(&e->split);
  if (e->dp_size > 1 && e->num_moe_layers > 0) {
    /* Attention DP: every rank's page ids (negative for padding rows), which every MoE
     * layer's routing reads, gathered once per step. */
    INA_CHECK(gpu_split_mark(&e->split, SPLIT_EP_COMM, e->stream));
    INA_CHECK(ina_comm_all_gather(e->ep_comm, in->page_ids, s->page_ids_all, (size_t)T, INA_DTYPE_I32, e->stream));
  }
  INA_CHECK(gpu_split_mark(&e->split, SPLIT_OTHER, e->stream));
  INA_CHECK(ina_gpu_embedding(tokens_dev, T, e->w.embed, INA_DTYPE_BF16, c->vocab_size, Hd, s->x, NULL, e->stream));
  for (int32_t l = 0; l < c->num_layers; l++) {
    const gpu_layer_t *L = &e->w.layers[l];
    /* The residual stream s.x takes the previous block's output as it is normalized. */
    if (l == 0) {
      INA_CHECK(rmsnorm(e, T, Hd, s->x, NULL, L->input_norm, eps, s->h));
    } else {
      INA_CHECK(gpu_split_mark(&e->split, norm_part, e->stream));
      INA_CHECK(add_and_norm(e, T, L->input_norm, eps));
    }
    INA_CHECK(gpu_split_mark(&e->split, SPLIT_ATTENTION, e->stream));
    INA_CHECK(attention_block(e, l, T, in));
    INA_CHECK(gpu_split_mark(&e->split, norm_part, e->stream));
    INA_CHECK(add_and_norm(e, T, L->post_attention_norm, eps));
    if (L->is_moe) {
      INA_CHECK(gpu_split_mark(&e->split, SPLIT_MOE, e->stream));
      INA_CHECK(moe_block(e, l, T, in->page_ids, in->padded));
    } else {
      INA_CHECK(gpu_split_mark(&e->split, SPLIT_OTHER, e->stream));
      INA_CHECK(mlp(e, &L->mlp, s->h, T, s->delta));
    }
  }
  INA_CHECK(gpu_split_mark(&e->split, norm_part, e->stream));
  INA_CHECK(add_and_norm(e, T, e->w.final_norm, eps));
  INA_CHECK(gpu_split_mark(&e->split, SPLIT_OTHER, e->stream));
  {
    const uint16_t *final_rows = s->h;
    if (!all_rows) {
      /* Each sequence's last token: gather its row (the embedding gather again). */
      INA_CHECK(ina_gpu_embedding(last_rows_dev, out_rows, s->h, INA_DTYPE_BF16, T, Hd, s->fin, NULL, e->stream));
      final_rows = s->fin;
    }
    INA_CHECK(linear(e, &e->w.lm_head, final_rows, out_rows, s->logits, INA_DTYPE_F32, NULL));
  }
  e->split.forward_marks = e->split.count;
fail:
  return st;
}

/* The graph of decode bucket `bucket`, captured now if there is none: the forward pass of
 * `bucket` rows, one per sequence, reading the inputs laid out by stage_inputs. NULL with
 * INA_OK when capture is not possible (graphs are then switched off for this engine). */
static ina_status_t decode_graph(ina_engine_gpu_t *e, int32_t bucket, const step_inputs_t *in,
                                 const stage_layout_t *l, cudaGraphExec_t *out) {
  ina_status_t st = INA_OK;
  cudaGraph_t graph = NULL;
  *out = NULL;
  for (int32_t i = 0; i < e->num_graphs; i++)
    if (e->graphs[i].bucket == bucket) {
      *out = e->graphs[i].exec;
      return INA_OK;
    }
  if (e->num_graphs == MAX_GRAPHS) gpu_drop_graphs(e);
  INA_CUDA_CHECK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeThreadLocal));
  const ina_status_t captured =
      enqueue_forward(e, bucket, bucket, 0, in, e->stage_dev + l->tokens, e->stage_dev + l->last_rows);
  const cudaError_t ended = cudaStreamEndCapture(e->stream, &graph);
  if (captured != INA_OK || ended != cudaSuccess || !graph) {
    INA_LOG_W(INA_LOG_SUBSYS, "gpu engine: decode step capture failed (%s); running steps eagerly",
              captured != INA_OK ? ina_last_error() : cudaGetErrorString(ended));
    (void)cudaGetLastError();
    e->use_graphs = 0;
    goto fail;
  }
  cudaGraphExec_t exec = NULL;
  INA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  e->graphs[e->num_graphs].bucket = bucket;
  e->graphs[e->num_graphs].exec = exec;
  e->num_graphs++;
  *out = exec;
fail:
  if (graph) cudaGraphDestroy(graph);
  return st;
}

/* A step with one new token per sequence and a graph bucket for its batch. */
static int graph_step(const ina_engine_gpu_t *e, const ina_batch_t *b) {
  return e->use_graphs && b->batch <= MAX_GRAPH_BATCH && b->qo_indptr[b->batch] == b->batch;
}

/* The step's shape without attention DP: the whole batch, a graph step padded to its
 * bucket. */
static void whole_batch_shape(const ina_engine_gpu_t *e, const ina_batch_t *b, step_shape_t *sh) {
  const int64_t T = b->qo_indptr[b->batch];
  sh->mine = *b;
  sh->graphed = graph_step(e, b);
  sh->rows = sh->graphed ? round_up_pow2(b->batch, 1) : T;
  sh->seqs = sh->graphed ? (int32_t)sh->rows : b->batch;
  sh->out_rows = sh->graphed ? sh->rows : b->all_logits ? T : b->batch;
}

/* Room for the greedy tokens of n rows on the device, with their sampling parameters
 * (temperature 0: greedy). */
static ina_status_t ensure_tokens(ina_engine_gpu_t *e, int64_t n) {
  ina_status_t st = INA_OK;
  ina_gpu_sampling_row_t *params = NULL;
  if (n <= e->tokens_cap) return INA_OK;
  const int64_t cap = round_up_pow2(n, 256);
  cudaFree(e->tokens_dev);
  cudaFree(e->greedy_params_dev);
  e->tokens_dev = NULL;
  e->greedy_params_dev = NULL;
  e->tokens_cap = 0;
  params = malloc((size_t)cap * sizeof *params);
  INA_CHECK_ALLOC(params);
  for (int64_t i = 0; i < cap; i++) params[i] = (ina_gpu_sampling_row_t){0.0f, 0, 1.0f, 0, 0, 0};
  INA_CUDA_CHECK(cudaMalloc((void **)&e->tokens_dev, (size_t)cap * sizeof(int32_t)));
  INA_CUDA_CHECK(cudaMalloc((void **)&e->greedy_params_dev, (size_t)cap * sizeof *params));
  INA_CUDA_CHECK(cudaMemcpy(e->greedy_params_dev, params, (size_t)cap * sizeof *params, cudaMemcpyHostToDevice));
  e->tokens_cap = cap;
fail:
  free(params);
  return st;
}

/* The step of ina_engine_gpu_forward (logits) or ina_engine_gpu_forward_greedy (tokens):
 * exactly one of them is set. */
static ina_status_t forward(ina_engine_gpu_t *e, const ina_batch_t *b, float *logits, int32_t *tokens) {
  ina_status_t st = INA_OK;
  int appended = 0;
  step_shape_t sh;
  INA_CHECK(ina_engine_validate_batch(e->cfg, b));
  const int64_t T = b->qo_indptr[b->batch];
  if (T == 0) return INA_OK; /* no token: nothing grows, no logits row */
  INA_REQUIRE((logits != NULL) != (tokens != NULL), INA_ERR_INVALID_ARGUMENT, "forward: %s is NULL",
              tokens ? "tokens" : "logits");
  const int64_t out_rows = b->all_logits ? T : b->batch; /* the caller's rows */
  INA_CUDA_CHECK(cudaSetDevice(e->device));
  /* Room for the whole batch's host scratch first (remember_last_pages). */
  INA_CHECK(ensure_capacity(e, 0, b->batch));
  remember_last_pages(e, b);
  INA_CHECK(ina_engine_append_all(e->kv, b));
  appended = 1;
  /* Under attention DP the sequences' ranks come from their pages, known only now. */
  if (e->dp_size > 1)
    INA_CHECK(gpu_dp_split(e, b, graph_step(e, b), &sh));
  else
    whole_batch_shape(e, b, &sh);
  INA_CHECK(ensure_capacity(e, sh.rows, sh.seqs));
  /* Greedy tokens: the caller's rows; under attention DP ours, then every rank's. */
  if (tokens) INA_CHECK(ensure_tokens(e, e->dp_size > 1 ? (e->dp_size + 1) * sh.out_rows : out_rows));
  INA_CHECK(copy_replaced_pages(e, b));
  INA_CHECK(ina_page_table_build(&e->table, (const ina_kv_seq_t *const *)sh.mine.seqs, sh.mine.batch,
                                 ina_page_pool_page_size(e->kv)));
  {
    stage_layout_t l;
    step_inputs_t in;
    cudaGraphExec_t exec = NULL;
    INA_CHECK(stage_inputs(e, &sh.mine, sh.rows, sh.seqs, &l));
    in.positions = e->stage_dev + l.positions;
    in.page_ids = e->stage_dev + l.page_ids;
    in.slots = e->stage_dev + l.slots;
    in.kv_indptr = e->stage_dev + l.kv_indptr;
    in.kv_indices = e->stage_dev + l.kv_indices;
    in.padded = sh.graphed || e->dp_size > 1;
    memset(&in.dsa, 0, sizeof in.dsa);
    if (e->has_indexer)
      INA_CHECK(plan_sparse(e, &sh.mine, (int32_t)sh.rows, &in.dsa, &in.plan));
    else
      INA_CHECK(plan_attention(e, &sh.mine, sh.seqs, &in.plan));
    if (sh.graphed) INA_CHECK(decode_graph(e, (int32_t)sh.rows, &in, &l, &exec));
    if (exec)
      INA_CUDA_CHECK(cudaGraphLaunch(exec, e->stream));
    else
      INA_CHECK(enqueue_forward(e, sh.rows, sh.out_rows, b->all_logits, &in, e->stage_dev + l.tokens,
                                e->stage_dev + l.last_rows));
    /* The marks after the forward's own (a graph holds those): the logits' way out. */
    e->split.count = e->split.forward_marks;
    const int64_t V = e->cfg->vocab_size;
    if (tokens && e->dp_size > 1) {
      /* Each rank chooses its own rows' tokens: only those travel, not the logits. */
      INA_CHECK(gpu_dp_greedy_tokens(e, &sh));
    } else if (tokens) {
      /* Greedy sampling: the argmax, and -1 for a row of NaN only (as the CPU sampler). */
      INA_CHECK(ina_gpu_sample(e->s.logits, INA_DTYPE_F32, out_rows, V, V, e->greedy_params_dev, 0, e->tokens_dev,
                               NULL, e->stream));
      INA_CUDA_CHECK(cudaMemcpyAsync(tokens, e->tokens_dev, (size_t)out_rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                     e->stream));
    } else {
      const float *rows_dev = e->s.logits; /* the caller's rows, in batch order */
      if (e->dp_size > 1) INA_CHECK(gpu_dp_order_logits(e, b, &sh, &rows_dev));
      INA_CUDA_CHECK(cudaMemcpyAsync(logits, rows_dev, (size_t)(out_rows * V) * sizeof(float), cudaMemcpyDeviceToHost,
                                     e->stream));
    }
    INA_CHECK(gpu_split_mark(&e->split, SPLIT_OTHER, e->stream)); /* the end */
    INA_CUDA_CHECK(cudaStreamSynchronize(e->stream));
    INA_CHECK(gpu_split_end_step(&e->split));
    if (tokens && e->dp_size > 1) gpu_dp_order_tokens(e, b, &sh, tokens);
  }
  return INA_OK;
fail:
  if (appended) {
    /* Let queued work that may read the staging buffers finish before they are reused. */
    (void)cudaStreamSynchronize(e->stream);
    (void)cudaGetLastError();
    ina_engine_truncate_all(e->kv, b);
  }
  return st;
}

ina_status_t ina_engine_gpu_forward(ina_engine_gpu_t *e, const ina_batch_t *b, float *logits) {
  return forward(e, b, logits, NULL);
}

ina_status_t ina_engine_gpu_forward_greedy(ina_engine_gpu_t *e, const ina_batch_t *b, int32_t *tokens) {
  return forward(e, b, NULL, tokens);
}

void *ina_engine_gpu_host_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return p;
}

void ina_engine_gpu_host_free(void *p) {
  if (p) cudaFreeHost(p);
}
