/* ina_gemm_grouped_run in a build without CUDA: INA_ERR_UNSUPPORTED, as gemm_none.c does
 * for the dense GEMMs. The CPU reference (gemm_grouped_ref.c) builds everywhere. */
#define INA_LOG_SUBSYS "gemm"
#include "core/check.h"
#include "gemm/gemm_grouped.h"

ina_status_t ina_gemm_grouped_run(const ina_gemm_grouped_args_t *args) {
  ina_error(INA_LOG_SUBSYS,
            "ina_gemm_grouped_run: this build has no CUDA support (configure with -DINA_CUDA=ON)");
  return INA_ERR_UNSUPPORTED;
}
