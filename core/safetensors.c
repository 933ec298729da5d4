/* safetensors reader (mmap, full validation at open) and writer.
 *
 * Layout of a file: 8-byte little-endian header length N, N bytes of JSON header, then
 * the data section. The header maps each tensor name to {"dtype", "shape",
 * "data_offsets": [begin, end]} with offsets relative to the data section; the optional
 * "__metadata__" key holds an object of string values. */
#define INA_LOG_SUBSYS "safetensors"
#include "core/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/check.h"

/* A bigger header is a corrupt length field, not a real file (the 163-shard DeepSeek-V3
 * checkpoint has headers of a few hundred kB). */
#define MAX_HEADER_BYTES ((uint64_t)100 * 1000 * 1000)
#define METADATA_KEY "__metadata__"

/* Names in messages are clipped so a hostile header cannot push the file path out of the
 * fixed-size last-error buffer. */
#define NAME_FMT "%.200s"

struct ina_safetensors {
  char *path;
  void *map; /* NULL when the bytes are the caller's (ina_safetensors_open_memory) */
  size_t map_size;
  ina_st_entry_t *entries; /* data-offset order, i.e. the order of the file */
  size_t count;
  const ina_st_entry_t **by_name; /* the entries sorted by name, for binary search */
  char **metadata;                /* key0, value0, key1, value1, ... */
  size_t metadata_pairs;
  char *strings; /* one block holding every name, key and value above */
};

/* ---- reading ------------------------------------------------------------------- */

static uint64_t load_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Copies s into the string block at *cursor and returns the copy. */
static char *pool_copy(char **cursor, const char *s) {
  size_t n = strlen(s) + 1;
  char *dst = *cursor;
  memcpy(dst, s, n);
  *cursor += n;
  return dst;
}

/* Reads the non-negative integer elements of a JSON array into dst (room for cap). */
static int json_int_array(const json_t *arr, int64_t *dst, size_t cap, size_t *n) {
  if (!json_is_array(arr)) return 0;
  *n = json_array_size(arr);
  for (size_t i = 0; i < *n; i++) {
    const json_t *v = json_array_get(arr, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    if (i < cap) dst[i] = (int64_t)json_integer_value(v);
  }
  return 1;
}

/* Matches a safetensors dtype name without recording an error: the caller's message
 * names the file and the tensor. */
static int dtype_from_name(const char *name, ina_dtype_t *out) {
  for (int d = 0; d < INA_DTYPE_COUNT; d++) {
    const char *known = ina_dtype_safetensors_name((ina_dtype_t)d);
    if (known && strcmp(name, known) == 0) {
      *out = (ina_dtype_t)d;
      return 1;
    }
  }
  return 0;
}

/* Validates one tensor entry of the header and fills e (name and data set by the caller).
 * data_size is the byte size of the data section; *begin receives the data offset. */
static ina_status_t parse_entry(const char *path, const char *name, const json_t *desc,
                                uint64_t data_size, ina_st_entry_t *e, uint64_t *begin) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(json_is_object(desc), INA_ERR_FORMAT,
              "file %s: tensor '" NAME_FMT "': entry is not a JSON object", path, name);

  const json_t *dtype = json_object_get(desc, "dtype");
  INA_REQUIRE(json_is_string(dtype), INA_ERR_FORMAT,
              "file %s: tensor '" NAME_FMT "': \"dtype\" is %s", path, name,
              dtype ? "not a string" : "missing");
  INA_REQUIRE(dtype_from_name(json_string_value(dtype), &e->dtype), INA_ERR_UNSUPPORTED,
              "file %s: tensor '" NAME_FMT "': unsupported dtype '%.40s'", path, name,
              json_string_value(dtype));

  const json_t *shape = json_object_get(desc, "shape");
  size_t ndim = 0;
  INA_REQUIRE(shape != NULL, INA_ERR_FORMAT, "file %s: tensor '" NAME_FMT "': \"shape\" is missing",
              path, name);
  INA_REQUIRE(json_int_array(shape, e->shape, INA_MAX_DIMS, &ndim), INA_ERR_FORMAT,
              "file %s: tensor '" NAME_FMT "': \"shape\" is not an array of non-negative integers",
              path, name);
  INA_REQUIRE(ndim <= INA_MAX_DIMS, INA_ERR_UNSUPPORTED,
              "file %s: tensor '" NAME_FMT "': %zu dimensions, at most %d are supported", path,
              name, ndim, INA_MAX_DIMS);
  e->ndim = (int)ndim;
  size_t nbytes = 0;
  INA_REQUIRE(ina_shape_nbytes(e->dtype, e->ndim, e->shape, &nbytes), INA_ERR_FORMAT,
              "file %s: tensor '" NAME_FMT "': shape overflows 64 bits", path, name);

  const json_t *offsets = json_object_get(desc, "data_offsets");
  int64_t off[2] = {0, 0};
  size_t noff = 0;
  INA_REQUIRE(offsets != NULL, INA_ERR_FORMAT,
              "file %s: tensor '" NAME_FMT "': \"data_offsets\" is missing", path, name);
  INA_REQUIRE(json_int_array(offsets, off, 2, &noff) && noff == 2, INA_ERR_FORMAT,
              "file %s: tensor '" NAME_FMT
              "': \"data_offsets\" is not an array of two non-negative integers",
              path, name);
  INA_REQUIRE(off[0] <= off[1], INA_ERR_FORMAT,
              "file %s: tensor '" NAME_FMT "': data_offsets [%lld, %lld] begin after end", path,
              name, (long long)off[0], (long long)off[1]);
  INA_REQUIRE((uint64_t)off[1] <= data_size, INA_ERR_FORMAT,
              "file %s: tensor '" NAME_FMT
              "': data_offsets end %lld beyond the data section (%llu bytes)",
              path, name, (long long)off[1], (unsigned long long)data_size);
  INA_REQUIRE((uint64_t)(off[1] - off[0]) == nbytes, INA_ERR_FORMAT,
              "file %s: tensor '" NAME_FMT
              "': data_offsets span %lld bytes, shape and dtype %s need %llu",
              path, name, (long long)(off[1] - off[0]), ina_dtype_safetensors_name(e->dtype),
              (unsigned long long)nbytes);
  e->nbytes = (size_t)nbytes;
  *begin = (uint64_t)off[0];
  return INA_OK;
fail:
  return st;
}

/* Checks the "__metadata__" value: an object whose values are all strings. */
static ina_status_t check_metadata(const char *path, const json_t *meta) {
  ina_status_t st = INA_OK;
  const char *key;
  const json_t *value;
  INA_REQUIRE(json_is_object(meta), INA_ERR_FORMAT,
              "file %s: \"" METADATA_KEY "\" is not an object", path);
  json_object_foreach((json_t *)meta, key, value)
      INA_REQUIRE(json_is_string(value), INA_ERR_FORMAT,
                  "file %s: \"" METADATA_KEY "\" key '" NAME_FMT "' is not a string", path, key);
  return INA_OK;
fail:
  return st;
}

/* File order: by first byte, empty tensors before a tensor starting at the same place. */
static int cmp_by_offset(const void *a, const void *b) {
  const ina_st_entry_t *x = a, *y = b;
  uintptr_t xa = (uintptr_t)x->data, ya = (uintptr_t)y->data;
  if (xa != ya) return xa < ya ? -1 : 1;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int cmp_by_name(const void *a, const void *b) {
  return strcmp((*(const ina_st_entry_t *const *)a)->name,
                (*(const ina_st_entry_t *const *)b)->name);
}

/* Validates every header entry and builds the entry table and the name index. */
static ina_status_t build_entries(ina_safetensors_t *sf, const json_t *header,
                                  const unsigned char *data, uint64_t data_size) {
  ina_status_t st = INA_OK;
  const char *path = sf->path;
  const char *key;
  json_t *value;
  const json_t *meta = json_object_get(header, METADATA_KEY);
  if (meta) INA_CHECK(check_metadata(path, meta));

  /* Pass 1: sizes, so that all strings live in one block. */
  size_t count = 0, string_bytes = 1;
  json_object_foreach((json_t *)header, key, value) {
    if (strcmp(key, METADATA_KEY) == 0) continue;
    string_bytes += strlen(key) + 1;
    count++;
  }
  if (meta) {
    json_object_foreach((json_t *)meta, key, value) string_bytes +=
        strlen(key) + 1 + strlen(json_string_value(value)) + 1;
  }
  sf->strings = malloc(string_bytes);
  INA_CHECK_ALLOC(sf->strings);
  sf->entries = calloc(count + 1, sizeof *sf->entries);
  INA_CHECK_ALLOC(sf->entries);
  sf->by_name = calloc(count + 1, sizeof *sf->by_name);
  INA_CHECK_ALLOC(sf->by_name);
  sf->metadata = calloc(2 * (meta ? json_object_size(meta) : 0) + 1, sizeof *sf->metadata);
  INA_CHECK_ALLOC(sf->metadata);
  char *cursor = sf->strings;

  /* Pass 2: validate and copy. */
  json_object_foreach((json_t *)header, key, value) {
    if (strcmp(key, METADATA_KEY) == 0) continue;
    ina_st_entry_t *e = &sf->entries[sf->count];
    uint64_t begin = 0;
    INA_CHECK(parse_entry(path, key, value, data_size, e, &begin));
    e->name = pool_copy(&cursor, key);
    e->data = data + begin;
    sf->count++;
  }
  if (meta) {
    json_object_foreach((json_t *)meta, key, value) {
      sf->metadata[2 * sf->metadata_pairs] = pool_copy(&cursor, key);
      sf->metadata[2 * sf->metadata_pairs + 1] = pool_copy(&cursor, json_string_value(value));
      sf->metadata_pairs++;
    }
  }

  /* No two tensors may share a byte; empty tensors own none and are skipped. */
  qsort(sf->entries, count, sizeof *sf->entries, cmp_by_offset);
  const ina_st_entry_t *prev = NULL;
  for (size_t i = 0; i < count; i++) {
    const ina_st_entry_t *e = &sf->entries[i];
    if (e->nbytes == 0) continue;
    if (prev) {
      uint64_t prev_begin = (uint64_t)((const unsigned char *)prev->data - data);
      uint64_t begin = (uint64_t)((const unsigned char *)e->data - data);
      INA_REQUIRE(begin >= prev_begin + prev->nbytes, INA_ERR_FORMAT,
                  "file %s: tensors '" NAME_FMT "' [%llu, %llu) and '" NAME_FMT
                  "' [%llu, %llu) overlap",
                  path, prev->name, (unsigned long long)prev_begin,
                  (unsigned long long)(prev_begin + prev->nbytes), e->name,
                  (unsigned long long)begin, (unsigned long long)(begin + e->nbytes));
    }
    prev = e;
  }

  for (size_t i = 0; i < count; i++) sf->by_name[i] = &sf->entries[i];
  qsort(sf->by_name, count, sizeof *sf->by_name, cmp_by_name);
  return INA_OK;
fail:
  return st;
}

/* Validates the whole file at bytes (file_size bytes, mapped or borrowed) and fills sf's
 * entry table; sf->path names it in messages. */
static ina_status_t parse_file(ina_safetensors_t *sf, const unsigned char *bytes,
                               uint64_t file_size) {
  ina_status_t st = INA_OK;
  const char *path = sf->path;
  json_t *header = NULL;
  INA_REQUIRE(file_size >= 8, INA_ERR_FORMAT,
              "file %s: %llu bytes, too short for the 8-byte header length", path,
              (unsigned long long)file_size);
  uint64_t header_len = load_le64(bytes);
  INA_REQUIRE(header_len > 0, INA_ERR_FORMAT, "file %s: header length is 0", path);
  INA_REQUIRE(header_len <= MAX_HEADER_BYTES, INA_ERR_FORMAT,
              "file %s: header length %llu exceeds the %llu-byte limit", path,
              (unsigned long long)header_len, (unsigned long long)MAX_HEADER_BYTES);
  INA_REQUIRE(header_len <= file_size - 8, INA_ERR_FORMAT,
              "file %s: header length %llu exceeds the %llu bytes after the length field", path,
              (unsigned long long)header_len, (unsigned long long)(file_size - 8));

  json_error_t jerr;
  header = json_loadb((const char *)bytes + 8, (size_t)header_len, JSON_REJECT_DUPLICATES, &jerr);
  INA_REQUIRE(header != NULL, INA_ERR_FORMAT, "file %s: header is not valid JSON (column %d): %s",
              path, jerr.column, jerr.text);
  INA_REQUIRE(json_is_object(header), INA_ERR_FORMAT, "file %s: header is not a JSON object", path);

  INA_CHECK(build_entries(sf, header, bytes + 8 + header_len, file_size - 8 - header_len));
fail:
  json_decref(header);
  return st;
}

/* A handle without entries yet, named path (copied). */
static ina_status_t new_handle(const char *path, ina_safetensors_t **out) {
  ina_status_t st = INA_OK;
  ina_safetensors_t *sf = calloc(1, sizeof *sf);
  INA_CHECK_ALLOC(sf);
  sf->path = strdup(path);
  INA_CHECK_ALLOC(sf->path);
  *out = sf;
  return INA_OK;
fail:
  free(sf);
  return st;
}

ina_status_t ina_safetensors_open(const char *path, ina_safetensors_t **out) {
  ina_status_t st = INA_OK;
  ina_safetensors_t *sf = NULL;
  int fd = -1;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_safetensors_open: out is NULL");
  *out = NULL;
  INA_REQUIRE(path != NULL, INA_ERR_INVALID_ARGUMENT, "ina_safetensors_open: path is NULL");
  INA_CHECK(new_handle(path, &sf));

  fd = open(path, O_RDONLY | O_CLOEXEC);
  INA_REQUIRE(fd >= 0, INA_ERR_IO, "file %s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  INA_REQUIRE(fstat(fd, &sb) == 0, INA_ERR_IO, "file %s: cannot stat: %s", path, strerror(errno));
  INA_REQUIRE(S_ISREG(sb.st_mode), INA_ERR_IO, "file %s: not a regular file", path);
  uint64_t file_size = (uint64_t)sb.st_size;
  /* mmap refuses an empty mapping: say what is wrong with the file instead. */
  INA_REQUIRE(file_size >= 8, INA_ERR_FORMAT,
              "file %s: %llu bytes, too short for the 8-byte header length", path,
              (unsigned long long)file_size);

  void *map = mmap(NULL, (size_t)file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  INA_REQUIRE(map != MAP_FAILED, INA_ERR_IO, "file %s: mmap of %llu bytes failed: %s", path,
              (unsigned long long)file_size, strerror(errno));
  sf->map = map;
  sf->map_size = (size_t)file_size;
  close(fd);
  fd = -1;

  INA_CHECK(parse_file(sf, sf->map, file_size));
  *out = sf;
  return INA_OK;
fail:
  if (fd >= 0) close(fd);
  ina_safetensors_close(sf);
  return st;
}

ina_status_t ina_safetensors_open_memory(const void *bytes, size_t size, const char *name,
                                         ina_safetensors_t **out) {
  ina_status_t st = INA_OK;
  ina_safetensors_t *sf = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_safetensors_open_memory: out is NULL");
  *out = NULL;
  INA_REQUIRE(bytes != NULL || size == 0, INA_ERR_INVALID_ARGUMENT,
              "ina_safetensors_open_memory: bytes is NULL for %zu bytes", size);
  INA_CHECK(new_handle(name ? name : "(memory)", &sf));
  /* A NULL (empty) buffer is too short for the length field: parse_file says so before
   * it reads a byte. */
  INA_CHECK(parse_file(sf, bytes, (uint64_t)size));
  *out = sf;
  return INA_OK;
fail:
  ina_safetensors_close(sf);
  return st;
}

void ina_safetensors_close(ina_safetensors_t *sf) {
  if (!sf) return;
  if (sf->map) munmap(sf->map, sf->map_size);
  free(sf->entries);
  free((void *)sf->by_name);
  free(sf->metadata);
  free(sf->strings);
  free(sf->path);
  free(sf);
}

size_t ina_safetensors_count(const ina_safetensors_t *sf) { return sf ? sf->count : 0; }

const ina_st_entry_t *ina_safetensors_at(const ina_safetensors_t *sf, size_t i) {
  return sf && i < sf->count ? &sf->entries[i] : NULL;
}

const ina_st_entry_t *ina_safetensors_find(const ina_safetensors_t *sf, const char *name) {
  if (!sf || !name) return NULL;
  size_t lo = 0, hi = sf->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const ina_st_entry_t *e = sf->by_name[mid];
    int c = strcmp(name, e->name);
    if (c == 0) return e;
    if (c < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return NULL;
}

const char *ina_safetensors_path(const ina_safetensors_t *sf) { return sf ? sf->path : NULL; }

const char *ina_safetensors_metadata(const ina_safetensors_t *sf, const char *key) {
  if (!sf || !key) return NULL;
  for (size_t i = 0; i < sf->metadata_pairs; i++)
    if (strcmp(sf->metadata[2 * i], key) == 0) return sf->metadata[2 * i + 1];
  return NULL;
}

/* ---- writing ------------------------------------------------------------------- */

static ina_status_t check_write_entry(const char *path, const ina_st_write_entry_t *e,
                                      uint64_t *nbytes) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e->name != NULL && e->name[0] != '\0', INA_ERR_INVALID_ARGUMENT,
              "file %s: writing a tensor with an empty or NULL name", path);
  INA_REQUIRE(strcmp(e->name, METADATA_KEY) != 0, INA_ERR_INVALID_ARGUMENT,
              "file %s: tensor name '" METADATA_KEY "' is reserved", path);
  INA_REQUIRE((int)e->dtype >= 0 && e->dtype < INA_DTYPE_COUNT, INA_ERR_INVALID_ARGUMENT,
              "file %s: tensor '" NAME_FMT "': invalid dtype %d", path, e->name, (int)e->dtype);
  INA_REQUIRE(e->ndim >= 0 && e->ndim <= INA_MAX_DIMS, INA_ERR_INVALID_ARGUMENT,
              "file %s: tensor '" NAME_FMT "': ndim %d outside [0, %d]", path, e->name, e->ndim,
              INA_MAX_DIMS);
  uint64_t n = 0;
  for (int i = 0; i < e->ndim; i++)
    INA_REQUIRE(e->shape[i] >= 0, INA_ERR_INVALID_ARGUMENT,
                "file %s: tensor '" NAME_FMT "': negative dimension %lld", path, e->name,
                (long long)e->shape[i]);
  INA_REQUIRE(ina_shape_nbytes(e->dtype, e->ndim, e->shape, &n), INA_ERR_INVALID_ARGUMENT,
              "file %s: tensor '" NAME_FMT "': shape overflows 64 bits", path, e->name);
  INA_REQUIRE(e->data != NULL || n == 0, INA_ERR_INVALID_ARGUMENT,
              "file %s: tensor '" NAME_FMT "': data is NULL for %llu bytes", path, e->name,
              (unsigned long long)n);
  *nbytes = n;
  return INA_OK;
fail:
  return st;
}

/* Builds the compact JSON header, padded with spaces to a multiple of 8 so the data
 * section starts 8-byte aligned. *out is malloc'ed; *len excludes the terminator. */
static ina_status_t build_header(const char *path, const ina_st_write_entry_t *entries, size_t n,
                                 const char *const *metadata, char **out, size_t *len) {
  ina_status_t st = INA_OK;
  json_t *root = json_object();
  char *text = NULL;
  INA_CHECK_ALLOC(root);
  if (metadata && metadata[0]) {
    json_t *meta = json_object();
    INA_CHECK_ALLOC(meta);
    INA_REQUIRE(json_object_set_new(root, METADATA_KEY, meta) == 0, INA_ERR_OUT_OF_MEMORY,
                "file %s: out of memory building the header", path);
    for (size_t i = 0; metadata[i]; i += 2) {
      INA_REQUIRE(metadata[i + 1] != NULL, INA_ERR_INVALID_ARGUMENT,
                  "file %s: metadata key '" NAME_FMT "' has a NULL value", path, metadata[i]);
      INA_REQUIRE(json_object_get(meta, metadata[i]) == NULL, INA_ERR_INVALID_ARGUMENT,
                  "file %s: metadata key '" NAME_FMT "' given twice", path, metadata[i]);
      INA_REQUIRE(json_object_set_new(meta, metadata[i], json_string(metadata[i + 1])) == 0,
                  INA_ERR_INVALID_ARGUMENT,
                  "file %s: metadata key '" NAME_FMT "': key or value is not valid UTF-8", path,
                  metadata[i]);
    }
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < n; i++) {
    const ina_st_write_entry_t *e = &entries[i];
    uint64_t nbytes = 0;
    INA_CHECK(check_write_entry(path, e, &nbytes));
    INA_REQUIRE(json_object_get(root, e->name) == NULL, INA_ERR_INVALID_ARGUMENT,
                "file %s: tensor '" NAME_FMT "' given twice", path, e->name);
    INA_REQUIRE(nbytes <= (uint64_t)INT64_MAX - offset, INA_ERR_INVALID_ARGUMENT,
                "file %s: tensor '" NAME_FMT "': the data section would exceed 2^63 bytes", path,
                e->name);
    json_t *desc =
        json_pack("{s:s, s:[], s:[I, I]}", "dtype", ina_dtype_safetensors_name(e->dtype), "shape",
                  "data_offsets", (json_int_t)offset, (json_int_t)(offset + nbytes));
    INA_CHECK_ALLOC(desc);
    /* set_new takes the reference even when it fails (invalid UTF-8 name). */
    INA_REQUIRE(json_object_set_new(root, e->name, desc) == 0, INA_ERR_INVALID_ARGUMENT,
                "file %s: tensor '" NAME_FMT "': name is not valid UTF-8", path, e->name);
    json_t *shape = json_object_get(desc, "shape");
    for (int d = 0; d < e->ndim; d++)
      INA_REQUIRE(json_array_append_new(shape, json_integer(e->shape[d])) == 0,
                  INA_ERR_OUT_OF_MEMORY, "file %s: out of memory building the header", path);
    offset += nbytes;
  }
  text = json_dumps(root, JSON_COMPACT);
  INA_CHECK_ALLOC(text);
  size_t raw = strlen(text), padded = (raw + 7) / 8 * 8;
  char *grown = realloc(text, padded + 1);
  INA_CHECK_ALLOC(grown);
  text = grown;
  memset(text + raw, ' ', padded - raw);
  text[padded] = '\0';
  json_decref(root);
  *out = text;
  *len = padded;
  return INA_OK;
fail:
  free(text);
  json_decref(root);
  return st;
}

static int write_all(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n; }

ina_status_t ina_safetensors_write(const char *path, const ina_st_write_entry_t *entries, size_t n,
                                   const char *const *metadata) {
  ina_status_t st = INA_OK;
  char *header = NULL, *tmp_path = NULL;
  FILE *f = NULL;
  int created = 0; /* the temporary file exists and must go on failure */
  size_t header_len = 0;
  INA_REQUIRE(path != NULL, INA_ERR_INVALID_ARGUMENT, "ina_safetensors_write: path is NULL");
  INA_REQUIRE(entries != NULL || n == 0, INA_ERR_INVALID_ARGUMENT,
              "file %s: entries is NULL for %zu tensors", path, n);
  INA_CHECK(build_header(path, entries, n, metadata, &header, &header_len));

  size_t plen = strlen(path);
  tmp_path = malloc(plen + 5);
  INA_CHECK_ALLOC(tmp_path);
  memcpy(tmp_path, path, plen);
  memcpy(tmp_path + plen, ".tmp", 5);
  f = fopen(tmp_path, "wb");
  INA_REQUIRE(f != NULL, INA_ERR_IO, "file %s: cannot create: %s", tmp_path, strerror(errno));
  created = 1;

  unsigned char len_bytes[8];
  for (int i = 0; i < 8; i++) len_bytes[i] = (unsigned char)((uint64_t)header_len >> (8 * i));
  int ok = write_all(f, len_bytes, 8) && write_all(f, header, header_len);
  for (size_t i = 0; ok && i < n; i++) {
    uint64_t nbytes = 0;
    INA_CHECK(check_write_entry(path, &entries[i], &nbytes));
    ok = write_all(f, entries[i].data, (size_t)nbytes);
  }
  INA_REQUIRE(ok, INA_ERR_IO, "file %s: write failed: %s", tmp_path, strerror(errno));
  int close_rc = fclose(f);
  f = NULL;
  INA_REQUIRE(close_rc == 0, INA_ERR_IO, "file %s: write failed: %s", tmp_path, strerror(errno));
  INA_REQUIRE(rename(tmp_path, path) == 0, INA_ERR_IO, "file %s: cannot rename %s into place: %s",
              path, tmp_path, strerror(errno));
  free(tmp_path);
  free(header);
  return INA_OK;
fail:
  if (f) fclose(f);
  if (created) remove(tmp_path);
  free(tmp_path);
  free(header);
  return st;
}
