/* Checkpoint directories: an index over two shards opened lazily (read from the directory
 * or given in memory), a single file, several files without an index, and the ways each
 * can be wrong. */
#include <sys/stat.h>

#include "core/checkpoint.h"
#include "core/safetensors.h"
#include "tests/io/io_test_util.h"

enum { NT = 8 };

/* The checkpoint's tensors, with random contents made once. */
typedef struct {
  char name[64];
  ina_dtype_t dtype;
  int ndim;
  int64_t shape[INA_MAX_DIMS];
  unsigned char *bytes;
  size_t nbytes;
} tensor_t;

static tensor_t g_tensors[NT];

static void make_tensors(test_rng_t *rng) {
  static const char *names[NT] = {"model.embed_tokens.weight",
                                  "model.layers.0.input_layernorm.weight",
                                  "model.layers.0.self_attn.q_proj.weight",
                                  "model.layers.0.mlp.gate.weight",
                                  "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                                  "model.layers.1.mlp.experts.0.up_proj.weight",
                                  "model.norm.weight",
                                  "lm_head.weight"};
  for (int i = 0; i < NT; i++) {
    tensor_t *t = &g_tensors[i];
    snprintf(t->name, sizeof t->name, "%s", names[i]);
    t->dtype = (ina_dtype_t)test_rng_int(rng, 0, INA_DTYPE_COUNT - 1);
    t->ndim = (int)test_rng_int(rng, 1, 3);
    size_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
      t->shape[d] = test_rng_int(rng, 1, 7);
      numel *= (size_t)t->shape[d];
    }
    t->nbytes = numel * ina_dtype_size(t->dtype);
    t->bytes = malloc(t->nbytes);
    for (size_t k = 0; k < t->nbytes; k++) t->bytes[k] = (unsigned char)test_rng_next(rng);
  }
}

/* Writes tensors [first, first + count) of g_tensors to dir/file. */
static void write_shard(const char *dir, const char *file, int first, int count) {
  ina_st_write_entry_t w[NT];
  for (int i = 0; i < count; i++) {
    const tensor_t *t = &g_tensors[first + i];
    w[i] = (ina_st_write_entry_t){t->name, t->dtype, t->ndim, {0}, t->bytes};
    memcpy(w[i].shape, t->shape, sizeof t->shape);
  }
  char path[512];
  CHECK_OK(ina_safetensors_write(io_join(path, sizeof path, dir, file), w, (size_t)count, NULL));
}

/* A fresh subdirectory of the scratch directory. */
static const char *subdir(char *buf, size_t size, const char *root, const char *name) {
  io_join(buf, size, root, name);
  if (mkdir(buf, 0755) != 0) {
    perror(buf);
    exit(1);
  }
  return buf;
}

/* The view of tensor i: right dtype, shape, contiguous strides, CPU, not owned, bytes. */
static void check_view(ina_checkpoint_t *ck, int i) {
  const tensor_t *t = &g_tensors[i];
  ina_tensor_t v;
  CHECK_OK(ina_checkpoint_get(ck, t->name, &v));
  CHECK(v.dtype == t->dtype && v.ndim == t->ndim);
  CHECK(v.device.type == INA_DEVICE_CPU && v.owns_data == 0);
  int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    CHECK(v.shape[d] == t->shape[d]);
    CHECK(v.stride[d] == stride);
    stride *= t->shape[d];
  }
  CHECK(v.data != NULL && memcmp(v.data, t->bytes, t->nbytes) == 0);
  CHECK(ina_tensor_is_contiguous(&v) && ina_tensor_nbytes(&v) == t->nbytes);
}

/* The index of a two-shard checkpoint: tensors 0..4 in shard 1, 5..7 in shard 2, listed
 * in a shuffled order that the checkpoint must keep. */
static const char *SHARD1 = "model-00001-of-00002.safetensors";
static const char *SHARD2 = "model-00002-of-00002.safetensors";

static const char *index_text(char *text, size_t size, const int *order) {
  int len = snprintf(text, size, "{\"metadata\": {\"total_size\": 1234},\n \"weight_map\": {");
  for (int k = 0; k < NT; k++)
    len += snprintf(text + len, size - (size_t)len, "%s\n  \"%s\": \"%s\"", k ? "," : "",
                    g_tensors[order[k]].name, order[k] < 5 ? SHARD1 : SHARD2);
  snprintf(text + len, size - (size_t)len, "\n }\n}\n");
  return text;
}

static void write_index(const char *dir, const int *order) {
  char text[4096], path[512];
  CHECK(io_write_text(io_join(path, sizeof path, dir, "model.safetensors.index.json"),
                      index_text(text, sizeof text, order)));
}

static void test_indexed(const char *root, test_rng_t *rng) {
  char dir[512], path[512];
  subdir(dir, sizeof dir, root, "indexed");
  write_shard(dir, SHARD1, 0, 5);
  write_shard(dir, SHARD2, 5, 3);
  int order[NT];
  for (int k = 0; k < NT; k++) order[k] = k;
  for (int k = NT - 1; k > 0; k--) {
    int j = (int)test_rng_int(rng, 0, k), tmp = order[k];
    order[k] = order[j];
    order[j] = tmp;
  }
  write_index(dir, order);
  /* A stray file that the index does not name must not matter. */
  CHECK(io_write_text(io_join(path, sizeof path, dir, "stray.safetensors"), "garbage"));

  ina_checkpoint_t *ck = NULL;
  CHECK_OK(ina_checkpoint_open(dir, &ck));
  if (!ck) return;
  CHECK(strcmp(ina_checkpoint_dir(ck), dir) == 0);
  CHECK(ina_checkpoint_count(ck) == NT);
  for (int k = 0; k < NT; k++) {
    const char *name = ina_checkpoint_name_at(ck, (size_t)k);
    CHECK(name && strcmp(name, g_tensors[order[k]].name) == 0);
    CHECK(ina_checkpoint_has(ck, g_tensors[k].name));
    const char *shard = ina_checkpoint_shard_of(ck, g_tensors[k].name);
    CHECK(shard && strcmp(shard, k < 5 ? SHARD1 : SHARD2) == 0);
  }
  CHECK(ina_checkpoint_name_at(ck, NT) == NULL);
  CHECK(!ina_checkpoint_has(ck, "model.layers.2.mlp.gate.weight"));
  CHECK(ina_checkpoint_shard_of(ck, "model.layers.2.mlp.gate.weight") == NULL);
  CHECK(ina_checkpoint_shard_of(NULL, g_tensors[0].name) == NULL);

  /* Lazy opening: shard 2 is removed after open. Tensors of shard 1 still load; those of
   * shard 2 fail naming the file, and load once it is back. */
  char shard2[512];
  io_join(shard2, sizeof shard2, dir, SHARD2);
  size_t shard2_size = 0;
  unsigned char *shard2_bytes = io_read_file(shard2, &shard2_size);
  CHECK(shard2_bytes != NULL && remove(shard2) == 0);
  check_view(ck, 0);
  ina_tensor_t v;
  CHECK_FAILS_WITH(ina_checkpoint_get(ck, g_tensors[6].name, &v), INA_ERR_IO, SHARD2,
                   g_tensors[6].name);
  CHECK(ina_tensor_is_empty(&v));
  CHECK(io_write_file(shard2, shard2_bytes, shard2_size));
  free(shard2_bytes);
  for (int i = 0; i < NT; i++) check_view(ck, i);
  /* Once open, a shard stays mapped: removing its file changes nothing. */
  CHECK(remove(io_join(path, sizeof path, dir, SHARD1)) == 0);
  for (int i = 0; i < NT; i++) check_view(ck, i);

  ina_clear_error();
  CHECK_FAILS_WITH(ina_checkpoint_get(ck, "model.layers.9.absent.weight", &v), INA_ERR_NOT_FOUND,
                   dir, "model.layers.9.absent.weight");
  CHECK(ina_tensor_is_empty(&v));
  ina_checkpoint_close(ck);
  ina_checkpoint_close(NULL);
}

/* Indexes that are wrong in each of the ways the reader checks. */
static const struct {
  const char *what, *index;
  ina_status_t at_open; /* status of ina_checkpoint_open */
  const char *in_message;
} kBadIndexes[] = {
    {"not JSON", "{\"weight_map\": ", INA_ERR_FORMAT, "index.json"},
    {"no weight_map", "{\"metadata\": {}}", INA_ERR_FORMAT, "weight_map"},
    {"weight_map an array", "{\"weight_map\": [\"a.safetensors\"]}", INA_ERR_FORMAT,
     "weight_map"},
    {"file name a number", "{\"weight_map\": {\"w.num\": 3}}", INA_ERR_FORMAT, "w.num"},
    {"parent directory", "{\"weight_map\": {\"w.up\": \"../model.safetensors\"}}", INA_ERR_FORMAT,
     "../model.safetensors"},
    {"dot-dot", "{\"weight_map\": {\"w.dd\": \"..\"}}", INA_ERR_FORMAT, "w.dd"},
    {"dot", "{\"weight_map\": {\"w.dot\": \".\"}}", INA_ERR_FORMAT, "w.dot"},
    {"subdirectory", "{\"weight_map\": {\"w.sub\": \"sub/x.safetensors\"}}", INA_ERR_FORMAT,
     "sub/x.safetensors"},
    {"absolute path", "{\"weight_map\": {\"w.abs\": \"/etc/passwd\"}}", INA_ERR_FORMAT, "w.abs"},
    {"empty file name", "{\"weight_map\": {\"w.empty\": \"\"}}", INA_ERR_FORMAT, "w.empty"},
    {"duplicate tensor", "{\"weight_map\": {\"w\": \"a.safetensors\", \"w\": \"b.safetensors\"}}",
     INA_ERR_FORMAT, "index.json"},
    {"escaped slash", "{\"weight_map\": {\"w.esc\": \"sub\\/x.safetensors\"}}", INA_ERR_FORMAT,
     "sub/x.safetensors"},
    {"escaped dots", "{\"weight_map\": {\"w.udots\": \"\\u002e\\u002e\"}}", INA_ERR_FORMAT,
     "w.udots"},
    {"an array at the top", "[{\"weight_map\": {}}]", INA_ERR_FORMAT, "index.json"},
    {"empty", "", INA_ERR_FORMAT, "index.json"},
};
enum { N_BAD_INDEXES = sizeof kBadIndexes / sizeof kBadIndexes[0] };

static void test_bad_indexes(const char *root) {
  for (size_t k = 0; k < N_BAD_INDEXES; k++) {
    char name[32], dir[512], path[512];
    snprintf(name, sizeof name, "badindex%zu", k);
    subdir(dir, sizeof dir, root, name);
    CHECK(io_write_text(io_join(path, sizeof path, dir, "model.safetensors.index.json"),
                        kBadIndexes[k].index));
    ina_checkpoint_t *ck = (ina_checkpoint_t *)&ck;
    int failed_before = test_checks_failed_;
    ina_clear_error();
    CHECK_FAILS_WITH(ina_checkpoint_open(dir, &ck), kBadIndexes[k].at_open, dir,
                     kBadIndexes[k].in_message);
    CHECK(ck == NULL);
    if (test_checks_failed_ > failed_before)
      fprintf(stderr, "  in case: %s\n", kBadIndexes[k].what);
  }

  /* The index names a shard that is not there: found at the first get, as an I/O error
   * naming the file; has() still answers from the index. */
  char dir[512], path[512];
  subdir(dir, sizeof dir, root, "missing_shard");
  write_shard(dir, "present.safetensors", 0, 1);
  char text[1024];
  snprintf(text, sizeof text,
           "{\"weight_map\": {\"%s\": \"present.safetensors\", \"%s\": \"gone.safetensors\", "
           "\"lost.tensor\": \"present.safetensors\"}}",
           g_tensors[0].name, g_tensors[1].name);
  CHECK(io_write_text(io_join(path, sizeof path, dir, "model.safetensors.index.json"), text));
  ina_checkpoint_t *ck = NULL;
  CHECK_OK(ina_checkpoint_open(dir, &ck));
  if (!ck) return;
  CHECK(ina_checkpoint_count(ck) == 3 && ina_checkpoint_has(ck, g_tensors[1].name));
  check_view(ck, 0);
  ina_tensor_t v;
  CHECK_FAILS_WITH(ina_checkpoint_get(ck, g_tensors[1].name, &v), INA_ERR_IO, "gone.safetensors",
                   g_tensors[1].name);
  /* The index claims a tensor the shard does not hold. */
  CHECK_FAILS_WITH(ina_checkpoint_get(ck, "lost.tensor", &v), INA_ERR_FORMAT, "present.safetensors",
                   "lost.tensor");
  CHECK(ina_tensor_is_empty(&v));
  ina_checkpoint_close(ck);
}

/* The index given in memory: the same checkpoint as from the file, shards opened from the
 * directory when first needed, and the same refusals, naming the label given. */
static void test_index_in_memory(const char *root) {
  char dir[512], text[4096];
  subdir(dir, sizeof dir, root, "in_memory");
  write_shard(dir, SHARD1, 0, 5);
  write_shard(dir, SHARD2, 5, 3);
  int order[NT];
  for (int k = 0; k < NT; k++) order[k] = NT - 1 - k;
  index_text(text, sizeof text, order);
  ina_checkpoint_t *ck = NULL;
  CHECK_OK(ina_checkpoint_open_index_memory(dir, text, strlen(text), NULL, &ck));
  if (!ck) return;
  CHECK(strcmp(ina_checkpoint_dir(ck), dir) == 0 && ina_checkpoint_count(ck) == NT);
  for (int k = 0; k < NT; k++) {
    CHECK(strcmp(ina_checkpoint_name_at(ck, (size_t)k), g_tensors[order[k]].name) == 0);
    const char *shard = ina_checkpoint_shard_of(ck, g_tensors[k].name);
    CHECK(shard && strcmp(shard, k < 5 ? SHARD1 : SHARD2) == 0);
  }
  /* The bytes are not kept: the checkpoint outlives them. */
  memset(text, 'x', sizeof text);
  for (int i = 0; i < NT; i++) check_view(ck, i);
  ina_tensor_t v;
  CHECK_FAILS_WITH(ina_checkpoint_get(ck, "absent.weight", &v), INA_ERR_NOT_FOUND, dir,
                   "absent.weight");
  ina_checkpoint_close(ck);

  /* dir is read only for the shards: one that is not there fails at the first get. */
  char gone[512];
  io_join(gone, sizeof gone, root, "no_such_checkpoint");
  static const char one[] = "{\"weight_map\": {\"w\": \"only.safetensors\"}}";
  CHECK_OK(ina_checkpoint_open_index_memory(gone, one, sizeof one - 1, "label.json", &ck));
  if (!ck) return;
  CHECK(ina_checkpoint_has(ck, "w"));
  CHECK(strcmp(ina_checkpoint_shard_of(ck, "w"), "only.safetensors") == 0);
  CHECK_FAILS_WITH(ina_checkpoint_get(ck, "w", &v), INA_ERR_IO, "only.safetensors", gone);
  ina_checkpoint_close(ck);

  /* An empty weight map is an empty checkpoint, as from the file. */
  static const char empty_map[] = "{\"weight_map\": {}}";
  CHECK_OK(ina_checkpoint_open_index_memory(dir, empty_map, sizeof empty_map - 1, NULL, &ck));
  CHECK(ck && ina_checkpoint_count(ck) == 0 && ina_checkpoint_name_at(ck, 0) == NULL);
  ina_checkpoint_close(ck);

  for (size_t k = 0; k < N_BAD_INDEXES; k++) {
    int failed_before = test_checks_failed_;
    const char *label = "memory/model.safetensors.index.json";
    ck = (ina_checkpoint_t *)&ck;
    ina_clear_error();
    CHECK_FAILS_WITH(ina_checkpoint_open_index_memory(dir, kBadIndexes[k].index,
                                                      strlen(kBadIndexes[k].index), label, &ck),
                     kBadIndexes[k].at_open, label, kBadIndexes[k].in_message);
    CHECK(ck == NULL);
    /* Without a label, the messages name the index file of the directory. */
    ina_clear_error();
    CHECK_FAILS_WITH(ina_checkpoint_open_index_memory(dir, kBadIndexes[k].index,
                                                      strlen(kBadIndexes[k].index), NULL, &ck),
                     kBadIndexes[k].at_open, dir, "model.safetensors.index.json");
    if (test_checks_failed_ > failed_before)
      fprintf(stderr, "  in case (in memory): %s\n", kBadIndexes[k].what);
  }
  /* Only the bytes given are read: a valid index cut short is not JSON. */
  CHECK_FAILS_WITH(ina_checkpoint_open_index_memory(dir, one, sizeof one - 2, NULL, &ck),
                   INA_ERR_FORMAT, dir, "invalid JSON");
  CHECK_FAILS_WITH(ina_checkpoint_open_index_memory(dir, NULL, 0, NULL, &ck), INA_ERR_FORMAT, dir,
                   "invalid JSON");
  CHECK(ck == NULL);
  CHECK(ina_checkpoint_open_index_memory(dir, one, sizeof one - 1, NULL, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_checkpoint_open_index_memory(NULL, one, sizeof one - 1, NULL, &ck) ==
            INA_ERR_INVALID_ARGUMENT &&
        ck == NULL);
}

static void test_single_file(const char *root) {
  char dir[512];
  subdir(dir, sizeof dir, root, "single");
  write_shard(dir, "model.safetensors", 0, NT);
  /* Other safetensors files are ignored when model.safetensors exists. */
  write_shard(dir, "extra.safetensors", 0, 2);
  ina_checkpoint_t *ck = NULL;
  CHECK_OK(ina_checkpoint_open(dir, &ck));
  if (!ck) return;
  CHECK(ina_checkpoint_count(ck) == NT);
  for (int i = 0; i < NT; i++) {
    CHECK(strcmp(ina_checkpoint_name_at(ck, (size_t)i), g_tensors[i].name) == 0); /* file order */
    CHECK(strcmp(ina_checkpoint_shard_of(ck, g_tensors[i].name), "model.safetensors") == 0);
    check_view(ck, i);
  }
  ina_tensor_t v;
  CHECK_FAILS_WITH(ina_checkpoint_get(ck, "nope", &v), INA_ERR_NOT_FOUND, dir, "'nope'");
  ina_checkpoint_close(ck);

  /* A broken model.safetensors fails at open, naming it. */
  char bad[512], path[512];
  subdir(bad, sizeof bad, root, "single_bad");
  static const char broken[] = "\x10\0\0\0\0\0\0\0{not json}      ";
  CHECK(io_write_file(io_join(path, sizeof path, bad, "model.safetensors"), broken,
                      sizeof broken - 1));
  ck = (ina_checkpoint_t *)&ck;
  CHECK_FAILS_WITH(ina_checkpoint_open(bad, &ck), INA_ERR_FORMAT, path, NULL);
  CHECK(ck == NULL);
}

static void test_several_files(const char *root) {
  char dir[512], path[512];
  subdir(dir, sizeof dir, root, "several");
  /* Written out of name order: the checkpoint lists them sorted by file name. */
  write_shard(dir, "b.safetensors", 3, 5);
  write_shard(dir, "a.safetensors", 0, 3);
  CHECK(io_write_text(io_join(path, sizeof path, dir, "config.json"), "{}"));
  CHECK(mkdir(io_join(path, sizeof path, dir, "dir.safetensors"), 0755) == 0); /* not a file */
  ina_checkpoint_t *ck = NULL;
  CHECK_OK(ina_checkpoint_open(dir, &ck));
  if (!ck) return;
  CHECK(ina_checkpoint_count(ck) == NT);
  for (int i = 0; i < NT; i++) {
    CHECK(strcmp(ina_checkpoint_name_at(ck, (size_t)i), g_tensors[i].name) == 0);
    CHECK(ina_checkpoint_has(ck, g_tensors[i].name));
    CHECK(strcmp(ina_checkpoint_shard_of(ck, g_tensors[i].name),
                 i < 3 ? "a.safetensors" : "b.safetensors") == 0);
    check_view(ck, i);
  }
  ina_checkpoint_close(ck);

  /* The same tensor in two files. */
  char dup[512];
  subdir(dup, sizeof dup, root, "duplicates");
  write_shard(dup, "one.safetensors", 0, 3);
  write_shard(dup, "two.safetensors", 2, 3);
  ck = (ina_checkpoint_t *)&ck;
  CHECK_FAILS_WITH(ina_checkpoint_open(dup, &ck), INA_ERR_FORMAT, dup, g_tensors[2].name);
  CHECK(strstr(ina_last_error(), "one.safetensors") && strstr(ina_last_error(), "two.safetensors"));
  CHECK(ck == NULL);

  /* One bad file among good ones. */
  char bad[512];
  subdir(bad, sizeof bad, root, "one_bad");
  write_shard(bad, "good.safetensors", 0, 3);
  CHECK(io_write_text(io_join(path, sizeof path, bad, "worse.safetensors"), "tiny"));
  ck = (ina_checkpoint_t *)&ck;
  CHECK_FAILS_WITH(ina_checkpoint_open(bad, &ck), INA_ERR_FORMAT, "worse.safetensors", NULL);
  CHECK(ck == NULL);
}

static void test_not_a_checkpoint(const char *root) {
  char dir[512], path[512];
  subdir(dir, sizeof dir, root, "empty");
  CHECK(io_write_text(io_join(path, sizeof path, dir, "config.json"), "{}"));
  CHECK(io_write_text(io_join(path, sizeof path, dir, "weights.safetensors.bak"), "x"));
  ina_checkpoint_t *ck = (ina_checkpoint_t *)&ck;
  CHECK_FAILS_WITH(ina_checkpoint_open(dir, &ck), INA_ERR_NOT_FOUND, dir,
                   "no safetensors files in");
  CHECK(ck == NULL);

  io_join(path, sizeof path, root, "no_such_dir");
  ck = (ina_checkpoint_t *)&ck;
  CHECK_FAILS_WITH(ina_checkpoint_open(path, &ck), INA_ERR_IO, path, NULL);
  CHECK(ck == NULL);
  io_join(path, sizeof path, dir, "config.json");
  ck = (ina_checkpoint_t *)&ck;
  CHECK_FAILS_WITH(ina_checkpoint_open(path, &ck), INA_ERR_IO, path, "not a directory");
  CHECK(ck == NULL);
}

int main(void) {
  test_rng_t rng = {test_seed("test_checkpoint")};
  ina_log_set_quiet_errors(1);
  char *root = io_make_temp_dir();
  make_tensors(&rng);
  test_indexed(root, &rng);
  test_bad_indexes(root);
  test_index_in_memory(root);
  test_single_file(root);
  test_several_files(root);
  test_not_a_checkpoint(root);
  for (int i = 0; i < NT; i++) free(g_tensors[i].bytes);
  io_remove_tree(root);
  free(root);
  return test_finish("test_checkpoint");
}
