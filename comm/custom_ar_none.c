/* comm/custom_ar.h for a build without CUDA: nothing can be created, so every entry point
 * reports INA_ERR_UNSUPPORTED (or the empty answer for the queries). */
#define INA_LOG_SUBSYS "custom_ar"
#include "comm/custom_ar.h"

#include "core/check.h"

static ina_status_t unsupported(const char *what) {
  ina_error(INA_LOG_SUBSYS, "%s: this build has no CUDA support (configure with -DINA_CUDA=ON)",
            what);
  return INA_ERR_UNSUPPORTED;
}

ina_status_t ina_custom_ar_create(ina_comm_t *comm, const ina_custom_ar_config_t *cfg,
                                  ina_custom_ar_t **out) {
  if (out) *out = NULL;
  return unsupported("ina_custom_ar_create");
}

void ina_custom_ar_destroy(ina_custom_ar_t *ar) { (void)ar; }

void *ina_custom_ar_input_buffer(const ina_custom_ar_t *ar, size_t *bytes) {
  if (bytes) *bytes = 0;
  return NULL;
}

int ina_custom_ar_peer_access(const ina_custom_ar_t *ar) { return 0; }
int ina_custom_ar_nranks(const ina_custom_ar_t *ar) { return 0; }

ina_status_t ina_custom_ar_choose(const ina_custom_ar_t *ar, ina_custom_ar_mode_t mode,
                                  ina_custom_ar_algo_t requested, size_t count, int64_t rows,
                                  int64_t cols, ina_custom_ar_algo_t *algo) {
  return unsupported("ina_custom_ar_choose");
}

ina_status_t ina_custom_ar_run(ina_custom_ar_t *ar, const ina_custom_ar_args_t *args) {
  return unsupported("ina_custom_ar_run");
}
