/* Malformed checkpoints are rejected with a message naming the file and the tensor or
 * key, and nothing crashes or leaks (this test runs under ASan/UBSan in CI). Each case
 * starts from a valid checkpoint written by ina_weights_save and breaks one thing. */
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"
#include "core/safetensors.h"
#include "model/model.h"
#include "../test_util.h"

static char g_root[] = "/tmp/ina_test_ckpt_XXXXXX";

static void run(const char *fmt, const char *arg) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, fmt, arg, arg, arg);
  CHECKF(system(cmd) == 0, "%s", cmd);
}

/* A fresh valid tiny checkpoint in <root>/<name>. */
static void make_checkpoint(const char *name, ina_dtype_t dtype, char *dir, size_t n) {
  snprintf(dir, n, "%s/%s", g_root, name);
  mkdir(dir, 0755);
  ina_model_config_t cfg;
  ina_weights_t w;
  CHECK_OK(ina_model_config_builtin("tiny", &cfg));
  cfg.num_layers = 2;
  CHECK_OK(ina_weights_random(&cfg, 3, dtype, NULL, &w));
  CHECK_OK(ina_weights_save(&w, dir));
  ina_weights_release(&w);
}

typedef enum { DROP, RESHAPE, RETYPE_I32 } edit_t;

/* Rewrite dir/model.safetensors with one tensor dropped, reshaped or given an integer
 * dtype of the same byte size. */
static void edit_tensor(const char *dir, const char *name, edit_t edit) {
  char path[512], tmp[512];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  snprintf(tmp, sizeof tmp, "%s/edited.safetensors", dir);
  ina_safetensors_t *st = NULL;
  CHECK_OK(ina_safetensors_open(path, &st));
  if (!st) return;
  size_t n = ina_safetensors_count(st), k = 0;
  ina_st_write_entry_t *e = calloc(n, sizeof *e);
  for (size_t i = 0; i < n; i++) {
    const ina_st_entry_t *s = ina_safetensors_at(st, i);
    if (strcmp(s->name, name) == 0 && edit == DROP) continue;
    e[k].name = s->name;
    e[k].dtype = s->dtype;
    e[k].ndim = s->ndim;
    memcpy(e[k].shape, s->shape, sizeof e[k].shape);
    e[k].data = s->data;
    if (strcmp(s->name, name) == 0 && edit == RESHAPE) {
      e[k].shape[0] = s->shape[1];
      e[k].shape[1] = s->shape[0];
    }
    if (strcmp(s->name, name) == 0 && edit == RETYPE_I32) e[k].dtype = INA_DTYPE_I32;
    k++;
  }
  CHECK_OK(ina_safetensors_write(tmp, e, k, NULL));
  free(e);
  ina_safetensors_close(st);
  CHECK(rename(tmp, path) == 0);
}

static void expect_load_error(const char *dir, ina_status_t want, const char *needle) {
  ina_model_t *m = (ina_model_t *)1;
  ina_clear_error();
  ina_status_t st = ina_model_open(dir, NULL, &m);
  CHECKF(st == want, "%s: status %d (%s), want %d", dir, st, ina_last_error(), want);
  CHECK(m == NULL);
  CHECKF(strstr(ina_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", dir, ina_last_error(), needle);
  CHECKF(strstr(ina_last_error(), dir) != NULL, "message '%s' lacks the path %s", ina_last_error(), dir);
}

int main(void) {
  char dir[512];
  CHECK(mkdtemp(g_root) != NULL);
  ina_log_set_quiet_errors(1);

  make_checkpoint("missing_expert", INA_DTYPE_F32, dir, sizeof dir);
  edit_tensor(dir, "model.layers.1.mlp.experts.3.up_proj.weight", DROP);
  expect_load_error(dir, INA_ERR_NOT_FOUND, "model.layers.1.mlp.experts.3.up_proj.weight");

  make_checkpoint("missing_head", INA_DTYPE_BF16, dir, sizeof dir);
  edit_tensor(dir, "lm_head.weight", DROP);
  expect_load_error(dir, INA_ERR_NOT_FOUND, "lm_head.weight");

  make_checkpoint("wrong_shape", INA_DTYPE_F32, dir, sizeof dir);
  edit_tensor(dir, "model.layers.0.self_attn.kv_b_proj.weight", RESHAPE);
  expect_load_error(dir, INA_ERR_FORMAT, "model.layers.0.self_attn.kv_b_proj.weight");

  make_checkpoint("int_dtype", INA_DTYPE_F32, dir, sizeof dir);
  edit_tensor(dir, "model.norm.weight", RETYPE_I32);
  expect_load_error(dir, INA_ERR_FORMAT, "model.norm.weight");

  make_checkpoint("fp8_no_scale", INA_DTYPE_FP8_E4M3, dir, sizeof dir);
  edit_tensor(dir, "model.layers.1.self_attn.o_proj.weight_scale_inv", DROP);
  expect_load_error(dir, INA_ERR_FORMAT, "model.layers.1.self_attn.o_proj.weight_scale_inv");

  make_checkpoint("fp8_scale_shape", INA_DTYPE_FP8_E4M3, dir, sizeof dir);
  edit_tensor(dir, "model.layers.0.mlp.down_proj.weight_scale_inv", RESHAPE);
  expect_load_error(dir, INA_ERR_FORMAT, "model.layers.0.mlp.down_proj.weight_scale_inv");

  make_checkpoint("no_config", INA_DTYPE_F32, dir, sizeof dir);
  run("rm %s/config.json", dir);
  expect_load_error(dir, INA_ERR_IO, "config.json");

  make_checkpoint("garbled_config", INA_DTYPE_F32, dir, sizeof dir);
  run("printf '{\"model_type\": \"deepseek_v3\", \"hidden' > %s/config.json", dir);
  expect_load_error(dir, INA_ERR_FORMAT, "config.json");

  make_checkpoint("truncated_weights", INA_DTYPE_F32, dir, sizeof dir);
  run("truncate -s 100000 %s/model.safetensors", dir);
  expect_load_error(dir, INA_ERR_FORMAT, "model.safetensors");

  make_checkpoint("garbage_weights", INA_DTYPE_F32, dir, sizeof dir);
  run("head -c 4096 /dev/urandom > %s/model.safetensors", dir);
  expect_load_error(dir, INA_ERR_FORMAT, "model.safetensors");

  make_checkpoint("no_weights", INA_DTYPE_F32, dir, sizeof dir);
  run("rm %s/model.safetensors", dir);
  expect_load_error(dir, INA_ERR_NOT_FOUND, "safetensors");

  /* a valid one still loads after all that */
  make_checkpoint("valid", INA_DTYPE_FP8_E4M3, dir, sizeof dir);
  ina_model_t *m = NULL;
  CHECK_OK(ina_model_open(dir, NULL, &m));
  ina_model_destroy(m);

  ina_log_set_quiet_errors(0);
  run("rm -rf %s", g_root);
  return test_finish("test_checkpoint_errors");
}
