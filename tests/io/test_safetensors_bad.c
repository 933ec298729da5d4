/* Malformed safetensors files, made here byte by byte: each must fail with the right
 * status, leave *out NULL, and leave a message naming the file (and the tensor, for entry
 * errors). Also every prefix of a valid file, and random byte flips in its header. */
#include <fcntl.h>

#include "core/safetensors.h"
#include "tests/io/io_test_util.h"

#define DATA_BYTES 64

typedef struct {
  const char *dir;
  int counter; /* a fresh file name per case, so messages cannot come from an old case */
  char path[512];
} bench_t;

/* Opens the bytes as a file; on success walks every entry (ASan sees any bad pointer)
 * and closes it. Checks that a failure leaves *out NULL. */
static ina_status_t open_bytes(bench_t *b, const void *bytes, size_t n) {
  char name[64];
  snprintf(name, sizeof name, "case_%04d.safetensors", b->counter++);
  io_join(b->path, sizeof b->path, b->dir, name);
  if (!io_write_file(b->path, bytes, n)) {
    fprintf(stderr, "cannot write %s\n", b->path);
    exit(1);
  }
  ina_clear_error();
  ina_safetensors_t *st = (ina_safetensors_t *)b; /* non-NULL, to see it reset */
  ina_status_t s = ina_safetensors_open(b->path, &st);
  if (s != INA_OK) {
    CHECKF(st == NULL, "failed open left *out set (%s)", b->path);
    CHECKF(ina_last_error()[0] != '\0', "no message for %s", b->path);
  } else {
    unsigned sum = 0;
    for (size_t i = 0; i < ina_safetensors_count(st); i++) {
      const ina_st_entry_t *e = ina_safetensors_at(st, i);
      for (size_t k = 0; k < e->nbytes; k++) sum += ((const unsigned char *)e->data)[k];
      CHECK(ina_safetensors_find(st, e->name) == e);
    }
    (void)sum;
    ina_safetensors_close(st);
  }
  remove(b->path);
  return s;
}

/* 8-byte length + header text (of hlen bytes, which may hold NULs) + DATA_BYTES. */
static unsigned char *make_file(const char *header, size_t hlen, uint64_t length_field, size_t *n) {
  *n = 8 + hlen + DATA_BYTES;
  unsigned char *buf = malloc(*n);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(length_field >> (8 * i));
  memcpy(buf + 8, header, hlen);
  for (size_t i = 0; i < DATA_BYTES; i++) buf[8 + hlen + i] = (unsigned char)(i * 7 + 1);
  return buf;
}

static void expect(bench_t *b, const char *what, const char *header, ina_status_t want,
                   const char *also_name) {
  size_t n;
  unsigned char *buf = make_file(header, strlen(header), strlen(header), &n);
  int failed_before = test_checks_failed_;
  ina_status_t s = open_bytes(b, buf, n);
  if (want == INA_OK)
    CHECKF(s == INA_OK, "%s", ina_last_error());
  else
    CHECK_FAILS_WITH(s, want, b->path, also_name);
  if (test_checks_failed_ > failed_before) fprintf(stderr, "  in case: %s: %s\n", what, header);
  free(buf);
}

#define T(name, body) "{\"" name "\":{" body "}}"
#define F32_8 "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]"

static void test_header_rules(bench_t *b) {
  static const struct {
    const char *what, *header;
    ina_status_t want;
    const char *name; /* must appear in the message */
  } cases[] = {
      /* The header as a whole. */
      {"not JSON", "not json at all", INA_ERR_FORMAT, "JSON"},
      {"cut JSON", "{\"t\":{\"dtype\":", INA_ERR_FORMAT, NULL},
      {"array", "[1,2]", INA_ERR_FORMAT, "object"},
      {"string", "\"text\"", INA_ERR_FORMAT, NULL},
      {"trailing garbage", "{} x", INA_ERR_FORMAT, NULL},
      {"duplicate tensor", "{\"t\":{" F32_8 "},\"t\":{" F32_8 "}}", INA_ERR_FORMAT, NULL},
      {"invalid UTF-8 name", "{\"t\xff\":{" F32_8 "}}", INA_ERR_FORMAT, NULL},
      {"NUL escape in name", "{\"t\\u0000x\":{" F32_8 "}}", INA_ERR_FORMAT, NULL},
      {"integer too large",
       T("t", "\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]"),
       INA_ERR_FORMAT, NULL},
      /* Entries. */
      {"entry is a number", "{\"w.num\":1}", INA_ERR_FORMAT, "w.num"},
      {"entry is an array", "{\"w.arr\":[1]}", INA_ERR_FORMAT, "w.arr"},
      {"dtype missing", T("w.a", "\"shape\":[2],\"data_offsets\":[0,8]"), INA_ERR_FORMAT, "w.a"},
      {"dtype a number", T("w.b", "\"dtype\":5,\"shape\":[2],\"data_offsets\":[0,8]"),
       INA_ERR_FORMAT, "w.b"},
      {"dtype BOOL", T("w.bool", "\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]"),
       INA_ERR_UNSUPPORTED, "w.bool"},
      {"dtype F8_E8M0", T("w.e8", "\"dtype\":\"F8_E8M0\",\"shape\":[2],\"data_offsets\":[0,2]"),
       INA_ERR_UNSUPPORTED, "F8_E8M0"},
      {"dtype lower case", T("w.lc", "\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]"),
       INA_ERR_UNSUPPORTED, "w.lc"},
      {"dtype empty", T("w.de", "\"dtype\":\"\",\"shape\":[2],\"data_offsets\":[0,8]"),
       INA_ERR_UNSUPPORTED, "w.de"},
      {"shape missing", T("w.c", "\"dtype\":\"F32\",\"data_offsets\":[0,8]"), INA_ERR_FORMAT,
       "w.c"},
      {"shape a number", T("w.d", "\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]"),
       INA_ERR_FORMAT, "w.d"},
      {"shape of strings", T("w.e", "\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]"),
       INA_ERR_FORMAT, "w.e"},
      {"shape of reals", T("w.f", "\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]"),
       INA_ERR_FORMAT, "w.f"},
      {"negative dim", T("w.g", "\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]"),
       INA_ERR_FORMAT, "w.g"},
      {"negative dim, zero product",
       T("w.g0", "\"dtype\":\"F32\",\"shape\":[0,-2],\"data_offsets\":[0,0]"), INA_ERR_FORMAT,
       "w.g0"},
      {"six dims", T("w.h", "\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,2],\"data_offsets\":[0,8]"),
       INA_ERR_UNSUPPORTED, "w.h"},
      {"numel overflow",
       T("w.i", "\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]"),
       INA_ERR_FORMAT, "w.i"},
      {"bytes overflow",
       T("w.i2", "\"dtype\":\"I64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]"),
       INA_ERR_FORMAT, "w.i2"},
      {"overflow beside a zero dim",
       T("w.j", "\"dtype\":\"F32\",\"shape\":[0,4294967296,4294967296],\"data_offsets\":[0,0]"),
       INA_ERR_FORMAT, "w.j"},
      {"offsets missing", T("w.k", "\"dtype\":\"F32\",\"shape\":[2]"), INA_ERR_FORMAT, "w.k"},
      {"offsets a number", T("w.l", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":8"),
       INA_ERR_FORMAT, "w.l"},
      {"one offset", T("w.m", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8]"),
       INA_ERR_FORMAT, "w.m"},
      {"three offsets", T("w.n", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,16]"),
       INA_ERR_FORMAT, "w.n"},
      {"negative offset", T("w.o", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]"),
       INA_ERR_FORMAT, "w.o"},
      {"real offset", T("w.p", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]"),
       INA_ERR_FORMAT, "w.p"},
      {"string offsets", T("w.q", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[\"0\",\"8\"]"),
       INA_ERR_FORMAT, "w.q"},
      {"begin after end", T("w.r", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]"),
       INA_ERR_FORMAT, "w.r"},
      {"end beyond data", T("w.s", "\"dtype\":\"F32\",\"shape\":[18],\"data_offsets\":[0,72]"),
       INA_ERR_FORMAT, "w.s"},
      {"end far beyond data",
       T("w.s2",
         "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9223372036854775799,"
         "9223372036854775807]"),
       INA_ERR_FORMAT, "w.s2"},
      {"begin beyond data", T("w.s3", "\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[65,65]"),
       INA_ERR_FORMAT, "w.s3"},
      {"too few bytes", T("w.t", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]"),
       INA_ERR_FORMAT, "w.t"},
      {"too many bytes", T("w.u", "\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]"),
       INA_ERR_FORMAT, "w.u"},
      {"overlap",
       "{\"w.v1\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
       "\"w.v2\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
       INA_ERR_FORMAT, "w.v1"},
      {"same range",
       "{\"w.w1\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"w.w2\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
       INA_ERR_FORMAT, "w.w2"},
      {"one inside another",
       "{\"w.x1\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
       "\"w.x2\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]}}",
       INA_ERR_FORMAT, "w.x2"},
      /* Metadata. */
      {"metadata a string", "{\"__metadata__\":\"x\"}", INA_ERR_FORMAT, "__metadata__"},
      {"metadata value a number", "{\"__metadata__\":{\"format\":\"pt\",\"step\":1}}",
       INA_ERR_FORMAT, "step"},
      {"metadata value an object", "{\"__metadata__\":{\"nested\":{}}}", INA_ERR_FORMAT, "nested"},
      {"metadata value null",
       "{\"__metadata__\":{\"nil\":null},"
       "\"t\":{" F32_8 "}}",
       INA_ERR_FORMAT, "nil"},
      /* Valid edge cases that must not be rejected. */
      {"no tensors", "{}", INA_OK, NULL},
      {"only metadata", "{\"__metadata__\":{}}", INA_OK, NULL},
      {"zero-size at the end", T("z", "\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[64,64]"),
       INA_OK, NULL},
      {"zero-size inside a tensor",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
       "\"z\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[4,4]}}",
       INA_OK, NULL},
      {"adjacent tensors",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]},"
       "\"b\":{\"dtype\":\"F8_E4M3\",\"shape\":[16],\"data_offsets\":[0,16]}}",
       INA_OK, NULL},
      {"scalar", T("s", "\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[56,64]"), INA_OK, NULL},
      {"extra fields ignored", T("x", F32_8 ",\"extra\":[1,2]"), INA_OK, NULL},
      {"padded with spaces", "{\"p\":{" F32_8 "}}        ", INA_OK, NULL},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    expect(b, cases[k].what, cases[k].header, cases[k].want, cases[k].name);

  /* A NUL inside the header text. */
  static const char with_nul[] = "{\"t\":\0{}}";
  size_t n;
  unsigned char *buf = make_file(with_nul, sizeof with_nul - 1, sizeof with_nul - 1, &n);
  CHECK_FAILS_WITH(open_bytes(b, buf, n), INA_ERR_FORMAT, b->path, NULL);
  free(buf);
}

/* The 8-byte length field against the file size. */
static void test_length_field(bench_t *b) {
  const char *header = "{}";
  static const uint64_t lengths[] = {0,          3 + DATA_BYTES, 1ull << 40,
                                     UINT64_MAX, 1ull << 63,     100000001};
  for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
    size_t n;
    unsigned char *buf = make_file(header, strlen(header), lengths[k], &n);
    CHECK_FAILS_WITH(open_bytes(b, buf, n), INA_ERR_FORMAT, b->path, NULL);
    free(buf);
  }
  /* Shorter than the length field itself. */
  unsigned char small[8] = {2, 0, 0, 0, 0, 0, 0, 0};
  for (size_t len = 0; len < 8; len++)
    CHECK_FAILS_WITH(open_bytes(b, small, len), INA_ERR_FORMAT, b->path, NULL);

  /* A header length above the 100 MB limit in a (sparse) file that is long enough. */
  char path[512];
  io_join(path, sizeof path, b->dir, "sparse.safetensors");
  uint64_t hlen = 100000001;
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; i++) len_bytes[i] = (unsigned char)(hlen >> (8 * i));
  int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  CHECK(fd >= 0 && write(fd, len_bytes, 8) == 8 && ftruncate(fd, (off_t)(8 + hlen + 16)) == 0);
  if (fd >= 0) close(fd);
  ina_safetensors_t *st = (ina_safetensors_t *)b;
  CHECK_FAILS_WITH(ina_safetensors_open(path, &st), INA_ERR_FORMAT, path, "limit");
  CHECK(st == NULL);
  remove(path);

  /* Not there, or not a file. */
  io_join(path, sizeof path, b->dir, "absent.safetensors");
  st = (ina_safetensors_t *)b;
  CHECK_FAILS_WITH(ina_safetensors_open(path, &st), INA_ERR_IO, path, NULL);
  CHECK(st == NULL);
  st = (ina_safetensors_t *)b;
  CHECK_FAILS_WITH(ina_safetensors_open(b->dir, &st), INA_ERR_IO, b->dir, NULL);
  CHECK(st == NULL);
}

/* A small valid file from the writer; the last tensor in the file is not empty, so every
 * proper prefix lacks bytes somewhere. */
static unsigned char *valid_file(bench_t *b, size_t *n, size_t *header_end) {
  float a[12];
  uint16_t c[5];
  int64_t d[4];
  for (int i = 0; i < 12; i++) a[i] = (float)i - 5.5f;
  for (int i = 0; i < 5; i++) c[i] = (uint16_t)(0x3f80 + i);
  for (int i = 0; i < 4; i++) d[i] = -1 - i;
  ina_st_write_entry_t w[] = {
      {"layer.a", INA_DTYPE_F32, 2, {3, 4}, a},
      {"layer.empty", INA_DTYPE_F32, 2, {0, 4}, NULL},
      {"layer.c", INA_DTYPE_BF16, 1, {5}, c},
      {"layer.d", INA_DTYPE_I64, 2, {2, 2}, d},
  };
  const char *meta[] = {"format", "pt", NULL};
  char path[512];
  io_join(path, sizeof path, b->dir, "valid.safetensors");
  CHECK_OK(ina_safetensors_write(path, w, 4, meta));
  unsigned char *bytes = io_read_file(path, n);
  CHECK(bytes != NULL);
  if (!bytes) exit(1);
  remove(path);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i];
  *header_end = 8 + (size_t)hlen;
  CHECK(open_bytes(b, bytes, *n) == INA_OK);
  return bytes;
}

static void test_every_prefix(bench_t *b) {
  size_t n, header_end;
  unsigned char *bytes = valid_file(b, &n, &header_end);
  int wrong = 0;
  for (size_t len = 0; len < n; len++) {
    ina_status_t s = open_bytes(b, bytes, len);
    if (s != INA_ERR_FORMAT || strstr(ina_last_error(), b->path) == NULL) {
      wrong++;
      fprintf(stderr, "prefix of %zu bytes: status %s, message '%s'\n", len, ina_status_string(s),
              ina_last_error());
    }
  }
  CHECKF(wrong == 0, "%d of %zu prefixes not rejected as FORMAT with the path", wrong, n);
  free(bytes);
}

/* Random bytes of the length field and header changed: open either succeeds (and the
 * entries can be read) or fails with FORMAT / UNSUPPORTED and the path in the message. */
static void test_random_flips(bench_t *b, test_rng_t *rng) {
  enum { TRIALS = 3000 };
  size_t n, header_end;
  unsigned char *bytes = valid_file(b, &n, &header_end);
  unsigned char *copy = malloc(n);
  int accepted = 0, rejected = 0, wrong = 0;
  for (int t = 0; t < TRIALS; t++) {
    memcpy(copy, bytes, n);
    int flips = (int)test_rng_int(rng, 1, 4);
    for (int f = 0; f < flips; f++) {
      /* Mostly in the header; one trial in eight also hits the length field. */
      size_t at = (t % 8 == 0) ? (size_t)test_rng_int(rng, 0, 7)
                               : (size_t)test_rng_int(rng, 8, (int64_t)header_end - 1);
      copy[at] ^= (unsigned char)test_rng_int(rng, 1, 255);
    }
    ina_status_t s = open_bytes(b, copy, n);
    if (s == INA_OK) {
      accepted++;
    } else if ((s == INA_ERR_FORMAT || s == INA_ERR_UNSUPPORTED) &&
               strstr(ina_last_error(), b->path) != NULL) {
      rejected++;
    } else {
      wrong++;
      fprintf(stderr, "flip trial %d: status %s, message '%s'\n", t, ina_status_string(s),
              ina_last_error());
    }
  }
  printf("byte flips: %d accepted, %d rejected, %d wrong\n", accepted, rejected, wrong);
  CHECK(wrong == 0);
  CHECK(rejected > TRIALS / 2); /* most corruptions of a header are caught */
  free(copy);
  free(bytes);
}

int main(void) {
  test_rng_t rng = {test_seed("test_safetensors_bad")};
  ina_log_set_quiet_errors(1);
  bench_t b = {io_make_temp_dir(), 0, {0}};
  test_header_rules(&b);
  test_length_field(&b);
  test_every_prefix(&b);
  test_random_flips(&b, &rng);
  io_remove_tree(b.dir);
  free((void *)b.dir);
  return test_finish("test_safetensors_bad");
}
