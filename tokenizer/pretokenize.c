/* The pre-tokenizer: null, Sequence, Split (regex or literal, five behaviors, invert),
 * ByteLevel (add_prefix_space, use_regex) and Digits (individual_digits), with the
 * splitting rules of `tokenizers`' NormalizedString::split. Each step runs on every text
 * piece left by the previous one; pieces that are added tokens pass through untouched,
 * and empty pieces are dropped, as PreTokenizedString::split drops them. */
#define INA_LOG_SUBSYS "tokenizer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"

/* GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the others
 * take the code points from 256 on, in byte order. */
const uint16_t tk_byte_to_cp[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271,
    272, 273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287,
    288, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79,
    80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
    96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 289,
    290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305,
    306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321,
    322, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 323, 174, 175,
    176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207,
    208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223,
    224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239,
    240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255,
};

/* The bytes of the code points 256..323, in order: the bytes tk_byte_to_cp does not keep. */
static const uint8_t kCpToByte[68] = {
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 127,
    128, 129, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139, 140, 141, 142, 143, 144,
    145, 146, 147, 148, 149, 150, 151, 152, 153, 154, 155, 156, 157, 158, 159, 160, 173,
};

int tk_cp_to_byte(uint32_t cp) {
  if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
  if (cp < 256 || cp > 323) return -1;
  return kCpToByte[cp - 256];
}

/* The regex ByteLevel splits with when use_regex is set (GPT-2's). */
static const char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- parsing ----------------------------------------------------------------------- */

static ina_status_t get_bool(const json_t *j, const char *key, int dflt, const char *origin, const char *path,
                             int *out) {
  ina_status_t st = INA_OK;
  const json_t *v = json_object_get(j, key);
  *out = dflt;
  if (!v || json_is_null(v)) return INA_OK;
  INA_REQUIRE(json_is_boolean(v), INA_ERR_FORMAT, "%s: %s.%s: expected a boolean", origin, path, key);
  *out = json_is_true(v);
fail:
  return st;
}

static ina_status_t add_step(tk_pretokenizer_t *pt, tk_pre_step_t **step) {
  ina_status_t st = INA_OK;
  tk_pre_step_t *s = realloc(pt->steps, (pt->n + 1) * sizeof *s);
  INA_CHECK_ALLOC(s);
  pt->steps = s;
  *step = &pt->steps[pt->n++];
  memset(*step, 0, sizeof **step);
fail:
  return st;
}

static ina_status_t parse_behavior(const json_t *j, const char *origin, const char *path, tk_split_behavior_t *out) {
  ina_status_t st = INA_OK;
  const char *b = json_string_value(json_object_get(j, "behavior"));
  INA_REQUIRE(b != NULL, INA_ERR_FORMAT, "%s: %s: missing string 'behavior'", origin, path);
  static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
  for (int i = 0; i < 5; i++)
    if (strcmp(b, names[i]) == 0) {
      *out = (tk_split_behavior_t)i;
      return INA_OK;
    }
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "%s: %s.behavior: '%s' is not supported", origin, path, b);
fail:
  return st;
}

/* {"Regex": "..."} or {"String": "..."}, as `tokenizers` writes a SplitPattern. */
ina_status_t tk_parse_pattern(const json_t *j, const char *origin, const char *path, tk_regex_t *re) {
  ina_status_t st = INA_OK;
  char where[TK_PATH_MAX + 64];
  INA_REQUIRE(json_is_object(j) && json_object_size(j) == 1, INA_ERR_FORMAT,
              "%s: %s: expected {\"Regex\": ...} or {\"String\": ...}", origin, path);
  const json_t *r = json_object_get(j, "Regex"), *s = json_object_get(j, "String");
  INA_REQUIRE(r || s, INA_ERR_UNSUPPORTED, "%s: %s: pattern kind '%s' is not supported", origin, path,
              json_object_iter_key(json_object_iter((json_t *)j)));
  const json_t *v = r ? r : s;
  INA_REQUIRE(json_is_string(v), INA_ERR_FORMAT, "%s: %s.%s: expected a string", origin, path, r ? "Regex" : "String");
  snprintf(where, sizeof where, "%s: %s", origin, path);
  INA_CHECK(tk_regex_compile(re, json_string_value(v), json_string_length(v), s != NULL, where));
fail:
  return st;
}

static ina_status_t parse_one(const json_t *j, const char *origin, const char *path, int depth, tk_pretokenizer_t *pt) {
  ina_status_t st = INA_OK;
  tk_pre_step_t *step = NULL;
  char sub[TK_PATH_MAX];
  INA_REQUIRE(json_is_object(j), INA_ERR_FORMAT, "%s: %s: expected an object", origin, path);
  const char *type = json_string_value(json_object_get(j, "type"));
  INA_REQUIRE(type != NULL, INA_ERR_FORMAT, "%s: %s: missing string 'type'", origin, path);
  if (strcmp(type, "Sequence") == 0) {
    INA_REQUIRE(depth < 8, INA_ERR_UNSUPPORTED, "%s: %s: Sequences nested deeper than 8", origin, path);
    const json_t *list = json_object_get(j, "pretokenizers");
    INA_REQUIRE(json_is_array(list), INA_ERR_FORMAT, "%s: %s: Sequence without a 'pretokenizers' array", origin, path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
      INA_CHECK(parse_one(json_array_get(list, i), origin, sub, depth + 1, pt));
    }
    return INA_OK;
  }
  if (strcmp(type, "Split") == 0) {
    INA_CHECK(add_step(pt, &step));
    step->kind = TK_PRE_SPLIT;
    INA_CHECK(parse_behavior(j, origin, path, &step->behavior));
    INA_CHECK(get_bool(j, "invert", 0, origin, path, &step->invert));
    const json_t *pat = json_object_get(j, "pattern");
    INA_REQUIRE(pat != NULL, INA_ERR_FORMAT, "%s: %s: Split without a 'pattern'", origin, path);
    snprintf(sub, sizeof sub, "%s.pattern", path);
    INA_CHECK(tk_parse_pattern(pat, origin, sub, &step->re));
    return INA_OK;
  }
  if (strcmp(type, "ByteLevel") == 0) {
    INA_CHECK(add_step(pt, &step));
    step->kind = TK_PRE_BYTE_LEVEL;
    INA_CHECK(get_bool(j, "add_prefix_space", 1, origin, path, &step->add_prefix_space));
    INA_CHECK(get_bool(j, "use_regex", 1, origin, path, &step->use_regex));
    int trim; /* offsets only: no effect on ids */
    INA_CHECK(get_bool(j, "trim_offsets", 1, origin, path, &trim));
    if (step->use_regex) {
      snprintf(sub, sizeof sub, "%s: %s (GPT-2 regex)", origin, path);
      INA_CHECK(tk_regex_compile(&step->re, kGpt2Pattern, sizeof kGpt2Pattern - 1, 0, sub));
    }
    return INA_OK;
  }
  if (strcmp(type, "Digits") == 0) {
    INA_CHECK(add_step(pt, &step));
    step->kind = TK_PRE_DIGITS;
    INA_CHECK(get_bool(j, "individual_digits", 0, origin, path, &step->individual_digits));
    return INA_OK;
  }
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "%s: %s: pre-tokenizer type '%s' is not supported", origin, path, type);
fail:
  return st;
}

ina_status_t tk_pretokenizer_parse(const json_t *j, const char *origin, const char *path, tk_pretokenizer_t *out) {
  memset(out, 0, sizeof *out);
  if (!j || json_is_null(j)) return INA_OK;
  ina_status_t st = parse_one(j, origin, path, 0, out);
  if (st != INA_OK) tk_pretokenizer_free(out);
  return st;
}

void tk_pretokenizer_free(tk_pretokenizer_t *pt) {
  for (size_t i = 0; i < pt->n; i++) tk_regex_free(&pt->steps[i].re);
  free(pt->steps);
  pt->steps = NULL;
  pt->n = 0;
}

/* ---- running ----------------------------------------------------------------------- */

ina_status_t tk_split_apply(const char *s, const tk_matches_t *ms, tk_split_behavior_t behavior, tk_pieces_t *out) {
  ina_status_t st = INA_OK;
  const tk_match_t *m = ms->v;
  const size_t n = ms->n;
  switch (behavior) {
  case TK_SPLIT_ISOLATED:
    for (size_t i = 0; i < n; i++) INA_CHECK(tk_pieces_text(out, s + m[i].start, m[i].end - m[i].start));
    break;
  case TK_SPLIT_REMOVED:
    for (size_t i = 0; i < n; i++)
      if (!m[i].is_match) INA_CHECK(tk_pieces_text(out, s + m[i].start, m[i].end - m[i].start));
    break;
  case TK_SPLIT_CONTIGUOUS:
  case TK_SPLIT_MERGED_WITH_PREVIOUS: {
    /* The folds of `tokenizers`: an element either extends the last piece or starts a
     * new one; `prev` is the previous element's flag, not the piece's. */
    size_t ps = 0, pe = 0;
    int have = 0, prev = 0;
    for (size_t i = 0; i < n; i++) {
      const int extend = behavior == TK_SPLIT_CONTIGUOUS ? m[i].is_match == prev : (m[i].is_match && !prev);
      if (extend && have) {
        pe = m[i].end;
      } else {
        if (have) INA_CHECK(tk_pieces_text(out, s + ps, pe - ps));
        ps = m[i].start;
        pe = m[i].end;
        have = 1;
      }
      prev = m[i].is_match;
    }
    if (have) INA_CHECK(tk_pieces_text(out, s + ps, pe - ps));
    break;
  }
  case TK_SPLIT_MERGED_WITH_NEXT: {
    /* `tokenizers` folds from the end: a match whose next element is not a match joins
     * that element. */
    size_t carry = 0;
    int carrying = 0;
    for (size_t i = 0; i < n; i++) {
      const size_t start = carrying ? carry : m[i].start;
      if (m[i].is_match && i + 1 < n && !m[i + 1].is_match) {
        carry = start;
        carrying = 1;
        continue;
      }
      carrying = 0;
      INA_CHECK(tk_pieces_text(out, s + start, m[i].end - start));
    }
    break;
  }
  }
fail:
  return st;
}

/* `char::is_numeric` as a pattern: every numeric character is a match of its own. */
static ina_status_t digit_matches(const char *s, size_t n, tk_matches_t *ms) {
  ina_status_t st = INA_OK;
  if (n == 0) return tk_matches_push(ms, 0, 0, 0);
  size_t last = 0;
  for (size_t i = 0; i < n;) {
    size_t adv;
    const int32_t cp = tk_utf8_next((const unsigned char *)s + i, n - i, &adv, NULL);
    if (cp >= 0 && tk_is_numeric((uint32_t)cp)) {
      if (last < i) INA_CHECK(tk_matches_push(ms, last, i, 0));
      INA_CHECK(tk_matches_push(ms, i, i + adv, 1));
      last = i + adv;
    }
    i += adv;
  }
  if (last < n) INA_CHECK(tk_matches_push(ms, last, n, 0));
fail:
  return st;
}

/* Appends s with every byte replaced by its ByteLevel character. */
static ina_status_t byte_level_map(const char *s, size_t n, tk_pieces_t *out) {
  ina_status_t st = INA_OK;
  if (n == 0) return INA_OK;
  const size_t off = out->text.len;
  INA_CHECK(tk_buf_reserve(&out->text, 2 * n));
  char *o = out->text.p + off;
  for (size_t i = 0; i < n; i++) {
    const uint16_t cp = tk_byte_to_cp[(unsigned char)s[i]];
    if (cp < 0x80) {
      *o++ = (char)cp;
    } else { /* all below U+0800: two bytes */
      *o++ = (char)(0xC0 | (cp >> 6));
      *o++ = (char)(0x80 | (cp & 0x3F));
    }
  }
  const size_t len = (size_t)(o - (out->text.p + off));
  out->text.len += len;
  out->text.p[out->text.len] = '\0';
  INA_CHECK(tk_pieces_range(out, off, len));
fail:
  return st;
}

static ina_status_t run_step(const tk_pre_step_t *step, tk_scratch_t *sc, const char *s, size_t n, tk_pieces_t *out) {
  ina_status_t st = INA_OK;
  sc->matches.n = 0;
  switch (step->kind) {
  case TK_PRE_SPLIT:
    INA_CHECK(tk_regex_find_matches(&step->re, &sc->matcher, s, n, &sc->matches));
    if (step->invert)
      for (size_t i = 0; i < sc->matches.n; i++) sc->matches.v[i].is_match = !sc->matches.v[i].is_match;
    INA_CHECK(tk_split_apply(s, &sc->matches, step->behavior, out));
    break;
  case TK_PRE_DIGITS:
    INA_CHECK(digit_matches(s, n, &sc->matches));
    INA_CHECK(tk_split_apply(s, &sc->matches, step->individual_digits ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS, out));
    break;
  case TK_PRE_BYTE_LEVEL: {
    const char *t = s;
    size_t tn = n;
    if (step->add_prefix_space && s[0] != ' ') {
      sc->buf.len = 0;
      INA_CHECK(tk_buf_append(&sc->buf, " ", 1));
      INA_CHECK(tk_buf_append(&sc->buf, s, n));
      t = sc->buf.p;
      tn = sc->buf.len;
    }
    if (!step->use_regex) {
      INA_CHECK(byte_level_map(t, tn, out));
      break;
    }
    INA_CHECK(tk_regex_find_matches(&step->re, &sc->matcher, t, tn, &sc->matches));
    for (size_t i = 0; i < sc->matches.n; i++)
      INA_CHECK(byte_level_map(t + sc->matches.v[i].start, sc->matches.v[i].end - sc->matches.v[i].start, out));
    break;
  }
  }
fail:
  return st;
}

ina_status_t tk_pretokenize(const tk_pretokenizer_t *pt, tk_scratch_t *sc, tk_pieces_t *p, tk_pieces_t *tmp) {
  ina_status_t st = INA_OK;
  for (size_t k = 0; k < pt->n; k++) {
    tk_pieces_reset(tmp);
    for (size_t i = 0; i < p->n; i++) {
      const tk_piece_t pc = p->v[i];
      if (pc.id >= 0) {
        INA_CHECK(tk_pieces_token(tmp, pc.id));
        continue;
      }
      INA_CHECK(run_step(&pt->steps[k], sc, p->text.p + pc.off, pc.len, tmp));
    }
    const tk_pieces_t t = *p;
    *p = *tmp;
    *tmp = t;
  }
fail:
  return st;
}
