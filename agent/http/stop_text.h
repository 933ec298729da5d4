/* Stop strings over streamed text: the text of a generation arrives in pieces (each
 * whole UTF-8 characters, from the detokenizer); what may be sent at once is the text up
 * to the first occurrence of any stop string, minus a tail that could still grow into
 * one. That tail is held back until the next piece decides it, so a stop string split
 * over two pieces is still found, and text before a stop string is never cut short or
 * sent past it. The stop string itself is not sent (OpenAI's semantics). The text ends
 * before the first stop string to appear whole as the pieces arrive; among several that
 * one piece completes, the one that starts first (vLLM's order: a stop is acted on as
 * soon as a token completes it).
 *
 * Ownership: the matcher copies the stop strings; release it with
 * ina_stop_text_release. Released text is appended to the caller's buffer (out, a
 * malloc'ed growable string that the caller frees). Thread safety: one thread at a
 * time per matcher. */
#ifndef INA_AGENT_HTTP_STOP_TEXT_H
#define INA_AGENT_HTTP_STOP_TEXT_H

#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_text_buf {
  char *data; /* NUL-terminated when non-NULL */
  size_t len, cap;
} ina_text_buf_t;

ina_status_t ina_text_buf_append(ina_text_buf_t *b, const char *text, size_t len);
void ina_text_buf_release(ina_text_buf_t *b);

typedef struct ina_stop_text {
  char **stops;
  size_t *lens;
  size_t num_stops;
  ina_text_buf_t held; /* text not yet released */
  int stopped;         /* a stop string was found: everything after it is dropped */
} ina_stop_text_t;

/* stops[num_stops] non-empty strings of lens[i] bytes (num_stops may be 0). */
ina_status_t ina_stop_text_init(ina_stop_text_t *m, const char *const *stops, const size_t *lens, size_t num_stops);
void ina_stop_text_release(ina_stop_text_t *m);

/* Takes the next piece and appends to out what can be released now. Returns 1 when a stop
 * string has been found (now or before: then nothing more is released), else 0; -1 when
 * out of memory. */
int ina_stop_text_feed(ina_stop_text_t *m, const char *text, size_t len, ina_text_buf_t *out);
/* The generation ended without a stop string: releases the held tail. */
ina_status_t ina_stop_text_flush(ina_stop_text_t *m, ina_text_buf_t *out);

#ifdef __cplusplus
}
#endif
#endif
