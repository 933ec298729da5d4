/* .npy round trips of random arrays (f32, i32, i64; rank 0 to 5, zero-size), headers
 * as NumPy writes them, malformed files, and the same read from memory. */
#include "core/npy.h"
#include "tests/io/io_test_util.h"

/* Writes, checks the header bytes, reads back and compares. */
static void round_trip(const char *path, ina_dtype_t dtype, int ndim, const int64_t *shape,
                       test_rng_t *rng) {
  size_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= (size_t)shape[d];
  size_t nbytes = numel * ina_dtype_size(dtype);
  unsigned char *data = malloc(nbytes + 1);
  if (dtype == INA_DTYPE_F32) {
    for (size_t i = 0; i < numel; i++) ((float *)data)[i] = test_rng_normal(rng);
  } else {
    for (size_t i = 0; i < nbytes; i++) data[i] = (unsigned char)test_rng_next(rng);
  }
  CHECK_OK(ina_npy_write(path, dtype, ndim, shape, nbytes ? data : NULL));

  size_t size = 0;
  unsigned char *file = io_read_file(path, &size);
  CHECK(file != NULL && size >= 10);
  if (file && size >= 10) {
    size_t hlen = (size_t)file[8] | (size_t)file[9] << 8;
    CHECK(memcmp(file, "\x93NUMPY\x01\x00", 8) == 0);
    CHECK((10 + hlen) % 64 == 0 && size == 10 + hlen + nbytes);
    CHECK(file[10 + hlen - 1] == '\n');
    char expect[128];
    int len = snprintf(expect, sizeof expect, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                       dtype == INA_DTYPE_F32   ? "<f4"
                       : dtype == INA_DTYPE_I32 ? "<i4"
                                                : "<i8");
    for (int d = 0; d < ndim; d++)
      len += snprintf(expect + len, sizeof expect - (size_t)len, "%s%lld%s", d ? ", " : "",
                      (long long)shape[d], ndim == 1 ? "," : "");
    snprintf(expect + len, sizeof expect - (size_t)len, "), }");
    CHECKF(strncmp((const char *)file + 10, expect, strlen(expect)) == 0, "header %.*s, wanted %s",
           (int)hlen, file + 10, expect);
  }
  free(file);

  ina_tensor_t t;
  CHECK_OK(ina_npy_read(path, &t));
  CHECK(t.dtype == dtype && t.ndim == ndim && t.owns_data == 1 && t.device.type == INA_DEVICE_CPU);
  for (int d = 0; d < ndim && d < t.ndim; d++) CHECK(t.shape[d] == shape[d]);
  CHECK(ina_tensor_is_contiguous(&t));
  CHECK(nbytes == 0 || (t.data && memcmp(t.data, data, nbytes) == 0));
  ina_tensor_release(&t);
  free(data);
}

static void test_round_trips(const char *dir, test_rng_t *rng) {
  char path[512];
  io_join(path, sizeof path, dir, "a.npy");
  static const ina_dtype_t dtypes[] = {INA_DTYPE_F32, INA_DTYPE_I32, INA_DTYPE_I64};
  for (int k = 0; k < 3; k++) {
    for (int ndim = 0; ndim <= INA_MAX_DIMS; ndim++) {
      for (int rep = 0; rep < 3; rep++) {
        int64_t shape[INA_MAX_DIMS];
        for (int d = 0; d < ndim; d++) shape[d] = test_rng_int(rng, 1, ndim > 3 ? 5 : 40);
        if (rep == 2 && ndim > 0) shape[test_rng_int(rng, 0, ndim - 1)] = 0; /* zero-size */
        round_trip(path, dtypes[k], ndim, shape, rng);
      }
    }
  }
  /* A logits-sized row, and a dim that needs many digits. */
  int64_t logits[2] = {3, 129280};
  round_trip(path, INA_DTYPE_F32, 2, logits, rng);
  int64_t wide[3] = {0, 1234567890123, 7};
  round_trip(path, INA_DTYPE_I64, 3, wide, rng);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  CHECK(!io_file_exists(tmp));
}

/* Writes a file from a version, a header dict and n data bytes (the length field is
 * computed unless forced). */
static void write_npy(const char *path, int major, int minor, const char *dict, size_t data_bytes,
                      long forced_hlen) {
  size_t dlen = strlen(dict), prefix = major >= 2 ? 12 : 10;
  size_t n = prefix + dlen + data_bytes;
  unsigned char *buf = calloc(1, n + 1);
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)major;
  buf[7] = (unsigned char)minor;
  uint32_t hlen = forced_hlen >= 0 ? (uint32_t)forced_hlen : (uint32_t)dlen;
  for (size_t i = 0; i < prefix - 8; i++) buf[8 + i] = (unsigned char)(hlen >> (8 * i));
  memcpy(buf + prefix, dict, dlen);
  for (size_t i = 0; i < data_bytes; i++) buf[prefix + dlen + i] = (unsigned char)(i + 1);
  CHECK(io_write_file(path, buf, n));
  free(buf);
}

/* Headers NumPy (or an older NumPy, or a hand) can produce, all readable. */
static void test_accepted_headers(const char *dir) {
  static const struct {
    const char *dict;
    int major;
    int ndim;
    int64_t shape[2];
    ina_dtype_t dtype;
  } cases[] = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n",
       1,
       2,
       {2, 3},
       INA_DTYPE_F32},
      {"{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3,), }      \n",
       1,
       2,
       {2, 3},
       INA_DTYPE_I64},
      {"{\"shape\": (5,), \"descr\": \"<i4\", \"fortran_order\": False}\n",
       2,
       1,
       {5, 0},
       INA_DTYPE_I32},
      {"{'descr':'<f4','fortran_order':False,'shape':()}", 1, 0, {0, 0}, INA_DTYPE_F32},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }\n",
       1,
       2,
       {0, 4},
       INA_DTYPE_F32},
  };
  char path[512];
  io_join(path, sizeof path, dir, "accepted.npy");
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    size_t numel = 1;
    for (int d = 0; d < cases[k].ndim; d++) numel *= (size_t)cases[k].shape[d];
    write_npy(path, cases[k].major, 0, cases[k].dict, numel * ina_dtype_size(cases[k].dtype), -1);
    ina_tensor_t t;
    ina_status_t s = ina_npy_read(path, &t);
    CHECKF(s == INA_OK, "header %s: %s", cases[k].dict, ina_last_error());
    CHECK(t.dtype == cases[k].dtype && t.ndim == cases[k].ndim);
    for (int d = 0; d < cases[k].ndim; d++) CHECK(t.shape[d] == cases[k].shape[d]);
    if (s == INA_OK && numel) CHECK(((unsigned char *)t.data)[0] == 1); /* first data byte */
    ina_tensor_release(&t);
  }
}

static void test_malformed(const char *dir) {
  static const char *GOOD = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
  static const struct {
    const char *what;
    int major, minor;
    const char *dict;
    size_t data_bytes;
    long forced_hlen;
    ina_status_t want;
  } cases[] = {
      {"version 3.0", 3, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 8, -1,
       INA_ERR_UNSUPPORTED},
      {"version 1.1", 1, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 8, -1,
       INA_ERR_UNSUPPORTED},
      {"header length 0", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 8, 0,
       INA_ERR_FORMAT},
      {"header past the end", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n",
       8, 60000, INA_ERR_FORMAT},
      {"huge v2 header", 2, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 8,
       0x7fffffff, INA_ERR_FORMAT},
      {"data too short", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 7, -1,
       INA_ERR_FORMAT},
      {"data too long", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 9, -1,
       INA_ERR_FORMAT},
      {"f8", 1, 0, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }\n", 16, -1,
       INA_ERR_UNSUPPORTED},
      {"big endian", 1, 0, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }\n", 8, -1,
       INA_ERR_UNSUPPORTED},
      {"structured", 1, 0, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }\n",
       8, -1, INA_ERR_FORMAT},
      {"fortran", 1, 0, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }\n", 16, -1,
       INA_ERR_UNSUPPORTED},
      {"order not a bool", 1, 0, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }\n", 8, -1,
       INA_ERR_FORMAT},
      {"negative dim", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }\n", 8, -1,
       INA_ERR_FORMAT},
      {"int not tuple", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2), }\n", 8, -1,
       INA_ERR_FORMAT},
      {"list shape", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': [2], }\n", 8, -1,
       INA_ERR_FORMAT},
      {"six dims", 1, 0,
       "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 2), }\n", 8, -1,
       INA_ERR_UNSUPPORTED},
      {"dim overflow", 1, 0,
       "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", 8, -1,
       INA_ERR_FORMAT},
      {"numel overflow", 1, 0,
       "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n", 8, -1,
       INA_ERR_FORMAT},
      {"missing shape", 1, 0, "{'descr': '<f4', 'fortran_order': False, }\n", 8, -1,
       INA_ERR_FORMAT},
      {"missing descr", 1, 0, "{'fortran_order': False, 'shape': (2,), }\n", 8, -1, INA_ERR_FORMAT},
      {"extra key", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}\n", 8,
       -1, INA_ERR_FORMAT},
      {"repeated key", 1, 0,
       "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}\n", 8, -1,
       INA_ERR_FORMAT},
      {"unterminated string", 1, 0, "{'descr: '<f4', 'fortran_order': False, 'shape': (2,), }\n", 8,
       -1, INA_ERR_FORMAT},
      {"escaped string", 1, 0, "{'de\\scr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 8,
       -1, INA_ERR_FORMAT},
      {"no braces", 1, 0, "'descr': '<f4', 'fortran_order': False, 'shape': (2,)\n", 8, -1,
       INA_ERR_FORMAT},
      {"unclosed dict", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), \n", 8, -1,
       INA_ERR_FORMAT},
      {"unclosed tuple", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, }\n", 8, -1,
       INA_ERR_FORMAT},
      {"missing comma", 1, 0, "{'descr': '<f4' 'fortran_order': False, 'shape': (2,), }\n", 8, -1,
       INA_ERR_FORMAT},
      {"trailing text", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } x\n", 8,
       -1, INA_ERR_FORMAT},
      {"empty header", 1, 0, "          \n", 8, -1, INA_ERR_FORMAT},
  };
  char path[512];
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char name[32];
    snprintf(name, sizeof name, "bad%02zu.npy", k);
    io_join(path, sizeof path, dir, name);
    write_npy(path, cases[k].major, cases[k].minor, cases[k].dict, cases[k].data_bytes,
              cases[k].forced_hlen);
    ina_tensor_t t;
    int failed_before = test_checks_failed_;
    ina_clear_error();
    CHECK_FAILS_WITH(ina_npy_read(path, &t), cases[k].want, path, NULL);
    CHECK(ina_tensor_is_empty(&t));
    if (test_checks_failed_ > failed_before) fprintf(stderr, "  in case: %s\n", cases[k].what);
  }

  /* Every proper prefix of a valid file, and a wrong magic. */
  io_join(path, sizeof path, dir, "good.npy");
  write_npy(path, 1, 0, GOOD, 8, -1);
  size_t n = 0;
  unsigned char *bytes = io_read_file(path, &n);
  CHECK(bytes != NULL);
  int wrong = 0;
  for (size_t len = 0; bytes && len < n; len++) {
    CHECK(io_write_file(path, bytes, len));
    ina_tensor_t t;
    ina_clear_error();
    ina_status_t s = ina_npy_read(path, &t);
    wrong += s != INA_ERR_FORMAT || !strstr(ina_last_error(), path) || !ina_tensor_is_empty(&t);
  }
  CHECKF(wrong == 0, "%d prefixes not rejected as FORMAT naming the file", wrong);
  if (bytes) {
    bytes[3] = 'X';
    CHECK(io_write_file(path, bytes, n));
    ina_tensor_t t;
    CHECK_FAILS_WITH(ina_npy_read(path, &t), INA_ERR_FORMAT, path, "magic");
  }
  free(bytes);

  ina_tensor_t t;
  io_join(path, sizeof path, dir, "absent.npy");
  CHECK_FAILS_WITH(ina_npy_read(path, &t), INA_ERR_IO, path, NULL);
  CHECK_FAILS_WITH(ina_npy_read(dir, &t), INA_ERR_IO, dir, NULL);
}

/* Random bytes of a valid header changed: never a crash; failures name the file. */
static void test_random_flips(const char *dir, test_rng_t *rng) {
  char path[512];
  io_join(path, sizeof path, dir, "flip.npy");
  int64_t shape[2] = {3, 5};
  float data[15];
  for (int i = 0; i < 15; i++) data[i] = (float)i;
  CHECK_OK(ina_npy_write(path, INA_DTYPE_F32, 2, shape, data));
  size_t n = 0;
  unsigned char *bytes = io_read_file(path, &n);
  unsigned char *copy = malloc(n);
  int accepted = 0, wrong = 0;
  for (int trial = 0; bytes && trial < 2000; trial++) {
    memcpy(copy, bytes, n);
    int flips = (int)test_rng_int(rng, 1, 3);
    for (int f = 0; f < flips; f++)
      copy[test_rng_int(rng, 0, 127)] ^= (unsigned char)test_rng_int(rng, 1, 255);
    /* A new file each time: truncating the old one in place is slow on some filesystems. */
    remove(path);
    CHECK(io_write_file(path, copy, n));
    ina_tensor_t t;
    ina_clear_error();
    ina_status_t s = ina_npy_read(path, &t);
    if (s == INA_OK) {
      accepted++;
      ina_tensor_release(&t);
    } else {
      wrong += (s != INA_ERR_FORMAT && s != INA_ERR_UNSUPPORTED) || !strstr(ina_last_error(), path);
    }
  }
  printf("npy byte flips: %d accepted, %d wrong\n", accepted, wrong);
  CHECK(wrong == 0);
  free(copy);
  free(bytes);
}

static void test_write_errors(const char *dir) {
  char path[512];
  int64_t shape[1] = {4};
  float data[4] = {1, 2, 3, 4};
  io_join(path, sizeof path, dir, "w.npy");
  CHECK_FAILS_WITH(ina_npy_write(path, INA_DTYPE_BF16, 1, shape, data), INA_ERR_UNSUPPORTED, path,
                   NULL);
  CHECK_FAILS_WITH(ina_npy_write(path, INA_DTYPE_F32, 6, shape, data), INA_ERR_INVALID_ARGUMENT,
                   path, NULL);
  CHECK_FAILS_WITH(ina_npy_write(path, INA_DTYPE_F32, 1, shape, NULL), INA_ERR_INVALID_ARGUMENT,
                   path, NULL);
  int64_t negative[1] = {-4};
  CHECK_FAILS_WITH(ina_npy_write(path, INA_DTYPE_F32, 1, negative, data), INA_ERR_INVALID_ARGUMENT,
                   path, NULL);
  CHECK(!io_file_exists(path));
  io_join(path, sizeof path, dir, "no/such/dir/w.npy");
  CHECK_FAILS_WITH(ina_npy_write(path, INA_DTYPE_F32, 1, shape, data), INA_ERR_IO, path, NULL);
}

/* ina_npy_read_memory reads what ina_npy_read reads, and refuses what it refuses, naming
 * the label it is given. */
static void test_memory(const char *dir) {
  static const char *GOOD = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }\n";
  char path[512];
  io_join(path, sizeof path, dir, "memory.npy");
  write_npy(path, 1, 0, GOOD, 16, -1);
  size_t n = 0;
  unsigned char *bytes = io_read_file(path, &n);
  CHECK(bytes != NULL);
  if (!bytes) return;
  ina_tensor_t a, b;
  CHECK_OK(ina_npy_read(path, &a));
  CHECK_OK(ina_npy_read_memory(bytes, n, "logits", &b));
  CHECK(a.dtype == b.dtype && a.ndim == 2 && b.ndim == 2 && b.shape[0] == 2 && b.shape[1] == 2);
  CHECK(b.owns_data && b.data != (void *)bytes && memcmp(a.data, b.data, 16) == 0);
  ina_tensor_release(&a);
  ina_tensor_release(&b);
  int wrong = 0;
  for (size_t len = 0; len < n; len++) {
    ina_clear_error();
    ina_status_t s = ina_npy_read_memory(bytes, len, "logits", &b);
    wrong += s != INA_ERR_FORMAT || !strstr(ina_last_error(), "logits") || !ina_tensor_is_empty(&b);
  }
  CHECKF(wrong == 0, "%d prefixes not rejected as FORMAT naming the label", wrong);
  CHECK_FAILS_WITH(ina_npy_read_memory(NULL, 0, NULL, &b), INA_ERR_FORMAT, "(memory)", NULL);
  free(bytes);
}

/* A NUL or other control byte inside a header string is malformed: it used to end the
 * copied key or dtype early, so that 'descr\0xyz' was taken for 'descr'. */
static void test_control_bytes(const char *dir) {
#define DICT(text) {text, sizeof text - 1}
  static const struct {
    const char *text;
    size_t len;
  } dicts[] = {
      DICT("{'descr\0xyz': '<f4', 'fortran_order': False, 'shape': (2,), }\n"),
      DICT("{'descr': '<f4\0', 'fortran_order': False, 'shape': (2,), }\n"),
      DICT("{'descr': '<f4', 'fortran_order': False, 'sha\x01pe': (2,), }\n"),
  };
#undef DICT
  char path[512];
  io_join(path, sizeof path, dir, "control.npy");
  for (size_t k = 0; k < sizeof dicts / sizeof dicts[0]; k++) {
    unsigned char buf[10 + 64 + 8];
    size_t dlen = dicts[k].len;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)dlen;
    buf[9] = 0;
    memcpy(buf + 10, dicts[k].text, dlen);
    memset(buf + 10 + dlen, 0, 8);
    CHECK(io_write_file(path, buf, 10 + dlen + 8));
    ina_tensor_t t;
    ina_clear_error();
    CHECK_FAILS_WITH(ina_npy_read(path, &t), INA_ERR_FORMAT, path, "control byte");
    CHECK(ina_tensor_is_empty(&t));
    ina_clear_error();
    CHECK_FAILS_WITH(ina_npy_read_memory(buf, 10 + dlen + 8, "ctl", &t), INA_ERR_FORMAT, "ctl",
                     "control byte");
  }
}

int main(void) {
  test_rng_t rng = {test_seed("test_npy")};
  ina_log_set_quiet_errors(1);
  char *dir = io_make_temp_dir();
  test_round_trips(dir, &rng);
  test_accepted_headers(dir);
  test_malformed(dir);
  test_random_flips(dir, &rng);
  test_write_errors(dir);
  test_memory(dir);
  test_control_bytes(dir);
  io_remove_tree(dir);
  free(dir);
  return test_finish("test_npy");
}
