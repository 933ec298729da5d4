/* NumPy .npy files: a magic string, a version, a header length, a Python-literal dict
 * {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and a
 * '\n' so that the data starts on a 64-byte boundary, then the raw array. */
#define INA_LOG_SUBSYS "npy"
#include "core/npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/check.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c reads and writes little-endian arrays with plain memory copies"
#endif

static const char NPY_MAGIC[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
#define NPY_ALIGN 64
/* Real headers are a few dozen bytes; a larger length field means a corrupt file. */
#define NPY_MAX_HEADER 65536

static const char *descr_of(ina_dtype_t dtype) {
  switch (dtype) {
  case INA_DTYPE_F32: return "<f4";
  case INA_DTYPE_I32: return "<i4";
  case INA_DTYPE_I64: return "<i8";
  default: return NULL;
  }
}

/* ---- writing ------------------------------------------------------------------- */

ina_status_t ina_npy_write(const char *path, ina_dtype_t dtype, int ndim, const int64_t *shape,
                           const void *data) {
  ina_status_t st = INA_OK;
  FILE *f = NULL;
  char *tmp_path = NULL;
  int created = 0;
  INA_REQUIRE(path != NULL, INA_ERR_INVALID_ARGUMENT, "ina_npy_write: path is NULL");
  const char *descr = descr_of(dtype);
  INA_REQUIRE(descr != NULL, INA_ERR_UNSUPPORTED,
              "file %s: npy writing supports f32, i32 and i64, not dtype %d", path, (int)dtype);
  INA_REQUIRE(ndim >= 0 && ndim <= INA_MAX_DIMS && (shape != NULL || ndim == 0),
              INA_ERR_INVALID_ARGUMENT, "file %s: bad ndim %d or NULL shape", path, ndim);

  /* Room for the dict with INA_MAX_DIMS 20-digit dims, plus padding to 64. */
  char header[256 + NPY_ALIGN];
  int len =
      snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  size_t nbytes = 0;
  for (int i = 0; i < ndim; i++)
    INA_REQUIRE(shape[i] >= 0, INA_ERR_INVALID_ARGUMENT, "file %s: negative dimension %lld", path,
                (long long)shape[i]);
  INA_REQUIRE(ina_shape_nbytes(dtype, ndim, shape, &nbytes), INA_ERR_INVALID_ARGUMENT,
              "file %s: shape overflows 64 bits", path);
  for (int i = 0; i < ndim; i++) {
    /* A 1-tuple needs its trailing comma: (3,) */
    len += snprintf(header + len, sizeof header - (size_t)len, "%s%lld%s", i ? ", " : "",
                    (long long)shape[i], ndim == 1 ? "," : "");
  }
  INA_REQUIRE(data != NULL || nbytes == 0, INA_ERR_INVALID_ARGUMENT,
              "file %s: data is NULL for %llu bytes", path, (unsigned long long)nbytes);
  len += snprintf(header + len, sizeof header - (size_t)len, "), }");
  /* magic (6) + version (2) + length (2) + dict + spaces + '\n' = a multiple of 64. */
  int total = (10 + len + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
  int dict_len = total - 10;
  memset(header + len, ' ', (size_t)(dict_len - 1 - len));
  header[dict_len - 1] = '\n';

  unsigned char prefix[10];
  memcpy(prefix, NPY_MAGIC, 6);
  prefix[6] = 1; /* version 1.0 */
  prefix[7] = 0;
  prefix[8] = (unsigned char)(dict_len & 0xff);
  prefix[9] = (unsigned char)(dict_len >> 8);

  /* Written under a temporary name and renamed, so a failure leaves no partial array. */
  size_t plen = strlen(path);
  tmp_path = malloc(plen + 5);
  INA_CHECK_ALLOC(tmp_path);
  memcpy(tmp_path, path, plen);
  memcpy(tmp_path + plen, ".tmp", 5);
  f = fopen(tmp_path, "wb");
  INA_REQUIRE(f != NULL, INA_ERR_IO, "file %s: cannot create: %s", tmp_path, strerror(errno));
  created = 1;
  int ok = fwrite(prefix, 1, 10, f) == 10 &&
           fwrite(header, 1, (size_t)dict_len, f) == (size_t)dict_len &&
           (nbytes == 0 || fwrite(data, 1, (size_t)nbytes, f) == nbytes);
  int close_rc = fclose(f);
  f = NULL;
  INA_REQUIRE(ok && close_rc == 0, INA_ERR_IO, "file %s: write failed: %s", tmp_path,
              strerror(errno));
  INA_REQUIRE(rename(tmp_path, path) == 0, INA_ERR_IO, "file %s: cannot rename %s into place: %s",
              path, tmp_path, strerror(errno));
  free(tmp_path);
  return INA_OK;
fail:
  if (f) fclose(f);
  if (created) remove(tmp_path);
  free(tmp_path);
  return st;
}

/* ---- reading ------------------------------------------------------------------- */

/* A cursor over the header dict. */
typedef struct {
  const char *path;
  const char *p, *end;
} scan_t;

static void skip_space(scan_t *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int accept_char(scan_t *s, char c) {
  skip_space(s);
  if (s->p < s->end && *s->p == c) {
    s->p++;
    return 1;
  }
  return 0;
}

/* What the scanner stopped at, for messages. */
static const char *here(const scan_t *s, char *buf, size_t size) {
  size_t n = (size_t)(s->end - s->p);
  if (n == 0) return "end of header";
  if (n > size - 1) n = size - 1;
  memcpy(buf, s->p, n);
  buf[n] = '\0';
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)buf[i] < 32 || (unsigned char)buf[i] > 126) buf[i] = '?';
  return buf;
}

#define SCAN_FAIL(s, ...)                                                               \
  do {                                                                                  \
    char near_[24];                                                                     \
    char what_[160];                                                                    \
    snprintf(what_, sizeof what_, __VA_ARGS__);                                         \
    INA_REQUIRE(0, INA_ERR_FORMAT, "file %s: npy header: %s at '%s'", (s)->path, what_, \
                here((s), near_, sizeof near_));                                        \
  } while (0)

/* A quoted string without escapes ('...' or "..."), copied into out. A control byte
 * (NUL above all, which would end the copy early and make 'descr\0x' read as 'descr')
 * cannot be in a Python string literal, so it is malformed. */
static ina_status_t scan_string(scan_t *s, char *out, size_t size) {
  ina_status_t st = INA_OK;
  skip_space(s);
  if (s->p >= s->end || (*s->p != '\'' && *s->p != '"')) SCAN_FAIL(s, "expected a quoted string");
  char quote = *s->p;
  const char *start = ++s->p;
  while (s->p < s->end && *s->p != quote && *s->p != '\\' && (unsigned char)*s->p >= 0x20) s->p++;
  if (s->p < s->end && (unsigned char)*s->p < 0x20)
    SCAN_FAIL(s, "control byte 0x%02x in a string", (unsigned)(unsigned char)*s->p);
  if (s->p >= s->end || *s->p != quote) SCAN_FAIL(s, "unterminated or escaped string");
  size_t n = (size_t)(s->p - start);
  if (n >= size) SCAN_FAIL(s, "string of %zu bytes is too long", n);
  memcpy(out, start, n);
  out[n] = '\0';
  s->p++;
  return INA_OK;
fail:
  return st;
}

static ina_status_t scan_bool(scan_t *s, int *out) {
  ina_status_t st = INA_OK;
  skip_space(s);
  size_t left = (size_t)(s->end - s->p);
  if (left >= 4 && memcmp(s->p, "True", 4) == 0) {
    *out = 1;
    s->p += 4;
  } else if (left >= 5 && memcmp(s->p, "False", 5) == 0) {
    *out = 0;
    s->p += 5;
  } else {
    SCAN_FAIL(s, "expected True or False");
  }
  return INA_OK;
fail:
  return st;
}

static ina_status_t scan_dim(scan_t *s, int64_t *out) {
  ina_status_t st = INA_OK;
  skip_space(s);
  if (s->p < s->end && *s->p == '-') SCAN_FAIL(s, "negative dimension");
  if (s->p >= s->end || *s->p < '0' || *s->p > '9') SCAN_FAIL(s, "expected a dimension");
  int64_t v = 0;
  while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *s->p - '0', &v))
      SCAN_FAIL(s, "dimension overflows 64 bits");
    s->p++;
  }
  *out = v;
  return INA_OK;
fail:
  return st;
}

/* A Python tuple of non-negative integers: (), (3,), (2, 3) or (2, 3,). */
static ina_status_t scan_shape(scan_t *s, int *ndim, int64_t *shape) {
  ina_status_t st = INA_OK;
  int n = 0, trailing_comma = 0;
  if (!accept_char(s, '(')) SCAN_FAIL(s, "expected '(' opening the shape");
  while (!accept_char(s, ')')) {
    if (n == INA_MAX_DIMS) {
      INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "file %s: npy shape has more than %d dimensions", s->path,
                  INA_MAX_DIMS);
    }
    INA_CHECK(scan_dim(s, &shape[n++]));
    trailing_comma = accept_char(s, ',');
    skip_space(s);
    if (!trailing_comma && (s->p >= s->end || *s->p != ')'))
      SCAN_FAIL(s, "expected ',' or ')' in the shape");
  }
  /* (3) is the integer 3 in Python, not a tuple. */
  if (n == 1 && !trailing_comma) SCAN_FAIL(s, "a one-dimensional shape needs a trailing comma");
  *ndim = n;
  return INA_OK;
fail:
  return st;
}

typedef struct {
  ina_dtype_t dtype;
  int ndim;
  int64_t shape[INA_MAX_DIMS];
} npy_header_t;

static ina_status_t parse_header(const char *path, const char *text, size_t len, npy_header_t *h) {
  ina_status_t st = INA_OK;
  scan_t s = {path, text, text + len};
  int seen_descr = 0, seen_order = 0, seen_shape = 0, fortran = 0;
  char descr[32];
  if (!accept_char(&s, '{')) SCAN_FAIL(&s, "expected '{'");
  while (!accept_char(&s, '}')) {
    char key[32];
    INA_CHECK(scan_string(&s, key, sizeof key));
    if (!accept_char(&s, ':')) SCAN_FAIL(&s, "expected ':' after key '%s'", key);
    if (strcmp(key, "descr") == 0 && !seen_descr) {
      INA_CHECK(scan_string(&s, descr, sizeof descr));
      seen_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0 && !seen_order) {
      INA_CHECK(scan_bool(&s, &fortran));
      seen_order = 1;
    } else if (strcmp(key, "shape") == 0 && !seen_shape) {
      INA_CHECK(scan_shape(&s, &h->ndim, h->shape));
      seen_shape = 1;
    } else {
      SCAN_FAIL(&s, "unexpected or repeated key '%s'", key);
    }
    if (!accept_char(&s, ',')) {
      skip_space(&s);
      if (s.p >= s.end || *s.p != '}') SCAN_FAIL(&s, "expected ',' or '}'");
    }
  }
  skip_space(&s);
  if (s.p != s.end) SCAN_FAIL(&s, "trailing characters after the dict");
  INA_REQUIRE(seen_descr && seen_order && seen_shape, INA_ERR_FORMAT,
              "file %s: npy header lacks '%s'", path,
              !seen_descr   ? "descr"
              : !seen_order ? "fortran_order"
                            : "shape");
  if (strcmp(descr, "<f4") == 0)
    h->dtype = INA_DTYPE_F32;
  else if (strcmp(descr, "<i4") == 0)
    h->dtype = INA_DTYPE_I32;
  else if (strcmp(descr, "<i8") == 0)
    h->dtype = INA_DTYPE_I64;
  else
    INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "file %s: npy dtype '%s' is not one of <f4, <i4, <i8", path,
                descr);
  INA_REQUIRE(!fortran, INA_ERR_UNSUPPORTED, "file %s: Fortran-order npy arrays are not supported",
              path);
  return INA_OK;
fail:
  return st;
}

static uint32_t load_le(const unsigned char *p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* The longest prefix + header an npy file may have: what decode_header needs in hand. */
#define NPY_MAX_PREFIX (12 + NPY_MAX_HEADER)

/* Decodes the prefix and header of the npy file `path` of file_size bytes, of which the
 * first `avail` are at `bytes` (at least min(file_size, NPY_MAX_PREFIX) of them), and
 * checks that the data section holds exactly the array: *data_offset is where it
 * starts, *nbytes its size. */
static ina_status_t decode_header(const char *path, const unsigned char *bytes, size_t avail,
                                  uint64_t file_size, npy_header_t *h, uint64_t *data_offset,
                                  size_t *nbytes) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(file_size >= 10 && avail >= 10, INA_ERR_FORMAT,
              "file %s: %llu bytes, too short for an npy header", path,
              (unsigned long long)file_size);
  INA_REQUIRE(memcmp(bytes, NPY_MAGIC, 6) == 0, INA_ERR_FORMAT,
              "file %s: not an npy file (bad magic)", path);
  int major = bytes[6], minor = bytes[7];
  INA_REQUIRE((major == 1 || major == 2) && minor == 0, INA_ERR_UNSUPPORTED,
              "file %s: npy format version %d.%d is not supported (1.0 and 2.0 are)", path, major,
              minor);
  /* Version 1.0 stores the header length in 2 bytes, 2.0 in 4. */
  uint64_t prefix_len = major == 1 ? 10 : 12;
  INA_REQUIRE(file_size >= prefix_len && avail >= prefix_len, INA_ERR_FORMAT,
              "file %s: too short for an npy 2.0 header", path);
  uint64_t header_len = load_le(bytes + 8, major == 1 ? 2 : 4);
  INA_REQUIRE(
      header_len > 0 && header_len <= NPY_MAX_HEADER && header_len <= file_size - prefix_len,
      INA_ERR_FORMAT, "file %s: npy header length %llu does not fit the %llu-byte file", path,
      (unsigned long long)header_len, (unsigned long long)file_size);
  INA_REQUIRE(prefix_len + header_len <= avail, INA_ERR_IO,
              "file %s: short read of the npy header", path);
  INA_CHECK(parse_header(path, (const char *)bytes + prefix_len, (size_t)header_len, h));

  INA_REQUIRE(ina_shape_nbytes(h->dtype, h->ndim, h->shape, nbytes), INA_ERR_FORMAT,
              "file %s: npy shape overflows 64 bits", path);
  uint64_t data_size = file_size - prefix_len - header_len;
  INA_REQUIRE(data_size == *nbytes, INA_ERR_FORMAT,
              "file %s: npy shape needs %llu data bytes, the file has %llu", path,
              (unsigned long long)*nbytes, (unsigned long long)data_size);
  *data_offset = prefix_len + header_len;
  return INA_OK;
fail:
  return st;
}

ina_status_t ina_npy_read(const char *path, ina_tensor_t *out) {
  ina_status_t st = INA_OK;
  FILE *f = NULL;
  unsigned char *prefix = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_npy_read: out is NULL");
  memset(out, 0, sizeof *out);
  INA_REQUIRE(path != NULL, INA_ERR_INVALID_ARGUMENT, "ina_npy_read: path is NULL");
  f = fopen(path, "rb");
  INA_REQUIRE(f != NULL, INA_ERR_IO, "file %s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  INA_REQUIRE(fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode), INA_ERR_IO,
              "file %s: not a readable regular file", path);
  uint64_t file_size = (uint64_t)sb.st_size;

  /* Whatever the header's length, it lies in the first NPY_MAX_PREFIX bytes. */
  size_t want = file_size < NPY_MAX_PREFIX ? (size_t)file_size : NPY_MAX_PREFIX;
  prefix = malloc(want + 1);
  INA_CHECK_ALLOC(prefix);
  size_t avail = fread(prefix, 1, want, f);
  npy_header_t h = {0};
  uint64_t data_offset = 0;
  size_t nbytes = 0;
  INA_CHECK(decode_header(path, prefix, avail, file_size, &h, &data_offset, &nbytes));

  INA_CHECK(ina_tensor_alloc(out, h.dtype, h.ndim, h.shape, INA_CPU));
  INA_REQUIRE(nbytes == 0 || fseeko(f, (off_t)data_offset, SEEK_SET) == 0, INA_ERR_IO,
              "file %s: cannot seek to the npy data at byte %llu: %s", path,
              (unsigned long long)data_offset, strerror(errno));
  INA_REQUIRE(nbytes == 0 || fread(out->data, 1, (size_t)nbytes, f) == nbytes, INA_ERR_IO,
              "file %s: short read of %llu data bytes", path, (unsigned long long)nbytes);
  free(prefix);
  fclose(f);
  return INA_OK;
fail:
  if (out) ina_tensor_release(out);
  free(prefix);
  if (f) fclose(f);
  return st;
}

ina_status_t ina_npy_read_memory(const void *bytes, size_t size, const char *name,
                                 ina_tensor_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_npy_read_memory: out is NULL");
  memset(out, 0, sizeof *out);
  INA_REQUIRE(bytes != NULL || size == 0, INA_ERR_INVALID_ARGUMENT,
              "ina_npy_read_memory: bytes is NULL for %zu bytes", size);
  if (!name) name = "(memory)";
  npy_header_t h = {0};
  uint64_t data_offset = 0;
  size_t nbytes = 0;
  INA_CHECK(decode_header(name, bytes, size, (uint64_t)size, &h, &data_offset, &nbytes));
  INA_CHECK(ina_tensor_alloc(out, h.dtype, h.ndim, h.shape, INA_CPU));
  if (nbytes) memcpy(out->data, (const unsigned char *)bytes + data_offset, nbytes);
  return INA_OK;
fail:
  if (out) ina_tensor_release(out);
  return st;
}
