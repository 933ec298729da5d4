/* Reading the golden fixtures (format in tests/golden/README.md), shared by the tests
 * that compare an engine with Hugging Face. Include after tests/test_util.h. */
#ifndef INA_TESTS_GOLDEN_GOLDEN_FIXTURE_H
#define INA_TESTS_GOLDEN_GOLDEN_FIXTURE_H

#include <dirent.h>
#include <string.h>

#include "core/json.h"
#include "core/npy.h"

#define GOLDEN_MAX_PROMPTS 8
#define GOLDEN_MAX_NEW 64
#define GOLDEN_MAX_FIXTURES 64

typedef struct fixture {
  char dir[512];
  int32_t count, max_new;
  int32_t *prompts[GOLDEN_MAX_PROMPTS];
  int32_t lens[GOLDEN_MAX_PROMPTS];
  int32_t generated[GOLDEN_MAX_PROMPTS][GOLDEN_MAX_NEW];
  ina_tensor_t logits[GOLDEN_MAX_PROMPTS]; /* [lens[p] + max_new - 1, vocab] */
} fixture_t;

static inline int32_t golden_read_ids(const json_t *arr, int32_t *out, int32_t cap) {
  if (!json_is_array(arr) || (int32_t)json_array_size(arr) > cap) return -1;
  for (size_t i = 0; i < json_array_size(arr); i++) out[i] = (int32_t)json_integer_value(json_array_get(arr, i));
  return (int32_t)json_array_size(arr);
}

/* expected.json and logits_P.npy of one fixture directory; 0 on success. */
static inline int load_fixture(const char *dir, fixture_t *f) {
  char path[600];
  json_t *root = NULL;
  memset(f, 0, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "%s", dir);
  snprintf(path, sizeof path, "%s/expected.json", dir);
  if (ina_json_load_file(path, &root) != INA_OK) return -1;
  const json_t *prompts = json_object_get(root, "prompts"), *gen = json_object_get(root, "generated");
  f->max_new = (int32_t)json_integer_value(json_object_get(root, "max_new_tokens"));
  f->count = (int32_t)json_array_size(prompts);
  if (f->count > GOLDEN_MAX_PROMPTS || f->max_new > GOLDEN_MAX_NEW || f->max_new < 1) f->count = 0;
  for (int32_t p = 0; p < f->count; p++) {
    const json_t *ids = json_array_get(prompts, p);
    f->prompts[p] = malloc(json_array_size(ids) * sizeof(int32_t) + 1);
    f->lens[p] = golden_read_ids(ids, f->prompts[p], 1 << 20);
    CHECK(golden_read_ids(json_array_get(gen, p), f->generated[p], GOLDEN_MAX_NEW) == f->max_new);
    snprintf(path, sizeof path, "%s/logits_%d.npy", dir, p);
    CHECK_OK(ina_npy_read(path, &f->logits[p]));
    const ina_tensor_t *t = &f->logits[p];
    const int shape_ok = t->ndim == 2 && t->shape[0] == f->lens[p] + f->max_new - 1;
    CHECKF(shape_ok, "%s: logits_%d.npy has the wrong shape", dir, p);
    if (!shape_ok) f->count = 0;
  }
  json_decref(root);
  return f->count > 0 ? 0 : -1;
}

static inline void free_fixture(fixture_t *f) {
  for (int32_t p = 0; p < GOLDEN_MAX_PROMPTS; p++) {
    free(f->prompts[p]);
    ina_tensor_release(&f->logits[p]);
  }
}

static inline int golden_cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The fixture directory names under root, sorted, malloc'ed into names (the caller
 * frees each); returns their count (0 when root cannot be read). */
static inline int golden_fixture_names(const char *root, char **names) {
  DIR *d = opendir(root);
  int count = 0;
  struct dirent *ent;
  CHECKF(d != NULL, "cannot open %s", root);
  if (!d) return 0;
  while ((ent = readdir(d)) && count < GOLDEN_MAX_FIXTURES)
    if (ent->d_name[0] != '.') names[count++] = strdup(ent->d_name);
  closedir(d);
  qsort(names, (size_t)count, sizeof *names, golden_cmp_names);
  return count;
}

#endif
