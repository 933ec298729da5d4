/* ina status codes: every fallible function returns one; INA_OK is zero.
 * Thread safety: all functions here are thread-safe. */
#ifndef INA_CORE_STATUS_H
#define INA_CORE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ina_status {
  INA_OK = 0,
  INA_ERR_INVALID_ARGUMENT, /* a caller passed a bad value (NULL, out of range, mismatched shape) */
  INA_ERR_OUT_OF_MEMORY,    /* host or device allocation failed */
  INA_ERR_OUT_OF_PAGES,     /* the KV page pool has no free page left */
  INA_ERR_IO,               /* open/read/write/mmap failed */
  INA_ERR_FORMAT,           /* malformed file or message (checkpoint, JSON, safetensors) */
  INA_ERR_NOT_FOUND,        /* a named item (tensor, key, config) does not exist */
  INA_ERR_UNSUPPORTED,      /* valid input that this build or device does not support */
  INA_ERR_CUDA,             /* a CUDA runtime or driver call failed */
  INA_ERR_NCCL,             /* an NCCL call failed */
  INA_ERR_MPI,              /* an MPI call failed */
  INA_ERR_INTERNAL,         /* a broken invariant inside ina */
  INA_STATUS_COUNT
} ina_status_t;

/* Static, never-NULL description of a status code ("out of pages"). */
const char *ina_status_string(ina_status_t status);

#ifdef __cplusplus
}
#endif
#endif
