#define INA_LOG_SUBSYS "model"
#include "model/model.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/check.h"
#include "core/log.h"

#define MODEL_OPTIONS_V1_SIZE (offsetof(ina_model_options_t, shard) + sizeof(ina_shard_t))

struct ina_model {
  ina_weights_t weights;
  char source[256];
  int checkpoint;       /* loaded from a checkpoint directory (else seeded random weights) */
  int random_on_device; /* weights left for a device engine: seed and dtype below */
  uint64_t seed;
  ina_dtype_t dtype;
};

/* options->random_on_device when the caller's struct has it (version 2). */
static int wants_random_on_device(const ina_model_options_t *o) {
  return o->struct_size >= offsetof(ina_model_options_t, random_on_device) + sizeof(int32_t) &&
         o->random_on_device != 0;
}

static int is_directory(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_builtin(const char *name) {
  for (const char *const *n = ina_model_config_builtin_names(); *n; n++)
    if (strcmp(*n, name) == 0) return 1;
  return 0;
}

ina_status_t ina_model_spec_config(const char *spec, ina_model_config_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(out != NULL && spec != NULL, INA_ERR_INVALID_ARGUMENT, "model: NULL argument");
  if (is_directory(spec)) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", spec);
    INA_CHECK(ina_model_config_load(path, out));
  } else {
    const char *name = strncmp(spec, "random:", 7) == 0 ? spec + 7 : spec;
    INA_REQUIRE(is_builtin(name), INA_ERR_NOT_FOUND,
                "model '%s' is neither a checkpoint directory nor a built-in model (tiny, "
                "random:tiny, random:v2-lite, random:v3-layers, random:v3.2-tiny, random:v3.2-layers)", spec);
    INA_CHECK(ina_model_config_builtin(name, out));
  }
fail:
  return st;
}

ina_status_t ina_model_open(const char *spec, const ina_model_options_t *options, ina_model_t **out) {
  ina_status_t st = INA_OK;
  ina_model_t *m = NULL;
  const ina_model_options_t defaults = INA_MODEL_OPTIONS_INIT;
  INA_REQUIRE(out != NULL && spec != NULL, INA_ERR_INVALID_ARGUMENT, "model: NULL argument");
  *out = NULL;
  if (!options) options = &defaults;
  INA_REQUIRE_VERSIONED(options, MODEL_OPTIONS_V1_SIZE, "model options", "INA_MODEL_OPTIONS_INIT");
  m = calloc(1, sizeof *m);
  INA_CHECK_ALLOC(m);
  snprintf(m->source, sizeof m->source, "%s", spec);
  if (is_directory(spec)) {
    INA_LOG_I(INA_LOG_SUBSYS, "loading checkpoint %s", spec);
    INA_CHECK(ina_weights_load(spec, &options->shard, &m->weights));
    m->checkpoint = 1;
  } else {
    const char *name = strncmp(spec, "random:", 7) == 0 ? spec + 7 : spec;
    ina_model_config_t cfg;
    /* Look the name up first so an unknown spec records one error, this one. */
    INA_REQUIRE(is_builtin(name), INA_ERR_NOT_FOUND,
                "model '%s' is neither a checkpoint directory nor a built-in model (tiny, "
                "random:tiny, random:v2-lite, random:v3-layers, random:v3.2-tiny, random:v3.2-layers)", spec);
    INA_CHECK(ina_model_config_builtin(name, &cfg));
    if (wants_random_on_device(options)) {
      INA_LOG_I(INA_LOG_SUBSYS, "random weights for '%s' (seed %llu, %s) left for the device engine", name,
                (unsigned long long)options->seed, ina_dtype_name(options->dtype));
      INA_CHECK(ina_weights_random_shell(&cfg, options->dtype, &options->shard, &m->weights));
      m->random_on_device = 1;
      m->seed = options->seed;
      m->dtype = options->dtype;
    } else {
      INA_LOG_I(INA_LOG_SUBSYS, "building random weights for '%s' (seed %llu, %s)", name,
                (unsigned long long)options->seed, ina_dtype_name(options->dtype));
      INA_CHECK(ina_weights_random(&cfg, options->seed, options->dtype, &options->shard, &m->weights));
    }
  }
  *out = m;
  return INA_OK;
fail:
  ina_model_destroy(m);
  return st;
}

void ina_model_destroy(ina_model_t *m) {
  if (!m) return;
  ina_weights_release(&m->weights);
  free(m);
}

const ina_model_config_t *ina_model_config(const ina_model_t *m) { return &m->weights.config; }
const ina_weights_t *ina_model_weights(const ina_model_t *m) { return &m->weights; }

int ina_model_from_checkpoint(const ina_model_t *model) { return model && model->checkpoint; }

int ina_model_random_on_device(const ina_model_t *m, uint64_t *seed, ina_dtype_t *dtype) {
  if (!m->random_on_device) return 0;
  if (seed) *seed = m->seed;
  if (dtype) *dtype = m->dtype;
  return 1;
}

int64_t ina_model_weight_bytes(const ina_model_t *m) {
  if (m->random_on_device) return ina_weights_random_bytes(&m->weights, m->dtype);
  ina_weight_spec_t *specs = NULL;
  int32_t count = 0;
  int64_t bytes = 0;
  if (ina_weight_specs((ina_weights_t *)&m->weights, &specs, &count) != INA_OK) return -1;
  for (int32_t i = 0; i < count; i++) {
    bytes += (int64_t)ina_tensor_nbytes(specs[i].tensor);
    if (specs[i].linear) bytes += (int64_t)ina_tensor_nbytes(&specs[i].linear->scale_inv);
  }
  free(specs);
  return bytes;
}
