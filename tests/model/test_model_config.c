/* config.json parsing: the keys of DeepseekV2/V3/V3.2 configs as transformers writes them
 * (old and new rope keys), derived quantities against an independent double-precision
 * YaRN, clear errors for bad files, and each value the parser once took wrongly (cut to
 * int32, lost on saving, NaN frequencies, a negative attention scale) refused, naming
 * the key, beside accepted neighbours. */
#include <string.h>

#include "core/log.h"
#include "core/json.h"
#include "model/config.h"
#include "../test_util.h"

static char g_dir[] = "/tmp/ina_test_config_XXXXXX";

static const char *write_config(const char *text) {
  static char path[256];
  snprintf(path, sizeof path, "%s/config.json", g_dir);
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
  return path;
}

#define V3_BASE                                                                              \
  "\"model_type\": \"deepseek_v3\", \"vocab_size\": 100, \"hidden_size\": 32,"               \
  "\"intermediate_size\": 64, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 2,"      \
  "\"num_attention_heads\": 4, \"q_lora_rank\": null, \"kv_lora_rank\": 16,"                 \
  "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8,"                     \
  "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"n_shared_experts\": 1,"            \
  "\"n_group\": 2, \"topk_group\": 1, \"first_k_dense_replace\": 1"

static void test_valid(void) {
  ina_model_config_t c;
  /* legacy rope_scaling with "type", eos as a list */
  CHECK_OK(ina_model_config_load(
      write_config("{" V3_BASE ", \"eos_token_id\": [7, 8], \"rope_theta\": 50000,"
                   "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"original_max_position_embeddings\": 4096,"
                   "\"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": 1.0, \"mscale_all_dim\": 1.0}}"),
      &c));
  CHECK(c.arch == INA_ARCH_DEEPSEEK_V3 && c.q_lora_rank == 0 && c.eos_token_id == 7);
  CHECK(c.rope_yarn && c.yarn_factor == 40 && c.rope_theta == 50000 && c.yarn_original_max_position == 4096);
  CHECK(c.scoring == INA_SCORING_SIGMOID_NOAUX_TC && c.norm_topk_prob == 1);
  CHECK(c.rope_layout == INA_ROPE_PAIRS);
  CHECK(c.routed_scaling_factor == 2.5);
  /* softmax scale: (8+4)^-0.5 * (0.1 * 1.0 * ln 40 + 1)^2 */
  double m = 0.1 * log(40.0) + 1.0;
  CHECK(fabs(ina_cfg_softmax_scale(&c) - m * m / sqrt(12.0)) < 1e-12);
  /* YaRN inverse frequencies against a double-precision evaluation of the paper's
   * formula with HF's truncation */
  float inv[2], af;
  ina_cfg_rope_inv_freq(&c, inv, &af);
  const double base = 50000, dim = 4, pi2 = 6.283185307179586;
  double low = floor(dim * log(4096 / (32 * pi2)) / (2 * log(base)));
  double high = ceil(dim * log(4096 / (1 * pi2)) / (2 * log(base)));
  if (low < 0) low = 0;
  if (high > dim - 1) high = dim - 1;
  for (int i = 0; i < 2; i++) {
    double pos = pow(base, 2.0 * i / dim);
    double ramp = (i - low) / (high - low);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    double ex = 1 - ramp;
    double want = (1 / (40 * pos)) * (1 - ex) + (1 / pos) * ex;
    CHECKF(fabs(inv[i] - want) <= 1e-6 * want, "inv_freq[%d] %.9g vs %.9g", i, inv[i], want);
  }
  CHECK(af == 1.0f); /* mscale == mscale_all_dim */

  /* V2, new rope_parameters key, group_limited_greedy, fp8 quantization config */
  CHECK_OK(ina_model_config_load(
      write_config("{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 32,"
                   "\"intermediate_size\": 64, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 2,"
                   "\"num_attention_heads\": 3, \"q_lora_rank\": 24, \"kv_lora_rank\": 16,"
                   "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8,"
                   "\"n_routed_experts\": 6, \"num_experts_per_tok\": 2, \"n_shared_experts\": 2,"
                   "\"n_group\": 3, \"topk_group\": 2, \"topk_method\": \"group_limited_greedy\","
                   "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000},"
                   "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\","
                   "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}}"),
      &c));
  CHECK(c.arch == INA_ARCH_DEEPSEEK_V2 && c.scoring == INA_SCORING_SOFTMAX_GROUP_GREEDY);
  CHECK(c.norm_topk_prob == 0 && c.routed_scaling_factor == 1.0 && !c.rope_yarn);
  CHECK(c.fp8_block_scaled && c.fp8_block_rows == 128 && c.q_lora_rank == 24);
  CHECK(fabs(ina_cfg_softmax_scale(&c) - 1 / sqrt(12.0)) < 1e-12);

  /* save -> load is the identity on what matters */
  char path[256];
  snprintf(path, sizeof path, "%s/saved.json", g_dir);
  CHECK_OK(ina_model_config_builtin("tiny", &c));
  CHECK_OK(ina_model_config_save(&c, path));
  ina_model_config_t back;
  CHECK_OK(ina_model_config_load(path, &back));
  CHECK(back.hidden_size == c.hidden_size && back.q_lora_rank == c.q_lora_rank &&
        back.yarn_factor == c.yarn_factor && back.rms_norm_eps == c.rms_norm_eps &&
        back.n_group == c.n_group && back.scoring == c.scoring && back.rope_layout == c.rope_layout);
  for (const char *const *n = ina_model_config_builtin_names(); *n; n++) {
    CHECK_OK(ina_model_config_builtin(*n, &c));
    CHECK_OK(ina_model_config_validate(&c, *n));
  }
}

static void expect_error(const char *json, ina_status_t want, const char *needle) {
  ina_model_config_t c;
  ina_clear_error();
  ina_status_t st = ina_model_config_load(write_config(json), &c);
  CHECKF(st == want, "status %d, want %d for %s", st, want, json);
  CHECKF(strstr(ina_last_error(), needle) != NULL, "message '%s' lacks '%s'", ina_last_error(), needle);
  CHECKF(strstr(ina_last_error(), "config.json") != NULL, "message '%s' lacks the file", ina_last_error());
}

/* The base V3 config with one key replaced (value given as JSON text). */
static void expect_override_error(const char *key, const char *value, ina_status_t want,
                                  const char *needle) {
  json_t *root = json_loads("{" V3_BASE "}", 0, NULL);
  json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
  CHECK(root && v);
  json_object_set_new(root, key, v);
  char *text = json_dumps(root, JSON_COMPACT);
  expect_error(text, want, needle);
  free(text);
  json_decref(root);
}

static void test_errors(void) {
  ina_log_set_quiet_errors(1);
  expect_error("{" V3_BASE, INA_ERR_FORMAT, "config.json");
  expect_error("[1, 2]", INA_ERR_FORMAT, "config.json");
  expect_error("{\"model_type\": \"llama\"}", INA_ERR_UNSUPPORTED, "llama");
  expect_error("{\"model_type\": \"deepseek_v3\", \"vocab_size\": 100}", INA_ERR_NOT_FOUND, "hidden_size");
  expect_override_error("hidden_size", "\"32\"", INA_ERR_FORMAT, "hidden_size");
  expect_override_error("hidden_act", "\"gelu\"", INA_ERR_UNSUPPORTED, "gelu");
  expect_override_error("rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2}", INA_ERR_UNSUPPORTED, "dynamic");
  expect_override_error("rope_scaling", "3", INA_ERR_FORMAT, "rope_scaling");
  expect_override_error("n_group", "3", INA_ERR_FORMAT, "n_group");
  expect_override_error("qk_rope_head_dim", "5", INA_ERR_FORMAT, "qk_rope_head_dim");
  expect_override_error("num_attention_heads", "0", INA_ERR_FORMAT, "num_attention_heads");
  expect_override_error("scoring_func", "\"softmax\"", INA_ERR_UNSUPPORTED, "softmax");
  expect_override_error("quantization_config", "{\"quant_method\": \"gptq\"}", INA_ERR_UNSUPPORTED, "gptq");
  expect_override_error("quantization_config", "{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}",
               INA_ERR_FORMAT, "weight_block_size");
  expect_override_error("num_key_value_heads", "1", INA_ERR_UNSUPPORTED, "num_key_value_heads");
  expect_override_error("num_experts_per_tok", "9", INA_ERR_FORMAT, "num_experts_per_tok");
  ina_model_config_t c;
  CHECK(ina_model_config_load("/nonexistent/config.json", &c) != INA_OK);
  CHECK(strstr(ina_last_error(), "/nonexistent/config.json") != NULL);
  CHECK(ina_model_config_builtin("huge", &c) == INA_ERR_NOT_FOUND);
  ina_log_set_quiet_errors(0);
}

/* ---- values the parser once took wrongly -------------------------------------------- */

/* tests/golden/fixtures/v3_mscale/config.json, as transformers saved it: DeepSeek-V3 with
 * YaRN (factor 4, mscale 1.0, mscale_all_dim 0.707) in rope_parameters. */
static const char kFixture[] =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 0, \"dtype\": \"float32\", \"eos_token_id\": 1,"
    " \"first_k_dense_replace\": 1, \"head_dim\": 8, \"hidden_act\": \"silu\", \"hidden_size\": 32,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 96, \"kv_lora_rank\": 32,"
    " \"max_position_embeddings\": 128, \"model_type\": \"deepseek_v3\","
    " \"moe_intermediate_size\": 16, \"n_group\": 4, \"n_routed_experts\": 8,"
    " \"n_shared_experts\": 1, \"norm_topk_prob\": true, \"num_attention_heads\": 4,"
    " \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2, \"num_key_value_heads\": 4,"
    " \"num_nextn_predict_layers\": 1, \"output_router_logits\": false, \"pad_token_id\": null,"
    " \"pretraining_tp\": 1, \"q_lora_rank\": 24, \"qk_head_dim\": 24, \"qk_nope_head_dim\": 16,"
    " \"qk_rope_head_dim\": 8, \"rms_norm_eps\": 1e-06, \"rope_interleave\": true,"
    " \"rope_parameters\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 4.0, \"mscale\": 1.0,"
    " \"mscale_all_dim\": 0.707, \"original_max_position_embeddings\": 32,"
    " \"rope_theta\": 10000.0, \"rope_type\": \"yarn\"},"
    " \"routed_scaling_factor\": 2.5, \"scoring_func\": \"sigmoid\", \"tie_word_embeddings\": false,"
    " \"topk_group\": 2, \"topk_method\": \"noaux_tc\", \"transformers_version\": \"5.24.0\","
    " \"use_cache\": true, \"v_head_dim\": 16, \"vocab_size\": 128}";

#define FIXTURE_WHERE "v3_mscale/config.json"

/* The fixture with up to two keys changed, parsed in memory. A key is top-level or
 * "rope.KEY" (in rope_parameters); a NULL value deletes it. */
static ina_status_t parse_fixture(const char *key, const char *value, const char *key2,
                                  const char *value2, ina_model_config_t *c) {
  json_t *root = json_loads(kFixture, JSON_REJECT_DUPLICATES, NULL);
  CHECK(root != NULL);
  if (!root) return INA_ERR_INTERNAL;
  for (int k = 0; k < 2; k++) {
    const char *full = k ? key2 : key, *text = k ? value2 : value;
    if (!full) continue;
    json_t *obj = root;
    if (strncmp(full, "rope.", 5) == 0) {
      obj = json_object_get(root, "rope_parameters");
      full += 5;
    }
    if (!text) {
      json_object_del(obj, full);
      continue;
    }
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    CHECKF(v != NULL, "bad JSON in the test: %s", text);
    json_object_set_new(obj, full, v);
  }
  ina_clear_error();
  ina_status_t st = ina_model_config_from_json(root, FIXTURE_WHERE, c);
  json_decref(root);
  return st;
}

/* "key = value[, key2 = value2]" for messages. */
static const char *describe(const char *key, const char *value, const char *key2,
                            const char *value2) {
  static char text[512];
  snprintf(text, sizeof text, "%s = %s%s%s%s%s", key ? key : "(nothing)",
           value ? value : "(deleted)", key2 ? ", " : "", key2 ? key2 : "", key2 ? " = " : "",
           key2 ? (value2 ? value2 : "(deleted)") : "");
  return text;
}

/* The change is refused as INA_ERR_FORMAT, with a message naming the file and `needle`
 * (the key). */
static void expect_refused2(const char *key, const char *value, const char *key2,
                            const char *value2, const char *needle) {
  ina_model_config_t c;
  ina_status_t st = parse_fixture(key, value, key2, value2, &c);
  const char *msg = ina_last_error();
  CHECKF(st == INA_ERR_FORMAT, "%s: status %d, want INA_ERR_FORMAT (%s)",
         describe(key, value, key2, value2), st, msg);
  CHECKF(strstr(msg, needle) != NULL && strstr(msg, FIXTURE_WHERE) != NULL,
         "%s: message '%s' lacks '%s' or the file", describe(key, value, key2, value2), msg,
         needle);
}

static void expect_refused(const char *key, const char *value, const char *needle) {
  expect_refused2(key, value, NULL, NULL, needle);
}

/* The change is accepted; *c is what it gives. */
static void expect_accepted2(const char *key, const char *value, const char *key2,
                             const char *value2, ina_model_config_t *c) {
  ina_status_t st = parse_fixture(key, value, key2, value2, c);
  CHECKF(st == INA_OK, "%s: refused (%s)", describe(key, value, key2, value2), ina_last_error());
}

static void expect_accepted(const char *key, const char *value, ina_model_config_t *c) {
  expect_accepted2(key, value, NULL, NULL, c);
}

/* Saved with ina_model_config_save and loaded again. */
static void save_and_load(const ina_model_config_t *c, ina_model_config_t *back) {
  char path[256];
  snprintf(path, sizeof path, "%s/roundtrip.json", g_dir);
  CHECK_OK(ina_model_config_save(c, path));
  CHECK_OK(ina_model_config_load(path, back));
}

static void test_rope_theta(void) {
  ina_model_config_t c;
  /* ln(rope_theta) divides YaRN's correction range. */
  expect_refused("rope.rope_theta", "1", "rope_theta");
  expect_refused2("rope.rope_theta", "1", "rope.beta_fast", "1.0", "rope_theta");
  /* 0, negative, or 0 / inf as a float32: the float32 frequencies are NaN or inf. */
  expect_refused("rope.rope_theta", "1.1e-299", "rope_theta");
  expect_refused("rope.rope_theta", "1e-39", "rope_theta");
  expect_refused("rope.rope_theta", "0", "rope_theta");
  expect_refused("rope.rope_theta", "-10000", "rope_theta");
  expect_refused("rope.rope_theta", "1e39", "rope_theta");
  /* the top-level key, when the rope object has none */
  expect_refused2("rope.rope_theta", NULL, "rope_theta", "1.1e-299", "rope_theta");
  expect_accepted("rope.rope_theta", "1e6", &c);
  CHECK(c.rope_theta == 1e6);
  expect_accepted("rope.rope_theta", "1.5", &c);
  expect_accepted2("rope.rope_theta", NULL, "rope_theta", "50000", &c);
  CHECK(c.rope_theta == 50000);
  /* theta 1 without YaRN: every frequency is 1, which is sound */
  expect_accepted2("rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 1}", NULL, NULL,
                   &c);
  CHECK(!c.rope_yarn && c.rope_theta == 1);
}

static void test_original_max_position(void) {
  ina_model_config_t c;
  const char *key = "rope.original_max_position_embeddings";
  const char *needle = "rope_parameters.original_max_position_embeddings";
  expect_refused(key, "1e20", needle);
  expect_refused(key, "4096.5", needle);
  expect_refused(key, "32.25", needle);
  expect_refused(key, "2147483648", needle);
  expect_refused(key, "4294967328", needle); /* 2^32 + 32 */
  expect_refused(key, "0", needle);
  /* The legacy key names itself in the message. */
  expect_refused2("rope_parameters", NULL, "rope_scaling",
                  "{\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32.5}",
                  "rope_scaling.original_max_position_embeddings");
  expect_accepted(key, "4096.0", &c);
  CHECK(c.yarn_original_max_position == 4096);
  expect_accepted(key, "2147483647", &c);
  CHECK(c.yarn_original_max_position == INT32_MAX);
  /* absent: max_position_embeddings (128), and the factor 4 given */
  expect_accepted(key, NULL, &c);
  CHECK(c.yarn_original_max_position == 128 && c.yarn_factor == 4.0);
}

static void test_token_ids(void) {
  ina_model_config_t c, back;
  expect_refused("bos_token_id", "4294967296", "bos_token_id"); /* was cut to 0 */
  expect_refused("eos_token_id", "4294967297", "eos_token_id"); /* was cut to 1 */
  expect_refused("eos_token_id", "[4294967296, 1]", "eos_token_id");
  expect_refused("bos_token_id", "2147483648", "bos_token_id");
  /* a negative id was saved as absent */
  expect_refused("eos_token_id", "-7", "eos_token_id");
  expect_refused("eos_token_id", "[-7]", "eos_token_id");
  expect_refused("bos_token_id", "-1", "bos_token_id");
  expect_accepted2("bos_token_id", "2147483647", "eos_token_id", "[0, 5]", &c);
  CHECK(c.bos_token_id == INT32_MAX && c.eos_token_id == 0);
  save_and_load(&c, &back);
  CHECK(back.bos_token_id == INT32_MAX && back.eos_token_id == 0);
  expect_accepted2("bos_token_id", "null", "eos_token_id", NULL, &c);
  CHECK(c.bos_token_id == -1 && c.eos_token_id == -1);
  save_and_load(&c, &back);
  CHECK(back.bos_token_id == -1 && back.eos_token_id == -1);
}

static void test_weight_block_size(void) {
  ina_model_config_t c;
  const char *key = "quantization_config";
  expect_refused(key, "{\"quant_method\": \"fp8\", \"weight_block_size\": [4294967424, 128]}",
                 "weight_block_size"); /* was cut to [128, 128] */
  expect_refused(key, "{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 4294967424]}",
                 "weight_block_size");
  expect_refused(key, "{\"quant_method\": \"fp8\", \"weight_block_size\": [2147483648, 1]}",
                 "weight_block_size");
  expect_refused(key, "{\"quant_method\": \"fp8\", \"weight_block_size\": [128, -128]}",
                 "weight_block_size");
  expect_accepted(key, "{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}", &c);
  CHECK(c.fp8_block_scaled && c.fp8_block_rows == 128 && c.fp8_block_cols == 128);
  expect_accepted(key, "{\"quant_method\": \"fp8\", \"weight_block_size\": [1, 2147483647]}", &c);
  CHECK(c.fp8_block_rows == 1 && c.fp8_block_cols == INT32_MAX);
}

static void test_attention_factor(void) {
  ina_model_config_t c, back;
  /* <= 0 was saved as "derive it" (a negative one) or scaled cos and sin by 0 */
  expect_refused("rope.attention_factor", "-3.0", "attention_factor");
  expect_refused("rope.attention_factor", "-1", "attention_factor");
  expect_refused("rope.attention_factor", "0", "attention_factor");
  expect_accepted("rope.attention_factor", "0.5", &c);
  CHECK(c.yarn_attention_factor == 0.5);
  save_and_load(&c, &back);
  CHECK(back.yarn_attention_factor == 0.5);
  float inv[4], af = 0;
  ina_cfg_rope_inv_freq(&back, inv, &af);
  CHECK(af == 0.5f);
  /* null: derived from the mscales, and still derived after saving */
  expect_accepted("rope.attention_factor", "null", &c);
  CHECK(c.yarn_attention_factor < 0);
  save_and_load(&c, &back);
  CHECK(back.yarn_attention_factor < 0);
}

static void test_beta_factor_mscale(void) {
  ina_model_config_t c;
  expect_refused("rope.beta_slow", "-1.0", "beta_slow");
  expect_refused("rope.beta_fast", "-32", "beta_fast");
  expect_refused("rope.factor", "0.5", "factor");
  expect_refused("rope.factor", "0.999", "factor");
  /* 0.1 * mscale * ln(4) + 1 < 0: a negative attention scale */
  expect_refused("rope.mscale_all_dim", "-10.0", "mscale_all_dim");
  expect_refused("rope.mscale", "-10.0", "mscale");
  expect_refused2("rope.mscale", "-10.0", "rope.mscale_all_dim", "-10.0", "mscale");
  /* an explicit 0 beta means the default, as in transformers */
  expect_accepted2("rope.beta_fast", "0", "rope.beta_slow", "2", &c);
  CHECK(c.yarn_beta_fast == 32 && c.yarn_beta_slow == 2);
  expect_accepted("rope.factor", "1", &c);
  CHECK(c.yarn_factor == 1);
  expect_accepted("rope.factor", "40", &c);
  expect_accepted("rope.mscale_all_dim", "-1.0", &c); /* 0.1 * -1 * ln 4 + 1 = 0.86 */
  CHECK(ina_cfg_softmax_scale(&c) > 0);
  expect_accepted2("rope.mscale", "0.707", "rope.mscale_all_dim", "0", &c);
}

static void test_head_dims_and_positions(void) {
  ina_model_config_t c;
  expect_refused("qk_nope_head_dim", "2147483647", "qk_nope_head_dim + qk_rope_head_dim");
  expect_refused("qk_nope_head_dim", "2147483641", "qk_nope_head_dim + qk_rope_head_dim");
  expect_accepted("qk_nope_head_dim", "2147483639", &c); /* + 8 = INT32_MAX */
  CHECK(ina_cfg_qk_head_dim(&c) == INT32_MAX);
  /* original_max_position_embeddings is given, so only the check of the key itself
   * refuses these */
  expect_refused("max_position_embeddings", "0", "max_position_embeddings");
  expect_refused("max_position_embeddings", "-5", "max_position_embeddings");
  expect_accepted("max_position_embeddings", "1", &c);
  CHECK(c.max_position_embeddings == 1);
  expect_accepted("max_position_embeddings", NULL, &c);
  CHECK(c.max_position_embeddings == 4096);
}

/* ina_model_config_save keeps YaRN's "truncate": false (absent reads as true). */
static void test_truncate_saved(void) {
  ina_model_config_t c, back;
  float inv[4], inv_back[4], af, af_back;
  expect_accepted("rope.truncate", "false", &c);
  CHECK(c.rope_yarn && c.yarn_truncate == 0);
  save_and_load(&c, &back);
  CHECK(back.rope_yarn && back.yarn_truncate == 0);
  ina_cfg_rope_inv_freq(&c, inv, &af);
  ina_cfg_rope_inv_freq(&back, inv_back, &af_back);
  CHECK(memcmp(inv, inv_back, sizeof inv) == 0 && af == af_back);
  expect_accepted("rope.truncate", "true", &c);
  CHECK(c.yarn_truncate == 1);
  save_and_load(&c, &back);
  CHECK(back.yarn_truncate == 1);
  expect_accepted(NULL, NULL, &c); /* the fixture as it is: truncate on */
  CHECK(c.yarn_truncate == 1);
}

/* DeepSeek-V3.2: deepseek_v32 (or only the architecture) is V3 with an indexer; its
 * keys, transformers' defaults when absent, a save that transformers reads back as V3.2,
 * and the shapes it cannot take, refused by name. */
#define V32_BASE                                                                             \
  "\"model_type\": \"deepseek_v32\", \"vocab_size\": 100, \"hidden_size\": 32,"              \
  "\"intermediate_size\": 64, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 2,"     \
  "\"num_attention_heads\": 3, \"q_lora_rank\": 24, \"kv_lora_rank\": 16,"                    \
  "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8,"                    \
  "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"n_shared_experts\": 1,"           \
  "\"n_group\": 2, \"topk_group\": 1, \"first_k_dense_replace\": 1"

static void test_v32(void) {
  ina_model_config_t c, back;
  CHECK_OK(ina_model_config_load(
      write_config("{" V32_BASE ", \"index_topk\": 5, \"index_n_heads\": 3, \"index_head_dim\": 12}"), &c));
  CHECK(c.arch == INA_ARCH_DEEPSEEK_V3 && ina_cfg_has_indexer(&c) && c.index_topk == 5 && c.index_n_heads == 3 &&
        c.index_head_dim == 12 && c.scoring == INA_SCORING_SIGMOID_NOAUX_TC);
  char path[256];
  snprintf(path, sizeof path, "%s/saved_v32.json", g_dir);
  CHECK_OK(ina_model_config_save(&c, path));
  CHECK_OK(ina_model_config_load(path, &back));
  CHECK(back.index_topk == 5 && back.index_n_heads == 3 && back.index_head_dim == 12);
  {
    json_t *saved = json_load_file(path, 0, NULL);
    CHECK(saved && strcmp(json_string_value(json_object_get(saved, "model_type")), "deepseek_v32") == 0);
    json_decref(saved);
  }
  CHECK_OK(ina_model_config_load(write_config("{" V32_BASE "}"), &c));
  CHECK(c.index_topk == 2048 && c.index_n_heads == 64 && c.index_head_dim == 128);
  /* No model_type: the architecture names it. */
  const char *by_arch = "{\"architectures\": [\"DeepseekV32ForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 32,"
                        "\"intermediate_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
                        "\"q_lora_rank\": 8, \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 4, \"qk_rope_head_dim\": 4,"
                        "\"v_head_dim\": 4, \"index_topk\": 7, \"index_head_dim\": 8, \"index_n_heads\": 2}";
  CHECK_OK(ina_model_config_load(write_config(by_arch), &c));
  CHECK(ina_cfg_has_indexer(&c) && c.index_topk == 7);
  /* V3 never has one, whatever keys it carries. */
  CHECK_OK(ina_model_config_load(write_config("{" V3_BASE ", \"index_topk\": 5}"), &c));
  CHECK(!ina_cfg_has_indexer(&c));
  /* MLA's rope is interleaved whatever rope_interleave says (transformers' V3.2 never
   * reads the key); V3 reads it. */
  CHECK_OK(ina_model_config_load(write_config("{" V32_BASE ", \"rope_interleave\": false}"), &c));
  CHECK(c.rope_layout == INA_ROPE_PAIRS);
  CHECK_OK(ina_model_config_load(write_config("{" V3_BASE ", \"rope_interleave\": false}"), &c));
  CHECK(c.rope_layout == INA_ROPE_HALVES);
  /* mlp_layer_types decides the dense layers, over first_k_dense_replace. */
  CHECK_OK(ina_model_config_load(write_config("{" V32_BASE ", \"mlp_layer_types\": [\"sparse\", \"sparse\"]}"), &c));
  CHECK(c.first_k_dense_replace == 0);
  CHECK_OK(ina_model_config_load(write_config("{" V32_BASE ", \"mlp_layer_types\": [\"dense\", \"dense\"]}"), &c));
  CHECK(c.first_k_dense_replace == 2);
  CHECK_OK(ina_model_config_load(write_config("{" V32_BASE ", \"mlp_layer_types\": null}"), &c));
  CHECK(c.first_k_dense_replace == 1);
  ina_log_set_quiet_errors(1);
  expect_error("{" V32_BASE ", \"mlp_layer_types\": [\"sparse\", \"dense\"]}", INA_ERR_UNSUPPORTED,
               "mlp_layer_types[1]");
  expect_error("{" V32_BASE ", \"mlp_layer_types\": [\"dense\"]}", INA_ERR_FORMAT, "mlp_layer_types");
  expect_error("{" V32_BASE ", \"mlp_layer_types\": [\"dense\", \"moe\"]}", INA_ERR_FORMAT, "mlp_layer_types[1]");
  expect_error("{" V32_BASE ", \"index_topk\": 0}", INA_ERR_FORMAT, "index_topk");
  expect_error("{" V32_BASE ", \"index_n_heads\": 0}", INA_ERR_FORMAT, "index_n_heads");
  expect_error("{" V32_BASE ", \"index_head_dim\": 2}", INA_ERR_FORMAT, "index_head_dim");
  expect_error("{" V32_BASE ", \"q_lora_rank\": null}", INA_ERR_FORMAT, "q_lora_rank");
  ina_log_set_quiet_errors(0);
}

static void test_fixed_values(void) {
  ina_log_set_quiet_errors(1);
  test_rope_theta();
  test_original_max_position();
  test_token_ids();
  test_weight_block_size();
  test_attention_factor();
  test_beta_factor_mscale();
  test_head_dims_and_positions();
  test_truncate_saved();
  ina_log_set_quiet_errors(0);
}

int main(void) {
  CHECK(mkdtemp(g_dir) != NULL);
  test_valid();
  test_errors();
  test_v32();
  test_fixed_values();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  CHECK(system(cmd) == 0);
  return test_finish("test_model_config");
}
