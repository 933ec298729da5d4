/* Stop strings over streamed text (stop_text.h). */
#define INA_LOG_SUBSYS "http"
#include "agent/http/stop_text.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

ina_status_t ina_text_buf_append(ina_text_buf_t *b, const char *text, size_t len) {
  ina_status_t st = INA_OK;
  if (b->len + len + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + len + 1) cap *= 2;
    char *grown = realloc(b->data, cap);
    INA_CHECK_ALLOC(grown);
    b->data = grown;
    b->cap = cap;
  }
  if (len) memcpy(b->data + b->len, text, len);
  b->len += len;
  b->data[b->len] = '\0';
fail:
  return st;
}

void ina_text_buf_release(ina_text_buf_t *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

ina_status_t ina_stop_text_init(ina_stop_text_t *m, const char *const *stops, const size_t *lens, size_t num_stops) {
  ina_status_t st = INA_OK;
  memset(m, 0, sizeof *m);
  if (num_stops == 0) return INA_OK;
  m->stops = calloc(num_stops, sizeof *m->stops);
  m->lens = calloc(num_stops, sizeof *m->lens);
  INA_CHECK_ALLOC(m->stops);
  INA_CHECK_ALLOC(m->lens);
  m->num_stops = num_stops;
  for (size_t i = 0; i < num_stops; i++) {
    INA_REQUIRE(lens[i] > 0, INA_ERR_INVALID_ARGUMENT, "stop[%zu]: an empty stop string", i);
    m->stops[i] = malloc(lens[i] + 1);
    INA_CHECK_ALLOC(m->stops[i]);
    memcpy(m->stops[i], stops[i], lens[i]);
    m->stops[i][lens[i]] = '\0';
    m->lens[i] = lens[i];
  }
  return INA_OK;
fail:
  ina_stop_text_release(m);
  return st;
}

void ina_stop_text_release(ina_stop_text_t *m) {
  for (size_t i = 0; i < m->num_stops; i++) free(m->stops[i]);
  free(m->stops);
  free(m->lens);
  ina_text_buf_release(&m->held);
  memset(m, 0, sizeof *m);
}

/* The first byte offset of any stop string in s[0..n), or n. */
static size_t first_stop(const ina_stop_text_t *m, const char *s, size_t n) {
  size_t best = n;
  for (size_t i = 0; i < m->num_stops; i++) {
    const size_t k = m->lens[i];
    for (size_t p = 0; p + k <= n && p < best; p++)
      if (memcmp(s + p, m->stops[i], k) == 0) {
        best = p;
        break;
      }
  }
  return best;
}

/* The length of the longest tail of s[0..n) that is a proper prefix of a stop string. */
static size_t open_tail(const ina_stop_text_t *m, const char *s, size_t n) {
  size_t best = 0;
  for (size_t i = 0; i < m->num_stops; i++) {
    const size_t k = m->lens[i];
    for (size_t t = (k - 1 < n ? k - 1 : n); t > best; t--)
      if (memcmp(s + n - t, m->stops[i], t) == 0) {
        best = t;
        break;
      }
  }
  return best;
}

int ina_stop_text_feed(ina_stop_text_t *m, const char *text, size_t len, ina_text_buf_t *out) {
  if (m->stopped) return 1;
  if (m->num_stops == 0) return ina_text_buf_append(out, text, len) == INA_OK ? 0 : -1;
  if (ina_text_buf_append(&m->held, text, len) != INA_OK) return -1;
  const char *s = m->held.data;
  const size_t n = m->held.len;
  const size_t stop_at = first_stop(m, s, n);
  if (stop_at < n) {
    m->stopped = 1;
    const int ok = ina_text_buf_append(out, s, stop_at) == INA_OK;
    m->held.len = 0;
    m->held.data[0] = '\0';
    return ok ? 1 : -1;
  }
  const size_t keep = open_tail(m, s, n);
  if (ina_text_buf_append(out, s, n - keep) != INA_OK) return -1;
  memmove(m->held.data, s + n - keep, keep);
  m->held.len = keep;
  m->held.data[keep] = '\0';
  return 0;
}

ina_status_t ina_stop_text_flush(ina_stop_text_t *m, ina_text_buf_t *out) {
  ina_status_t st = INA_OK;
  if (!m->stopped && m->held.len) INA_CHECK(ina_text_buf_append(out, m->held.data, m->held.len));
  m->held.len = 0;
  if (m->held.data) m->held.data[0] = '\0';
fail:
  return st;
}
