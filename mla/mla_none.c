/* The device side of mla/mla.h in a build without CUDA: the plan still runs (with an
 * explicit num_sms and no device workspace), everything that needs a GPU reports
 * INA_ERR_UNSUPPORTED, as the CUDA build does on a machine without one. */
#define INA_LOG_SUBSYS "mla"
#include "core/check.h"
#include "mla/mla.h"
#include "mla/mla_schedule.h"

static ina_status_t unsupported(const char *what) {
  ina_error(INA_LOG_SUBSYS, "%s: this build has no CUDA support (configure with -DINA_CUDA=ON)",
            what);
  return INA_ERR_UNSUPPORTED;
}

ina_status_t ina_mla_run(const ina_mla_plan_info_t *info, void *device_ws,
                         const ina_mla_run_params_t *p, void *stream) {
  return unsupported("ina_mla_run");
}

ina_status_t ina_mla_device_num_sms(int32_t *out) {
  return unsupported("ina_mla plan with num_sms = 0 (the device's SM count)");
}

ina_status_t ina_mla_copy_schedule(void *device_ws, const void *host_ws, size_t bytes,
                                   void *stream) {
  return unsupported("ina_mla plan into a device workspace");
}
