/* The NCCL backend on GPUs, under mpirun with 2 ranks: all-reduce (f32, bf16) and
 * all-to-all-v on device buffers against fp64 references. Skipped (77)
 * without a GPU, with fewer GPUs than ranks on a node, or without NCCL in the build. */
#include <string.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/cuda.h"
#include "tests/comm/comm_test_data.h"

static int g_rank, g_size;

static void check_all_reduce(ina_comm_t *c, int dev, uint64_t seed, size_t n, ina_dtype_t dtype) {
  int bf = dtype == INA_DTYPE_BF16;
  size_t eb = ina_dtype_size(dtype);
  float *vals = malloc(n * sizeof(float));
  double *ref = calloc(n, sizeof(double));
  void *host = malloc(n * eb), *d = NULL;
  for (int r = 0; r < g_size; r++) {
    comm_test_fill(vals, n, seed, r, n, bf);
    for (size_t i = 0; i < n; i++) ref[i] += vals[i];
  }
  comm_test_fill(vals, n, seed, g_rank, n, bf);
  ina_from_f32(vals, host, dtype, n);
  CHECK_OK(ina_cuda_malloc(dev, n * eb, &d));
  CHECK_OK(ina_cuda_memcpy_h2d(d, host, n * eb));
  CHECK_OK(ina_comm_all_reduce(c, d, d, n, dtype, NULL));
  CHECK_OK(ina_comm_sync(c, NULL));
  memset(host, 0xff, n * eb);
  CHECK_OK(ina_cuda_memcpy_d2h(host, d, n * eb));
  ina_to_f32(host, dtype, vals, n);
  float *reff = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) reff[i] = (float)ref[i];
  double e = test_rel_l2(vals, reff, n);
  CHECKF(e <= (bf ? 1e-2 : 1e-5), "nccl all_reduce n=%zu %s: rel err %g", n,
         ina_dtype_name(dtype), e);
  ina_cuda_free(d);
  free(reff);
  free(host);
  free(ref);
  free(vals);
}

static void check_all_to_all(ina_comm_t *c, int dev) {
  size_t sc[8], rc[8], stot = 0, rtot = 0;
  for (int p = 0; p < g_size; p++) {
    sc[p] = (size_t)(1 + g_rank + 3 * p); /* rank s sends 1 + s + 3d to rank d */
    rc[p] = (size_t)(1 + p + 3 * g_rank);
    stot += sc[p];
    rtot += rc[p];
  }
  int32_t *hs = malloc(stot * 4), *hr = malloc(rtot * 4);
  void *ds = NULL, *dr = NULL;
  for (size_t i = 0, p = 0, k = 0; p < (size_t)g_size; p++)
    for (k = 0; k < sc[p]; k++) hs[i++] = (int32_t)(g_rank * 100000 + (int)p * 1000 + (int)k);
  CHECK_OK(ina_cuda_malloc(dev, stot * 4, &ds));
  CHECK_OK(ina_cuda_malloc(dev, rtot * 4, &dr));
  CHECK_OK(ina_cuda_memcpy_h2d(ds, hs, stot * 4));
  CHECK_OK(ina_comm_all_to_all_v(c, ds, sc, NULL, dr, rc, NULL, INA_DTYPE_I32, NULL));
  CHECK_OK(ina_comm_sync(c, NULL));
  CHECK_OK(ina_cuda_memcpy_d2h(hr, dr, rtot * 4));
  size_t bad = 0;
  for (size_t i = 0, p = 0, k = 0; p < (size_t)g_size; p++)
    for (k = 0; k < rc[p]; k++) bad += hr[i++] != (int32_t)((int)p * 100000 + g_rank * 1000 + (int)k);
  CHECKF(bad == 0, "nccl all_to_all_v: %zu wrong elements", bad);
  ina_cuda_free(ds);
  ina_cuda_free(dr);
  free(hs);
  free(hr);
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  int dev = ina_bootstrap_device(boot);
  /* NCCL needs a GPU of its own for every rank of a node. */
  const int too_few_gpus = dev >= 0 && ina_bootstrap_local_size(boot) > ina_cuda_device_count();
  if (dev < 0 || !ina_comm_have_nccl() || too_few_gpus || ina_bootstrap_world_size(boot) > 8) {
    if (ina_bootstrap_world_rank(boot) == 0)
      printf("test_comm_nccl: skipped (%s)\n", dev < 0              ? "no CUDA device"
                                               : too_few_gpus       ? "fewer GPUs than ranks on this node"
                                               : !ina_comm_have_nccl() ? "no NCCL in this build"
                                                                       : "more than 8 ranks");
    ina_bootstrap_finalize(boot);
    return TEST_SKIP;
  }
  ina_comm_t *c = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_NCCL, &c));
  if (c) {
    g_rank = ina_comm_rank(c);
    g_size = ina_comm_size(c);
    uint64_t seed = comm_test_seed("test_comm_nccl");
    const size_t sizes[] = {1, 1001, (size_t)1 << 22};
    for (size_t k = 0; k < 3; k++) {
      check_all_reduce(c, dev, seed, sizes[k], INA_DTYPE_F32);
      check_all_reduce(c, dev, seed, sizes[k], INA_DTYPE_BF16);
    }
    check_all_to_all(c, dev);
    CHECK_OK(ina_comm_barrier(c, NULL));
  }
  ina_comm_destroy(c);
  int rc = test_finish("test_comm_nccl");
  ina_bootstrap_finalize(boot);
  return rc;
}
