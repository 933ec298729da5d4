/* Fuzz target: the responses the `ina` command line decodes from a server it was pointed
 * at (tools/cmd_client.c): ina.v1.NodeInfo (ina info), ina.v1.NodeHealth and
 * grpc.health.v1.HealthCheckResponse (ina health), ina.v1.GenerateResponse (each message
 * of the ina generate --server stream). A server is as untrusted as a client.
 *
 * Each input is decoded as each of the four. For every decoding it traps unless decoding
 * either fails (the client reports the call failed) or gives a sound message
 * (fuzz_message.h: every string the client prints is non-NULL and NUL-terminated, no
 * repeated GpuInfo / RankInfo / RankHealth entry is NULL, open enums keep unknown
 * values, the canonical re-encoding is stable). Messages are freed (LeakSanitizer
 * checks). */
#include <stdint.h>

#include "grpc/health/v1/health.pb-c.h"
#include "ina/v1/inference.pb-c.h"
#include "ina/v1/node.pb-c.h"
#include "tests/fuzz/fuzz_message.h"

static const ProtobufCMessageDescriptor *const kClientResponses[] = {
    &ina__v1__node_info__descriptor,
    &ina__v1__node_health__descriptor,
    &grpc__health__v1__health_check_response__descriptor,
    &ina__v1__generate_response__descriptor,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (size_t i = 0; i < sizeof kClientResponses / sizeof kClientResponses[0]; i++)
    protobuf_c_message_free_unpacked(fuzz_decode(kClientResponses[i], data, size), NULL);
  return 0;
}
