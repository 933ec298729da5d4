/* Tensor descriptors: wrap, alloc/release, sizes, contiguity, describe, validation. */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "core/cuda.h"
#include "core/log.h"
#include "core/tensor.h"
#include "tests/test_util.h"

static int is_all_zero(const ina_tensor_t *t) {
  const unsigned char *p = (const unsigned char *)t;
  for (size_t i = 0; i < sizeof *t; i++)
    if (p[i]) return 0;
  return 1;
}

static void test_wrap(void) {
  float storage[2 * 3 * 4];
  const int64_t shape[3] = {2, 3, 4};
  ina_tensor_t t = ina_tensor_wrap(storage, INA_DTYPE_F32, 3, shape, INA_CPU);
  CHECK(t.data == storage && !t.owns_data && t.ndim == 3 && t.dtype == INA_DTYPE_F32);
  CHECK(t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 4);
  CHECK(t.stride[0] == 12 && t.stride[1] == 4 && t.stride[2] == 1);
  CHECK(ina_tensor_numel(&t) == 24);
  CHECK(ina_tensor_nbytes(&t) == sizeof storage);
  CHECK(ina_tensor_is_contiguous(&t));
  CHECK(!ina_tensor_is_empty(&t));
  /* Releasing a wrapped tensor frees nothing (ASan would catch a free of the stack) and
   * resets it. */
  ina_tensor_release(&t);
  CHECK(ina_tensor_is_empty(&t) && is_all_zero(&t));

  /* Scalar: rank 0 with data has one element. */
  float one = 1.0f;
  ina_tensor_t s = ina_tensor_wrap(&one, INA_DTYPE_F32, 0, NULL, INA_CPU);
  CHECK(!ina_tensor_is_empty(&s) && ina_tensor_numel(&s) == 1 && ina_tensor_nbytes(&s) == 4);

  /* Byte sizes follow the dtype. */
  const int64_t v[1] = {10};
  for (int d = 0; d < INA_DTYPE_COUNT; d++) {
    ina_tensor_t w = ina_tensor_wrap(storage, (ina_dtype_t)d, 1, v, INA_CPU);
    CHECK(ina_tensor_nbytes(&w) == 10 * ina_dtype_size((ina_dtype_t)d));
  }

  /* Zero dims: no elements, still contiguous, strides stay meaningful. */
  const int64_t z[3] = {4, 0, 5};
  ina_tensor_t zt = ina_tensor_wrap(NULL, INA_DTYPE_BF16, 3, z, INA_CPU);
  CHECK(zt.ndim == 3 && ina_tensor_numel(&zt) == 0 && ina_tensor_nbytes(&zt) == 0);
  CHECK(zt.stride[2] == 1 && zt.stride[1] == 5 && zt.stride[0] == 5);
  CHECK(ina_tensor_is_contiguous(&zt));

  /* Invalid descriptions give an empty tensor and record why. */
  ina_log_set_quiet_errors(1);
  const int64_t neg[2] = {3, -1};
  ina_tensor_t bad = ina_tensor_wrap(storage, INA_DTYPE_F32, 2, neg, INA_CPU);
  CHECK(ina_tensor_is_empty(&bad));
  CHECK(strstr(ina_last_error(), "-1") != NULL);
  const int64_t six[6] = {1, 1, 1, 1, 1, 1};
  bad = ina_tensor_wrap(storage, INA_DTYPE_F32, 6, six, INA_CPU);
  CHECK(ina_tensor_is_empty(&bad));
  bad = ina_tensor_wrap(storage, INA_DTYPE_COUNT, 1, v, INA_CPU);
  CHECK(ina_tensor_is_empty(&bad));
  ina_log_set_quiet_errors(0);
}

static void test_alloc(uint64_t seed) {
  test_rng_t rng = {seed};
  for (int iter = 0; iter < 50; iter++) {
    int ndim = (int)test_rng_int(&rng, 0, INA_MAX_DIMS);
    int64_t shape[INA_MAX_DIMS];
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
      shape[i] = test_rng_int(&rng, 0, 7);
      numel *= shape[i];
    }
    ina_dtype_t dt = (ina_dtype_t)test_rng_int(&rng, 0, INA_DTYPE_COUNT - 1);
    ina_tensor_t t;
    CHECK_OK(ina_tensor_alloc(&t, dt, ndim, shape, INA_CPU));
    CHECK(t.data != NULL && t.owns_data && t.ndim == ndim && t.dtype == dt);
    CHECK(((uintptr_t)t.data & 63) == 0);
    CHECK(ina_tensor_numel(&t) == numel);
    CHECK(ina_tensor_nbytes(&t) == (size_t)numel * ina_dtype_size(dt));
    CHECK(ina_tensor_is_contiguous(&t));
    for (int i = 0; i < ndim; i++) CHECK(t.shape[i] == shape[i]);
    /* The whole buffer is writable (ASan checks the bounds). */
    memset(t.data, 0x5A, ina_tensor_nbytes(&t));
    ina_tensor_release(&t);
    CHECK(is_all_zero(&t));
  }
  ina_tensor_release(NULL);
  ina_tensor_t empty = {0};
  ina_tensor_release(&empty);
  CHECK(ina_tensor_is_empty(&empty));
  CHECK(ina_tensor_is_empty(NULL) && ina_tensor_numel(NULL) == 0 && ina_tensor_nbytes(NULL) == 0);

  ina_log_set_quiet_errors(1);
  ina_tensor_t t;
  memset(&t, 0x33, sizeof t);
  const int64_t ok_shape[2] = {4, 4};
  CHECK(ina_tensor_alloc(&t, INA_DTYPE_F32, -1, ok_shape, INA_CPU) == INA_ERR_INVALID_ARGUMENT);
  CHECK(is_all_zero(&t));
  memset(&t, 0x33, sizeof t);
  CHECK(ina_tensor_alloc(&t, INA_DTYPE_F32, INA_MAX_DIMS + 1, ok_shape, INA_CPU) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(is_all_zero(&t));
  CHECK(ina_tensor_alloc(&t, INA_DTYPE_F32, 2, NULL, INA_CPU) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_tensor_alloc(&t, (ina_dtype_t)99, 2, ok_shape, INA_CPU) == INA_ERR_INVALID_ARGUMENT);
  const int64_t negative[3] = {2, -3, 4};
  CHECK(ina_tensor_alloc(&t, INA_DTYPE_F32, 3, negative, INA_CPU) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "-3") != NULL);
  CHECK(is_all_zero(&t));
  /* Sizes whose byte count overflows, also when a later dim is zero. */
  const int64_t huge[2] = {INT64_MAX / 2, 3};
  CHECK(ina_tensor_alloc(&t, INA_DTYPE_F32, 2, huge, INA_CPU) == INA_ERR_INVALID_ARGUMENT);
  const int64_t huge_i64[1] = {INT64_MAX / 4};
  CHECK(ina_tensor_alloc(&t, INA_DTYPE_I64, 1, huge_i64, INA_CPU) == INA_ERR_INVALID_ARGUMENT);
  const int64_t huge_then_zero[3] = {INT64_MAX, INT64_MAX, 0};
  CHECK(ina_tensor_alloc(&t, INA_DTYPE_F32, 3, huge_then_zero, INA_CPU) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(is_all_zero(&t));
  ina_device_t bogus = {(ina_device_type_t)7, 0};
  CHECK(ina_tensor_alloc(&t, INA_DTYPE_F32, 2, ok_shape, bogus) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_tensor_alloc(NULL, INA_DTYPE_F32, 2, ok_shape, INA_CPU) == INA_ERR_INVALID_ARGUMENT);

  /* CUDA: allocates when a device is present, fails cleanly otherwise. */
  ina_device_t gpu = {INA_DEVICE_CUDA, 0};
  ina_status_t st = ina_tensor_alloc(&t, INA_DTYPE_BF16, 2, ok_shape, gpu);
  if (ina_cuda_device_count() > 0) {
    CHECK(st == INA_OK && t.data != NULL && t.owns_data && t.device.type == INA_DEVICE_CUDA);
  } else {
    CHECK(st != INA_OK);
    CHECK(is_all_zero(&t));
  }
  ina_tensor_release(&t);
  CHECK(is_all_zero(&t));
  ina_device_t negative_gpu = {INA_DEVICE_CUDA, -1};
  CHECK(ina_tensor_alloc(&t, INA_DTYPE_BF16, 2, ok_shape, negative_gpu) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
}

static void test_contiguity(void) {
  float storage[64];
  const int64_t shape[3] = {2, 3, 4};
  ina_tensor_t t = ina_tensor_wrap(storage, INA_DTYPE_F32, 3, shape, INA_CPU);
  /* A transposed view of the last two dims. */
  ina_tensor_t tr = t;
  tr.shape[1] = 4;
  tr.shape[2] = 3;
  tr.stride[1] = 1;
  tr.stride[2] = 4;
  CHECK(!ina_tensor_is_contiguous(&tr));
  CHECK(ina_tensor_numel(&tr) == 24);
  /* A row-sliced view (every other row) is not contiguous... */
  ina_tensor_t sl = t;
  sl.shape[1] = 2;
  sl.stride[1] = 8;
  CHECK(!ina_tensor_is_contiguous(&sl));
  /* ...but the stride of a size-1 dim does not matter. */
  ina_tensor_t one = t;
  one.shape[0] = 1;
  one.stride[0] = 999;
  CHECK(ina_tensor_is_contiguous(&one));
}

static void test_describe(void) {
  char buf[128];
  const int64_t shape[2] = {128, 512};
  ina_tensor_t t = ina_tensor_wrap(NULL, INA_DTYPE_BF16, 2, shape, INA_CPU);
  CHECK(strcmp(ina_tensor_describe(&t, buf, sizeof buf), "bf16[128, 512]") == 0);
  const int64_t v[1] = {7};
  t = ina_tensor_wrap(NULL, INA_DTYPE_FP8_E4M3, 1, v, INA_CPU);
  CHECK(strcmp(ina_tensor_describe(&t, buf, sizeof buf), "fp8_e4m3[7]") == 0);
  float x = 0;
  t = ina_tensor_wrap(&x, INA_DTYPE_F32, 0, NULL, INA_CPU);
  CHECK(strcmp(ina_tensor_describe(&t, buf, sizeof buf), "f32[]") == 0);
  ina_tensor_t empty = {0};
  CHECK(strcmp(ina_tensor_describe(&empty, buf, sizeof buf), "empty") == 0);
  CHECK(strcmp(ina_tensor_describe(NULL, buf, sizeof buf), "empty") == 0);

  ina_device_t gpu = {INA_DEVICE_CUDA, 1};
  t = ina_tensor_wrap(NULL, INA_DTYPE_F16, 2, shape, gpu);
  CHECK(strcmp(ina_tensor_describe(&t, buf, sizeof buf), "f16[128, 512] on cuda:1") == 0);
  t = ina_tensor_wrap(NULL, INA_DTYPE_F32, 2, shape, INA_CPU);
  t.shape[0] = 512;
  t.shape[1] = 128;
  t.stride[0] = 1;
  t.stride[1] = 512;
  CHECK(strcmp(ina_tensor_describe(&t, buf, sizeof buf), "f32[512, 128] stride [1, 512]") == 0);

  /* Truncation stays inside the buffer and NUL-terminated. */
  char small[8];
  memset(small, 'x', sizeof small);
  const int64_t big[5] = {123456, 234567, 3, 4, 5};
  t = ina_tensor_wrap(NULL, INA_DTYPE_BF16, 5, big, INA_CPU);
  CHECK(ina_tensor_describe(&t, small, sizeof small) == small);
  CHECK(strlen(small) == sizeof small - 1 && strncmp(small, "bf16[12", 7) == 0);
  CHECK(ina_tensor_describe(&t, NULL, 0) == NULL);
  char one_byte[1] = {'x'};
  ina_tensor_describe(&t, one_byte, 1);
  CHECK(one_byte[0] == '\0');
}

int main(void) {
  uint64_t seed = test_seed("test_tensor");
  test_wrap();
  test_alloc(seed);
  test_contiguity();
  test_describe();
  return test_finish("test_tensor");
}
