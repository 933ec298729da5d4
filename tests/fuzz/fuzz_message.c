/* Decoded-message checks shared by the fuzz targets: see fuzz_message.h. */
#include "tests/fuzz/fuzz_message.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_check.h"

/* libFuzzer only sees coverage of instrumented code, and protobuf-c's decoder is a system
 * library. These counters stand in for it: libFuzzer clears the section
 * "__libfuzzer_extra_counters" before each run and reads every byte of it as coverage
 * afterwards, so an input that decodes to a new shape (a field set for the first time, a
 * repeated field with more entries, a string with unusual bytes, an unknown field of
 * another wire type) is kept in the corpus like one that reached new code. */
#define SHAPE_COUNTERS 4096
__attribute__((section("__libfuzzer_extra_counters"), used)) static uint8_t
    shape_counters[SHAPE_COUNTERS];

/* Bumps the counter of (where, kind, bucket); `where` is a field or message descriptor. */
static void note_shape(const void *where, uint32_t kind, uint32_t bucket) {
  uint64_t h = (uint64_t)(uintptr_t)where * 0x9E3779B97F4A7C15ull;
  h ^= (((uint64_t)kind << 32) | bucket) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  uint8_t *c = &shape_counters[h % SHAPE_COUNTERS];
  if (*c < 255) (*c)++;
}

/* Bit length: 0 for 0, 1..64 otherwise. Buckets integers and lengths by magnitude. */
static uint32_t magnitude(uint64_t v) { return v ? 64u - (uint32_t)__builtin_clzll(v) : 0u; }

/* NaN, infinities, zeros, subnormals and normals below / above 1, each with its sign. */
static uint32_t float_class(double x) {
  return (uint32_t)fpclassify(x) * 4u + (signbit(x) ? 2u : 0u) + (fabs(x) >= 1.0 ? 1u : 0u);
}

static size_t element_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
  case PROTOBUF_C_TYPE_DOUBLE: return 8;
  case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
  case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
  case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
  default: return 4; /* 32-bit integers, float, enum */
  }
}

/* Each walk returns how many unknown fields numbered 0 it met (see
 * exempt_from_round_trip). */
static size_t walk_message(const ProtobufCMessage *m, unsigned depth);

/* One value of field f at p (the member, or one entry of a repeated field). */
static size_t walk_value(const ProtobufCMessageDescriptor *d, const ProtobufCFieldDescriptor *f,
                         const void *p, bool repeated, unsigned depth) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32: {
    int32_t v = *(const int32_t *)p;
    note_shape(f, 1, magnitude(v < 0 ? (uint64_t)-(int64_t)v : (uint64_t)v) * 2u + (v < 0));
    break;
  }
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: note_shape(f, 1, magnitude(*(const uint32_t *)p)); break;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64: note_shape(f, 1, magnitude(*(const uint64_t *)p)); break;
  case PROTOBUF_C_TYPE_FLOAT: note_shape(f, 1, float_class(*(const float *)p)); break;
  case PROTOBUF_C_TYPE_DOUBLE: note_shape(f, 1, float_class(*(const double *)p)); break;
  case PROTOBUF_C_TYPE_BOOL: {
    protobuf_c_boolean b = *(const protobuf_c_boolean *)p;
    FUZZ_REQUIRE(b == 0 || b == 1, "%s.%s: bool decoded as %d", d->name, f->name, (int)b);
    note_shape(f, 1, (uint32_t)b);
    break;
  }
  case PROTOBUF_C_TYPE_ENUM: {
    int32_t v = *(const int32_t *)p;
    /* proto3 enums are open: an unknown value is kept, and handlers must cope with it. */
    bool known = protobuf_c_enum_descriptor_get_value(f->descriptor, v) != NULL;
    note_shape(f, 1, known ? (uint32_t)v % 64u : 64u);
    break;
  }
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)p;
    /* Only a proto2 `optional` string may be absent; proto3 ones default to "". */
    if (!repeated && f->label == PROTOBUF_C_LABEL_OPTIONAL && s == NULL) break;
    FUZZ_REQUIRE(s != NULL, "%s.%s: NULL string", d->name, f->name);
    size_t n = strlen(s); /* AddressSanitizer reports a missing NUL */
    bool unusual = false;
    for (size_t i = 0; i < n; i++) unusual |= (unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e;
    note_shape(f, 1, magnitude(n) * 2u + unusual);
    break;
  }
  case PROTOBUF_C_TYPE_BYTES: {
    const ProtobufCBinaryData *b = p;
    FUZZ_REQUIRE(b->len == 0 || b->data != NULL, "%s.%s: %zu bytes without data", d->name,
                 f->name, b->len);
    if (b->len) (void)*(volatile const uint8_t *)&b->data[b->len - 1]; /* in bounds */
    note_shape(f, 1, magnitude(b->len));
    break;
  }
  case PROTOBUF_C_TYPE_MESSAGE: {
    const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
    FUZZ_REQUIRE(sub != NULL || !repeated, "%s.%s: NULL entry in a repeated message field",
                 d->name, f->name);
    note_shape(f, 1, sub != NULL);
    if (sub) {
      FUZZ_REQUIRE(sub->descriptor == f->descriptor, "%s.%s: submessage of another type",
                   d->name, f->name);
      return walk_message(sub, depth + 1);
    }
    break;
  }
  }
  return 0;
}

static size_t walk_message(const ProtobufCMessage *m, unsigned depth) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  size_t zero_numbered = 0;
  /* None of the ina.v1 or grpc.health.v1 messages is recursive. */
  FUZZ_REQUIRE(depth < 16, "%s: nested %u deep", d->name, depth);
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *member = (const char *)m + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
      const char *array = *(char *const *)member;
      FUZZ_REQUIRE(n == 0 || array != NULL, "%s.%s: %zu entries without an array", d->name,
                   f->name, n);
      note_shape(f, 0, magnitude(n));
      const size_t es = element_size(f->type);
      for (size_t k = 0; k < n; k++) zero_numbered += walk_value(d, f, array + k * es, true, depth);
    } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset &&
               f->type != PROTOBUF_C_TYPE_MESSAGE && f->type != PROTOBUF_C_TYPE_STRING) {
      /* proto2 optional scalar: a has_ flag says whether the value means anything. */
      protobuf_c_boolean has = *(const protobuf_c_boolean *)((const char *)m + f->quantifier_offset);
      note_shape(f, 0, has != 0);
      if (has) zero_numbered += walk_value(d, f, member, false, depth);
    } else {
      zero_numbered += walk_value(d, f, member, false, depth);
    }
  }
  note_shape(d, 2, magnitude(m->n_unknown_fields));
  for (unsigned i = 0; i < m->n_unknown_fields; i++) {
    const ProtobufCMessageUnknownField *u = &m->unknown_fields[i];
    FUZZ_REQUIRE(u->len == 0 || u->data != NULL, "%s: unknown field %u: %zu bytes without data",
                 d->name, u->tag, u->len);
    note_shape(d, 3, (uint32_t)u->wire_type * 2u + (u->tag == 0));
    zero_numbered += u->tag == 0;
  }
  return zero_numbered;
}

/* The canonical encoding of m in a fresh buffer (freed by the caller). */
static uint8_t *pack_copy(const ProtobufCMessage *m, size_t *len) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  FUZZ_REQUIRE(buf != NULL, "%s: no memory for %zu bytes", m->descriptor->name, n);
  size_t written = protobuf_c_message_pack(m, buf);
  FUZZ_REQUIRE(written == n, "%s: packed %zu bytes, get_packed_size said %zu",
               m->descriptor->name, written, n);
  *len = n;
  return buf;
}

/* protobuf-c 1.4.1 rejects field number 0 in a one-byte tag but keeps it as an unknown
 * field when the tag is spelled over-long ("80 00"); packing writes the one-byte form
 * back, which then does not decode. Harmless to the agent (unknown fields are ignored and
 * freed), so such a message is exempt from the round trip instead of reported. */
static bool exempt_from_round_trip(const ProtobufCMessage *m) { return walk_message(m, 0) > 0; }

ProtobufCMessage *fuzz_redecode(const ProtobufCMessage *m) {
  size_t n = 0;
  uint8_t *bytes = pack_copy(m, &n);
  ProtobufCMessage *copy = protobuf_c_message_unpack(m->descriptor, NULL, n, bytes);
  FUZZ_REQUIRE(copy != NULL || exempt_from_round_trip(m),
               "%s: its own %zu-byte encoding does not decode", m->descriptor->name, n);
  free(bytes);
  return copy;
}

ProtobufCMessage *fuzz_decode(const ProtobufCMessageDescriptor *d, const uint8_t *data,
                              size_t size) {
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size, data);
  note_shape(d, 4, m != NULL);
  if (!m) return NULL;
  FUZZ_REQUIRE(m->descriptor == d, "%s: decoded as another type", d->name);
  FUZZ_REQUIRE(protobuf_c_message_check(m), "%s: protobuf_c_message_check fails", d->name);
  walk_message(m, 0);

  /* Decoding normalizes (packed repeated fields, last value wins, merged submessages),
   * so the input's bytes need not come back; the canonical form must be a fixed point. */
  ProtobufCMessage *copy = fuzz_redecode(m);
  if (copy) {
    size_t n1 = 0, n2 = 0;
    uint8_t *once = pack_copy(m, &n1), *twice = pack_copy(copy, &n2);
    FUZZ_REQUIRE(n1 == n2 && memcmp(once, twice, n1) == 0,
                 "%s: canonical encoding is not stable (%zu then %zu bytes)", d->name, n1, n2);
    free(once);
    free(twice);
    protobuf_c_message_free_unpacked(copy, NULL);
  }
  return m;
}
