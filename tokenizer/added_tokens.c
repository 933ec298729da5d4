/* Added tokens: reading tokenizer.json's added_tokens with the ids `tokenizers` gives
 * them, and splitting them out of the text before the normalizer and pre-tokenizer run.
 *
 * As AddedVocabulary does it: tokens with normalized=false are matched in the raw text;
 * the text between them is normalized and then the normalized=true tokens (their
 * contents normalized the same way) are matched in it. Matching is leftmost-longest
 * without overlaps; a single_word token only counts when no word character touches it;
 * lstrip / rstrip make the token swallow the whitespace on its left / right. */
#define INA_LOG_SUBSYS "tokenizer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/log.h"
#include "tokenizer/internal.h"

/* ---- trie -------------------------------------------------------------------------- */

static ina_status_t trie_node(tk_trie_t *t, unsigned char byte, int32_t *out) {
  ina_status_t st = INA_OK;
  if (t->num_nodes == t->cap) {
    const size_t cap = t->cap ? t->cap * 2 : 64;
    tk_trie_node_t *v = realloc(t->nodes, cap * sizeof *v);
    INA_CHECK_ALLOC(v);
    t->nodes = v;
    t->cap = cap;
  }
  t->nodes[t->num_nodes] = (tk_trie_node_t){-1, -1, -1, byte};
  *out = (int32_t)t->num_nodes++;
fail:
  return st;
}

static int32_t trie_child(const tk_trie_t *t, int32_t node, unsigned char byte) {
  for (int32_t c = t->nodes[node].first_child; c >= 0; c = t->nodes[c].next_sibling)
    if (t->nodes[c].byte == byte) return c;
  return -1;
}

ina_status_t tk_trie_build(tk_trie_t *t, const char *const *contents, const size_t *lens, const int32_t *tokens,
                           size_t n) {
  ina_status_t st = INA_OK;
  int32_t root;
  memset(t, 0, sizeof *t);
  INA_CHECK(trie_node(t, 0, &root));
  for (size_t i = 0; i < n; i++) {
    if (lens[i] == 0) continue; /* an empty token matches nothing */
    int32_t node = 0;
    for (size_t k = 0; k < lens[i]; k++) {
      const unsigned char b = (unsigned char)contents[i][k];
      int32_t c = trie_child(t, node, b);
      if (c < 0) {
        INA_CHECK(trie_node(t, b, &c));
        t->nodes[c].next_sibling = t->nodes[node].first_child;
        t->nodes[node].first_child = c;
      }
      node = c;
    }
    /* The first of equal contents wins, as the first pattern does in Aho-Corasick. */
    if (t->nodes[node].token < 0) t->nodes[node].token = tokens[i];
    t->first[(unsigned char)contents[i][0]] = 1;
  }
fail:
  return st;
}

void tk_trie_free(tk_trie_t *t) {
  free(t->nodes);
  memset(t, 0, sizeof *t);
}

/* The leftmost-longest token match at or after `from`: 1 with [*ms, *me) and the index
 * into added[]. */
static int trie_find(const tk_trie_t *t, const char *s, size_t n, size_t from, size_t *ms, size_t *me, int32_t *tok) {
  for (size_t i = from; i < n; i++) {
    if (!t->first[(unsigned char)s[i]]) continue;
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < n; k++) {
      node = trie_child(t, node, (unsigned char)s[k]);
      if (node < 0) break;
      if (t->nodes[node].token >= 0) {
        best = t->nodes[node].token;
        best_end = k + 1;
      }
    }
    if (best >= 0) {
      *ms = i;
      *me = best_end;
      *tok = best;
      return 1;
    }
  }
  return 0;
}

/* ---- splitting --------------------------------------------------------------------- */

/* The code point ending at s[end) (well-formed UTF-8, end > 0). */
static uint32_t cp_before(const char *s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
  size_t adv;
  const int32_t cp = tk_utf8_next((const unsigned char *)s + i, end - i, &adv, NULL);
  return cp < 0 ? 0xFFFD : (uint32_t)cp;
}

static uint32_t cp_at(const char *s, size_t n, size_t i, size_t *adv) {
  const int32_t cp = tk_utf8_next((const unsigned char *)s + i, n - i, adv, NULL);
  return cp < 0 ? 0xFFFD : (uint32_t)cp;
}

ina_status_t tk_added_split(const ina_tokenizer_t *tok, const tk_trie_t *trie, const char *s, size_t n,
                            tk_pieces_t *out) {
  ina_status_t st = INA_OK;
  size_t start_offset = 0, from = 0, ms, me;
  int32_t idx;
  while (from < n && trie_find(trie, s, n, from, &ms, &me, &idx)) {
    from = me; /* the search goes on after the match, whatever is made of it */
    const tk_added_t *a = &tok->added[idx];
    size_t start = ms, stop = me;
    if (a->single_word) {
      const int start_space = start == 0 || !tk_is_word(cp_before(s, start));
      size_t adv;
      const int stop_space = stop == n || !tk_is_word(cp_at(s, n, stop, &adv));
      if (!start_space || !stop_space) continue;
    }
    if (a->lstrip) {
      size_t ns = start;
      while (ns > 0) {
        const size_t prev_end = ns;
        size_t i = prev_end - 1;
        while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
        if (!tk_is_white_space(cp_before(s, prev_end))) break;
        ns = i;
      }
      /* Spaces an earlier token's rstrip took stay with it. */
      start = ns > start_offset ? ns : start_offset;
    }
    if (a->rstrip) {
      size_t adv;
      while (stop < n && tk_is_white_space(cp_at(s, n, stop, &adv))) stop += adv;
    }
    if (start_offset < start) INA_CHECK(tk_pieces_text(out, s + start_offset, start - start_offset));
    INA_CHECK(tk_pieces_token(out, a->id));
    start_offset = stop;
  }
  if (start_offset < n) INA_CHECK(tk_pieces_text(out, s + start_offset, n - start_offset));
fail:
  return st;
}

/* ---- reading added_tokens ------------------------------------------------------------ */

static ina_status_t flag(const json_t *t, const char *key, int dflt, const char *origin, size_t i, int *out) {
  ina_status_t st = INA_OK;
  const json_t *v = json_object_get(t, key);
  *out = dflt;
  if (!v || json_is_null(v)) return INA_OK;
  INA_REQUIRE(json_is_boolean(v), INA_ERR_FORMAT, "%s: added_tokens[%zu].%s: expected a boolean", origin, i, key);
  *out = json_is_true(v);
fail:
  return st;
}

/* Gives id → token strings room for ids below num. */
static ina_status_t grow_ids(ina_tokenizer_t *tok, int32_t num) {
  ina_status_t st = INA_OK;
  if (num <= tok->num_ids) return INA_OK;
  char **t = realloc(tok->tokens, ((size_t)num + 1) * sizeof *t);
  INA_CHECK_ALLOC(t);
  tok->tokens = t;
  uint32_t *l = realloc(tok->token_lens, ((size_t)num + 1) * sizeof *l);
  INA_CHECK_ALLOC(l);
  tok->token_lens = l;
  for (int32_t i = tok->num_ids; i <= num; i++) {
    tok->tokens[i] = NULL;
    tok->token_lens[i] = 0;
  }
  tok->num_ids = num;
fail:
  return st;
}

ina_status_t tk_added_parse(const json_t *list, const char *origin, ina_tokenizer_t *tok) {
  ina_status_t st = INA_OK;
  INA_CHECK(tk_strmap_init(&tok->added_map, 16));
  if (!list || json_is_null(list)) return INA_OK;
  INA_REQUIRE(json_is_array(list), INA_ERR_FORMAT, "%s: added_tokens: expected an array", origin);
  const size_t n = json_array_size(list);
  tok->added = calloc(n ? n : 1, sizeof *tok->added);
  INA_CHECK_ALLOC(tok->added);
  int32_t max_added = -1; /* the largest id in added_tokens_map so far */
  for (size_t i = 0; i < n; i++) {
    const json_t *t = json_array_get(list, i);
    INA_REQUIRE(json_is_object(t), INA_ERR_FORMAT, "%s: added_tokens[%zu]: expected an object", origin, i);
    const json_t *content = json_object_get(t, "content");
    INA_REQUIRE(json_is_string(content), INA_ERR_FORMAT, "%s: added_tokens[%zu]: missing string 'content'", origin, i);
    const json_t *jid = json_object_get(t, "id");
    INA_REQUIRE(json_is_integer(jid), INA_ERR_FORMAT, "%s: added_tokens[%zu]: missing integer 'id'", origin, i);
    const char *c = json_string_value(content);
    const size_t len = json_string_length(content);
    if (len == 0) continue; /* ignored, as add_tokens ignores empty contents */
    if (tk_strmap_get(&tok->added_map, c, len) >= 0) continue; /* a repeated content: the first stays */

    tk_added_t *a = &tok->added[tok->num_added];
    INA_CHECK(flag(t, "special", 0, origin, i, &a->special));
    INA_CHECK(flag(t, "single_word", 0, origin, i, &a->single_word));
    INA_CHECK(flag(t, "lstrip", 0, origin, i, &a->lstrip));
    INA_CHECK(flag(t, "rstrip", 0, origin, i, &a->rstrip));
    INA_CHECK(flag(t, "normalized", !a->special, origin, i, &a->normalized));
    /* add_tokens' id: the vocabulary's when the content is in it, else the next one
     * after the model's vocabulary and the added tokens so far. */
    int32_t id = tk_strmap_get(&tok->bpe.vocab, c, len);
    if (id < 0) {
      const int32_t vs = (int32_t)tok->bpe.vocab_count;
      id = max_added < 0 ? vs : (max_added >= vs || vs == 0 ? max_added + 1 : vs);
      INA_REQUIRE(id < (1 << 24), INA_ERR_FORMAT, "%s: added_tokens[%zu]: too many ids", origin, i);
      INA_REQUIRE(id >= tok->num_ids || tok->tokens[id] == NULL, INA_ERR_FORMAT,
                  "%s: added_tokens[%zu]: '%s' would take id %d, which the vocabulary gives to '%s'", origin, i, c,
                  id, tok->tokens[id]);
    }
    if (json_integer_value(jid) != id)
      INA_LOG_W(INA_LOG_SUBSYS, "%s: added_tokens[%zu]: '%s' has id %lld in the file but takes id %d, as in "
                                "Hugging Face tokenizers", origin, i, c, (long long)json_integer_value(jid), id);
    if (id > max_added) max_added = id;
    a->content = malloc(len + 1);
    INA_CHECK_ALLOC(a->content);
    memcpy(a->content, c, len + 1);
    a->len = len;
    a->id = id;
    tok->num_added++;
    INA_CHECK(tk_strmap_put(&tok->added_map, a->content, len, id, NULL));
    INA_CHECK(grow_ids(tok, id + 1));
    if (!tok->tokens[id]) {
      tok->tokens[id] = malloc(len + 1);
      INA_CHECK_ALLOC(tok->tokens[id]);
      memcpy(tok->tokens[id], c, len + 1);
      tok->token_lens[id] = (uint32_t)len;
    }
  }
fail:
  return st;
}

/* Builds both tries (after the normalizer is known) and the special flags per id. */
ina_status_t tk_added_finish(ina_tokenizer_t *tok) {
  ina_status_t st = INA_OK;
  const size_t n = tok->num_added;
  const char **contents = calloc(n + 1, sizeof *contents);
  size_t *lens = calloc(n + 1, sizeof *lens);
  int32_t *idx = calloc(n + 1, sizeof *idx);
  tk_buf_t nb = {0};
  INA_CHECK_ALLOC(contents);
  INA_CHECK_ALLOC(lens);
  INA_CHECK_ALLOC(idx);
  tok->special = calloc((size_t)tok->num_ids + 1, 1);
  INA_CHECK_ALLOC(tok->special);
  tok->norm_contents = calloc(n + 1, sizeof *tok->norm_contents);
  INA_CHECK_ALLOC(tok->norm_contents);
  for (size_t i = 0; i < n; i++)
    if (tok->added[i].special) tok->special[tok->added[i].id] = 1;

  /* Patterns in AddedVocabulary's order: the special tokens, then the others. */
  for (int pass = 0; pass < 2; pass++) {
    size_t m = 0;
    for (int sp = 1; sp >= 0; sp--)
      for (size_t i = 0; i < n; i++) {
        const tk_added_t *a = &tok->added[i];
        if (a->special != sp || a->normalized != pass) continue;
        if (pass == 0) {
          contents[m] = a->content;
          lens[m] = a->len;
        } else {
          nb.len = 0;
          INA_CHECK(tk_normalize(&tok->normalizer, a->content, a->len, &nb));
          char *c = malloc(nb.len + 1);
          INA_CHECK_ALLOC(c);
          memcpy(c, nb.p ? nb.p : "", nb.len);
          c[nb.len] = '\0';
          tok->norm_contents[tok->num_norm_contents++] = c;
          contents[m] = c;
          lens[m] = nb.len;
          /* `tokenizers` gives the normalized form back as the id's token (id_to_token,
           * decode), while token_to_id still takes the content as written. */
          if (tok->normalizer.n > 0 && (nb.len != tok->token_lens[a->id] || memcmp(c, tok->tokens[a->id], nb.len))) {
            char *t = malloc(nb.len + 1);
            INA_CHECK_ALLOC(t);
            memcpy(t, c, nb.len + 1);
            free(tok->tokens[a->id]);
            tok->tokens[a->id] = t;
            tok->token_lens[a->id] = (uint32_t)nb.len;
          }
        }
        idx[m++] = (int32_t)i;
      }
    INA_CHECK(tk_trie_build(pass == 0 ? &tok->trie_raw : &tok->trie_norm, contents, lens, idx, m));
  }
fail:
  free(contents);
  free(lens);
  free(idx);
  tk_buf_free(&nb);
  return st;
}
