/* Argument checks of ina_gemm_run, ina_gemm_query_path and the CPU reference: one place
 * that states every rule of gemm/gemm.h's "Constraints" section. */
#define INA_LOG_SUBSYS "gemm"
#include <string.h>

#include "core/check.h"
#include "gemm/gemm_internal.h"

#define MAX_DIM ((int64_t)1 << 31)
#define ALIGN_BYTES 16

size_t ina_gemm_out_size(ina_dtype_t dtype) { return dtype == INA_DTYPE_F32 ? 4 : 2; }

static int aligned16(const void *p) { return (uintptr_t)p % ALIGN_BYTES == 0; }

/* The device path's alignment rules (FP8 only; bf16 runs at any element alignment). */
static ina_status_t check_alignment(const ina_gemm_args_t *a, const char *who) {
  ina_status_t st = INA_OK;
  const size_t out_size = ina_gemm_out_size(a->out_dtype);
  if (a->mode != INA_GEMM_FP8_BLOCK) return INA_OK;
  INA_REQUIRE(aligned16(a->x) && aligned16(a->w) && aligned16(a->y) && aligned16(a->residual) &&
                  aligned16(a->x_scale) && aligned16(a->w_scale),
              INA_ERR_INVALID_ARGUMENT,
              "%s: FP8 needs 16-byte aligned x %p, w %p, y %p, residual %p, x_scale %p, w_scale %p",
              who, a->x, a->w, a->y, a->residual, (const void *)a->x_scale,
              (const void *)a->w_scale);
  INA_REQUIRE(a->ldx % ALIGN_BYTES == 0 && (a->ldy * (int64_t)out_size) % ALIGN_BYTES == 0 &&
                  (a->ldr * (int64_t)out_size) % ALIGN_BYTES == 0,
              INA_ERR_INVALID_ARGUMENT,
              "%s: FP8 row strides must be multiples of 16 bytes (ldx %lld, ldy %lld, ldr %lld "
              "elements of %zu bytes)",
              who, (long long)a->ldx, (long long)a->ldy, (long long)a->ldr, out_size);
fail:
  return st;
}

ina_status_t ina_gemm_check_args(const ina_gemm_args_t *args, const char *who, int checks,
                                 ina_gemm_args_t *out) {
  ina_status_t st = INA_OK;
  ina_gemm_args_t a;
  memset(&a, 0, sizeof a);
  INA_REQUIRE(args != NULL, INA_ERR_INVALID_ARGUMENT, "%s: args is NULL", who);
  INA_REQUIRE(args->struct_size >= INA_GEMM_ARGS_V1_SIZE && args->version >= 1,
              INA_ERR_INVALID_ARGUMENT,
              "%s: args struct_size %zu / version %u not from INA_GEMM_ARGS_INIT", who,
              args->struct_size, (unsigned)args->version);
  memcpy(&a, args, INA_GEMM_ARGS_V1_SIZE);
  a.struct_size = sizeof a;
  INA_REQUIRE(a.mode == INA_GEMM_BF16 || a.mode == INA_GEMM_FP8_BLOCK, INA_ERR_INVALID_ARGUMENT,
              "%s: unknown mode %d", who, (int)a.mode);
  INA_REQUIRE(a.path == INA_GEMM_PATH_AUTO || a.path == INA_GEMM_PATH_CUBLASLT ||
                  a.path == INA_GEMM_PATH_KERNEL,
              INA_ERR_INVALID_ARGUMENT, "%s: unknown path %d", who, (int)a.path);
  INA_REQUIRE(a.path != INA_GEMM_PATH_KERNEL || a.mode == INA_GEMM_FP8_BLOCK, INA_ERR_UNSUPPORTED,
              "%s: the kernel path exists for FP8 only (mode bf16)", who);
  INA_REQUIRE(a.out_dtype == INA_DTYPE_BF16 || a.out_dtype == INA_DTYPE_F32,
              INA_ERR_INVALID_ARGUMENT, "%s: output dtype %s is not bf16 or f32", who,
              ina_dtype_name(a.out_dtype));
  INA_REQUIRE(
      a.m >= 0 && a.m <= MAX_DIM && a.n >= 1 && a.n <= MAX_DIM && a.k >= 1 && a.k <= MAX_DIM,
      INA_ERR_INVALID_ARGUMENT, "%s: shape m %lld, n %lld, k %lld out of range", who,
      (long long)a.m, (long long)a.n, (long long)a.k);
  if (a.mode == INA_GEMM_FP8_BLOCK)
    INA_REQUIRE(a.n % 16 == 0 && a.k % 16 == 0, INA_ERR_INVALID_ARGUMENT,
                "%s: FP8 needs n (%lld) and k (%lld) to be multiples of 16", who, (long long)a.n,
                (long long)a.k);
  if (a.ldx == 0) a.ldx = a.k;
  if (a.ldy == 0) a.ldy = a.n;
  if (a.ldr == 0) a.ldr = a.n;
  INA_REQUIRE(a.ldx >= a.k && a.ldy >= a.n && a.ldr >= a.n, INA_ERR_INVALID_ARGUMENT,
              "%s: row strides ldx %lld, ldy %lld, ldr %lld are shorter than rows of k %lld / "
              "n %lld",
              who, (long long)a.ldx, (long long)a.ldy, (long long)a.ldr, (long long)a.k,
              (long long)a.n);
  INA_REQUIRE(a.residual != a.y || a.residual == NULL || a.ldr == a.ldy, INA_ERR_INVALID_ARGUMENT,
              "%s: an in-place residual (residual == y) needs ldr (%lld) == ldy (%lld)", who,
              (long long)a.ldr, (long long)a.ldy);
  if (a.m > 0 && (checks & INA_GEMM_CHECK_POINTERS)) {
    INA_REQUIRE(a.x && a.w && a.y, INA_ERR_INVALID_ARGUMENT, "%s: NULL x, w or y", who);
    INA_REQUIRE(a.mode != INA_GEMM_FP8_BLOCK || (a.x_scale && a.w_scale), INA_ERR_INVALID_ARGUMENT,
                "%s: FP8 needs x_scale and w_scale", who);
  }
  if (a.m > 0 && (checks & INA_GEMM_CHECK_ALIGNMENT)) INA_CHECK(check_alignment(&a, who));
  *out = a;
fail:
  return st;
}
