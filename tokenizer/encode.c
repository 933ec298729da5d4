/* Encoding: text → ids through the stages in `tokenizers`' order: invalid UTF-8 to
 * U+FFFD, added tokens (raw), normalizer and added tokens (normalized), pre-tokenizer,
 * BPE per piece, post-processor. Batches run over the thread pool, one text per task
 * with its own scratch, so that the tokenizer itself is only read. */
#define INA_LOG_SUBSYS "tokenizer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"

static ina_status_t push_ids(int32_t **ids, size_t *n, size_t *cap, const int32_t *src, size_t m) {
  ina_status_t st = INA_OK;
  if (*n + m > *cap) {
    size_t c = *cap ? *cap : 64;
    while (c < *n + m) c *= 2;
    int32_t *p = realloc(*ids, c * sizeof *p);
    INA_CHECK_ALLOC(p);
    *ids = p;
    *cap = c;
  }
  if (m) memcpy(*ids + *n, src, m * sizeof *src);
  *n += m;
fail:
  return st;
}

static ina_status_t encode_one(const ina_tokenizer_t *tok, const char *text, size_t len, int add_special,
                               tk_scratch_t *sc, int32_t **out_ids, size_t *out_n) {
  ina_status_t st = INA_OK;
  tk_pieces_t a = {0}, b = {0};
  tk_buf_t clean = {0}, norm = {0};
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;

  /* Rust strings are UTF-8: the text is taken as from_utf8_lossy makes it. */
  const char *s = text;
  size_t sl = len;
  if (!tk_utf8_valid(text, len)) {
    INA_CHECK(tk_utf8_lossy(&clean, text, len));
    s = clean.p;
    sl = clean.len;
  }
  if (tok->trie_raw.num_nodes > 1) {
    INA_CHECK(tk_added_split(tok, &tok->trie_raw, s, sl, &a));
  } else {
    INA_CHECK(tk_pieces_text(&a, s, sl));
  }
  if (tok->normalizer.n > 0 || tok->trie_norm.num_nodes > 1) {
    for (size_t i = 0; i < a.n; i++) {
      if (a.v[i].id >= 0) {
        INA_CHECK(tk_pieces_token(&b, a.v[i].id));
        continue;
      }
      norm.len = 0;
      INA_CHECK(tk_normalize(&tok->normalizer, a.text.p + a.v[i].off, a.v[i].len, &norm));
      if (tok->trie_norm.num_nodes > 1) {
        INA_CHECK(tk_added_split(tok, &tok->trie_norm, norm.p ? norm.p : "", norm.len, &b));
      } else {
        INA_CHECK(tk_pieces_text(&b, norm.p ? norm.p : "", norm.len));
      }
    }
    const tk_pieces_t t = a;
    a = b;
    b = t;
  }
  INA_CHECK(tk_pretokenize(&tok->pre, sc, &a, &b));

  if (add_special) INA_CHECK(push_ids(&ids, &n, &cap, tok->post.prefix, tok->post.num_prefix));
  for (size_t i = 0; i < a.n; i++) {
    if (a.v[i].id >= 0) {
      INA_CHECK(push_ids(&ids, &n, &cap, &a.v[i].id, 1));
    } else {
      INA_CHECK(tk_bpe_word(&tok->bpe, sc, a.text.p + a.v[i].off, a.v[i].len, &ids, &n, &cap));
    }
  }
  if (add_special) INA_CHECK(push_ids(&ids, &n, &cap, tok->post.suffix, tok->post.num_suffix));
  if (!ids) { /* never NULL on success */
    ids = malloc(sizeof *ids);
    INA_CHECK_ALLOC(ids);
  }
  *out_ids = ids;
  *out_n = n;
  ids = NULL;
fail:
  free(ids);
  tk_pieces_free(&a);
  tk_pieces_free(&b);
  tk_buf_free(&clean);
  tk_buf_free(&norm);
  return st;
}

ina_status_t ina_tokenizer_encode(const ina_tokenizer_t *tok, const char *text, size_t len, int add_special,
                                  int32_t **ids, size_t *num_ids) {
  ina_status_t st = INA_OK;
  tk_scratch_t sc = {0};
  INA_REQUIRE(ids != NULL && num_ids != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_encode: ids or num_ids is NULL");
  *ids = NULL;
  *num_ids = 0;
  INA_REQUIRE(tok != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_encode: tok is NULL");
  INA_REQUIRE(text != NULL || len == 0, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_encode: text is NULL");
  INA_CHECK(encode_one(tok, text ? text : "", len, add_special, &sc, ids, num_ids));
fail:
  tk_scratch_free(&sc);
  return st;
}

typedef struct batch_ctx {
  const ina_tokenizer_t *tok;
  const char *const *texts;
  const size_t *lens;
  int add_special;
  int32_t **ids;
  size_t *num_ids;
  ina_status_t *status;
} batch_ctx_t;

static void batch_range(void *ctx, int64_t begin, int64_t end, int worker) {
  batch_ctx_t *c = ctx;
  tk_scratch_t sc = {0};
  for (int64_t i = begin; i < end; i++) {
    const char *t = c->texts[i] ? c->texts[i] : "";
    c->status[i] = encode_one(c->tok, t, c->texts[i] ? c->lens[i] : 0, c->add_special, &sc, &c->ids[i], &c->num_ids[i]);
  }
  tk_scratch_free(&sc);
}

ina_status_t ina_tokenizer_encode_batch(const ina_tokenizer_t *tok, const char *const *texts, const size_t *lens,
                                        size_t count, int add_special, ina_threadpool_t *pool, int32_t **ids,
                                        size_t *num_ids) {
  ina_status_t st = INA_OK;
  ina_status_t *status = NULL;
  INA_REQUIRE(ids != NULL && num_ids != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_tokenizer_encode_batch: ids or num_ids is NULL");
  for (size_t i = 0; i < count; i++) {
    ids[i] = NULL;
    num_ids[i] = 0;
  }
  INA_REQUIRE(tok != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_encode_batch: tok is NULL");
  INA_REQUIRE(count == 0 || (texts != NULL && lens != NULL), INA_ERR_INVALID_ARGUMENT,
              "ina_tokenizer_encode_batch: texts or lens is NULL");
  for (size_t i = 0; i < count; i++)
    INA_REQUIRE(texts[i] != NULL || lens[i] == 0, INA_ERR_INVALID_ARGUMENT,
                "ina_tokenizer_encode_batch: texts[%zu] is NULL with length %zu", i, lens[i]);
  if (count == 0) return INA_OK;
  status = calloc(count, sizeof *status);
  INA_CHECK_ALLOC(status);
  batch_ctx_t ctx = {tok, texts, lens, add_special, ids, num_ids, status};
  ina_parallel_for(pool, (int64_t)count, 1, batch_range, &ctx);
  for (size_t i = 0; i < count; i++) {
    if (status[i] == INA_OK) continue;
    /* The message was recorded on a worker's thread: encode that text again here (the
     * same input fails the same way) so that this thread's last error says why. */
    int32_t *again = NULL;
    size_t n_again = 0;
    tk_scratch_t sc = {0};
    st = encode_one(tok, texts[i] ? texts[i] : "", lens[i], add_special, &sc, &again, &n_again);
    tk_scratch_free(&sc);
    free(again);
    if (st == INA_OK) {
      st = status[i];
      ina_error(INA_LOG_SUBSYS, "ina_tokenizer_encode_batch: texts[%zu] failed: %s", i, ina_status_string(st));
    } else {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", ina_last_error());
      ina_error(INA_LOG_SUBSYS, "ina_tokenizer_encode_batch: texts[%zu]: %s", i, msg);
    }
    goto fail;
  }
  free(status);
  return INA_OK;
fail:
  for (size_t i = 0; ids && num_ids && i < count; i++) {
    free(ids[i]);
    ids[i] = NULL;
    num_ids[i] = 0;
  }
  free(status);
  return st;
}
