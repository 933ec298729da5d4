/* gRPC status codes and the status a call ends with, shared by the server and the client
 * of rpc/. The values are those of grpc_status_code (grpc/status.h), so that this header
 * and its users need no gRPC include.
 *
 * Thread safety: all functions here are thread-safe (pure). */
#ifndef INA_AGENT_RPC_RPC_STATUS_H
#define INA_AGENT_RPC_RPC_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ina_rpc_code {
  INA_RPC_OK = 0,
  INA_RPC_CANCELLED = 1,
  INA_RPC_UNKNOWN = 2,
  INA_RPC_INVALID_ARGUMENT = 3,
  INA_RPC_DEADLINE_EXCEEDED = 4,
  INA_RPC_NOT_FOUND = 5,
  INA_RPC_ALREADY_EXISTS = 6,
  INA_RPC_PERMISSION_DENIED = 7,
  INA_RPC_RESOURCE_EXHAUSTED = 8,
  INA_RPC_FAILED_PRECONDITION = 9,
  INA_RPC_ABORTED = 10,
  INA_RPC_OUT_OF_RANGE = 11,
  INA_RPC_UNIMPLEMENTED = 12,
  INA_RPC_INTERNAL = 13,
  INA_RPC_UNAVAILABLE = 14,
  INA_RPC_DATA_LOSS = 15,
  INA_RPC_UNAUTHENTICATED = 16
} ina_rpc_code_t;

/* Longest status message kept, terminating NUL included; longer ones are truncated. */
#define INA_RPC_MESSAGE_MAX 512

/* How a call ended: the code and the status details string ("" when none). */
typedef struct ina_rpc_status {
  ina_rpc_code_t code;
  char message[INA_RPC_MESSAGE_MAX];
} ina_rpc_status_t;

/* Static, never-NULL name of a code as gRPC spells it ("UNAUTHENTICATED");
 * "INVALID_CODE" for a value outside the enum. */
const char *ina_rpc_code_name(ina_rpc_code_t code);

/* The ina status a caller sees for a call that ended with `code`: INA_OK for OK;
 * INA_ERR_INVALID_ARGUMENT for INVALID_ARGUMENT, OUT_OF_RANGE and FAILED_PRECONDITION;
 * INA_ERR_NOT_FOUND for NOT_FOUND; INA_ERR_UNSUPPORTED for UNIMPLEMENTED;
 * INA_ERR_INTERNAL for INTERNAL and DATA_LOSS; INA_ERR_IO for the rest (the call did
 * not get through: unavailable, deadline, cancelled, unauthenticated, ...). */
ina_status_t ina_rpc_code_to_status(ina_rpc_code_t code);

/* Formats into `message` (INA_RPC_MESSAGE_MAX bytes, truncating) and returns `code`, so
 * that a handler can write `return ina_rpc_error(reply->message, INA_RPC_NOT_FOUND,
 * "unknown service '%s'", name);`. fmt may be NULL for an empty message. */
ina_rpc_code_t ina_rpc_error(char *message, ina_rpc_code_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
ina_rpc_code_t ina_rpc_errorv(char *message, ina_rpc_code_t code, const char *fmt, va_list ap);

#ifdef __cplusplus
}
#endif
#endif
