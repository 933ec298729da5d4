/* Tensor-parallel slices of the weights (layout in model/weights.h). For every golden
 * fixture (loaded) and for random models in f32, bf16 and fp8 (generated, and saved
 * then loaded), with T = 1, 2 and 4 ranks:
 *  - each rank's tensor is byte for byte the rows or columns of the whole tensor that
 *    the layout gives it (fp8 scales too), or the whole tensor where it is replicated;
 *    o_proj and down_proj biases are held by rank 0 alone;
 *  - the ranks' parts, laid end to end in rank order, are the whole tensor: each
 *    element is held exactly once;
 *  - the spec list and ina_weights_random_shell describe exactly these parts;
 *  - splits that cannot be made fail with the right status and a message naming the
 *    tensor (heads or intermediate sizes not divisible, fp8 block boundaries, a bad
 *    tp_rank).
 * The expected layout is derived here from tensor names and the config, not from the
 * spec list under test. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"
#include "core/safetensors.h"
#include "model/weights.h"
#include "../test_util.h"
#include "../golden/golden_fixture.h"

static const int32_t kTpSizes[] = {1, 2, 4};

typedef struct source {
  char label[96];
  char dir[600];          /* checkpoint directory; empty for random weights */
  ina_model_config_t cfg; /* random weights: the config, dtype and seed */
  ina_dtype_t dtype;
  uint64_t seed;
} source_t;

static ina_shard_t tp_shard(int32_t rank, int32_t size) {
  ina_shard_t shard = INA_SHARD_INIT;
  shard.tp_rank = rank;
  shard.tp_size = size;
  return shard;
}

/* shard NULL: the whole model. */
static ina_status_t open_weights(const source_t *src, const ina_shard_t *shard, ina_weights_t *w) {
  if (src->dir[0]) return ina_weights_load(src->dir, shard, w);
  return ina_weights_random(&src->cfg, src->seed, src->dtype, shard, w);
}

/* ---- the expected layout, from names ------------------------------------------------ */

typedef enum { REPLICATED, ROWS, COLS, RANK0_ONLY } layout_t;

typedef struct expect {
  layout_t layout;
  int64_t groups, unit; /* ROWS / COLS: groups x unit rows or columns, split by groups */
} expect_t;

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static expect_t expected_layout(const ina_model_config_t *c, const char *name) {
  const int64_t heads = c->num_heads;
  const expect_t replicated = {REPLICATED, 1, 1};
  if (strstr(name, ".self_attn.q_proj.") || strstr(name, ".self_attn.q_b_proj."))
    return (expect_t){ROWS, heads, c->qk_nope_head_dim + c->qk_rope_head_dim};
  if (strstr(name, ".self_attn.kv_b_proj."))
    return (expect_t){ROWS, heads, c->qk_nope_head_dim + c->v_head_dim};
  if (ends_with(name, ".self_attn.o_proj.weight")) return (expect_t){COLS, heads, c->v_head_dim};
  if (ends_with(name, ".self_attn.o_proj.bias")) return (expect_t){RANK0_ONLY, 1, 1};
  if (!strstr(name, ".mlp.") ||
      !(strstr(name, ".gate_proj.") || strstr(name, ".up_proj.") || strstr(name, ".down_proj.")))
    return replicated;
  int64_t inter = c->intermediate_size;
  if (strstr(name, ".mlp.shared_experts."))
    inter = (int64_t)c->moe_intermediate_size * c->n_shared_experts;
  else if (strstr(name, ".mlp.experts."))
    inter = c->moe_intermediate_size;
  if (ends_with(name, ".down_proj.weight")) return (expect_t){COLS, inter, 1};
  if (ends_with(name, ".down_proj.bias")) return (expect_t){RANK0_ONLY, 1, 1};
  return (expect_t){ROWS, inter, 1};
}

/* The rows (dim 0) or columns (dim 1) [*begin, *begin + *len) that rank r of T holds
 * under e; replicated tensors: dim 0, everything. */
static int expected_part(const expect_t *e, const ina_tensor_t *whole, int32_t r, int32_t T, int64_t *begin,
                         int64_t *len) {
  if (e->layout == ROWS || e->layout == COLS) {
    *len = e->groups / T * e->unit;
    *begin = r * *len;
    return e->layout == ROWS ? 0 : 1;
  }
  *begin = 0;
  *len = whole->shape[0];
  return 0;
}

/* Why T ranks cannot split c (NULL when they can), and the status the loaders give. */
static const char *why_not(const ina_model_config_t *c, int fp8, int32_t T, ina_status_t *status, char *buf,
                           size_t n) {
  int dense = 0, moe = 0;
  for (int32_t i = 0; i < c->num_layers; i++) {
    if (ina_cfg_layer_is_moe(c, i))
      moe = 1;
    else
      dense = 1;
  }
  const int64_t shared = (int64_t)c->moe_intermediate_size * c->n_shared_experts;
  *status = INA_ERR_INVALID_ARGUMENT;
  if (c->num_heads % T) return snprintf(buf, n, "num_attention_heads %d is not divisible by %d", c->num_heads, T), buf;
  if (dense && c->intermediate_size % T) return snprintf(buf, n, "intermediate_size %d is not divisible by %d", c->intermediate_size, T), buf;
  if (moe && c->n_shared_experts > 0 && shared % T) return snprintf(buf, n, "shared intermediate %lld is not divisible by %d", (long long)shared, T), buf;
  if (moe && c->moe_intermediate_size % T) return snprintf(buf, n, "moe_intermediate_size %d is not divisible by %d", c->moe_intermediate_size, T), buf;
  if (!fp8 || T == 1) return NULL;
  /* fp8: a rank's run must be whole blocks of the sliced dimension */
  *status = INA_ERR_UNSUPPORTED;
  const int64_t hl = c->num_heads / T;
  const int64_t runs[] = {hl * (c->qk_nope_head_dim + c->qk_rope_head_dim), hl * (c->qk_nope_head_dim + c->v_head_dim),
                          hl * c->v_head_dim, dense ? c->intermediate_size / T : 0,
                          moe ? shared / T : 0, moe ? c->moe_intermediate_size / T : 0};
  const char *what[] = {"q rows", "kv_b rows", "o_proj columns", "dense MLP", "shared MLP", "expert MLP"};
  for (int i = 0; i < 6; i++)
    if (runs[i] % 128) return snprintf(buf, n, "fp8: %s per rank (%lld) are not whole 128-blocks", what[i], (long long)runs[i]), buf;
  return NULL;
}

/* ---- comparing tensors -------------------------------------------------------------- */

/* 1 when `part` is exactly the rows (dim 0) or columns (dim 1) [begin, begin + len) of
 * `whole`: dtype, rank, shape and bytes. */
static int is_part_of(const ina_tensor_t *part, const ina_tensor_t *whole, int dim, int64_t begin, int64_t len) {
  if (part->dtype != whole->dtype || part->ndim != whole->ndim || whole->ndim < 1 || whole->ndim > 2) return 0;
  const int64_t cols = whole->ndim == 2 ? whole->shape[1] : 1;
  const int64_t rows_want = dim == 0 ? len : whole->shape[0], cols_want = dim == 1 ? len : cols;
  if (part->shape[0] != rows_want || (whole->ndim == 2 && part->shape[1] != cols_want)) return 0;
  if (begin < 0 || begin + len > whole->shape[dim]) return 0;
  if (rows_want * cols_want > 0 && (!part->data || !whole->data)) return 0;
  const size_t es = ina_dtype_size(whole->dtype);
  const int64_t r0 = dim == 0 ? begin : 0, c0 = dim == 1 ? begin : 0;
  for (int64_t r = 0; r < rows_want; r++)
    if (memcmp((const char *)part->data + (size_t)(r * cols_want) * es,
               (const char *)whole->data + (size_t)((r0 + r) * cols + c0) * es, (size_t)cols_want * es) != 0)
      return 0;
  return 1;
}

static int same_tensor(const ina_tensor_t *a, const ina_tensor_t *b) {
  if (ina_tensor_is_empty(a) || ina_tensor_is_empty(b)) return ina_tensor_is_empty(a) && ina_tensor_is_empty(b);
  return is_part_of(a, b, 0, 0, b->shape[0]);
}

/* The member of `to` at the place `field` (inside spec s's layer, expert or model) has
 * in `from`; both are weights of one config. NULL when `to` lacks s's expert. */
static void *same_member(const ina_weights_t *from, const ina_weights_t *to, const ina_weight_spec_t *s,
                         const void *field) {
  const char *fb;
  char *tb;
  if (s->layer < 0) {
    fb = (const char *)from;
    tb = (char *)to;
  } else if (s->expert >= 0) {
    if (s->expert < to->expert_begin || s->expert >= to->expert_end) return NULL;
    fb = (const char *)&from->layers[s->layer].experts[s->expert - from->expert_begin];
    tb = (char *)&to->layers[s->layer].experts[s->expert - to->expert_begin];
  } else {
    fb = (const char *)&from->layers[s->layer];
    tb = (char *)&to->layers[s->layer];
  }
  return tb + ((const char *)field - fb);
}

/* ---- per-rank checks ---------------------------------------------------------------- */

/* Rank r of T's tensor for the whole model's spec s (and its fp8 scales) is what the
 * layout gives it. */
static void check_rank_tensor(const source_t *src, const ina_weights_t *W, const ina_weights_t *R,
                              const ina_weight_spec_t *s, int32_t r, int32_t T) {
  const expect_t e = expected_layout(&W->config, s->name);
  const ina_tensor_t *part = same_member(W, R, s, s->tensor);
  if (!part) return; /* an expert this rank does not hold */
  if (e.layout == RANK0_ONLY && r != 0) {
    CHECKF(ina_tensor_is_empty(part), "%s T=%d rank %d: bias '%s' must be empty off rank 0", src->label, T, r,
           s->name);
    return;
  }
  int64_t begin, len;
  const int dim = expected_part(&e, s->tensor, r, T, &begin, &len);
  CHECKF(is_part_of(part, s->tensor, dim, begin, len), "%s T=%d rank %d: '%s' is not %s [%lld, %lld) of the whole",
         src->label, T, r, s->name, dim == 0 ? "rows" : "columns", (long long)begin, (long long)(begin + len));
  /* Loaded row parts are views into the mapping, column parts owned copies; random
   * weights own everything. */
  const int owned = src->dir[0] ? (e.layout == COLS && T > 1) : 1;
  CHECKF(part->owns_data == owned, "%s T=%d rank %d: '%s' owns_data %d, expected %d", src->label, T, r, s->name,
         part->owns_data, owned);
  if (!s->linear) return;
  const ina_linear_t *wl = s->linear, *rl = same_member(W, R, s, s->linear);
  if (ina_tensor_is_empty(&wl->scale_inv)) {
    CHECKF(ina_tensor_is_empty(&rl->scale_inv), "%s: '%s' has scales the whole lacks", src->label, s->name);
    return;
  }
  CHECK(rl->block_rows == wl->block_rows && rl->block_cols == wl->block_cols);
  const int64_t block = dim == 0 ? wl->block_rows : wl->block_cols;
  const int64_t b0 = begin / block, b1 = (begin + len + block - 1) / block;
  CHECKF(is_part_of(&rl->scale_inv, &wl->scale_inv, dim, b0, b1 - b0),
         "%s T=%d rank %d: scale_inv of '%s' is not %s blocks [%lld, %lld)", src->label, T, r, s->name,
         dim == 0 ? "row" : "column", (long long)b0, (long long)b1);
}

/* The rank's spec list names the tensors it holds, in the whole list's order, with the
 * whole shape, its part's shape and the slice position. */
static void check_rank_specs(const source_t *src, const ina_weights_t *W, const ina_weight_spec_t *ws, int32_t wn,
                             ina_weights_t *R, int32_t r, int32_t T) {
  ina_weight_spec_t *rs = NULL;
  int32_t rn = 0, k = 0;
  CHECK_OK(ina_weight_specs(R, &rs, &rn));
  for (int32_t i = 0; i < wn; i++) {
    const expect_t e = expected_layout(&W->config, ws[i].name);
    if (e.layout == RANK0_ONLY && r != 0) continue;
    if (k >= rn || strcmp(rs[k].name, ws[i].name) != 0) {
      CHECKF(0, "%s T=%d rank %d: spec %d is '%s', expected '%s'", src->label, T, r, k, k < rn ? rs[k].name : "(end)",
             ws[i].name);
      break;
    }
    const ina_weight_spec_t *s = &rs[k++];
    int64_t begin, len;
    const int dim = expected_part(&e, ws[i].tensor, r, T, &begin, &len);
    const int sliced = (e.layout == ROWS || e.layout == COLS) && T > 1;
    CHECKF(s->full_shape[0] == ws[i].shape[0] && s->full_shape[1] == ws[i].shape[1],
           "%s: spec '%s' full_shape", src->label, s->name);
    CHECKF(s->shape[0] == s->tensor->shape[0] && (s->ndim == 1 || s->shape[1] == s->tensor->shape[1]),
           "%s T=%d rank %d: spec '%s' shape is not its tensor's", src->label, T, r, s->name);
    CHECKF(s->slice_dim == (sliced ? dim : -1) && s->slice_begin == (sliced ? begin : 0),
           "%s T=%d rank %d: spec '%s' slice (%d, %lld), expected (%d, %lld)", src->label, T, r, s->name,
           s->slice_dim, (long long)s->slice_begin, sliced ? dim : -1, (long long)(sliced ? begin : 0));
  }
  CHECKF(k == rn, "%s T=%d rank %d: %d specs, expected %d", src->label, T, r, rn, k);
  free(rs);
}

/* The shell of a random model lists the same parts as the random weights, holding no
 * data. */
static void check_shell(const source_t *src, const ina_weights_t *R, int32_t r, int32_t T) {
  ina_shard_t shard = tp_shard(r, T);
  ina_weights_t shell;
  ina_weight_spec_t *a = NULL, *b = NULL;
  int32_t na = 0, nb = 0;
  CHECK_OK(ina_weights_random_shell(&src->cfg, src->dtype, &shard, &shell));
  CHECK(shell.tp_rank == r && shell.tp_size == T);
  CHECK_OK(ina_weight_specs(&shell, &a, &na));
  CHECK_OK(ina_weight_specs((ina_weights_t *)R, &b, &nb));
  CHECKF(na == nb, "%s T=%d rank %d: shell lists %d tensors, weights %d", src->label, T, r, na, nb);
  for (int32_t i = 0; i < na && i < nb; i++) {
    const int same = strcmp(a[i].name, b[i].name) == 0 && a[i].ndim == b[i].ndim &&
                     memcmp(a[i].shape, b[i].shape, sizeof a[i].shape) == 0 &&
                     memcmp(a[i].full_shape, b[i].full_shape, sizeof a[i].full_shape) == 0 &&
                     a[i].slice_dim == b[i].slice_dim && a[i].slice_begin == b[i].slice_begin;
    CHECKF(same && ina_tensor_is_empty(a[i].tensor), "%s T=%d rank %d: shell spec '%s' differs", src->label, T,
           r, a[i].name);
  }
  free(a);
  free(b);
  ina_weights_release(&shell);
}

/* The parts of every sliced tensor (and fp8 scales), laid end to end in rank order,
 * are the whole: each element is held by exactly one rank. A rank-0-only bias is held
 * by exactly one rank. */
static void check_cover(const source_t *src, const ina_weights_t *W, const ina_weight_spec_t *ws, int32_t wn,
                        ina_weights_t *const *R, int32_t T) {
  for (int32_t i = 0; i < wn; i++) {
    const ina_weight_spec_t *s = &ws[i];
    const expect_t e = expected_layout(&W->config, s->name);
    if (e.layout == REPLICATED) continue;
    if (e.layout == RANK0_ONLY) {
      int holders = 0;
      for (int32_t r = 0; r < T; r++) holders += !ina_tensor_is_empty(same_member(W, R[r], s, s->tensor));
      CHECKF(holders == 1, "%s T=%d: bias '%s' held by %d ranks", src->label, T, s->name, holders);
      continue;
    }
    const int dim = e.layout == ROWS ? 0 : 1;
    for (int scales = 0; scales < 2; scales++) {
      const ina_tensor_t *whole = scales ? (s->linear ? &s->linear->scale_inv : NULL) : s->tensor;
      if (!whole || ina_tensor_is_empty(whole)) continue;
      int64_t at = 0;
      int ok = 1;
      for (int32_t r = 0; r < T && ok; r++) {
        const ina_tensor_t *part = scales ? &((const ina_linear_t *)same_member(W, R[r], s, s->linear))->scale_inv
                                          : same_member(W, R[r], s, s->tensor);
        const int64_t len = part->ndim > dim ? part->shape[dim] : 0;
        ok = is_part_of(part, whole, dim, at, len);
        at += len;
      }
      CHECKF(ok && at == whole->shape[dim], "%s T=%d: the ranks' %s of '%s' do not tile the whole (%lld of %lld)",
             src->label, T, scales ? "scales" : "parts", s->name, (long long)at, (long long)whole->shape[dim]);
    }
  }
}

/* Two models with the same shard hold byte-identical tensors (random vs. saved and
 * loaded back). */
static void check_same_weights(const char *what, ina_weights_t *a, ina_weights_t *b) {
  ina_weight_spec_t *sa = NULL, *sb = NULL;
  int32_t na = 0, nb = 0;
  CHECK_OK(ina_weight_specs(a, &sa, &na));
  CHECK_OK(ina_weight_specs(b, &sb, &nb));
  CHECKF(na == nb, "%s: %d vs %d tensors", what, na, nb);
  for (int32_t i = 0; i < na && i < nb; i++) {
    int same = strcmp(sa[i].name, sb[i].name) == 0 && same_tensor(sa[i].tensor, sb[i].tensor);
    if (same && sa[i].linear) same = same_tensor(&sa[i].linear->scale_inv, &sb[i].linear->scale_inv);
    CHECKF(same, "%s: tensor '%s' differs", what, sa[i].name);
  }
  free(sa);
  free(sb);
}

/* ---- one model, every tp_size ------------------------------------------------------- */

static void check_source(const source_t *src, test_rng_t *rng, const source_t *random_twin) {
  ina_weights_t whole;
  ina_weight_spec_t *ws = NULL;
  int32_t wn = 0;
  if (open_weights(src, NULL, &whole) != INA_OK) {
    CHECKF(0, "%s: cannot open the whole model: %s", src->label, ina_last_error());
    return;
  }
  CHECK(whole.tp_rank == 0 && whole.tp_size == 1);
  CHECK_OK(ina_weight_specs(&whole, &ws, &wn));
  const int fp8 = whole.config.fp8_block_scaled;
  int32_t split = 0; /* a tp_size > 1 the model splits into */
  for (size_t t = 0; t < sizeof kTpSizes / sizeof *kTpSizes; t++) {
    const int32_t T = kTpSizes[t];
    char why[160];
    ina_status_t want;
    if (why_not(&whole.config, fp8, T, &want, why, sizeof why)) {
      printf("  %s: T=%d skipped: %s\n", src->label, T, why);
      /* ... and the loaders refuse it on every rank */
      ina_log_set_quiet_errors(1);
      const int32_t first_last[2] = {0, T - 1};
      for (int k = 0; k < 2; k++) {
        const int32_t r = first_last[k];
        ina_shard_t shard = tp_shard(r, T);
        ina_weights_t w;
        const ina_status_t got = open_weights(src, &shard, &w);
        CHECKF(got == want, "%s T=%d rank %d: expected status %d", src->label, T, r, (int)want);
        if (got == INA_OK) ina_weights_release(&w);
      }
      ina_log_set_quiet_errors(0);
      continue;
    }
    if (T > 1) split = T;
    ina_weights_t *R[4] = {NULL, NULL, NULL, NULL};
    int opened = 1;
    for (int32_t r = 0; r < T; r++) {
      ina_shard_t shard = tp_shard(r, T);
      R[r] = calloc(1, sizeof(ina_weights_t));
      if (open_weights(src, &shard, R[r]) != INA_OK) {
        CHECKF(0, "%s T=%d rank %d: %s", src->label, T, r, ina_last_error());
        free(R[r]);
        R[r] = NULL;
        opened = 0;
      }
    }
    if (opened) {
      for (int32_t r = 0; r < T; r++) {
        CHECK(R[r]->tp_rank == r && R[r]->tp_size == T);
        for (int32_t i = 0; i < wn; i++) check_rank_tensor(src, &whole, R[r], &ws[i], r, T);
        check_rank_specs(src, &whole, ws, wn, R[r], r, T);
        if (!src->dir[0]) check_shell(src, R[r], r, T);
        if (random_twin) {
          ina_shard_t shard = tp_shard(r, T);
          ina_weights_t twin;
          char what[160];
          snprintf(what, sizeof what, "%s T=%d rank %d vs random", src->label, T, r);
          CHECK_OK(open_weights(random_twin, &shard, &twin));
          check_same_weights(what, R[r], &twin);
          ina_weights_release(&twin);
        }
      }
      check_cover(src, &whole, ws, wn, R, T);
      printf("  %s: T=%d ok (%d tensors)\n", src->label, T, wn);
    }
    /* Expert and tensor parallelism together: a random expert range on a random rank. */
    if (opened && whole.config.n_routed_experts > 0) {
      const int32_t E = whole.config.n_routed_experts;
      ina_shard_t shard = tp_shard((int32_t)test_rng_int(rng, 0, T - 1), T);
      shard.expert_begin = (int32_t)test_rng_int(rng, 0, E);
      shard.expert_end = (int32_t)test_rng_int(rng, shard.expert_begin, E);
      ina_weights_t part;
      CHECK_OK(open_weights(src, &shard, &part));
      for (int32_t i = 0; i < wn; i++) check_rank_tensor(src, &whole, &part, &ws[i], shard.tp_rank, T);
      ina_weights_release(&part);
    }
    for (int32_t r = 0; r < T; r++) {
      if (R[r]) ina_weights_release(R[r]);
      free(R[r]);
    }
  }
  /* A slice is not a model: saving one is refused. */
  if (split > 1) {
    ina_shard_t shard = tp_shard(split - 1, split);
    ina_weights_t w;
    CHECK_OK(open_weights(src, &shard, &w));
    ina_log_set_quiet_errors(1);
    CHECK(ina_weights_save(&w, "/nonexistent-dir-for-tp-save") == INA_ERR_INVALID_ARGUMENT);
    ina_log_set_quiet_errors(0);
    CHECK(strstr(ina_last_error(), "only whole models are saved") != NULL);
    ina_weights_release(&w);
  }
  free(ws);
  ina_weights_release(&whole);
}

/* ---- models ------------------------------------------------------------------------- */

static source_t random_source(const char *name, const ina_model_config_t *cfg, ina_dtype_t dtype, uint64_t seed) {
  source_t s;
  memset(&s, 0, sizeof s);
  snprintf(s.label, sizeof s.label, "random %s %s", name, ina_dtype_name(dtype));
  s.cfg = *cfg;
  s.dtype = dtype;
  s.seed = seed;
  return s;
}

/* tiny with 4 heads and dims whose halves are whole 128-blocks (fp8 splits into 2,
 * not 4: o_proj's columns per rank are 64 at T = 4). */
static ina_model_config_t config_h4(void) {
  ina_model_config_t c;
  CHECK_OK(ina_model_config_builtin("tiny", &c));
  c.num_heads = 4;
  c.qk_nope_head_dim = 64;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 64;
  c.intermediate_size = 256;
  c.moe_intermediate_size = 256;
  c.num_layers = 3;
  return c;
}

/* DeepSeek-V2 style with every bias (attention_bias, mlp_bias), no q LoRA (q_proj) and
 * two shared experts. */
static ina_model_config_t config_v2_biased(void) {
  ina_model_config_t c = config_h4();
  c.arch = INA_ARCH_DEEPSEEK_V2;
  c.scoring = INA_SCORING_SOFTMAX_GREEDY;
  c.n_group = c.topk_group = 1;
  c.norm_topk_prob = 0;
  c.q_lora_rank = 0;
  c.attention_bias = 1;
  c.mlp_bias = 1;
  c.n_shared_experts = 2;
  return c;
}

/* Save the whole random model of src under root/name and return it as a loaded source. */
static source_t saved_source(const source_t *src, const char *root, const char *name) {
  source_t s;
  ina_weights_t w;
  memset(&s, 0, sizeof s);
  snprintf(s.label, sizeof s.label, "saved %s", src->label + strlen("random "));
  snprintf(s.dir, sizeof s.dir, "%s/%s", root, name);
  CHECK(mkdir(s.dir, 0755) == 0);
  CHECK_OK(open_weights(src, NULL, &w));
  CHECK_OK(ina_weights_save(&w, s.dir));
  ina_weights_release(&w);
  return s;
}

/* Save src's whole model with each MoE layer's routed experts fused as Transformers >= 5
 * may write them: experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]. */
static source_t fused_source(const source_t *src, const char *root) {
  source_t s;
  ina_weights_t w;
  ina_weight_spec_t *specs = NULL;
  int32_t n = 0, k = 0;
  memset(&s, 0, sizeof s);
  snprintf(s.label, sizeof s.label, "fused-experts %s", src->label + strlen("random "));
  snprintf(s.dir, sizeof s.dir, "%s/fused", root);
  CHECK(mkdir(s.dir, 0755) == 0);
  CHECK_OK(open_weights(src, NULL, &w));
  CHECK_OK(ina_weight_specs(&w, &specs, &n));
  const ina_model_config_t *c = &w.config;
  const int64_t E = c->n_routed_experts, I = c->moe_intermediate_size, H = c->hidden_size;
  const size_t es = ina_dtype_size(src->dtype), mat = (size_t)(I * H) * es;
  ina_st_write_entry_t *entries = calloc((size_t)n + 2 * (size_t)c->num_layers, sizeof *entries);
  char (*names)[96] = calloc(2 * (size_t)c->num_layers, sizeof *names);
  char **fused = calloc(2 * (size_t)c->num_layers, sizeof *fused);
  for (int32_t i = 0; i < n; i++) {
    if (specs[i].expert >= 0) continue;
    entries[k] = (ina_st_write_entry_t){specs[i].name, specs[i].tensor->dtype, specs[i].tensor->ndim, {0}, specs[i].tensor->data};
    memcpy(entries[k].shape, specs[i].tensor->shape, sizeof entries[k].shape);
    k++;
  }
  for (int32_t l = 0; l < c->num_layers; l++) {
    if (!w.layers[l].is_moe) continue;
    char *gate_up = malloc((size_t)E * 2 * mat), *down = malloc((size_t)E * mat);
    for (int64_t e = 0; e < E; e++) {
      const ina_mlp_weights_t *m = &w.layers[l].experts[e];
      memcpy(gate_up + (size_t)(2 * e) * mat, m->gate.weight.data, mat);
      memcpy(gate_up + (size_t)(2 * e + 1) * mat, m->up.weight.data, mat);
      memcpy(down + (size_t)e * mat, m->down.weight.data, mat);
    }
    fused[2 * l] = gate_up;
    fused[2 * l + 1] = down;
    snprintf(names[2 * l], sizeof names[0], "model.layers.%d.mlp.experts.gate_up_proj", l);
    snprintf(names[2 * l + 1], sizeof names[0], "model.layers.%d.mlp.experts.down_proj", l);
    entries[k++] = (ina_st_write_entry_t){names[2 * l], src->dtype, 3, {E, 2 * I, H}, gate_up};
    entries[k++] = (ina_st_write_entry_t){names[2 * l + 1], src->dtype, 3, {E, H, I}, down};
  }
  char path[700];
  snprintf(path, sizeof path, "%s/model.safetensors", s.dir);
  CHECK_OK(ina_safetensors_write(path, entries, (size_t)k, NULL));
  snprintf(path, sizeof path, "%s/config.json", s.dir);
  CHECK_OK(ina_model_config_save(c, path));
  for (int32_t l = 0; l < 2 * c->num_layers; l++) free(fused[l]);
  free(fused);
  free(names);
  free(entries);
  free(specs);
  ina_weights_release(&w);
  return s;
}

/* ---- errors ------------------------------------------------------------------------- */

/* Every way of making rank `rank` of T of src fails with `want` and a message holding
 * each of the NULL-terminated `needles`. */
static void expect_error(const source_t *src, int32_t rank, int32_t T, ina_status_t want, const char *const *needles) {
  ina_shard_t shard = tp_shard(rank, T);
  ina_weights_t w;
  ina_log_set_quiet_errors(1);
  ina_status_t got = open_weights(src, &shard, &w);
  ina_log_set_quiet_errors(0);
  CHECKF(got == want, "%s rank %d of %d: status %d, expected %d", src->label, rank, T, (int)got, (int)want);
  if (got == INA_OK) ina_weights_release(&w);
  CHECKF(w.layers == NULL && w.tp_size == 0, "%s: a failed load leaves w empty", src->label);
  for (const char *const *n = needles; *n; n++)
    CHECKF(strstr(ina_last_error(), *n) != NULL, "%s rank %d of %d: message '%s' lacks '%s'", src->label, rank, T,
           ina_last_error(), *n);
  if (src->dir[0]) return;
  ina_log_set_quiet_errors(1);
  got = ina_weights_random_shell(&src->cfg, src->dtype, &shard, &w);
  ina_log_set_quiet_errors(0);
  CHECKF(got == want, "%s rank %d of %d: shell status %d, expected %d", src->label, rank, T, (int)got, (int)want);
  if (got == INA_OK) ina_weights_release(&w);
  for (const char *const *n = needles; *n; n++)
    CHECKF(strstr(ina_last_error(), *n) != NULL, "%s shell: message '%s' lacks '%s'", src->label, ina_last_error(), *n);
}

static void test_errors(uint64_t seed, const char *fixtures, const char *root) {
  ina_model_config_t tiny;
  CHECK_OK(ina_model_config_builtin("tiny", &tiny));
  const source_t t3 = random_source("tiny", &tiny, INA_DTYPE_BF16, seed);
  /* heads */
  expect_error(&t3, 1, 2, INA_ERR_INVALID_ARGUMENT,
               (const char *[]){"model.layers.0.self_attn.q_b_proj.weight", "num_attention_heads 3", "tp_size 2", NULL});
  source_t fx;
  memset(&fx, 0, sizeof fx);
  snprintf(fx.label, sizeof fx.label, "fixture v2_softmax");
  snprintf(fx.dir, sizeof fx.dir, "%s/v2_softmax", fixtures);
  expect_error(&fx, 0, 3, INA_ERR_INVALID_ARGUMENT,
               (const char *[]){"model.layers.0.self_attn.q_proj.weight", "num_attention_heads 4", "tp_size 3", NULL});
  /* tp_rank / tp_size */
  expect_error(&t3, -1, 1, INA_ERR_INVALID_ARGUMENT, (const char *[]){"tp_rank -1", NULL});
  expect_error(&t3, 2, 2, INA_ERR_INVALID_ARGUMENT, (const char *[]){"tp_rank 2 outside [0, tp_size 2)", NULL});
  expect_error(&t3, 0, 0, INA_ERR_INVALID_ARGUMENT, (const char *[]){"tp_size 0", NULL});
  expect_error(&fx, 4, 4, INA_ERR_INVALID_ARGUMENT, (const char *[]){"tp_rank 4", NULL});
  /* intermediate sizes: dense, shared experts, routed experts */
  ina_model_config_t c = config_h4();
  c.intermediate_size = 250;
  source_t s = random_source("h4-inter250", &c, INA_DTYPE_F32, seed);
  expect_error(&s, 3, 4, INA_ERR_INVALID_ARGUMENT,
               (const char *[]){"model.layers.0.mlp.gate_proj.weight", "intermediate_size 250", "tp_size 4", NULL});
  c = config_h4();
  c.moe_intermediate_size = 250;
  s = random_source("h4-moe250", &c, INA_DTYPE_F32, seed);
  expect_error(&s, 0, 4, INA_ERR_INVALID_ARGUMENT,
               (const char *[]){"model.layers.1.mlp.shared_experts.gate_proj.weight",
                                "moe_intermediate_size x n_shared_experts 250", NULL});
  c.n_shared_experts = 2; /* 500 splits into 4, 250 does not */
  s = random_source("h4-moe250-shared2", &c, INA_DTYPE_F32, seed);
  expect_error(&s, 0, 4, INA_ERR_INVALID_ARGUMENT,
               (const char *[]){"model.layers.1.mlp.experts.0.gate_proj.weight", "moe_intermediate_size 250", NULL});
  /* fp8: o_proj's columns split at 64 inside a 128-column block (T = 4) */
  c = config_h4();
  s = random_source("h4", &c, INA_DTYPE_FP8_E4M3, seed);
  const char *const o_proj[] = {"model.layers.0.self_attn.o_proj.weight", "columns", "boundary 64", "128-column",
                                NULL};
  expect_error(&s, 1, 4, INA_ERR_UNSUPPORTED, o_proj);
  expect_error(&s, 0, 4, INA_ERR_UNSUPPORTED, o_proj);
  const source_t saved = saved_source(&s, root, "fp8_h4");
  expect_error(&saved, 1, 4, INA_ERR_UNSUPPORTED, o_proj);
  /* fp8: q_b_proj's rows split at 2 heads x 96 = 192 inside a 128-row block (T = 2) */
  c.qk_rope_head_dim = 32;
  s = random_source("h4-qk96", &c, INA_DTYPE_FP8_E4M3, seed);
  expect_error(&s, 1, 2, INA_ERR_UNSUPPORTED,
               (const char *[]){"model.layers.0.self_attn.q_b_proj.weight", "rows", "boundary 192", "128-row", NULL});
  /* the same model in bf16 has no blocks and splits */
  s = random_source("h4-qk96", &c, INA_DTYPE_BF16, seed);
  ina_shard_t shard = tp_shard(1, 2);
  ina_weights_t w;
  CHECK_OK(open_weights(&s, &shard, &w));
  ina_weights_release(&w);
}

int main(int argc, char **argv) {
  const uint64_t seed = test_seed("test_weights_tp");
  test_rng_t rng = {seed};
  const char *fixtures = argc > 1 ? argv[1] : "tests/golden/fixtures";
  char root[] = "/tmp/ina_test_weights_tp_XXXXXX";
  CHECK(mkdtemp(root) != NULL);

  char *names[GOLDEN_MAX_FIXTURES];
  const int nfix = golden_fixture_names(fixtures, names);
  CHECKF(nfix >= 9, "%d fixtures under %s", nfix, fixtures);
  for (int i = 0; i < nfix; i++) {
    source_t s;
    memset(&s, 0, sizeof s);
    snprintf(s.label, sizeof s.label, "fixture %s", names[i]);
    snprintf(s.dir, sizeof s.dir, "%s/%s", fixtures, names[i]);
    check_source(&s, &rng, NULL);
    free(names[i]);
  }

  const ina_dtype_t dtypes[] = {INA_DTYPE_F32, INA_DTYPE_BF16, INA_DTYPE_FP8_E4M3};
  ina_model_config_t tiny, h4 = config_h4(), v2 = config_v2_biased();
  CHECK_OK(ina_model_config_builtin("tiny", &tiny));
  for (int d = 0; d < 3; d++) {
    const uint64_t s = test_rng_next(&rng);
    const source_t a = random_source("tiny", &tiny, dtypes[d], s);
    const source_t b = random_source("tiny-h4", &h4, dtypes[d], s);
    const source_t c = random_source("v2-biased", &v2, dtypes[d], s);
    check_source(&a, &rng, NULL);
    check_source(&b, &rng, NULL);
    check_source(&c, &rng, NULL);
    /* loading gives the same slices as generating */
    char name[32];
    snprintf(name, sizeof name, "h4_%s", ina_dtype_name(dtypes[d]));
    const source_t sb = saved_source(&b, root, name);
    check_source(&sb, &rng, &b);
    snprintf(name, sizeof name, "v2_%s", ina_dtype_name(dtypes[d]));
    const source_t sc = saved_source(&c, root, name);
    check_source(&sc, &rng, &c);
    if (dtypes[d] == INA_DTYPE_F32) {
      const source_t f = fused_source(&b, root);
      check_source(&f, &rng, &b);
    }
  }
  test_errors(test_rng_next(&rng), fixtures, root);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  CHECK(system(cmd) == 0);
  return test_finish("test_weights_tp");
}
