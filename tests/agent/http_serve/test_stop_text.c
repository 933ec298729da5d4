/* agent/http/stop_text.h: random texts over a small alphabet (so stop strings occur,
 * overlap and straddle pieces, multi-byte characters included), random stop sets and
 * random splits into pieces. After every piece the released text must be a prefix of the
 * expected output (the text up to the first stop string to appear whole as the pieces
 * arrive, or all of it), never run past it, and at the end equal it exactly. The expected
 * output is computed here by a plain search over each prefix the pieces make. */
#include <stdlib.h>
#include <string.h>

#include "agent/http/stop_text.h"
#include "core/log.h"
#include "tests/test_util.h"

/* Characters of 1, 2 and 3 bytes. */
static const char *const alphabet[] = {"a", "b", " ", "\n", "\xc3\xa9", "\xe4\xb8\xad"};
#define ALPHABET (sizeof alphabet / sizeof alphabet[0])

static size_t random_text(test_rng_t *rng, char *out, int chars) {
  size_t n = 0;
  for (int i = 0; i < chars; i++) {
    const char *c = alphabet[test_rng_int(rng, 0, ALPHABET - 1)];
    memcpy(out + n, c, strlen(c));
    n += strlen(c);
  }
  out[n] = '\0';
  return n;
}

/* Where the first stop string starts in text[0..end), the earliest start of any, or end. */
static size_t first_in_prefix(const char *text, size_t end, char stops[][32], const size_t *lens, size_t n) {
  for (size_t p = 0; p < end; p++)
    for (size_t i = 0; i < n; i++)
      if (p + lens[i] <= end && memcmp(text + p, stops[i], lens[i]) == 0) return p;
  return end;
}
static void trial(test_rng_t *rng) {
  char text[512], stops[4][32];
  size_t lens[4], cuts[512];
  const size_t len = random_text(rng, text, (int)test_rng_int(rng, 0, 60));
  const size_t n = (size_t)test_rng_int(rng, 0, 4);
  const char *ptrs[4];
  for (size_t i = 0; i < n; i++) {
    lens[i] = random_text(rng, stops[i], (int)test_rng_int(rng, 1, 3));
    ptrs[i] = stops[i];
  }
  /* Pieces of 1-4 whole characters. */
  size_t num_cuts = 0;
  for (size_t end = 0; end < len;) {
    for (int c = (int)test_rng_int(rng, 1, 4); c > 0 && end < len; c--) {
      end++;
      while (end < len && ((unsigned char)text[end] & 0xC0) == 0x80) end++;
    }
    cuts[num_cuts++] = end;
  }
  /* The text ends before the first stop string to appear whole as the pieces arrive
   * (among several completed by one piece, the one that starts first). */
  size_t want = len;
  int want_stop = 0;
  for (size_t c = 0; c < num_cuts && !want_stop; c++) {
    const size_t at = first_in_prefix(text, cuts[c], stops, lens, n);
    if (at < cuts[c]) want = at, want_stop = 1;
  }
  ina_stop_text_t m;
  CHECK_OK(ina_stop_text_init(&m, ptrs, lens, n));
  ina_text_buf_t out = {0};
  size_t pos = 0;
  int stopped = 0;
  for (size_t c = 0; c < num_cuts && !stopped; c++) {
    const int r = ina_stop_text_feed(&m, text + pos, cuts[c] - pos, &out);
    CHECK(r == 0 || r == 1);
    stopped = r == 1;
    pos = cuts[c];
    CHECKF(out.len <= want && (out.len == 0 || memcmp(out.data, text, out.len) == 0),
           "released %zu bytes, more than or other than the %zu before the stop", out.len, want);
  }
  if (!stopped) CHECK_OK(ina_stop_text_flush(&m, &out));
  CHECKF(stopped == want_stop, "stopped %d, want %d", stopped, want_stop);
  CHECKF(out.len == want && (want == 0 || memcmp(out.data, text, want) == 0), "released %zu bytes, want %zu",
         out.len, want);
  /* Nothing more after a stop. */
  if (stopped) {
    const size_t before = out.len;
    CHECK(ina_stop_text_feed(&m, "ab", 2, &out) == 1 && out.len == before);
  }
  ina_text_buf_release(&out);
  ina_stop_text_release(&m);
}

int main(void) {
  test_rng_t rng = {test_seed("test_stop_text")};
  for (int t = 0; t < 20000; t++) trial(&rng);
  /* An empty stop string is refused. */
  ina_stop_text_t m;
  const char *empty = "";
  const size_t zero = 0;
  CHECK(ina_stop_text_init(&m, &empty, &zero, 1) == INA_ERR_INVALID_ARGUMENT);
  return test_finish("test_stop_text");
}
