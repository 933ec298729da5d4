/* Checks the tokenizer fuzz targets share (fuzz_tokenizer.c).
 *
 * fuzz_tokenizer_check_text: encodes text (with and without the post-processor) and
 * traps unless the ids are below the vocabulary size, decode of them works, the
 * streaming detokenizer adds up to the decode in whole characters, and encode_batch
 * gives the same ids. allow_regex_limit: a failure of encode on a PCRE2 resource limit
 * is accepted (a fuzzed pattern may backtrack without end). round_trip: decode must give
 * back the text (with invalid UTF-8 replaced), as a byte-level tokenizer without
 * normalizer or stripping added tokens does.
 * fuzz_tokenizer_check_stream_of_bytes: ids drawn from bytes (two per id, below the
 * vocabulary size), streamed against decode. Thread safety: none needed. */
#ifndef INA_TESTS_FUZZ_FUZZ_TOKENIZER_H
#define INA_TESTS_FUZZ_FUZZ_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

void fuzz_tokenizer_check_text(const ina_tokenizer_t *tok, const char *text, size_t len, int allow_regex_limit,
                               int round_trip);
void fuzz_tokenizer_check_stream(const ina_tokenizer_t *tok, const int32_t *ids, size_t n, int skip_special);
void fuzz_tokenizer_check_stream_of_bytes(const ina_tokenizer_t *tok, const uint8_t *data, size_t size);

#endif
