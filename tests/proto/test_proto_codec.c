/* Wire-format robustness of every ina.v1 and grpc.health.v1 message: random messages
 * survive pack -> unpack unchanged, and hostile input (random bytes, bit-flipped and
 * truncated valid encodings) is either rejected or unpacks into a message that passes
 * protobuf_c_message_check, re-packs, and survives the request validators. Run under
 * ASan/UBSan, this is where out-of-bounds reads in the decoding path would show. */
#include "grpc/health/v1/health.pb-c.h"
#include "ina/v1/inference.pb-c.h"
#include "ina/v1/node.pb-c.h"
#include "ina/v1/placement.pb-c.h"
#include "proto/validate.h"
#include "tests/proto/proto_random.h"

static const ProtobufCMessageDescriptor *const kMessages[] = {
    &grpc__health__v1__health_check_request__descriptor,
    &grpc__health__v1__health_check_response__descriptor,
    &ina__v1__get_node_info_request__descriptor,
    &ina__v1__node_info__descriptor,
    &ina__v1__gpu_info__descriptor,
    &ina__v1__gpu_link__descriptor,
    &ina__v1__rank_info__descriptor,
    &ina__v1__model_info__descriptor,
    &ina__v1__build_info__descriptor,
    &ina__v1__get_health_request__descriptor,
    &ina__v1__node_health__descriptor,
    &ina__v1__rank_health__descriptor,
    &ina__v1__get_load_request__descriptor,
    &ina__v1__node_load__descriptor,
    &ina__v1__expert_load__descriptor,
    &ina__v1__sampling_params__descriptor,
    &ina__v1__generate_request__descriptor,
    &ina__v1__timings__descriptor,
    &ina__v1__generate_response__descriptor,
    &ina__v1__cancel_request__descriptor,
    &ina__v1__cancel_response__descriptor,
    &ina__v1__layout__descriptor,
    &ina__v1__expert_slot__descriptor,
    &ina__v1__layer_placement__descriptor,
    &ina__v1__expert_placement__descriptor,
    &ina__v1__get_placement_request__descriptor,
    &ina__v1__get_placement_response__descriptor,
    &ina__v1__apply_placement_request__descriptor,
    &ina__v1__apply_placement_response__descriptor,
};
#define N_MESSAGES (sizeof kMessages / sizeof kMessages[0])

enum { ROUND_TRIPS = 200, GARBAGE_STRINGS = 2000, MUTATIONS = 300, PREFIX_SOURCES = 4 };

static int n_accepted, n_rejected, n_unknown_not_repackable;

/* Whether m or any sub-message carries fields its descriptor does not know. */
static bool has_unknown_fields(const ProtobufCMessage *m) {
  if (m->n_unknown_fields > 0) return true;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = PR_MEMBER(size_t, m, f->quantifier_offset);
      ProtobufCMessage **arr = PR_MEMBER(ProtobufCMessage **, m, f->offset);
      for (size_t k = 0; k < n; k++)
        if (has_unknown_fields(arr[k])) return true;
    } else {
      const ProtobufCMessage *sub = PR_MEMBER(ProtobufCMessage *, m, f->offset);
      if (sub && has_unknown_fields(sub)) return true;
    }
  }
  return false;
}

static void dump_hex(const char *what, const uint8_t *p, size_t n) {
  fprintf(stderr, "  %s (%zu bytes):", what, n);
  for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", p[i]);
  fputc('\n', stderr);
}

/* Unpacks hostile bytes. A message that comes out must be well-formed, re-pack to
 * something that unpacks to the same fields, and not upset the validators. */
static void unpack_hostile(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len) {
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, buf);
  if (m == NULL) {
    n_rejected++;
    return;
  }
  n_accepted++;
  CHECKF(protobuf_c_message_check(m), "%s: unpacked message fails check", d->name);
  size_t len2;
  uint8_t *buf2 = pr_pack(m, &len2);
  ProtobufCMessage *m2 = protobuf_c_message_unpack(d, NULL, len2, buf2);
  /* protobuf-c 1.4 keeps an unknown field whose tag has field number 0 when the tag is
   * an over-long varint (85 00), then re-packs it minimally (05), which it rejects.
   * Unknown fields are never read by ina, so only the known fields must round-trip. */
  if (m2 == NULL && has_unknown_fields(m)) n_unknown_not_repackable++;
  bool same = (m2 == NULL && has_unknown_fields(m)) || (m2 != NULL && pr_messages_equal(m, m2));
  CHECKF(same, "%s: re-packed hostile message differs", d->name);
  if (!same) {
    dump_hex("input", buf, len);
    dump_hex("re-packed", buf2, len2);
  }

  char msg[256];
  ina_proto_code_t code;
  if (d == &ina__v1__generate_request__descriptor) {
    const ina_generate_limits_t lim = {.vocab_size = 1000, .max_context_tokens = 4096};
    ina_status_t st = ina_validate_generate_request((const Ina__V1__GenerateRequest *)m, &lim, msg,
                                                    sizeof msg, &code);
    CHECK((st == INA_OK) == (code == INA_PROTO_CODE_OK) && strlen(msg) < sizeof msg);
  } else if (d == &ina__v1__apply_placement_request__descriptor) {
    const ina_placement_limits_t lim = {.world_size = 8, .n_moe_layers = 4, .n_routed_experts = 16,
                                        .max_slots_per_rank = 4, .current_generation = 1};
    ina_status_t st = ina_validate_apply_placement_request((const Ina__V1__ApplyPlacementRequest *)m,
                                                           &lim, msg, sizeof msg, &code);
    CHECK((st == INA_OK) == (code == INA_PROTO_CODE_OK) && strlen(msg) < sizeof msg);
  }
  if (m2) protobuf_c_message_free_unpacked(m2, NULL);
  free(buf2);
  protobuf_c_message_free_unpacked(m, NULL);
}

static void test_round_trip(const ProtobufCMessageDescriptor *d, test_rng_t *r) {
  for (int it = 0; it < ROUND_TRIPS; it++) {
    ProtobufCMessage *m = pr_random_message(d, r, 0);
    CHECKF(protobuf_c_message_check(m), "%s: random message fails check", d->name);
    size_t len;
    uint8_t *buf = pr_pack(m, &len);
    ProtobufCMessage *u = protobuf_c_message_unpack(d, NULL, len, buf);
    CHECKF(u != NULL, "%s: unpack of a valid encoding failed", d->name);
    if (u) {
      CHECKF(pr_messages_equal(m, u), "%s: round trip changed the message", d->name);
      /* Encoding is canonical: the unpacked copy packs to the same bytes. */
      size_t len2;
      uint8_t *buf2 = pr_pack(u, &len2);
      CHECKF(len2 == len && memcmp(buf, buf2, len) == 0, "%s: re-pack differs", d->name);
      free(buf2);
      protobuf_c_message_free_unpacked(u, NULL);
    }
    /* Every prefix of a few valid encodings, and bit flips of all of them. */
    if (it < PREFIX_SOURCES)
      for (size_t n = 0; n < len; n++) unpack_hostile(d, buf, n);
    if (len > 0 && it < MUTATIONS) {
      uint8_t *mut = malloc(len);
      memcpy(mut, buf, len);
      int flips = (int)test_rng_int(r, 1, 4);
      for (int k = 0; k < flips; k++) mut[test_rng_next(r) % len] ^= (uint8_t)(1u << test_rng_int(r, 0, 7));
      unpack_hostile(d, mut, len);
      free(mut);
    }
    free(buf);
    protobuf_c_message_free_unpacked(m, NULL);
  }
}

static void test_garbage(const ProtobufCMessageDescriptor *d, test_rng_t *r) {
  uint8_t buf[96];
  for (int it = 0; it < GARBAGE_STRINGS; it++) {
    size_t len = (size_t)test_rng_int(r, 0, sizeof buf);
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)test_rng_next(r);
    /* Half the strings start with a plausible tag (field 1..12, any wire type) so the
     * decoder gets past the first byte more often. */
    if (len > 0 && (it & 1)) buf[0] = (uint8_t)((test_rng_int(r, 1, 12) << 3) | test_rng_int(r, 0, 5));
    /* Exactly-sized heap copy so ASan sees any read past the end. */
    uint8_t *heap = malloc(len ? len : 1);
    memcpy(heap, buf, len);
    unpack_hostile(d, heap, len);
    free(heap);
  }
}

/* Fixed edge cases: empty input is the all-defaults message; an over-long varint, a
 * length running past the end, and a truncated fixed64 are rejected. */
static void test_fixed_cases(void) {
  ProtobufCMessage *m = protobuf_c_message_unpack(&ina__v1__generate_request__descriptor, NULL, 0,
                                                  (const uint8_t *)"");
  CHECK(m != NULL);
  if (m) {
    const Ina__V1__GenerateRequest *g = (const Ina__V1__GenerateRequest *)m;
    CHECK(g->n_prompt_token_ids == 0 && g->max_tokens == 0 && g->sampling == NULL && strcmp(g->request_id, "") == 0);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  static const uint8_t long_varint[] = {0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  static const uint8_t long_len[] = {0x0a, 0x7f, 'a', 'b'};
  static const uint8_t short_fixed64[] = {0x29, 1, 2, 3};
  CHECK(protobuf_c_message_unpack(&ina__v1__generate_request__descriptor, NULL, sizeof long_varint, long_varint) == NULL);
  CHECK(protobuf_c_message_unpack(&ina__v1__generate_request__descriptor, NULL, sizeof long_len, long_len) == NULL);
  CHECK(protobuf_c_message_unpack(&ina__v1__gpu_link__descriptor, NULL, sizeof short_fixed64, short_fixed64) == NULL);

  /* The comparator itself must see a one-field difference, also inside a sub-message. */
  pr_quiet = true;
  Ina__V1__GpuInfo a = INA__V1__GPU_INFO__INIT, b = INA__V1__GPU_INFO__INIT;
  a.memory_total_bytes = b.memory_total_bytes = 141ull << 30;
  CHECK(pr_messages_equal(&a.base, &b.base));
  b.memory_total_bytes++;
  CHECK(!pr_messages_equal(&a.base, &b.base));
  Ina__V1__ApplyPlacementRequest ra = INA__V1__APPLY_PLACEMENT_REQUEST__INIT, rb = INA__V1__APPLY_PLACEMENT_REQUEST__INIT;
  Ina__V1__ExpertPlacement pa = INA__V1__EXPERT_PLACEMENT__INIT, pb = INA__V1__EXPERT_PLACEMENT__INIT;
  ra.placement = &pa;
  rb.placement = &pb;
  CHECK(pr_messages_equal(&ra.base, &rb.base));
  pb.slots_per_rank = 9;
  CHECK(!pr_messages_equal(&ra.base, &rb.base));
  pr_quiet = false;
}

int main(void) {
  test_rng_t rng = {test_seed("test_proto_codec")};
  test_fixed_cases();
  for (size_t i = 0; i < N_MESSAGES; i++) {
    test_round_trip(kMessages[i], &rng);
    test_garbage(kMessages[i], &rng);
  }
  printf("test_proto_codec: %zu message types; hostile inputs: %d unpacked, %d rejected, %d with "
         "unknown fields that do not re-pack\n", N_MESSAGES, n_accepted, n_rejected, n_unknown_not_repackable);
  CHECK(n_rejected > 0 && n_accepted > 0); /* both paths were exercised */
  return test_finish("test_proto_codec");
}
