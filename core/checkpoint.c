/* Hugging Face checkpoint directories: an index with a weight map over shards opened on
 * demand, a single model.safetensors, or a set of *.safetensors files. */
#define INA_LOG_SUBSYS "checkpoint"
#include "core/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/check.h"
#include "core/json.h"

#define INDEX_FILE "model.safetensors.index.json"
#define SINGLE_FILE "model.safetensors"
#define NAME_FMT "%.200s"

typedef struct {
  const char *file_name; /* plain name inside the directory */
  char *owned_name;      /* file_name when this struct owns it (not borrowed from the index) */
  ina_safetensors_t *st; /* NULL until first needed (index mode) */
} shard_t;

typedef struct {
  const char *name; /* borrowed from the index JSON or from an opened shard */
  size_t shard;
} tensor_ref_t;

struct ina_checkpoint {
  char *dir;
  json_t *index;    /* kept alive: tensor names point into it (index mode) */
  char *index_path; /* NULL unless the directory has an index */
  shard_t *shards;  /* sorted by file name */
  size_t nshards;
  tensor_ref_t *tensors; /* index order or file order */
  size_t ntensors;
  tensor_ref_t *by_name; /* the same, sorted by name */
};

static char *join_path(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  p[a] = '/';
  memcpy(p + a + 1, name, b + 1);
  return p;
}

static int is_regular_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int cmp_tensor_ref(const void *a, const void *b) {
  return strcmp(((const tensor_ref_t *)a)->name, ((const tensor_ref_t *)b)->name);
}

static int cmp_cstr(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_shard(const void *a, const void *b) {
  return strcmp(((const shard_t *)a)->file_name, ((const shard_t *)b)->file_name);
}

static const tensor_ref_t *find_ref(const ina_checkpoint_t *ck, const char *name) {
  tensor_ref_t probe = {name, 0};
  return ck->ntensors ? bsearch(&probe, ck->by_name, ck->ntensors, sizeof probe, cmp_tensor_ref)
                      : NULL;
}

static ina_status_t open_shard(ina_checkpoint_t *ck, size_t i) {
  ina_status_t st = INA_OK;
  char *path = join_path(ck->dir, ck->shards[i].file_name);
  INA_CHECK_ALLOC(path);
  INA_CHECK(ina_safetensors_open(path, &ck->shards[i].st));
fail:
  free(path);
  return st;
}

/* Sorts the tensor list by name and rejects names that appear twice. */
static ina_status_t build_name_index(ina_checkpoint_t *ck) {
  ina_status_t st = INA_OK;
  ck->by_name = malloc((ck->ntensors + 1) * sizeof *ck->by_name);
  INA_CHECK_ALLOC(ck->by_name);
  if (ck->ntensors) memcpy(ck->by_name, ck->tensors, ck->ntensors * sizeof *ck->by_name);
  qsort(ck->by_name, ck->ntensors, sizeof *ck->by_name, cmp_tensor_ref);
  for (size_t i = 1; i < ck->ntensors; i++) {
    const tensor_ref_t *a = &ck->by_name[i - 1], *b = &ck->by_name[i];
    INA_REQUIRE(strcmp(a->name, b->name) != 0, INA_ERR_FORMAT,
                "checkpoint %s: tensor '" NAME_FMT "' is in both %s and %s", ck->dir, a->name,
                ck->shards[a->shard].file_name, ck->shards[b->shard].file_name);
  }
  return INA_OK;
fail:
  return st;
}

/* A shard name from the weight map must name a file directly inside the directory. */
static int is_plain_file_name(const char *s) {
  return s[0] != '\0' && strchr(s, '/') == NULL && strstr(s, "..") == NULL && strcmp(s, ".") != 0;
}

/* The shard of a file name; the shard list is sorted and holds every name asked for. */
static size_t find_shard(const ina_checkpoint_t *ck, const char *file) {
  size_t lo = 0, hi = ck->nshards;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(file, ck->shards[mid].file_name) < 0)
      hi = mid;
    else
      lo = mid;
  }
  return lo;
}

/* The weight map of the index already loaded into ck->index (a JSON object). */
static ina_status_t read_weight_map(ina_checkpoint_t *ck) {
  ina_status_t st = INA_OK;
  const char **files = NULL;
  const char *key;
  json_t *value;
  json_t *map = json_object_get(ck->index, "weight_map");
  INA_REQUIRE(map != NULL, INA_ERR_FORMAT, "%s: missing key 'weight_map'", ck->index_path);
  INA_REQUIRE(json_is_object(map), INA_ERR_FORMAT, "%s: key 'weight_map': expected an object",
              ck->index_path);

  /* The distinct shard names: every value, sorted, one of each. */
  size_t n = json_object_size(map), i = 0;
  files = calloc(n + 1, sizeof *files);
  INA_CHECK_ALLOC(files);
  json_object_foreach(map, key, value) {
    INA_REQUIRE(json_is_string(value), INA_ERR_FORMAT,
                "%s: weight_map entry '" NAME_FMT "': expected a file name string", ck->index_path,
                key);
    const char *file = json_string_value(value);
    INA_REQUIRE(is_plain_file_name(file), INA_ERR_FORMAT,
                "%s: weight_map entry '" NAME_FMT "': file name '" NAME_FMT
                "' is not a plain name inside the directory",
                ck->index_path, key, file);
    files[i++] = file;
  }
  qsort(files, n, sizeof *files, cmp_cstr);
  ck->shards = calloc(n + 1, sizeof *ck->shards);
  INA_CHECK_ALLOC(ck->shards);
  for (i = 0; i < n; i++)
    if (ck->nshards == 0 || strcmp(ck->shards[ck->nshards - 1].file_name, files[i]) != 0)
      ck->shards[ck->nshards++].file_name = files[i]; /* borrowed from the index JSON */

  ck->tensors = calloc(n + 1, sizeof *ck->tensors);
  INA_CHECK_ALLOC(ck->tensors);
  json_object_foreach(map, key, value) {
    ck->tensors[ck->ntensors++] = (tensor_ref_t){key, find_shard(ck, json_string_value(value))};
  }
  INA_CHECK(build_name_index(ck));
fail:
  free(files);
  return st;
}

/* Adds every tensor of the (already opened) shards, in file order. */
static ina_status_t list_shard_tensors(ina_checkpoint_t *ck) {
  ina_status_t st = INA_OK;
  size_t total = 0;
  for (size_t s = 0; s < ck->nshards; s++) total += ina_safetensors_count(ck->shards[s].st);
  ck->tensors = calloc(total + 1, sizeof *ck->tensors);
  INA_CHECK_ALLOC(ck->tensors);
  for (size_t s = 0; s < ck->nshards; s++)
    for (size_t i = 0; i < ina_safetensors_count(ck->shards[s].st); i++)
      ck->tensors[ck->ntensors++] =
          (tensor_ref_t){ina_safetensors_at(ck->shards[s].st, i)->name, s};
  INA_CHECK(build_name_index(ck));
  return INA_OK;
fail:
  return st;
}

static int has_suffix(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The regular *.safetensors files of the directory, sorted by name. */
static ina_status_t scan_directory(ina_checkpoint_t *ck) {
  ina_status_t st = INA_OK;
  DIR *d = opendir(ck->dir);
  size_t cap = 0;
  char *path = NULL;
  INA_REQUIRE(d != NULL, INA_ERR_IO, "checkpoint %s: cannot open directory: %s", ck->dir,
              strerror(errno));
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (!has_suffix(de->d_name, ".safetensors")) continue;
    path = join_path(ck->dir, de->d_name);
    INA_CHECK_ALLOC(path);
    int regular = is_regular_file(path);
    free(path);
    path = NULL;
    if (!regular) continue;
    if (ck->nshards == cap) {
      cap = cap ? 2 * cap : 16;
      shard_t *grown = realloc(ck->shards, cap * sizeof *grown);
      INA_CHECK_ALLOC(grown);
      ck->shards = grown;
    }
    shard_t *shard = &ck->shards[ck->nshards];
    *shard = (shard_t){NULL, strdup(de->d_name), NULL};
    INA_CHECK_ALLOC(shard->owned_name);
    shard->file_name = shard->owned_name;
    ck->nshards++;
  }
  if (ck->nshards) qsort(ck->shards, ck->nshards, sizeof *ck->shards, cmp_shard);
fail:
  if (d) closedir(d);
  return st;
}

ina_status_t ina_checkpoint_open(const char *dir, ina_checkpoint_t **out) {
  ina_status_t st = INA_OK;
  ina_checkpoint_t *ck = NULL;
  char *single = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_checkpoint_open: out is NULL");
  *out = NULL;
  INA_REQUIRE(dir != NULL, INA_ERR_INVALID_ARGUMENT, "ina_checkpoint_open: dir is NULL");
  ck = calloc(1, sizeof *ck);
  INA_CHECK_ALLOC(ck);
  ck->dir = strdup(dir);
  INA_CHECK_ALLOC(ck->dir);
  struct stat sb;
  INA_REQUIRE(stat(dir, &sb) == 0, INA_ERR_IO, "checkpoint %s: %s", dir, strerror(errno));
  INA_REQUIRE(S_ISDIR(sb.st_mode), INA_ERR_IO, "checkpoint %s: not a directory", dir);

  ck->index_path = join_path(dir, INDEX_FILE);
  INA_CHECK_ALLOC(ck->index_path);
  if (is_regular_file(ck->index_path)) {
    INA_CHECK(ina_json_load_file(ck->index_path, &ck->index));
    INA_CHECK(read_weight_map(ck));
  } else {
    free(ck->index_path);
    ck->index_path = NULL;
    single = join_path(dir, SINGLE_FILE);
    INA_CHECK_ALLOC(single);
    if (is_regular_file(single)) {
      ck->shards = calloc(1, sizeof *ck->shards);
      INA_CHECK_ALLOC(ck->shards);
      ck->shards[0].owned_name = strdup(SINGLE_FILE);
      INA_CHECK_ALLOC(ck->shards[0].owned_name);
      ck->shards[0].file_name = ck->shards[0].owned_name;
      ck->nshards = 1;
    } else {
      INA_CHECK(scan_directory(ck));
    }
    INA_REQUIRE(ck->nshards > 0, INA_ERR_NOT_FOUND, "no safetensors files in %s", dir);
    for (size_t i = 0; i < ck->nshards; i++) INA_CHECK(open_shard(ck, i));
    INA_CHECK(list_shard_tensors(ck));
  }
  free(single);
  *out = ck;
  return INA_OK;
fail:
  free(single);
  ina_checkpoint_close(ck);
  return st;
}

ina_status_t ina_checkpoint_open_index_memory(const char *dir, const void *json, size_t size,
                                              const char *name, ina_checkpoint_t **out) {
  ina_status_t st = INA_OK;
  ina_checkpoint_t *ck = NULL;
  json_error_t err;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_checkpoint_open_index_memory: out is NULL");
  *out = NULL;
  INA_REQUIRE(dir != NULL && (json != NULL || size == 0), INA_ERR_INVALID_ARGUMENT,
              "ina_checkpoint_open_index_memory: dir or bytes is NULL");
  ck = calloc(1, sizeof *ck);
  INA_CHECK_ALLOC(ck);
  ck->dir = strdup(dir);
  INA_CHECK_ALLOC(ck->dir);
  ck->index_path = name ? strdup(name) : join_path(dir, INDEX_FILE);
  INA_CHECK_ALLOC(ck->index_path);
  /* As ina_json_load_file reads the file: duplicate keys refused. */
  ck->index = json_loadb(size ? json : "", size, JSON_REJECT_DUPLICATES, &err);
  INA_REQUIRE(ck->index != NULL, INA_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", ck->index_path,
              err.line, err.column, err.text);
  INA_REQUIRE(json_is_object(ck->index), INA_ERR_FORMAT, "%s: expected a JSON object at the top",
              ck->index_path);
  INA_CHECK(read_weight_map(ck));
  *out = ck;
  return INA_OK;
fail:
  ina_checkpoint_close(ck);
  return st;
}

void ina_checkpoint_close(ina_checkpoint_t *ck) {
  if (!ck) return;
  for (size_t i = 0; i < ck->nshards; i++) {
    ina_safetensors_close(ck->shards[i].st);
    free(ck->shards[i].owned_name);
  }
  free(ck->shards);
  free(ck->tensors);
  free(ck->by_name);
  json_decref(ck->index);
  free(ck->index_path);
  free(ck->dir);
  free(ck);
}

const char *ina_checkpoint_dir(const ina_checkpoint_t *ck) { return ck ? ck->dir : NULL; }

int ina_checkpoint_has(ina_checkpoint_t *ck, const char *name) {
  return ck && name && find_ref(ck, name) != NULL;
}

ina_status_t ina_checkpoint_get(ina_checkpoint_t *ck, const char *name, ina_tensor_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_checkpoint_get: out is NULL");
  memset(out, 0, sizeof *out);
  INA_REQUIRE(ck != NULL && name != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_checkpoint_get: NULL checkpoint or name");
  const tensor_ref_t *ref = find_ref(ck, name);
  INA_REQUIRE(ref != NULL, INA_ERR_NOT_FOUND, "checkpoint %s: no tensor '" NAME_FMT "'", ck->dir,
              name);
  shard_t *shard = &ck->shards[ref->shard];
  if (!shard->st) {
    ina_status_t open_st = open_shard(ck, ref->shard);
    if (open_st != INA_OK) {
      /* Say which tensor needed the shard, keeping the reason the reader gave. */
      char reason[600];
      snprintf(reason, sizeof reason, "%s", ina_last_error());
      INA_REQUIRE(0, open_st, "checkpoint %s: tensor '" NAME_FMT "': %s", ck->dir, name, reason);
    }
  }
  const ina_st_entry_t *e = ina_safetensors_find(shard->st, name);
  INA_REQUIRE(e != NULL, INA_ERR_FORMAT,
              "checkpoint %s: index maps tensor '" NAME_FMT "' to %s, which has no such tensor",
              ck->dir, name, shard->file_name);
  /* The mapping is read-only: the view must not be written through. */
  *out = ina_tensor_wrap((void *)e->data, e->dtype, e->ndim, e->shape, INA_CPU);
  return INA_OK;
fail:
  return st;
}

size_t ina_checkpoint_count(ina_checkpoint_t *ck) { return ck ? ck->ntensors : 0; }

const char *ina_checkpoint_name_at(ina_checkpoint_t *ck, size_t i) {
  return ck && i < ck->ntensors ? ck->tensors[i].name : NULL;
}

const char *ina_checkpoint_shard_of(const ina_checkpoint_t *ck, const char *name) {
  const tensor_ref_t *ref = ck && name ? find_ref(ck, name) : NULL;
  return ref ? ck->shards[ref->shard].file_name : NULL;
}
