/* A rank that stalls past INA_COMM_TIMEOUT_S (the test sets 3 s) must make the others'
 * operation fail within the timeout, not hang: the last rank sleeps timeout + 1 s before
 * joining an all-reduce. The stalled operation then completes while the others destroy
 * their (broken) communicator (which waits one more timeout for it), so the job still
 * ends cleanly. */
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/log.h"
#include "tests/comm/comm_test_data.h"

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  ina_comm_t *c = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &c));
  if (!c) return 1;
  int rank = ina_comm_rank(c), size = ina_comm_size(c);
  const char *env = getenv("INA_COMM_TIMEOUT_S");
  double timeout = env ? atof(env) : 60;
  CHECKF(timeout > 0 && timeout <= 10, "run with INA_COMM_TIMEOUT_S in (0, 10], got %g", timeout);
  float x[16], y[16];
  for (int i = 0; i < 16; i++) x[i] = (float)(rank + i);

  /* A healthy operation first: the timeout must not fire on a live peer. */
  CHECK_OK(ina_comm_all_reduce(c, x, y, 16, INA_DTYPE_F32, NULL));
  CHECK(y[0] == (float)(size * (size - 1) / 2));

  ina_log_set_quiet_errors(1);
  if (rank == size - 1) {
    sleep((unsigned)(timeout + 1));
    ina_status_t st = ina_comm_all_reduce(c, x, y, 16, INA_DTYPE_F32, NULL);
    CHECKF(st == INA_OK, "the late rank's all-reduce: %s", ina_last_error());
  } else {
    double t0 = test_now_s();
    ina_status_t st = ina_comm_all_reduce(c, x, y, 16, INA_DTYPE_F32, NULL);
    double waited = test_now_s() - t0;
    CHECK(st == INA_ERR_MPI);
    CHECKF(strstr(ina_last_error(), "timed out") && strstr(ina_last_error(), "all_reduce"),
           "message: %s", ina_last_error());
    CHECKF(waited >= timeout * 0.9 && waited <= timeout + 2, "failed after %.2f s", waited);
    CHECK(ina_comm_is_broken(c));
    CHECK(ina_comm_barrier(c, NULL) == INA_ERR_MPI); /* broken: fails at once */
    CHECK(strstr(ina_last_error(), "broken") != NULL);
  }
  ina_log_set_quiet_errors(0);
  printf("rank %d/%d: %s\n", rank, size, test_checks_failed_ ? "FAILED" : "ok");
  ina_comm_destroy(c); /* drains the stalled all-reduce: the late rank has joined by now */
  int rc = test_finish("test_comm_timeout");
  ina_bootstrap_finalize(boot);
  return rc;
}
