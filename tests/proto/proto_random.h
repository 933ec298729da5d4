/* Descriptor-driven helpers for the protobuf-c tests: fill any message with random
 * contents, compare two messages field by field, pack into a fresh buffer. They walk
 * ProtobufCMessageDescriptor, so a field added to a .proto file is covered without
 * touching the tests.
 *
 * Messages built here are malloc'd throughout, so protobuf_c_message_free_unpacked(m,
 * NULL) frees them like unpacked ones. */
#ifndef INA_TESTS_PROTO_RANDOM_H
#define INA_TESTS_PROTO_RANDOM_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>

#include "tests/test_util.h"

/* Where a field's value (or, for repeated fields, its array pointer) and count live. */
#define PR_MEMBER(type, msg, off) (*(type *)((char *)(msg) + (off)))

static size_t pr_scalar_size(ProtobufCType t) {
  switch (t) {
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
      return 8;
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
    default: return 4; /* 32-bit integers, float, enum */
  }
}

static ProtobufCMessage *pr_random_message(const ProtobufCMessageDescriptor *d, test_rng_t *r,
                                           int depth);

/* Writes one random value of field f at p (an element of an array or the member). */
static void pr_random_value(const ProtobufCFieldDescriptor *f, void *p, test_rng_t *r, int depth) {
  uint64_t bits = test_rng_next(r);
  /* Small values half of the time: they take the short varint encodings. */
  if (test_rng_next(r) & 1) bits &= 0xff;
  switch (f->type) {
    case PROTOBUF_C_TYPE_FLOAT: {
      float x;
      do { uint32_t b = (uint32_t)test_rng_next(r); memcpy(&x, &b, 4); } while (!isfinite(x));
      *(float *)p = x;
      break;
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
      double x;
      do { uint64_t b = test_rng_next(r); memcpy(&x, &b, 8); } while (!isfinite(x));
      *(double *)p = x;
      break;
    }
    case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)p = (protobuf_c_boolean)(bits & 1); break;
    case PROTOBUF_C_TYPE_ENUM: {
      const ProtobufCEnumDescriptor *e = f->descriptor;
      *(int32_t *)p = e->values[test_rng_next(r) % e->n_values].value;
      break;
    }
    case PROTOBUF_C_TYPE_STRING: {
      size_t n = (size_t)test_rng_int(r, 0, 24);
      char *s = malloc(n + 1);
      for (size_t i = 0; i < n; i++) s[i] = (char)test_rng_int(r, 0x20, 0x7e);
      s[n] = '\0';
      *(char **)p = s;
      break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
      ProtobufCBinaryData *b = p;
      b->len = (size_t)test_rng_int(r, 0, 24);
      b->data = malloc(b->len ? b->len : 1);
      for (size_t i = 0; i < b->len; i++) b->data[i] = (uint8_t)test_rng_next(r);
      break;
    }
    case PROTOBUF_C_TYPE_MESSAGE:
      *(ProtobufCMessage **)p = pr_random_message(f->descriptor, r, depth + 1);
      break;
    default: memcpy(p, &bits, pr_scalar_size(f->type)); break; /* little-endian host */
  }
}

static ProtobufCMessage *pr_random_message(const ProtobufCMessageDescriptor *d, test_rng_t *r,
                                           int depth) {
  ProtobufCMessage *m = malloc(d->sizeof_message);
  d->message_init(m);
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (test_rng_int(r, 0, 3) == 0) continue; /* leave a quarter of the fields unset */
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = depth > 3 ? 0 : (size_t)test_rng_int(r, 0, 6);
      size_t es = pr_scalar_size(f->type);
      char *arr = n ? calloc(n, es) : NULL;
      for (size_t k = 0; k < n; k++) pr_random_value(f, arr + k * es, r, depth);
      PR_MEMBER(size_t, m, f->quantifier_offset) = n;
      PR_MEMBER(void *, m, f->offset) = arr;
    } else {
      if (f->type == PROTOBUF_C_TYPE_MESSAGE && depth > 3) continue;
      pr_random_value(f, (char *)m + f->offset, r, depth);
      if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset && f->type != PROTOBUF_C_TYPE_MESSAGE &&
          f->type != PROTOBUF_C_TYPE_STRING)
        PR_MEMBER(protobuf_c_boolean, m, f->quantifier_offset) = 1;
    }
  }
  return m;
}

static bool pr_messages_equal(const ProtobufCMessage *a, const ProtobufCMessage *b);

static bool pr_values_equal(const ProtobufCFieldDescriptor *f, const void *a, const void *b) {
  switch (f->type) {
    /* Hostile input can carry NaN, which must survive a round trip as NaN. */
    case PROTOBUF_C_TYPE_FLOAT: {
      float x = *(const float *)a, y = *(const float *)b;
      return x == y || (isnan(x) && isnan(y));
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
      double x = *(const double *)a, y = *(const double *)b;
      return x == y || (isnan(x) && isnan(y));
    }
    case PROTOBUF_C_TYPE_BOOL: return !*(const protobuf_c_boolean *)a == !*(const protobuf_c_boolean *)b;
    case PROTOBUF_C_TYPE_STRING: {
      const char *x = *(char *const *)a, *y = *(char *const *)b;
      return strcmp(x ? x : "", y ? y : "") == 0;
    }
    case PROTOBUF_C_TYPE_BYTES: {
      const ProtobufCBinaryData *x = a, *y = b;
      return x->len == y->len && (x->len == 0 || memcmp(x->data, y->data, x->len) == 0);
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
      const ProtobufCMessage *x = *(ProtobufCMessage *const *)a, *y = *(ProtobufCMessage *const *)b;
      if (!x || !y) return x == y;
      return pr_messages_equal(x, y);
    }
    default: return memcmp(a, b, pr_scalar_size(f->type)) == 0;
  }
}

/* Set to silence pr_messages_equal where a difference is the expected outcome. */
static bool pr_quiet;

/* Field-by-field equality (unknown fields ignored); prints the first differing field. */
static bool pr_messages_equal(const ProtobufCMessage *a, const ProtobufCMessage *b) {
  const ProtobufCMessageDescriptor *d = a->descriptor;
  if (b->descriptor != d) return false;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    bool same = true;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t na = PR_MEMBER(size_t, a, f->quantifier_offset), nb = PR_MEMBER(size_t, b, f->quantifier_offset);
      const char *xa = PR_MEMBER(void *, a, f->offset), *xb = PR_MEMBER(void *, b, f->offset);
      size_t es = pr_scalar_size(f->type);
      same = na == nb;
      for (size_t k = 0; same && k < na; k++) same = pr_values_equal(f, xa + k * es, xb + k * es);
    } else {
      same = pr_values_equal(f, (const char *)a + f->offset, (const char *)b + f->offset);
    }
    if (!same) {
      if (!pr_quiet) fprintf(stderr, "%s.%s differs\n", d->name, f->name);
      return false;
    }
  }
  return true;
}

/* Packs m into a fresh malloc'd buffer; *len gets its size. */
static uint8_t *pr_pack(const ProtobufCMessage *m, size_t *len) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  *len = protobuf_c_message_pack(m, buf);
  CHECKF(*len == n, "%s: packed %zu bytes, get_packed_size said %zu", m->descriptor->name, *len, n);
  return buf;
}

#endif
