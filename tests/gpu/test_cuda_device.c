/* core/cuda.h on any machine: the device count never fails, ina_cuda_no_device_reason
 * says why it is 0 (and only then), and without a device every call that needs one says
 * INA_ERR_UNSUPPORTED and leaves a message; with a device, allocation, copies and
 * synchronization work and bad arguments are refused. Under INA_REQUIRE_GPU=1 (a GPU
 * machine) no device is a failure: the device path must be the one tested. */

#include "tests/gpu_test_util.h"

#include <stdint.h>
#include <string.h>

#include "core/cuda.h"
#include "core/log.h"

#define POISON_PTR ((void *)(uintptr_t)0x1)

/* The status must be `expect` and the last error must name `fn`. */
static void expect_error(ina_status_t st, ina_status_t expect, const char *fn) {
  CHECKF(st == expect, "%s: status %d (%s), expected %d (%s)", fn, (int)st,
         ina_status_string(st), (int)expect, ina_status_string(expect));
  CHECKF(strstr(ina_last_error(), fn) != NULL, "%s: last error \"%s\" does not name it", fn,
         ina_last_error());
}

/* A reason exactly when there is no device; truncated, never overrun. */
static void test_no_device_reason(int count) {
  char buf[256], small[8];
  const char *why = ina_cuda_no_device_reason(buf, sizeof buf);
  CHECK(ina_cuda_no_device_reason(NULL, 16) == NULL);
  CHECK(ina_cuda_no_device_reason(buf, 0) == NULL);
  if (count > 0) {
    CHECKF(why == NULL, "%d devices, yet a reason: %s", count, why);
    return;
  }
  CHECK(why == buf && strlen(buf) > 0);
  if (why) printf("no device: %s\n", why);
  memset(small, 'x', sizeof small);
  CHECK(ina_cuda_no_device_reason(small, 5) == small && strlen(small) == 4 && small[5] == 'x');
  if (test_gpu_required()) CHECKF(0, "INA_REQUIRE_GPU is set, and there is no CUDA device: %s", why);
}

/* The skip rule of tests/test_util.h and tests/gpu_test_util.h: fewer GPUs than asked
 * for gives a reason, and INA_REQUIRE_GPU turns the skip into a failure. */
static void test_skip_rule(int count) {
  char buf[256];
  CHECK(test_gpus_missing(0, buf, sizeof buf) == NULL);
  CHECK(test_gpus_missing(count, buf, sizeof buf) == NULL);
  CHECK(test_require_gpus("test_cuda_device", count) == 0);
  const char *why = test_gpus_missing(count + 1, buf, sizeof buf);
  CHECK(why == buf && strlen(buf) > 0);
  if (why && count > 0) CHECKF(strstr(why, "visible") != NULL, "reason: %s", why);
  const char *env = getenv("INA_REQUIRE_GPU");
  char saved[64];
  snprintf(saved, sizeof saved, "%s", env ? env : "");
  setenv("INA_REQUIRE_GPU", "1", 1);
  CHECK(test_gpu_required() && test_gpu_skip_status() == 1);
  setenv("INA_REQUIRE_GPU", "0", 1);
  CHECK(!test_gpu_required() && test_gpu_skip_status() == TEST_SKIP);
  setenv("INA_REQUIRE_GPU", "", 1);
  CHECK(!test_gpu_required() && test_gpu_skip_status() == TEST_SKIP);
  unsetenv("INA_REQUIRE_GPU");
  CHECK(!test_gpu_required() && test_gpu_skip_status() == TEST_SKIP);
  if (env) setenv("INA_REQUIRE_GPU", saved, 1);
}

static void test_name_edge_cases(int count) {
  char buf[128];
  CHECK(strcmp(ina_cuda_device_name(0, NULL, 0), "none") == 0);
  CHECK(strcmp(ina_cuda_device_name(0, buf, 0), "none") == 0);
  CHECK(ina_cuda_device_name(-1, buf, sizeof buf) == buf && strcmp(buf, "none") == 0);
  CHECK(ina_cuda_device_name(count, buf, sizeof buf) == buf && strcmp(buf, "none") == 0);
  /* A short buffer is truncated, never overrun. */
  memset(buf, 'x', sizeof buf);
  CHECK(ina_cuda_device_name(-1, buf, 3) == buf && strcmp(buf, "no") == 0 && buf[3] == 'x');
}

static void test_without_device(void) {
  char buf[64];
  void *p = POISON_PTR;
  CHECK(strcmp(ina_cuda_device_name(0, buf, sizeof buf), "none") == 0);

  ina_clear_error();
  expect_error(ina_cuda_malloc(0, 1024, &p), INA_ERR_UNSUPPORTED, "ina_cuda_malloc");
  CHECK(p == NULL);
  p = POISON_PTR;
  expect_error(ina_cuda_malloc(0, 0, &p), INA_ERR_UNSUPPORTED, "ina_cuda_malloc");
  CHECK(p == NULL);

  ina_clear_error();
  expect_error(ina_cuda_memcpy_h2d(buf, buf, sizeof buf), INA_ERR_UNSUPPORTED,
               "ina_cuda_memcpy_h2d");
  ina_clear_error();
  expect_error(ina_cuda_memcpy_d2h(buf, buf, sizeof buf), INA_ERR_UNSUPPORTED,
               "ina_cuda_memcpy_d2h");
  ina_clear_error();
  expect_error(ina_cuda_synchronize(), INA_ERR_UNSUPPORTED, "ina_cuda_synchronize");
  ina_cuda_free(NULL);
}

static void test_with_device(int count, test_rng_t *rng) {
  char name[128];
  void *p = POISON_PTR;
  enum { N = 1 << 18 };
  uint32_t *host = malloc(N * sizeof *host), *back = malloc(N * sizeof *back);
  CHECK(host && back);
  if (!host || !back) goto done;

  ina_cuda_device_name(0, name, sizeof name);
  printf("device 0 of %d: %s\n", count, name);
  CHECKF(strstr(name, "sm_") != NULL && strstr(name, "SMs") != NULL, "name \"%s\"", name);

  ina_clear_error();
  expect_error(ina_cuda_malloc(count, 1024, &p), INA_ERR_INVALID_ARGUMENT, "ina_cuda_malloc");
  CHECK(p == NULL);
  p = POISON_PTR;
  expect_error(ina_cuda_malloc(-1, 1024, &p), INA_ERR_INVALID_ARGUMENT, "ina_cuda_malloc");
  CHECK(p == NULL);
  expect_error(ina_cuda_malloc(0, 1024, NULL), INA_ERR_INVALID_ARGUMENT, "ina_cuda_malloc");
  /* Far more than any GPU has: a clean out-of-memory, not a CUDA error. */
  p = POISON_PTR;
  expect_error(ina_cuda_malloc(0, (size_t)1 << 50, &p), INA_ERR_OUT_OF_MEMORY, "cudaMalloc");
  CHECK(p == NULL);
  p = POISON_PTR;
  CHECK_OK(ina_cuda_malloc(0, 0, &p));
  CHECK(p == NULL);

  /* Round trip of fresh random data through the device. */
  CHECK_OK(ina_cuda_malloc(0, N * sizeof *host, &p));
  CHECK(p != NULL);
  if (p) {
    for (size_t i = 0; i < N; i++) host[i] = (uint32_t)test_rng_next(rng);
    memset(back, 0, N * sizeof *back);
    CHECK_OK(ina_cuda_memcpy_h2d(p, host, N * sizeof *host));
    CHECK_OK(ina_cuda_synchronize());
    CHECK_OK(ina_cuda_memcpy_d2h(back, p, N * sizeof *back));
    CHECK(memcmp(host, back, N * sizeof *host) == 0);
    CHECK_OK(ina_cuda_memcpy_h2d(p, host, 0));
    CHECK_OK(ina_cuda_memcpy_d2h(NULL, NULL, 0));
    ina_clear_error();
    expect_error(ina_cuda_memcpy_h2d(p, NULL, 16), INA_ERR_INVALID_ARGUMENT,
                 "ina_cuda_memcpy_h2d");
    ina_clear_error();
    expect_error(ina_cuda_memcpy_d2h(NULL, p, 16), INA_ERR_INVALID_ARGUMENT,
                 "ina_cuda_memcpy_d2h");
    ina_cuda_free(p);
  }
  /* The failures above must not leave an error behind for the next call. */
  CHECK_OK(ina_cuda_synchronize());
  ina_cuda_free(NULL);
done:
  free(host);
  free(back);
}

int main(void) {
  test_rng_t rng = {test_seed("test_cuda_device")};
  int count = ina_cuda_device_count();
  printf("CUDA devices: %d\n", count);
  CHECK(count >= 0);
  CHECK(ina_cuda_device_count() == count); /* asking again changes nothing */

  ina_log_set_quiet_errors(1);
  test_no_device_reason(count);
  test_skip_rule(count);
  test_name_edge_cases(count);
  if (count == 0) test_without_device();
  else test_with_device(count, &rng);
  ina_log_set_quiet_errors(0);
  return test_finish("test_cuda_device");
}
