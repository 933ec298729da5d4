/* protobuf-c glue for rpc/: requests and responses travel as bytes, packed here.
 *
 * Ownership: *bytes is malloc'd and owned by the caller (free(); the server frees a
 * unary reply's bytes itself). Thread safety: reentrant. */
#ifndef INA_AGENT_RPC_RPC_PB_H
#define INA_AGENT_RPC_RPC_PB_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Packs `msg` into a new buffer. An empty message gives *size 0 and a valid 1-byte
 * allocation, so *bytes is never NULL on success. On failure *bytes = NULL, *size = 0. */
ina_status_t ina_rpc_pack(const ProtobufCMessage *msg, uint8_t **bytes, size_t *size);

#ifdef __cplusplus
}
#endif
#endif
