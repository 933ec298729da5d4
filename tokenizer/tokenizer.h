/* The checkpoint's tokenizer: Hugging Face `tokenizer.json` (byte-level BPE, as DeepSeek's
 * models use) plus `tokenizer_config.json` (BOS / EOS, added tokens, the chat template).
 *
 * What it runs, in the order Hugging Face `tokenizers` runs it: the added tokens are split
 * out of the text first (special or not, with their lstrip / rstrip / normalized /
 * single_word flags); the rest goes through the normalizer (null, NFC, NFKC, Sequence of
 * those), the pre-tokenizer (null, Sequence, Split by a regex or a literal with its
 * behavior and invert, ByteLevel with add_prefix_space / use_regex, Digits with
 * individual_digits) and the BPE model (merges as "a b" strings or as [a, b] pairs,
 * ignore_merges, byte_fallback, unk_token, continuing_subword_prefix /
 * end_of_word_suffix empty); the post-processor (null, TemplateProcessing with one
 * sequence, ByteLevel) adds BOS where the checkpoint asks for it. Decoding runs the
 * ByteLevel decoder (or the Sequence of ByteFallback / Fuse / Strip / Replace that some
 * checkpoints use). A component or option outside this list is refused at load with
 * INA_ERR_UNSUPPORTED and a message naming it and where it sits in the file ("tokenizer.json:
 * pre_tokenizer.pretokenizers[1]: type 'Metaspace' is not supported"); a malformed file
 * with INA_ERR_FORMAT and its place. Regexes run through PCRE2 (UTF mode, Unicode
 * properties), normalization through utf8proc.
 *
 * Invalid UTF-8 in the input text is encoded as the `tokenizers` library does for Rust
 * strings made with from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD.
 *
 * Where ina and `tokenizers` part (tests/tokenizer/check_hf_tokenizers.py measures the
 * rest equal): regex classes and normalization follow PCRE2's and utf8proc's Unicode
 * tables, so characters newer than those may split or normalize differently; an
 * unk_token missing from the vocabulary is refused at load (`tokenizers` fails at the
 * first unknown character); out-of-range ids are refused by decode (`tokenizers` drops
 * them). Oniguruma's regex syntax is read as `tokenizers` reads it: \s, \w, \uHHHH and
 * script properties are rewritten to PCRE2's spelling of the same sets.
 *
 * Ownership: the caller owns every buffer it passes; outputs the library allocates are
 * malloc'ed and freed by the caller with free(). A failed constructor sets *out = NULL;
 * destroying NULL is a no-op. Thread safety: a loaded tokenizer is immutable; encode,
 * decode and the lookups may run concurrently from any threads. A detokenizer stream is
 * used by one thread at a time. */
#ifndef INA_TOKENIZER_TOKENIZER_H
#define INA_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_tokenizer ina_tokenizer_t;

/* dir/tokenizer.json, and dir/tokenizer_config.json when present (BOS / EOS names,
 * add_bos_token, the chat template). */
ina_status_t ina_tokenizer_load_dir(const char *dir, ina_tokenizer_t **out);
/* The same from memory; config_json may be NULL. `origin` names the source in messages
 * ("tokenizer.json" when NULL). */
ina_status_t ina_tokenizer_load_json(const char *tokenizer_json, size_t tokenizer_len, const char *config_json,
                                     size_t config_len, const char *origin, ina_tokenizer_t **out);
/* The built-in tokenizer of the built-in models (a small byte-level BPE of 1024 ids whose
 * ids 0 and 1 are BOS and EOS, as tiny's config says). */
ina_status_t ina_tokenizer_builtin(const char *model_name, ina_tokenizer_t **out);
void ina_tokenizer_destroy(ina_tokenizer_t *tok);

/* Number of ids (the model vocabulary and the added tokens): every id encode returns is
 * below it. It is the largest id + 1; an id below it without a token (a gap in the
 * vocabulary) has id_to_token NULL and is refused by decode. */
int32_t ina_tokenizer_vocab_size(const ina_tokenizer_t *tok);
/* BOS / EOS ids from tokenizer_config.json (or the built-in's), -1 when there is none. */
int32_t ina_tokenizer_bos_id(const ina_tokenizer_t *tok);
int32_t ina_tokenizer_eos_id(const ina_tokenizer_t *tok);
/* The id of a token's exact string (added tokens included), -1 when there is none. */
int32_t ina_tokenizer_token_to_id(const ina_tokenizer_t *tok, const char *token);
/* The token string of an id (as stored in the vocabulary, e.g. ByteLevel's "Ġ"), NULL
 * when out of range or unused. An added token with normalized=true gives its normalized
 * content, as `tokenizers` does (token_to_id takes the content as written). Owned by the
 * tokenizer. */
const char *ina_tokenizer_id_to_token(const ina_tokenizer_t *tok, int32_t id);
/* 1 when id is a special added token (decode skips them when asked). */
int ina_tokenizer_is_special(const ina_tokenizer_t *tok, int32_t id);
/* tokenizer_config.json's chat_template (the default one when it is a list), NULL when
 * none. Owned by the tokenizer. */
const char *ina_tokenizer_chat_template(const ina_tokenizer_t *tok);

/* Text (UTF-8, `len` bytes, need not be NUL-terminated) to ids. add_special: run the
 * post-processor (BOS as the checkpoint asks), as `encode(text, add_special_tokens=True)`.
 * *ids is malloc'ed (never NULL on success, even for 0 ids). */
ina_status_t ina_tokenizer_encode(const ina_tokenizer_t *tok, const char *text, size_t len, int add_special,
                                  int32_t **ids, size_t *num_ids);
/* Several texts at once over the pool (NULL: the caller's thread): ids[i], num_ids[i] as
 * ina_tokenizer_encode gives them. On failure every output is freed and set to NULL / 0,
 * and the message (ina_last_error on the calling thread) names the first failed text.
 * The pool runs one parallel_for at a time: callers sharing a pool serialize. */
ina_status_t ina_tokenizer_encode_batch(const ina_tokenizer_t *tok, const char *const *texts, const size_t *lens,
                                        size_t count, int add_special, ina_threadpool_t *pool, int32_t **ids,
                                        size_t *num_ids);
/* Ids to text, as `decode(ids, skip_special_tokens=skip_special)`. Bytes that do not form
 * valid UTF-8 come out as U+FFFD, as `tokenizers` does. *text is malloc'ed and
 * NUL-terminated; *len excludes the NUL. An id out of range: INA_ERR_INVALID_ARGUMENT. */
ina_status_t ina_tokenizer_decode(const ina_tokenizer_t *tok, const int32_t *ids, size_t num_ids, int skip_special,
                                  char **text, size_t *len);

/* Streaming detokenization for generated tokens: push each id as it is sampled and get
 * the text it completes. Text is emitted only in whole UTF-8 characters (a token that
 * ends inside a character holds its bytes until the next completes it), and the
 * concatenation of every push's output and the final flush equals
 * ina_tokenizer_decode of all the ids (the decoder's whole-sequence steps, such as a
 * leading-space strip, are applied as decode applies them). */
typedef struct ina_detokenizer ina_detokenizer_t;
ina_status_t ina_detokenizer_create(const ina_tokenizer_t *tok, int skip_special, ina_detokenizer_t **out);
void ina_detokenizer_destroy(ina_detokenizer_t *d);
/* The newly completed text in *text (malloc'ed, NUL-terminated; "" when the id completes
 * nothing yet). An id out of range: INA_ERR_INVALID_ARGUMENT, the stream unchanged.
 * Each push costs the token's length for a ByteLevel decoder (DeepSeek's) or none;
 * other decoder chains decode the ids so far again (a cost that grows with the length). */
ina_status_t ina_detokenizer_push(ina_detokenizer_t *d, int32_t id, char **text, size_t *len);
/* What is left at the end (held bytes of an unfinished character, as U+FFFD). */
ina_status_t ina_detokenizer_flush(ina_detokenizer_t *d, char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
