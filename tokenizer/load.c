/* Loading: tokenizer.json's top level (model, added tokens, normalizer, pre-tokenizer,
 * post-processor, decoder; truncation and padding must be off) and tokenizer_config.json
 * (BOS / EOS, add_bos_token / add_eos_token, the chat template), and the lookups on a
 * loaded tokenizer. */
#define INA_LOG_SUBSYS "tokenizer"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"

static const char *const kTopKeys[] = {"version",       "truncation",   "padding",        "added_tokens", "normalizer",
                                       "pre_tokenizer", "model",        "post_processor", "decoder",      NULL};

/* ---- post-processor ---------------------------------------------------------------- */

static ina_status_t append_ids(int32_t **dst, size_t *n, const int32_t *src, size_t m) {
  ina_status_t st = INA_OK;
  if (m == 0) return INA_OK;
  int32_t *p = realloc(*dst, (*n + m) * sizeof *p);
  INA_CHECK_ALLOC(p);
  memcpy(p + *n, src, m * sizeof *p);
  *dst = p;
  *n += m;
fail:
  return st;
}

/* TemplateProcessing's `single` template: the special tokens' ids before and after $A. */
static ina_status_t parse_template(const json_t *j, const char *origin, const char *path, const ina_tokenizer_t *tok,
                                   tk_post_t *post) {
  ina_status_t st = INA_OK;
  int32_t *pre = NULL, *suf = NULL;
  size_t npre = 0, nsuf = 0;
  int seen_a = 0;
  const json_t *single = json_object_get(j, "single");
  const json_t *specials = json_object_get(j, "special_tokens");
  INA_REQUIRE(json_is_array(single), INA_ERR_FORMAT, "%s: %s.single: expected an array", origin, path);
  INA_REQUIRE(specials == NULL || json_is_object(specials), INA_ERR_FORMAT, "%s: %s.special_tokens: expected an object",
              origin, path);
  for (size_t i = 0; i < json_array_size(single); i++) {
    const json_t *item = json_array_get(single, i);
    const json_t *sp = json_object_get(item, "SpecialToken"), *seq = json_object_get(item, "Sequence");
    INA_REQUIRE(json_is_object(item) && json_object_size(item) == 1 && (sp || seq), INA_ERR_FORMAT,
                "%s: %s.single[%zu]: expected {\"SpecialToken\": ...} or {\"Sequence\": ...}", origin, path, i);
    const char *name = json_string_value(json_object_get(sp ? sp : seq, "id"));
    INA_REQUIRE(name != NULL, INA_ERR_FORMAT, "%s: %s.single[%zu]: missing string 'id'", origin, path, i);
    if (seq) {
      INA_REQUIRE(strcmp(name, "A") == 0 && !seen_a, INA_ERR_UNSUPPORTED,
                  "%s: %s.single[%zu]: sequence '%s' is not supported (one $A only)", origin, path, i, name);
      seen_a = 1;
      continue;
    }
    const json_t *entry = specials ? json_object_get(specials, name) : NULL;
    const json_t *ids = json_object_get(entry, "ids");
    INA_REQUIRE(json_is_array(ids), INA_ERR_FORMAT, "%s: %s.special_tokens: no ids for '%s'", origin, path, name);
    for (size_t k = 0; k < json_array_size(ids); k++) {
      const json_t *v = json_array_get(ids, k);
      INA_REQUIRE(json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < tok->num_ids &&
                      tok->tokens[json_integer_value(v)] != NULL,
                  INA_ERR_FORMAT, "%s: %s.special_tokens['%s'].ids[%zu]: not a token id", origin, path, name, k);
      const int32_t id = (int32_t)json_integer_value(v);
      INA_CHECK(seen_a ? append_ids(&suf, &nsuf, &id, 1) : append_ids(&pre, &npre, &id, 1));
    }
  }
  INA_REQUIRE(seen_a, INA_ERR_FORMAT, "%s: %s.single: no {\"Sequence\": {\"id\": \"A\"}}", origin, path);
  /* Applied around what earlier processors made: P2 + (P1 + A + S1) + S2. */
  INA_CHECK(append_ids(&pre, &npre, post->prefix, post->num_prefix));
  INA_CHECK(append_ids(&post->suffix, &post->num_suffix, suf, nsuf));
  free(post->prefix);
  post->prefix = pre;
  post->num_prefix = npre;
  pre = NULL;
fail:
  free(pre);
  free(suf);
  return st;
}

static ina_status_t parse_post(const json_t *j, const char *origin, const char *path, int depth,
                               const ina_tokenizer_t *tok, tk_post_t *post) {
  ina_status_t st = INA_OK;
  char sub[TK_PATH_MAX];
  if (!j || json_is_null(j)) return INA_OK;
  INA_REQUIRE(json_is_object(j), INA_ERR_FORMAT, "%s: %s: expected an object or null", origin, path);
  const char *type = json_string_value(json_object_get(j, "type"));
  INA_REQUIRE(type != NULL, INA_ERR_FORMAT, "%s: %s: missing string 'type'", origin, path);
  if (strcmp(type, "ByteLevel") == 0) return INA_OK; /* offsets only */
  if (strcmp(type, "TemplateProcessing") == 0) return parse_template(j, origin, path, tok, post);
  if (strcmp(type, "Sequence") == 0) {
    INA_REQUIRE(depth < 8, INA_ERR_UNSUPPORTED, "%s: %s: Sequences nested deeper than 8", origin, path);
    const json_t *list = json_object_get(j, "processors");
    INA_REQUIRE(json_is_array(list), INA_ERR_FORMAT, "%s: %s: Sequence without a 'processors' array", origin, path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
      INA_CHECK(parse_post(json_array_get(list, i), origin, sub, depth + 1, tok, post));
    }
    return INA_OK;
  }
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "%s: %s: post-processor type '%s' is not supported", origin, path, type);
fail:
  return st;
}

/* ---- tokenizer_config.json --------------------------------------------------------- */

/* bos_token / eos_token: a string, an AddedToken object with "content", or null. */
static ina_status_t config_token(const json_t *cfg, const char *key, const char *origin, const ina_tokenizer_t *tok,
                                 int32_t *out) {
  ina_status_t st = INA_OK;
  const json_t *v = json_object_get(cfg, key);
  *out = -1;
  if (!v || json_is_null(v)) return INA_OK;
  if (json_is_object(v)) v = json_object_get(v, "content");
  INA_REQUIRE(json_is_string(v), INA_ERR_FORMAT, "%s: %s: expected a string or an object with 'content'", origin, key);
  *out = ina_tokenizer_token_to_id(tok, json_string_value(v));
  INA_REQUIRE(*out >= 0, INA_ERR_FORMAT, "%s: %s: '%s' is not a token of the tokenizer", origin, key,
              json_string_value(v));
fail:
  return st;
}

static ina_status_t parse_config(const char *text, size_t len, const char *origin, ina_tokenizer_t *tok) {
  ina_status_t st = INA_OK;
  json_error_t err;
  json_t *cfg = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
  INA_REQUIRE(cfg != NULL, INA_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", origin, err.line, err.column, err.text);
  INA_REQUIRE(json_is_object(cfg), INA_ERR_FORMAT, "%s: expected a JSON object at the top", origin);
  INA_CHECK(config_token(cfg, "bos_token", origin, tok, &tok->bos_id));
  INA_CHECK(config_token(cfg, "eos_token", origin, tok, &tok->eos_id));

  /* add_bos_token / add_eos_token: transformers' Llama tokenizers (DeepSeek's class)
   * rebuild the post-processor from them, BOS before and EOS after the sequence. */
  const json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
  INA_REQUIRE(!ab || json_is_boolean(ab) || json_is_null(ab), INA_ERR_FORMAT, "%s: add_bos_token: expected a boolean",
              origin);
  INA_REQUIRE(!ae || json_is_boolean(ae) || json_is_null(ae), INA_ERR_FORMAT, "%s: add_eos_token: expected a boolean",
              origin);
  if (json_is_boolean(ab) || json_is_boolean(ae)) {
    free(tok->post.prefix);
    free(tok->post.suffix);
    memset(&tok->post, 0, sizeof tok->post);
    if (json_is_true(ab)) {
      INA_REQUIRE(tok->bos_id >= 0, INA_ERR_FORMAT, "%s: add_bos_token is true without a bos_token", origin);
      INA_CHECK(append_ids(&tok->post.prefix, &tok->post.num_prefix, &tok->bos_id, 1));
    }
    if (json_is_true(ae)) {
      INA_REQUIRE(tok->eos_id >= 0, INA_ERR_FORMAT, "%s: add_eos_token is true without an eos_token", origin);
      INA_CHECK(append_ids(&tok->post.suffix, &tok->post.num_suffix, &tok->eos_id, 1));
    }
  }

  const json_t *tpl = json_object_get(cfg, "chat_template");
  const char *chosen = NULL;
  if (json_is_string(tpl)) {
    chosen = json_string_value(tpl);
  } else if (json_is_array(tpl)) {
    for (size_t i = 0; i < json_array_size(tpl); i++) {
      const json_t *e = json_array_get(tpl, i);
      const char *name = json_string_value(json_object_get(e, "name"));
      const char *t = json_string_value(json_object_get(e, "template"));
      INA_REQUIRE(name && t, INA_ERR_FORMAT, "%s: chat_template[%zu]: expected {\"name\", \"template\"}", origin, i);
      if (strcmp(name, "default") == 0) chosen = t;
    }
  } else {
    INA_REQUIRE(tpl == NULL || json_is_null(tpl), INA_ERR_FORMAT, "%s: chat_template: expected a string or a list",
                origin);
  }
  if (chosen) {
    tok->chat_template = strdup(chosen);
    INA_CHECK_ALLOC(tok->chat_template);
  }
fail:
  json_decref(cfg);
  return st;
}

/* ---- load -------------------------------------------------------------------------- */

ina_status_t ina_tokenizer_load_json(const char *tokenizer_json, size_t tokenizer_len, const char *config_json,
                                     size_t config_len, const char *origin, ina_tokenizer_t **out) {
  ina_status_t st = INA_OK;
  ina_tokenizer_t *tok = NULL;
  json_t *root = NULL;
  json_error_t err;
  char cfg_origin[TK_PATH_MAX];
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_load_json: out is NULL");
  *out = NULL;
  INA_REQUIRE(tokenizer_json != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_load_json: tokenizer_json is NULL");
  if (!origin) origin = "tokenizer.json";
  tok = calloc(1, sizeof *tok);
  INA_CHECK_ALLOC(tok);
  tok->bos_id = tok->eos_id = -1;
  tok->origin = strdup(origin);
  INA_CHECK_ALLOC(tok->origin);
  origin = tok->origin;

  root = json_loadb(tokenizer_json, tokenizer_len, JSON_REJECT_DUPLICATES, &err);
  INA_REQUIRE(root != NULL, INA_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", origin, err.line, err.column, err.text);
  INA_REQUIRE(json_is_object(root), INA_ERR_FORMAT, "%s: expected a JSON object at the top", origin);
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    int known = 0;
    for (int i = 0; kTopKeys[i]; i++) known |= strcmp(key, kTopKeys[i]) == 0;
    INA_REQUIRE(known, INA_ERR_UNSUPPORTED, "%s: top-level key '%s' is not supported", origin, key);
  }
  INA_REQUIRE(json_is_null(json_object_get(root, "truncation")) || !json_object_get(root, "truncation"),
              INA_ERR_UNSUPPORTED, "%s: truncation: only null is supported", origin);
  INA_REQUIRE(json_is_null(json_object_get(root, "padding")) || !json_object_get(root, "padding"), INA_ERR_UNSUPPORTED,
              "%s: padding: only null is supported", origin);
  const json_t *model = json_object_get(root, "model");
  INA_REQUIRE(model != NULL, INA_ERR_FORMAT, "%s: missing 'model'", origin);
  INA_CHECK(tk_bpe_parse(model, origin, tok));
  INA_CHECK(tk_added_parse(json_object_get(root, "added_tokens"), origin, tok));
  INA_CHECK(tk_normalizer_parse(json_object_get(root, "normalizer"), origin, "normalizer", &tok->normalizer));
  INA_CHECK(tk_pretokenizer_parse(json_object_get(root, "pre_tokenizer"), origin, "pre_tokenizer", &tok->pre));
  INA_CHECK(parse_post(json_object_get(root, "post_processor"), origin, "post_processor", 0, tok, &tok->post));
  INA_CHECK(tk_decoder_parse(json_object_get(root, "decoder"), origin, "decoder", &tok->decoder));
  INA_CHECK(tk_added_finish(tok));
  if (config_json) {
    snprintf(cfg_origin, sizeof cfg_origin, "%s", strcmp(origin, "tokenizer.json") == 0 ? "tokenizer_config.json" : origin);
    /* A directory's origin is its tokenizer.json path: name the config file beside it. */
    char *slash = strstr(cfg_origin, "tokenizer.json");
    if (slash && strcmp(slash, "tokenizer.json") == 0)
      snprintf(slash, sizeof cfg_origin - (size_t)(slash - cfg_origin), "tokenizer_config.json");
    INA_CHECK(parse_config(config_json, config_len, cfg_origin, tok));
  }
  json_decref(root);
  *out = tok;
  return INA_OK;
fail:
  json_decref(root);
  ina_tokenizer_destroy(tok);
  return st;
}

/* The whole file, malloc'ed; *data NULL (and INA_OK) when optional and absent. */
static ina_status_t read_file(const char *path, int optional, char **data, size_t *len) {
  ina_status_t st = INA_OK;
  FILE *f = fopen(path, "rb");
  *data = NULL;
  *len = 0;
  if (!f && optional && errno == ENOENT) return INA_OK;
  INA_REQUIRE(f != NULL, INA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  INA_CHECK_ALLOC(buf);
  for (;;) {
    const size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) break;
    if (n == cap) {
      char *b = realloc(buf, cap * 2);
      if (!b) free(buf);
      INA_CHECK_ALLOC(b);
      buf = b;
      cap *= 2;
    }
  }
  if (ferror(f)) free(buf);
  INA_REQUIRE(!ferror(f), INA_ERR_IO, "%s: read failed", path);
  *data = buf;
  *len = n;
fail:
  if (f) fclose(f);
  return st;
}

ina_status_t ina_tokenizer_load_dir(const char *dir, ina_tokenizer_t **out) {
  ina_status_t st = INA_OK;
  char *tj = NULL, *cj = NULL, path[4096], cpath[4096];
  size_t tl = 0, cl = 0;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_load_dir: out is NULL");
  *out = NULL;
  INA_REQUIRE(dir != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_load_dir: dir is NULL");
  INA_REQUIRE(strlen(dir) < sizeof path - 32, INA_ERR_INVALID_ARGUMENT, "ina_tokenizer_load_dir: path too long");
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
  INA_CHECK(read_file(path, 0, &tj, &tl));
  INA_CHECK(read_file(cpath, 1, &cj, &cl));
  INA_CHECK(ina_tokenizer_load_json(tj, tl, cj, cl, path, out));
fail:
  free(tj);
  free(cj);
  return st;
}

void ina_tokenizer_destroy(ina_tokenizer_t *tok) {
  if (!tok) return;
  for (int32_t i = 0; tok->tokens && i < tok->num_ids; i++) free(tok->tokens[i]);
  free(tok->tokens);
  free(tok->token_lens);
  for (size_t i = 0; i < tok->num_added; i++) free(tok->added[i].content);
  free(tok->added);
  tk_strmap_free(&tok->added_map);
  free(tok->special);
  tk_trie_free(&tok->trie_raw);
  tk_trie_free(&tok->trie_norm);
  for (size_t i = 0; i < tok->num_norm_contents; i++) free(tok->norm_contents[i]);
  free(tok->norm_contents);
  tk_bpe_free(&tok->bpe);
  tk_normalizer_free(&tok->normalizer);
  tk_pretokenizer_free(&tok->pre);
  tk_decoder_free(&tok->decoder);
  free(tok->post.prefix);
  free(tok->post.suffix);
  free(tok->chat_template);
  free(tok->origin);
  free(tok);
}

/* ---- lookups ----------------------------------------------------------------------- */

int32_t ina_tokenizer_vocab_size(const ina_tokenizer_t *tok) { return tok ? tok->num_ids : 0; }
int32_t ina_tokenizer_bos_id(const ina_tokenizer_t *tok) { return tok ? tok->bos_id : -1; }
int32_t ina_tokenizer_eos_id(const ina_tokenizer_t *tok) { return tok ? tok->eos_id : -1; }

int32_t ina_tokenizer_token_to_id(const ina_tokenizer_t *tok, const char *token) {
  if (!tok || !token) return -1;
  const size_t n = strlen(token);
  const int32_t id = tk_strmap_get(&tok->added_map, token, n);
  return id >= 0 ? id : tk_strmap_get(&tok->bpe.vocab, token, n);
}

const char *ina_tokenizer_id_to_token(const ina_tokenizer_t *tok, int32_t id) {
  if (!tok || id < 0 || id >= tok->num_ids) return NULL;
  return tok->tokens[id];
}

int ina_tokenizer_is_special(const ina_tokenizer_t *tok, int32_t id) {
  if (!tok || id < 0 || id >= tok->num_ids) return 0;
  return tok->special[id];
}

const char *ina_tokenizer_chat_template(const ina_tokenizer_t *tok) { return tok ? tok->chat_template : NULL; }
