/* Random device data for the benchmarks (bench/bench_util.h): generated on the device, so
 * filling gigabytes costs milliseconds, not a host loop and a copy. */
#define INA_LOG_SUBSYS "bench"
#include <cuda_bf16.h>

#include "bench/bench_util.h"
#include "core/cuda_check.h"

/* splitmix64 finalizer: index -> well-mixed 64 bits. */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_random_bf16_kernel(uint16_t *out, size_t n, uint64_t seed, float scale) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull * (i + 1));
    /* 24 random bits -> odd multiple of 2^-24 in (-1, 1): never zero. */
    const float u = (float)((int32_t)(h >> 40) - (1 << 23)) * 0x1p-23f + 0x1p-24f;
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(u * scale));
  }
}

extern "C" ina_status_t ina_bench_fill_random_bf16(uint16_t *dev, size_t n, uint64_t seed,
                                                   float scale) {
  ina_status_t st = INA_OK;
  int sms = 0, device = 0;
  if (n == 0) return INA_OK;
  INA_REQUIRE(dev != NULL, INA_ERR_INVALID_ARGUMENT, "ina_bench_fill_random_bf16: NULL buffer");
  INA_CUDA_CHECK(cudaGetDevice(&device));
  INA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  fill_random_bf16_kernel<<<sms * 8, 256>>>(dev, n, seed, scale);
  INA_CUDA_CHECK_LAUNCH();
  INA_CUDA_CHECK(cudaDeviceSynchronize());
fail:
  return st;
}
