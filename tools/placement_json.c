#include "tools/placement_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/json_output.h"

json_t *placement_to_json(const Ina__V1__ExpertPlacement *p) {
  json_t *doc = json_object(), *layout = json_object(), *layers = json_array();
  int bad = !doc;
  if (bad) {
    json_decref(layout);
    json_decref(layers);
    return NULL;
  }
  json_output_set(doc, "layout", layout, &bad);
  /* An absent layout reads as its zero value, as proto3 has it. */
  json_output_set(layout, "tp", json_integer(p->layout ? p->layout->tp : 0), &bad);
  json_output_set(layout, "dp", json_integer(p->layout ? p->layout->dp : 0), &bad);
  json_output_set(layout, "ep", json_integer(p->layout ? p->layout->ep : 0), &bad);
  json_output_set(doc, "slots_per_rank", json_integer(p->slots_per_rank), &bad);
  json_output_set(doc, "generation", json_integer((json_int_t)p->generation), &bad);
  json_output_set(doc, "layers", layers, &bad);
  for (size_t l = 0; l < p->n_layers && !bad; l++) {
    const Ina__V1__LayerPlacement *lp = p->layers[l];
    json_t *layer = json_output_append_object(layers, &bad);
    if (!layer) break;
    json_t *slots = json_array();
    json_output_set(layer, "moe_layer", json_integer(lp->moe_layer), &bad);
    json_output_set(layer, "slots", slots, &bad);
    for (size_t i = 0; i < lp->n_slots && !bad; i++) {
      json_t *slot = json_output_append_object(slots, &bad);
      if (!slot) break;
      json_output_set(slot, "ep_rank", json_integer(lp->slots[i]->ep_rank), &bad);
      json_output_set(slot, "slot", json_integer(lp->slots[i]->slot), &bad);
      json_output_set(slot, "logical_expert", json_integer(lp->slots[i]->logical_expert), &bad);
    }
  }
  if (bad) {
    json_decref(doc);
    return NULL;
  }
  return doc;
}

/* A placement read from a file: the protobuf-c messages and the storage they point into
 * (every slot of every layer in one array). `placement` comes first, so that
 * placement_free finds the whole from the message it handed out. */
typedef struct placement_doc {
  Ina__V1__ExpertPlacement placement;
  Ina__V1__Layout layout;
  Ina__V1__LayerPlacement *layers, **layer_ptrs;
  Ina__V1__ExpertSlot *slots, **slot_ptrs;
} placement_doc_t;

void placement_free(Ina__V1__ExpertPlacement *placement) {
  placement_doc_t *d = (placement_doc_t *)placement;
  if (!d) return;
  free(d->layers);
  free(d->layer_ptrs);
  free(d->slots);
  free(d->slot_ptrs);
  free(d);
}

/* Reading state: the file name for messages and the first problem found. */
typedef struct reader {
  const char *file;
  char *error;
  size_t error_size;
} reader_t;

/* Records "FILE: PATH: problem" (PATH omitted when empty); returns -1. */
__attribute__((format(printf, 3, 4))) static int reader_fail(reader_t *r, const char *path,
                                                             const char *fmt, ...) {
  va_list ap;
  int n = snprintf(r->error, r->error_size, "%s: %s%s", r->file, path, path[0] ? ": " : "");
  if (n < 0 || (size_t)n >= r->error_size) return -1;
  va_start(ap, fmt);
  vsnprintf(r->error + n, r->error_size - (size_t)n, fmt, ap);
  va_end(ap);
  return -1;
}

/* A value as it appears in JSON, shortened for messages: "x" with its quotes, 12, [1, 2]. */
static void describe(const json_t *v, char *out, size_t size) {
  char *s = json_dumps(v, JSON_OUTPUT_DUMP_FLAGS);
  if (!s) {
    snprintf(out, size, "(a value)");
    return;
  }
  if (strlen(s) > 48) snprintf(out, size, "%.45s...", s);
  else snprintf(out, size, "%s", s);
  free(s);
}

/* "prefix.key", or "key" at the top. */
static void join_path(char *out, size_t size, const char *prefix, const char *key) {
  snprintf(out, size, "%s%s%s", prefix, prefix[0] ? "." : "", key);
}

/* obj must be an object whose keys are all in `allowed` (NULL-terminated). */
static int check_object(reader_t *r, const json_t *obj, const char *path, const char *const *allowed) {
  char got[64], key_path[160], expected[160] = "";
  const char *key;
  json_t *value;
  if (!json_is_object(obj)) {
    describe(obj, got, sizeof got);
    return reader_fail(r, path, "expected an object, got %s", got);
  }
  for (size_t i = 0; allowed[i]; i++)
    snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s%s", i ? ", " : "",
             allowed[i]);
  json_object_foreach((json_t *)obj, key, value) {
    size_t i = 0;
    while (allowed[i] && strcmp(allowed[i], key) != 0) i++;
    if (!allowed[i]) {
      join_path(key_path, sizeof key_path, path, key);
      return reader_fail(r, key_path, "unknown key (expected one of %s)", expected);
    }
  }
  return 0;
}

/* obj[key] as an integer in [0, max]. */
static int read_uint(reader_t *r, const json_t *obj, const char *path, const char *key, uint64_t max,
                     uint64_t *out) {
  char key_path[160], got[64];
  join_path(key_path, sizeof key_path, path, key);
  const json_t *v = json_object_get(obj, key);
  if (!v) return reader_fail(r, key_path, "missing");
  if (!json_is_integer(v) || json_integer_value(v) < 0) {
    describe(v, got, sizeof got);
    return reader_fail(r, key_path, "expected a non-negative integer, got %s", got);
  }
  if ((uint64_t)json_integer_value(v) > max) {
    describe(v, got, sizeof got);
    return reader_fail(r, key_path, "expected an integer in [0, %llu], got %s",
                       (unsigned long long)max, got);
  }
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

static int read_u32(reader_t *r, const json_t *obj, const char *path, const char *key, uint32_t *out) {
  uint64_t v = 0;
  if (read_uint(r, obj, path, key, UINT32_MAX, &v)) return -1;
  *out = (uint32_t)v;
  return 0;
}

/* obj[key] as an array. */
static const json_t *read_array(reader_t *r, const json_t *obj, const char *path, const char *key) {
  char key_path[160], got[64];
  join_path(key_path, sizeof key_path, path, key);
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    reader_fail(r, key_path, "missing");
    return NULL;
  }
  if (!json_is_array(v)) {
    describe(v, got, sizeof got);
    reader_fail(r, key_path, "expected an array, got %s", got);
    return NULL;
  }
  return v;
}

static int read_slot(reader_t *r, const json_t *v, const char *path, Ina__V1__ExpertSlot *slot) {
  static const char *const keys[] = {"ep_rank", "slot", "logical_expert", NULL};
  ina__v1__expert_slot__init(slot);
  if (check_object(r, v, path, keys)) return -1;
  if (read_u32(r, v, path, "ep_rank", &slot->ep_rank)) return -1;
  if (read_u32(r, v, path, "slot", &slot->slot)) return -1;
  return read_u32(r, v, path, "logical_expert", &slot->logical_expert);
}

/* Slots of every layer, for sizing the one slot array; malformed entries count 0 and are
 * reported by the full read. */
static size_t count_slots(const json_t *layers) {
  size_t total = 0, l;
  json_t *layer;
  json_array_foreach((json_t *)layers, l, layer) {
    const json_t *slots = json_is_object(layer) ? json_object_get(layer, "slots") : NULL;
    if (json_is_array(slots)) total += json_array_size(slots);
  }
  return total;
}

static int read_placement(reader_t *r, const json_t *root, placement_doc_t *d) {
  static const char *const top_keys[] = {"layout", "slots_per_rank", "generation", "layers", NULL};
  static const char *const layout_keys[] = {"tp", "dp", "ep", NULL};
  static const char *const layer_keys[] = {"moe_layer", "slots", NULL};
  ina__v1__expert_placement__init(&d->placement);
  ina__v1__layout__init(&d->layout);
  if (check_object(r, root, "", top_keys)) return -1;
  const json_t *layout = json_object_get(root, "layout");
  if (!layout) return reader_fail(r, "layout", "missing");
  if (check_object(r, layout, "layout", layout_keys)) return -1;
  if (read_u32(r, layout, "layout", "tp", &d->layout.tp) ||
      read_u32(r, layout, "layout", "dp", &d->layout.dp) ||
      read_u32(r, layout, "layout", "ep", &d->layout.ep))
    return -1;
  if (read_u32(r, root, "", "slots_per_rank", &d->placement.slots_per_rank)) return -1;
  const json_t *layers = read_array(r, root, "", "layers");
  if (!layers) return -1;

  const size_t n_layers = json_array_size(layers), n_slots = count_slots(layers);
  d->layers = calloc(n_layers + 1, sizeof *d->layers);
  d->layer_ptrs = calloc(n_layers + 1, sizeof *d->layer_ptrs);
  d->slots = calloc(n_slots + 1, sizeof *d->slots);
  d->slot_ptrs = calloc(n_slots + 1, sizeof *d->slot_ptrs);
  if (!d->layers || !d->layer_ptrs || !d->slots || !d->slot_ptrs)
    return reader_fail(r, "", "out of memory");
  size_t next_slot = 0;
  for (size_t l = 0; l < n_layers; l++) {
    char path[64];
    const json_t *layer = json_array_get(layers, l);
    Ina__V1__LayerPlacement *lp = &d->layers[l];
    ina__v1__layer_placement__init(lp);
    snprintf(path, sizeof path, "layers[%zu]", l);
    if (check_object(r, layer, path, layer_keys)) return -1;
    if (read_u32(r, layer, path, "moe_layer", &lp->moe_layer)) return -1;
    const json_t *slots = read_array(r, layer, path, "slots");
    if (!slots) return -1;
    lp->n_slots = json_array_size(slots);
    lp->slots = d->slot_ptrs + next_slot;
    for (size_t i = 0; i < lp->n_slots; i++) {
      char slot_path[96];
      snprintf(slot_path, sizeof slot_path, "%s.slots[%zu]", path, i);
      if (read_slot(r, json_array_get(slots, i), slot_path, &d->slots[next_slot])) return -1;
      d->slot_ptrs[next_slot] = &d->slots[next_slot];
      next_slot++;
    }
    d->layer_ptrs[l] = lp;
  }
  d->placement.layout = &d->layout;
  d->placement.n_layers = n_layers;
  d->placement.layers = d->layer_ptrs;
  return 0;
}

int placement_from_json(const json_t *root, const char *file, Ina__V1__ExpertPlacement **out,
                        char *error, size_t error_size) {
  reader_t reader = {file, error, error_size};
  placement_doc_t *d = calloc(1, sizeof *d);
  *out = NULL;
  if (error_size > 0) error[0] = '\0';
  if (!d) return reader_fail(&reader, "", "out of memory");
  if (read_placement(&reader, root, d)) {
    placement_free(&d->placement);
    return -1;
  }
  *out = &d->placement;
  return 0;
}
