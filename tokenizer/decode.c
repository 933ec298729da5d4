/* Decoding: ids to their token strings (added tokens' contents, else the vocabulary's),
 * then the decoder chain of `tokenizers` over that list of strings: ByteLevel (each
 * token's characters back to bytes, the whole as lossy UTF-8), ByteFallback (<0xXX>
 * runs to bytes), Fuse, Strip, Replace and Sequence of them. No decoder joins the tokens
 * with spaces, as `tokenizers` does. */
#define INA_LOG_SUBSYS "tokenizer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"

/* ---- parsing ----------------------------------------------------------------------- */

static ina_status_t add_step(tk_decoder_t *d, tk_dec_kind_t kind, tk_dec_step_t **out) {
  ina_status_t st = INA_OK;
  tk_dec_step_t *s = realloc(d->steps, (d->n + 1) * sizeof *s);
  INA_CHECK_ALLOC(s);
  d->steps = s;
  *out = &d->steps[d->n++];
  memset(*out, 0, sizeof **out);
  (*out)->kind = kind;
fail:
  return st;
}

static ina_status_t get_count(const json_t *j, const char *key, const char *origin, const char *path, size_t *out) {
  ina_status_t st = INA_OK;
  const json_t *v = json_object_get(j, key);
  INA_REQUIRE(json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < (1 << 20), INA_ERR_FORMAT,
              "%s: %s.%s: expected a non-negative integer", origin, path, key);
  *out = (size_t)json_integer_value(v);
fail:
  return st;
}

static ina_status_t parse_one(const json_t *j, const char *origin, const char *path, int depth, tk_decoder_t *d) {
  ina_status_t st = INA_OK;
  tk_dec_step_t *s = NULL;
  char sub[TK_PATH_MAX];
  INA_REQUIRE(json_is_object(j), INA_ERR_FORMAT, "%s: %s: expected an object", origin, path);
  const char *type = json_string_value(json_object_get(j, "type"));
  INA_REQUIRE(type != NULL, INA_ERR_FORMAT, "%s: %s: missing string 'type'", origin, path);
  if (strcmp(type, "Sequence") == 0) {
    INA_REQUIRE(depth < 8, INA_ERR_UNSUPPORTED, "%s: %s: Sequences nested deeper than 8", origin, path);
    const json_t *list = json_object_get(j, "decoders");
    INA_REQUIRE(json_is_array(list), INA_ERR_FORMAT, "%s: %s: Sequence without a 'decoders' array", origin, path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      snprintf(sub, sizeof sub, "%s.decoders[%zu]", path, i);
      INA_CHECK(parse_one(json_array_get(list, i), origin, sub, depth + 1, d));
    }
    return INA_OK;
  }
  if (strcmp(type, "ByteLevel") == 0) return add_step(d, TK_DEC_BYTE_LEVEL, &s);
  if (strcmp(type, "ByteFallback") == 0) return add_step(d, TK_DEC_BYTE_FALLBACK, &s);
  if (strcmp(type, "Fuse") == 0) return add_step(d, TK_DEC_FUSE, &s);
  if (strcmp(type, "Strip") == 0) {
    INA_CHECK(add_step(d, TK_DEC_STRIP, &s));
    const json_t *c = json_object_get(j, "content");
    size_t adv = 0;
    INA_REQUIRE(json_is_string(c) && json_string_length(c) > 0, INA_ERR_FORMAT,
                "%s: %s.content: expected a one-character string", origin, path);
    const int32_t cp = tk_utf8_next((const unsigned char *)json_string_value(c), json_string_length(c), &adv, NULL);
    INA_REQUIRE(cp >= 0 && adv == json_string_length(c), INA_ERR_FORMAT,
                "%s: %s.content: expected a one-character string", origin, path);
    s->strip_char = (uint32_t)cp;
    INA_CHECK(get_count(j, "start", origin, path, &s->strip_start));
    INA_CHECK(get_count(j, "stop", origin, path, &s->strip_stop));
    return INA_OK;
  }
  if (strcmp(type, "Replace") == 0) {
    INA_CHECK(add_step(d, TK_DEC_REPLACE, &s));
    const json_t *c = json_object_get(j, "content");
    INA_REQUIRE(json_is_string(c), INA_ERR_FORMAT, "%s: %s.content: expected a string", origin, path);
    s->replace_len = json_string_length(c);
    s->replace_with = malloc(s->replace_len + 1);
    INA_CHECK_ALLOC(s->replace_with);
    memcpy(s->replace_with, json_string_value(c), s->replace_len + 1);
    const json_t *pat = json_object_get(j, "pattern");
    INA_REQUIRE(pat != NULL, INA_ERR_FORMAT, "%s: %s: Replace without a 'pattern'", origin, path);
    snprintf(sub, sizeof sub, "%s.pattern", path);
    INA_CHECK(tk_parse_pattern(pat, origin, sub, &s->re));
    return INA_OK;
  }
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "%s: %s: decoder type '%s' is not supported", origin, path, type);
fail:
  return st;
}

ina_status_t tk_decoder_parse(const json_t *j, const char *origin, const char *path, tk_decoder_t *out) {
  memset(out, 0, sizeof *out);
  if (!j || json_is_null(j)) return INA_OK;
  out->present = 1;
  ina_status_t st = parse_one(j, origin, path, 0, out);
  if (st != INA_OK) tk_decoder_free(out);
  return st;
}

void tk_decoder_free(tk_decoder_t *d) {
  for (size_t i = 0; i < d->n; i++) {
    tk_regex_free(&d->steps[i].re);
    free(d->steps[i].replace_with);
  }
  free(d->steps);
  memset(d, 0, sizeof *d);
}

static int fallback_byte(const char *t, size_t n);

int tk_decoder_has_byte_fallback(const tk_decoder_t *d) {
  for (size_t i = 0; i < d->n; i++)
    if (d->steps[i].kind == TK_DEC_BYTE_FALLBACK) return 1;
  return 0;
}

int tk_is_fallback_token(const ina_tokenizer_t *tok, int32_t id) {
  return fallback_byte(tok->tokens[id], tok->token_lens[id]) >= 0;
}

int tk_decoder_is_byte_level(const tk_decoder_t *d) {
  return d->present && d->n == 1 && d->steps[0].kind == TK_DEC_BYTE_LEVEL;
}

/* ---- steps ------------------------------------------------------------------------- */

ina_status_t tk_byte_level_token_bytes(const char *t, size_t n, tk_buf_t *out) {
  ina_status_t st = INA_OK;
  const size_t start = out->len;
  INA_CHECK(tk_buf_reserve(out, n));
  for (size_t i = 0; i < n;) {
    size_t adv;
    const int32_t cp = tk_utf8_next((const unsigned char *)t + i, n - i, &adv, NULL);
    const int b = cp >= 0 ? tk_cp_to_byte((uint32_t)cp) : -1;
    if (b < 0) { /* a character outside the table: the token's own bytes */
      out->len = start;
      return tk_buf_append(out, t, n);
    }
    out->p[out->len++] = (char)b;
    i += adv;
  }
  out->p[out->len] = '\0';
fail:
  return st;
}

/* A ByteFallback token "<0xXX>": its byte, or -1. Rust's u8::from_str_radix also takes a
 * leading '+' ("<0x+F>"), so that is a byte token too. */
static int fallback_byte(const char *t, size_t n) {
  if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>') return -1;
  int v = 0, digits = 0;
  for (int i = 3; i < 5; i++) {
    const char c = t[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else if (c == '+' && i == 3) continue;
    else return -1;
    v = v * 16 + d;
    digits++;
  }
  return digits ? v : -1;
}

static ina_status_t flush_bytes(tk_pieces_t *out, const tk_buf_t *bytes) {
  ina_status_t st = INA_OK;
  if (bytes->len == 0) return INA_OK;
  if (tk_utf8_valid(bytes->p, bytes->len)) return tk_pieces_text(out, bytes->p, bytes->len);
  /* Not UTF-8: one U+FFFD per byte, each its own token. */
  for (size_t i = 0; i < bytes->len; i++) INA_CHECK(tk_pieces_text(out, "\xEF\xBF\xBD", 3));
fail:
  return st;
}

/* Empty tokens are kept as pieces here (a decoder sees them), so the list is kept with
 * explicit lengths rather than tk_pieces_text, which drops them. */
static ina_status_t push_piece(tk_pieces_t *p, const char *s, size_t n) {
  ina_status_t st = INA_OK;
  const size_t off = p->text.len;
  INA_CHECK(tk_buf_append(&p->text, s, n));
  INA_CHECK(tk_pieces_range(p, off, n));
fail:
  return st;
}

static ina_status_t run_step(const tk_dec_step_t *s, tk_scratch_t *sc, const tk_pieces_t *in, tk_pieces_t *out) {
  ina_status_t st = INA_OK;
  tk_buf_t *b = &sc->buf;
  b->len = 0;
  switch (s->kind) {
  case TK_DEC_BYTE_LEVEL: {
    for (size_t i = 0; i < in->n; i++) INA_CHECK(tk_byte_level_token_bytes(in->text.p + in->v[i].off, in->v[i].len, b));
    const size_t off = out->text.len;
    INA_CHECK(tk_utf8_lossy(&out->text, b->p ? b->p : "", b->len));
    INA_CHECK(tk_pieces_range(out, off, out->text.len - off));
    break;
  }
  case TK_DEC_BYTE_FALLBACK:
    for (size_t i = 0; i < in->n; i++) {
      const char *t = in->text.p + in->v[i].off;
      const int byte = fallback_byte(t, in->v[i].len);
      if (byte >= 0) {
        const char c = (char)byte;
        INA_CHECK(tk_buf_append(b, &c, 1));
        continue;
      }
      INA_CHECK(flush_bytes(out, b));
      b->len = 0;
      INA_CHECK(push_piece(out, t, in->v[i].len));
    }
    INA_CHECK(flush_bytes(out, b));
    break;
  case TK_DEC_FUSE: {
    const size_t off = out->text.len;
    for (size_t i = 0; i < in->n; i++) INA_CHECK(tk_buf_append(&out->text, in->text.p + in->v[i].off, in->v[i].len));
    INA_CHECK(tk_pieces_range(out, off, out->text.len - off));
    break;
  }
  case TK_DEC_STRIP:
    for (size_t i = 0; i < in->n; i++) {
      const char *t = in->text.p + in->v[i].off;
      const size_t n = in->v[i].len;
      size_t a = 0, z = n, adv;
      for (size_t k = 0; k < s->strip_start && a < n; k++) {
        if ((uint32_t)tk_utf8_next((const unsigned char *)t + a, n - a, &adv, NULL) != s->strip_char) break;
        a += adv;
      }
      for (size_t k = 0; k < s->strip_stop && z > a; k++) {
        size_t j = z - 1;
        while (j > 0 && ((unsigned char)t[j] & 0xC0) == 0x80) j--;
        if ((uint32_t)tk_utf8_next((const unsigned char *)t + j, z - j, &adv, NULL) != s->strip_char) break;
        z = j;
      }
      INA_CHECK(push_piece(out, t + a, z - a));
    }
    break;
  case TK_DEC_REPLACE:
    for (size_t i = 0; i < in->n; i++) {
      const char *t = in->text.p + in->v[i].off;
      sc->matches.n = 0;
      INA_CHECK(tk_regex_find_matches(&s->re, &sc->matcher, t, in->v[i].len, &sc->matches));
      const size_t off = out->text.len;
      for (size_t k = 0; k < sc->matches.n; k++) {
        const tk_match_t m = sc->matches.v[k];
        if (m.is_match) INA_CHECK(tk_buf_append(&out->text, s->replace_with, s->replace_len));
        else INA_CHECK(tk_buf_append(&out->text, t + m.start, m.end - m.start));
      }
      INA_CHECK(tk_pieces_range(out, off, out->text.len - off));
    }
    break;
  }
fail:
  return st;
}

/* ---- decode ------------------------------------------------------------------------ */

ina_status_t tk_decode_ids(const ina_tokenizer_t *tok, const int32_t *ids, size_t n, int skip_special,
                           tk_buf_t *out) {
  ina_status_t st = INA_OK;
  tk_pieces_t a = {0}, b = {0};
  tk_scratch_t sc = {0};
  for (size_t i = 0; i < n; i++) {
    const int32_t id = ids[i];
    INA_REQUIRE(id >= 0 && id < tok->num_ids && tok->tokens[id] != NULL, INA_ERR_INVALID_ARGUMENT,
                "decode: ids[%zu] = %d is not a token id (vocabulary of %d)", i, id, tok->num_ids);
    if (skip_special && tok->special[id]) continue;
    INA_CHECK(push_piece(&a, tok->tokens[id], tok->token_lens[id]));
  }
  if (!tok->decoder.present) {
    for (size_t i = 0; i < a.n; i++) {
      if (i) INA_CHECK(tk_buf_append(out, " ", 1));
      INA_CHECK(tk_buf_append(out, a.text.p + a.v[i].off, a.v[i].len));
    }
  } else {
    for (size_t k = 0; k < tok->decoder.n; k++) {
      tk_pieces_reset(&b);
      INA_CHECK(run_step(&tok->decoder.steps[k], &sc, &a, &b));
      const tk_pieces_t t = a;
      a = b;
      b = t;
    }
    for (size_t i = 0; i < a.n; i++) INA_CHECK(tk_buf_append(out, a.text.p + a.v[i].off, a.v[i].len));
  }
  INA_CHECK(tk_buf_reserve(out, 0)); /* terminated even when empty */
  out->p[out->len] = '\0';
fail:
  tk_pieces_free(&a);
  tk_pieces_free(&b);
  tk_scratch_free(&sc);
  return st;
}

ina_status_t ina_tokenizer_decode(const ina_tokenizer_t *tok, const int32_t *ids, size_t num_ids, int skip_special,
                                  char **text, size_t *len) {
  ina_status_t st = INA_OK;
  tk_buf_t out = {0};
  INA_REQUIRE(text != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_decode: text is NULL");
  *text = NULL;
  if (len) *len = 0;
  INA_REQUIRE(tok != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_decode: tok is NULL");
  INA_REQUIRE(ids != NULL || num_ids == 0, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_decode: ids is NULL");
  INA_CHECK(tk_decode_ids(tok, ids, num_ids, skip_special, &out));
  *text = out.p;
  if (len) *len = out.len;
  return INA_OK;
fail:
  tk_buf_free(&out);
  return st;
}
