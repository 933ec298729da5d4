/* Fuzz target: grpc.health.v1.HealthCheckRequest, the bytes any client (load balancer,
 * Kubernetes probe) sends to Health.Check and Health.Watch, without a bearer token. The
 * handlers (agent/rpc/health.c) unpack them, look `service` up by name, strdup it and
 * print it into the NOT_FOUND message.
 *
 * For every input it traps unless decoding either fails (the handler answers
 * INVALID_ARGUMENT) or gives a sound message (fuzz_message.h: service is a non-NULL,
 * NUL-terminated string, the canonical re-encoding is stable); the message is freed
 * (LeakSanitizer checks). */
#include <stdint.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ProtobufCMessage *m = fuzz_decode(&grpc__health__v1__health_check_request__descriptor, data, size);
  if (!m) return 0;
  const Grpc__Health__V1__HealthCheckRequest *req = (const Grpc__Health__V1__HealthCheckRequest *)m;
  FUZZ_REQUIRE(strlen(req->service) <= size, "service of %zu bytes from %zu input bytes",
               strlen(req->service), size);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
