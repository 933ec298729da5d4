/* JSON accessors: typed getters with defaults, messages naming file and key, file loading
 * errors, and a round trip of random values through a file. */
#include <float.h>

#include "core/json.h"
#include "core/log.h"
#include "tests/io/io_test_util.h"

static const char *CONFIG =
    "{\"hidden_size\": 7168, \"name\": \"deepseek_v3\", \"rms_norm_eps\": 1e-06,\n"
    " \"rope_theta\": 10000, \"tie_word_embeddings\": false, \"moe\": true,\n"
    " \"q_lora_rank\": null, \"bad_int\": \"7168\", \"real_int\": 2.0,\n"
    " \"nested\": {\"factor\": 40}, \"list\": [1, 2]}";

static void test_getters(const char *dir) {
  char path[512];
  io_join(path, sizeof path, dir, "config.json");
  CHECK(io_write_text(path, CONFIG));
  json_t *cfg = NULL;
  CHECK_OK(ina_json_load_file(path, &cfg));
  if (!cfg) return;

  int64_t i = 0;
  double d = 0;
  int b = -1;
  const char *s = NULL;
  CHECK_OK(ina_json_get_int(cfg, "hidden_size", path, &i));
  CHECK(i == 7168);
  CHECK_OK(ina_json_get_double(cfg, "rms_norm_eps", path, &d));
  CHECK(d == 1e-06);
  CHECK_OK(ina_json_get_double(cfg, "rope_theta", path, &d)); /* an integer is a number */
  CHECK(d == 10000.0);
  CHECK_OK(ina_json_get_bool(cfg, "tie_word_embeddings", path, &b));
  CHECK(b == 0);
  CHECK_OK(ina_json_get_bool(cfg, "moe", path, &b));
  CHECK(b == 1);
  CHECK_OK(ina_json_get_string(cfg, "name", path, &s));
  CHECK(s && strcmp(s, "deepseek_v3") == 0);
  CHECK_OK(ina_json_get_int(json_object_get(cfg, "nested"), "factor", "config.json:nested", &i));
  CHECK(i == 40);

  /* Wrong types: FORMAT with "FILE: key 'K': expected X, got Y". */
  ina_clear_error();
  CHECK_FAILS_WITH(ina_json_get_int(cfg, "bad_int", path, &i), INA_ERR_FORMAT, path, "'bad_int'");
  CHECK(strstr(ina_last_error(), "expected an integer, got string") != NULL);
  CHECK_FAILS_WITH(ina_json_get_int(cfg, "real_int", path, &i), INA_ERR_FORMAT, path, "got real");
  CHECK_FAILS_WITH(ina_json_get_double(cfg, "name", path, &d), INA_ERR_FORMAT, path, "'name'");
  CHECK_FAILS_WITH(ina_json_get_bool(cfg, "hidden_size", path, &b), INA_ERR_FORMAT, path,
                   "expected a boolean, got integer");
  CHECK_FAILS_WITH(ina_json_get_string(cfg, "list", path, &s), INA_ERR_FORMAT, path, "got array");
  CHECK_FAILS_WITH(ina_json_get_int(cfg, "q_lora_rank", path, &i), INA_ERR_FORMAT, path,
                   "got null");
  /* Looking up in something that is not an object. */
  CHECK_FAILS_WITH(ina_json_get_int(json_object_get(cfg, "list"), "x", path, &i), INA_ERR_FORMAT,
                   path, "'x'");
  CHECK_FAILS_WITH(ina_json_get_int(NULL, "x", path, &i), INA_ERR_INVALID_ARGUMENT, path, "'x'");

  /* Absent keys: NOT_FOUND with a message for the required getters... */
  ina_clear_error();
  CHECK_FAILS_WITH(ina_json_get_int(cfg, "vocab_size", path, &i), INA_ERR_NOT_FOUND, path,
                   "missing key 'vocab_size'");
  CHECK_FAILS_WITH(ina_json_get_string(cfg, "model_type", path, &s), INA_ERR_NOT_FOUND, path,
                   "'model_type'");

  /* ...and the default, quietly, for the optional ones (null counts as absent). */
  ina_clear_error();
  CHECK_OK(ina_json_get_int_opt(cfg, "q_lora_rank", path, 1536, &i));
  CHECK(i == 1536);
  CHECK_OK(ina_json_get_int_opt(cfg, "absent", path, -3, &i));
  CHECK(i == -3);
  CHECK_OK(ina_json_get_int_opt(cfg, "hidden_size", path, -3, &i));
  CHECK(i == 7168);
  CHECK_OK(ina_json_get_double_opt(cfg, "absent", path, 0.5, &d));
  CHECK(d == 0.5);
  CHECK_OK(ina_json_get_double_opt(cfg, "rms_norm_eps", path, 0.5, &d));
  CHECK(d == 1e-06);
  CHECK_OK(ina_json_get_bool_opt(cfg, "absent", path, 1, &b));
  CHECK(b == 1);
  CHECK_OK(ina_json_get_bool_opt(cfg, "moe", path, 0, &b));
  CHECK(b == 1);
  CHECK_OK(ina_json_get_string_opt(cfg, "absent", path, "dflt", &s));
  CHECK(s && strcmp(s, "dflt") == 0);
  CHECK_OK(ina_json_get_string_opt(cfg, "name", path, "dflt", &s));
  CHECK(s && strcmp(s, "deepseek_v3") == 0);
  CHECK(ina_last_error()[0] == '\0');
  /* A present value of the wrong type is still an error, and *out keeps the default. */
  i = 99;
  CHECK_FAILS_WITH(ina_json_get_int_opt(cfg, "bad_int", path, 5, &i), INA_ERR_FORMAT, path,
                   "'bad_int'");
  CHECK(i == 5);
  json_decref(cfg);
}

static void test_load_errors(const char *dir) {
  char path[512];
  json_t *j = (json_t *)&j; /* non-NULL, so that resetting *out is visible */

  io_join(path, sizeof path, dir, "absent.json");
  CHECK_FAILS_WITH(ina_json_load_file(path, &j), INA_ERR_IO, path, NULL);
  CHECK(j == NULL);

  static const struct {
    const char *text;
    const char *why; /* a word the message must contain */
  } bad[] = {
      {"", "invalid JSON"},
      {"{\"a\": 1", "invalid JSON"},
      {"{\"a\": 1} trailing", "invalid JSON"},
      {"{\"a\": 1, \"a\": 2}", "invalid JSON"},
      {"[1, 2, 3]", "got array"},
      {"\"text\"", "invalid JSON"}, /* jansson decodes only arrays and objects at the top */
      {"{\"a\": 99999999999999999999999}", "invalid JSON"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    char name[32];
    snprintf(name, sizeof name, "bad%zu.json", k);
    io_join(path, sizeof path, dir, name);
    CHECK(io_write_text(path, bad[k].text));
    j = (json_t *)&j;
    CHECK_FAILS_WITH(ina_json_load_file(path, &j), INA_ERR_FORMAT, path, bad[k].why);
    CHECK(j == NULL);
  }
}

/* Random ints, doubles, bools and strings written by jansson come back exactly. */
static void test_random_round_trip(const char *dir, test_rng_t *rng) {
  enum { N = 200 };
  char path[512];
  io_join(path, sizeof path, dir, "random.json");
  json_t *obj = json_object();
  int64_t ints[N];
  double reals[N];
  int bools[N];
  char strs[N][16];
  for (int k = 0; k < N; k++) {
    char key[32];
    ints[k] = (int64_t)test_rng_next(rng);
    reals[k] = (test_rng_uniform(rng) - 0.5) * pow(10.0, (double)test_rng_int(rng, -30, 30));
    bools[k] = (int)(test_rng_next(rng) & 1);
    for (int c = 0; c < 15; c++) strs[k][c] = (char)test_rng_int(rng, 'a', 'z');
    strs[k][15] = '\0';
    snprintf(key, sizeof key, "i%d", k);
    json_object_set_new(obj, key, json_integer(ints[k]));
    snprintf(key, sizeof key, "r%d", k);
    json_object_set_new(obj, key, json_real(reals[k]));
    snprintf(key, sizeof key, "b%d", k);
    json_object_set_new(obj, key, json_boolean(bools[k]));
    snprintf(key, sizeof key, "s%d", k);
    json_object_set_new(obj, key, json_string(strs[k]));
  }
  CHECK(json_dump_file(obj, path, JSON_REAL_PRECISION(17)) == 0);
  json_decref(obj);

  json_t *back = NULL;
  CHECK_OK(ina_json_load_file(path, &back));
  if (!back) return;
  int mismatches = 0;
  for (int k = 0; k < N; k++) {
    char key[32];
    int64_t i = 0;
    double d = 0;
    int b = -1;
    const char *s = NULL;
    snprintf(key, sizeof key, "i%d", k);
    mismatches += ina_json_get_int(back, key, path, &i) != INA_OK || i != ints[k];
    snprintf(key, sizeof key, "r%d", k);
    mismatches += ina_json_get_double(back, key, path, &d) != INA_OK || d != reals[k];
    snprintf(key, sizeof key, "b%d", k);
    mismatches += ina_json_get_bool_opt(back, key, path, -1, &b) != INA_OK || b != bools[k];
    snprintf(key, sizeof key, "s%d", k);
    mismatches += ina_json_get_string(back, key, path, &s) != INA_OK || strcmp(s, strs[k]) != 0;
  }
  CHECKF(mismatches == 0, "%d values changed in the round trip", mismatches);
  json_decref(back);
}

int main(void) {
  test_rng_t rng = {test_seed("test_json")};
  ina_log_set_quiet_errors(1);
  char *dir = io_make_temp_dir();
  test_getters(dir);
  test_load_errors(dir);
  test_random_round_trip(dir, &rng);
  io_remove_tree(dir);
  free(dir);
  return test_finish("test_json");
}
