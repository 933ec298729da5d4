/* The `ina` commands' text side (cli_tokenizer.h). */
#include "tools/cli_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"

int cli_tokenizer_open(const char *command, const char *model_spec, ina_tokenizer_t **out) {
  struct stat sb;
  const int dir = stat(model_spec, &sb) == 0 && S_ISDIR(sb.st_mode);
  const char *name = strncmp(model_spec, "random:", 7) == 0 ? model_spec + 7 : model_spec;
  const ina_status_t st = dir ? ina_tokenizer_load_dir(model_spec, out) : ina_tokenizer_builtin(name, out);
  if (st != INA_OK) {
    fprintf(stderr, "%s: no tokenizer for model '%s': %s\n", command, model_spec, ina_last_error());
    return 1;
  }
  return 0;
}

int cli_tokenize_prompt(const char *command, const ina_tokenizer_t *tok, const char *text, int32_t **ids,
                        int32_t *count) {
  size_t n = 0;
  if (ina_tokenizer_encode(tok, text, strlen(text), 1, ids, &n) != INA_OK) {
    fprintf(stderr, "%s: cannot tokenize the prompt: %s\n", command, ina_last_error());
    return 1;
  }
  if (n == 0) {
    free(*ids);
    *ids = NULL;
    fprintf(stderr, "%s: the prompt '%s' is empty after tokenization\n", command, text);
    return 1;
  }
  *count = (int32_t)n;
  return 0;
}

int cli_print_text(const char *command, const ina_tokenizer_t *tok, const char *label, const int32_t *ids,
                   int32_t count) {
  char *text = NULL;
  size_t len = 0;
  if (ina_tokenizer_decode(tok, ids, (size_t)count, 1, &text, &len) != INA_OK) {
    fprintf(stderr, "%s: cannot decode the output: %s\n", command, ina_last_error());
    return 1;
  }
  printf("%s", label);
  fwrite(text, 1, len, stdout);
  printf("\n");
  free(text);
  return 0;
}
