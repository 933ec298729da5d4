/* Fuzz target: the three requests without fields, ina.v1.GetNodeInfoRequest,
 * ina.v1.GetHealthRequest (agent/service_node.c) and ina.v1.GetPlacementRequest
 * (agent/service_placement.c). Their handlers only require that the bytes decode: any
 * well-formed protobuf does, with every field unknown, and that is the decoder's path
 * for skipping fields the agent does not know (a newer client's).
 *
 * Each input is decoded as each of the three. For every decoding it traps unless
 * decoding either fails (the handler answers INVALID_ARGUMENT) or gives a sound message
 * (fuzz_message.h: the unknown fields are kept with their data, the canonical
 * re-encoding is stable); the three types must agree on whether the bytes decode, since
 * none has a field to read differently. Messages are freed (LeakSanitizer checks). */
#include <stdint.h>

#include "ina/v1/node.pb-c.h"
#include "ina/v1/placement.pb-c.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_message.h"

static const ProtobufCMessageDescriptor *const kEmptyRequests[] = {
    &ina__v1__get_node_info_request__descriptor,
    &ina__v1__get_health_request__descriptor,
    &ina__v1__get_placement_request__descriptor,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int decoded[3];
  for (int i = 0; i < 3; i++) {
    ProtobufCMessage *m = fuzz_decode(kEmptyRequests[i], data, size);
    decoded[i] = m != NULL;
    protobuf_c_message_free_unpacked(m, NULL);
  }
  FUZZ_REQUIRE(decoded[0] == decoded[1] && decoded[1] == decoded[2],
               "empty messages disagree on whether %zu bytes decode: %d %d %d", size, decoded[0],
               decoded[1], decoded[2]);
  return 0;
}
