/* Decoding fuzzed bytes the way ina-agent's handlers do (protobuf-c, default allocator),
 * and checking what the handlers then take for granted about a decoded message.
 *
 * fuzz_decode unpacks `size` bytes as a `d` message. When they do not decode it returns
 * NULL (the handler answers INVALID_ARGUMENT; nothing else to check). When they do, it
 * walks the message through its descriptor and traps (FUZZ_REQUIRE) unless:
 *  - protobuf_c_message_check passes and every submessage has its field's descriptor;
 *  - every string of a proto3 field is non-NULL and NUL-terminated (handlers strdup and
 *    strcmp them), every bool is 0 or 1;
 *  - every repeated field with entries has an array, and no repeated message entry is
 *    NULL (proto/validate.h relies on it); unknown fields with a length have data;
 *  - the canonical encoding (pack) has get_packed_size bytes, decodes again, and
 *    re-encodes to the same bytes. Exempt: a message with an unknown field numbered 0,
 *    which protobuf-c 1.4.1 accepts from an over-long tag ("80 00") but writes back in
 *    the one-byte form it rejects; the agent ignores unknown fields, so this is noted
 *    (as coverage) and not reported.
 * It also feeds the shape of the decoded message (which fields are set, how long the
 * repeated fields and strings are, unknown fields) to libFuzzer as extra coverage,
 * because the decoder itself, the system's libprotobuf-c, is not instrumented.
 *
 * Ownership: a returned message belongs to the caller, who frees it with
 * protobuf_c_message_free_unpacked(m, NULL). data may be NULL when size is 0.
 * Thread safety: not thread-safe (the coverage counters are process-wide); libFuzzer
 * runs a target on one thread. */
#ifndef INA_TESTS_FUZZ_FUZZ_MESSAGE_H
#define INA_TESTS_FUZZ_FUZZ_MESSAGE_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

ProtobufCMessage *fuzz_decode(const ProtobufCMessageDescriptor *d, const uint8_t *data,
                              size_t size);

/* A second, independent decoding of m: its canonical encoding unpacked again (what a
 * client that re-sent the request would get the agent to see). NULL only for the exempt
 * messages above; traps if any other fails. The caller frees the copy like a decoded
 * message. */
ProtobufCMessage *fuzz_redecode(const ProtobufCMessage *m);

#endif
