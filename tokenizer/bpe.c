/* The BPE model: the vocabulary, the merges with their ranks, and the merge loop of one
 * pre-tokenized word.
 *
 * The loop is `tokenizers`' Word::merge_all without dropout: every adjacent pair with a
 * merge goes into a priority queue ordered by (rank, position); the lowest is merged
 * unless it went stale (its left symbol was merged away, or the pair there changed), and
 * the pairs the new symbol forms with its neighbors are queued. Equal ranks at several
 * positions merge leftmost first. Characters missing from the vocabulary go to
 * byte_fallback's <0xXX> tokens when all of their bytes have one, else to unk_token
 * (fused when fuse_unk), else they are dropped, as merge_word does. */
#define INA_LOG_SUBSYS "tokenizer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"

/* Ids above this are refused: the id → token table is dense. */
#define MAX_ID (1 << 24)

/* ---- merge table ------------------------------------------------------------------- */

static size_t pair_hash(uint64_t key, size_t mask) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  return (size_t)key & mask;
}

static inline uint64_t pair_key(int32_t a, int32_t b) { return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1; }

/* The merge of (a, b): its slot, or NULL. */
static inline const tk_merge_slot_t *merge_find(const tk_bpe_t *bpe, int32_t a, int32_t b) {
  if (!bpe->merges) return NULL;
  const uint64_t key = pair_key(a, b);
  for (size_t h = pair_hash(key, bpe->merge_mask);; h = (h + 1) & bpe->merge_mask) {
    const tk_merge_slot_t *s = &bpe->merges[h];
    if (s->key == key) return s;
    if (s->key == 0) return NULL;
  }
}

/* Later duplicates replace earlier ones, as collecting the merges into a HashMap does. */
static void merge_put(tk_bpe_t *bpe, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
  const uint64_t key = pair_key(a, b);
  size_t h = pair_hash(key, bpe->merge_mask);
  while (bpe->merges[h].key != 0 && bpe->merges[h].key != key) h = (h + 1) & bpe->merge_mask;
  bpe->merges[h] = (tk_merge_slot_t){key, rank, new_id};
}

/* ---- parsing ----------------------------------------------------------------------- */

static ina_status_t opt_bool(const json_t *m, const char *key, const char *origin, int *out) {
  ina_status_t st = INA_OK;
  const json_t *v = json_object_get(m, key);
  *out = 0;
  if (!v || json_is_null(v)) return INA_OK;
  INA_REQUIRE(json_is_boolean(v), INA_ERR_FORMAT, "%s: model.%s: expected a boolean", origin, key);
  *out = json_is_true(v);
fail:
  return st;
}

/* A merge's two parts: "a b" (exactly one space, as convert_merges_to_hashmap splits
 * it) or ["a", "b"]. */
static ina_status_t merge_parts(const json_t *m, size_t i, const char *origin, const char **a, size_t *al,
                                const char **b, size_t *bl) {
  ina_status_t st = INA_OK;
  if (json_is_string(m)) {
    const char *s = json_string_value(m);
    const size_t n = json_string_length(m);
    const char *sp = memchr(s, ' ', n);
    INA_REQUIRE(sp && !memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1), INA_ERR_FORMAT,
                "%s: model.merges[%zu]: '%.*s' is not two tokens separated by one space", origin, i,
                (int)(n > 100 ? 100 : n), s);
    *a = s;
    *al = (size_t)(sp - s);
    *b = sp + 1;
    *bl = n - *al - 1;
    return INA_OK;
  }
  INA_REQUIRE(json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                  json_is_string(json_array_get(m, 1)),
              INA_ERR_FORMAT, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", origin, i);
  *a = json_string_value(json_array_get(m, 0));
  *al = json_string_length(json_array_get(m, 0));
  *b = json_string_value(json_array_get(m, 1));
  *bl = json_string_length(json_array_get(m, 1));
fail:
  return st;
}

ina_status_t tk_bpe_parse(const json_t *model, const char *origin, ina_tokenizer_t *tok) {
  ina_status_t st = INA_OK;
  tk_bpe_t *bpe = &tok->bpe;
  char *joined = NULL;
  memset(bpe, 0, sizeof *bpe);
  bpe->unk_id = -1;
  INA_REQUIRE(json_is_object(model), INA_ERR_FORMAT, "%s: model: expected an object", origin);
  const json_t *type = json_object_get(model, "type");
  INA_REQUIRE(type == NULL || json_is_string(type), INA_ERR_FORMAT, "%s: model.type: expected a string", origin);
  INA_REQUIRE(type == NULL || strcmp(json_string_value(type), "BPE") == 0, INA_ERR_UNSUPPORTED,
              "%s: model: type '%s' is not supported (only BPE)", origin, json_string_value(type));

  const json_t *dropout = json_object_get(model, "dropout");
  INA_REQUIRE(!dropout || json_is_null(dropout) || (json_is_number(dropout) && json_number_value(dropout) == 0.0),
              INA_ERR_UNSUPPORTED, "%s: model.dropout: BPE dropout is not supported", origin);
  static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int k = 0; k < 2; k++) {
    const json_t *v = json_object_get(model, affixes[k]);
    INA_REQUIRE(!v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0), INA_ERR_UNSUPPORTED,
                "%s: model.%s: only null or \"\" is supported", origin, affixes[k]);
  }
  INA_CHECK(opt_bool(model, "fuse_unk", origin, &bpe->fuse_unk));
  INA_CHECK(opt_bool(model, "byte_fallback", origin, &bpe->byte_fallback));
  INA_CHECK(opt_bool(model, "ignore_merges", origin, &bpe->ignore_merges));

  /* The vocabulary: every id once, ids dense enough for a table. */
  const json_t *vocab = json_object_get(model, "vocab");
  INA_REQUIRE(vocab != NULL, INA_ERR_FORMAT, "%s: model: missing 'vocab'", origin);
  INA_REQUIRE(json_is_object(vocab), INA_ERR_FORMAT, "%s: model.vocab: expected an object", origin);
  int64_t max_id = -1;
  const char *key;
  size_t key_len;
  json_t *val;
  json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
    INA_REQUIRE(json_is_integer(val), INA_ERR_FORMAT, "%s: model.vocab['%.*s']: expected an integer id", origin,
                (int)(key_len > 100 ? 100 : key_len), key);
    const json_int_t id = json_integer_value(val);
    INA_REQUIRE(id >= 0 && id < MAX_ID, INA_ERR_FORMAT, "%s: model.vocab['%.*s']: id %lld is out of range [0, %d)",
                origin, (int)(key_len > 100 ? 100 : key_len), key, (long long)id, MAX_ID);
    if (id > max_id) max_id = id;
  }
  tok->num_ids = (int32_t)(max_id + 1);
  tok->tokens = calloc((size_t)tok->num_ids + 1, sizeof *tok->tokens);
  INA_CHECK_ALLOC(tok->tokens);
  tok->token_lens = calloc((size_t)tok->num_ids + 1, sizeof *tok->token_lens);
  INA_CHECK_ALLOC(tok->token_lens);
  INA_CHECK(tk_strmap_init(&bpe->vocab, json_object_size(vocab)));
  json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
    const int32_t id = (int32_t)json_integer_value(val);
    INA_REQUIRE(tok->tokens[id] == NULL, INA_ERR_FORMAT, "%s: model.vocab: id %d is given to both '%s' and '%.*s'",
                origin, id, tok->tokens[id], (int)(key_len > 100 ? 100 : key_len), key);
    tok->tokens[id] = malloc(key_len + 1);
    INA_CHECK_ALLOC(tok->tokens[id]);
    memcpy(tok->tokens[id], key, key_len + 1);
    tok->token_lens[id] = (uint32_t)key_len;
    INA_CHECK(tk_strmap_put(&bpe->vocab, tok->tokens[id], key_len, id, NULL));
  }
  bpe->vocab_count = json_object_size(vocab);

  /* Fast lookups of one-character tokens and of byte_fallback's byte tokens. */
  for (int i = 0; i < 512; i++) {
    char c[4];
    bpe->char_id[i] = tk_strmap_get(&bpe->vocab, c, tk_utf8_put((uint32_t)i, c));
  }
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    bpe->byte_fallback_id[b] = bpe->byte_fallback ? tk_strmap_get(&bpe->vocab, name, 6) : -1;
  }

  const json_t *unk = json_object_get(model, "unk_token");
  if (unk && !json_is_null(unk)) {
    INA_REQUIRE(json_is_string(unk), INA_ERR_FORMAT, "%s: model.unk_token: expected a string", origin);
    bpe->unk_id = tk_strmap_get(&bpe->vocab, json_string_value(unk), json_string_length(unk));
    /* `tokenizers` would fail on the first unknown character instead. */
    INA_REQUIRE(bpe->unk_id >= 0, INA_ERR_FORMAT, "%s: model.unk_token: '%s' is not in the vocabulary", origin,
                json_string_value(unk));
  }

  const json_t *merges = json_object_get(model, "merges");
  INA_REQUIRE(merges == NULL || json_is_array(merges), INA_ERR_FORMAT, "%s: model.merges: expected an array",
              origin);
  const size_t nm = merges ? json_array_size(merges) : 0;
  size_t slots = 16;
  while (slots < nm * 2) slots *= 2;
  bpe->merges = calloc(slots, sizeof *bpe->merges);
  INA_CHECK_ALLOC(bpe->merges);
  bpe->merge_mask = slots - 1;
  bpe->num_merges = nm;
  size_t joined_cap = 0;
  for (size_t i = 0; i < nm; i++) {
    const char *a, *b;
    size_t al, bl;
    INA_CHECK(merge_parts(json_array_get(merges, i), i, origin, &a, &al, &b, &bl));
    const int32_t ia = tk_strmap_get(&bpe->vocab, a, al), ib = tk_strmap_get(&bpe->vocab, b, bl);
    INA_REQUIRE(ia >= 0, INA_ERR_FORMAT, "%s: model.merges[%zu]: token '%.*s' is not in the vocabulary", origin, i,
                (int)(al > 100 ? 100 : al), a);
    INA_REQUIRE(ib >= 0, INA_ERR_FORMAT, "%s: model.merges[%zu]: token '%.*s' is not in the vocabulary", origin, i,
                (int)(bl > 100 ? 100 : bl), b);
    if (al + bl > joined_cap) {
      joined_cap = 2 * (al + bl);
      free(joined);
      joined = malloc(joined_cap);
      INA_CHECK_ALLOC(joined);
    }
    memcpy(joined, a, al);
    memcpy(joined + al, b, bl);
    const int32_t inew = tk_strmap_get(&bpe->vocab, joined, al + bl);
    INA_REQUIRE(inew >= 0, INA_ERR_FORMAT, "%s: model.merges[%zu]: the merged token '%.*s' is not in the vocabulary",
                origin, i, (int)(al + bl > 100 ? 100 : al + bl), joined);
    merge_put(bpe, ia, ib, (uint32_t)i, inew);
  }
fail:
  free(joined);
  return st;
}

void tk_bpe_free(tk_bpe_t *bpe) {
  tk_strmap_free(&bpe->vocab);
  free(bpe->merges);
  memset(bpe, 0, sizeof *bpe);
}

/* ---- the merge loop ---------------------------------------------------------------- */

typedef struct symbol {
  int32_t id;
  int32_t prev, next; /* -1: none */
  uint32_t len;       /* 0: merged into its left neighbor */
} symbol_t;

typedef struct qitem {
  uint32_t rank, pos;
  int32_t new_id;
} qitem_t;

static inline int q_less(qitem_t a, qitem_t b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void q_push(qitem_t *h, size_t *n, qitem_t it) {
  size_t i = (*n)++;
  while (i > 0) {
    const size_t p = (i - 1) / 2;
    if (!q_less(it, h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = it;
}

static qitem_t q_pop(qitem_t *h, size_t *n) {
  const qitem_t top = h[0];
  const qitem_t last = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && q_less(h[c + 1], h[c])) c++;
    if (!q_less(h[c], last)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = last;
  return top;
}

static ina_status_t push_id(int32_t **ids, size_t *count, size_t *cap, int32_t id) {
  ina_status_t st = INA_OK;
  if (*count == *cap) {
    const size_t c = *cap ? *cap * 2 : 64;
    int32_t *p = realloc(*ids, c * sizeof *p);
    INA_CHECK_ALLOC(p);
    *ids = p;
    *cap = c;
  }
  (*ids)[(*count)++] = id;
fail:
  return st;
}

static inline void add_symbol(symbol_t *sym, size_t *n, int32_t id, uint32_t len) {
  const size_t i = (*n)++;
  sym[i] = (symbol_t){id, (int32_t)i - 1, -1, len};
  if (i > 0) sym[i - 1].next = (int32_t)i;
}

ina_status_t tk_bpe_word(const tk_bpe_t *bpe, tk_scratch_t *sc, const char *w, size_t n, int32_t **ids,
                         size_t *count, size_t *cap) {
  ina_status_t st = INA_OK;
  if (n == 0) return INA_OK;
  if (bpe->ignore_merges) {
    const int32_t id = tk_strmap_get(&bpe->vocab, w, n);
    if (id >= 0) return push_id(ids, count, cap, id);
  }
  /* At most one symbol per byte (byte fallback) and one queue entry per pair plus the
   * two each merge adds. */
  if (sc->sym_cap < n) {
    free(sc->sym);
    free(sc->heap);
    sc->sym_cap = sc->heap_cap = 0;
    sc->sym = malloc(n * sizeof(symbol_t));
    sc->heap = malloc(3 * n * sizeof(qitem_t));
    INA_CHECK_ALLOC(sc->sym);
    INA_CHECK_ALLOC(sc->heap);
    sc->sym_cap = n;
    sc->heap_cap = 3 * n;
  }
  symbol_t *sym = sc->sym;
  qitem_t *heap = sc->heap;
  size_t ns = 0;
  int32_t unk_pending = -1; /* an unknown character's unk symbol not yet added */
  uint32_t unk_len = 0;
  const unsigned char *u = (const unsigned char *)w;
  for (size_t i = 0; i < n;) {
    size_t adv;
    const int32_t cp = tk_utf8_next(u + i, n - i, &adv, NULL);
    int32_t id = cp >= 0 && cp < 512 ? bpe->char_id[cp] : tk_strmap_get(&bpe->vocab, w + i, adv);
    if (id >= 0) {
      if (unk_pending >= 0) add_symbol(sym, &ns, unk_pending, unk_len);
      unk_pending = -1;
      add_symbol(sym, &ns, id, (uint32_t)adv);
      i += adv;
      continue;
    }
    if (bpe->byte_fallback) {
      size_t k = 0;
      while (k < adv && bpe->byte_fallback_id[u[i + k]] >= 0) k++;
      if (k == adv) {
        /* As merge_word, an unk still pending stays pending across byte tokens. */
        for (k = 0; k < adv; k++) add_symbol(sym, &ns, bpe->byte_fallback_id[u[i + k]], 1);
        i += adv;
        continue;
      }
    }
    if (bpe->unk_id >= 0) {
      if (unk_pending >= 0 && bpe->fuse_unk) {
        unk_len += (uint32_t)adv;
      } else {
        if (unk_pending >= 0) add_symbol(sym, &ns, unk_pending, unk_len);
        unk_pending = bpe->unk_id;
        unk_len = (uint32_t)adv;
      }
    }
    i += adv;
  }
  if (unk_pending >= 0) add_symbol(sym, &ns, unk_pending, unk_len);

  size_t nq = 0;
  for (size_t i = 0; i + 1 < ns; i++) {
    const tk_merge_slot_t *m = merge_find(bpe, sym[i].id, sym[i + 1].id);
    if (m) q_push(heap, &nq, (qitem_t){m->rank, (uint32_t)i, m->new_id});
  }
  while (nq > 0) {
    const qitem_t top = q_pop(heap, &nq);
    symbol_t *cur = &sym[top.pos];
    if (cur->len == 0 || cur->next < 0) continue;
    symbol_t *right = &sym[cur->next];
    const tk_merge_slot_t *m = merge_find(bpe, cur->id, right->id);
    if (!m || m->new_id != top.new_id) continue; /* stale: the pair here changed */
    cur->id = top.new_id;
    cur->len += right->len;
    right->len = 0;
    cur->next = right->next;
    if (cur->next >= 0) sym[cur->next].prev = (int32_t)top.pos;
    if (cur->prev >= 0) {
      const tk_merge_slot_t *pm = merge_find(bpe, sym[cur->prev].id, cur->id);
      if (pm) q_push(heap, &nq, (qitem_t){pm->rank, (uint32_t)cur->prev, pm->new_id});
    }
    if (cur->next >= 0) {
      const tk_merge_slot_t *nm = merge_find(bpe, cur->id, sym[cur->next].id);
      if (nm) q_push(heap, &nq, (qitem_t){nm->rank, top.pos, nm->new_id});
    }
  }
  for (size_t i = 0; i < ns; i++)
    if (sym[i].len != 0) INA_CHECK(push_id(ids, count, cap, sym[i].id));
fail:
  return st;
}
