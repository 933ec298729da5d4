#include "tools/json_output.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void json_output_set(json_t *obj, const char *key, json_t *value, int *bad) {
  if (!value || json_object_set_new(obj, key, value) != 0) *bad = 1;
}

json_t *json_output_append_object(json_t *array, int *bad) {
  json_t *obj = json_object();
  if (!obj || json_array_append_new(array, obj) != 0) {
    *bad = 1;
    return NULL;
  }
  return obj;
}

/* Whether v prints on one line: a scalar, or an array or object of scalars only. */
static int is_flat(const json_t *v) {
  const char *key;
  json_t *child;
  size_t i;
  if (json_is_array(v)) {
    json_array_foreach((json_t *)v, i, child)
      if (json_is_array(child) || json_is_object(child)) return 0;
  } else if (json_is_object(v)) {
    json_object_foreach((json_t *)v, key, child)
      if (json_is_array(child) || json_is_object(child)) return 0;
  }
  return 1;
}

static int print_dump(FILE *f, const json_t *v) {
  char *s = json_dumps(v, JSON_OUTPUT_DUMP_FLAGS);
  if (!s) return -1;
  fputs(s, f);
  free(s);
  return 0;
}

/* Prints v, its nested lines indented by `indent` + 2 spaces; 0, or -1 when out of memory. */
static int print_json(FILE *f, const json_t *v, int indent) {
  if (is_flat(v)) return print_dump(f, v);
  const int is_object = json_is_object(v);
  const size_t n = is_object ? json_object_size(v) : json_array_size(v);
  size_t i = 0;
  fputs(is_object ? "{\n" : "[\n", f);
  void *it = is_object ? json_object_iter((json_t *)v) : NULL;
  for (i = 0; i < n; i++) {
    fprintf(f, "%*s", indent + 2, "");
    json_t *child;
    if (is_object) {
      json_t *key = json_string(json_object_iter_key(it));
      if (!key || print_dump(f, key)) {
        json_decref(key);
        return -1;
      }
      json_decref(key);
      fputs(": ", f);
      child = json_object_iter_value(it);
      it = json_object_iter_next((json_t *)v, it);
    } else {
      child = json_array_get(v, i);
    }
    if (print_json(f, child, indent + 2)) return -1;
    fputs(i + 1 < n ? ",\n" : "\n", f);
  }
  fprintf(f, "%*s%s", indent, "", is_object ? "}" : "]");
  return 0;
}

int json_output_write(const char *cmd, const json_t *doc, const char *path) {
  FILE *f = path ? fopen(path, "w") : stdout;
  if (!f) {
    fprintf(stderr, "ina %s: --out '%s': cannot open: %s\n", cmd, path, strerror(errno));
    return 1;
  }
  int bad = print_json(f, doc, 0) != 0;
  fputc('\n', f);
  bad |= ferror(f) != 0;
  if (path) bad |= fclose(f) != 0;
  else bad |= fflush(f) != 0;
  if (bad) fprintf(stderr, "ina %s: cannot write %s\n", cmd, path ? path : "to stdout");
  return bad;
}
