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
 *   tiny in bf16 with seed 0.
 * A run with another seed must differ (the comparison can fail). Errors: a linear bias,
 * dtype f16, 64x64 FP8 blocks and an invalid config fail with the host path's status and
 * leave the output zeroed.
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
#include "../test_util.h"

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

static void compare_layer(compare_t *c, const ina_model_config_t *cfg, int32_t l, const gpu_layer_t *a,
                          const gpu_layer_t *b) {
  char name[160];
  const size_t H = (size_t)cfg->hidden_size, E = (size_t)cfg->n_routed_experts;
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
                (size_t)cfg->num_heads * (size_t)(cfg->qk_nope_head_dim + cfg->v_head_dim) *
                    (size_t)cfg->kv_lora_rank * 2);
  compare_linear(c, NAME("self_attn.o_proj"), &a->o_proj, &b->o_proj, 1);
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
  for (int32_t x = 0; x < cfg->n_routed_experts; x++) {
    char expert[96];
    snprintf(expert, sizeof expert, "model.layers.%d.mlp.experts.%d", l, x);
    compare_mlp(c, expert, &a->experts[x], &b->experts[x]);
  }
  compare_tables(c, l, a, b, cfg->n_routed_experts);
#undef NAME
}

static void compare_weights(compare_t *c, const ina_model_config_t *cfg, const gpu_weights_t *a,
                            const gpu_weights_t *b) {
  const size_t vocab = (size_t)cfg->vocab_size, H = (size_t)cfg->hidden_size;
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
  for (int32_t l = 0; l < a->num_layers; l++) compare_layer(c, cfg, l, &a->layers[l], &b->layers[l]);
}

/* ---- the cases ------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct expect {
  int fp8_linears, bf16_linears, grouped; /* each: 1 = some, 0 = none, -1 = any */
} expect_t;

static void check_count(const char *name, const char *what, int count, int want) {
  if (want < 0) return;
  CHECKF(want ? count > 0 : count == 0, "%s: %d %s, expected %s", name, count, what, want ? "some" : "none");
}

/* Both paths for cfg; returns 0 when they agree. */
static int run_case(const char *name, const ina_model_config_t *cfg, ina_dtype_t dtype, uint64_t seed,
                    cudaStream_t stream, expect_t expect) {
  ina_weights_t w;
  gpu_weights_t up, rnd;
  compare_t c;
  memset(&up, 0, sizeof up);
  memset(&rnd, 0, sizeof rnd);
  memset(&c, 0, sizeof c);
  c.config = name;
  CHECK_OK(ina_weights_random(cfg, seed, dtype, NULL, &w));
  CHECK_OK(ina_gpu_weights_upload(&w, &w.config, stream, &up));
  ina_weights_release(&w);
  CHECK_OK(ina_gpu_weights_random(cfg, seed, dtype, stream, &rnd));
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
    CHECK_OK(ina_gpu_weights_random(cfg, seed + 1, dtype, stream, &other));
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

static void test_configs(uint64_t seed, cudaStream_t stream) {
  const expect_t fp8_mixed = {1, 1, 1}, fp8_all = {1, 0, 1}, bf16_only = {0, 1, 1};
  const ina_model_config_t tiny = builtin("tiny"), v2 = v2_style(), rag = ragged(), v3 = v3_small();
  printf("configs, seed %llu:\n", (unsigned long long)seed);
  run_case("tiny", &tiny, INA_DTYPE_BF16, seed, stream, bf16_only);
  run_case("tiny", &tiny, INA_DTYPE_FP8_E4M3, seed, stream, fp8_all);
  run_case("tiny", &tiny, INA_DTYPE_F32, seed, stream, bf16_only);
  run_case("v2-style", &v2, INA_DTYPE_F32, seed, stream, bf16_only);
  run_case("v2-style", &v2, INA_DTYPE_FP8_E4M3, seed, stream, fp8_all);
  run_case("ragged-fp8", &rag, INA_DTYPE_FP8_E4M3, seed, stream, fp8_mixed);
  run_case("ragged-bf16", &rag, INA_DTYPE_BF16, seed, stream, bf16_only);
  run_case("v3-small", &v3, INA_DTYPE_FP8_E4M3, seed, stream, fp8_all);
  run_case("tiny", &tiny, INA_DTYPE_BF16, 0, stream, bf16_only);
}

/* A failure must carry the host path's status and leave *out zeroed. */
static void error_case(const char *what, const ina_model_config_t *cfg, ina_dtype_t dtype, cudaStream_t stream) {
  ina_weights_t w;
  gpu_weights_t g, zero;
  ina_status_t want = ina_weights_random(cfg, 1, dtype, NULL, &w);
  if (want == INA_OK) {
    memset(&g, 0, sizeof g);
    want = ina_gpu_weights_upload(&w, &w.config, stream, &g);
    ina_gpu_weights_free(&g);
    ina_weights_release(&w);
  }
  CHECKF(want != INA_OK, "%s: the host path succeeded", what);
  memset(&g, 0x5A, sizeof g);
  memset(&zero, 0, sizeof zero);
  ina_status_t got = ina_gpu_weights_random(cfg, 1, dtype, stream, &g);
  CHECKF(got == want, "%s: status %d (%s), the host path gives %d", what, (int)got, ina_last_error(), (int)want);
  CHECKF(memcmp(&g, &zero, sizeof g) == 0, "%s: output not zeroed after the failure", what);
  printf("  %-28s status %d, as the host path: %s\n", what, (int)got, ina_last_error());
}

static void test_errors(cudaStream_t stream) {
  ina_model_config_t bias = builtin("tiny"), blocks = builtin("tiny"), invalid = builtin("tiny");
  const ina_model_config_t tiny = builtin("tiny");
  bias.attention_bias = 1;
  blocks.fp8_block_rows = blocks.fp8_block_cols = 64;
  invalid.num_heads = 0;
  printf("errors:\n");
  ina_log_set_quiet_errors(1);
  error_case("attention_bias", &bias, INA_DTYPE_BF16, stream);
  error_case("dtype f16", &tiny, INA_DTYPE_F16, stream);
  error_case("64x64 fp8 blocks", &blocks, INA_DTYPE_FP8_E4M3, stream);
  error_case("num_heads 0", &invalid, INA_DTYPE_BF16, stream);
  ina_log_set_quiet_errors(0);
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
  double t = now_s();
  CHECK_OK(ina_gpu_weights_random(&full, seed, INA_DTYPE_BF16, stream, &g));
  t = now_s() - t;
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
  double t_gen = now_s();
  CHECK_OK(ina_weights_random(&part, seed, INA_DTYPE_BF16, NULL, &w));
  t_gen = now_s() - t_gen;
  double t_up = now_s();
  CHECK_OK(ina_gpu_weights_upload(&w, &w.config, stream, &up));
  t_up = now_s() - t_up;
  ina_weights_release(&w);
  double t_dev = now_s();
  CHECK_OK(ina_gpu_weights_random(&part, seed, INA_DTYPE_BF16, stream, &rnd));
  t_dev = now_s() - t_dev;
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
  if (ina_cuda_device_count() == 0) {
    printf("test_gpu_random_weights: skipped (no CUDA device)\n");
    return TEST_SKIP;
  }
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
    time_v2_lite(seed, stream);
  }
  if (stream) cudaStreamDestroy(stream);
  free(host_a);
  free(host_b);
  return test_finish("test_gpu_random_weights");
}

#else

int main(void) {
  printf("test_gpu_random_weights: skipped (built without CUDA)\n");
  return TEST_SKIP;
}

#endif
