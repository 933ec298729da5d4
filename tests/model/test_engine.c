/* The CPU engine against itself: the invariances a correct forward pass must have.
 * Absorbed decode equals expanded attention; page size, batching, chunked prefill and
 * prefix sharing do not change logits; running out of pages or a bad token id changes
 * nothing. (Agreement with Hugging Face is test_golden's job.) */
#include <string.h>

#include "core/log.h"
#include "model/sampler.h"
#include "../test_util.h"
#include "model_test_util.h"

static ina_model_t *open_random(const char *name, ina_dtype_t dtype, uint64_t seed) {
  ina_model_options_t o = INA_MODEL_OPTIONS_INIT;
  ina_model_t *m = NULL;
  o.dtype = dtype;
  o.seed = seed;
  CHECK_OK(ina_model_open(name, &o, &m));
  return m;
}

static void random_prompt(test_rng_t *rng, int32_t vocab, int32_t *p, int32_t n) {
  for (int32_t i = 0; i < n; i++) p[i] = (int32_t)test_rng_int(rng, 0, vocab - 1);
}

static void test_absorbed_equals_expanded(ina_model_t *m, test_rng_t *rng) {
  const int32_t vocab = ina_model_config(m)->vocab_size;
  int32_t prompt[9];
  random_prompt(rng, vocab, prompt, 9);
  ina_engine_t *absorbed = make_engine(m, 16, 4096, 0), *expanded = make_engine(m, 16, 4096, 1);
  CHECK(absorbed && expanded);
  float *a = run_greedy(absorbed, prompt, 9, 8, NULL), *b = run_greedy(expanded, prompt, 9, 8, NULL);
  CHECK(a && b);
  if (a && b) {
    double err = test_rel_l2(a, b, (size_t)16 * vocab);
    CHECKF(err <= 1e-5, "absorbed vs expanded decode: rel l2 %.3g", err);
  }
  free(a);
  free(b);
  ina_engine_destroy(absorbed);
  ina_engine_destroy(expanded);
}

static void test_page_sizes(ina_model_t *m, test_rng_t *rng) {
  const int32_t vocab = ina_model_config(m)->vocab_size;
  int32_t prompt[13];
  random_prompt(rng, vocab, prompt, 13);
  const int32_t sizes[] = {1, 3, 16, 64};
  float *ref = NULL;
  for (int i = 0; i < 4; i++) {
    ina_engine_t *e = make_engine(m, sizes[i], 4096, 0);
    CHECK(e != NULL);
    float *l = e ? run_greedy(e, prompt, 13, 6, NULL) : NULL;
    CHECK(l != NULL);
    if (i == 0) {
      ref = l;
    } else if (l && ref) {
      double err = test_rel_l2(l, ref, (size_t)18 * vocab);
      CHECKF(err <= 1e-6, "page size %d vs 1: rel l2 %.3g", sizes[i], err);
      free(l);
    }
    ina_engine_destroy(e);
  }
  free(ref);
}

/* The per-expert counters: every forwarded token adds top-k to each MoE layer, spread
 * over the experts its router picked; reset starts over; too small a buffer is refused. */
static void test_expert_load(ina_model_t *m, test_rng_t *rng) {
  const ina_model_config_t *c = ina_model_config(m);
  const int32_t E = c->n_routed_experts, K = c->num_experts_per_tok;
  int32_t moe_layers = 0, expected_layers = 0, prompt[11];
  for (int32_t l = 0; l < c->num_layers; l++) expected_layers += ina_cfg_layer_is_moe(c, l);
  random_prompt(rng, c->vocab_size, prompt, 11);
  ina_engine_t *e = make_engine(m, 16, 4096, 0);
  if (!e) return;
  CHECK_OK(ina_engine_expert_load(e, 0, NULL, 0, &moe_layers));
  CHECK(moe_layers == expected_layers && moe_layers > 0);
  const size_t n = (size_t)moe_layers * (size_t)E;
  uint64_t *counts = malloc(n * sizeof *counts);
  CHECK_OK(ina_engine_expert_load(e, 0, counts, (int64_t)n, &moe_layers));
  for (size_t i = 0; i < n; i++) CHECK(counts[i] == 0);
  free(run_greedy(e, prompt, 11, 5, NULL)); /* 11 prompt tokens, then 4 decode steps */
  const uint64_t tokens = 11 + 4;
  for (int pass = 0; pass < 2; pass++) {
    CHECK_OK(ina_engine_expert_load(e, pass == 0, counts, (int64_t)n, &moe_layers));
    for (int32_t layer = 0; layer < moe_layers; layer++) {
      uint64_t sum = 0, most = 0;
      for (int32_t x = 0; x < E; x++) {
        sum += counts[(size_t)layer * E + x];
        if (counts[(size_t)layer * E + x] > most) most = counts[(size_t)layer * E + x];
      }
      const uint64_t want = pass == 0 ? tokens * (uint64_t)K : 0;
      CHECKF(sum == want, "MoE layer %d: %llu routed tokens counted, want %llu (pass %d)", layer,
             (unsigned long long)sum, (unsigned long long)want, pass);
      CHECK(most <= (pass == 0 ? tokens : 0)); /* an expert at most once per token */
    }
  }
  ina_log_set_quiet_errors(1);
  CHECK(ina_engine_expert_load(e, 0, counts, (int64_t)n - 1, &moe_layers) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  free(counts);
  ina_engine_destroy(e);
}

/* A ragged batch (prefill of three prompts at once, then batched decode) gives each
 * sequence the logits it gets alone. */
static void test_batch_invariance(ina_model_t *m, test_rng_t *rng) {
  const int32_t vocab = ina_model_config(m)->vocab_size;
  const int32_t lens[3] = {1, 7, 4}, new_tokens = 5;
  int32_t prompts[3][7];
  ina_generate_request_t r[3];
  float *alone[3];
  ina_engine_t *e = make_engine(m, 4, 4096, 0);
  CHECK(e != NULL);
  if (!e) return;
  memset(r, 0, sizeof r);
  for (int i = 0; i < 3; i++) {
    random_prompt(rng, vocab, prompts[i], lens[i]);
    alone[i] = run_greedy(e, prompts[i], lens[i], new_tokens, NULL);
    ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT;
    r[i].prompt = prompts[i];
    r[i].prompt_len = lens[i];
    r[i].max_new_tokens = new_tokens;
    r[i].sampling = sp;
    r[i].ignore_eos = 1;
    r[i].output = malloc(new_tokens * sizeof(int32_t));
    r[i].logits = malloc((size_t)(lens[i] + new_tokens) * vocab * sizeof(float));
  }
  CHECK_OK(ina_generate(e, r, 3, NULL));
  for (int i = 0; i < 3; i++) {
    double err = test_rel_l2(r[i].logits, alone[i], (size_t)(lens[i] + new_tokens - 1) * vocab);
    CHECKF(err <= 1e-5, "sequence %d in a batch vs alone: rel l2 %.3g", i, err);
    free(alone[i]);
    free(r[i].output);
    free(r[i].logits);
  }
  CHECK(ina_page_pool_free_pages(ina_engine_page_pool(e)) == ina_page_pool_num_pages(ina_engine_page_pool(e)));
  ina_engine_destroy(e);
}

/* Feeding a prompt in chunks (chunked prefill over the cached prefix) gives the same
 * logits as one prefill, and so does a forked sequence sharing the prefix's pages. */
static void test_chunks_and_prefix_sharing(ina_model_t *m, test_rng_t *rng) {
  const int32_t vocab = ina_model_config(m)->vocab_size, n = 11;
  int32_t prompt[11];
  random_prompt(rng, vocab, prompt, n);
  ina_engine_t *e = make_engine(m, 4, 4096, 0);
  CHECK(e != NULL);
  if (!e) return;
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  float *whole = malloc((size_t)n * vocab * sizeof(float));
  float *chunked = malloc((size_t)n * vocab * sizeof(float));
  ina_kv_seq_t a = INA_KV_SEQ_INIT, b = INA_KV_SEQ_INIT;
  ina_kv_seq_t *pa = &a, *pb = &b;
  int32_t qo[2] = {0, n};
  ina_batch_t batch = {1, &pa, qo, prompt, 1};
  CHECK_OK(ina_engine_forward(e, &batch, whole));
  /* chunks of 3, 1, 5, 2 */
  const int32_t chunks[] = {3, 1, 5, 2};
  int32_t done = 0;
  for (int k = 0; k < 4; k++) {
    int32_t cq[2] = {0, chunks[k]};
    ina_batch_t cb = {1, &pb, cq, prompt + done, 1};
    CHECK_OK(ina_engine_forward(e, &cb, chunked + (size_t)done * vocab));
    done += chunks[k];
  }
  double err = test_rel_l2(chunked, whole, (size_t)n * vocab);
  CHECKF(err <= 1e-5, "chunked prefill vs whole: rel l2 %.3g", err);
  /* Fork a after 6 tokens (mid page) and recompute the rest on the fork. */
  ina_kv_seq_t f = INA_KV_SEQ_INIT, *pf = &f;
  CHECK_OK(ina_kv_seq_fork(pool, &a, 6, &f));
  int32_t fq[2] = {0, n - 6};
  ina_batch_t fb = {1, &pf, fq, prompt + 6, 1};
  float *forked = malloc((size_t)(n - 6) * vocab * sizeof(float));
  CHECK_OK(ina_engine_forward(e, &fb, forked));
  err = test_rel_l2(forked, whole + (size_t)6 * vocab, (size_t)(n - 6) * vocab);
  CHECKF(err <= 1e-5, "forked prefix vs whole: rel l2 %.3g", err);
  /* and the parent still decodes as before the fork wrote into its copy */
  int32_t next = prompt[0], dq[2] = {0, 1};
  float *pa_logits = malloc((size_t)vocab * sizeof(float)), *pb_logits = malloc((size_t)vocab * sizeof(float));
  ina_batch_t da = {1, &pa, dq, &next, 0}, db = {1, &pb, dq, &next, 0};
  CHECK_OK(ina_engine_forward(e, &da, pa_logits));
  CHECK_OK(ina_engine_forward(e, &db, pb_logits));
  err = test_rel_l2(pa_logits, pb_logits, (size_t)vocab);
  CHECKF(err <= 1e-5, "parent after fork vs independent sequence: rel l2 %.3g", err);
  ina_kv_seq_release(pool, &a);
  ina_kv_seq_release(pool, &b);
  ina_kv_seq_release(pool, &f);
  CHECK(ina_page_pool_free_pages(pool) == ina_page_pool_num_pages(pool));
  free(whole);
  free(chunked);
  free(forked);
  free(pa_logits);
  free(pb_logits);
  ina_engine_destroy(e);
}

static void test_errors_change_nothing(ina_model_t *m) {
  const int32_t vocab = ina_model_config(m)->vocab_size;
  ina_engine_t *e = make_engine(m, 4, 16, 0); /* 4 pages */
  CHECK(e != NULL);
  if (!e) return;
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  ina_kv_seq_t a = INA_KV_SEQ_INIT, b = INA_KV_SEQ_INIT;
  ina_kv_seq_t *seqs[2] = {&a, &b};
  int32_t tokens[20];
  for (int i = 0; i < 20; i++) tokens[i] = i % vocab;
  float *logits = malloc((size_t)20 * vocab * sizeof(float));
  int32_t qo_ok[2] = {0, 5};
  ina_batch_t ok = {1, seqs, qo_ok, tokens, 0};
  CHECK_OK(ina_engine_forward(e, &ok, logits));
  const int32_t free_before = ina_page_pool_free_pages(pool);
  /* a needs 1 more page for 4 tokens, b needs 3 for 12: 4 > 2 free */
  int32_t qo_big[3] = {0, 4, 16};
  ina_batch_t big = {2, seqs, qo_big, tokens, 0};
  ina_log_set_quiet_errors(1);
  CHECK(ina_engine_forward(e, &big, logits) == INA_ERR_OUT_OF_PAGES);
  CHECK(a.num_tokens == 5 && b.num_tokens == 0);
  CHECK(ina_page_pool_free_pages(pool) == free_before);
  int32_t bad[1] = {vocab};
  int32_t qo1[2] = {0, 1};
  ina_batch_t bad_batch = {1, seqs, qo1, bad, 0};
  CHECK(ina_engine_forward(e, &bad_batch, logits) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "outside the vocabulary") != NULL);
  CHECK(a.num_tokens == 5);
  /* the CPU backend does not time its steps' parts */
  ina_engine_step_split_t split;
  CHECK(ina_engine_step_split(e, 0, &split) == INA_ERR_UNSUPPORTED);
  ina_log_set_quiet_errors(0);
  /* the engine still serves: decode one token on a */
  ina_batch_t one = {1, seqs, qo1, tokens, 0};
  CHECK_OK(ina_engine_forward(e, &one, logits));
  CHECK(a.num_tokens == 6);
  ina_kv_seq_release(pool, &a);
  ina_kv_seq_release(pool, &b);
  free(logits);
  ina_engine_destroy(e);
}

/* ina_engine_forward_greedy returns the argmax of each row ina_engine_forward would
 * return, for a prefill of every row's logits and of the last rows. */
static void test_forward_greedy(ina_model_t *m, test_rng_t *rng) {
  const int32_t vocab = ina_model_config(m)->vocab_size;
  for (int all = 0; all < 2; all++) {
    ina_engine_t *a = make_engine(m, 16, 1024, 0), *b = make_engine(m, 16, 1024, 0);
    ina_kv_seq_t sa[3] = {INA_KV_SEQ_INIT, INA_KV_SEQ_INIT, INA_KV_SEQ_INIT};
    ina_kv_seq_t sb[3] = {INA_KV_SEQ_INIT, INA_KV_SEQ_INIT, INA_KV_SEQ_INIT};
    ina_kv_seq_t *pa[3] = {&sa[0], &sa[1], &sa[2]}, *pb[3] = {&sb[0], &sb[1], &sb[2]};
    int32_t qo[4] = {0}, tokens[48], chosen[48];
    for (int k = 0; k < 3; k++) qo[k + 1] = qo[k] + 1 + (int32_t)test_rng_int(rng, 0, 14);
    for (int32_t t = 0; t < qo[3]; t++) tokens[t] = (int32_t)test_rng_int(rng, 0, vocab - 1);
    const int32_t rows = all ? qo[3] : 3;
    float *logits = malloc((size_t)rows * vocab * sizeof *logits);
    if (a && b && logits) {
      const ina_batch_t ba = {3, pa, qo, tokens, all}, bb = {3, pb, qo, tokens, all};
      CHECK_OK(ina_engine_forward(a, &ba, logits));
      CHECK_OK(ina_engine_forward_greedy(b, &bb, chosen));
      int same = 1;
      for (int32_t r = 0; r < rows; r++) same &= chosen[r] == ina_argmax_f32(logits + (int64_t)r * vocab, vocab);
      CHECKF(same, "forward_greedy (all_logits %d): a token is not its row's argmax", all);
      for (int k = 0; k < 3; k++) {
        ina_kv_seq_release(ina_engine_page_pool(a), &sa[k]);
        ina_kv_seq_release(ina_engine_page_pool(b), &sb[k]);
      }
    }
    free(logits);
    ina_engine_destroy(a);
    ina_engine_destroy(b);
  }
}

/* Random weights depend only on the seed: the in-memory model equals the one written
 * by `ina model init` and loaded back, for f32, bf16 and fp8 storage. */
static void test_random_roundtrip(void) {
  const ina_dtype_t dtypes[] = {INA_DTYPE_F32, INA_DTYPE_BF16, INA_DTYPE_FP8_E4M3};
  char dir[] = "/tmp/ina_test_engine_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  for (int i = 0; i < 3; i++) {
    ina_model_t *mem = open_random("random:tiny", dtypes[i], 7);
    ina_weights_t w;
    ina_model_config_t cfg;
    CHECK_OK(ina_model_config_builtin("tiny", &cfg));
    CHECK_OK(ina_weights_random(&cfg, 7, dtypes[i], NULL, &w));
    CHECK_OK(ina_weights_save(&w, dir));
    ina_weights_release(&w);
    ina_model_t *disk = NULL;
    CHECK_OK(ina_model_open(dir, NULL, &disk));
    CHECK(disk && ina_model_config(disk)->fp8_block_scaled == (dtypes[i] == INA_DTYPE_FP8_E4M3));
    CHECK(ina_model_weight_bytes(disk) == ina_model_weight_bytes(mem));
    {
      /* A model whose random weights are left for a device counts the same bytes. */
      ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
      mo.seed = 7;
      mo.dtype = dtypes[i];
      mo.random_on_device = 1;
      ina_model_t *shell = NULL;
      CHECK_OK(ina_model_open("random:tiny", &mo, &shell));
      CHECKF(shell && ina_model_weight_bytes(shell) == ina_model_weight_bytes(mem),
             "dtype %s: a shell counts %lld bytes, the weights take %lld", ina_dtype_name(dtypes[i]),
             shell ? (long long)ina_model_weight_bytes(shell) : -1LL, (long long)ina_model_weight_bytes(mem));
      ina_model_destroy(shell);
    }
    int32_t prompt[5] = {5, 900, 17, 3, 256};
    ina_engine_t *e1 = make_engine(mem, 16, 1024, 0), *e2 = disk ? make_engine(disk, 16, 1024, 0) : NULL;
    float *a = e1 ? run_greedy(e1, prompt, 5, 4, NULL) : NULL;
    float *b = e2 ? run_greedy(e2, prompt, 5, 4, NULL) : NULL;
    CHECK(a && b);
    if (a && b) CHECKF(memcmp(a, b, (size_t)8 * 1024 * sizeof(float)) == 0, "dtype %s: logits differ", ina_dtype_name(dtypes[i]));
    free(a);
    free(b);
    ina_engine_destroy(e1);
    ina_engine_destroy(e2);
    ina_model_destroy(disk);
    ina_model_destroy(mem);
  }
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

/* DeepSeek-V3.2 (v3.2-tiny): its indexer's tensors are listed in every layer with
 * Hugging Face's names and shapes, saved and loaded back to the same bytes (f32, bf16,
 * fp8); the CPU engine runs it and the CUDA engine refuses it by name. */
static void test_v32_weights(void) {
  const ina_dtype_t dtypes[] = {INA_DTYPE_F32, INA_DTYPE_BF16, INA_DTYPE_FP8_E4M3};
  char dir[] = "/tmp/ina_test_engine_v32_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  ina_model_config_t cfg;
  CHECK_OK(ina_model_config_builtin("v3.2-tiny", &cfg));
  CHECK(ina_cfg_has_indexer(&cfg));
  for (int i = 0; i < 3; i++) {
    ina_weights_t w;
    CHECK_OK(ina_weights_random(&cfg, 11, dtypes[i], NULL, &w));
    ina_weight_spec_t *specs = NULL;
    int32_t count = 0, found = 0;
    CHECK_OK(ina_weight_specs(&w, &specs, &count));
    for (int32_t k = 0; k < count; k++) {
      const ina_weight_spec_t *sp = &specs[k];
      if (!strstr(sp->name, ".self_attn.indexer.")) continue;
      found++;
      const int64_t want0 = strstr(sp->name, "wq_b")     ? (int64_t)cfg.index_n_heads * cfg.index_head_dim
                            : strstr(sp->name, "weights_proj") ? cfg.index_n_heads
                                                               : cfg.index_head_dim;
      CHECKF(sp->full_shape[0] == want0 && sp->slice_dim == -1, "%s: %lld rows, expected %lld", sp->name,
             (long long)sp->full_shape[0], (long long)want0);
      if (strstr(sp->name, "wq_b")) CHECK(sp->full_shape[1] == cfg.q_lora_rank);
      if (strstr(sp->name, "wk.") || strstr(sp->name, "weights_proj")) CHECK(sp->full_shape[1] == cfg.hidden_size);
      /* weights_proj stays in high precision, as Hugging Face keeps it */
      if (strstr(sp->name, "weights_proj")) CHECK(sp->tensor->dtype != INA_DTYPE_FP8_E4M3);
    }
    CHECKF(found == 5 * cfg.num_layers, "%d indexer tensors listed, expected 5 per layer", (int)found);
    free(specs);
    CHECK_OK(ina_weights_save(&w, dir));
    ina_model_t *disk = NULL;
    CHECK_OK(ina_model_open(dir, NULL, &disk));
    if (disk) {
      const ina_weights_t *d = ina_model_weights(disk);
      for (int32_t l = 0; l < cfg.num_layers; l++) {
        const ina_layer_weights_t *a = &w.layers[l], *b = &d->layers[l];
        const ina_tensor_t *ta[] = {&a->index_wq_b.weight, &a->index_wk.weight, &a->index_k_norm,
                                    &a->index_k_norm_bias, &a->index_weights_proj};
        const ina_tensor_t *tb[] = {&b->index_wq_b.weight, &b->index_wk.weight, &b->index_k_norm,
                                    &b->index_k_norm_bias, &b->index_weights_proj};
        for (int k = 0; k < 5; k++)
          CHECKF(ina_tensor_nbytes(ta[k]) > 0 && ina_tensor_nbytes(ta[k]) == ina_tensor_nbytes(tb[k]) &&
                     memcmp(ta[k]->data, tb[k]->data, ina_tensor_nbytes(ta[k])) == 0,
                 "%s layer %d indexer tensor %d differs after saving", ina_dtype_name(dtypes[i]), (int)l, k);
      }
      /* The CPU engine runs it, with f32 index keys or FP8 ones; another key format is
       * refused by name. */
      ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
      ina_engine_t *e = NULL;
      CHECK_OK(ina_engine_create(disk, &eo, &e));
      ina_engine_destroy(e);
      e = NULL;
      eo.index_keys = INA_ENGINE_INDEX_KEYS_FP8;
      CHECK_OK(ina_engine_create(disk, &eo, &e));
      ina_engine_destroy(e);
      e = NULL;
      eo.index_keys = 2;
      ina_log_set_quiet_errors(1);
      const ina_status_t st = ina_engine_create(disk, &eo, &e);
      ina_log_set_quiet_errors(0);
      CHECKF(st == INA_ERR_INVALID_ARGUMENT && e == NULL && strstr(ina_last_error(), "index_keys"),
             "index_keys 2 gave %d: %s", (int)st, ina_last_error());
    }
    ina_model_destroy(disk);
    ina_weights_release(&w);
  }
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

int main(void) {
  test_rng_t rng = {test_seed("test_engine")};
  ina_model_t *tiny = open_random("tiny", INA_DTYPE_F32, 1);
  if (tiny) {
    test_absorbed_equals_expanded(tiny, &rng);
    test_page_sizes(tiny, &rng);
    test_batch_invariance(tiny, &rng);
    test_chunks_and_prefix_sharing(tiny, &rng);
    test_errors_change_nothing(tiny);
    test_expert_load(tiny, &rng);
    test_forward_greedy(tiny, &rng);
  }
  ina_model_destroy(tiny);
  /* The same properties on DeepSeek-V3.2 (sparse attention over 8 selected tokens, fewer
   * than most of these prompts). */
  ina_model_t *v32 = open_random("v3.2-tiny", INA_DTYPE_F32, 3);
  if (v32) {
    test_page_sizes(v32, &rng);
    test_batch_invariance(v32, &rng);
    test_chunks_and_prefix_sharing(v32, &rng);
    test_errors_change_nothing(v32);
    test_forward_greedy(v32, &rng);
  }
  ina_model_destroy(v32);
  test_random_roundtrip();
  test_v32_weights();
  return test_finish("test_engine");
}
