/* The `ina` commands' text side: the tokenizer of a model spec (a checkpoint directory's
 * tokenizer.json, or a built-in model's own), prompts from text, and printing token ids
 * as text. Each returns 0 on success and prints the problem to stderr otherwise. */
#ifndef INA_TOOLS_CLI_TOKENIZER_H
#define INA_TOOLS_CLI_TOKENIZER_H

#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* `command` prefixes messages ("ina generate"). */
int cli_tokenizer_open(const char *command, const char *model_spec, ina_tokenizer_t **out);
/* Text to ids with the checkpoint's special tokens (BOS where it asks for one), as a
 * completions prompt is tokenized; malloc'ed (caller frees). At least one id. */
int cli_tokenize_prompt(const char *command, const ina_tokenizer_t *tok, const char *text, int32_t **ids,
                        int32_t *count);
/* Prints ids as text (special tokens skipped) after `label`, then a newline. */
int cli_print_text(const char *command, const ina_tokenizer_t *tok, const char *label, const int32_t *ids,
                   int32_t count);

#endif
