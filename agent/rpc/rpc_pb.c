#define INA_LOG_SUBSYS "rpc"
#include "agent/rpc/rpc_pb.h"

#include <stdlib.h>

#include "core/check.h"

ina_status_t ina_rpc_pack(const ProtobufCMessage *msg, uint8_t **bytes, size_t *size) {
  ina_status_t st = INA_OK;
  uint8_t *buf = NULL;
  size_t n = 0;
  if (bytes) *bytes = NULL;
  if (size) *size = 0;
  INA_REQUIRE(msg && bytes && size, INA_ERR_INVALID_ARGUMENT,
              "rpc pack: message, bytes and size must not be NULL");
  n = protobuf_c_message_get_packed_size(msg);
  buf = malloc(n ? n : 1);
  INA_CHECK_ALLOC(buf);
  size_t written = protobuf_c_message_pack(msg, buf);
  INA_REQUIRE(written == n, INA_ERR_INTERNAL, "rpc pack: %s packed to %zu bytes, expected %zu",
              msg->descriptor->name, written, n);
  *bytes = buf;
  *size = n;
  return INA_OK;
fail:
  free(buf);
  return st;
}
