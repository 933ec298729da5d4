/* Argument checks shared by the append kernel's launcher and its CPU reference, so both
 * accept and reject the same parameters. Internal to the mla GPU library.
 * Thread safety: pure. */
#ifndef INA_MLA_MLA_APPEND_ARGS_H
#define INA_MLA_MLA_APPEND_ARGS_H

#include "core/status.h"
#include "mla/mla_append.h"

#ifdef __cplusplus
extern "C" {
#endif

/* INA_OK when p describes a valid append for any cache format; `who` names the caller
 * in the error message. Checks sizes, strides, NULL pointers and element alignment, not
 * the contents of the index arrays (they may live on the device). */
ina_status_t ina_mla_append_check_args(const ina_mla_append_params_t *p, const char *who);

#ifdef __cplusplus
}
#endif
#endif
