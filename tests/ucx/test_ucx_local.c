/* The UCX engine inside one process: CUDA detection, the device-memory path without a
 * usable GPU, and puts/gets to this process's own worker (UCX's self transport). */
#include <stdlib.h>
#include <string.h>
#include <ucs/memory/memory_type.h>

#include "comm/ucx_engine.h"
#include "core/cuda.h"
#include "core/log.h"
#include "tests/test_util.h"

static void test_cuda_detection_rule(void) {
  CHECK(ina_ucx_memory_types_have_cuda(1ull << UCS_MEMORY_TYPE_HOST) == 0);
  CHECK(ina_ucx_memory_types_have_cuda((1ull << UCS_MEMORY_TYPE_HOST) |
                                       (1ull << UCS_MEMORY_TYPE_CUDA)) == 1);
  CHECK(ina_ucx_memory_types_have_cuda(1ull << UCS_MEMORY_TYPE_CUDA_MANAGED) == 0);
  CHECK(ina_ucx_memory_types_have_cuda(1ull << UCS_MEMORY_TYPE_ROCM) == 0);
  CHECK(ina_ucx_memory_types_have_cuda(0) == 0);
}

static void test_device_region(ina_ucx_engine_t *e) {
  ina_ucx_region_t *r = (ina_ucx_region_t *)1;
  char fake_device[64];
  ina_status_t st = ina_ucx_region_register(e, fake_device, sizeof fake_device, INA_UCX_MEM_CUDA, &r);
  if (!ina_ucx_engine_has_cuda(e) && ina_cuda_device_count() == 0) {
    /* Staging needs a GPU to copy from; without one the engine must say so. */
    CHECKF(st == INA_ERR_UNSUPPORTED, "device region without a GPU: status %d", (int)st);
    CHECK(r == NULL);
    CHECKF(strstr(ina_last_error(), "no CUDA device") != NULL, "message: %s", ina_last_error());
  } else {
    printf("test_ucx_local: a GPU or CUDA-aware UCX is present; device path not exercised\n");
    if (st == INA_OK) ina_ucx_region_deregister(r);
  }
  r = (ina_ucx_region_t *)1;
  CHECK(ina_ucx_region_register(e, NULL, 64, INA_UCX_MEM_HOST, &r) == INA_ERR_INVALID_ARGUMENT);
  CHECK(r == NULL);
}

static void test_self_transfers(ina_ucx_engine_t *e, test_rng_t *rng) {
  enum { N = 1 << 16 };
  uint8_t *exposed = malloc(N), *local = malloc(N), *expect = malloc(N);
  for (size_t i = 0; i < N; i++) exposed[i] = expect[i] = (uint8_t)test_rng_next(rng);
  ina_ucx_region_t *region = NULL;
  CHECK_OK(ina_ucx_region_register(e, exposed, N, INA_UCX_MEM_HOST, &region));
  CHECK(!ina_ucx_region_is_staged(region));
  CHECK(ina_ucx_region_remote_base(region) == (uint64_t)(uintptr_t)exposed);
  void *blob = NULL;
  size_t size = 0;
  CHECK_OK(ina_ucx_engine_pack_blob(e, &region, 1, &blob, &size));
  ina_ucx_peer_t *self = NULL;
  CHECK_OK(ina_ucx_peer_connect(e, blob, size, &self));
  if (!self) goto out;
  uint64_t base = 0, length = 0;
  CHECK_OK(ina_ucx_peer_region(self, 0, &base, &length));
  CHECK(base == (uint64_t)(uintptr_t)exposed && length == N);
  CHECK(ina_ucx_peer_region(self, 1, &base, &length) == INA_ERR_INVALID_ARGUMENT);

  /* Get two random slices, then put random bytes into a third. */
  memset(local, 0x5A, N);
  size_t off1 = (size_t)test_rng_int(rng, 0, N / 2 - 1), len1 = (size_t)test_rng_int(rng, 1, N / 2);
  size_t off2 = (size_t)test_rng_int(rng, N / 2, N - 1);
  size_t len2 = N - off2;
  ina_ucx_xfer_t gets[2] = {{local, base + off1, len1}, {local + N / 2, base + off2, len2}};
  ina_ucx_batch_t *batch = NULL;
  CHECK_OK(ina_ucx_post(self, INA_UCX_GET, gets, 2, &batch));
  CHECK_OK(ina_ucx_batch_wait(batch, 10.0));
  ina_ucx_batch_destroy(batch);
  CHECK(memcmp(local, expect + off1, len1) == 0);
  CHECK(memcmp(local + N / 2, expect + off2, len2) == 0);

  for (size_t i = 0; i < N; i++) local[i] = (uint8_t)test_rng_next(rng);
  size_t off3 = (size_t)test_rng_int(rng, 0, N - 1), len3 = N - off3;
  ina_ucx_xfer_t put = {local, base + off3, len3};
  CHECK_OK(ina_ucx_post(self, INA_UCX_PUT, &put, 1, &batch));
  int done = 0;
  for (int i = 0; i < 1000000 && !done; i++) CHECK_OK(ina_ucx_batch_test(batch, &done));
  CHECK(done);
  ina_ucx_batch_destroy(batch);
  memcpy(expect + off3, local, len3);
  CHECK(memcmp(exposed, expect, N) == 0);

  /* A remote range outside every advertised region posts nothing. */
  ina_ucx_xfer_t outside = {local, base + N - 4, 8};
  batch = (ina_ucx_batch_t *)1;
  CHECK(ina_ucx_post(self, INA_UCX_GET, &outside, 1, &batch) == INA_ERR_INVALID_ARGUMENT);
  CHECK(batch == NULL);
  CHECK(strstr(ina_last_error(), "not inside any region") != NULL);
  CHECK_OK(ina_ucx_peer_flush(self, 10.0));

out:
  ina_ucx_peer_disconnect(self);
  /* A malformed blob leaves no peer behind. */
  ina_ucx_peer_t *bad = (ina_ucx_peer_t *)1;
  CHECK(ina_ucx_peer_connect(e, blob, size / 2, &bad) == INA_ERR_FORMAT);
  CHECK(bad == NULL);
  free(blob);
  ina_ucx_region_deregister(region);
  free(exposed);
  free(local);
  free(expect);
}

int main(void) {
  ina_log_set_quiet_errors(1);
  test_rng_t rng = {test_seed("test_ucx_local")};
  test_cuda_detection_rule();
  ina_ucx_engine_t *e = NULL;
  CHECK_OK(ina_ucx_engine_create(&e));
  if (e) {
    printf("test_ucx_local: UCX CUDA memory: %s\n",
           ina_ucx_engine_has_cuda(e) ? "supported" : "not supported (device regions staged)");
    test_device_region(e);
    test_self_transfers(e, &rng);
  }
  ina_ucx_engine_destroy(e);
  ina_ucx_engine_destroy(NULL);
  ina_ucx_region_deregister(NULL);
  ina_ucx_peer_disconnect(NULL);
  ina_ucx_batch_destroy(NULL);
  return test_finish("test_ucx_local");
}
