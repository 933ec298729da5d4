/* Fuzz target: ina.v1.CancelRequest, the bytes any client sends to Inference.Cancel.
 * The handler (agent/service_inference.c) unpacks them and looks request_id up in its
 * registry of running generations (strcmp), then in the scheduler.
 *
 * For every input it traps unless decoding either fails (the handler answers
 * INVALID_ARGUMENT) or gives a sound message (fuzz_message.h: request_id is a non-NULL,
 * NUL-terminated string, the canonical re-encoding is stable); the message is freed
 * (LeakSanitizer checks). */
#include <stdint.h>
#include <string.h>

#include "ina/v1/inference.pb-c.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ProtobufCMessage *m = fuzz_decode(&ina__v1__cancel_request__descriptor, data, size);
  if (!m) return 0;
  const Ina__V1__CancelRequest *req = (const Ina__V1__CancelRequest *)m;
  /* A decoded id is never longer than the bytes it came from. */
  FUZZ_REQUIRE(strlen(req->request_id) <= size, "request_id of %zu bytes from %zu input bytes",
               strlen(req->request_id), size);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
