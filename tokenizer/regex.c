/* The pre-tokenizer's and decoder's regexes through PCRE2 (UTF + UCP, JIT when the
 * library has it), iterated as `tokenizers` iterates its Oniguruma regexes.
 *
 * `tokenizers` compiles patterns with Oniguruma's Ruby syntax, whose Unicode classes
 * differ from PCRE2's where real patterns reach them: Oniguruma's \s is White_Space
 * (with U+0085, without U+180E; PCRE2's is the other way round), and its \w is
 * Unicode's Word set (Alphabetic, marks, Nd, Pc) plus, outside brackets only, the
 * Latin-1 superscripts and fractions, where PCRE2's is Letter | Number | '_'. Before
 * compiling, \s \S \w \W are rewritten to explicit classes with Oniguruma's meaning
 * (inside a bracket class \s and \w are widened in place; \S and \W there are left
 * to PCRE2, a difference no known checkpoint pattern reaches), and Oniguruma's \uHHHH
 * becomes PCRE2's \x{HHHH}; a script property is the Script property in both (see
 * rewrite_property). The sets were measured on
 * every code point against `tokenizers` 0.23 (tests/tokenizer/check_hf_tokenizers.py
 * --classes repeats it). \d and \p{..} mean the same in both.
 */
#define INA_LOG_SUBSYS "tokenizer"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"

/* Oniguruma's word characters: Unicode's Word set (Alphabetic, which adds Nl and the
 * circled letters, marks, Nd, Pc); outside brackets also the Latin-1 superscripts and
 * fractions, from the Latin-1 table it consults there. */
#define WORD_CLASS_IN_CLASS \
  "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{24B6}-\\x{24E9}\\x{1F130}-\\x{1F149}\\x{1F150}-\\x{1F169}\\x{1F170}-\\x{1F189}"
#define WORD_CLASS WORD_CLASS_IN_CLASS "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"
#define SPACE_CLASS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* \p{Name} / \P{Name} / \p{^Name}: a script name means the Script property in
 * Oniguruma, but Script_Extensions in PCRE2 (so PCRE2's \p{Katakana} takes U+3099, whose
 * script is Inherited); PCRE2 spells the Script property sc:Name. Whether Name is a
 * script is asked of PCRE2 itself (a pattern of \p{sc:Name} compiles); categories such as
 * L or Nd are copied as they are. */
static ina_status_t rewrite_property(const char *esc, size_t len, tk_buf_t *out) {
  const size_t name_at = esc[3] == '^' ? 4 : 3;
  const char *name = esc + name_at;
  const size_t name_len = len - name_at - 1;
  char probe[96];
  if (name_len == 0 || name_len > 64 || memchr(name, ':', name_len) || memchr(name, '=', name_len))
    return tk_buf_append(out, esc, len);
  snprintf(probe, sizeof probe, "\\p{sc:%.*s}", (int)name_len, name);
  int err;
  PCRE2_SIZE off;
  pcre2_code *c = pcre2_compile((PCRE2_SPTR)probe, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
  if (!c) return tk_buf_append(out, esc, len);
  pcre2_code_free(c);
  ina_status_t st = tk_buf_append(out, esc, name_at);
  if (st == INA_OK) st = tk_buf_append(out, "sc:", 3);
  if (st == INA_OK) st = tk_buf_append(out, name, name_len + 1);
  return st;
}

/* Rewrites the class escapes described above; the rest is copied as is. */
static ina_status_t rewrite_pattern(const char *p, size_t n, tk_buf_t *out) {
  ina_status_t st = INA_OK;
  int in_class = 0;
  for (size_t i = 0; i < n; i++) {
    const char c = p[i];
    if (c == '\\' && i + 1 < n) {
      const char e = p[i + 1];
      if (e == 'Q') { /* \Q...\E: literal text, copied through \E */
        const char *end = NULL;
        for (size_t j = i + 2; j + 1 < n; j++)
          if (p[j] == '\\' && p[j + 1] == 'E') {
            end = p + j + 2;
            break;
          }
        const size_t stop = end ? (size_t)(end - p) : n;
        INA_CHECK(tk_buf_append(out, p + i, stop - i));
        i = stop - 1;
        continue;
      }
      if (e == 'u' && i + 5 < n && isxdigit((unsigned char)p[i + 2]) && isxdigit((unsigned char)p[i + 3]) &&
          isxdigit((unsigned char)p[i + 4]) && isxdigit((unsigned char)p[i + 5])) {
        /* Oniguruma's \uHHHH; PCRE2 spells it \x{HHHH}. */
        char esc[16];
        snprintf(esc, sizeof esc, "\\x{%.4s}", p + i + 2);
        INA_CHECK(tk_buf_append(out, esc, strlen(esc)));
        i += 5;
        continue;
      }
      if ((e == 'p' || e == 'P') && i + 2 < n && p[i + 2] == '{') {
        const char *close = memchr(p + i + 3, '}', n - i - 3);
        if (close) {
          INA_CHECK(rewrite_property(p + i, (size_t)(close - p) + 1 - i, out));
          i = (size_t)(close - p);
          continue;
        }
      }
      const char *rep = NULL;
      if (!in_class) {
        if (e == 's') rep = "[" SPACE_CLASS "]";
        if (e == 'S') rep = "[^" SPACE_CLASS "]";
        if (e == 'w') rep = "[" WORD_CLASS "]";
        if (e == 'W') rep = "[^" WORD_CLASS "]";
      } else {
        if (e == 's') rep = SPACE_CLASS;
        if (e == 'w') rep = WORD_CLASS_IN_CLASS;
      }
      if (rep) {
        INA_CHECK(tk_buf_append(out, rep, strlen(rep)));
      } else {
        INA_CHECK(tk_buf_append(out, p + i, 2));
      }
      i++;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = 1;
      INA_CHECK(tk_buf_append(out, p + i, 1));
      /* A ']' right after '[' or '[^' is a literal member, not the end. */
      if (i + 1 < n && p[i + 1] == '^') INA_CHECK(tk_buf_append(out, p + ++i, 1));
      if (i + 1 < n && p[i + 1] == ']') INA_CHECK(tk_buf_append(out, p + ++i, 1));
      continue;
    }
    if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
      const char *end = strstr(p + i + 2, ":]");
      if (end && (size_t)(end - p) < n) {
        INA_CHECK(tk_buf_append(out, p + i, (size_t)(end - p) + 2 - i));
        i = (size_t)(end - p) + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = 0;
    INA_CHECK(tk_buf_append(out, p + i, 1));
  }
fail:
  return st;
}

ina_status_t tk_regex_compile(tk_regex_t *re, const char *pattern, size_t len, int literal, const char *where) {
  ina_status_t st = INA_OK;
  tk_buf_t rw = {0};
  re->code = NULL;
  INA_REQUIRE(tk_utf8_valid(pattern, len), INA_ERR_FORMAT, "%s: the pattern is not valid UTF-8", where);
  uint32_t options = PCRE2_UTF;
  const char *src = pattern;
  size_t src_len = len;
  if (literal) {
    options |= PCRE2_LITERAL; /* UCP only changes classes, which a literal has none of */
  } else {
    options |= PCRE2_UCP;
    INA_CHECK(rewrite_pattern(pattern, len, &rw));
    src = rw.p ? rw.p : "";
    src_len = rw.len;
  }
  int err = 0;
  PCRE2_SIZE err_off = 0;
  re->code = pcre2_compile((PCRE2_SPTR)src, src_len, options, &err, &err_off, NULL);
  if (!re->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    INA_REQUIRE(0, INA_ERR_FORMAT, "%s: invalid regex '%.*s': %s (at offset %zu)", where, (int)(len > 200 ? 200 : len),
                pattern, (const char *)msg, (size_t)err_off);
  }
  /* JIT is an optimization: without it (no JIT in this PCRE2 build, or a pattern it
   * cannot compile) pcre2_match interprets the same pattern. */
  (void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
fail:
  tk_buf_free(&rw);
  return st;
}

void tk_regex_free(tk_regex_t *re) {
  if (re->code) pcre2_code_free(re->code);
  re->code = NULL;
}

void tk_matcher_free(tk_matcher_t *m) {
  if (m->md) pcre2_match_data_free(m->md);
  if (m->mctx) pcre2_match_context_free(m->mctx);
  if (m->jit_stack) pcre2_jit_stack_free(m->jit_stack);
  memset(m, 0, sizeof *m);
}

/* One pcre2_match from `from`; 1 with [*s, *e) on a match, 0 on none. A JIT stack
 * overflow (long runs under a pattern such as \s+(?!\S)) retries with a larger stack. */
static ina_status_t match_at(const tk_regex_t *re, tk_matcher_t *m, const char *s, size_t n, size_t from, int *found,
                             size_t *ms, size_t *me) {
  ina_status_t st = INA_OK;
  if (!m->md) {
    m->md = pcre2_match_data_create(1, NULL);
    INA_CHECK_ALLOC(m->md);
  }
  for (size_t stack = 1u << 20;; stack *= 4) {
    const int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, m->md, m->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) {
      *found = 0;
      return INA_OK;
    }
    if (rc >= 0) { /* 0: the ovector is too small for the groups, but group 0 is set */
      const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
      *found = 1;
      *ms = ov[0];
      *me = ov[1];
      return INA_OK;
    }
    if (rc != PCRE2_ERROR_JIT_STACKLIMIT || stack > (64u << 20)) {
      /* A pattern that backtracks without end meets PCRE2's match limit here. */
      PCRE2_UCHAR msg[128];
      pcre2_get_error_message(rc, msg, sizeof msg);
      INA_REQUIRE(0, INA_ERR_INTERNAL, "regex match failed on a %zu-byte piece: %s (PCRE2 error %d)", n,
                  (const char *)msg, rc);
    }
    if (m->jit_stack) pcre2_jit_stack_free(m->jit_stack);
    m->jit_stack = pcre2_jit_stack_create(32 * 1024, stack, NULL);
    INA_CHECK_ALLOC(m->jit_stack);
    if (!m->mctx) {
      m->mctx = pcre2_match_context_create(NULL);
      INA_CHECK_ALLOC(m->mctx);
    }
    pcre2_jit_stack_assign(m->mctx, NULL, m->jit_stack);
  }
fail:
  return st;
}

ina_status_t tk_regex_find_matches(const tk_regex_t *re, tk_matcher_t *m, const char *s, size_t n,
                                   tk_matches_t *out) {
  ina_status_t st = INA_OK;
  if (n == 0) return tk_matches_push(out, 0, 0, 0);
  size_t prev = 0, last_end = 0, last_match_end = 0;
  int have_last = 0;
  while (last_end <= n) {
    int found = 0;
    size_t ms = 0, me = 0;
    INA_CHECK(match_at(re, m, s, n, last_end, &found, &ms, &me));
    if (!found) break;
    /* Oniguruma's find_iter: an empty match right where the previous one ended is
     * skipped by stepping one character. */
    if (ms == me && have_last && last_match_end == me) {
      size_t adv = 1;
      if (last_end < n) (void)tk_utf8_next((const unsigned char *)s + last_end, n - last_end, &adv, NULL);
      last_end += adv;
      continue;
    }
    last_end = me;
    last_match_end = me;
    have_last = 1;
    if (prev != ms) INA_CHECK(tk_matches_push(out, prev, ms, 0));
    INA_CHECK(tk_matches_push(out, ms, me, 1));
    prev = me;
  }
  if (prev != n) INA_CHECK(tk_matches_push(out, prev, n, 0));
fail:
  return st;
}
