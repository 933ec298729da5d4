/* Fuzz target: model.safetensors.index.json, the weight map of a sharded checkpoint (a
 * downloaded checkpoint is outside input). Each input is the file's text. The checkpoint
 * directory holds one real shard, SHARD (a few tensors), and the index itself.
 *
 * For every input it traps unless:
 *  - ina_checkpoint_open_index_memory refuses it exactly when the index read here apart
 *    (jansson, duplicate keys refused) breaks a rule of the format: a JSON object whose
 *    "weight_map" is an object of file name strings, each a plain name inside the
 *    directory (not empty, not ".", no '/', no "..");
 *  - a refusal is INA_ERR_FORMAT, *out NULL, with a message naming the index file;
 *  - an accepted index gives one tensor per weight_map key, in the index's order, no
 *    name twice, each found by ina_checkpoint_has and read from its weight_map value
 *    (ina_checkpoint_shard_of), a plain file name; a name outside the map is not found;
 *  - ina_checkpoint_get of each tensor gives SHARD's bytes for one SHARD holds, and
 *    otherwise fails naming the tensor: INA_ERR_FORMAT when its shard is SHARD (which
 *    lacks it) or the index (no safetensors file), INA_ERR_IO when its shard is not there;
 *  - ina_checkpoint_open on the directory, with the input as its index file, gives the
 *    same verdict and the same tensors and shards.
 * Everything is freed and unmapped (LeakSanitizer checks the memory). */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/checkpoint.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_files.h"

#define INDEX_FILE "model.safetensors.index.json"
#define SHARD "model-00001-of-00002.safetensors"
/* A message names a tensor or file by (at most) this many of its first bytes. */
#define NAMED_PREFIX 64

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const ina_status_t kFailures[] = {INA_ERR_FORMAT, INA_OK};

/* What SHARD holds: names HF checkpoints have, so that seeds and the dictionary hit them. */
static const char *const kShardTensors[] = {"model.embed_tokens.weight", "model.norm.weight",
                                            "lm_head.weight"};
enum { N_SHARD_TENSORS = sizeof kShardTensors / sizeof kShardTensors[0] };
static unsigned char shard_bytes[N_SHARD_TENSORS][8];

static char ckpt_dir[640], index_path[700];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_files_init();
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s", fuzz_scratch_path("checkpoint"));
  FUZZ_REQUIRE(mkdir(ckpt_dir, 0755) == 0, "mkdir %s: %s", ckpt_dir, strerror(errno));
  snprintf(index_path, sizeof index_path, "%s/" INDEX_FILE, ckpt_dir);
  ina_st_write_entry_t w[N_SHARD_TENSORS];
  for (int i = 0; i < N_SHARD_TENSORS; i++) {
    for (int k = 0; k < 8; k++) shard_bytes[i][k] = (unsigned char)(i * 31 + k * 7 + 1);
    w[i] = (ina_st_write_entry_t){kShardTensors[i], INA_DTYPE_BF16, 2, {2, 2}, shard_bytes[i]};
  }
  char path[800];
  snprintf(path, sizeof path, "%s/" SHARD, ckpt_dir);
  FUZZ_REQUIRE(ina_safetensors_write(path, w, N_SHARD_TENSORS, NULL) == INA_OK, "writing %s: %s",
               path, ina_last_error());
  return 0;
}

/* The format's rule for a shard name: a file directly inside the directory. */
static int plain_file_name(const char *s) {
  return s[0] != '\0' && strcmp(s, ".") != 0 && strchr(s, '/') == NULL && strstr(s, "..") == NULL;
}

/* The weight map when the index keeps every rule, else NULL. */
static const json_t *valid_weight_map(const json_t *index) {
  if (!json_is_object(index)) return NULL;
  const json_t *map = json_object_get(index, "weight_map");
  if (!json_is_object(map)) return NULL;
  const char *key;
  const json_t *value;
  json_object_foreach((json_t *)map, key, value) {
    if (!json_is_string(value) || !plain_file_name(json_string_value(value))) return NULL;
  }
  return map;
}

/* The message names s (its first NAMED_PREFIX bytes, as long names are cut). */
static void require_named(const char *what, const char *s) {
  char prefix[NAMED_PREFIX + 1];
  snprintf(prefix, sizeof prefix, "%s", s);
  FUZZ_REQUIRE(strstr(ina_last_error(), prefix) != NULL, "%s: the message does not name '%s': %s",
               what, prefix, ina_last_error());
}

static int by_string(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The checkpoint holds the weight map's tensors (see the top of the file). */
static void check_checkpoint(ina_checkpoint_t *ck, const json_t *map) {
  FUZZ_REQUIRE(strcmp(ina_checkpoint_dir(ck), ckpt_dir) == 0, "dir reads %s",
               ina_checkpoint_dir(ck));
  const size_t n = ina_checkpoint_count(ck);
  FUZZ_REQUIRE(n == json_object_size(map), "%zu tensors from a weight map of %zu", n,
               json_object_size(map));
  const char **names = calloc(n + 1, sizeof *names);
  FUZZ_REQUIRE(names != NULL, "no memory for %zu names", n);
  size_t i = 0;
  const char *key;
  const json_t *value;
  json_object_foreach((json_t *)map, key, value) {
    const char *name = ina_checkpoint_name_at(ck, i);
    FUZZ_REQUIRE(name && strcmp(name, key) == 0, "tensor %zu is '%s', the index's '%s'", i,
                 name ? name : "(NULL)", key);
    FUZZ_REQUIRE(ina_checkpoint_has(ck, key), "has('%s') is 0", key);
    const char *shard = ina_checkpoint_shard_of(ck, key);
    FUZZ_REQUIRE(shard && strcmp(shard, json_string_value(value)) == 0,
                 "tensor '%s' is read from '%s', the index says '%s'", key,
                 shard ? shard : "(NULL)", json_string_value(value));
    FUZZ_REQUIRE(plain_file_name(shard), "tensor '%s' is read from '%s', outside the directory",
                 key, shard);
    names[i++] = name;
  }
  FUZZ_REQUIRE(ina_checkpoint_name_at(ck, n) == NULL, "name_at(count) is not NULL");
  qsort(names, n, sizeof *names, by_string);
  for (i = 1; i < n; i++)
    FUZZ_REQUIRE(strcmp(names[i - 1], names[i]) != 0, "tensor '%s' listed twice", names[i]);
  free(names);

  static const char *const kAbsent[] = {"model.layers.0.absent.weight", "\x01", ""};
  for (size_t k = 0; k < sizeof kAbsent / sizeof kAbsent[0]; k++) {
    if (json_object_get(map, kAbsent[k])) continue;
    FUZZ_REQUIRE(!ina_checkpoint_has(ck, kAbsent[k]) && !ina_checkpoint_shard_of(ck, kAbsent[k]),
                 "'%s' is found, yet not in the index", kAbsent[k]);
    ina_tensor_t v;
    ina_clear_error();
    FUZZ_REQUIRE(ina_checkpoint_get(ck, kAbsent[k], &v) == INA_ERR_NOT_FOUND,
                 "get of absent '%s' does not fail with INA_ERR_NOT_FOUND", kAbsent[k]);
  }
}

/* Each tensor read through its shard (see the top of the file). */
static void check_reads(ina_checkpoint_t *ck) {
  for (size_t i = 0; i < ina_checkpoint_count(ck); i++) {
    const char *name = ina_checkpoint_name_at(ck, i);
    const char *shard = ina_checkpoint_shard_of(ck, name);
    int held = -1;
    for (int k = 0; k < N_SHARD_TENSORS; k++)
      if (strcmp(name, kShardTensors[k]) == 0) held = k;
    ina_tensor_t v;
    ina_clear_error();
    const ina_status_t st = ina_checkpoint_get(ck, name, &v);
    if (strcmp(shard, SHARD) == 0 && held >= 0) {
      FUZZ_REQUIRE(st == INA_OK, "'%s' from " SHARD ": %s", name, ina_last_error());
      FUZZ_REQUIRE(v.dtype == INA_DTYPE_BF16 && v.ndim == 2 && v.shape[0] == 2 &&
                       v.shape[1] == 2 && memcmp(v.data, shard_bytes[held], 8) == 0,
                   "'%s' reads back wrong from " SHARD, name);
      continue;
    }
    const ina_status_t want = strcmp(shard, SHARD) == 0 || strcmp(shard, INDEX_FILE) == 0
                                  ? INA_ERR_FORMAT
                                  : INA_ERR_IO;
    FUZZ_REQUIRE(st == want, "get('%s') from '%s': status %d, want %d (%s)", name, shard, (int)st,
                 (int)want, ina_last_error());
    FUZZ_REQUIRE(v.data == NULL, "a failed get('%s') left a view", name);
    require_named("ina_checkpoint_get", name);
    require_named("ina_checkpoint_get", shard);
  }
}

/* Two checkpoints of the same index hold the same tensors from the same shards. */
static void require_same(ina_checkpoint_t *a, ina_checkpoint_t *b) {
  FUZZ_REQUIRE(ina_checkpoint_count(a) == ina_checkpoint_count(b),
               "%zu tensors from memory, %zu from the file", ina_checkpoint_count(a),
               ina_checkpoint_count(b));
  for (size_t i = 0; i < ina_checkpoint_count(a); i++) {
    const char *x = ina_checkpoint_name_at(a, i), *y = ina_checkpoint_name_at(b, i);
    FUZZ_REQUIRE(strcmp(x, y) == 0 &&
                     strcmp(ina_checkpoint_shard_of(a, x), ina_checkpoint_shard_of(b, y)) == 0,
                 "tensor %zu differs between memory ('%s') and file ('%s')", i, x, y);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* The index file first: a tensor the index maps to itself reads these bytes. */
  FILE *f = fopen(index_path, "wb");
  FUZZ_REQUIRE(f != NULL && (size == 0 || fwrite(data, 1, size, f) == size) && fclose(f) == 0,
               "writing %s: %s", index_path, strerror(errno));

  json_t *index = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
  const json_t *map = valid_weight_map(index);

  ina_checkpoint_t *ck = (ina_checkpoint_t *)&ck; /* not NULL, to see it reset */
  ina_clear_error();
  const ina_status_t st = ina_checkpoint_open_index_memory(ckpt_dir, data, size, NULL, &ck);
  if (st != INA_OK) {
    FUZZ_REQUIRE(ck == NULL, "a failed open left *out set");
    fuzz_require_error("ina_checkpoint_open_index_memory", st, kFailures, index_path);
    FUZZ_REQUIRE(map == NULL, "an index that keeps every rule refused: %s", ina_last_error());
  } else {
    FUZZ_REQUIRE(ck != NULL, "open succeeded without a checkpoint");
    FUZZ_REQUIRE(map != NULL, "an index that breaks a rule accepted");
    check_checkpoint(ck, map);
  }

  /* The same bytes as the directory's index file. */
  ina_checkpoint_t *from_file = (ina_checkpoint_t *)&from_file;
  ina_clear_error();
  const ina_status_t st_file = ina_checkpoint_open(ckpt_dir, &from_file);
  FUZZ_REQUIRE(st_file == st, "the file gives status %d, the memory %d (%s)", (int)st_file,
               (int)st, ina_last_error());
  if (st_file != INA_OK) {
    FUZZ_REQUIRE(from_file == NULL, "a failed open left *out set");
    fuzz_require_error("ina_checkpoint_open", st_file, kFailures, index_path);
  } else {
    require_same(ck, from_file);
    check_reads(from_file);
    ina_checkpoint_close(from_file);
  }

  if (st == INA_OK) {
    check_reads(ck);
    ina_checkpoint_close(ck);
  }
  json_decref(index);
  return 0;
}
