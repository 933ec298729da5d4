/* The built-in tokenizer agrees with the built-in models of model/config.c: every
 * built-in name whose vocabulary is 1024 ids has it (1024 ids, BOS and EOS at the
 * config's ids), every other built-in name is refused with INA_ERR_NOT_FOUND and a
 * message that names it. The tokenizer keeps its own table (it sits below model/), so
 * a new built-in model must be added to both; this test notices when it is not. */
#include "tests/test_util.h"

#include <string.h>

#include "core/log.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

int main(void) {
  const char *const *names = ina_model_config_builtin_names();
  for (int i = 0; names[i]; i++) {
    ina_model_config_t c;
    CHECK_OK(ina_model_config_builtin(names[i], &c));
    ina_tokenizer_t *tok = (ina_tokenizer_t *)(uintptr_t)1;
    ina_log_set_quiet_errors(1);
    const ina_status_t st = ina_tokenizer_builtin(names[i], &tok);
    ina_log_set_quiet_errors(0);
    if (c.vocab_size == 1024) {
      CHECKF(st == INA_OK && tok, "%s: %s", names[i], ina_last_error());
      if (st != INA_OK) continue;
      CHECKF(ina_tokenizer_vocab_size(tok) == c.vocab_size, "%s: %d ids", names[i], ina_tokenizer_vocab_size(tok));
      CHECKF(ina_tokenizer_bos_id(tok) == c.bos_token_id && ina_tokenizer_eos_id(tok) == c.eos_token_id,
             "%s: BOS %d EOS %d, config %d %d", names[i], ina_tokenizer_bos_id(tok), ina_tokenizer_eos_id(tok),
             c.bos_token_id, c.eos_token_id);
      ina_tokenizer_destroy(tok);
    } else {
      CHECKF(st == INA_ERR_NOT_FOUND && tok == NULL, "%s (vocabulary %d): status %d", names[i], c.vocab_size, (int)st);
      CHECKF(strstr(ina_last_error(), names[i]) != NULL, "%s: message '%s'", names[i], ina_last_error());
    }
  }
  return test_finish("test_tokenizer_builtin");
}
