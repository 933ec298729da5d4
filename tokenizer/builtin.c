/* The built-in tokenizer of the built-in models: builtin_tiny.json (trained by
 * make_builtin.py) and builtin_tiny_config.json, embedded at build time.
 *
 * The table mirrors model/config.c's built-in models (the tokenizer sits below model/
 * and cannot ask it); tests/tokenizer/test_tokenizer_builtin checks the two agree. Only
 * the models with a vocabulary of 1024 have a built-in tokenizer: the others take the
 * real checkpoint's tokenizer.json. */
#define INA_LOG_SUBSYS "tokenizer"
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"

static const struct {
  const char *name;
  int32_t vocab_size;
} kBuiltins[] = {
    {"tiny", 1024}, {"v3.2-tiny", 1024}, {"v2-lite", 102400}, {"v3-layers", 129280}, {"v3.2-layers", 129280},
};

ina_status_t ina_tokenizer_builtin(const char *model_name, ina_tokenizer_t **out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_builtin: out is NULL");
  *out = NULL;
  INA_REQUIRE(model_name != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_builtin: model_name is NULL");
  for (size_t i = 0; i < sizeof kBuiltins / sizeof kBuiltins[0]; i++) {
    if (strcmp(model_name, kBuiltins[i].name) != 0) continue;
    INA_REQUIRE(kBuiltins[i].vocab_size == 1024, INA_ERR_NOT_FOUND,
                "built-in model '%s' has a vocabulary of %d ids and no built-in tokenizer (only the built-ins with "
                "1024 ids have one): load its checkpoint's tokenizer.json",
                model_name, (int)kBuiltins[i].vocab_size);
    return ina_tokenizer_load_json((const char *)ina_tk_builtin_tiny_json, ina_tk_builtin_tiny_json_len,
                                   (const char *)ina_tk_builtin_tiny_config_json, ina_tk_builtin_tiny_config_json_len,
                                   "builtin:tiny/tokenizer.json", out);
  }
  INA_REQUIRE(0, INA_ERR_NOT_FOUND, "no built-in tokenizer for '%s' (built-in models: tiny, v3.2-tiny, v2-lite, "
              "v3-layers, v3.2-layers)", model_name);
fail:
  return st;
}
