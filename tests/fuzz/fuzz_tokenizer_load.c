/* Fuzz target: a checkpoint's tokenizer.json, as ina_tokenizer_load_json reads it. Each
 * input is the file's text.
 *
 * It traps unless:
 *  - a failed load returns INA_ERR_FORMAT or INA_ERR_UNSUPPORTED with *out NULL and a
 *    message naming the file;
 *  - a loaded tokenizer encodes a few fixed texts (mixed scripts, whitespace runs,
 *    digits, invalid UTF-8, the text of its own first tokens) into ids below its vocabulary
 *    size, or fails only on a regex resource limit (a hostile pattern may backtrack
 *    without end; PCRE2's match limit stops it), and decodes them;
 *  - the streaming detokenizer of those ids, and of ids drawn from the input's bytes,
 *    emits whole characters only and adds up to the decode;
 *  - the lookups agree: token_to_id(id_to_token(id)), when it finds an id, finds one
 *    whose token is that string.
 * Everything is freed (LeakSanitizer checks). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_files.h"
#include "tests/fuzz/fuzz_tokenizer.h"
#include "tokenizer/tokenizer.h"

#define NAME "fuzz/tokenizer.json"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_files_init();
  return 0;
}

static const ina_status_t kFailures[] = {INA_ERR_FORMAT, INA_ERR_UNSUPPORTED, INA_OK};

static const char *const kTexts[] = {
    "Hello, world! It's 2026: 12345 tokens.\n\n  indented\ttab\r\n",
    "\xE4\xB8\xAD\xE6\x96\x87 \xD0\xBF\xD1\x80\xD0\xB8 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 \xEF\xAC\x81",
    "bad \xff\xfe utf-8 \xe2\x82 end",
    "",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ina_tokenizer_t *tok = (ina_tokenizer_t *)(uintptr_t)1;
  ina_clear_error();
  const ina_status_t st = ina_tokenizer_load_json((const char *)data, size, NULL, 0, NAME, &tok);
  if (st != INA_OK) {
    FUZZ_REQUIRE(tok == NULL, "failed load left *out set");
    fuzz_require_error("ina_tokenizer_load_json", st, kFailures, NAME);
    return 0;
  }
  const int32_t v = ina_tokenizer_vocab_size(tok);
  FUZZ_REQUIRE(v >= 0, "vocab size %d", v);
  for (int32_t id = 0; id < v && id < 64; id++) {
    const char *t = ina_tokenizer_id_to_token(tok, id);
    if (!t) continue;
    /* Not always back to id: a normalized added token's string is its normalized form,
     * which token_to_id does not know (as in `tokenizers`). */
    const int32_t back = ina_tokenizer_token_to_id(tok, t);
    FUZZ_REQUIRE(back >= -1 && back < v, "token %d ('%s') looks up as %d", id, t, back);
    FUZZ_REQUIRE(back < 0 || strcmp(ina_tokenizer_id_to_token(tok, back), t) == 0,
                 "token %d ('%s') looks up as %d ('%s')", id, t, back, ina_tokenizer_id_to_token(tok, back));
    /* The token's own text goes through encode too. */
    fuzz_tokenizer_check_text(tok, t, strlen(t), 1, 0);
  }
  for (size_t i = 0; i < sizeof kTexts / sizeof kTexts[0]; i++)
    fuzz_tokenizer_check_text(tok, kTexts[i], strlen(kTexts[i]), 1, 0);
  fuzz_tokenizer_check_stream_of_bytes(tok, data, size > 256 ? 256 : size);
  ina_tokenizer_destroy(tok);
  return 0;
}
