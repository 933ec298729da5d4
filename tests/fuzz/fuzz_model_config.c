/* Fuzz target: a checkpoint's config.json, as ina_model_config_load reads it (parsed by
 * jansson with duplicate keys refused, then ina_model_config_from_json). Each input is
 * the file's text.
 *
 * For every input that jansson parses it traps unless:
 *  - ina_model_config_from_json either fails with INA_ERR_FORMAT, INA_ERR_UNSUPPORTED or
 *    INA_ERR_NOT_FOUND (a required key missing) and a message naming the file, or gives a
 *    configuration that ina_model_config_validate accepts, with every enum and flag in
 *    range, and whose derived quantities are sound: a finite positive softmax scale,
 *    finite non-negative rotary frequencies and a finite positive attention factor;
 *  - an accepted configuration saved with ina_model_config_save loads back field for
 *    field (what `ina model init` writes must mean what it read).
 * Everything is freed (LeakSanitizer checks). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "model/config.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_files.h"

#define NAME "fuzz/config.json"
/* Bounds the frequency table computed per input (real models have 64 rotary dims). */
#define MAX_ROPE_DIM 4096

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_files_init();
  return 0;
}

static const ina_status_t kFailures[] = {INA_ERR_FORMAT, INA_ERR_UNSUPPORTED, INA_ERR_NOT_FOUND,
                                         INA_OK};

#define FLAG(f) FUZZ_REQUIRE(c->f == 0 || c->f == 1, #f " is %d", (int)c->f)

static void check_config(const ina_model_config_t *c) {
  ina_clear_error();
  FUZZ_REQUIRE(ina_model_config_validate(c, NAME) == INA_OK, "accepted, then invalid: %s",
               ina_last_error());
  FUZZ_REQUIRE(c->arch == INA_ARCH_DEEPSEEK_V2 || c->arch == INA_ARCH_DEEPSEEK_V3, "arch %d",
               (int)c->arch);
  FUZZ_REQUIRE(c->rope_layout == INA_ROPE_PAIRS || c->rope_layout == INA_ROPE_HALVES,
               "rope_layout %d", (int)c->rope_layout);
  FUZZ_REQUIRE(c->scoring >= INA_SCORING_SOFTMAX_GREEDY && c->scoring <= INA_SCORING_SIGMOID_NOAUX_TC,
               "scoring %d", (int)c->scoring);
  FLAG(norm_topk_prob);
  FLAG(tie_word_embeddings);
  FLAG(attention_bias);
  FLAG(mlp_bias);
  FLAG(rope_yarn);
  FLAG(yarn_truncate);
  FLAG(fp8_block_scaled);
  FUZZ_REQUIRE(c->fp8_block_rows > 0 && c->fp8_block_cols > 0, "fp8 block %dx%d",
               c->fp8_block_rows, c->fp8_block_cols);

  const double scale = ina_cfg_softmax_scale(c);
  FUZZ_REQUIRE(isfinite(scale) && scale > 0, "softmax scale %g", scale);
  if (c->qk_rope_head_dim <= MAX_ROPE_DIM) {
    float inv_freq[MAX_ROPE_DIM / 2], factor = 0;
    ina_cfg_rope_inv_freq(c, inv_freq, &factor);
    FUZZ_REQUIRE(isfinite(factor) && factor > 0, "attention factor %g", (double)factor);
    for (int i = 0; i < c->qk_rope_head_dim / 2; i++)
      /* 0 is sound: a frequency interpolated by a huge factor underflows the float. */
      FUZZ_REQUIRE(isfinite(inv_freq[i]) && inv_freq[i] >= 0, "inv_freq[%d] = %g", i,
                   (double)inv_freq[i]);
  }
}

/* Every field of the two configurations is equal. */
static void require_same(const ina_model_config_t *a, const ina_model_config_t *b) {
#define SAME(f)                                                                          \
  FUZZ_REQUIRE(a->f == b->f, "saved and loaded again, " #f " changes from %.17g to %.17g", \
               (double)a->f, (double)b->f)
  SAME(arch);
  SAME(vocab_size);
  SAME(hidden_size);
  SAME(intermediate_size);
  SAME(moe_intermediate_size);
  SAME(num_layers);
  SAME(num_heads);
  SAME(q_lora_rank);
  SAME(kv_lora_rank);
  SAME(qk_nope_head_dim);
  SAME(qk_rope_head_dim);
  SAME(v_head_dim);
  SAME(n_routed_experts);
  SAME(num_experts_per_tok);
  SAME(n_shared_experts);
  SAME(n_group);
  SAME(topk_group);
  SAME(first_k_dense_replace);
  SAME(norm_topk_prob);
  SAME(routed_scaling_factor);
  SAME(scoring);
  SAME(rms_norm_eps);
  SAME(tie_word_embeddings);
  SAME(attention_bias);
  SAME(mlp_bias);
  SAME(max_position_embeddings);
  SAME(bos_token_id);
  SAME(eos_token_id);
  SAME(rope_layout);
  SAME(rope_theta);
  SAME(rope_yarn);
  SAME(yarn_factor);
  SAME(yarn_beta_fast);
  SAME(yarn_beta_slow);
  SAME(yarn_mscale);
  SAME(yarn_mscale_all_dim);
  SAME(yarn_attention_factor);
  SAME(yarn_original_max_position);
  SAME(yarn_truncate);
  SAME(fp8_block_scaled);
  SAME(fp8_block_rows);
  SAME(fp8_block_cols);
#undef SAME
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_error_t jerr;
  /* As ina_json_load_file parses the file; what jansson refuses never reaches ina. */
  json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) return 0;
  ina_model_config_t c;
  ina_clear_error();
  ina_status_t st = ina_model_config_from_json(root, NAME, &c);
  json_decref(root);
  if (st != INA_OK) {
    fuzz_require_error("ina_model_config_from_json", st, kFailures, NAME);
    return 0;
  }
  check_config(&c);

  const char *path = fuzz_scratch_path("config.json");
  ina_clear_error();
  FUZZ_REQUIRE(ina_model_config_save(&c, path) == INA_OK, "an accepted config does not save: %s",
               ina_last_error());
  ina_model_config_t back;
  ina_clear_error();
  FUZZ_REQUIRE(ina_model_config_load(path, &back) == INA_OK,
               "a saved config does not load again: %s", ina_last_error());
  require_same(&c, &back);
  return 0;
}
