/* Fuzz target: ina.v1.GetLoadRequest, the bytes any client sends to Node.GetLoad. The
 * handler (agent/service_node.c) only requires that they decode.
 *
 * For every input it traps unless decoding either fails (the handler answers
 * INVALID_ARGUMENT) or gives a sound message (fuzz_message.h: both flags decode to 0 or
 * 1, the canonical re-encoding is stable); the message is freed (LeakSanitizer checks). */
#include <stdint.h>

#include "ina/v1/node.pb-c.h"
#include "tests/fuzz/fuzz_message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ProtobufCMessage *m = fuzz_decode(&ina__v1__get_load_request__descriptor, data, size);
  protobuf_c_message_free_unpacked(m, NULL); /* NULL: nothing decoded */
  return 0;
}
