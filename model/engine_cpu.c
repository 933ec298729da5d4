/* The CPU engine: one forward step of DeepSeek-V2/V3 over a ragged batch, in fp32, with
 * the paged latent cache in host memory. The step follows the model's data flow:
 * embedding -> per layer (RMSNorm, MLA, residual, RMSNorm, MLP or MoE, residual) ->
 * final norm -> LM head. */
#define INA_LOG_SUBSYS "model"
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "attention/dsa.h"
#include "attention/prefill_ref.h"
#include "core/check.h"
#include "core/threadpool.h"
#include "mla/mla_ref.h"
#include "model/cpu_ops.h"
#include "model/engine_backend.h"
#include "model/engine_cpu_internal.h"
#include "model/engine_cpu_numerics.h"
#include "model/engine_test_hooks.h"
#include "model/model.h"
#include "moe_ep/expert_parallel.h"
#include "moe_ep/expert_slots.h"
#include "moe_ep/moe_layer.h"
#include "moe_ep/router.h"

/* HF (and DeepSeek's own code) build q_a_layernorm and kv_a_layernorm without an eps
 * argument, so the latent norms always use the RMSNorm default, not rms_norm_eps. */
#define LATENT_NORM_EPS 1e-6f

static float latent_norm_eps(const ina_engine_cpu_t *e) {
  return e->mutation == INA_MUTATION_LATENT_EPS ? 1e-5f : LATENT_NORM_EPS;
}

/* With GPU numerics, x[n] as the CUDA engine stores it (bf16); else unchanged. The
 * oracle's noise of relative size `noise` goes on before the rounding. */
static void as_stored_noise(ina_engine_cpu_t *e, float *x, int64_t n, float noise) {
  if (!e->gpu_numerics) return;
  if (noise > 0)
    for (int64_t i = 0; i < n; i++) {
      uint64_t z = (e->noise_state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      const float u = (float)((double)((z ^ (z >> 31)) >> 11) * 0x1p-52 - 1.0);
      x[i] *= 1.0f + u * noise;
    }
  ina_cpu_round_bf16(x, n);
}

static void as_stored(ina_engine_cpu_t *e, float *x, int64_t n) { as_stored_noise(e, x, n, e->noise.relative); }

ina_status_t ina_engine_cpu_create(const ina_model_t *model, const ina_engine_options_t *options,
                                   ina_engine_cpu_t **out) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = NULL;
  const ina_engine_options_t defaults = INA_ENGINE_OPTIONS_INIT;
  INA_REQUIRE(out && model, INA_ERR_INVALID_ARGUMENT, "engine: NULL argument");
  *out = NULL;
  if (!options) options = &defaults;
  INA_REQUIRE_VERSIONED(options, ENGINE_OPTIONS_V1_SIZE, "engine options", "INA_ENGINE_OPTIONS_INIT");
  INA_REQUIRE(options->page_size >= 1 && options->max_tokens >= 1, INA_ERR_INVALID_ARGUMENT,
              "engine: page_size (%d) and max_tokens (%lld) must be positive", options->page_size,
              (long long)options->max_tokens);
  INA_REQUIRE(!ina_model_random_on_device(model, NULL, NULL), INA_ERR_INVALID_ARGUMENT,
              "cpu engine: the model's random weights were left for a device engine to generate "
              "(random_on_device); open it without that option to run on the CPU");
  e = calloc(1, sizeof *e);
  INA_CHECK_ALLOC(e);
  e->model = model;
  e->cfg = ina_model_config(model);
  e->w = ina_model_weights(model);
  e->expanded_decode = options->expanded_decode;
  e->tp_comm = ina_engine_options_tp_comm(options);
  e->max_expert_bytes = ina_engine_options_max_expert_bytes(options);
  e->attention_dp = ina_engine_options_attention_dp(options);
  e->gpu_numerics = ina_engine_options_numerics(options) == INA_ENGINE_NUMERICS_GPU;
  e->fp8_index_keys = ina_engine_options_index_keys(options) == INA_ENGINE_INDEX_KEYS_FP8;
  if (e->gpu_numerics) {
    e->kv_a_norm_bf16 = calloc((size_t)e->cfg->num_layers, sizeof *e->kv_a_norm_bf16);
    INA_CHECK_ALLOC(e->kv_a_norm_bf16);
    for (int32_t l = 0; l < e->cfg->num_layers; l++) {
      const ina_tensor_t *w = &e->w->layers[l].kv_a_norm;
      const int64_t n = ina_tensor_numel(w);
      float *f32 = malloc((size_t)n * sizeof *f32);
      INA_CHECK_ALLOC(f32);
      ina_to_f32(w->data, w->dtype, f32, (size_t)n);
      st = ina_tensor_alloc(&e->kv_a_norm_bf16[l], INA_DTYPE_BF16, 1, &n, INA_CPU);
      if (st == INA_OK) st = ina_from_f32(f32, e->kv_a_norm_bf16[l].data, INA_DTYPE_BF16, (size_t)n);
      free(f32);
      INA_CHECK(st);
    }
  }
  INA_REQUIRE(e->attention_dp >= 0 && e->attention_dp <= 2, INA_ERR_INVALID_ARGUMENT,
              "engine: attention_dp %d (0 off, 1 a batch per rank, 2 one batch split by sequence)", e->attention_dp);
  INA_REQUIRE(!e->attention_dp || ina_engine_options_ep_comm(options), INA_ERR_INVALID_ARGUMENT,
              "engine: attention data parallelism shares the MoE layers over ep_comm, and none was given");
  {
    const int32_t tp_size = e->tp_comm ? ina_comm_size(e->tp_comm) : 1;
    const int32_t tp_rank = e->tp_comm ? ina_comm_rank(e->tp_comm) : 0;
    INA_REQUIRE(e->w->tp_size == tp_size && e->w->tp_rank == tp_rank, INA_ERR_INVALID_ARGUMENT,
                "engine: the model holds tensor-parallel slice %d of %d, but this rank is %d of "
                "%d in tp_comm%s",
                e->w->tp_rank, e->w->tp_size, tp_rank, tp_size,
                e->tp_comm ? "" : " (none given: one rank)");
    e->heads = e->cfg->num_heads / tp_size;
  }
  pthread_mutex_init(&e->load_mu, NULL);
  e->moe_index = malloc((size_t)e->cfg->num_layers * sizeof *e->moe_index);
  INA_CHECK_ALLOC(e->moe_index);
  for (int32_t l = 0; l < e->cfg->num_layers; l++)
    e->moe_index[l] = ina_cfg_layer_is_moe(e->cfg, l) ? e->num_moe_layers++ : -1;
  {
    ina_comm_t *ep_comm = ina_engine_options_ep_comm(options);
    INA_REQUIRE(ep_comm || (e->w->expert_begin == 0 &&
                            e->w->expert_end == e->cfg->n_routed_experts),
                INA_ERR_UNSUPPORTED,
                "engine: this model holds experts [%d, %d) of %d; without an expert-parallel "
                "communicator (ep_comm) the engine needs all of them",
                e->w->expert_begin, e->w->expert_end, e->cfg->n_routed_experts);
    INA_CHECK(ina_ep_group_init(ep_comm, e->w->expert_begin, e->w->expert_end,
                                e->cfg->n_routed_experts, e->num_moe_layers, &e->ep));
    e->moe_layers = malloc(((size_t)e->num_moe_layers + 1) * sizeof *e->moe_layers);
    INA_CHECK_ALLOC(e->moe_layers);
    for (int32_t l = 0; l < e->cfg->num_layers; l++)
      if (e->moe_index[l] >= 0) e->moe_layers[e->moe_index[l]] = l;
    INA_CHECK(ina_expert_slots_from_model(e->w, e->moe_layers, &e->ep.placement, e->ep.rank,
                                          &e->slots));
  }
  {
    const int x = ina_engine_options_ep_exchange(options);
    e->ep_exchange = x != INA_ENGINE_EP_EXCHANGE_AUTO ? x
                     : e->attention_dp                ? INA_ENGINE_EP_EXCHANGE_DISPATCH
                                                      : INA_ENGINE_EP_EXCHANGE_ALLGATHER;
    INA_REQUIRE(e->ep_exchange != INA_ENGINE_EP_EXCHANGE_DISPATCH || e->attention_dp, INA_ERR_INVALID_ARGUMENT,
                "engine: the dispatch exchange needs attention data parallelism (attention_dp): with the batch "
                "replicated, every rank holds every token already");
    e->traffic.exchange = e->ep_exchange;
    ina_ep_config_t xc = INA_EP_CONFIG_INIT;
    xc.layout = (ina_ep_layout_t)options->ep_layout;
    xc.dispatch_payload = (ina_ep_payload_t)options->ep_payload;
    xc.combine_payload = INA_EP_PAYLOAD_F32; /* expert outputs are not rounded before the sum */
    xc.hidden = e->cfg->hidden_size;
    xc.top_k = e->cfg->num_experts_per_tok > 0 ? e->cfg->num_experts_per_tok : 1;
    xc.max_tokens_per_rank = options->ep_max_tokens > 0 ? options->ep_max_tokens : 512;
    if (ina_engine_options_ep_exchange(options) == INA_ENGINE_EP_EXCHANGE_AUTO &&
        options->struct_size < offsetof(ina_engine_options_t, ep_max_tokens) + sizeof(int64_t)) {
      xc.layout = INA_EP_LAYOUT_CONTIGUOUS;
      xc.dispatch_payload = INA_EP_PAYLOAD_F32;
    }
    e->ex_config = xc;
    e->micro_batches = ina_engine_options_micro_batches(options);
    INA_REQUIRE(e->micro_batches == 1 || e->micro_batches == 2, INA_ERR_INVALID_ARGUMENT,
                "engine: micro_batches %d: 1 (the batch whole) or 2 (two-batch overlap)", (int)e->micro_batches);
    INA_REQUIRE(e->micro_batches == 1 || e->ep_exchange == INA_ENGINE_EP_EXCHANGE_DISPATCH, INA_ERR_INVALID_ARGUMENT,
                "engine: two-batch overlap (micro_batches 2) needs the dispatch exchange, which only attention "
                "data parallelism runs: the %s exchange has no halves to overlap",
                ina_engine_ep_exchange_name(e->ep_exchange));
    e->traffic.micro_batches = e->micro_batches;
  }
  e->expert_load = calloc((size_t)e->num_moe_layers * (size_t)e->cfg->n_routed_experts + 1,
                          sizeof *e->expert_load);
  INA_CHECK_ALLOC(e->expert_load);
  e->step_load = calloc((size_t)e->num_moe_layers * (size_t)e->cfg->n_routed_experts + 1,
                        sizeof *e->step_load);
  INA_CHECK_ALLOC(e->step_load);
  INA_CHECK(ina_threadpool_create(options->num_threads, &e->pool));
  {
    ina_page_pool_config_t pc = INA_PAGE_POOL_CONFIG_INIT;
    int64_t pages = (options->max_tokens + options->page_size - 1) / options->page_size;
    INA_REQUIRE(pages <= INT32_MAX, INA_ERR_INVALID_ARGUMENT, "engine: max_tokens too large");
    pc.page_size = options->page_size;
    pc.num_pages = (int32_t)pages;
    pc.num_layers = e->cfg->num_layers;
    /* A token's entry: the latent, the rope key, and V3.2's index key after them (one
     * entry, so that prefix sharing, copy on write and page transfers carry it). */
    pc.entry_elems = e->cfg->kv_lora_rank + e->cfg->qk_rope_head_dim +
                     (ina_cfg_has_indexer(e->cfg) ? e->cfg->index_head_dim : 0);
    pc.dtype = INA_DTYPE_F32;
    /* A batch split by sequence: each rank's sequences in a stripe of their own. */
    if (e->attention_dp == 2) pc.stripes = ina_comm_size(ina_engine_options_ep_comm(options));
    INA_CHECK(ina_page_pool_create(&pc, &e->kv));
  }
  e->inv_freq = malloc((size_t)e->cfg->qk_rope_head_dim / 2 * sizeof(float));
  INA_CHECK_ALLOC(e->inv_freq);
  ina_cfg_rope_inv_freq(e->cfg, e->inv_freq, &e->attention_factor);
  e->softmax_scale = (float)ina_cfg_softmax_scale(e->cfg);
  *out = e;
  return INA_OK;
fail:
  ina_engine_cpu_destroy(e);
  return st;
}

void ina_engine_cpu_destroy(ina_engine_cpu_t *e) {
  if (!e) return;
  ina_page_pool_destroy(e->kv);
  ina_threadpool_destroy(e->pool);
  ina_ep_exchange_destroy(e->ex[0]);
  ina_ep_exchange_destroy(e->ex[1]);
  ina_ep_group_free(&e->ep);
  ina_expert_slots_release(&e->slots, NULL);
  free(e->moe_layers);
  if (e->moe_index) pthread_mutex_destroy(&e->load_mu);
  free(e->moe_index);
  free(e->expert_load);
  free(e->step_load);
  free(e->inv_freq);
  free(e->routes);
  for (int32_t l = 0; e->kv_a_norm_bf16 && l < e->cfg->num_layers; l++) ina_tensor_release(&e->kv_a_norm_bf16[l]);
  free(e->kv_a_norm_bf16);
  free(e);
}

ina_page_pool_t *ina_engine_cpu_page_pool(ina_engine_cpu_t *e) { return e->kv; }
const ina_model_config_t *ina_engine_cpu_config(const ina_engine_cpu_t *e) { return e->cfg; }

/* ---- the step's working memory ---------------------------------------------------- */

typedef struct step {
  ina_engine_cpu_t *e;
  const ina_batch_t *b;
  int64_t T;          /* new tokens in the step */
  int64_t *positions; /* [T] */
  int32_t *token_seq; /* [T] sequence of each token */
  float *x, *h, *tmp; /* [T, hidden] */
  float *qa;          /* [T, q_lora_rank] */
  float *q;           /* [T, heads, qk_head_dim] */
  float *kv;          /* [T, kv_lora_rank + rope] */
  float *attn;        /* [T, heads, v_head_dim] */
  float *g, *u;       /* [T, max intermediate] */
  float *iq, *iw;     /* V3.2's indexer: query heads [T, index heads, index dim], their weights [T, index heads] */
} step_t;

static void step_free(step_t *s) {
  free(s->positions);
  free(s->token_seq);
  free(s->x);
  free(s->h);
  free(s->tmp);
  free(s->qa);
  free(s->q);
  free(s->kv);
  free(s->attn);
  free(s->g);
  free(s->u);
  free(s->iq);
  free(s->iw);
}

/* The widest MLP intermediate (dense, or the shared experts together). */
static int64_t widest_intermediate(const ina_model_config_t *c) {
  int64_t inter = c->intermediate_size;
  if ((int64_t)c->moe_intermediate_size * (c->n_shared_experts > 1 ? c->n_shared_experts : 1) > inter)
    inter = (int64_t)c->moe_intermediate_size * (c->n_shared_experts > 1 ? c->n_shared_experts : 1);
  return inter;
}

static ina_status_t step_alloc(step_t *s) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = s->e->cfg;
  const size_t T = (size_t)(s->T > 0 ? s->T : 1);
  const int64_t inter = widest_intermediate(c);
#define ALLOC(field, count) \
  s->field = malloc(T * (size_t)(count) * sizeof *s->field); \
  INA_CHECK_ALLOC(s->field)
  ALLOC(positions, 1);
  ALLOC(token_seq, 1);
  ALLOC(x, c->hidden_size);
  ALLOC(h, c->hidden_size);
  ALLOC(tmp, c->hidden_size);
  ALLOC(qa, c->q_lora_rank > 0 ? c->q_lora_rank : 1);
  ALLOC(q, (int64_t)s->e->heads * ina_cfg_qk_head_dim(c));
  ALLOC(kv, c->kv_lora_rank + c->qk_rope_head_dim);
  ALLOC(attn, (int64_t)s->e->heads * c->v_head_dim);
  ALLOC(g, inter);
  ALLOC(u, inter);
  if (ina_cfg_has_indexer(c)) {
    ALLOC(iq, (int64_t)c->index_n_heads * c->index_head_dim);
    ALLOC(iw, c->index_n_heads);
  }
#undef ALLOC
fail:
  return st;
}

/* ---- linears ----------------------------------------------------------------------- */

/* y = x . W^T, in the engine's numerics: fp32 on the stored weights, or as the CUDA
 * engine's GEMM (FP8 where it takes it, bf16 out). */
static ina_status_t linear(ina_engine_cpu_t *e, const ina_linear_t *lin, const float *x, int64_t m, float *y) {
  ina_status_t st = INA_OK;
  if (!e->gpu_numerics) return ina_cpu_linear(e->pool, lin, x, m, y);
  ina_cpu_gpu_linear_opts_t o = {1, 1, 0}; /* fp32 out, rounded here as stored */
  o.transposed_scales = e->mutation == INA_MUTATION_FP8_SCALE_TRANSPOSED && lin == &e->w->layers[0].kv_a_proj;
  INA_CHECK(ina_cpu_gpu_linear(e->pool, lin, x, m, y, &o));
  as_stored(e, y, m * lin->weight.shape[0]);
fail:
  return st;
}

/* Row n of kv_b_proj as the absorption reads it: fp32 as stored, or as the CUDA engine
 * holds it (bf16; an FP8 kv_b dequantized to bf16). */
static void kv_b_row(const ina_engine_cpu_t *e, const ina_linear_t *kv_b, int64_t n, float *out) {
  if (e->gpu_numerics)
    ina_cpu_gpu_weight_row(kv_b, n, 0, 0, out);
  else
    ina_cpu_linear_row(kv_b, n, out);
}

/* RMSNorm of rows [m, n] into y, as stored: the CUDA engine's norms read bf16 values and
 * write bf16 (their weights: f32, kv_a_layernorm's bf16, see kv_a_norm_weight). */
static void norm_rows(ina_engine_cpu_t *e, const float *x, const ina_tensor_t *weight, int64_t m, int64_t n,
                      float eps, int64_t x_stride, float *y, int64_t y_stride) {
  ina_cpu_rmsnorm(x, weight, m, n, eps, x_stride, y, y_stride);
  for (int64_t i = 0; i < m; i++) as_stored(e, y + i * y_stride, n);
}

/* The kv_a_layernorm weight of a layer as the engine's numerics hold it: the CUDA engine
 * uploads it as bf16 (engine_gpu_weights.c), so GPU numerics read the bf16 copy made at
 * create. */
static const ina_tensor_t *kv_a_norm_weight(const ina_engine_cpu_t *e, int32_t layer) {
  return e->kv_a_norm_bf16 ? &e->kv_a_norm_bf16[layer] : &e->w->layers[layer].kv_a_norm;
}

/* ---- attention -------------------------------------------------------------------- */

/* Copy the latent and rope parts of the cache entries [0, L) of a sequence into dense
 * rows [L, kv_lora_rank + rope]. */
static void gather_entries(ina_engine_cpu_t *e, int32_t layer, const ina_kv_seq_t *seq, int64_t L,
                           float *out) {
  const int32_t page_size = ina_page_pool_page_size(e->kv);
  const int32_t row = e->cfg->kv_lora_rank + e->cfg->qk_rope_head_dim;
  for (int64_t t = 0; t < L; t++) {
    int32_t page, slot;
    ina_kv_seq_locate(seq, page_size, t, &page, &slot);
    memcpy(out + t * row, ina_page_pool_entry(e->kv, layer, page, slot), (size_t)row * sizeof(float));
  }
}

/* The latent cache of a layer as mla/mla_cache.h describes it: f32 latent then rope in
 * each entry, whose stride includes V3.2's index key. */
static ina_mla_cache_t latent_cache(ina_engine_cpu_t *e, int32_t layer) {
  const int32_t page_size = ina_page_pool_page_size(e->kv);
  const int64_t token = (int64_t)ina_page_pool_entry_elems(e->kv) * (int64_t)sizeof(float);
  ina_tensor_t cache = ina_page_pool_layer(e->kv, layer);
  ina_mla_cache_t m = ina_mla_cache_interleaved(INA_MLA_CACHE_F32, cache.data, page_size, e->cfg->kv_lora_rank,
                                                e->cfg->qk_rope_head_dim);
  m.latent_token_stride = m.rope_token_stride = token;
  m.latent_page_stride = m.rope_page_stride = token * page_size;
  return m;
}

/* V3.2's index keys of a layer (attention/dsa.h): f32, after the latent and rope key
 * in each entry. */
static ina_dsa_index_cache_t index_cache(ina_engine_cpu_t *e, int32_t layer) {
  const int32_t page_size = ina_page_pool_page_size(e->kv);
  const int64_t token = (int64_t)ina_page_pool_entry_elems(e->kv) * (int64_t)sizeof(float);
  ina_tensor_t cache = ina_page_pool_layer(e->kv, layer);
  const ina_dsa_index_cache_t k = {
      .format = INA_DSA_KEY_F32,
      .page_size = page_size,
      .head_dim = e->cfg->index_head_dim,
      .keys = (const char *)cache.data + (size_t)(e->cfg->kv_lora_rank + e->cfg->qk_rope_head_dim) * sizeof(float),
      .page_stride = token * page_size,
      .token_stride = token};
  return k;
}

/* Expanded MLA for one sequence: K and V of the whole context from the latent cache
 * through kv_b_proj, then causal attention of the new tokens (qk 192 / v 128 on V3). */
static ina_status_t attend_expanded(step_t *s, int32_t layer, int32_t i) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = s->e;
  const ina_model_config_t *c = e->cfg;
  const ina_layer_weights_t *L = &e->w->layers[layer];
  const ina_kv_seq_t *seq = s->b->seqs[i];
  const int64_t kv_len = seq->num_tokens;
  const int32_t q0 = s->b->qo_indptr[i], n = s->b->qo_indptr[i + 1] - q0;
  const int32_t H = e->heads, C = c->kv_lora_rank, R = c->qk_rope_head_dim;
  const int32_t nope = c->qk_nope_head_dim, V = c->v_head_dim, QK = nope + R;
  float *entries = NULL, *latent = NULL, *kvb = NULL, *k = NULL, *v = NULL;
  entries = malloc((size_t)kv_len * (size_t)(C + R) * sizeof(float));
  latent = malloc((size_t)kv_len * (size_t)C * sizeof(float));
  kvb = malloc((size_t)kv_len * (size_t)H * (size_t)(nope + V) * sizeof(float));
  k = malloc((size_t)kv_len * (size_t)H * (size_t)QK * sizeof(float));
  v = malloc((size_t)kv_len * (size_t)H * (size_t)V * sizeof(float));
  INA_CHECK_ALLOC(entries);
  INA_CHECK_ALLOC(latent);
  INA_CHECK_ALLOC(kvb);
  INA_CHECK_ALLOC(k);
  INA_CHECK_ALLOC(v);
  gather_entries(e, layer, seq, kv_len, entries);
  for (int64_t t = 0; t < kv_len; t++) memcpy(latent + t * C, entries + t * (C + R), (size_t)C * sizeof(float));
  INA_CHECK(ina_cpu_linear(e->pool, &L->kv_b_proj, latent, kv_len, kvb));
  for (int64_t t = 0; t < kv_len; t++) {
    for (int32_t h = 0; h < H; h++) {
      const float *src = kvb + (t * H + h) * (nope + V);
      memcpy(k + (t * H + h) * QK, src, (size_t)nope * sizeof(float));
      memcpy(k + (t * H + h) * QK + nope, entries + t * (C + R) + C, (size_t)R * sizeof(float));
      memcpy(v + (t * H + h) * V, src + nope, (size_t)V * sizeof(float));
    }
  }
  {
    ina_prefill_ref_params_t p = {n, (int32_t)kv_len, H, QK, V, e->softmax_scale,
                                  s->q + (int64_t)q0 * H * QK, k, v, s->attn + (int64_t)q0 * H * V, NULL};
    INA_CHECK(ina_attention_prefill_ref(&p, e->pool));
  }
fail:
  free(entries);
  free(latent);
  free(kvb);
  free(k);
  free(v);
  return st;
}

/* Absorption: q_abs[t, h] = W_UK[h]^T q_nope[t, h] and out[t, h] = W_UV[h] o_latent[t, h],
 * with W_UK / W_UV the key and value rows of kv_b_proj for head h. One head per item, so
 * each weight row is converted once for all tokens. */
typedef struct absorb_job {
  const ina_engine_cpu_t *e;
  const ina_linear_t *kv_b;
  const ina_model_config_t *c;
  int32_t heads; /* this rank's */
  const int32_t *tokens; /* rows of the step that take part */
  int32_t count;
  const float *q;   /* step q [T, H, QK] */
  float *q_abs;     /* [count, H, C] */
  const float *o_latent; /* [count, H, C] */
  float *attn;      /* step attn [T, H, V] */
  float *scratch;   /* [workers, C] */
} absorb_job_t;

static void absorb_q_heads(void *ctx, int64_t begin, int64_t end, int worker) {
  const absorb_job_t *j = ctx;
  const int32_t C = j->c->kv_lora_rank, nope = j->c->qk_nope_head_dim, V = j->c->v_head_dim;
  const int32_t H = j->heads, QK = nope + j->c->qk_rope_head_dim;
  float *row = j->scratch + (size_t)worker * (size_t)C;
  for (int64_t h = begin; h < end; h++) {
    for (int32_t i = 0; i < j->count; i++) memset(j->q_abs + ((int64_t)i * H + h) * C, 0, (size_t)C * sizeof(float));
    for (int32_t d = 0; d < nope; d++) {
      kv_b_row(j->e, j->kv_b, h * (nope + V) + d, row);
      for (int32_t i = 0; i < j->count; i++) {
        const float qd = j->q[((int64_t)j->tokens[i] * H + h) * QK + d];
        ina_cpu_axpy(qd, row, j->q_abs + ((int64_t)i * H + h) * C, C);
      }
    }
  }
}

static void absorb_v_heads(void *ctx, int64_t begin, int64_t end, int worker) {
  const absorb_job_t *j = ctx;
  const int32_t C = j->c->kv_lora_rank, nope = j->c->qk_nope_head_dim, V = j->c->v_head_dim;
  const int32_t H = j->heads;
  float *row = j->scratch + (size_t)worker * (size_t)C;
  for (int64_t h = begin; h < end; h++) {
    for (int32_t d = 0; d < V; d++) {
      kv_b_row(j->e, j->kv_b, h * (nope + V) + nope + d, row);
      for (int32_t i = 0; i < j->count; i++)
        j->attn[((int64_t)j->tokens[i] * H + h) * V + d] =
            ina_cpu_dot(j->o_latent + ((int64_t)i * H + h) * C, row, C);
    }
  }
}

static uint64_t id_mix(uint64_t z);

/* The oracle's near-tie probe of V3.2's top-k (GPU numerics): for each query token that
 * chose (more visible positions than k), the gap between the last position kept and the
 * best one dropped, over the scale of what can move them: N_t = sum_h |w_h| scale
 * sum_d |q_hd k_td|, which bounds the fp32 sums' error (a few ulp of it) and the error of
 * weights_proj's bf16 hi + lo split (2^-17 of it). margin = gap / (N_kept + N_dropped),
 * +inf when both are exactly 0 (two scores of zeros stay zeros), folded into the row's
 * route record with the hash of the set chosen, so that the oracle counts such rows
 * apart as it does routing near-ties (tests/model/oracle.h). */
static void record_selection(ina_engine_cpu_t *e, int32_t layer, int32_t nseq, const int32_t *qo,
                             const int32_t *kv_len, const ina_page_table_t *table, const int32_t *tokens,
                             const float *iq, const float *iw, const float *scores, int64_t score_stride,
                             const int32_t *selected, int32_t K, float scale) {
  const ina_model_config_t *c = e->cfg;
  const int32_t nI = c->index_n_heads, D = c->index_head_dim;
  const int32_t page_size = ina_page_pool_page_size(e->kv);
  const ina_dsa_index_cache_t cache = index_cache(e, layer);
  unsigned char *kept = calloc((size_t)score_stride + 1, 1);
  if (!kept) return; /* the probe only: no record means no row counted apart */
  for (int32_t k = 0; k < nseq; k++) {
    const int32_t q_len = qo[k + 1] - qo[k];
    for (int32_t j = 0; j < q_len; j++) {
      const int32_t i = qo[k] + j, visible = kv_len[k] - q_len + j + 1;
      const int64_t row = tokens[i];
      if (visible <= K || row >= e->route_rows) continue;
      const float *sc = scores + (int64_t)i * score_stride;
      const int32_t *sel = selected + (int64_t)i * K;
      uint64_t set = 0;
      for (int32_t x = 0; x < K; x++) {
        kept[sel[x]] = 1;
        set += id_mix((uint64_t)sel[x] + 0x5e1ec7ull * (uint64_t)(layer + 1));
      }
      int32_t dropped = -1;
      for (int32_t t = 0; t < visible; t++)
        if (!kept[t] && (dropped < 0 || sc[t] > sc[dropped])) dropped = t;
      const int32_t last = sel[K - 1];
      double n[2] = {0, 0};
      const int32_t pos[2] = {last, dropped};
      for (int p = 0; p < 2; p++) {
        const int32_t t = pos[p];
        const int32_t page = table->indices[table->indptr[k] + t / page_size];
        const float *key =
            (const float *)((const char *)cache.keys + page * cache.page_stride + (t % page_size) * cache.token_stride);
        for (int32_t h = 0; h < nI; h++) {
          double a = 0;
          for (int32_t d = 0; d < D; d++) a += fabs((double)iq[((int64_t)i * nI + h) * D + d] * key[d]);
          n[p] += fabs((double)iw[(int64_t)i * nI + h]) * scale * a;
        }
      }
      /* The FP8 query's products add on FP8 tensor cores with 13 fraction bits, not fp32's
       * 24: test_dsa_gpu.c's model bounds a score's error by about 2^-10 of N (a few
       * 2^-13 per 32-dim step), 2^7 times the fp32 error the oracle's tie margin stands
       * for, so N counts 2^7 times as much. */
      const double n_scale = e->fp8_index_keys ? 0x1p7 : 1.0;
      const double gap = (double)sc[last] - (double)sc[dropped];
      const float margin = n[0] + n[1] > 0 ? (float)(gap / (n_scale * (n[0] + n[1]))) : gap > 0 ? INFINITY : 0.0f;
      ina_engine_route_t *r = &e->routes[row];
      r->experts = id_mix(r->experts ^ set);
      if (margin < r->margin) r->margin = margin;
      for (int32_t x = 0; x < K; x++) kept[sel[x]] = 0;
    }
  }
  free(kept);
}

/* DeepSeek Sparse Attention (V3.2): the indexer's scores of each query token over its
 * visible cached tokens, its index_topk best (attention/dsa.h's tie rule: higher score,
 * then lower position), and absorbed MLA over only those, into o_latent. The requests,
 * their tokens (rows of the step) and the absorbed queries as attend_absorbed made them. */
static ina_status_t attend_selected(step_t *s, int32_t layer, int32_t nseq, const int32_t *qo, const int32_t *kv_len,
                                    const ina_page_table_t *table, const int32_t *tokens, int32_t count,
                                    const float *q_abs, const float *q_pe, float scale, float *o_latent) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = s->e;
  const ina_model_config_t *c = e->cfg;
  const int32_t nI = c->index_n_heads, D = c->index_head_dim;
  const int32_t K = c->index_topk - (e->mutation == INA_MUTATION_INDEX_TOPK_LESS && c->index_topk > 1);
  const int32_t page_size = ina_page_pool_page_size(e->kv);
  float *iq = malloc(((size_t)count * (size_t)nI * (size_t)D + 1) * sizeof *iq);
  float *iw = malloc(((size_t)count * (size_t)nI + 1) * sizeof *iw), *scores = NULL;
  int32_t *selected = malloc(((size_t)count * (size_t)K + 1) * sizeof *selected);
  void *ws_score = NULL, *ws_topk = NULL, *ws_mla = NULL;
  INA_CHECK_ALLOC(iq);
  INA_CHECK_ALLOC(iw);
  INA_CHECK_ALLOC(selected);
  for (int32_t i = 0; i < count; i++) {
    memcpy(iq + (size_t)i * nI * D, s->iq + (size_t)tokens[i] * nI * D, (size_t)nI * D * sizeof *iq);
    memcpy(iw + (size_t)i * nI, s->iw + (size_t)tokens[i] * nI, (size_t)nI * sizeof *iw);
  }
  /* FP8 index keys go with DeepSeek's FP8 query: each head's row rounded as the GPU
   * quantizes it (model.h's index_keys). */
  if (e->fp8_index_keys) INA_CHECK(ina_dsa_index_query_round_fp8(iq, count * nI, D, iq));
  size_t bytes = 0;
  ina_dsa_plan_info_t score_info, topk_info, mla_info;
  {
    ina_dsa_score_plan_params_t p = INA_DSA_SCORE_PLAN_PARAMS_INIT;
    p.backend = INA_DSA_BACKEND_REF;
    p.batch = nseq, p.qo_indptr = qo, p.kv_len = kv_len;
    p.num_heads = nI, p.head_dim = D, p.page_size = page_size;
    INA_CHECK(ina_dsa_score_workspace_size(&p, &bytes));
    ws_score = malloc(bytes + 1);
    INA_CHECK_ALLOC(ws_score);
    INA_CHECK(ina_dsa_score_plan(&p, ws_score, bytes, &score_info));
    scores = malloc(((size_t)count * (size_t)score_info.score_stride + 1) * sizeof *scores);
    INA_CHECK_ALLOC(scores);
    ina_dsa_score_run_params_t r = INA_DSA_SCORE_RUN_PARAMS_INIT;
    r.q = iq, r.weights = iw, r.cache = index_cache(e, layer);
    r.kv_indptr = table->indptr, r.kv_indices = table->indices;
    r.softmax_scale = (float)(1.0 / sqrt((double)D));
    r.scores = scores;
    INA_CHECK(ina_dsa_score_run(&score_info, ws_score, &r, e->pool, NULL));
  }
  {
    ina_dsa_topk_plan_params_t p = INA_DSA_TOPK_PLAN_PARAMS_INIT;
    p.backend = INA_DSA_BACKEND_REF;
    p.batch = nseq, p.qo_indptr = qo, p.kv_len = kv_len;
    p.topk = K, p.score_stride = score_info.score_stride;
    INA_CHECK(ina_dsa_topk_workspace_size(&p, &bytes));
    ws_topk = malloc(bytes + 1);
    INA_CHECK_ALLOC(ws_topk);
    INA_CHECK(ina_dsa_topk_plan(&p, ws_topk, bytes, &topk_info));
    ina_dsa_topk_run_params_t r = INA_DSA_TOPK_RUN_PARAMS_INIT;
    r.scores = scores, r.indices = selected;
    INA_CHECK(ina_dsa_topk_run(&topk_info, ws_topk, &r, e->pool, NULL));
    if (e->gpu_numerics && e->routes)
      record_selection(e, layer, nseq, qo, kv_len, table, tokens, iq, iw, scores, score_info.score_stride, selected, K,
                       (float)(1.0 / sqrt((double)D)));
  }
  {
    ina_dsa_mla_plan_params_t p = INA_DSA_MLA_PLAN_PARAMS_INIT;
    p.backend = INA_DSA_BACKEND_REF;
    p.batch = nseq, p.qo_indptr = qo, p.kv_len = kv_len;
    p.num_heads = e->heads, p.kv_lora_rank = c->kv_lora_rank, p.rope_dim = c->qk_rope_head_dim;
    p.page_size = page_size, p.index_stride = K;
    INA_CHECK(ina_dsa_mla_workspace_size(&p, &bytes));
    ws_mla = malloc(bytes + 1);
    INA_CHECK_ALLOC(ws_mla);
    INA_CHECK(ina_dsa_mla_plan(&p, ws_mla, bytes, &mla_info));
    ina_dsa_mla_run_params_t r = INA_DSA_MLA_RUN_PARAMS_INIT;
    r.q_nope = q_abs, r.q_pe = q_pe, r.cache = latent_cache(e, layer);
    r.kv_indptr = table->indptr, r.kv_indices = table->indices;
    r.indices = selected, r.softmax_scale = scale, r.out = o_latent;
    INA_CHECK(ina_dsa_mla_run(&mla_info, ws_mla, &r, e->pool, NULL));
  }
fail:
  free(iq);
  free(iw);
  free(scores);
  free(selected);
  free(ws_score);
  free(ws_topk);
  free(ws_mla);
  return st;
}

/* Absorbed MLA over the paged latent cache for the sequences in `seq_ids`, with softmax
 * scale `scale` (V3.2: over each token's selected cached tokens only); skip_newest
 * leaves each sequence's newest key out (a mutation). */
static ina_status_t attend_absorbed(step_t *s, int32_t layer, const int32_t *seq_ids, int32_t nseq, float scale,
                                    int skip_newest) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = s->e;
  const ina_model_config_t *c = e->cfg;
  const int32_t H = e->heads, C = c->kv_lora_rank, R = c->qk_rope_head_dim;
  const int32_t QK = c->qk_nope_head_dim + R;
  const int32_t workers = ina_threadpool_size(e->pool);
  ina_page_table_t table = INA_PAGE_TABLE_INIT;
  const ina_kv_seq_t **seqs = NULL;
  int32_t *qo = NULL, *kv_len = NULL, *tokens = NULL;
  float *q_abs = NULL, *q_pe = NULL, *o_latent = NULL, *scratch = NULL;
  int32_t count = 0;
  for (int32_t k = 0; k < nseq; k++) count += s->b->qo_indptr[seq_ids[k] + 1] - s->b->qo_indptr[seq_ids[k]];
  seqs = malloc((size_t)nseq * sizeof *seqs);
  qo = malloc((size_t)(nseq + 1) * sizeof *qo);
  kv_len = malloc((size_t)nseq * sizeof *kv_len);
  tokens = malloc((size_t)count * sizeof *tokens);
  q_abs = malloc((size_t)count * H * C * sizeof(float));
  q_pe = malloc((size_t)count * H * R * sizeof(float) + 1);
  o_latent = malloc((size_t)count * H * C * sizeof(float));
  scratch = malloc((size_t)workers * C * sizeof(float));
  INA_CHECK_ALLOC(seqs);
  INA_CHECK_ALLOC(qo);
  INA_CHECK_ALLOC(kv_len);
  INA_CHECK_ALLOC(tokens);
  INA_CHECK_ALLOC(q_abs);
  INA_CHECK_ALLOC(q_pe);
  INA_CHECK_ALLOC(o_latent);
  INA_CHECK_ALLOC(scratch);
  qo[0] = 0;
  for (int32_t k = 0; k < nseq; k++) {
    const int32_t i = seq_ids[k];
    seqs[k] = s->b->seqs[i];
    kv_len[k] = (int32_t)s->b->seqs[i]->num_tokens - (skip_newest ? 1 : 0);
    qo[k + 1] = qo[k];
    for (int32_t t = s->b->qo_indptr[i]; t < s->b->qo_indptr[i + 1]; t++) {
      tokens[qo[k + 1]] = t;
      for (int32_t h = 0; h < H; h++)
        memcpy(q_pe + ((int64_t)qo[k + 1] * H + h) * R, s->q + ((int64_t)t * H + h) * QK + c->qk_nope_head_dim,
               (size_t)R * sizeof(float));
      qo[k + 1]++;
    }
  }
  INA_CHECK(ina_page_table_build(&table, seqs, nseq, ina_page_pool_page_size(e->kv)));
  {
    absorb_job_t job = {e, &e->w->layers[layer].kv_b_proj, c, H, tokens, count, s->q, q_abs, o_latent,
                        s->attn, scratch};
    ina_parallel_for(e->pool, H, 1, absorb_q_heads, &job);
    as_stored(e, q_abs, (int64_t)count * H * C);
    if (ina_cfg_has_indexer(c)) {
      INA_CHECK(attend_selected(s, layer, nseq, qo, kv_len, &table, tokens, count, q_abs, q_pe, scale, o_latent));
    } else {
      ina_mla_ref_params_t p = {nseq, H, C, R, scale, qo, kv_len, table.indptr, table.indices,
                                q_abs, q_pe, latent_cache(e, layer), o_latent, NULL};
      INA_CHECK(ina_mla_attention_ref(&p, e->pool));
    }
    as_stored_noise(e, o_latent, (int64_t)count * H * C, e->noise.attention);
    ina_parallel_for(e->pool, H, 1, absorb_v_heads, &job);
    for (int32_t i = 0; i < count; i++) as_stored(e, s->attn + (int64_t)tokens[i] * H * c->v_head_dim, (int64_t)H * c->v_head_dim);
  }
fail:
  ina_page_table_release(&table);
  free(seqs);
  free(qo);
  free(kv_len);
  free(tokens);
  free(q_abs);
  free(q_pe);
  free(o_latent);
  free(scratch);
  return st;
}

/* ---- one layer -------------------------------------------------------------------- */

/* Tensor parallelism: each rank's o_proj and down projections see only its heads or its
 * slice of the intermediate, so their outputs are partial sums over the ranks. */
static ina_status_t tp_sum(ina_engine_cpu_t *e, float *x, int64_t n) {
  if (!e->tp_comm || ina_comm_size(e->tp_comm) == 1) return INA_OK;
  return ina_comm_all_reduce(e->tp_comm, x, x, (size_t)n, INA_DTYPE_F32, NULL);
}

/* V3.2's indexer up to its scores (Hugging Face's DeepseekV32Indexer): its query heads
 * s->iq from the q LoRA output, each head's weight s->iw = weights_proj(h) /
 * sqrt(index heads), and its key k_norm(wk(h)), all roped on their first
 * qk_rope_head_dim dims in the half-split layout (whatever MLA's layout), the key
 * written into each token's cache entry after the latent and rope key. */
static ina_status_t index_projections(step_t *s, int32_t layer) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = s->e;
  const ina_model_config_t *c = e->cfg;
  const ina_layer_weights_t *L = &e->w->layers[layer];
  const int64_t T = s->T;
  const int32_t nI = c->index_n_heads, D = c->index_head_dim, R = c->qk_rope_head_dim;
  const int32_t key_at = c->kv_lora_rank + R;
  float *k = malloc(((size_t)T * (size_t)D + 1) * sizeof *k);
  uint8_t *q8 = malloc((size_t)D + 1); /* one key's e4m3 bytes (FP8 index keys) */
  INA_CHECK_ALLOC(k);
  INA_CHECK_ALLOC(q8);
  INA_CHECK(linear(e, &L->index_wq_b, s->qa, T, s->iq));
  INA_CHECK(linear(e, &L->index_wk, s->h, T, k));
  ina_cpu_layernorm(k, &L->index_k_norm, &L->index_k_norm_bias, T, D, 1e-6f, k);
  as_stored(e, k, T * D); /* the GPU's LayerNorm writes bf16 */
  {
    /* weights_proj in fp32, as Hugging Face keeps it */
    const ina_linear_t weights_proj = {L->index_weights_proj, {0}, {0}, 0, 0};
    INA_CHECK(ina_cpu_linear(e->pool, &weights_proj, s->h, T, s->iw));
    const float head_scale = (float)(1.0 / sqrt((double)nI));
    for (int64_t i = 0; i < T * nI; i++) s->iw[i] *= head_scale;
  }
  for (int64_t t = 0; t < T; t++) {
    if (e->mutation != INA_MUTATION_INDEX_KEY_NO_ROPE) {
      ina_cpu_rope(k + t * D, R, s->positions[t], e->inv_freq, e->attention_factor, 0);
      as_stored(e, k + t * D, R);
    } /* and so does its rope, on the rotated dims */
    for (int32_t h = 0; h < nI; h++) {
      ina_cpu_rope(s->iq + (t * nI + h) * D, R, s->positions[t], e->inv_freq, e->attention_factor, 0);
      as_stored(e, s->iq + (t * nI + h) * D, R);
    }
    if (e->fp8_index_keys) {
      /* The key as an FP8 cache holds it: attention/dsa.h's quantization, dequantized. */
      float scale;
      INA_CHECK(ina_dsa_index_key_quantize_fp8(k + t * D, D, q8, &scale));
      for (int32_t d = 0; d < D; d++) k[t * D + d] = ina_fp8_e4m3_to_f32(q8[d]) * scale;
    }
    int32_t page, slot;
    ina_kv_seq_locate(s->b->seqs[s->token_seq[t]], ina_page_pool_page_size(e->kv), s->positions[t], &page, &slot);
    memcpy((float *)ina_page_pool_entry(e->kv, layer, page, slot) + key_at, k + t * D, (size_t)D * sizeof(float));
  }
fail:
  free(k);
  free(q8);
  return st;
}

static ina_status_t attention_block(step_t *s, int32_t layer) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = s->e;
  const ina_model_config_t *c = e->cfg;
  const ina_layer_weights_t *L = &e->w->layers[layer];
  const int64_t T = s->T, Hd = c->hidden_size;
  const int32_t H = e->heads, C = c->kv_lora_rank, R = c->qk_rope_head_dim;
  const int32_t QK = c->qk_nope_head_dim + R;
  const int pairs = c->rope_layout == INA_ROPE_PAIRS;
  int32_t *absorbed = NULL, *decoding = NULL;
  int32_t nabsorbed = 0, ndecoding = 0;

  norm_rows(e, s->x, &L->input_norm, T, Hd, (float)c->rms_norm_eps, Hd, s->h, Hd);
  if (c->q_lora_rank > 0) {
    INA_CHECK(linear(e, &L->q_a_proj, s->h, T, s->qa));
    norm_rows(e, s->qa, &L->q_a_norm, T, c->q_lora_rank, latent_norm_eps(e), c->q_lora_rank, s->qa, c->q_lora_rank);
    INA_CHECK(linear(e, &L->q_b_proj, s->qa, T, s->q));
  } else {
    INA_CHECK(linear(e, &L->q_proj, s->h, T, s->q));
  }
  INA_CHECK(linear(e, &L->kv_a_proj, s->h, T, s->kv));
  for (int64_t t = 0; t < T; t++) {
    float *kv = s->kv + t * (C + R);
    norm_rows(e, kv, kv_a_norm_weight(e, layer), 1, C, latent_norm_eps(e), C, kv, C);
    ina_cpu_rope(kv + C, R, s->positions[t], e->inv_freq, e->attention_factor, pairs);
    as_stored(e, kv + C, R);
    for (int32_t h = 0; h < H; h++) {
      float *q_pe = s->q + (t * H + h) * QK + c->qk_nope_head_dim;
      ina_cpu_rope(q_pe, R, s->positions[t], e->inv_freq, e->attention_factor, pairs);
      as_stored(e, q_pe, R);
    }
    /* append the token's latent entry to the paged cache */
    int32_t page, slot;
    ina_kv_seq_locate(s->b->seqs[s->token_seq[t]], ina_page_pool_page_size(e->kv), s->positions[t],
                      &page, &slot);
    memcpy(ina_page_pool_entry(e->kv, layer, page, slot), kv, (size_t)(C + R) * sizeof(float));
  }
  if (ina_cfg_has_indexer(c)) INA_CHECK(index_projections(s, layer));
  absorbed = malloc((size_t)(s->b->batch > 0 ? s->b->batch : 1) * sizeof *absorbed);
  decoding = malloc((size_t)(s->b->batch > 0 ? s->b->batch : 1) * sizeof *decoding);
  INA_CHECK_ALLOC(absorbed);
  INA_CHECK_ALLOC(decoding);
  {
    /* The decode mutations act on a sequence's one new token after context of its own. */
    const int decode_mutation = e->mutation == INA_MUTATION_DECODE_SCALE || e->mutation == INA_MUTATION_DECODE_NO_MSCALE ||
                                e->mutation == INA_MUTATION_DECODE_SKIP_NEWEST;
    for (int32_t i = 0; i < s->b->batch; i++) {
      const int32_t n = s->b->qo_indptr[i + 1] - s->b->qo_indptr[i];
      if (n == 0) continue;
      if (decode_mutation && n == 1 && s->b->seqs[i]->num_tokens > 1)
        decoding[ndecoding++] = i;
      else if ((n == 1 && !e->expanded_decode) || e->gpu_numerics || ina_cfg_has_indexer(c))
        /* the GPU absorbs every step; V3.2 attends to its selected tokens, absorbed */
        absorbed[nabsorbed++] = i;
      else
        INA_CHECK(attend_expanded(s, layer, i));
    }
  }
  if (nabsorbed > 0) INA_CHECK(attend_absorbed(s, layer, absorbed, nabsorbed, e->softmax_scale, 0));
  if (ndecoding > 0) {
    const float plain = (float)(1.0 / sqrt((double)QK));
    const float scale = e->mutation == INA_MUTATION_DECODE_SCALE     ? 0.95f * e->softmax_scale
                        : e->mutation == INA_MUTATION_DECODE_NO_MSCALE ? plain
                                                                       : e->softmax_scale;
    INA_CHECK(attend_absorbed(s, layer, decoding, ndecoding, scale, e->mutation == INA_MUTATION_DECODE_SKIP_NEWEST));
  }
  INA_CHECK(linear(e, &L->o_proj, s->attn, T, s->tmp));
  if (e->noise.reduced > 0) as_stored_noise(e, s->tmp, T * Hd, e->noise.reduced);
  INA_CHECK(tp_sum(e, s->tmp, T * Hd));
  for (int64_t i = 0; i < T * Hd; i++) s->x[i] += s->tmp[i];
  as_stored(e, s->x, T * Hd);
fail:
  free(absorbed);
  free(decoding);
  return st;
}

/* out = down(SiLU(gate(in)) * up(in)) for `rows` rows. */
static ina_status_t mlp(step_t *s, const ina_mlp_weights_t *m, const float *in, int64_t rows, float *out) {
  ina_status_t st = INA_OK;
  const int64_t inter = m->gate.weight.shape[0];
  INA_CHECK(linear(s->e, &m->gate, in, rows, s->g));
  INA_CHECK(linear(s->e, &m->up, in, rows, s->u));
  ina_cpu_silu_mul(s->g, s->u, rows * inter, s->g);
  as_stored(s->e, s->g, rows * inter);
  INA_CHECK(linear(s->e, &m->down, s->g, rows, out));
fail:
  return st;
}

/* splitmix64's finalizer: spreads an id (or a hash) over all 64 bits. */
static uint64_t id_mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The routed (token, slot) pairs of a layer in expert order, then token, then slot: HF's
 * loop order, which the combine keeps. */
typedef struct routed_pairs {
  int64_t *first;  /* [E + 1]: pairs of expert x are [first[x], first[x + 1]) */
  int32_t *token;  /* [T * K] */
  float *weight;   /* [T * K] */
} routed_pairs_t;

static void routed_pairs_free(routed_pairs_t *p) {
  free(p->first);
  free(p->token);
  free(p->weight);
}

static ina_status_t routed_pairs_build(const int32_t *ids, const float *weights, int64_t T,
                                       int32_t K, int32_t E, routed_pairs_t *p) {
  ina_status_t st = INA_OK;
  int64_t *fill = NULL;
  memset(p, 0, sizeof *p);
  p->first = calloc((size_t)E + 1, sizeof *p->first);
  p->token = malloc(((size_t)(T * K) + 1) * sizeof *p->token);
  p->weight = malloc(((size_t)(T * K) + 1) * sizeof *p->weight);
  fill = malloc(((size_t)E + 1) * sizeof *fill);
  INA_CHECK_ALLOC(p->first);
  INA_CHECK_ALLOC(p->token);
  INA_CHECK_ALLOC(p->weight);
  INA_CHECK_ALLOC(fill);
  for (int64_t i = 0; i < T * K; i++) p->first[ids[i] + 1]++;
  for (int32_t x = 0; x < E; x++) p->first[x + 1] += p->first[x];
  memcpy(fill, p->first, ((size_t)E + 1) * sizeof *fill);
  for (int64_t t = 0; t < T; t++)
    for (int32_t k = 0; k < K; k++) {
      const int64_t at = fill[ids[t * K + k]]++;
      p->token[at] = (int32_t)t;
      p->weight[at] = weights[t * K + k];
    }
fail:
  free(fill);
  if (st != INA_OK) routed_pairs_free(p);
  return st;
}

typedef struct expert_job {
  step_t *s;
  int32_t moe_layer;
  const routed_pairs_t *pairs;
  float *xe, *y;
  int64_t computed; /* rows this rank computed, which the all-gather sends to every other */
} expert_job_t;

/* One piece of the routed pairs, when it is this rank's: its rows of y. */
static ina_status_t run_piece(const ina_ep_piece_t *piece, void *arg) {
  ina_status_t st = INA_OK;
  expert_job_t *j = arg;
  const ina_engine_cpu_t *e = j->s->e;
  const int64_t Hd = e->cfg->hidden_size, n = piece->pair_end - piece->pair_begin;
  if (piece->rank != e->ep.rank) return INA_OK;
  j->computed += n;
  for (int64_t r = 0; r < n; r++)
    memcpy(j->xe + r * Hd, j->s->h + (int64_t)j->pairs->token[piece->pair_begin + r] * Hd,
           (size_t)Hd * sizeof(float));
  INA_CHECK(mlp(j->s, ina_expert_slots_at(&e->slots, j->moe_layer, piece->slot), j->xe, n,
                j->y + piece->pair_begin * Hd));
fail:
  return st;
}

/* The router on T rows of h: ids and weights [T, top_k] (the test hook's expert swap
 * applied). `record`: the oracle's route probe takes these rows (one rank's batch). */
static ina_status_t route_rows(ina_engine_cpu_t *e, int32_t layer, const float *h, int64_t T, int record,
                               int32_t *ids, float *weights) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  const ina_layer_weights_t *L = &e->w->layers[layer];
  const int32_t E = c->n_routed_experts, K = c->num_experts_per_tok;
  float *logits = NULL, *bias = NULL;
  logits = malloc(((size_t)T * E + 1) * sizeof(float));
  INA_CHECK_ALLOC(logits);
  {
    /* The router runs in fp32, as HF's F.linear on float32 weights. */
    ina_linear_t router = {L->router, {0}, {0}, 0, 0};
    INA_CHECK(ina_cpu_linear(e->pool, &router, h, T, logits));
  }
  if (!ina_tensor_is_empty(&L->router_bias)) {
    bias = malloc((size_t)E * sizeof(float));
    INA_CHECK_ALLOC(bias);
    ina_to_f32(L->router_bias.data, L->router_bias.dtype, bias, (size_t)E);
  }
  {
    const ina_router_config_t rc = ina_cfg_router_config(c);
    INA_CHECK(ina_router_ref(&rc, logits, bias, T, ids, weights));
    if (record && e->gpu_numerics && e->routes && T <= e->route_rows) {
      /* How each row was routed, and how near it came to other experts: the oracle's
       * near-tie rows. Under attention DP this layer's rows are every rank's; only a
       * single rank's are recorded. */
      float *m = malloc((size_t)T * sizeof *m);
      INA_CHECK_ALLOC(m);
      st = ina_router_ref_margins(&rc, logits, bias, T, m);
      for (int64_t t = 0; st == INA_OK && t < T; t++) {
        ina_engine_route_t *r = &e->routes[t];
        uint64_t set = 0; /* a sum of mixed ids: the chosen set, whatever their order */
        for (int32_t k = 0; k < K; k++) set += id_mix((uint64_t)ids[t * K + k]);
        r->experts = id_mix(r->experts ^ set);
        if (m[t] < r->margin) r->margin = m[t];
      }
      free(m);
      INA_CHECK(st);
    }
  }
  if (e->mutation == INA_MUTATION_EXPERT_SWAP && e->moe_index[layer] == 0 && E >= 2)
    for (int64_t i = 0; i < T * K; i++) ids[i] = ids[i] == 0 ? 1 : ids[i] == 1 ? 0 : ids[i];
fail:
  free(logits);
  free(bias);
  return st;
}

/* The end of a MoE layer on the step's rows: out (the routed experts' sum) plus the
 * shared experts on s->h (xe: [T, hidden] scratch), rounded as stored. */
static ina_status_t add_shared_experts(step_t *s, int32_t layer, float *xe, float *out) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = s->e;
  const ina_layer_weights_t *L = &e->w->layers[layer];
  const int64_t n = s->T * e->cfg->hidden_size;
  if (L->has_shared && e->mutation != INA_MUTATION_NO_SHARED) {
    INA_CHECK(mlp(s, &L->mlp, s->h, s->T, xe));
    for (int64_t i = 0; i < n; i++) out[i] += xe[i];
  }
  as_stored(e, out, n);
fail:
  return st;
}

static ina_status_t moe_layer(step_t *s, int32_t layer, float *out) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = s->e;
  const ina_model_config_t *c = e->cfg;
  const int64_t T = s->T, Hd = c->hidden_size;
  const int32_t E = c->n_routed_experts, K = c->num_experts_per_tok;
  float *weights = NULL, *xe = NULL, *y = NULL;
  int32_t *ids = NULL;
  routed_pairs_t pairs = {NULL, NULL, NULL};
  weights = malloc(((size_t)T * K + 1) * sizeof(float));
  ids = malloc(((size_t)T * K + 1) * sizeof(int32_t));
  xe = malloc(((size_t)T * Hd + 1) * sizeof(float));
  y = malloc(((size_t)T * K * Hd + 1) * sizeof(float));
  INA_CHECK_ALLOC(weights);
  INA_CHECK_ALLOC(ids);
  INA_CHECK_ALLOC(xe);
  INA_CHECK_ALLOC(y);
  INA_CHECK(route_rows(e, layer, s->h, T, 1, ids, weights));
  INA_CHECK(routed_pairs_build(ids, weights, T, K, E, &pairs));
  {
    uint64_t *load = e->step_load + (int64_t)e->moe_index[layer] * E;
    for (int32_t x = 0; x < E; x++) load[x] += (uint64_t)(pairs.first[x + 1] - pairs.first[x]);
  }
  /* Our pieces, each over the tokens routed to its expert; then every rank's rows
   * everywhere. */
  {
    expert_job_t job = {s, e->moe_index[layer], &pairs, xe, y, 0};
    INA_CHECK(ina_ep_walk_pieces(&e->ep, job.moe_layer, pairs.first, run_piece, &job));
    if (e->ep.nranks > 1) {
      e->step_traffic.layers++;
      e->step_traffic.combine_bytes += job.computed * (e->ep.nranks - 1) * Hd * (int64_t)sizeof(float);
    }
  }
  INA_CHECK(ina_ep_share_outputs(&e->ep, e->moe_index[layer], pairs.first, Hd, y));
  /* Combine in expert order, each token's rows in turn (HF's loop order). */
  memset(out, 0, (size_t)T * Hd * sizeof(float));
  for (int64_t i = 0; i < pairs.first[E]; i++) {
    float *dst = out + (int64_t)pairs.token[i] * Hd;
    const float *src = y + i * Hd;
    const float w = pairs.weight[i] * (e->mutation == INA_MUTATION_ROUTED_SCALE ? 0.95f : 1.0f);
    for (int64_t d = 0; d < Hd; d++) dst[d] += src[d] * w;
  }
  INA_CHECK(add_shared_experts(s, layer, xe, out));
fail:
  free(weights);
  free(ids);
  free(xe);
  free(y);
  routed_pairs_free(&pairs);
  return st;
}

/* Attention data parallelism: the ranks' tokens gathered over the expert-parallel group in
 * rank order, the layer over all of them (the same routing and pieces on every rank), and
 * this rank's rows kept. */
static ina_status_t moe_block_dp(step_t *s, int32_t layer, float *out) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = s->e;
  const int64_t Hd = e->cfg->hidden_size, inter = widest_intermediate(e->cfg);
  const int32_t n = e->ep.nranks;
  int64_t mine = s->T, total = 0, first = 0;
  int64_t *counts = malloc((size_t)n * sizeof *counts);
  size_t *sc = calloc((size_t)n, sizeof *sc), *sd = calloc((size_t)n, sizeof *sd);
  size_t *rc = calloc((size_t)n, sizeof *rc), *rd = calloc((size_t)n, sizeof *rd);
  float *h_all = NULL, *out_all = NULL, *g = NULL, *u = NULL;
  step_t all = *s;
  INA_CHECK_ALLOC(counts);
  INA_CHECK_ALLOC(sc);
  INA_CHECK_ALLOC(sd);
  INA_CHECK_ALLOC(rc);
  INA_CHECK_ALLOC(rd);
  INA_CHECK(ina_comm_all_gather(e->ep.comm, &mine, counts, 1, INA_DTYPE_I64, NULL));
  for (int32_t r = 0; r < n; r++) {
    if (r == e->ep.rank) first = total;
    rd[r] = (size_t)(total * Hd);
    rc[r] = (size_t)(counts[r] * Hd);
    sc[r] = (size_t)(mine * Hd); /* our rows to every rank, from the same place */
    total += counts[r];
  }
  if (total == 0) goto fail; /* no rank brought a token */
  h_all = malloc((size_t)(total * Hd) * sizeof *h_all);
  out_all = malloc((size_t)(total * Hd) * sizeof *out_all);
  g = malloc((size_t)(total * inter) * sizeof *g);
  u = malloc((size_t)(total * inter) * sizeof *u);
  INA_CHECK_ALLOC(h_all);
  INA_CHECK_ALLOC(out_all);
  INA_CHECK_ALLOC(g);
  INA_CHECK_ALLOC(u);
  INA_CHECK(ina_comm_all_to_all_v(e->ep.comm, s->h, sc, sd, h_all, rc, rd, INA_DTYPE_F32, NULL));
  e->step_traffic.rows_sent += mine * (n - 1);
  e->step_traffic.dispatch_bytes += mine * (n - 1) * Hd * (int64_t)sizeof(float);
  all.h = h_all;
  all.T = total;
  all.g = g;
  all.u = u;
  INA_CHECK(moe_layer(&all, layer, out_all));
  if (mine > 0) memcpy(out, out_all + first * Hd, (size_t)(mine * Hd) * sizeof *out);
fail:
  free(counts);
  free(sc), free(sd), free(rc), free(rd);
  free(h_all), free(out_all), free(g), free(u);
  return st;
}

/* The exchange for the placement in force: made at the first MoE layer, remade when a
 * placement change altered the slots per rank (local: no communication). */
/* Exchange i (one per micro-batch), made for the placement's slots per rank: remade
 * when a placement change alters them. */
static ina_status_t ensure_exchange(ina_engine_cpu_t *e, int i) {
  ina_status_t st = INA_OK;
  if (e->ex[i] && e->ex_config.slots_per_rank == e->ep.placement.slots_per_rank) return INA_OK;
  ina_ep_exchange_destroy(e->ex[0]);
  ina_ep_exchange_destroy(e->ex[1]);
  e->ex[0] = e->ex[1] = NULL;
  e->ex_config.slots_per_rank = e->ep.placement.slots_per_rank;
  for (int j = 0; j < e->micro_batches; j++) INA_CHECK(ina_ep_exchange_create(e->ep.comm, &e->ex_config, &e->ex[j]));
fail:
  return st;
}

/* Attention data parallelism over the dispatch/combine exchange: moe_ep/moe_layer.h's
 * three stages, with this engine's router and experts. This rank routes its own rows
 * and sends each only to the ranks of its experts (begin); runs its slots on the rows
 * it received (experts); sums the outputs that came back in the one-rank order, then
 * adds the shared experts on its own rows, as moe_layer does (end). */
static ina_status_t route_own_rows(void *ctx, int32_t layer, int32_t moe, const float *x, int64_t T, int32_t *ids,
                                   float *weights) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = ctx;
  const int32_t E = e->cfg->n_routed_experts, K = e->cfg->num_experts_per_tok;
  INA_CHECK(route_rows(e, layer, x, T, 0, ids, weights));
  uint64_t *load = e->step_load + (int64_t)moe * E;
  for (int64_t i = 0; i < T * K; i++) load[ids[i]]++;
fail:
  return st;
}

static ina_status_t run_slot(void *ctx, int32_t layer, int32_t moe, int32_t slot, const float *rows, int64_t n,
                             float *out) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = ctx;
  (void)layer;
  const int64_t inter = widest_intermediate(e->cfg);
  step_t scratch; /* mlp's scratch only, for these rows */
  memset(&scratch, 0, sizeof scratch);
  scratch.e = e;
  scratch.g = malloc(((size_t)(n * inter)) * sizeof *scratch.g + 1);
  scratch.u = malloc(((size_t)(n * inter)) * sizeof *scratch.u + 1);
  INA_CHECK_ALLOC(scratch.g);
  INA_CHECK_ALLOC(scratch.u);
  INA_CHECK(mlp(&scratch, ina_expert_slots_at(&e->slots, moe, slot), rows, n, out));
fail:
  free(scratch.g);
  free(scratch.u);
  return st;
}

/* A micro-batch's flight: moe_ep/moe_layer.h's, and whether its traffic counts as the
 * step's layer (micro-batch 0: the other half's bytes add to the same layer). */
typedef struct moe_flight {
  ina_moe_ops_t ops;
  ina_moe_flight_t f;
  int count_layer;
} moe_flight_t;

static void flight_init(moe_flight_t *m, ina_engine_cpu_t *e, int i) {
  m->ops = (ina_moe_ops_t){route_own_rows, run_slot, e};
  ina_moe_flight_init(&m->f, e->ex[i], &e->ep, &m->ops, e->cfg->num_experts_per_tok);
  m->count_layer = i == 0;
}

static void flight_free(moe_flight_t *m) { ina_moe_flight_free(&m->f); }

static ina_status_t dispatch_begin(step_t *s, int32_t layer, moe_flight_t *m) {
  return ina_moe_flight_begin(&m->f, layer, s->e->moe_index[layer], s->h, s->T);
}

static ina_status_t dispatch_end(step_t *s, moe_flight_t *m, float *out) {
  ina_status_t st = INA_OK;
  ina_engine_cpu_t *e = s->e;
  const int64_t T = s->T, K = e->cfg->num_experts_per_tok;
  float *xe = NULL;
  if (e->mutation == INA_MUTATION_ROUTED_SCALE)
    for (int64_t i = 0; i < T * K; i++) m->f.weights[i] *= 0.95f;
  {
    ina_ep_stats_t stats;
    INA_CHECK(ina_moe_flight_end(&m->f, out, &stats));
    e->step_traffic.layers += m->count_layer;
    e->step_traffic.rows_sent += stats.rows_remote;
    e->step_traffic.dispatch_bytes += stats.dispatch_bytes + stats.meta_bytes;
    e->step_traffic.combine_bytes += stats.combine_bytes;
    e->step_traffic.wait_ns += stats.wait_ns;
  }
  xe = malloc(((size_t)T * (size_t)e->cfg->hidden_size + 1) * sizeof *xe);
  INA_CHECK_ALLOC(xe);
  INA_CHECK(add_shared_experts(s, m->f.layer, xe, out));
fail:
  free(xe);
  return st;
}

/* The three stages back to back: one micro-batch. */
static ina_status_t moe_block_dispatch(step_t *s, int32_t layer, float *out) {
  ina_status_t st = INA_OK;
  moe_flight_t m;
  INA_CHECK(ensure_exchange(s->e, 0));
  flight_init(&m, s->e, 0);
  st = dispatch_begin(s, layer, &m);
  if (st == INA_OK) st = ina_moe_flight_experts(&m.f);
  if (st == INA_OK) st = dispatch_end(s, &m, out);
  if (st != INA_OK) ina_ep_exchange_drain(s->e->ex[0]);
  flight_free(&m);
fail:
  return st;
}

static ina_status_t moe_block(step_t *s, int32_t layer, float *out) {
  if (!s->e->attention_dp) return moe_layer(s, layer, out);
  return s->e->ep_exchange == INA_ENGINE_EP_EXCHANGE_DISPATCH ? moe_block_dispatch(s, layer, out)
                                                              : moe_block_dp(s, layer, out);
}

/* The end of an MLP block: its output s->tmp summed over the tensor-parallel ranks and
 * added to the residual stream. */
static ina_status_t mlp_block_end(step_t *s) {
  ina_status_t st = INA_OK;
  const int64_t n = s->T * s->e->cfg->hidden_size;
  if (s->e->noise.reduced > 0) as_stored_noise(s->e, s->tmp, n, s->e->noise.reduced);
  INA_CHECK(tp_sum(s->e, s->tmp, n));
  for (int64_t i = 0; i < n; i++) s->x[i] += s->tmp[i];
  as_stored(s->e, s->x, n);
fail:
  return st;
}

static void mlp_block_norm(step_t *s, int32_t layer) {
  const ina_model_config_t *c = s->e->cfg;
  norm_rows(s->e, s->x, &s->e->w->layers[layer].post_attention_norm, s->T, c->hidden_size, (float)c->rms_norm_eps,
            c->hidden_size, s->h, c->hidden_size);
}

static ina_status_t mlp_block(step_t *s, int32_t layer) {
  ina_status_t st = INA_OK;
  const ina_layer_weights_t *L = &s->e->w->layers[layer];
  mlp_block_norm(s, layer);
  if (L->is_moe)
    INA_CHECK(moe_block(s, layer, s->tmp));
  else
    INA_CHECK(mlp(s, &L->mlp, s->h, s->T, s->tmp));
  INA_CHECK(mlp_block_end(s));
fail:
  return st;
}

/* ---- the step --------------------------------------------------------------------- */

/* The step's expert counts into the published ones, every layer at once. Under the
 * dispatch exchange each rank routed only its own tokens: the ranks' counts are summed
 * first (collective), so that every rank publishes the group's, as with the all-gather
 * exchange where every rank routes every token. */
static ina_status_t publish_expert_load(ina_engine_cpu_t *e) {
  ina_status_t st = INA_OK;
  const size_t n = (size_t)e->num_moe_layers * (size_t)e->cfg->n_routed_experts;
  uint64_t *all = NULL;
  if (e->attention_dp && e->ep_exchange == INA_ENGINE_EP_EXCHANGE_DISPATCH && e->ep.comm && e->ep.nranks > 1 && n) {
    all = malloc(n * (size_t)e->ep.nranks * sizeof *all);
    INA_CHECK_ALLOC(all);
    INA_CHECK(ina_comm_all_gather(e->ep.comm, e->step_load, all, n, INA_DTYPE_I64, NULL));
    for (size_t i = 0; i < n; i++) {
      uint64_t sum = 0;
      for (int32_t r = 0; r < e->ep.nranks; r++) sum += all[(size_t)r * n + i];
      e->step_load[i] = sum;
    }
  }
  pthread_mutex_lock(&e->load_mu);
  for (size_t i = 0; i < n; i++) e->expert_load[i] += e->step_load[i];
  e->traffic.layers += e->step_traffic.layers;
  e->traffic.rows_sent += e->step_traffic.rows_sent;
  e->traffic.dispatch_bytes += e->step_traffic.dispatch_bytes;
  e->traffic.combine_bytes += e->step_traffic.combine_bytes;
  e->traffic.wait_ns += e->step_traffic.wait_ns;
  pthread_mutex_unlock(&e->load_mu);
  memset(&e->step_traffic, 0, sizeof e->step_traffic);
  memset(e->step_load, 0, n * sizeof *e->step_load);
fail:
  free(all);
  return st;
}

/* A failed step's expert counts go: its tokens were not computed. */
static void drop_step_load(ina_engine_cpu_t *e) {
  memset(e->step_load, 0, (size_t)e->num_moe_layers * (size_t)e->cfg->n_routed_experts * sizeof *e->step_load);
}

/* A step's start: its working memory, each token's sequence and position, and the
 * embeddings. */
static ina_status_t step_begin(ina_engine_cpu_t *e, const ina_batch_t *b, step_t *s) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  memset(s, 0, sizeof *s);
  s->e = e;
  s->b = b;
  s->T = b->qo_indptr[b->batch];
  INA_CHECK(step_alloc(s));
  for (int32_t i = 0; i < b->batch; i++) {
    const int32_t n = b->qo_indptr[i + 1] - b->qo_indptr[i];
    for (int32_t t = b->qo_indptr[i]; t < b->qo_indptr[i + 1]; t++) {
      s->token_seq[t] = i;
      s->positions[t] = b->seqs[i]->num_tokens - n + (t - b->qo_indptr[i]);
    }
  }
  for (int64_t t = 0; t < s->T; t++) ina_cpu_tensor_row(&e->w->embed, b->tokens[t], s->x + t * c->hidden_size);
  as_stored(e, s->x, s->T * c->hidden_size);
fail:
  return st;
}

/* The oracle's route records for T rows (gpu_numerics), cleared. */
static ina_status_t routes_reset(ina_engine_cpu_t *e, int64_t T) {
  ina_status_t st = INA_OK;
  if (!e->gpu_numerics) return INA_OK;
  ina_engine_route_t *grown = realloc(e->routes, (size_t)(T > 0 ? T : 1) * sizeof *grown);
  INA_CHECK_ALLOC(grown);
  e->routes = grown;
  e->route_rows = T;
  for (int64_t t = 0; t < T; t++) e->routes[t] = (ina_engine_route_t){INFINITY, 0};
fail:
  return st;
}

/* The step's end: the final norm and the LM head on the rows that want logits (every
 * token's, or each sequence's last). */
static ina_status_t step_logits(ina_engine_cpu_t *e, const step_t *s, float *logits) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = e->cfg;
  const ina_batch_t *b = s->b;
  const int64_t rows = b->all_logits ? s->T : b->batch;
  float *final = malloc((size_t)(rows > 0 ? rows : 1) * (size_t)c->hidden_size * sizeof(float));
  INA_CHECK_ALLOC(final);
  for (int64_t r = 0; r < rows; r++) {
    const int64_t t = b->all_logits ? r : b->qo_indptr[r + 1] - 1;
    norm_rows(e, s->x + t * c->hidden_size, &e->w->final_norm, 1, c->hidden_size, (float)c->rms_norm_eps,
              c->hidden_size, final + r * c->hidden_size, c->hidden_size);
  }
  if (e->gpu_numerics) {
    const ina_cpu_gpu_linear_opts_t o = {1, 1, 0}; /* the LM head writes fp32 logits */
    INA_CHECK(ina_cpu_gpu_linear(e->pool, &e->w->lm_head, final, rows, logits, &o));
  } else {
    INA_CHECK(ina_cpu_linear(e->pool, &e->w->lm_head, final, rows, logits));
  }
fail:
  free(final);
  return st;
}

/* Two-batch overlap: the rank's sequences in two micro-batches A and B of about equal
 * tokens, each MoE layer of each in three stages (moe_flight_t: begin with the
 * attention, experts, end), interleaved as
 *   A0 B0 | A1 B1 A2 A0' B2 B0' | A1' B1' ...
 * so that A's dispatch travels during B's attention, B's during A's experts, A's
 * combine during B's experts, and B's during A's shared experts and next attention.
 * Every rank runs this order (its own halves, either possibly empty), so the
 * exchanges meet; a dense layer is all in its first stage. */
typedef struct micro_batch {
  ina_batch_t batch;
  int32_t *qo_indptr; /* B's, rebased */
  step_t s;
  moe_flight_t f;
} micro_batch_t;

/* The split: the first sequence count whose tokens reach half of the batch's, so that
 * both halves have tokens when the batch has two sequences or more. */
static int32_t split_point(const ina_batch_t *b) {
  if (b->batch < 2) return b->batch;
  const int32_t total = b->qo_indptr[b->batch];
  int32_t k = 1;
  while (k < b->batch - 1 && 2 * b->qo_indptr[k] < total) k++;
  /* the nearer of k and k - 1 to half, keeping both halves non-empty */
  if (k > 1 && total - 2 * b->qo_indptr[k - 1] < 2 * b->qo_indptr[k] - total) k--;
  return k;
}

static ina_status_t stage(micro_batch_t *m, int32_t layer, int which) {
  ina_status_t st = INA_OK;
  step_t *s = &m->s;
  const int moe = s->e->w->layers[layer].is_moe;
  if (which == 0) {
    INA_CHECK(attention_block(s, layer));
    if (!moe) return mlp_block(s, layer);
    mlp_block_norm(s, layer);
    INA_CHECK(dispatch_begin(s, layer, &m->f));
  } else if (moe && which == 1) {
    INA_CHECK(ina_moe_flight_experts(&m->f.f));
  } else if (moe) {
    INA_CHECK(dispatch_end(s, &m->f, s->tmp));
    INA_CHECK(mlp_block_end(s));
  }
fail:
  return st;
}

static ina_status_t forward_overlapped(ina_engine_cpu_t *e, const ina_batch_t *b, float *logits) {
  ina_status_t st = INA_OK;
  micro_batch_t mb[2];
  memset(mb, 0, sizeof mb);
  const int32_t L = e->cfg->num_layers, split = split_point(b);
  mb[0].batch = (ina_batch_t){split, b->seqs, b->qo_indptr, b->tokens, b->all_logits};
  mb[1].qo_indptr = malloc(((size_t)(b->batch - split) + 1) * sizeof *mb[1].qo_indptr);
  INA_CHECK_ALLOC(mb[1].qo_indptr);
  for (int32_t i = 0; i <= b->batch - split; i++) mb[1].qo_indptr[i] = b->qo_indptr[split + i] - b->qo_indptr[split];
  mb[1].batch = (ina_batch_t){b->batch - split, b->seqs + split, mb[1].qo_indptr, b->tokens + b->qo_indptr[split],
                              b->all_logits};
  INA_CHECK(routes_reset(e, b->qo_indptr[b->batch]));
  for (int i = 0; i < 2; i++) {
    INA_CHECK(ensure_exchange(e, i));
    INA_CHECK(step_begin(e, &mb[i].batch, &mb[i].s));
  }
  for (int i = 0; i < 2; i++) flight_init(&mb[i].f, e, i);
  for (int32_t l = 0; l < L; l++) {
    if (l == 0) {
      INA_CHECK(stage(&mb[0], 0, 0));
      INA_CHECK(stage(&mb[1], 0, 0));
    }
    INA_CHECK(stage(&mb[0], l, 1));
    INA_CHECK(stage(&mb[1], l, 1));
    INA_CHECK(stage(&mb[0], l, 2));
    if (l + 1 < L) INA_CHECK(stage(&mb[0], l + 1, 0));
    INA_CHECK(stage(&mb[1], l, 2));
    if (l + 1 < L) INA_CHECK(stage(&mb[1], l + 1, 0));
  }
  INA_CHECK(step_logits(e, &mb[0].s, logits));
  {
    const int64_t rows0 = b->all_logits ? mb[0].s.T : split;
    INA_CHECK(step_logits(e, &mb[1].s, logits + rows0 * e->cfg->vocab_size));
  }
  INA_CHECK(publish_expert_load(e));
fail:
  if (st != INA_OK) { /* every rank failed the same finish: the other half's exchange too */
    ina_ep_exchange_drain(e->ex[0]);
    ina_ep_exchange_drain(e->ex[1]);
    drop_step_load(e);
  }
  for (int i = 0; i < 2; i++) {
    flight_free(&mb[i].f);
    step_free(&mb[i].s);
  }
  free(mb[1].qo_indptr);
  return st;
}

/* The forward of batch b, whose sequences have grown by their new tokens already. */
static ina_status_t forward_grown(ina_engine_cpu_t *e, const ina_batch_t *b, float *logits) {
  ina_status_t st = INA_OK;
  step_t s;
  memset(&s, 0, sizeof s);
  if (e->micro_batches == 2) return forward_overlapped(e, b, logits);
  INA_CHECK(step_begin(e, b, &s));
  INA_CHECK(routes_reset(e, s.T));
  for (int32_t l = 0; l < e->cfg->num_layers; l++) {
    INA_CHECK(attention_block(&s, l)); /* writes layer l's KV entries of the step */
    if (e->layer_hook) e->layer_hook(l, e->layer_hook_user);
    INA_CHECK(mlp_block(&s, l));
  }
  INA_CHECK(step_logits(e, &s, logits));
  INA_CHECK(publish_expert_load(e));
fail:
  if (st != INA_OK)
    drop_step_load(e);
  step_free(&s);
  return st;
}

/* attention_dp 2: every rank has the whole batch; each computes the sequences it owns
 * (forward_grown with the MoE layers gathered), and the logits travel to every rank. */
static ina_status_t forward_split(ina_engine_cpu_t *e, const ina_batch_t *b, float *logits) {
  ina_status_t st = INA_OK;
  const int32_t n = e->ep.nranks, me = e->ep.rank, V = e->cfg->vocab_size;
  ina_kv_seq_t **seqs = malloc(((size_t)b->batch + 1) * sizeof *seqs);
  int32_t *qo = malloc(((size_t)b->batch + 2) * sizeof *qo);
  int32_t *tokens = malloc(((size_t)b->qo_indptr[b->batch] + 1) * sizeof *tokens);
  size_t *sc = calloc((size_t)n, sizeof *sc), *sd = calloc((size_t)n, sizeof *sd);
  size_t *rc = calloc((size_t)n, sizeof *rc), *rd = calloc((size_t)n, sizeof *rd), *cur = calloc((size_t)n, sizeof *cur);
  float *mine = NULL, *all = NULL;
  INA_CHECK_ALLOC(seqs);
  INA_CHECK_ALLOC(qo);
  INA_CHECK_ALLOC(tokens);
  INA_CHECK_ALLOC(sc);
  INA_CHECK_ALLOC(sd);
  INA_CHECK_ALLOC(rc);
  INA_CHECK_ALLOC(rd);
  INA_CHECK_ALLOC(cur);
  /* Our sequences, and every rank's logits rows (known to all: the owners are). */
  int32_t count = 0;
  qo[0] = 0;
  for (int32_t i = 0; i < b->batch; i++) {
    const int32_t len = b->qo_indptr[i + 1] - b->qo_indptr[i], owner = ina_kv_seq_stripe(e->kv, b->seqs[i]);
    rc[owner] += (size_t)(b->all_logits ? len : 1) * (size_t)V;
    if (owner != me) continue;
    seqs[count] = b->seqs[i];
    memcpy(tokens + qo[count], b->tokens + b->qo_indptr[i], (size_t)len * sizeof *tokens);
    qo[count + 1] = qo[count] + len;
    count++;
  }
  size_t total = 0;
  for (int32_t r = 0; r < n; r++) {
    rd[r] = total;
    total += rc[r];
    sc[r] = rc[me];
  }
  mine = malloc((rc[me] + 1) * sizeof *mine);
  all = malloc((total + 1) * sizeof *all);
  INA_CHECK_ALLOC(mine);
  INA_CHECK_ALLOC(all);
  const ina_batch_t sub = {count, seqs, qo, tokens, b->all_logits};
  INA_CHECK(forward_grown(e, &sub, mine));
  INA_CHECK(ina_comm_all_to_all_v(e->ep.comm, mine, sc, sd, all, rc, rd, INA_DTYPE_F32, NULL));
  /* Back to batch order. */
  memcpy(cur, rd, (size_t)n * sizeof *cur);
  int64_t row = 0;
  for (int32_t i = 0; i < b->batch; i++) {
    const int32_t owner = ina_kv_seq_stripe(e->kv, b->seqs[i]);
    const size_t rows = b->all_logits ? (size_t)(b->qo_indptr[i + 1] - b->qo_indptr[i]) : 1;
    memcpy(logits + row * V, all + cur[owner], rows * (size_t)V * sizeof *logits);
    cur[owner] += rows * (size_t)V;
    row += (int64_t)rows;
  }
fail:
  free(seqs), free(qo), free(tokens);
  free(sc), free(sd), free(rc), free(rd), free(cur);
  free(mine), free(all);
  return st;
}

ina_status_t ina_engine_cpu_forward(ina_engine_cpu_t *e, const ina_batch_t *b, float *logits) {
  ina_status_t st = INA_OK;
  INA_CHECK(ina_engine_validate_batch(e->cfg, b));
  INA_CHECK(ina_engine_append_all(e->kv, b));
  st = e->attention_dp == 2 ? forward_split(e, b, logits) : forward_grown(e, b, logits);
  if (st != INA_OK) ina_engine_truncate_all(e->kv, b);
fail:
  return st;
}

ina_status_t ina_engine_cpu_expert_load(ina_engine_cpu_t *e, int reset, uint64_t *counts,
                                        int64_t capacity, int32_t *num_moe_layers) {
  ina_status_t st = INA_OK;
  const int64_t n = (int64_t)e->num_moe_layers * e->cfg->n_routed_experts;
  *num_moe_layers = e->num_moe_layers;
  if (capacity == 0 && counts == NULL) return INA_OK;
  INA_REQUIRE(counts != NULL && capacity >= n, INA_ERR_INVALID_ARGUMENT,
              "expert load: room for %lld counters, %d MoE layers x %d experts need %lld",
              (long long)capacity, e->num_moe_layers, e->cfg->n_routed_experts, (long long)n);
  pthread_mutex_lock(&e->load_mu);
  memcpy(counts, e->expert_load, (size_t)n * sizeof *counts);
  if (reset) memset(e->expert_load, 0, (size_t)n * sizeof *counts);
  pthread_mutex_unlock(&e->load_mu);
fail:
  return st;
}

/* ---- test hooks (model/engine_test_hooks.h) -------------------------------------------- */

ina_status_t ina_engine_cpu_set_mutation(ina_engine_cpu_t *e, int32_t mutation) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(mutation >= INA_MUTATION_NONE && mutation < INA_MUTATION_COUNT, INA_ERR_INVALID_ARGUMENT,
              "engine: mutation %d is out of range", mutation);
  e->mutation = mutation;
  {
    /* rope_theta ignored: the frequencies of the default base. */
    ina_model_config_t c = *e->cfg;
    if (mutation == INA_MUTATION_ROPE_THETA) c.rope_theta = 10000.0;
    ina_cfg_rope_inv_freq(&c, e->inv_freq, &e->attention_factor);
  }
fail:
  return st;
}

ina_status_t ina_engine_cpu_set_rounding_noise(ina_engine_cpu_t *e, const ina_engine_noise_t *noise) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e->gpu_numerics, INA_ERR_UNSUPPORTED, "engine: rounding noise needs GPU numerics");
  INA_REQUIRE(noise->relative >= 0 && noise->relative < 1 && noise->attention >= 0 && noise->attention < 1 &&
                  noise->reduced >= 0 && noise->reduced < 1,
              INA_ERR_INVALID_ARGUMENT, "engine: rounding noise %g / %g / %g out of [0, 1)", (double)noise->relative,
              (double)noise->attention, (double)noise->reduced);
  e->noise = *noise;
  e->noise_state = noise->seed;
fail:
  return st;
}

ina_status_t ina_engine_cpu_routes(ina_engine_cpu_t *e, ina_engine_route_t *out, int64_t capacity, int64_t *count) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e->gpu_numerics, INA_ERR_UNSUPPORTED, "engine: routes are kept only with GPU numerics");
  *count = e->route_rows;
  if (out && e->routes) memcpy(out, e->routes, (size_t)(capacity < *count ? capacity : *count) * sizeof *out);
fail:
  return st;
}

void ina_engine_cpu_set_layer_hook(ina_engine_cpu_t *e, ina_engine_layer_fn fn, void *user_data) {
  e->layer_hook = fn;
  e->layer_hook_user = user_data;
}

void ina_engine_cpu_ep_traffic(const ina_engine_cpu_t *e, ina_engine_ep_traffic_t *out) {
  ina_engine_cpu_t *m = (ina_engine_cpu_t *)e; /* the lock only */
  pthread_mutex_lock(&m->load_mu);
  *out = e->traffic;
  pthread_mutex_unlock(&m->load_mu);
}
