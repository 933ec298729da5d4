/* safetensors writer and reader: random tensors of every dtype and many shapes go through
 * the writer and come back byte for byte; metadata; thousands of tensors; files written
 * by other tools (unpadded header, metadata first), also read from memory; the writer's
 * argument checks. */
#include <jansson.h>

#include "core/safetensors.h"
#include "tests/io/io_test_util.h"

typedef struct {
  char name[64];
  ina_st_write_entry_t w;
  unsigned char *bytes;
  size_t nbytes;
} sample_t;

/* A tensor of the given shape filled with random bytes. */
static void make_sample(test_rng_t *rng, sample_t *s, const char *name, ina_dtype_t dtype, int ndim,
                        const int64_t *shape) {
  snprintf(s->name, sizeof s->name, "%s", name);
  s->w.name = s->name;
  s->w.dtype = dtype;
  s->w.ndim = ndim;
  size_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    s->w.shape[d] = shape[d];
    numel *= (size_t)shape[d];
  }
  s->nbytes = numel * ina_dtype_size(dtype);
  s->bytes = malloc(s->nbytes + 1);
  for (size_t i = 0; i < s->nbytes; i++) s->bytes[i] = (unsigned char)test_rng_next(rng);
  s->w.data = s->nbytes ? s->bytes : NULL; /* an empty tensor may come without data */
}

/* A random shape of the given rank; with allow_zero, now and then a zero dim. */
static void random_shape(test_rng_t *rng, int ndim, int allow_zero, int64_t *shape) {
  for (int d = 0; d < ndim; d++)
    shape[d] =
        allow_zero && test_rng_int(rng, 0, 5) == 0 ? 0 : test_rng_int(rng, 1, ndim >= 4 ? 4 : 9);
}

/* The entry read back matches the sample in name, dtype, shape and every byte. */
static int entry_matches(const ina_st_entry_t *e, const sample_t *s) {
  if (!e || strcmp(e->name, s->name) != 0 || e->dtype != s->w.dtype || e->ndim != s->w.ndim ||
      e->nbytes != s->nbytes)
    return 0;
  for (int d = 0; d < e->ndim; d++)
    if (e->shape[d] != s->w.shape[d]) return 0;
  return s->nbytes == 0 || memcmp(e->data, s->bytes, s->nbytes) == 0;
}

/* The header of a written file: length a multiple of 8, compact JSON then spaces, and
 * tensors laid out back to back in the order given. */
static void check_layout(const char *path, const sample_t *samples, size_t n) {
  size_t size = 0;
  unsigned char *file = io_read_file(path, &size);
  CHECK(file != NULL && size >= 8);
  if (!file || size < 8) {
    free(file);
    return;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | file[i];
  CHECKF(hlen % 8 == 0, "header length %llu", (unsigned long long)hlen);
  size_t data_bytes = 0;
  for (size_t i = 0; i < n; i++) data_bytes += samples[i].nbytes;
  CHECK(8 + hlen + data_bytes == size);
  json_error_t err;
  json_t *h = json_loadb((const char *)file + 8, hlen, 0, &err);
  CHECK(h != NULL);
  CHECK(memchr(file + 8, '\n', hlen) == NULL);
  uint64_t offset = 0;
  for (size_t i = 0; h && i < n; i++) {
    json_t *offs = json_object_get(json_object_get(h, samples[i].name), "data_offsets");
    CHECK((uint64_t)json_integer_value(json_array_get(offs, 0)) == offset);
    offset += samples[i].nbytes;
    CHECK((uint64_t)json_integer_value(json_array_get(offs, 1)) == offset);
  }
  /* Compact JSON (no space after separators), then fewer than 8 spaces of padding. */
  size_t text = hlen;
  while (text > 0 && file[8 + text - 1] == ' ') text--;
  CHECK(text > 0 && file[8 + text - 1] == '}' && hlen - text < 8);
  char *json_text = strndup((const char *)file + 8, text);
  CHECK(strstr(json_text, "\": ") == NULL && strstr(json_text, ", ") == NULL);
  free(json_text);
  json_decref(h);
  free(file);
}

static void test_every_dtype_and_rank(const char *dir, test_rng_t *rng) {
  enum { PER = 3, FIXED = 3 };
  sample_t samples[INA_DTYPE_COUNT * ((INA_MAX_DIMS + 1) * PER + FIXED)];
  size_t n = 0;
  for (int dt = 0; dt < INA_DTYPE_COUNT; dt++) {
    const char *dname = ina_dtype_name((ina_dtype_t)dt);
    char name[64];
    int64_t shape[INA_MAX_DIMS];
    for (int ndim = 0; ndim <= INA_MAX_DIMS; ndim++) {
      for (int k = 0; k < PER; k++) {
        snprintf(name, sizeof name, "model.layers.%d.%s.r%d", k, dname, ndim);
        random_shape(rng, ndim, k == PER - 1, shape);
        make_sample(rng, &samples[n++], name, (ina_dtype_t)dt, ndim, shape);
      }
    }
    /* Fixed edge cases: zero-size tensors and a 5-D one with dims of 1. */
    static const int64_t empty1[1] = {0}, empty3[3] = {2, 0, 3}, ones5[5] = {1, 1, 3, 1, 1};
    snprintf(name, sizeof name, "fixed.%s.empty1", dname);
    make_sample(rng, &samples[n++], name, (ina_dtype_t)dt, 1, empty1);
    snprintf(name, sizeof name, "fixed.%s.empty3", dname);
    make_sample(rng, &samples[n++], name, (ina_dtype_t)dt, 3, empty3);
    snprintf(name, sizeof name, "fixed.%s.ones5", dname);
    make_sample(rng, &samples[n++], name, (ina_dtype_t)dt, 5, ones5);
  }

  ina_st_write_entry_t w[sizeof samples / sizeof samples[0]];
  for (size_t i = 0; i < n; i++) w[i] = samples[i].w;
  char path[512];
  io_join(path, sizeof path, dir, "all.safetensors");
  const char *meta[] = {"format", "pt", "note", "h\xc3\xa9llo \"quoted\"", "empty", "", NULL};
  CHECK_OK(ina_safetensors_write(path, w, n, meta));
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  CHECK(!io_file_exists(tmp));
  check_layout(path, samples, n);

  ina_safetensors_t *st = NULL;
  CHECK_OK(ina_safetensors_open(path, &st));
  if (!st) return;
  CHECK(ina_safetensors_count(st) == n);
  CHECK(strcmp(ina_safetensors_path(st), path) == 0);
  int bad = 0;
  /* at() gives file order, which is the order written; empty tensors may sit anywhere
   * among equal offsets, so compare through find() as well. */
  for (size_t i = 0; i < n; i++) {
    bad += !entry_matches(ina_safetensors_find(st, samples[i].name), &samples[i]);
    const ina_st_entry_t *e = ina_safetensors_at(st, i);
    bad += e == NULL || ina_safetensors_find(st, e->name) != e;
  }
  CHECKF(bad == 0, "%d entries differ", bad);
  CHECK(ina_safetensors_at(st, n) == NULL);
  CHECK(ina_safetensors_find(st, "model.layers.0") == NULL);
  CHECK(ina_safetensors_find(st, "") == NULL);
  CHECK(ina_safetensors_find(st, "zzz") == NULL);
  CHECK(strcmp(ina_safetensors_metadata(st, "format"), "pt") == 0);
  CHECK(strcmp(ina_safetensors_metadata(st, "note"), "h\xc3\xa9llo \"quoted\"") == 0);
  CHECK(strcmp(ina_safetensors_metadata(st, "empty"), "") == 0);
  CHECK(ina_safetensors_metadata(st, "absent") == NULL);
  /* Non-empty tensors come in the written order. */
  size_t next = 0;
  for (size_t i = 0; i < n; i++) {
    if (samples[i].nbytes == 0) continue;
    while (next < n && ina_safetensors_at(st, next)->nbytes == 0) next++;
    CHECK(next < n && strcmp(ina_safetensors_at(st, next)->name, samples[i].name) == 0);
    next++;
  }
  ina_safetensors_close(st);
  for (size_t i = 0; i < n; i++) free(samples[i].bytes);
}

/* Thousands of tensors written in random order: every one is found by name. */
static void test_many_tensors(const char *dir, test_rng_t *rng) {
  enum { N = 4000 };
  sample_t *samples = calloc(N, sizeof *samples);
  ina_st_write_entry_t *w = calloc(N, sizeof *w);
  for (int i = 0; i < N; i++) {
    char name[64];
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.down_proj.weight", i / 256,
             i % 256);
    int64_t shape[2] = {0, 0};
    int ndim = (int)test_rng_int(rng, 0, 2);
    random_shape(rng, ndim, 1, shape);
    make_sample(rng, &samples[i], name, (ina_dtype_t)test_rng_int(rng, 0, INA_DTYPE_COUNT - 1),
                ndim, shape);
  }
  for (int i = N - 1; i > 0; i--) { /* shuffle */
    int j = (int)test_rng_int(rng, 0, i);
    sample_t t = samples[i];
    samples[i] = samples[j];
    samples[j] = t;
  }
  for (int i = 0; i < N; i++) {
    samples[i].w.name = samples[i].name;
    w[i] = samples[i].w;
  }
  char path[512];
  io_join(path, sizeof path, dir, "many.safetensors");
  CHECK_OK(ina_safetensors_write(path, w, N, NULL));
  ina_safetensors_t *st = NULL;
  CHECK_OK(ina_safetensors_open(path, &st));
  if (st) {
    CHECK(ina_safetensors_count(st) == N);
    int bad = 0;
    for (int i = 0; i < N; i++)
      bad += !entry_matches(ina_safetensors_find(st, samples[i].name), &samples[i]);
    CHECKF(bad == 0, "%d of %d tensors not found intact", bad, N);
    CHECK(ina_safetensors_find(st, "model.layers.0.mlp.experts.256.down_proj.weight") == NULL);
    CHECK(ina_safetensors_metadata(st, "format") == NULL);
    ina_safetensors_close(st);
  }
  for (int i = 0; i < N; i++) free(samples[i].bytes);
  free(samples);
  free(w);
}

/* A file as Python's safetensors or another tool may write it: metadata first, entries
 * out of offset order, a header length that is not a multiple of 8. */
static void test_foreign_layout(const char *dir) {
  const char *header =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"e\":{\"dtype\":\"BF16\",\"shape\":[0,4],\"data_offsets\":[16,16]}}";
  size_t hlen = strlen(header);
  unsigned char buf[512];
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  memcpy(buf + 8, header, hlen);
  int64_t a = -1234567890123;
  float b[2] = {1.5f, -2.25f};
  memcpy(buf + 8 + hlen, &a, 8);
  memcpy(buf + 8 + hlen + 8, b, 8);
  char path[512];
  io_join(path, sizeof path, dir, "foreign.safetensors");
  CHECK(io_write_file(path, buf, 8 + hlen + 16));
  ina_safetensors_t *st = NULL;
  CHECK_OK(ina_safetensors_open(path, &st));
  if (!st) return;
  CHECK(ina_safetensors_count(st) == 3);
  CHECK(strcmp(ina_safetensors_at(st, 0)->name, "a") == 0);
  CHECK(strcmp(ina_safetensors_at(st, 1)->name, "b") == 0);
  const ina_st_entry_t *ea = ina_safetensors_find(st, "a");
  CHECK(ea && ea->ndim == 0 && ea->dtype == INA_DTYPE_I64 && ea->nbytes == 8 &&
        memcmp(ea->data, &a, 8) == 0);
  const ina_st_entry_t *eb = ina_safetensors_find(st, "b");
  CHECK(eb && eb->ndim == 1 && eb->shape[0] == 2 && memcmp(eb->data, b, 8) == 0);
  const ina_st_entry_t *ee = ina_safetensors_find(st, "e");
  CHECK(ee && ee->ndim == 2 && ee->shape[0] == 0 && ee->shape[1] == 4 && ee->nbytes == 0);
  CHECK(strcmp(ina_safetensors_metadata(st, "format"), "pt") == 0);
  ina_safetensors_close(st);

  /* The same bytes from memory: entries point into the caller's buffer. */
  st = NULL;
  CHECK_OK(ina_safetensors_open_memory(buf, 8 + hlen + 16, "foreign", &st));
  if (!st) return;
  CHECK(strcmp(ina_safetensors_path(st), "foreign") == 0 && ina_safetensors_count(st) == 3);
  ea = ina_safetensors_find(st, "a");
  eb = ina_safetensors_find(st, "b");
  CHECK(ea && ea->data == buf + 8 + hlen && eb && eb->data == buf + 8 + hlen + 8);
  CHECK(strcmp(ina_safetensors_metadata(st, "format"), "pt") == 0);
  ina_safetensors_close(st);
  /* One data byte short: b's data_offsets end past the data section. */
  st = (ina_safetensors_t *)buf;
  CHECK_FAILS_WITH(ina_safetensors_open_memory(buf, 8 + hlen + 15, "foreign", &st), INA_ERR_FORMAT,
                   "foreign", "'b'");
  CHECK(st == NULL);
  CHECK_FAILS_WITH(ina_safetensors_open_memory(NULL, 0, NULL, &st), INA_ERR_FORMAT, "(memory)",
                   "too short");
  CHECK(st == NULL);
}

/* A file with no tensors at all is valid. */
static void test_empty_file(const char *dir) {
  char path[512];
  io_join(path, sizeof path, dir, "empty.safetensors");
  CHECK_OK(ina_safetensors_write(path, NULL, 0, NULL));
  ina_safetensors_t *st = NULL;
  CHECK_OK(ina_safetensors_open(path, &st));
  CHECK(st && ina_safetensors_count(st) == 0 && ina_safetensors_at(st, 0) == NULL &&
        ina_safetensors_find(st, "x") == NULL);
  ina_safetensors_close(st);
  ina_safetensors_close(NULL); /* a no-op */
}

/* The writer refuses bad entries, names the tensor, and leaves no file behind. */
static void test_writer_rejects(const char *dir) {
  float data[6] = {1, 2, 3, 4, 5, 6};
  char path[512], tmp[600];
  io_join(path, sizeof path, dir, "rejected.safetensors");
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  const ina_st_write_entry_t good = {"w.good", INA_DTYPE_F32, 2, {2, 3}, data};
  struct {
    ina_st_write_entry_t e;
    const char *name_in_message;
  } cases[] = {
      {{"w.ndim", INA_DTYPE_F32, 6, {1, 1, 1, 1, 1}, data}, "w.ndim"},
      {{"w.negative", INA_DTYPE_F32, 2, {2, -3}, data}, "w.negative"},
      {{"w.dtype", (ina_dtype_t)INA_DTYPE_COUNT, 1, {6}, data}, "w.dtype"},
      {{"w.nodata", INA_DTYPE_F32, 1, {6}, NULL}, "w.nodata"},
      {{"w.overflow", INA_DTYPE_F32, 3, {1ll << 31, 1ll << 31, 1ll << 2}, data}, "w.overflow"},
      {{"__metadata__", INA_DTYPE_F32, 1, {6}, data}, "__metadata__"},
      {{"", INA_DTYPE_F32, 1, {6}, data}, NULL},
      {{"w.bad\xff", INA_DTYPE_F32, 1, {6}, data}, "UTF-8"},
      {{"w.good", INA_DTYPE_F32, 1, {6}, data}, "w.good"}, /* duplicate of the first */
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    ina_st_write_entry_t two[2] = {good, cases[k].e};
    ina_clear_error();
    CHECK_FAILS_WITH(ina_safetensors_write(path, two, 2, NULL), INA_ERR_INVALID_ARGUMENT, path,
                     cases[k].name_in_message);
    CHECK(!io_file_exists(path) && !io_file_exists(tmp));
  }
  const char *bad_meta[] = {"k", NULL, NULL};
  CHECK_FAILS_WITH(ina_safetensors_write(path, &good, 1, bad_meta), INA_ERR_INVALID_ARGUMENT, path,
                   "'k'");
  const char *dup_meta[] = {"k", "1", "k", "2", NULL};
  CHECK_FAILS_WITH(ina_safetensors_write(path, &good, 1, dup_meta), INA_ERR_INVALID_ARGUMENT, path,
                   "'k'");
  CHECK(!io_file_exists(path) && !io_file_exists(tmp));

  /* An unwritable place: I/O error naming the file. */
  io_join(path, sizeof path, dir, "no/such/dir/x.safetensors");
  CHECK_FAILS_WITH(ina_safetensors_write(path, &good, 1, NULL), INA_ERR_IO, path, NULL);

  /* Writing over an existing file replaces it whole. */
  io_join(path, sizeof path, dir, "replaced.safetensors");
  CHECK(io_write_text(path, "old contents, not safetensors"));
  CHECK_OK(ina_safetensors_write(path, &good, 1, NULL));
  ina_safetensors_t *st = NULL;
  CHECK_OK(ina_safetensors_open(path, &st));
  CHECK(st && ina_safetensors_count(st) == 1);
  ina_safetensors_close(st);
}

int main(void) {
  test_rng_t rng = {test_seed("test_safetensors")};
  ina_log_set_quiet_errors(1);
  char *dir = io_make_temp_dir();
  test_every_dtype_and_rank(dir, &rng);
  test_many_tensors(dir, &rng);
  test_foreign_layout(dir);
  test_empty_file(dir);
  test_writer_rejects(dir);
  io_remove_tree(dir);
  free(dir);
  return test_finish("test_safetensors");
}
