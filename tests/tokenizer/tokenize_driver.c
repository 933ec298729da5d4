/* Runs the tokenizer over a file of texts for tests/tokenizer/check_hf_tokenizers.py.
 *
 *   tokenize_driver TOKENIZER_JSON TEXTS OUT [--config CONFIG_JSON] [--add-special]
 *                   [--skip-special] [--threads N]
 *
 * TEXTS holds the texts as (uint32 little-endian byte length, bytes). OUT receives, per
 * text: uint32 number of ids, the ids as int32, uint32 decoded length, the decode of
 * those ids (skip_special as asked). The texts are encoded in one
 * ina_tokenizer_encode_batch (over a pool of N threads; 0: the caller's thread only);
 * every decode is also streamed through a detokenizer, and a text whose streamed text
 * differs from the decode, or which contains a piece that is not whole UTF-8 characters,
 * is reported on stderr and makes the exit status 3.
 *
 *   tokenize_driver --bench TOKENIZER_JSON TEXT_FILE [REPEAT]
 * encodes the whole file (REPEAT times) on one thread and prints MB/s. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/threadpool.h"
#include "tokenizer/tokenizer.h"

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    exit(2);
  }
  size_t cap = 1 << 20, n = 0;
  char *buf = malloc(cap);
  for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += r;
    if (n == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  if (!buf) exit(2);
  *len = n;
  return buf;
}

static int whole_utf8(const char *s, size_t n) {
  /* Each piece must be whole characters: no lead byte without its continuations. */
  for (size_t i = 0; i < n;) {
    const unsigned char c = (unsigned char)s[i];
    size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (k == 0 || i + k > n) return 0;
    for (size_t j = 1; j < k; j++)
      if (((unsigned char)s[i + j] & 0xC0) != 0x80) return 0;
    i += k;
  }
  return 1;
}

static ina_tokenizer_t *load(const char *path, const char *config_path) {
  size_t tl = 0, cl = 0;
  char *tj = read_all(path, &tl), *cj = config_path ? read_all(config_path, &cl) : NULL;
  ina_tokenizer_t *tok = NULL;
  if (ina_tokenizer_load_json(tj, tl, cj, cl, path, &tok) != 0) {
    fprintf(stderr, "tokenize_driver: %s\n", ina_last_error());
    exit(2);
  }
  free(tj);
  free(cj);
  return tok;
}

static int bench(int argc, char **argv) {
  if (argc < 4) return 2;
  ina_tokenizer_t *tok = load(argv[2], NULL);
  size_t n = 0;
  char *text = read_all(argv[3], &n);
  const int repeat = argc > 4 ? atoi(argv[4]) : 3;
  double best = 1e30;
  size_t ids_total = 0;
  for (int r = 0; r < repeat; r++) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int32_t *ids = NULL;
    size_t num = 0;
    if (ina_tokenizer_encode(tok, text, n, 0, &ids, &num) != 0) {
      fprintf(stderr, "encode: %s\n", ina_last_error());
      return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    const double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    if (s < best) best = s;
    ids_total = num;
    free(ids);
  }
  printf("encode: %zu bytes -> %zu ids, best of %d: %.3f s, %.2f MB/s (1 thread)\n", n, ids_total, repeat, best,
         (double)n / best / 1e6);
  free(text);
  ina_tokenizer_destroy(tok);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--bench") == 0) return bench(argc, argv);
  if (argc < 4) {
    fprintf(stderr, "usage: tokenize_driver TOKENIZER_JSON TEXTS OUT [--config F] [--add-special] "
                    "[--skip-special] [--threads N]\n");
    return 2;
  }
  const char *config = NULL;
  int add_special = 0, skip_special = 0, threads = 2;
  for (int i = 4; i < argc; i++) {
    if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) config = argv[++i];
    else if (strcmp(argv[i], "--add-special") == 0) add_special = 1;
    else if (strcmp(argv[i], "--skip-special") == 0) skip_special = 1;
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
    else {
      fprintf(stderr, "tokenize_driver: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  ina_tokenizer_t *tok = load(argv[1], config);
  size_t in_len = 0;
  char *in = read_all(argv[2], &in_len);
  size_t count = 0;
  for (size_t off = 0; off + 4 <= in_len; count++) {
    uint32_t l;
    memcpy(&l, in + off, 4);
    off += 4 + l;
  }
  const char **texts = calloc(count + 1, sizeof *texts);
  size_t *lens = calloc(count + 1, sizeof *lens), *num_ids = calloc(count + 1, sizeof *num_ids);
  int32_t **ids = calloc(count + 1, sizeof *ids);
  size_t off = 0;
  for (size_t i = 0; i < count; i++) {
    uint32_t l;
    memcpy(&l, in + off, 4);
    texts[i] = in + off + 4;
    lens[i] = l;
    off += 4 + l;
  }
  ina_threadpool_t *pool = NULL;
  if (threads > 0 && ina_threadpool_create(threads, &pool) != 0) return 2;
  if (ina_tokenizer_encode_batch(tok, texts, lens, count, add_special, pool, ids, num_ids) != 0) {
    fprintf(stderr, "tokenize_driver: encode_batch: %s\n", ina_last_error());
    return 2;
  }
  FILE *out = fopen(argv[3], "wb");
  if (!out) {
    perror(argv[3]);
    return 2;
  }
  int bad = 0;
  for (size_t i = 0; i < count; i++) {
    const uint32_t n = (uint32_t)num_ids[i];
    fwrite(&n, 4, 1, out);
    fwrite(ids[i], 4, n, out);
    char *text = NULL;
    size_t tl = 0;
    if (ina_tokenizer_decode(tok, ids[i], n, skip_special, &text, &tl) != 0) {
      fprintf(stderr, "tokenize_driver: text %zu: decode: %s\n", i, ina_last_error());
      return 2;
    }
    const uint32_t l = (uint32_t)tl;
    fwrite(&l, 4, 1, out);
    fwrite(text, 1, tl, out);
    /* The stream of the same ids. */
    ina_detokenizer_t *d = NULL;
    if (ina_detokenizer_create(tok, skip_special, &d) != 0) return 2;
    char *acc = malloc(tl + 64);
    size_t al = 0, acap = tl + 64;
    for (size_t k = 0; k <= n; k++) {
      char *piece = NULL;
      size_t pl = 0;
      const int st = k < n ? ina_detokenizer_push(d, ids[i][k], &piece, &pl) : ina_detokenizer_flush(d, &piece, &pl);
      if (st != 0) {
        fprintf(stderr, "tokenize_driver: text %zu: detokenizer: %s\n", i, ina_last_error());
        return 2;
      }
      if (!whole_utf8(piece, pl)) {
        fprintf(stderr, "tokenize_driver: text %zu: the stream emitted a partial character\n", i);
        bad = 1;
      }
      if (al + pl + 1 > acap) acc = realloc(acc, acap = 2 * (al + pl + 1));
      memcpy(acc + al, piece, pl);
      al += pl;
      free(piece);
    }
    if (al != tl || memcmp(acc, text, tl) != 0) {
      fprintf(stderr, "tokenize_driver: text %zu: streamed text differs from decode\n", i);
      bad = 1;
    }
    free(acc);
    ina_detokenizer_destroy(d);
    free(text);
    free(ids[i]);
  }
  fclose(out);
  ina_threadpool_destroy(pool);
  ina_tokenizer_destroy(tok);
  free(texts);
  free(lens);
  free(num_ids);
  free(ids);
  free(in);
  return bad ? 3 : 0;
}
