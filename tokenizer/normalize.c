/* The normalizer: null, NFC, NFD, NFKC, NFKD, or a Sequence of those, run through
 * utf8proc (`tokenizers` runs the same Unicode forms with the unicode-normalization
 * crate; the two agree except on characters newer than utf8proc's Unicode tables). */
#define INA_LOG_SUBSYS "tokenizer"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/check.h"
#include "tokenizer/internal.h"

static ina_status_t add_step(tk_normalizer_t *nz, tk_norm_kind_t k) {
  ina_status_t st = INA_OK;
  tk_norm_kind_t *s = realloc(nz->steps, (nz->n + 1) * sizeof *s);
  INA_CHECK_ALLOC(s);
  nz->steps = s;
  nz->steps[nz->n++] = k;
fail:
  return st;
}

static ina_status_t parse_one(const json_t *j, const char *origin, const char *path, int depth, tk_normalizer_t *nz) {
  ina_status_t st = INA_OK;
  if (json_is_null(j)) return INA_OK;
  INA_REQUIRE(json_is_object(j), INA_ERR_FORMAT, "%s: %s: expected an object or null", origin, path);
  const char *type = json_string_value(json_object_get(j, "type"));
  INA_REQUIRE(type != NULL, INA_ERR_FORMAT, "%s: %s: missing string 'type'", origin, path);
  if (strcmp(type, "Sequence") == 0) {
    INA_REQUIRE(depth < 8, INA_ERR_UNSUPPORTED, "%s: %s: Sequences nested deeper than 8", origin, path);
    const json_t *list = json_object_get(j, "normalizers");
    INA_REQUIRE(json_is_array(list), INA_ERR_FORMAT, "%s: %s: Sequence without a 'normalizers' array", origin, path);
    for (size_t i = 0; i < json_array_size(list); i++) {
      char sub[TK_PATH_MAX];
      snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
      const json_t *item = json_array_get(list, i);
      INA_REQUIRE(!json_is_null(item), INA_ERR_FORMAT, "%s: %s: null in a Sequence", origin, sub);
      INA_CHECK(parse_one(item, origin, sub, depth + 1, nz));
    }
    return INA_OK;
  }
  if (strcmp(type, "NFC") == 0) return add_step(nz, TK_NORM_NFC);
  if (strcmp(type, "NFD") == 0) return add_step(nz, TK_NORM_NFD);
  if (strcmp(type, "NFKC") == 0) return add_step(nz, TK_NORM_NFKC);
  if (strcmp(type, "NFKD") == 0) return add_step(nz, TK_NORM_NFKD);
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "%s: %s: normalizer type '%s' is not supported", origin, path, type);
fail:
  return st;
}

ina_status_t tk_normalizer_parse(const json_t *j, const char *origin, const char *path, tk_normalizer_t *out) {
  memset(out, 0, sizeof *out);
  if (!j) return INA_OK;
  ina_status_t st = parse_one(j, origin, path, 0, out);
  if (st != INA_OK) tk_normalizer_free(out);
  return st;
}

static utf8proc_option_t options_of(tk_norm_kind_t k) {
  switch (k) {
  case TK_NORM_NFC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
  case TK_NORM_NFD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
  case TK_NORM_NFKC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  case TK_NORM_NFKD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  }
  return UTF8PROC_STABLE;
}

ina_status_t tk_normalize(const tk_normalizer_t *nz, const char *s, size_t n, tk_buf_t *out) {
  ina_status_t st = INA_OK;
  utf8proc_uint8_t *cur = NULL;
  if (nz->n == 0) return tk_buf_append(out, s, n);
  const utf8proc_uint8_t *in = (const utf8proc_uint8_t *)s;
  utf8proc_ssize_t in_len = (utf8proc_ssize_t)n;
  for (size_t i = 0; i < nz->n; i++) {
    utf8proc_uint8_t *next = NULL;
    /* With an explicit length utf8proc treats NUL as a character, as Rust does. */
    const utf8proc_ssize_t r = utf8proc_map(in, in_len, &next, options_of(nz->steps[i]));
    INA_REQUIRE(r >= 0, r == UTF8PROC_ERROR_NOMEM ? INA_ERR_OUT_OF_MEMORY : INA_ERR_INTERNAL,
                "normalization of a %zu-byte piece failed: %s", (size_t)in_len, utf8proc_errmsg(r));
    free(cur);
    cur = next;
    in = cur;
    in_len = r;
  }
  INA_CHECK(tk_buf_append(out, cur, (size_t)in_len));
fail:
  free(cur);
  return st;
}

void tk_normalizer_free(tk_normalizer_t *nz) {
  free(nz->steps);
  nz->steps = NULL;
  nz->n = 0;
}
