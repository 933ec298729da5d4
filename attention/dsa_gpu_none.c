/* Builds without CUDA: the GPU indexer's runs, the key append and the schedule copy refuse
 * with INA_ERR_UNSUPPORTED (the plan, plain C, still validates and plans host-only). */
#define INA_LOG_SUBSYS "dsa_gpu"
#include "attention/dsa_gpu.h"

#include "core/check.h"

static ina_status_t no_cuda(const char *what) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "dsa gpu %s: this build has no CUDA", what);
fail:
  return st;
}

ina_status_t ina_dsa_gpu_copy_schedule(void *device_ws, const void *host_ws, size_t bytes,
                                       void *stream) {
  (void)device_ws;
  (void)host_ws;
  (void)bytes;
  (void)stream;
  return no_cuda("plan (device workspace)");
}

ina_status_t ina_dsa_gpu_score_run(const ina_dsa_gpu_plan_info_t *info, const void *device_ws,
                                   const ina_dsa_gpu_score_run_params_t *p, void *stream) {
  (void)info;
  (void)device_ws;
  (void)p;
  (void)stream;
  return no_cuda("score");
}

ina_status_t ina_dsa_gpu_topk_run(const ina_dsa_gpu_plan_info_t *info, const void *device_ws,
                                  const ina_dsa_gpu_topk_run_params_t *p, void *stream) {
  (void)info;
  (void)device_ws;
  (void)p;
  (void)stream;
  return no_cuda("topk");
}

ina_status_t ina_dsa_gpu_append(const ina_dsa_gpu_append_params_t *p, void *stream) {
  (void)p;
  (void)stream;
  return no_cuda("append");
}
