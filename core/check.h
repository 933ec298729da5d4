/* Check macros in the style of NCCL's checks.h.
 *
 * A function that uses them declares `ina_status_t st = INA_OK;` and ends with a
 * `fail:` label that releases what it holds and returns `st`. Each macro logs the
 * failing expression with file:line and jumps to `fail`.
 *
 * A source file may set its log subsystem with `#define INA_LOG_SUBSYS "model"` before
 * including this header. */
#ifndef INA_CORE_CHECK_H
#define INA_CORE_CHECK_H

#include "core/log.h"
#include "core/status.h"

#ifndef INA_LOG_SUBSYS
#define INA_LOG_SUBSYS "ina"
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* Logs (at debug level: the callee already recorded the reason) where a check failed. */
void ina_check_failed(const char *subsystem, const char *file, int line, const char *expr,
                      ina_status_t status);
#ifdef __cplusplus
}
#endif

/* `call` returns ina_status_t: on failure keep its status and jump to fail. */
#define INA_CHECK(call)                                                                  \
  do {                                                                                   \
    ina_status_t ina_check_s_ = (call);                                                  \
    if (ina_check_s_ != INA_OK) {                                                        \
      st = ina_check_s_;                                                                 \
      ina_check_failed(INA_LOG_SUBSYS, __FILE__, __LINE__, #call, ina_check_s_);         \
      goto fail;                                                                         \
    }                                                                                    \
  } while (0)

/* Require `cond`; otherwise set st = code, record the formatted error message and jump
 * to fail. The message should say what and where: file, tensor or key, value. */
#define INA_REQUIRE(cond, code, ...)                                                     \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      st = (code);                                                                       \
      ina_error(INA_LOG_SUBSYS, __VA_ARGS__);                                            \
      goto fail;                                                                         \
    }                                                                                    \
  } while (0)

/* Versioned structs (NCCL style) begin with `size_t struct_size; uint32_t version;` and
 * are filled by an INIT macro. `v1_size` is the size of version 1 (offsetof its last
 * field + that field's size), so a caller built against a newer, longer version passes
 * and one that forgot the INIT macro does not. `what` names the struct in messages. */
#define INA_REQUIRE_VERSIONED(p, v1_size, what, init_macro)                               \
  do {                                                                                   \
    INA_REQUIRE((p) != NULL, INA_ERR_INVALID_ARGUMENT, "%s is NULL", what);              \
    INA_REQUIRE((p)->struct_size >= (size_t)(v1_size), INA_ERR_INVALID_ARGUMENT,         \
                "%s struct_size %zu is smaller than the version-1 size %zu (initialize it " \
                "with %s)", what, (p)->struct_size, (size_t)(v1_size), init_macro);      \
    INA_REQUIRE((p)->version >= 1, INA_ERR_INVALID_ARGUMENT,                             \
                "%s version %u is invalid (expected >= 1)", what, (unsigned)(p)->version); \
  } while (0)

/* A NULL pointer from an allocator becomes INA_ERR_OUT_OF_MEMORY. */
#define INA_CHECK_ALLOC(ptr)                                                             \
  INA_REQUIRE((ptr) != NULL, INA_ERR_OUT_OF_MEMORY, "out of memory allocating %s (%s:%d)", \
              #ptr, __FILE__, __LINE__)

#endif
