/* Fuzz target: text through fixed tokenizers. The first byte picks the tokenizer (and
 * the rest is the text):
 *  - even: the built-in tokenizer (DeepSeek-V3's pre-tokenizer regexes, ByteLevel, BOS /
 *    EOS added tokens);
 *  - odd: a small tokenizer of every other kind of component: NFKC, a Sequence of Split
 *    (several behaviors, invert), Digits and ByteLevel with GPT-2's regex, added tokens
 *    with lstrip / rstrip / single_word / normalized, a template BOS, and a
 *    non-byte-level BPE with byte_fallback under a Replace / ByteFallback / Fuse / Strip
 *    decoder.
 *
 * It traps unless encode succeeds with every id below the vocabulary size (with and
 * without the post-processor); decode of those ids succeeds; the streaming detokenizer
 * emits whole characters adding up to the decode (skip_special off and on); a batch of
 * the text gives the same ids; and, for the built-in tokenizer, decode(encode(text)) is
 * the text with invalid UTF-8 replaced by U+FFFD (byte-level BPE loses nothing). The
 * text's bytes read as ids also stream equal to their decode. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_tokenizer.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ina_tokenizer_t *g_builtin, *g_mixed;

static const char kMixed[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
    "\"added_tokens\":["
    "{\"id\":20,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
    "{\"id\":21,\"content\":\"<U>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":false,\"normalized\":false,\"special\":true},"
    "{\"id\":22,\"content\":\"<A>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":true,\"normalized\":false,\"special\":true},"
    "{\"id\":23,\"content\":\"ab\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":false},"
    "{\"id\":24,\"content\":\"\\ufb01\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":true,\"special\":false}],"
    "\"normalizer\":{\"type\":\"NFKC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"behavior\":\"MergedWithNext\",\"invert\":false},"
    "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Removed\",\"invert\":false},"
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{L}+\"},\"behavior\":\"MergedWithPrevious\",\"invert\":true},"
    "{\"type\":\"Digits\",\"individual_digits\":false}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],"
    "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[20],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"_\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":1}]},"
    "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"vocab\":{"
    "\"<unk>\":0,\"a\":1,\"b\":2,\"c\":3,\" \":4,\"1\":5,\"2\":6,\"12\":7,\"ab\":8,\"abc\":9,\"_\":10,"
    "\"<0xE4>\":11,\"<0xB8>\":12,\"<0xAD>\":13,\"<0xF0>\":14,\"<0x9F>\":15,\"<0x98>\":16,\"<0x80>\":17,\"<0x0A>\":18,"
    "\" a\":19},\"merges\":[\"a b\",\"ab c\",\"1 2\",[\" \",\"a\"]]}}";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  ina_log_set_quiet_errors(1);
  FUZZ_REQUIRE(ina_tokenizer_builtin("tiny", &g_builtin) == INA_OK, "built-in: %s", ina_last_error());
  FUZZ_REQUIRE(ina_tokenizer_load_json(kMixed, sizeof kMixed - 1, NULL, 0, "fuzz/mixed.json", &g_mixed) == INA_OK,
               "mixed tokenizer: %s", ina_last_error());
  /* The tokenizers live for the process; free them at exit for LeakSanitizer. */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const int mixed = data[0] & 1;
  const ina_tokenizer_t *tok = mixed ? g_mixed : g_builtin;
  fuzz_tokenizer_check_text(tok, (const char *)data + 1, size - 1, 0, !mixed);
  fuzz_tokenizer_check_stream_of_bytes(tok, data + 1, size - 1);
  return 0;
}
