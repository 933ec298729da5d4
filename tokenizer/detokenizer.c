/* Streaming detokenization: text in whole UTF-8 characters as ids arrive, adding up to
 * ina_tokenizer_decode of all of them.
 *
 * Three ways, by decoder:
 *  - a lone ByteLevel decoder (DeepSeek's): decode is from_utf8_lossy of the tokens'
 *    bytes one after the other, and that conversion decides each character or each
 *    ill-formed subpart from the bytes up to its end. So each push converts what it
 *    can and holds only a trailing prefix of a character that later bytes may complete;
 *    flush converts the held bytes (one U+FFFD).
 *  - no decoder: the tokens joined by spaces, which each push can emit at once.
 *  - any other chain (ByteFallback, Fuse, Strip, Replace): the ids so far are decoded
 *    again at every push, and the text past what was emitted goes out except trailing
 *    U+FFFD characters and what a ByteFallback run still open makes, both of which
 *    later tokens may change. For the
 *    chains `tokenizers` checkpoints use (per-token maps, byte runs, a leading-space
 *    strip) a longer sequence's decode extends a shorter one's, so what was emitted
 *    stays a prefix; the cost grows with the length, which these rarer checkpoints
 *    accept. */
#define INA_LOG_SUBSYS "tokenizer"
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"

typedef enum { MODE_BYTE_LEVEL, MODE_JOIN, MODE_REDECODE } mode_t_;

struct ina_detokenizer {
  const ina_tokenizer_t *tok;
  int skip_special;
  mode_t_ mode;
  tk_buf_t held;  /* MODE_BYTE_LEVEL: bytes of an unfinished character */
  size_t pushed;  /* MODE_JOIN: tokens emitted so far */
  int32_t *ids;   /* MODE_REDECODE: every id so far */
  size_t num_ids, cap_ids;
  size_t emitted; /* MODE_REDECODE: bytes of the decode already returned */
};

ina_status_t ina_detokenizer_create(const ina_tokenizer_t *tok, int skip_special, ina_detokenizer_t **out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_detokenizer_create: out is NULL");
  *out = NULL;
  INA_REQUIRE(tok != NULL, INA_ERR_INVALID_ARGUMENT, "ina_detokenizer_create: tok is NULL");
  ina_detokenizer_t *d = calloc(1, sizeof *d);
  INA_CHECK_ALLOC(d);
  d->tok = tok;
  d->skip_special = skip_special;
  d->mode = tk_decoder_is_byte_level(&tok->decoder) ? MODE_BYTE_LEVEL
            : !tok->decoder.present                 ? MODE_JOIN
                                                    : MODE_REDECODE;
  *out = d;
fail:
  return st;
}

void ina_detokenizer_destroy(ina_detokenizer_t *d) {
  if (!d) return;
  tk_buf_free(&d->held);
  free(d->ids);
  free(d);
}

/* Hands out buf as a NUL-terminated malloc'ed string ("" when empty). */
static ina_status_t give(tk_buf_t *buf, char **text, size_t *len) {
  ina_status_t st = INA_OK;
  INA_CHECK(tk_buf_reserve(buf, 0));
  buf->p[buf->len] = '\0';
  *text = buf->p;
  if (len) *len = buf->len;
  memset(buf, 0, sizeof *buf);
fail:
  return st;
}

/* MODE_BYTE_LEVEL: converts d->held into out up to a trailing unfinished character. */
static ina_status_t convert_held(ina_detokenizer_t *d, tk_buf_t *out) {
  ina_status_t st = INA_OK;
  const unsigned char *u = (const unsigned char *)d->held.p;
  const size_t n = d->held.len;
  size_t i = 0, run = 0;
  while (i < n) {
    size_t adv;
    int truncated;
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    if (tk_utf8_next(u + i, n - i, &adv, &truncated) >= 0) {
      i += adv;
      continue;
    }
    if (truncated) break; /* may still become a character */
    INA_CHECK(tk_buf_append(out, d->held.p + run, i - run));
    INA_CHECK(tk_buf_append(out, "\xEF\xBF\xBD", 3));
    i += adv;
    run = i;
  }
  INA_CHECK(tk_buf_append(out, d->held.p + run, i - run));
  memmove(d->held.p, d->held.p + i, n - i);
  d->held.len = n - i;
fail:
  return st;
}

/* MODE_REDECODE: the decode of the ids so far, and how much of it may go out now.
 * ByteFallback converts a run of byte tokens as a whole (one invalid byte anywhere turns
 * every byte of the run into U+FFFD), so nothing of a run that may still grow goes out:
 * until the run ends, only the decode of the ids before it counts. */
static ina_status_t redecode(ina_detokenizer_t *d, int final, tk_buf_t *out) {
  ina_status_t st = INA_OK;
  tk_buf_t all = {0};
  size_t k = d->num_ids;
  if (!final && tk_decoder_has_byte_fallback(&d->tok->decoder)) {
    /* Back over the trailing run (special tokens that decode skips do not end it). */
    while (k > 0) {
      const int32_t id = d->ids[k - 1];
      if (!(d->skip_special && d->tok->special[id]) && !tk_is_fallback_token(d->tok, id)) break;
      k--;
    }
  }
  INA_CHECK(tk_decode_ids(d->tok, d->ids, k, d->skip_special, &all));
  size_t stable = all.len;
  if (!final)
    while (stable >= 3 && memcmp(all.p + stable - 3, "\xEF\xBF\xBD", 3) == 0) stable -= 3;
  if (stable > d->emitted) {
    INA_CHECK(tk_buf_append(out, all.p + d->emitted, stable - d->emitted));
    d->emitted = stable;
  }
fail:
  tk_buf_free(&all);
  return st;
}

ina_status_t ina_detokenizer_push(ina_detokenizer_t *d, int32_t id, char **text, size_t *len) {
  ina_status_t st = INA_OK;
  tk_buf_t out = {0};
  INA_REQUIRE(text != NULL, INA_ERR_INVALID_ARGUMENT, "ina_detokenizer_push: text is NULL");
  *text = NULL;
  if (len) *len = 0;
  INA_REQUIRE(d != NULL, INA_ERR_INVALID_ARGUMENT, "ina_detokenizer_push: d is NULL");
  const ina_tokenizer_t *tok = d->tok;
  INA_REQUIRE(id >= 0 && id < tok->num_ids && tok->tokens[id] != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_detokenizer_push: %d is not a token id (vocabulary of %d)", id, tok->num_ids);
  const int skip = d->skip_special && tok->special[id];
  switch (d->mode) {
  case MODE_BYTE_LEVEL:
    if (!skip) {
      INA_CHECK(tk_byte_level_token_bytes(tok->tokens[id], tok->token_lens[id], &d->held));
      INA_CHECK(convert_held(d, &out));
    }
    break;
  case MODE_JOIN:
    if (!skip) {
      if (d->pushed++) INA_CHECK(tk_buf_append(&out, " ", 1));
      INA_CHECK(tk_buf_append(&out, tok->tokens[id], tok->token_lens[id]));
    }
    break;
  case MODE_REDECODE:
    if (d->num_ids == d->cap_ids) {
      const size_t cap = d->cap_ids ? d->cap_ids * 2 : 64;
      int32_t *p = realloc(d->ids, cap * sizeof *p);
      INA_CHECK_ALLOC(p);
      d->ids = p;
      d->cap_ids = cap;
    }
    d->ids[d->num_ids++] = id;
    INA_CHECK(redecode(d, 0, &out));
    break;
  }
  INA_CHECK(give(&out, text, len));
  return INA_OK;
fail:
  tk_buf_free(&out);
  return st;
}

ina_status_t ina_detokenizer_flush(ina_detokenizer_t *d, char **text, size_t *len) {
  ina_status_t st = INA_OK;
  tk_buf_t out = {0};
  INA_REQUIRE(text != NULL, INA_ERR_INVALID_ARGUMENT, "ina_detokenizer_flush: text is NULL");
  *text = NULL;
  if (len) *len = 0;
  INA_REQUIRE(d != NULL, INA_ERR_INVALID_ARGUMENT, "ina_detokenizer_flush: d is NULL");
  if (d->mode == MODE_BYTE_LEVEL) {
    INA_CHECK(tk_utf8_lossy(&out, d->held.p ? d->held.p : "", d->held.len));
    d->held.len = 0;
  } else if (d->mode == MODE_REDECODE) {
    INA_CHECK(redecode(d, 1, &out));
  }
  INA_CHECK(give(&out, text, len));
  return INA_OK;
fail:
  tk_buf_free(&out);
  return st;
}
