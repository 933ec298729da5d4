/* config.json parsing: the keys of DeepseekV2/V3 configs as transformers writes them
 * (old and new rope keys), derived quantities against an independent double-precision
 * YaRN, and clear errors for bad files. */
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

int main(void) {
  CHECK(mkdtemp(g_dir) != NULL);
  test_valid();
  test_errors();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  CHECK(system(cmd) == 0);
  return test_finish("test_model_config");
}
