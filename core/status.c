#include "core/status.h"

const char *ina_status_string(ina_status_t status) {
  switch (status) {
  case INA_OK: return "ok";
  case INA_ERR_INVALID_ARGUMENT: return "invalid argument";
  case INA_ERR_OUT_OF_MEMORY: return "out of memory";
  case INA_ERR_OUT_OF_PAGES: return "out of KV cache pages";
  case INA_ERR_IO: return "I/O error";
  case INA_ERR_FORMAT: return "malformed input";
  case INA_ERR_NOT_FOUND: return "not found";
  case INA_ERR_UNSUPPORTED: return "unsupported";
  case INA_ERR_CUDA: return "CUDA error";
  case INA_ERR_NCCL: return "NCCL error";
  case INA_ERR_MPI: return "MPI error";
  case INA_ERR_INTERNAL: return "internal error";
  case INA_STATUS_COUNT: break;
  }
  return "unknown status";
}
