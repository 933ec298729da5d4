/* A custom all-reduce whose peer never joins fails instead of hanging, without checked
 * mode: rank 0 enqueues a run that rank 1 never starts. The kernel's wait for rank 1 times
 * out (timeout_s = 2), records which wait it was and traps; rank 0's synchronization then
 * fails within seconds and its next ina_custom_ar_run returns INA_ERR_CUDA naming the
 * wait. Rank 0's CUDA context is lost afterwards, so this runs in its own program, on an
 * MPI communicator (no NCCL state in the lost context). `--algo ll` waits in an LL line
 * instead of a barrier (default: one-shot). Two ranks with a GPU each; skipped (77)
 * otherwise, failed under INA_REQUIRE_GPU=1 (tests/test_util.h). */
#include <string.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "comm/custom_ar.h"
#include "core/cuda.h"
#include "tests/comm/comm_test_data.h"
#include "tests/gpu_test_util.h"

#ifdef INA_HAVE_CUDA
#include <cuda_runtime_api.h>

static int run(ina_bootstrap_t *boot, ina_custom_ar_algo_t algo) {
  ina_comm_t *comm = NULL;
  ina_custom_ar_t *ar = NULL;
  CHECK_OK(ina_bootstrap_node_comm(boot, INA_COMM_BACKEND_MPI, &comm));
  if (!comm) return test_finish("test_custom_ar_watchdog");
  const int rank = ina_comm_rank(comm);
  ina_custom_ar_config_t cfg = INA_CUSTOM_AR_CONFIG_INIT;
  cfg.max_bytes = (size_t)1 << 20;
  cfg.timeout_s = 2.0;
  cfg.check = 0;
  ina_log_set_quiet_errors(1);
  const ina_status_t created = ina_custom_ar_create(comm, &cfg, &ar);
  ina_log_set_quiet_errors(0);
  if (created == INA_ERR_UNSUPPORTED) { /* no peer access and no NCCL: nothing to watch */
    ina_comm_destroy(comm);
    return rank == 0 ? test_skip_gpu("test_custom_ar_watchdog", "no peer access between the GPUs")
                     : test_gpu_skip_status();
  }
  CHECK_OK(created);
  if (ar && rank == 0) {
    void *d = NULL;
    cudaStream_t stream = NULL;
    CHECK(cudaMalloc(&d, 4096) == cudaSuccess);
    CHECK(cudaMemset(d, 0, 4096) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    ina_custom_ar_args_t a = INA_CUSTOM_AR_ARGS_INIT;
    a.algo = algo;
    a.count = 1000;
    a.in = d;
    a.out = (uint8_t *)d + 2048;
    a.stream = stream;
    CHECK_OK(ina_custom_ar_run(ar, &a));
    const double t0 = MPI_Wtime();
    const cudaError_t e = cudaStreamSynchronize(stream);
    const double waited = MPI_Wtime() - t0;
    printf("test_custom_ar_watchdog: the lone run ended after %.1f s: %s\n", waited,
           cudaGetErrorString(e));
    CHECKF(e != cudaSuccess, "a run without its peer completed");
    CHECKF(waited >= 1.5 && waited < 30.0, "the wait ended after %.1f s (timeout 2 s)", waited);
    ina_log_set_quiet_errors(1);
    const ina_status_t st = ina_custom_ar_run(ar, &a);
    ina_log_set_quiet_errors(0);
    CHECKF(st == INA_ERR_CUDA && strstr(ina_last_error(), "timed out") != NULL &&
               strstr(ina_last_error(), "for rank 1") != NULL &&
               strstr(ina_last_error(), algo == INA_CUSTOM_AR_LL ? "LL data" : "barrier") != NULL,
           "the next run returned %d: %s", (int)st, ina_last_error());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ina_custom_ar_destroy(ar);
  ina_comm_destroy(comm);
  return test_finish("test_custom_ar_watchdog");
}
#endif

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  char buf[256];
  /* One GPU per rank of the node: test_gpus_missing names the CUDA error when none. */
  const char *why = test_gpus_missing(ina_bootstrap_local_size(boot), buf, sizeof buf);
  if (!why && ina_bootstrap_world_size(boot) != 2) why = "needs exactly 2 ranks";
  if (why) {
    const int rc = ina_bootstrap_world_rank(boot) == 0 ? test_skip_gpu("test_custom_ar_watchdog", why)
                                                       : test_gpu_skip_status();
    ina_bootstrap_finalize(boot);
    return rc;
  }
  int rc = 1;
#ifdef INA_HAVE_CUDA
  const int ll = argc > 2 && strcmp(argv[1], "--algo") == 0 && strcmp(argv[2], "ll") == 0;
  rc = run(boot, ll ? INA_CUSTOM_AR_LL : INA_CUSTOM_AR_ONE_SHOT);
#endif
  ina_bootstrap_finalize(boot);
  return rc;
}
