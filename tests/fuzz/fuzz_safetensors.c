/* Fuzz target: safetensors files, the checkpoint shards ina_safetensors_open maps (a
 * downloaded checkpoint is outside input). Each input is a whole file.
 *
 * For every input it traps unless:
 *  - ina_safetensors_open_memory either fails with INA_ERR_FORMAT or INA_ERR_UNSUPPORTED,
 *    *out NULL and a message naming the file, or gives a table that agrees with the
 *    header read here apart (jansson, the file's own rules):
 *      one entry per tensor key, with its name, dtype, shape;
 *      nbytes = product of the dims x the dtype's size, equal to the data_offsets span;
 *      data = data section + data_offsets[0], every byte inside the input (all are read,
 *      so AddressSanitizer sees a stray one);
 *      entries in file order, no two non-empty ones sharing a byte;
 *      ina_safetensors_find gives each entry back by name, NULL for "__metadata__";
 *      every "__metadata__" pair is found by ina_safetensors_metadata;
 *  - ina_safetensors_open on the same bytes as a file (mmap) gives the same verdict and
 *    the same table;
 *  - an accepted file written again with ina_safetensors_write (after ina's writer rules:
 *    a tensor named "" is refused) reads back to the same tensors, bytes and metadata.
 * Everything is freed and unmapped (LeakSanitizer checks the memory). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/safetensors.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_files.h"

#define NAME "fuzz.safetensors"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_files_init();
  return 0;
}

static const ina_status_t kFailures[] = {INA_ERR_FORMAT, INA_ERR_UNSUPPORTED, INA_OK};

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* The entry agrees with its description in the header. */
static void check_entry(const ina_st_entry_t *e, const json_t *desc, const uint8_t *section,
                        const uint8_t *end) {
  FUZZ_REQUIRE(json_is_object(desc), "tensor '%s' accepted without an object", e->name);
  const char *dtype = json_string_value(json_object_get(desc, "dtype"));
  FUZZ_REQUIRE(dtype && strcmp(dtype, ina_dtype_safetensors_name(e->dtype)) == 0,
               "tensor '%s': dtype %s read as %s", e->name, dtype ? dtype : "(none)",
               ina_dtype_safetensors_name(e->dtype));
  const json_t *shape = json_object_get(desc, "shape");
  FUZZ_REQUIRE(json_is_array(shape) && json_array_size(shape) == (size_t)e->ndim &&
                   e->ndim >= 0 && e->ndim <= INA_MAX_DIMS,
               "tensor '%s': ndim %d for a shape of %zu", e->name, e->ndim,
               json_array_size(shape));
  uint64_t numel = 1;
  int empty = 0, overflow = 0;
  for (int d = 0; d < e->ndim; d++) {
    const json_t *dim = json_array_get(shape, (size_t)d);
    FUZZ_REQUIRE(json_is_integer(dim) && json_integer_value(dim) == e->shape[d] && e->shape[d] >= 0,
                 "tensor '%s': dim %d read as %lld", e->name, d, (long long)e->shape[d]);
    if (e->shape[d] == 0) empty = 1;
    else overflow |= __builtin_mul_overflow(numel, (uint64_t)e->shape[d], &numel);
  }
  uint64_t nbytes = 0;
  overflow |= __builtin_mul_overflow(numel, (uint64_t)ina_dtype_size(e->dtype), &nbytes);
  FUZZ_REQUIRE(!overflow, "tensor '%s': its shape overflows, yet it was accepted", e->name);
  if (empty) nbytes = 0;
  FUZZ_REQUIRE(e->nbytes == nbytes, "tensor '%s': nbytes %zu, shape x dtype size is %llu", e->name,
               e->nbytes, (unsigned long long)nbytes);
  const json_t *offsets = json_object_get(desc, "data_offsets");
  const json_t *b = json_array_get(offsets, 0), *f = json_array_get(offsets, 1);
  FUZZ_REQUIRE(json_array_size(offsets) == 2 && json_is_integer(b) && json_is_integer(f),
               "tensor '%s': data_offsets accepted without two integers", e->name);
  const json_int_t begin = json_integer_value(b), finish = json_integer_value(f);
  FUZZ_REQUIRE(begin >= 0 && finish >= begin && (uint64_t)(finish - begin) == e->nbytes,
               "tensor '%s': data_offsets [%lld, %lld] for %zu bytes", e->name, (long long)begin,
               (long long)finish, e->nbytes);
  const uint8_t *p = e->data;
  FUZZ_REQUIRE(p >= section && (uint64_t)(end - section) >= (uint64_t)finish &&
                   p == section + begin,
               "tensor '%s': data at %td of the data section, data_offsets begin %lld", e->name,
               p - section, (long long)begin);
  unsigned sum = 0;
  for (size_t k = 0; k < e->nbytes; k++) sum += p[k];
  (void)sum;
}

/* The table agrees with the header (see the top of the file). */
static void check_table(const ina_safetensors_t *sf, const uint8_t *data, size_t size) {
  FUZZ_REQUIRE(size >= 8, "a %zu-byte file accepted", size);
  const uint64_t header_len = le64(data);
  FUZZ_REQUIRE(header_len <= size - 8, "header length %llu accepted in a %zu-byte file",
               (unsigned long long)header_len, size);
  json_error_t jerr;
  json_t *header = json_loadb((const char *)data + 8, (size_t)header_len, JSON_REJECT_DUPLICATES,
                              &jerr);
  FUZZ_REQUIRE(json_is_object(header), "a header that is no JSON object accepted: %s", jerr.text);
  const json_t *meta = json_object_get(header, "__metadata__");
  FUZZ_REQUIRE(json_object_size(header) - (meta != NULL) == ina_safetensors_count(sf),
               "%zu tensors read from %zu header keys", ina_safetensors_count(sf),
               json_object_size(header));
  const uint8_t *section = data + 8 + header_len, *end = data + size;
  const uint8_t *prev_begin = section, *covered = section;
  for (size_t i = 0; i < ina_safetensors_count(sf); i++) {
    const ina_st_entry_t *e = ina_safetensors_at(sf, i);
    FUZZ_REQUIRE(e && e->name && strcmp(e->name, "__metadata__") != 0, "entry %zu is bad", i);
    check_entry(e, json_object_get(header, e->name), section, end);
    const uint8_t *p = e->data;
    FUZZ_REQUIRE(p >= prev_begin, "entry %zu ('%s') out of file order", i, e->name);
    if (e->nbytes) {
      FUZZ_REQUIRE(p >= covered, "tensor '%s' overlaps the one before", e->name);
      covered = p + e->nbytes;
    }
    prev_begin = p;
    FUZZ_REQUIRE(ina_safetensors_find(sf, e->name) == e, "find('%s') misses its entry", e->name);
  }
  FUZZ_REQUIRE(ina_safetensors_at(sf, ina_safetensors_count(sf)) == NULL, "at(count) is not NULL");
  FUZZ_REQUIRE(ina_safetensors_find(sf, "__metadata__") == NULL, "__metadata__ found as a tensor");
  const char *key;
  json_t *value;
  json_object_foreach((json_t *)meta, key, value) {
    const char *got = ina_safetensors_metadata(sf, key);
    FUZZ_REQUIRE(json_is_string(value) && got && strcmp(got, json_string_value(value)) == 0,
                 "metadata '%s' reads back as %s", key, got ? got : "NULL");
  }
  json_decref(header);
}

/* Two tables of the same bytes hold the same tensors (offsets relative to each base). */
static void require_same_table(const ina_safetensors_t *a, const uint8_t *base_a,
                               const ina_safetensors_t *b, const uint8_t *base_b) {
  FUZZ_REQUIRE(ina_safetensors_count(a) == ina_safetensors_count(b),
               "the file holds %zu tensors, the memory %zu", ina_safetensors_count(b),
               ina_safetensors_count(a));
  for (size_t i = 0; i < ina_safetensors_count(a); i++) {
    const ina_st_entry_t *x = ina_safetensors_at(a, i), *y = ina_safetensors_at(b, i);
    FUZZ_REQUIRE(strcmp(x->name, y->name) == 0 && x->dtype == y->dtype && x->ndim == y->ndim &&
                     memcmp(x->shape, y->shape, sizeof x->shape) == 0 && x->nbytes == y->nbytes &&
                     (const uint8_t *)x->data - base_a == (const uint8_t *)y->data - base_b,
                 "entry %zu differs between memory ('%s') and file ('%s')", i, x->name, y->name);
  }
}

/* Writes the accepted table with ina's writer and reads it back. */
static void check_rewrite(const ina_safetensors_t *sf, const json_t *meta_src) {
  const size_t n = ina_safetensors_count(sf);
  ina_st_write_entry_t *w = calloc(n + 1, sizeof *w);
  FUZZ_REQUIRE(w != NULL, "no memory for %zu entries", n);
  int empty_name = 0;
  for (size_t i = 0; i < n; i++) {
    const ina_st_entry_t *e = ina_safetensors_at(sf, i);
    w[i] = (ina_st_write_entry_t){e->name, e->dtype, e->ndim, {0}, e->data};
    memcpy(w[i].shape, e->shape, sizeof w[i].shape);
    empty_name |= e->name[0] == '\0';
  }
  size_t n_meta = json_object_size(meta_src);
  const char **meta = calloc(2 * n_meta + 1, sizeof *meta);
  FUZZ_REQUIRE(meta != NULL, "no memory for %zu metadata pairs", n_meta);
  size_t k = 0;
  const char *key;
  json_t *value;
  json_object_foreach((json_t *)meta_src, key, value) {
    meta[k++] = key;
    meta[k++] = json_string_value(value);
  }
  const char *path = fuzz_scratch_path("rewrite.safetensors");
  ina_clear_error();
  ina_status_t st = ina_safetensors_write(path, w, n, n_meta ? meta : NULL);
  if (empty_name) {
    FUZZ_REQUIRE(st == INA_ERR_INVALID_ARGUMENT, "a tensor named \"\" written (status %d)", (int)st);
  } else {
    FUZZ_REQUIRE(st == INA_OK, "an accepted table does not write back: %s", ina_last_error());
    ina_safetensors_t *back = NULL;
    st = ina_safetensors_open(path, &back);
    FUZZ_REQUIRE(st == INA_OK, "ina's own file does not read back: %s", ina_last_error());
    FUZZ_REQUIRE(ina_safetensors_count(back) == n, "%zu tensors written, %zu read back", n,
                 ina_safetensors_count(back));
    for (size_t i = 0; i < n; i++) {
      const ina_st_entry_t *e = ina_safetensors_at(sf, i);
      const ina_st_entry_t *r = ina_safetensors_find(back, e->name);
      FUZZ_REQUIRE(r && r->dtype == e->dtype && r->ndim == e->ndim &&
                       memcmp(r->shape, e->shape, sizeof r->shape) == 0 &&
                       r->nbytes == e->nbytes && memcmp(r->data, e->data, e->nbytes) == 0,
                   "tensor '%s' does not read back as written", e->name);
    }
    json_object_foreach((json_t *)meta_src, key, value) {
      const char *got = ina_safetensors_metadata(back, key);
      FUZZ_REQUIRE(got && strcmp(got, json_string_value(value)) == 0,
                   "metadata '%s' does not read back", key);
    }
    ina_safetensors_close(back);
  }
  free(meta);
  free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ina_safetensors_t *sf = (ina_safetensors_t *)&sf; /* not NULL, to see it reset */
  ina_clear_error();
  ina_status_t st = ina_safetensors_open_memory(data, size, NAME, &sf);
  if (st != INA_OK) {
    FUZZ_REQUIRE(sf == NULL, "a failed open left *out set");
    fuzz_require_error("ina_safetensors_open_memory", st, kFailures, NAME);
  } else {
    FUZZ_REQUIRE(sf != NULL, "open succeeded without a handle");
    FUZZ_REQUIRE(strcmp(ina_safetensors_path(sf), NAME) == 0, "path reads %s",
                 ina_safetensors_path(sf));
    check_table(sf, data, size);
  }

  /* The same bytes through the file path (open, fstat, mmap). */
  const char *path = fuzz_as_file(data, size);
  ina_safetensors_t *mapped = NULL;
  ina_clear_error();
  ina_status_t st_file = ina_safetensors_open(path, &mapped);
  FUZZ_REQUIRE(st_file == st, "the file gives status %d, the memory %d (%s)", (int)st_file, (int)st,
               ina_last_error());
  if (st_file != INA_OK) {
    fuzz_require_error("ina_safetensors_open", st_file, kFailures, path);
  } else {
    const ina_st_entry_t *first = ina_safetensors_at(mapped, 0);
    const ina_st_entry_t *mine = ina_safetensors_at(sf, 0);
    /* The base of the mapping is unknown here: line both up on their first entry. */
    if (first && mine)
      require_same_table(sf, (const uint8_t *)mine->data, mapped, (const uint8_t *)first->data);
    else
      FUZZ_REQUIRE(!first && !mine, "one of file and memory has no tensors");
    ina_safetensors_close(mapped);
  }

  if (st == INA_OK) {
    json_t *header = json_loadb((const char *)data + 8, (size_t)le64(data), 0, NULL);
    check_rewrite(sf, json_object_get(header, "__metadata__"));
    json_decref(header);
    ina_safetensors_close(sf);
  }
  return 0;
}
