/* The growing string that label sets and the exposition are built in. */
#include "agent/metrics/metrics_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int text_reserve(ina_text_t *t, size_t extra) {
  if (t->failed) return 0;
  size_t need = t->len + extra + 1; /* + NUL */
  if (need <= t->cap) return 1;
  size_t cap = t->cap ? t->cap : 256;
  while (cap < need) cap *= 2;
  char *buf = realloc(t->buf, cap);
  if (!buf) {
    t->failed = 1;
    return 0;
  }
  t->buf = buf;
  t->cap = cap;
  return 1;
}

void ina_text_append_n(ina_text_t *t, const char *s, size_t n) {
  if (!text_reserve(t, n)) return;
  memcpy(t->buf + t->len, s, n);
  t->len += n;
  t->buf[t->len] = '\0';
}

void ina_text_append(ina_text_t *t, const char *s) { ina_text_append_n(t, s, strlen(s)); }

void ina_text_appendf(ina_text_t *t, const char *fmt, ...) {
  char small[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    t->failed = 1;
    return;
  }
  if ((size_t)n < sizeof small) {
    ina_text_append_n(t, small, (size_t)n);
    return;
  }
  if (!text_reserve(t, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(t->buf + t->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  t->len += (size_t)n;
}

void ina_text_append_double(ina_text_t *t, double v) {
  if (isnan(v)) {
    ina_text_append(t, "NaN");
    return;
  }
  if (isinf(v)) {
    ina_text_append(t, v > 0 ? "+Inf" : "-Inf");
    return;
  }
  /* %.17g always round-trips but prints 0.1 as 0.10000000000000001; take the fewest
   * significant digits that still read back to the same double. */
  char buf[40];
  for (int digits = 1; digits <= 17; digits++) {
    snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (strtod(buf, NULL) == v) break;
  }
  ina_text_append(t, buf);
}

void ina_text_append_escaped(ina_text_t *t, const char *s, int quote) {
  const char *run = s; /* start of the bytes not yet copied */
  for (const char *p = s; *p; p++) {
    const char *esc = NULL;
    if (*p == '\\') esc = "\\\\";
    else if (*p == '\n') esc = "\\n";
    else if (*p == '"' && quote) esc = "\\\"";
    if (!esc) continue;
    ina_text_append_n(t, run, (size_t)(p - run));
    ina_text_append_n(t, esc, 2);
    run = p + 1;
  }
  ina_text_append(t, run);
}

void ina_text_free(ina_text_t *t) {
  free(t->buf);
  t->buf = NULL;
  t->len = t->cap = 0;
  t->failed = 0;
}
