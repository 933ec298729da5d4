/* Fuzz target: ina.v1.AbortTransferRequest, the bytes a decode agent (or anyone who
 * reaches the port) sends to KvTransfer.AbortTransfer. The handler
 * (agent/handoff/prefill_side.c, abort_transfer) unpacks them, refuses a transfer_id that
 * is empty or longer than 128 bytes, copies the rest into its ring of aborted ids (129
 * bytes each, snprintf) and looks it up among the transfers in flight (strcmp).
 *
 * For every input it traps unless decoding either fails (the handler answers
 * INVALID_ARGUMENT) or gives a sound message (fuzz_message.h: transfer_id is a non-NULL,
 * NUL-terminated string, the canonical re-encoding is stable) whose id is no longer than
 * the bytes it came from, and whose re-decoding has the same id, so that the handler's
 * length check judges both alike; the messages are freed (LeakSanitizer checks). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ina/v1/kv_transfer.pb-c.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_message.h"

/* HANDOFF_ID_MAX (agent/handoff/handoff_internal.h). */
#define HANDLER_ID_MAX 128

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ProtobufCMessage *m = fuzz_decode(&ina__v1__abort_transfer_request__descriptor, data, size);
  if (!m) return 0;
  const Ina__V1__AbortTransferRequest *req = (const Ina__V1__AbortTransferRequest *)m;
  const char *id = req->transfer_id ? req->transfer_id : "";
  const size_t len = strlen(id);
  /* A decoded id is never longer than the bytes it came from. */
  FUZZ_REQUIRE(len <= size, "transfer_id of %zu bytes from %zu input bytes", len, size);
  /* What the handler keeps of an id it accepts: all of it, NUL-terminated. */
  if (len >= 1 && len <= HANDLER_ID_MAX) {
    char ring_entry[HANDLER_ID_MAX + 1];
    FUZZ_REQUIRE(snprintf(ring_entry, sizeof ring_entry, "%s", id) == (int)len && strcmp(ring_entry, id) == 0,
                 "an accepted id of %zu bytes does not fit the handler's ring", len);
  }
  ProtobufCMessage *again = fuzz_redecode(m);
  if (again) {
    const Ina__V1__AbortTransferRequest *req2 = (const Ina__V1__AbortTransferRequest *)again;
    FUZZ_REQUIRE(strcmp(req2->transfer_id ? req2->transfer_id : "", id) == 0,
                 "re-decoded transfer_id differs (%zu bytes before)", len);
  }
  protobuf_c_message_free_unpacked(again, NULL);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
