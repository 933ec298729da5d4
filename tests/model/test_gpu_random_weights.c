/* ina_gpu_weights_random (model/engine_gpu.h) against the path it replaces: the host's
 * ina_weights_random followed by ina_gpu_weights_upload. Both must give the same device
 * weights bit for bit, so every device buffer of both is copied back and compared byte
 * for byte, with the bookkeeping (sizes, FP8 flags, grouped expert tables, buffer count
 * and bytes); a failure names the first differing tensor.
 *
 * Configurations (seeded from test_seed()):
 *   tiny in bf16, fp8_e4m3 and f32 (V3: q LoRA, dense + MoE layers, shared expert,
 *     noaux_tc router bias; the f32 router is split into bf16 hi + lo);
 *   v2-style: q_proj (q_lora_rank 0), softmax routing without bias, tied embeddings, f32;
 *   ragged-fp8: fp8_e4m3 with tied embeddings and dims that are not multiples of 128
 *     (ragged blocks), some not of 16 (dequantized to bf16) and some odd (byte stores),
 *     packed scales with padding;
 *   v3-small: v3-layers' structure at smaller widths in fp8_e4m3, full 128x128 blocks;
 *   tiny in bf16 with seed 0;
 *   v3.2-tiny in bf16, fp8_e4m3 and f32: V3.2's indexer (wq_b, wk, the k_norm LayerNorm's
 *     weight and bias, weights_proj as bf16 hi + lo when f32).
 * Shards (model/weights.h), each against ina_gpu_weights_upload of ina_weights_random
 * with the same shard, in bf16, f32 and fp8_e4m3:
 *   expert ranges of tiny: both halves, an uneven range and an empty one;
 *   tensor parallelism where the heads divide: tiny, v2-style and ragged with 4 heads
 *     (tp 2 ranks 0 and 1, tp 4 every rank, tp 2 x expert ranges), v3-small (8 heads,
 *     the same shards), and ragged-tp (ragged dims whose tp-2 slices are whole 128x128
 *     blocks: FP8 row and column slices of ragged, odd and dequantized tensors). An FP8
 *     slice off the block grid is refused by the host; the device must refuse it alike
 *     (printed as skipped, with the reason);
 *   v3-small in bf16: tp 2 ranks 0 and 1 tile the whole model's row slices (q_b_proj,
 *     gate) and column slices (o_proj, down), device against device.
 * A run with another seed must differ (the comparison can fail). Errors: a linear bias,
 * dtype f16, 64x64 FP8 blocks, an invalid config, heads that tp_size does not divide and
 * an expert range outside the model fail with the host path's status and leave the
 * output zeroed.
 *
 * Timing (reported, not checked): random:v2-lite in bf16 generated on the device, when
 * the device has the memory; the host path (generation + upload) on its first
 * INA_TEST_V2LITE_HOST_LAYERS layers (default 2: the dense layer and a MoE layer, about
 * 1.1 G of the 15.7 G values; 0 skips it, >= 27 is the whole model),
 * compared byte for byte with the device path on the same layers.
 *
 * Labelled gpu: exit 77 (skipped) without a CUDA device or without CUDA in the build. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/cuda.h"
#include "core/log.h"
#include "model/config.h"
#include "model/weights.h"
#include "tests/gpu_test_util.h"

#ifdef INA_HAVE_CUDA
#include <cuda_runtime.h>

#include "gemm/gemm.h"
#include "model/engine_gpu.h"

#define COPY_CHUNK ((size_t)64 << 20)
#define MAX_PRINTED 5

/* ---- comparing two device weight sets -------------------------------------------------- */

typedef struct compare {
  const char *config;
  int quiet;          /* expected to differ: print nothing */
  int64_t buffers, bytes;
  int differences;
  char first[256];    /* the first differing tensor, with where it differs */
  int fp8_linears, bf16_linears, grouped_layers;
} compare_t;

static void differ(compare_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void differ(compare_t *c, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->differences == 0) snprintf(c->first, sizeof c->first, "%s", msg);
  if (!c->quiet && c->differences < MAX_PRINTED) fprintf(stderr, "  %s: differs: %s\n", c->config, msg);
  c->differences++;
}

static unsigned char *host_a, *host_b; /* COPY_CHUNK staging buffers */

/* Device buffers a (upload) and b (random) of `bytes`; both NULL is equal. */
static void compare_bytes(compare_t *c, const char *what, const void *a, const void *b, size_t bytes) {
  if ((a == NULL) != (b == NULL)) {
    differ(c, "%s: present on one side only (upload %p, random %p)", what, a, b);
    return;
  }
  if (a == NULL) return;
  for (size_t off = 0; off < bytes; off += COPY_CHUNK) {
    const size_t n = bytes - off < COPY_CHUNK ? bytes - off : COPY_CHUNK;
    cudaError_t ea = cudaMemcpy(host_a, (const char *)a + off, n, cudaMemcpyDeviceToHost);
    cudaError_t eb = cudaMemcpy(host_b, (const char *)b + off, n, cudaMemcpyDeviceToHost);
    CHECKF(ea == cudaSuccess && eb == cudaSuccess, "%s: copy back: %s / %s", what, cudaGetErrorString(ea),
           cudaGetErrorString(eb));
    if (ea != cudaSuccess || eb != cudaSuccess) return;
    if (memcmp(host_a, host_b, n) == 0) continue;
    size_t i = 0;
    while (host_a[i] == host_b[i]) i++;
    differ(c, "%s: byte %zu of %zu (upload 0x%02x, random 0x%02x)", what, off + i, bytes, host_a[i], host_b[i]);
    return;
  }
  c->buffers++;
  c->bytes += (int64_t)bytes;
}

/* counted: a layer's linear, counted by kind in c (lm_head is always bf16). */
static void compare_linear(compare_t *c, const char *name, const gpu_linear_t *a, const gpu_linear_t *b,
                           int counted) {
  char what[256];
  if (a->n != b->n || a->k != b->k || a->fp8 != b->fp8) {
    differ(c, "%s: [%lld, %lld] fp8 %d against [%lld, %lld] fp8 %d", name, (long long)a->n, (long long)a->k,
           a->fp8, (long long)b->n, (long long)b->k, b->fp8);
    return;
  }
  if (a->w == NULL && b->w == NULL) return; /* a linear this model does not have */
  snprintf(what, sizeof what, "%s.weight", name);
  compare_bytes(c, what, a->w, b->w, (size_t)(a->n * a->k) * (a->fp8 ? 1 : 2));
  snprintf(what, sizeof what, "%s.weight (packed scales)", name);
  compare_bytes(c, what, a->w_scale, b->w_scale,
                a->fp8 ? (size_t)ina_gemm_w_scale_count(a->n, a->k) * sizeof(float) : 0);
  if (counted && a->fp8) c->fp8_linears++;
  else if (counted) c->bf16_linears++;
}

static void compare_mlp(compare_t *c, const char *prefix, const gpu_mlp_t *a, const gpu_mlp_t *b) {
  char name[192];
  snprintf(name, sizeof name, "%s.gate_proj", prefix);
  compare_linear(c, name, &a->gate, &b->gate, 1);
  snprintf(name, sizeof name, "%s.up_proj", prefix);
  compare_linear(c, name, &a->up, &b->up, 1);
  snprintf(name, sizeof name, "%s.down_proj", prefix);
  compare_linear(c, name, &a->down, &b->down, 1);
}

static const gpu_linear_t *mlp_part(const gpu_mlp_t *m, int i) {
  return i == 0 ? &m->gate : i == 1 ? &m->up : &m->down;
}

/* A grouped-GEMM table must list its own set's experts, in order. */
static void check_table(compare_t *c, int32_t l, int part, const char *side, const void *table, const gpu_layer_t *L,
                        int32_t experts, int scales) {
  const void **host = malloc((size_t)experts * sizeof *host);
  CHECK(host != NULL);
  if (!host) return;
  CHECK(cudaMemcpy(host, table, (size_t)experts * sizeof *host, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int32_t x = 0; x < experts; x++) {
    const gpu_linear_t *p = mlp_part(&L->experts[x], part);
    const void *want = scales ? (const void *)p->w_scale : p->w;
    if (host[x] != want) {
      differ(c, "layer %d: %s grouped %s table %d entry %d is %p, not the expert's %p", l, side,
             scales ? "scale" : "weight", part, x, host[x], want);
      break;
    }
  }
  free(host);
}

static void compare_tables(compare_t *c, int32_t l, const gpu_layer_t *a, const gpu_layer_t *b, int32_t experts) {
  if (a->grouped_fp8 != b->grouped_fp8) differ(c, "layer %d: grouped_fp8 %d against %d", l, a->grouped_fp8, b->grouped_fp8);
  for (int i = 0; i < 3; i++) {
    if ((a->grouped_w[i] == NULL) != (b->grouped_w[i] == NULL) ||
        (a->grouped_scale[i] == NULL) != (b->grouped_scale[i] == NULL)) {
      differ(c, "layer %d: grouped table %d present on one side only", l, i);
      return;
    }
    if (a->grouped_w[i]) {
      check_table(c, l, i, "upload", a->grouped_w[i], a, experts, 0);
      check_table(c, l, i, "random", b->grouped_w[i], b, experts, 0);
    }
    if (a->grouped_scale[i]) {
      check_table(c, l, i, "upload", a->grouped_scale[i], a, experts, 1);
      check_table(c, l, i, "random", b->grouped_scale[i], b, experts, 1);
    }
  }
  if (a->grouped_w[0]) c->grouped_layers++;
}

/* Layer l of a and b, which hold the same shard (compare_weights checked). */
static void compare_layer(compare_t *c, const ina_model_config_t *cfg, const gpu_weights_t *ga, int32_t l,
                          const gpu_layer_t *a, const gpu_layer_t *b) {
  char name[160];
  const size_t H = (size_t)cfg->hidden_size, E = (size_t)cfg->n_routed_experts;
  const size_t heads = (size_t)(cfg->num_heads / (ga->tp_size > 0 ? ga->tp_size : 1)); /* the rank's heads */
  const int32_t held = ga->expert_end - ga->expert_begin;
#define NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix), name)
  compare_bytes(c, NAME("input_layernorm.weight"), a->input_norm, b->input_norm, H * 4);
  compare_bytes(c, NAME("post_attention_layernorm.weight"), a->post_attention_norm, b->post_attention_norm, H * 4);
  compare_bytes(c, NAME("self_attn.q_a_layernorm.weight"), a->q_a_norm, b->q_a_norm, (size_t)cfg->q_lora_rank * 4);
  compare_bytes(c, NAME("self_attn.kv_a_layernorm.weight"), a->kv_a_norm, b->kv_a_norm, (size_t)cfg->kv_lora_rank * 2);
  compare_linear(c, NAME("self_attn.q_proj"), &a->q_proj, &b->q_proj, 1);
  compare_linear(c, NAME("self_attn.q_a_proj"), &a->q_a_proj, &b->q_a_proj, 1);
  compare_linear(c, NAME("self_attn.q_b_proj"), &a->q_b_proj, &b->q_b_proj, 1);
  compare_linear(c, NAME("self_attn.kv_a_proj_with_mqa"), &a->kv_a_proj, &b->kv_a_proj, 1);
  compare_bytes(c, NAME("self_attn.kv_b_proj.weight (bf16)"), a->kv_b, b->kv_b,
                heads * (size_t)(cfg->qk_nope_head_dim + cfg->v_head_dim) * (size_t)cfg->kv_lora_rank * 2);
  compare_linear(c, NAME("self_attn.o_proj"), &a->o_proj, &b->o_proj, 1);
  {
    /* V3.2's indexer (NULL and zero on both sides without one). */
    const size_t D = (size_t)cfg->index_head_dim, nI = (size_t)cfg->index_n_heads;
    compare_linear(c, NAME("self_attn.indexer.wq_b"), &a->index_wq_b, &b->index_wq_b, 1);
    compare_linear(c, NAME("self_attn.indexer.wk"), &a->index_wk, &b->index_wk, 1);
    compare_bytes(c, NAME("self_attn.indexer.k_norm.weight"), a->index_k_norm, b->index_k_norm, D * 4);
    compare_bytes(c, NAME("self_attn.indexer.k_norm.bias"), a->index_k_norm_bias, b->index_k_norm_bias, D * 4);
    compare_bytes(c, NAME("self_attn.indexer.weights_proj (bf16 hi)"), a->index_w_hi, b->index_w_hi, nI * H * 2);
    compare_bytes(c, NAME("self_attn.indexer.weights_proj (bf16 lo)"), a->index_w_lo, b->index_w_lo, nI * H * 2);
  }
  if (a->is_moe != b->is_moe || a->has_shared != b->has_shared) {
    differ(c, "layer %d: is_moe %d / has_shared %d against %d / %d", l, a->is_moe, a->has_shared, b->is_moe,
           b->has_shared);
    return;
  }
  compare_mlp(c, a->is_moe ? NAME("mlp.shared_experts") : NAME("mlp"), &a->mlp, &b->mlp);
  compare_bytes(c, NAME("mlp.gate.weight (bf16 hi)"), a->router_hi, b->router_hi, E * H * 2);
  compare_bytes(c, NAME("mlp.gate.weight (bf16 lo)"), a->router_lo, b->router_lo, E * H * 2);
  compare_bytes(c, NAME("mlp.gate.e_score_correction_bias"), a->router_bias, b->router_bias, E * 4);
  if (!a->is_moe) return;
  for (int32_t x = 0; x < held; x++) {
    char expert[96];
    snprintf(expert, sizeof expert, "model.layers.%d.mlp.experts.%d", l, ga->expert_begin + x);
    compare_mlp(c, expert, &a->experts[x], &b->experts[x]);
  }
  compare_tables(c, l, a, b, held);
#undef NAME
}

static void compare_weights(compare_t *c, const ina_model_config_t *cfg, const gpu_weights_t *a,
                            const gpu_weights_t *b) {
  const size_t vocab = (size_t)cfg->vocab_size, H = (size_t)cfg->hidden_size;
  if (a->tp_rank != b->tp_rank || a->tp_size != b->tp_size || a->expert_begin != b->expert_begin ||
      a->expert_end != b->expert_end) {
    differ(c, "shard: tensor-parallel slice %d of %d, experts [%d, %d) against slice %d of %d, experts [%d, %d)",
           a->tp_rank, a->tp_size, a->expert_begin, a->expert_end, b->tp_rank, b->tp_size, b->expert_begin,
           b->expert_end);
    return;
  }
  if (a->num_layers != b->num_layers || a->fp8_max_k != b->fp8_max_k ||
      a->max_expert_inter != b->max_expert_inter || a->device_bytes != b->device_bytes ||
      a->num_allocs != b->num_allocs)
    differ(c,
           "bookkeeping: layers %d/%d, fp8_max_k %lld/%lld, max_expert_inter %lld/%lld, device_bytes %lld/%lld, "
           "buffers %lld/%lld",
           a->num_layers, b->num_layers, (long long)a->fp8_max_k, (long long)b->fp8_max_k,
           (long long)a->max_expert_inter, (long long)b->max_expert_inter, (long long)a->device_bytes,
           (long long)b->device_bytes, (long long)a->num_allocs, (long long)b->num_allocs);
  compare_bytes(c, "model.embed_tokens.weight", a->embed, b->embed, vocab * H * 2);
  compare_bytes(c, "model.norm.weight", a->final_norm, b->final_norm, H * 4);
  compare_linear(c, "lm_head", &a->lm_head, &b->lm_head, 0);
  if (a->num_layers != b->num_layers) return;
  for (int32_t l = 0; l < a->num_layers; l++) compare_layer(c, cfg, a, l, &a->layers[l], &b->layers[l]);
}

/* ---- the cases ------------------------------------------------------------------------- */

typedef struct expect {
  int fp8_linears, bf16_linears, grouped; /* each: 1 = some, 0 = none, -1 = any */
} expect_t;

static void check_count(const char *name, const char *what, int count, int want) {
  if (want < 0) return;
  CHECKF(want ? count > 0 : count == 0, "%s: %d %s, expected %s", name, count, what, want ? "some" : "none");
}

/* Both paths for cfg and shard (NULL: whole); returns 0 when they agree. */
static int run_case(const char *name, const ina_model_config_t *cfg, const ina_shard_t *shard, ina_dtype_t dtype,
                    uint64_t seed, cudaStream_t stream, expect_t expect) {
  ina_weights_t w;
  gpu_weights_t up, rnd;
  compare_t c;
  memset(&up, 0, sizeof up);
  memset(&rnd, 0, sizeof rnd);
  memset(&c, 0, sizeof c);
  c.config = name;
  CHECK_OK(ina_weights_random(cfg, seed, dtype, shard, &w));
  CHECK_OK(ina_gpu_weights_upload(&w, &w.config, stream, &up));
  ina_weights_release(&w);
  CHECK_OK(ina_gpu_weights_random(cfg, shard, seed, dtype, stream, &rnd));
  {
    const int32_t tp_rank = shard ? shard->tp_rank : 0, tp_size = shard ? shard->tp_size : 1;
    const int32_t begin = shard ? shard->expert_begin : 0;
    const int32_t end = shard && shard->expert_end >= 0 ? shard->expert_end : cfg->n_routed_experts;
    CHECKF(rnd.tp_rank == tp_rank && rnd.tp_size == tp_size && rnd.expert_begin == begin && rnd.expert_end == end,
           "%s: the device weights hold slice %d of %d, experts [%d, %d); asked for %d of %d, [%d, %d)", name,
           rnd.tp_rank, rnd.tp_size, rnd.expert_begin, rnd.expert_end, tp_rank, tp_size, begin, end);
  }
  compare_weights(&c, cfg, &up, &rnd);
  CHECKF(c.differences == 0, "%s (%s, seed %llu): %d differences, the first: %s", name, ina_dtype_name(dtype),
         (unsigned long long)seed, c.differences, c.first);
  CHECKF(c.buffers > 0, "%s: nothing compared", name);
  printf("  %-12s %-8s %lld buffers, %.1f MiB identical, %d differ (%d fp8 / %d bf16 linears, %d grouped layers)\n",
         name, ina_dtype_name(dtype), (long long)c.buffers, (double)c.bytes / 1048576.0, c.differences,
         c.fp8_linears, c.bf16_linears, c.grouped_layers);
  check_count(name, "fp8 linears", c.fp8_linears, expect.fp8_linears);
  check_count(name, "bf16 linears", c.bf16_linears, expect.bf16_linears);
  check_count(name, "grouped layers", c.grouped_layers, expect.grouped);

  /* The comparison sees a change: another seed differs. */
  {
    gpu_weights_t other;
    compare_t d;
    memset(&d, 0, sizeof d);
    d.config = name;
    d.quiet = 1;
    CHECK_OK(ina_gpu_weights_random(cfg, shard, seed + 1, dtype, stream, &other));
    compare_bytes(&d, "model.embed_tokens.weight", up.embed, other.embed,
                  (size_t)cfg->vocab_size * (size_t)cfg->hidden_size * 2);
    compare_bytes(&d, "model.norm.weight", up.final_norm, other.final_norm, (size_t)cfg->hidden_size * 4);
    CHECKF(d.differences == 2, "%s: seeds %llu and %llu gave %d equal tensors of 2", name,
           (unsigned long long)seed, (unsigned long long)(seed + 1), 2 - d.differences);
    ina_gpu_weights_free(&other);
  }
  ina_gpu_weights_free(&up);
  ina_gpu_weights_free(&rnd);
  return c.differences == 0 ? 0 : 1;
}

static ina_model_config_t builtin(const char *name) {
  ina_model_config_t c;
  memset(&c, 0, sizeof c);
  CHECK_OK(ina_model_config_builtin(name, &c));
  return c;
}

/* DeepSeek-V2's attention (q_proj) and routing (softmax, no bias) at tiny sizes. */
static ina_model_config_t v2_style(void) {
  ina_model_config_t c = builtin("tiny");
  c.arch = INA_ARCH_DEEPSEEK_V2;
  c.scoring = INA_SCORING_SOFTMAX_GREEDY;
  c.norm_topk_prob = 0;
  c.q_lora_rank = 0;
  c.n_group = 1;
  c.topk_group = 1;
  c.n_shared_experts = 2;
  c.tie_word_embeddings = 1;
  return c;
}

/* Dims off the 128 grid: hidden 208 = 128 + 80 (multiple of 16: FP8 kept with ragged
 * blocks and padded packed scales), q_lora 136 and experts 72 (not of 16: dequantized),
 * kv_lora 141 and v_head 41 (odd: byte stores), dense MLP 272 = 2 x 128 + 16. */
static ina_model_config_t ragged(void) {
  ina_model_config_t c = builtin("tiny");
  c.vocab_size = 1000;
  c.hidden_size = 208;
  c.intermediate_size = 272;
  c.moe_intermediate_size = 72;
  c.num_layers = 3;
  c.q_lora_rank = 136;
  c.kv_lora_rank = 141;
  c.qk_nope_head_dim = 24;
  c.v_head_dim = 41;
  c.tie_word_embeddings = 1;
  return c;
}

/* v3-layers' structure (q LoRA, 1 dense + MoE layers, grouped noaux_tc routing, shared
 * expert, 128-multiples) at widths a test can build on the host. */
static ina_model_config_t v3_small(void) {
  ina_model_config_t c = builtin("v3-layers");
  c.vocab_size = 4096;
  c.hidden_size = 1024;
  c.intermediate_size = 2048;
  c.moe_intermediate_size = 256;
  c.num_layers = 2;
  c.num_heads = 8;
  c.q_lora_rank = 384;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  c.n_group = 4;
  c.topk_group = 2;
  return c;
}

/* cfg with another head count (tiny's 3 heads divide by no tp_size but 3). */
static ina_model_config_t with_heads(ina_model_config_t c, int32_t heads) {
  c.num_heads = heads;
  return c;
}

/* ragged's dims off the 128 grid where tensor parallelism does not slice (hidden 208,
 * q_lora 136, kv_lora 141), with heads and intermediates whose tp-2 slices are whole
 * 128x128 blocks: q_b_proj and kv_b_proj rows 2 x 128 of each head dim, o_proj columns
 * 2 x 64, dense MLP 256 and experts 128 per rank. In FP8, o_proj and down are column
 * slices of ragged-row tensors (kept FP8, padded packed scales), q_b_proj and kv_b_proj
 * dequantized row slices (K 136 and the odd 141: byte stores). */
static ina_model_config_t ragged_tp(void) {
  ina_model_config_t c = ragged();
  c.num_heads = 4;
  c.qk_nope_head_dim = 64;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 64;
  c.intermediate_size = 512;
  c.moe_intermediate_size = 256;
  return c;
}

/* Tensor-parallel slice tp_rank of tp_size, routed experts [begin, end) (end -1: all). */
static ina_shard_t shard_of(int32_t tp_rank, int32_t tp_size, int32_t begin, int32_t end) {
  ina_shard_t s = INA_SHARD_INIT;
  s.tp_rank = tp_rank;
  s.tp_size = tp_size;
  s.expert_begin = begin;
  s.expert_end = end;
  return s;
}

static void test_configs(uint64_t seed, cudaStream_t stream) {
  const expect_t fp8_mixed = {1, 1, 1}, fp8_all = {1, 0, 1}, bf16_only = {0, 1, 1};
  const ina_model_config_t tiny = builtin("tiny"), v2 = v2_style(), rag = ragged(), v3 = v3_small();
  const ina_model_config_t v32 = builtin("v3.2-tiny");
  printf("configs, seed %llu:\n", (unsigned long long)seed);
  run_case("v3.2-tiny", &v32, NULL, INA_DTYPE_BF16, seed, stream, bf16_only);
  run_case("v3.2-tiny", &v32, NULL, INA_DTYPE_FP8_E4M3, seed, stream, (expect_t){1, -1, 1});
  run_case("v3.2-tiny", &v32, NULL, INA_DTYPE_F32, seed, stream, bf16_only);
  run_case("tiny", &tiny, NULL, INA_DTYPE_BF16, seed, stream, bf16_only);
  run_case("tiny", &tiny, NULL, INA_DTYPE_FP8_E4M3, seed, stream, fp8_all);
  run_case("tiny", &tiny, NULL, INA_DTYPE_F32, seed, stream, bf16_only);
  run_case("v2-style", &v2, NULL, INA_DTYPE_F32, seed, stream, bf16_only);
  run_case("v2-style", &v2, NULL, INA_DTYPE_FP8_E4M3, seed, stream, fp8_all);
  run_case("ragged-fp8", &rag, NULL, INA_DTYPE_FP8_E4M3, seed, stream, fp8_mixed);
  run_case("ragged-bf16", &rag, NULL, INA_DTYPE_BF16, seed, stream, bf16_only);
  run_case("v3-small", &v3, NULL, INA_DTYPE_FP8_E4M3, seed, stream, fp8_all);
  run_case("tiny", &tiny, NULL, INA_DTYPE_BF16, 0, stream, bf16_only);
}

/* A failure must carry the host path's status and leave *out zeroed. */
static void error_case(const char *what, const ina_model_config_t *cfg, const ina_shard_t *shard, ina_dtype_t dtype,
                       cudaStream_t stream) {
  ina_weights_t w;
  gpu_weights_t g, zero;
  ina_status_t want = ina_weights_random(cfg, 1, dtype, shard, &w);
  if (want == INA_OK) {
    memset(&g, 0, sizeof g);
    want = ina_gpu_weights_upload(&w, &w.config, stream, &g);
    ina_gpu_weights_free(&g);
    ina_weights_release(&w);
  }
  CHECKF(want != INA_OK, "%s: the host path succeeded", what);
  memset(&g, 0x5A, sizeof g);
  memset(&zero, 0, sizeof zero);
  ina_status_t got = ina_gpu_weights_random(cfg, shard, 1, dtype, stream, &g);
  CHECKF(got == want, "%s: status %d (%s), the host path gives %d", what, (int)got, ina_last_error(), (int)want);
  CHECKF(memcmp(&g, &zero, sizeof g) == 0, "%s: output not zeroed after the failure", what);
  printf("  %-36s status %d, as the host path: %s\n", what, (int)got, ina_last_error());
}

static void test_errors(cudaStream_t stream) {
  ina_model_config_t bias = builtin("tiny"), blocks = builtin("tiny"), invalid = builtin("tiny");
  const ina_model_config_t tiny = builtin("tiny");
  ina_model_config_t bias4 = with_heads(builtin("tiny"), 4);
  bias4.attention_bias = 1;
  bias.attention_bias = 1;
  blocks.fp8_block_rows = blocks.fp8_block_cols = 64;
  invalid.num_heads = 0;
  printf("errors:\n");
  ina_log_set_quiet_errors(1);
  const ina_shard_t tp2 = shard_of(1, 2, 0, -1), outside = shard_of(0, 1, 4, 9), bad_rank = shard_of(2, 2, 0, -1);
  error_case("attention_bias", &bias, NULL, INA_DTYPE_BF16, stream);
  error_case("dtype f16", &tiny, NULL, INA_DTYPE_F16, stream);
  error_case("64x64 fp8 blocks", &blocks, NULL, INA_DTYPE_FP8_E4M3, stream);
  error_case("num_heads 0", &invalid, NULL, INA_DTYPE_BF16, stream);
  error_case("tp 2 of 3 heads", &tiny, &tp2, INA_DTYPE_BF16, stream);
  error_case("experts [4, 9) of 8", &tiny, &outside, INA_DTYPE_BF16, stream);
  error_case("tp_rank 2 of 2", &tiny, &bad_rank, INA_DTYPE_BF16, stream);
  error_case("attention_bias, 4 heads, tp 2", &bias4, &tp2, INA_DTYPE_BF16, stream);
  ina_log_set_quiet_errors(0);
}

/* ---- shards ------------------------------------------------------------------------------ */

/* cfg under `shard`: both paths agree bit for bit; or, for an FP8 slice off the 128x128
 * block grid, which the host refuses, the device refuses it with the same status. */
static void shard_case(const char *config, const ina_model_config_t *cfg, const ina_shard_t *shard,
                       ina_dtype_t dtype, uint64_t seed, cudaStream_t stream) {
  char name[96];
  ina_weights_t shell;
  snprintf(name, sizeof name, "%s tp%d/%d e[%d,%d)", config, shard->tp_rank, shard->tp_size, shard->expert_begin,
           shard->expert_end < 0 ? cfg->n_routed_experts : shard->expert_end);
  ina_log_set_quiet_errors(1);
  const ina_status_t host = ina_weights_random_shell(cfg, dtype, shard, &shell);
  ina_log_set_quiet_errors(0);
  if (host == INA_OK) {
    const int fp8 = dtype == INA_DTYPE_FP8_E4M3;
    const expect_t expect = {fp8 ? 1 : 0, fp8 ? -1 : 1, -1};
    ina_weights_release(&shell);
    run_case(name, cfg, shard, dtype, seed, stream, expect);
    return;
  }
  CHECKF(dtype == INA_DTYPE_FP8_E4M3 && host == INA_ERR_UNSUPPORTED, "%s %s: the host refuses the shard: status %d (%s)",
         name, ina_dtype_name(dtype), (int)host, ina_last_error());
  printf("  %-28s %-8s skipped: the host refuses this fp8 slice; the device must too:\n", name,
         ina_dtype_name(dtype));
  ina_log_set_quiet_errors(1);
  error_case(name, cfg, shard, dtype, stream);
  ina_log_set_quiet_errors(0);
}

/* The tensor-parallel shards of cfg, alone and with expert ranges: tp 2 (both ranks),
 * tp 4 (every rank), tp 2 x an expert half and an uneven expert range. */
static void tp_cases(const char *config, const ina_model_config_t *cfg, ina_dtype_t dtype, uint64_t seed,
                     cudaStream_t stream) {
  const int32_t E = cfg->n_routed_experts;
  const ina_shard_t shards[] = {
      shard_of(0, 2, 0, -1),    shard_of(1, 2, 0, -1),    shard_of(0, 4, 0, -1),
      shard_of(1, 4, 0, -1),    shard_of(2, 4, 0, -1),    shard_of(3, 4, 0, -1),
      shard_of(1, 2, E / 2, E), shard_of(0, 2, 1, E - 2),
  };
  for (size_t i = 0; i < sizeof shards / sizeof shards[0]; i++) shard_case(config, cfg, &shards[i], dtype, seed, stream);
}

/* Rows [row0, row0 + rows) x columns [col0, col0 + cols) of the device matrix `whole`
 * (whole_cols elements of esize bytes a row) against the device matrix `part`. */
static void compare_window(compare_t *c, const char *what, const void *whole, int64_t whole_cols, const void *part,
                           int64_t row0, int64_t col0, int64_t rows, int64_t cols, size_t esize) {
  const size_t row_bytes = (size_t)cols * esize, bytes = (size_t)rows * row_bytes;
  CHECKF(whole != NULL && part != NULL && bytes <= COPY_CHUNK, "%s: %p / %p, %zu bytes", what, whole, part, bytes);
  if (!whole || !part || bytes > COPY_CHUNK) return;
  const char *src = (const char *)whole + ((size_t)row0 * (size_t)whole_cols + (size_t)col0) * esize;
  CHECK(cudaMemcpy2D(host_a, row_bytes, src, (size_t)whole_cols * esize, row_bytes, (size_t)rows,
                     cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(cudaMemcpy(host_b, part, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  if (memcmp(host_a, host_b, bytes) != 0) {
    size_t i = 0;
    while (host_a[i] == host_b[i]) i++;
    differ(c, "%s: element (%zu, %zu) of the slice differs from the whole tensor's", what, i / row_bytes,
           i % row_bytes / esize);
    return;
  }
  c->buffers++;
  c->bytes += (int64_t)bytes;
}

/* Device against device: the bf16 slices of tp 2's ranks are the whole model's rows or
 * columns (q_b_proj and gate: rows; o_proj and down: columns, the window kernel). */
static void check_tiling(const ina_model_config_t *cfg, uint64_t seed, cudaStream_t stream) {
  gpu_weights_t whole, rank[2];
  compare_t c;
  memset(&c, 0, sizeof c);
  c.config = "v3-small tiling";
  CHECK_OK(ina_gpu_weights_random(cfg, NULL, seed, INA_DTYPE_BF16, stream, &whole));
  for (int32_t r = 0; r < 2; r++) {
    const ina_shard_t shard = shard_of(r, 2, 0, -1);
    CHECK_OK(ina_gpu_weights_random(cfg, &shard, seed, INA_DTYPE_BF16, stream, &rank[r]));
  }
  const int64_t H = cfg->hidden_size, heads = cfg->num_heads / 2;
  const int64_t qk = cfg->qk_nope_head_dim + cfg->qk_rope_head_dim, v = cfg->v_head_dim;
  for (int32_t r = 0; r < 2; r++) {
    const gpu_layer_t *W = &whole.layers[0], *P = &rank[r].layers[0];
    const gpu_layer_t *Wm = &whole.layers[1], *Pm = &rank[r].layers[1];
    const int64_t I = cfg->intermediate_size / 2, Ie = cfg->moe_intermediate_size / 2;
    compare_window(&c, "layers.0.self_attn.q_b_proj", W->q_b_proj.w, cfg->q_lora_rank, P->q_b_proj.w,
                   r * heads * qk, 0, heads * qk, cfg->q_lora_rank, 2);
    compare_window(&c, "layers.0.self_attn.o_proj", W->o_proj.w, 2 * heads * v, P->o_proj.w, 0, r * heads * v, H,
                   heads * v, 2);
    compare_window(&c, "layers.0.mlp.gate_proj", W->mlp.gate.w, H, P->mlp.gate.w, r * I, 0, I, H, 2);
    compare_window(&c, "layers.0.mlp.down_proj", W->mlp.down.w, 2 * I, P->mlp.down.w, 0, r * I, H, I, 2);
    compare_window(&c, "layers.1.mlp.experts.5.down_proj", Wm->experts[5].down.w, 2 * Ie, Pm->experts[5].down.w, 0,
                   r * Ie, H, Ie, 2);
  }
  CHECKF(c.differences == 0, "v3-small tiling: %d differences, the first: %s", c.differences, c.first);
  printf("  v3-small tp2 ranks tile the whole model: %lld windows identical, %d differ\n", (long long)c.buffers,
         c.differences);
  ina_gpu_weights_free(&whole);
  ina_gpu_weights_free(&rank[0]);
  ina_gpu_weights_free(&rank[1]);
}

static void test_shards(uint64_t seed, cudaStream_t stream) {
  const ina_dtype_t dtypes[] = {INA_DTYPE_BF16, INA_DTYPE_F32, INA_DTYPE_FP8_E4M3};
  const ina_model_config_t tiny = builtin("tiny"), tiny4 = with_heads(builtin("tiny"), 4);
  const ina_model_config_t v2 = with_heads(v2_style(), 4), rag4 = with_heads(ragged(), 4), rag_tp = ragged_tp();
  const ina_model_config_t v3 = v3_small();
  const int32_t E = tiny.n_routed_experts;
  /* Expert parallelism alone: both halves, an uneven range, none. */
  const ina_shard_t experts[] = {shard_of(0, 1, 0, E / 2), shard_of(0, 1, E / 2, E), shard_of(0, 1, 1, E - 2),
                                 shard_of(0, 1, 3, 3)};
  printf("shards, seed %llu:\n", (unsigned long long)seed);
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
    for (size_t i = 0; i < sizeof experts / sizeof experts[0]; i++)
      shard_case("tiny", &tiny, &experts[i], dtypes[d], seed, stream);
    tp_cases("tiny-4h", &tiny4, dtypes[d], seed, stream);
    tp_cases("v3-small", &v3, dtypes[d], seed, stream);
    tp_cases("ragged-tp", &rag_tp, dtypes[d], seed, stream);
  }
  /* q_proj (q_lora_rank 0), softmax routing, tied embeddings; odd column windows. */
  tp_cases("v2-style-4h", &v2, INA_DTYPE_F32, seed, stream);
  tp_cases("ragged-4h", &rag4, INA_DTYPE_BF16, seed, stream);
  check_tiling(&v3, seed, stream);
}

/* ---- timing on DeepSeek-V2-Lite ---------------------------------------------------------- */

static int64_t param_count(const ina_model_config_t *cfg) {
  ina_weights_t shell;
  ina_weight_spec_t *specs = NULL;
  int32_t count = 0;
  int64_t n = 0;
  if (ina_weights_random_shell(cfg, INA_DTYPE_BF16, NULL, &shell) != INA_OK) return -1;
  if (ina_weight_specs(&shell, &specs, &count) == INA_OK)
    for (int32_t i = 0; i < count; i++)
      n += specs[i].ndim == 2 ? specs[i].shape[0] * specs[i].shape[1] : specs[i].shape[0];
  free(specs);
  ina_weights_release(&shell);
  return n;
}

static void time_v2_lite(uint64_t seed, cudaStream_t stream) {
  const ina_model_config_t full = builtin("v2-lite");
  const char *env = getenv("INA_TEST_V2LITE_HOST_LAYERS");
  const int32_t host_layers = env ? atoi(env) : 2;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const int64_t params = param_count(&full);
  size_t free_b = 0, total_b = 0;
  gpu_weights_t g;
  CHECK(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  printf("random:v2-lite, bf16 (%.2f G values, %.1f GiB):\n", (double)params / 1e9, (double)params * 2 / gib);
  if ((double)free_b < (double)params * 2 * 1.1) {
    printf("  skipped: %.1f GiB free on the device\n", (double)free_b / gib);
    return;
  }
  double t = test_now_s();
  CHECK_OK(ina_gpu_weights_random(&full, NULL, seed, INA_DTYPE_BF16, stream, &g));
  t = test_now_s() - t;
  printf("  device path: %.2f GiB in %lld buffers, %.3f s (%.1f G values/s)\n", (double)g.device_bytes / gib,
         (long long)g.num_allocs, t, (double)params / t / 1e9);
  ina_gpu_weights_free(&g);
  if (host_layers <= 0) return;

  ina_model_config_t part = full;
  if (host_layers < part.num_layers) part.num_layers = host_layers;
  const int64_t part_params = param_count(&part);
  const double host_mem = (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
  CHECK(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  /* The host copy (bf16, plus one tensor in f32), and both device copies to compare. */
  if (host_mem < (double)part_params * 2 * 1.3 + 2 * gib || (double)free_b < (double)part_params * 4 * 1.1) {
    printf("  host path skipped: %.1f GiB available on the host, %.1f GiB on the device\n", host_mem / gib,
           (double)free_b / gib);
    return;
  }
  ina_weights_t w;
  gpu_weights_t up, rnd;
  compare_t c;
  memset(&c, 0, sizeof c);
  c.config = "v2-lite";
  double t_gen = test_now_s();
  CHECK_OK(ina_weights_random(&part, seed, INA_DTYPE_BF16, NULL, &w));
  t_gen = test_now_s() - t_gen;
  double t_up = test_now_s();
  CHECK_OK(ina_gpu_weights_upload(&w, &w.config, stream, &up));
  t_up = test_now_s() - t_up;
  ina_weights_release(&w);
  double t_dev = test_now_s();
  CHECK_OK(ina_gpu_weights_random(&part, NULL, seed, INA_DTYPE_BF16, stream, &rnd));
  t_dev = test_now_s() - t_dev;
  compare_weights(&c, &part, &up, &rnd);
  CHECKF(c.differences == 0, "v2-lite, %d layers: %d differences, the first: %s", part.num_layers, c.differences,
         c.first);
  printf("  first %d of %d layers (%.2f G values), byte-identical: %s\n", part.num_layers, full.num_layers,
         (double)part_params / 1e9, c.differences == 0 ? "yes" : "NO");
  printf("    host path:   generate %.2f s + upload %.2f s = %.2f s (%.3f G values/s)\n", t_gen, t_up,
         t_gen + t_up, (double)part_params / (t_gen + t_up) / 1e9);
  printf("    device path: %.3f s (%.1f G values/s)\n", t_dev, (double)part_params / t_dev / 1e9);
  if (part.num_layers < full.num_layers)
    printf("    host path on the whole model at that rate: about %.0f s\n",
           (t_gen + t_up) * (double)params / (double)part_params);
  ina_gpu_weights_free(&up);
  ina_gpu_weights_free(&rnd);
}

int main(void) {
  char name[128];
  const int skip = test_require_gpus("test_gpu_random_weights", 1);
  if (skip) return skip;
  printf("device: %s\n", ina_cuda_device_name(0, name, sizeof name));
  const uint64_t seed = test_seed("test_gpu_random_weights");
  cudaStream_t stream = NULL;
  host_a = malloc(COPY_CHUNK);
  host_b = malloc(COPY_CHUNK);
  CHECK(host_a != NULL && host_b != NULL);
  CHECK(cudaSetDevice(0) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  if (host_a && host_b && stream) {
    test_configs(seed, stream);
    test_errors(stream);
    test_shards(seed, stream);
    time_v2_lite(seed, stream);
  }
  if (stream) cudaStreamDestroy(stream);
  free(host_a);
  free(host_b);
  return test_finish("test_gpu_random_weights");
}

#else

int main(void) {
  return test_skip_gpu("test_gpu_random_weights", "this build has no CUDA");
}

#endif
