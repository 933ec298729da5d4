/* The tokenizer's small helpers: growable buffers, UTF-8 decoding with the lossy rule
 * `tokenizers` applies, the character classes of Rust's char that it relies on, a
 * string → id hash map, and the text pieces passed between the stages of encode. */
#define INA_LOG_SUBSYS "tokenizer"
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/check.h"
#include "tokenizer/internal.h"

/* ---- buffers ----------------------------------------------------------------------- */

ina_status_t tk_buf_reserve(tk_buf_t *b, size_t extra) {
  ina_status_t st = INA_OK;
  if (b->len + extra + 1 <= b->cap) return INA_OK;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + extra + 1) cap *= 2;
  char *p = realloc(b->p, cap);
  INA_CHECK_ALLOC(p);
  b->p = p;
  b->cap = cap;
fail:
  return st;
}

ina_status_t tk_buf_append(tk_buf_t *b, const void *s, size_t n) {
  ina_status_t st = tk_buf_reserve(b, n);
  if (st != INA_OK) return st;
  if (n) memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0'; /* always terminated, for the callers that hand it out */
  return INA_OK;
}

void tk_buf_free(tk_buf_t *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

/* ---- UTF-8 ------------------------------------------------------------------------- */

int32_t tk_utf8_next(const unsigned char *s, size_t n, size_t *adv, int *truncated) {
  const unsigned char b0 = s[0];
  if (truncated) *truncated = 0;
  if (b0 < 0x80) {
    *adv = 1;
    return b0;
  }
  /* The range of the second byte depends on the lead (it excludes overlongs,
   * surrogates and code points past U+10FFFF); later bytes are 80..BF. */
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  uint32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *adv = 1;
    return -1;
  }
  size_t i = 1;
  for (; i <= need; i++) {
    if (i >= n) {
      if (truncated) *truncated = 1;
      *adv = i;
      return -1;
    }
    const unsigned char c = s[i];
    if (c < lo || c > hi) {
      *adv = i;
      return -1;
    }
    lo = 0x80;
    hi = 0xBF;
    cp = (cp << 6) | (c & 0x3F);
  }
  *adv = i;
  return (int32_t)cp;
}

size_t tk_utf8_put(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

ina_status_t tk_utf8_lossy(tk_buf_t *out, const char *s, size_t n) {
  ina_status_t st = INA_OK;
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0, run = 0; /* run: start of the well-formed stretch not yet copied */
  INA_CHECK(tk_buf_reserve(out, n));
  while (i < n) {
    if (u[i] < 0x80) { /* ASCII fast path */
      i++;
      continue;
    }
    size_t adv;
    if (tk_utf8_next(u + i, n - i, &adv, NULL) >= 0) {
      i += adv;
      continue;
    }
    INA_CHECK(tk_buf_append(out, s + run, i - run));
    INA_CHECK(tk_buf_append(out, "\xEF\xBF\xBD", 3));
    i += adv;
    run = i;
  }
  INA_CHECK(tk_buf_append(out, s + run, n - run));
fail:
  return st;
}

int tk_utf8_valid(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t adv;
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    if (tk_utf8_next(u + i, n - i, &adv, NULL) < 0) return 0;
    i += adv;
  }
  return 1;
}

/* ---- character classes ------------------------------------------------------------- */

int tk_is_white_space(uint32_t cp) {
  /* Unicode's White_Space property, which char::is_whitespace and regex \s test. */
  if (cp >= 0x09 && cp <= 0x0D) return 1;
  switch (cp) {
  case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F:
  case 0x205F: case 0x3000:
    return 1;
  default:
    return cp >= 0x2000 && cp <= 0x200A;
  }
}

int tk_is_numeric(uint32_t cp) {
  const utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

int tk_is_word(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  switch (utf8proc_category((utf8proc_int32_t)cp)) {
  case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
  case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
  case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
  case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
    return 1;
  default:
    break;
  }
  /* Join_Control, and the symbols that are Other_Alphabetic (circled and squared
   * Latin letters); the other Other_Alphabetic characters are marks, covered above. */
  return cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
         (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189);
}

/* ---- string map -------------------------------------------------------------------- */

static uint64_t str_hash(const char *s, size_t n) {
  /* FNV-1a, then a final mix so that the low bits used as the slot index vary. */
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 32);
}

ina_status_t tk_strmap_init(tk_strmap_t *m, size_t expected) {
  ina_status_t st = INA_OK;
  memset(m, 0, sizeof *m);
  size_t slots = 16;
  while (slots < expected * 2) slots *= 2;
  m->slots = malloc(slots * sizeof *m->slots);
  INA_CHECK_ALLOC(m->slots);
  memset(m->slots, 0xFF, slots * sizeof *m->slots);
  m->mask = slots - 1;
fail:
  return st;
}

static ina_status_t strmap_grow(tk_strmap_t *m) {
  ina_status_t st = INA_OK;
  if (m->count + 1 > m->cap) {
    const size_t cap = m->cap ? m->cap * 2 : 64;
    const char **k = realloc(m->keys, cap * sizeof *k);
    INA_CHECK_ALLOC(k);
    m->keys = k;
    uint32_t *l = realloc(m->key_lens, cap * sizeof *l);
    INA_CHECK_ALLOC(l);
    m->key_lens = l;
    int32_t *v = realloc(m->values, cap * sizeof *v);
    INA_CHECK_ALLOC(v);
    m->values = v;
    m->cap = cap;
  }
  if ((m->count + 1) * 2 > m->mask + 1) {
    const size_t slots = (m->mask + 1) * 2;
    int32_t *s = malloc(slots * sizeof *s);
    INA_CHECK_ALLOC(s);
    memset(s, 0xFF, slots * sizeof *s);
    for (size_t i = 0; i < m->count; i++) {
      size_t h = (size_t)str_hash(m->keys[i], m->key_lens[i]) & (slots - 1);
      while (s[h] >= 0) h = (h + 1) & (slots - 1);
      s[h] = (int32_t)i;
    }
    free(m->slots);
    m->slots = s;
    m->mask = slots - 1;
  }
fail:
  return st;
}

ina_status_t tk_strmap_put(tk_strmap_t *m, const char *key, size_t len, int32_t value, int32_t *old) {
  ina_status_t st = INA_OK;
  if (old) *old = -1;
  size_t h = (size_t)str_hash(key, len) & m->mask;
  for (; m->slots[h] >= 0; h = (h + 1) & m->mask) {
    const int32_t k = m->slots[h];
    if (m->key_lens[k] == len && memcmp(m->keys[k], key, len) == 0) {
      if (old) *old = m->values[k];
      m->values[k] = value;
      return INA_OK;
    }
  }
  INA_CHECK(strmap_grow(m));
  h = (size_t)str_hash(key, len) & m->mask;
  while (m->slots[h] >= 0) h = (h + 1) & m->mask;
  m->slots[h] = (int32_t)m->count;
  m->keys[m->count] = key;
  m->key_lens[m->count] = (uint32_t)len;
  m->values[m->count] = value;
  m->count++;
fail:
  return st;
}

int32_t tk_strmap_get(const tk_strmap_t *m, const char *key, size_t len) {
  if (!m->slots) return -1;
  for (size_t h = (size_t)str_hash(key, len) & m->mask; m->slots[h] >= 0; h = (h + 1) & m->mask) {
    const int32_t k = m->slots[h];
    if (m->key_lens[k] == len && memcmp(m->keys[k], key, len) == 0) return m->values[k];
  }
  return -1;
}

void tk_strmap_free(tk_strmap_t *m) {
  free(m->slots);
  free(m->keys);
  free(m->key_lens);
  free(m->values);
  memset(m, 0, sizeof *m);
}

/* ---- pieces ------------------------------------------------------------------------ */

static ina_status_t pieces_push(tk_pieces_t *p, size_t off, size_t len, int32_t id) {
  ina_status_t st = INA_OK;
  /* The text buffer exists once a piece does, so that text.p + off is never NULL + 0. */
  INA_CHECK(tk_buf_reserve(&p->text, 0));
  if (p->n == p->cap) {
    const size_t cap = p->cap ? p->cap * 2 : 32;
    tk_piece_t *v = realloc(p->v, cap * sizeof *v);
    INA_CHECK_ALLOC(v);
    p->v = v;
    p->cap = cap;
  }
  p->v[p->n++] = (tk_piece_t){off, len, id};
fail:
  return st;
}

ina_status_t tk_pieces_text(tk_pieces_t *p, const char *s, size_t n) {
  if (n == 0) return INA_OK;
  const size_t off = p->text.len;
  ina_status_t st = tk_buf_append(&p->text, s, n);
  if (st != INA_OK) return st;
  return pieces_push(p, off, n, -1);
}

ina_status_t tk_pieces_token(tk_pieces_t *p, int32_t id) { return pieces_push(p, p->text.len, 0, id); }

ina_status_t tk_pieces_range(tk_pieces_t *p, size_t off, size_t len) { return pieces_push(p, off, len, -1); }

void tk_pieces_reset(tk_pieces_t *p) {
  p->n = 0;
  p->text.len = 0;
}

void tk_pieces_free(tk_pieces_t *p) {
  tk_buf_free(&p->text);
  free(p->v);
  memset(p, 0, sizeof *p);
}

ina_status_t tk_matches_push(tk_matches_t *ms, size_t start, size_t end, int is_match) {
  ina_status_t st = INA_OK;
  if (ms->n == ms->cap) {
    const size_t cap = ms->cap ? ms->cap * 2 : 64;
    tk_match_t *v = realloc(ms->v, cap * sizeof *v);
    INA_CHECK_ALLOC(v);
    ms->v = v;
    ms->cap = cap;
  }
  ms->v[ms->n++] = (tk_match_t){start, end, is_match};
fail:
  return st;
}

void tk_scratch_free(tk_scratch_t *s) {
  tk_matcher_free(&s->matcher);
  free(s->matches.v);
  tk_buf_free(&s->buf);
  free(s->sym);
  free(s->heap);
  memset(s, 0, sizeof *s);
}
