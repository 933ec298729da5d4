/* Typed accessors over jansson for configuration files (config.json, index files). */
#define INA_LOG_SUBSYS "json"
#include "core/json.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"

/* The name of a JSON value's type, for "expected X, got Y" messages. */
static const char *json_type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "object";
  case JSON_ARRAY: return "array";
  case JSON_STRING: return "string";
  case JSON_INTEGER: return "integer";
  case JSON_REAL: return "real";
  case JSON_TRUE:
  case JSON_FALSE: return "boolean";
  case JSON_NULL: return "null";
  }
  return "unknown";
}

ina_status_t ina_json_load_file(const char *path, json_t **out) {
  ina_status_t st = INA_OK;
  FILE *f = NULL;
  json_t *root = NULL;
  json_error_t err;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_json_load_file: out is NULL");
  *out = NULL;
  INA_REQUIRE(path != NULL, INA_ERR_INVALID_ARGUMENT, "ina_json_load_file: path is NULL");
  f = fopen(path, "rb");
  INA_REQUIRE(f != NULL, INA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  /* Duplicate keys would make the file mean different things to different readers. */
  root = json_loadf(f, JSON_REJECT_DUPLICATES, &err);
  INA_REQUIRE(root != NULL, INA_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, err.line,
              err.column, err.text);
  INA_REQUIRE(json_is_object(root), INA_ERR_FORMAT, "%s: expected a JSON object at the top, got %s",
              path, json_type_name(root));
  fclose(f);
  *out = root;
  return INA_OK;
fail:
  json_decref(root);
  if (f) fclose(f);
  return st;
}

/* Looks key up in obj. Returns INA_ERR_NOT_FOUND without a message when the key is absent
 * (or null and null_is_absent), so the *_opt getters can fall back quietly. */
static ina_status_t lookup(const json_t *obj, const char *key, const char *where,
                           int null_is_absent, const json_t **value) {
  ina_status_t st = INA_OK;
  *value = NULL;
  where = where ? where : "JSON";
  INA_REQUIRE(key != NULL, INA_ERR_INVALID_ARGUMENT, "%s: JSON lookup with a NULL key", where);
  INA_REQUIRE(obj != NULL, INA_ERR_INVALID_ARGUMENT, "%s: key '%s': looked up in a NULL object",
              where, key);
  INA_REQUIRE(json_is_object(obj), INA_ERR_FORMAT,
              "%s: key '%s': expected to look it up in an object, got %s", where, key,
              json_type_name(obj));
  const json_t *v = json_object_get(obj, key);
  if (v == NULL || (null_is_absent && json_is_null(v))) return INA_ERR_NOT_FOUND;
  *value = v;
  return INA_OK;
fail:
  return st;
}

/* Required lookup: an absent key is an error with a message. */
static ina_status_t lookup_required(const json_t *obj, const char *key, const char *where,
                                    const json_t **value) {
  ina_status_t st = lookup(obj, key, where, 0, value);
  if (st == INA_ERR_NOT_FOUND)
    ina_error(INA_LOG_SUBSYS, "%s: missing key '%s'", where ? where : "JSON", key);
  return st;
}

static ina_status_t wrong_type(const char *where, const char *key, const char *expected,
                               const json_t *v) {
  ina_error(INA_LOG_SUBSYS, "%s: key '%s': expected %s, got %s", where ? where : "JSON", key,
            expected, json_type_name(v));
  return INA_ERR_FORMAT;
}

static ina_status_t convert_int(const json_t *v, const char *key, const char *where, int64_t *out) {
  if (!json_is_integer(v)) return wrong_type(where, key, "an integer", v);
  *out = (int64_t)json_integer_value(v);
  return INA_OK;
}

/* Integers are accepted where a real is expected: "rope_theta": 10000 is a double. */
static ina_status_t convert_double(const json_t *v, const char *key, const char *where,
                                   double *out) {
  if (!json_is_number(v)) return wrong_type(where, key, "a number", v);
  *out = json_number_value(v);
  return INA_OK;
}

static ina_status_t convert_bool(const json_t *v, const char *key, const char *where, int *out) {
  if (!json_is_boolean(v)) return wrong_type(where, key, "a boolean", v);
  *out = json_is_true(v) ? 1 : 0;
  return INA_OK;
}

static ina_status_t convert_string(const json_t *v, const char *key, const char *where,
                                   const char **out) {
  if (!json_is_string(v)) return wrong_type(where, key, "a string", v);
  *out = json_string_value(v);
  return INA_OK;
}

/* The eight getters differ only in the conversion and in how absence is treated. */
#define DEFINE_GETTERS(suffix, ctype, convert)                                                    \
  ina_status_t ina_json_get_##suffix(const json_t *obj, const char *key, const char *where,       \
                                     ctype *out) {                                                \
    const json_t *v;                                                                              \
    ina_status_t st = lookup_required(obj, key, where, &v);                                       \
    if (st != INA_OK) return st;                                                                  \
    return convert(v, key, where, out);                                                           \
  }                                                                                               \
  ina_status_t ina_json_get_##suffix##_opt(const json_t *obj, const char *key, const char *where, \
                                           ctype dflt, ctype *out) {                              \
    const json_t *v;                                                                              \
    *out = dflt;                                                                                  \
    ina_status_t st = lookup(obj, key, where, 1, &v);                                             \
    if (st == INA_ERR_NOT_FOUND) return INA_OK;                                                   \
    if (st != INA_OK) return st;                                                                  \
    return convert(v, key, where, out);                                                           \
  }

DEFINE_GETTERS(int, int64_t, convert_int)
DEFINE_GETTERS(double, double, convert_double)
DEFINE_GETTERS(bool, int, convert_bool)
DEFINE_GETTERS(string, const char *, convert_string)
