#include "agent/rpc/rpc_status.h"

#include <stdio.h>

const char *ina_rpc_code_name(ina_rpc_code_t code) {
  static const char *const kNames[] = {
      "OK",           "CANCELLED",          "UNKNOWN",
      "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION", "ABORTED",     "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",          "UNAVAILABLE",
      "DATA_LOSS",    "UNAUTHENTICATED"};
  if ((unsigned)code >= sizeof kNames / sizeof kNames[0]) return "INVALID_CODE";
  return kNames[code];
}

ina_status_t ina_rpc_code_to_status(ina_rpc_code_t code) {
  switch (code) {
    case INA_RPC_OK: return INA_OK;
    case INA_RPC_INVALID_ARGUMENT:
    case INA_RPC_OUT_OF_RANGE:
    case INA_RPC_FAILED_PRECONDITION: return INA_ERR_INVALID_ARGUMENT;
    case INA_RPC_NOT_FOUND: return INA_ERR_NOT_FOUND;
    case INA_RPC_UNIMPLEMENTED: return INA_ERR_UNSUPPORTED;
    case INA_RPC_INTERNAL:
    case INA_RPC_DATA_LOSS: return INA_ERR_INTERNAL;
    default: return INA_ERR_IO;
  }
}

ina_rpc_code_t ina_rpc_errorv(char *message, ina_rpc_code_t code, const char *fmt, va_list ap) {
  if (!message) return code;
  if (fmt) {
    vsnprintf(message, INA_RPC_MESSAGE_MAX, fmt, ap);
  } else {
    message[0] = '\0';
  }
  return code;
}

ina_rpc_code_t ina_rpc_error(char *message, ina_rpc_code_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ina_rpc_errorv(message, code, fmt, ap);
  va_end(ap);
  return code;
}
