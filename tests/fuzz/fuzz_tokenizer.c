#include "tests/fuzz/fuzz_tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tests/fuzz/fuzz_check.h"

static int whole_chars(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    const unsigned char c = (unsigned char)s[i];
    const size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (k == 0 || i + k > n) return 0;
    for (size_t j = 1; j < k; j++)
      if (((unsigned char)s[i + j] & 0xC0) != 0x80) return 0;
    i += k;
  }
  return 1;
}

void fuzz_tokenizer_check_stream(const ina_tokenizer_t *tok, const int32_t *ids, size_t n, int skip_special) {
  char *want = NULL;
  size_t wl = 0;
  FUZZ_REQUIRE(ina_tokenizer_decode(tok, ids, n, skip_special, &want, &wl) == INA_OK, "decode failed: %s",
               ina_last_error());
  FUZZ_REQUIRE(want && want[wl] == '\0' && whole_chars(want, wl), "decode is not whole UTF-8 characters");
  ina_detokenizer_t *d = NULL;
  FUZZ_REQUIRE(ina_detokenizer_create(tok, skip_special, &d) == INA_OK, "detokenizer: %s", ina_last_error());
  size_t got = 0;
  for (size_t i = 0; i <= n; i++) {
    char *piece = NULL;
    size_t pl = 0;
    const ina_status_t st = i < n ? ina_detokenizer_push(d, ids[i], &piece, &pl) : ina_detokenizer_flush(d, &piece, &pl);
    FUZZ_REQUIRE(st == INA_OK && piece, "detokenizer step %zu: %s", i, ina_last_error());
    FUZZ_REQUIRE(whole_chars(piece, pl), "step %zu emitted part of a character", i);
    FUZZ_REQUIRE(got + pl <= wl && memcmp(want + got, piece, pl) == 0, "step %zu: the stream leaves the decode", i);
    got += pl;
    free(piece);
  }
  FUZZ_REQUIRE(got == wl, "the stream gave %zu of the decode's %zu bytes", got, wl);
  ina_detokenizer_destroy(d);
  free(want);
}

/* from_utf8_lossy of s. */
static char *lossy(const char *s, size_t n, size_t *out_len) {
  char *o = malloc(3 * n + 1);
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    const unsigned char c = (unsigned char)s[i];
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      o[k++] = (char)c;
      i++;
      continue;
    }
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    size_t j = 1;
    for (; need && j <= need && i + j < n; j++) {
      const unsigned char d = (unsigned char)s[i + j];
      if (d < lo || d > hi) break;
      lo = 0x80, hi = 0xBF;
    }
    if (need && j == need + 1) {
      memcpy(o + k, s + i, j);
      k += j;
    } else {
      memcpy(o + k, "\xEF\xBF\xBD", 3);
      k += 3;
    }
    i += need ? j : 1;
  }
  o[k] = '\0';
  *out_len = k;
  return o;
}

void fuzz_tokenizer_check_text(const ina_tokenizer_t *tok, const char *text, size_t len, int allow_regex_limit,
                               int round_trip) {
  const int32_t v = ina_tokenizer_vocab_size(tok);
  for (int add = 0; add < 2; add++) {
    int32_t *ids = (int32_t *)(uintptr_t)1;
    size_t n = 99;
    ina_clear_error();
    const ina_status_t st = ina_tokenizer_encode(tok, text, len, add, &ids, &n);
    if (st != INA_OK) {
      FUZZ_REQUIRE(allow_regex_limit && st == INA_ERR_INTERNAL && strstr(ina_last_error(), "PCRE2 error"),
                   "encode failed: %d %s", (int)st, ina_last_error());
      FUZZ_REQUIRE(ids == NULL && n == 0, "failed encode left its outputs set");
      return;
    }
    FUZZ_REQUIRE(ids != NULL, "ids NULL on success");
    for (size_t i = 0; i < n; i++) FUZZ_REQUIRE(ids[i] >= 0 && ids[i] < v, "id %d of %zu not below %d", ids[i], i, v);
    fuzz_tokenizer_check_stream(tok, ids, n, 0);
    fuzz_tokenizer_check_stream(tok, ids, n, 1);
    if (round_trip && !add) {
      char *back = NULL;
      size_t bl = 0, wl = 0;
      FUZZ_REQUIRE(ina_tokenizer_decode(tok, ids, n, 0, &back, &bl) == INA_OK, "decode: %s", ina_last_error());
      char *want = lossy(text, len, &wl);
      FUZZ_REQUIRE(bl == wl && memcmp(back, want, wl) == 0, "decode(encode(text)) is not the text");
      free(want);
      free(back);
    }
    /* A batch of the text twice, on the caller's thread, gives the same ids. */
    const char *texts[2] = {text, text};
    const size_t lens[2] = {len, len};
    int32_t *bids[2];
    size_t bn[2];
    FUZZ_REQUIRE(ina_tokenizer_encode_batch(tok, texts, lens, 2, add, NULL, bids, bn) == INA_OK, "batch: %s",
                 ina_last_error());
    for (int k = 0; k < 2; k++) {
      FUZZ_REQUIRE(bn[k] == n && memcmp(bids[k], ids, n * sizeof *ids) == 0, "batch differs from encode");
      free(bids[k]);
    }
    free(ids);
  }
}

void fuzz_tokenizer_check_stream_of_bytes(const ina_tokenizer_t *tok, const uint8_t *data, size_t size) {
  const int32_t v = ina_tokenizer_vocab_size(tok);
  if (v <= 0) return;
  int32_t ids[128];
  size_t n = 0;
  for (size_t i = 0; i + 1 < size && n < 128; i += 2) {
    const int32_t id = (int32_t)(((uint32_t)data[i] << 8 | data[i + 1]) % (uint32_t)v);
    if (ina_tokenizer_id_to_token(tok, id)) ids[n++] = id;
  }
  fuzz_tokenizer_check_stream(tok, ids, n, 0);
  fuzz_tokenizer_check_stream(tok, ids, n, 1);
}
