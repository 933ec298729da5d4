/* Dense GEMMs of the GPU forward pass: y[M, N] = x[M, K] . W[N, K]^T (+ beta * residual),
 * fp32 accumulation, in two modes:
 *   INA_GEMM_BF16        bf16 x, bf16 W.
 *   INA_GEMM_FP8_BLOCK   fp8 e4m3 x with one fp32 scale per 1 x 128 block, fp8 e4m3 W with
 *                        one fp32 scale per 128 x 128 block (the DeepSeek-V3 checkpoint
 *                        format: value = fp8 * scale_inv). FP8 weights stay FP8 on the
 *                        GPU; nothing is upcast at load.
 * The output is bf16 or fp32 (args.out_dtype); the optional residual has the output's
 * dtype (cuBLASLt reads C in D's type) and may be y itself (in-place accumulate).
 *
 * ---- Who computes what ------------------------------------------------------------
 * cuBLASLt is column-major, so the row-major product is taken transposed: y^T [N, M] =
 * W [N, K] . x^T [K, M], with A = W (stored K-major: op T), B = x (op N), D = y. That is
 * the "TN" form cuBLASLt's FP8 kernels require on sm_90.
 *   Few rows: a GEMM of 1..8 rows with 16-byte aligned operands takes ina's small-M kernel
 *          (gemm_small_m.cu: mma.sync with W as the 16-row operand, operands straight from
 *          global memory, K split across warps) when its weight is at most 16 MiB, or when
 *          it is FP8 with M % 4 != 0; measured to beat cuBLASLt there (gemm_internal.h says
 *          where the thresholds come from). The LM head stays on cuBLASLt.
 *   bf16:  otherwise cuBLASLt.
 *   FP8:   otherwise cuBLASLt's block-scaled mode (A: CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
 *          B: CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F; cuBLAS 12.9+, sm_90 only) needs its
 *          M and N (our N and M) to be multiples of 4. So the first M & ~3 rows go to
 *          cuBLASLt and the last M % 4 rows (all rows when M < 4) to ina's own kernel
 *          (mma.sync e4m3 m16n8k32, each 128-wide K block accumulated in fp32 and added to
 *          the main accumulator times scale_x[m, kb] * scale_w[n / 128, kb], as
 *          DeepGEMM does; split-K for small grids). When cuBLASLt finds no algorithm for
 *          a shape or refuses the call, the whole GEMM runs on the kernel. The kernel
 *          also serves M <= config.kernel_max_m and args.path = INA_GEMM_PATH_KERNEL.
 *          ina_gemm_query_path says which path a shape takes.
 *
 * ---- FP8 scale layouts (what cuBLASLt reads; the kernel reads the same) --------------
 * L = ceil(K / 128) K blocks; L4 = L rounded up to a multiple of 4.
 *   Weight scales: [ceil(N / 128), L4] row-major: scale of rows n/128, K block kb at
 *     w_scale[(n / 128) * L4 + kb] ("K-major, column stride a multiple of 4" in cuBLASLt's
 *     words). The checkpoint's weight_scale_inv is [ceil(N / 128), L] row-major, so the
 *     one-time transform at load, ina_gemm_pack_w_scales, only pads each row from L to
 *     L4 floats with zeros; for K a multiple of 512 (all DeepSeek-V3 shapes) it is a copy.
 *   Activation scales: M-major ("outer-dim-major"), as cuBLASLt's VEC128_32F wants for B,
 *     not the [M, L] row-major order ina_cuda_fp8_quantize_blocks writes. With M4 = M & ~3
 *     the buffer holds two M-major blocks: rows 0..M4-1 at x_scale[kb * M4 + m], then rows
 *     M4..M-1 at x_scale[M4 * L + kb * (M - M4) + (m - M4)]; M * L floats in all, and
 *     ina_gemm_x_scale_index computes it. ina_gemm_quantize_x writes x and its scales in
 *     this layout in one pass (bit-identical to ina_fp8_quantize_blocks with 1 x 128
 *     blocks); ina_gemm_pack_x_scales converts row-major scales on the host. The layout
 *     depends on M, so quantize and run with the same M.
 *
 * ---- Constraints (checked by ina_gemm_run; violations are INA_ERR_INVALID_ARGUMENT) ---
 *   M >= 0 (M == 0 does nothing), N >= 1, K >= 1. Row strides ldx, ldy, ldr in elements,
 *   0 meaning dense (K, N, N); W is dense ([N, K] contiguous).
 *   FP8: N and K multiples of 16 (cuBLASLt's 16-byte rule for 1-byte types); a ragged last
 *     128-block in N or K is allowed (the scale of a partial block covers what exists).
 *     x, W, y, residual and both scale pointers 16-byte aligned; ldx a multiple of 16,
 *     ldy and ldr multiples of 16 bytes.
 *   bf16: any shape and element-aligned pointers; 16-byte alignment of pointers and
 *     strides takes the cached algorithms, anything less a per-call heuristic query.
 *
 * ---- Shape of use --------------------------------------------------------------------
 * ina_gemm_create once per device and stream; at load ina_gemm_prepare for each
 * (mode, out dtype, N, K) the model uses, which picks cuBLASLt algorithms for power-of-
 * two M buckets up to config.max_m; then ina_gemm_run per GEMM. Run allocates nothing,
 * never waits on the host and can be captured in a CUDA graph. An unprepared shape also
 * runs, with cuBLASLt choosing per call (more host time per call).
 *
 * Ownership: the handle owns its cuBLASLt handle, workspaces and algorithm cache; the
 * caller owns every tensor. Thread safety: ina_gemm_prepare must not run concurrently
 * with anything else on the same handle. Runs through one handle share its workspaces,
 * so they must be ordered on one stream (or otherwise serialized on the device); use one
 * handle per concurrent stream. Run itself is safe to call from several host threads.
 * The host helpers (scale layouts, reference) are pure and thread-safe.
 *
 * Without CUDA in the build, the device functions return INA_ERR_UNSUPPORTED; the host
 * helpers and the CPU reference work everywhere. */
#ifndef INA_GEMM_GEMM_H
#define INA_GEMM_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_gemm ina_gemm_t;

typedef enum ina_gemm_mode {
  INA_GEMM_BF16 = 0,      /* bf16 x, bf16 W */
  INA_GEMM_FP8_BLOCK = 1, /* e4m3 x (1x128 scales), e4m3 W (128x128 scales) */
} ina_gemm_mode_t;

typedef enum ina_gemm_path {
  INA_GEMM_PATH_AUTO = 0,     /* cuBLASLt where it can, the kernel for the rest */
  INA_GEMM_PATH_CUBLASLT = 1, /* as AUTO, but a cuBLASLt refusal is an error */
  INA_GEMM_PATH_KERNEL = 2,   /* FP8 only: every row on ina's kernel */
} ina_gemm_path_t;

#define INA_GEMM_BLOCK 128 /* the FP8 scale block edge */

typedef struct ina_gemm_config {
  size_t struct_size;            /* sizeof(ina_gemm_config_t), set by the INIT macro */
  uint32_t version;              /* 1 */
  int32_t max_m;                 /* prepare picks algorithms for M buckets up to this; > 0 */
  int32_t max_shapes;            /* capacity of the algorithm cache, (mode, out, N, K) keys */
  int32_t kernel_max_m;          /* FP8 GEMMs with M <= this run on the kernel (0: only the
                                    rows cuBLASLt cannot take) */
  size_t workspace_bytes;        /* cuBLASLt workspace; 0: 32 MiB */
  size_t kernel_workspace_bytes; /* the kernel's split-K partial sums; 0: 8 MiB */
} ina_gemm_config_t;

#define INA_GEMM_CONFIG_INIT {sizeof(ina_gemm_config_t), 1, 16384, 64, 0, 0, 0}

typedef struct ina_gemm_args {
  size_t struct_size; /* sizeof(ina_gemm_args_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  ina_gemm_mode_t mode;
  ina_gemm_path_t path; /* AUTO unless testing or benchmarking a path */
  int64_t m, n, k;
  const void *x;         /* [m, k] bf16 or e4m3, row stride ldx; NULL only when m == 0 */
  int64_t ldx;           /* 0: k */
  const float *x_scale;  /* FP8: m * ceil(k/128) scales in the layout above; bf16: unused */
  const void *w;         /* [n, k] bf16 or e4m3, contiguous */
  const float *w_scale;  /* FP8: ina_gemm_w_scale_count(n, k) packed scales; bf16: unused */
  ina_dtype_t out_dtype; /* INA_DTYPE_BF16 or INA_DTYPE_F32 */
  void *y;               /* [m, n] of out_dtype, row stride ldy */
  int64_t ldy;           /* 0: n */
  const void *residual;  /* NULL, or [m, n] of out_dtype, row stride ldr; may equal y (then
                            ldr must equal ldy) */
  int64_t ldr;           /* 0: n */
  float beta;            /* y = x . W^T + beta * residual (ignored without a residual) */
  void *stream;          /* a cudaStream_t; NULL = legacy default stream */
} ina_gemm_args_t;

#define INA_GEMM_ARGS_INIT                                                                   \
  {sizeof(ina_gemm_args_t), 1, INA_GEMM_BF16, INA_GEMM_PATH_AUTO, 0, 0, 0, NULL, 0, NULL,    \
   NULL, NULL, INA_DTYPE_BF16, NULL, 0, NULL, 0, 1.0f, NULL}

/* Which rows of a GEMM go where (ina_gemm_query_path). */
typedef struct ina_gemm_path_info {
  int64_t cublaslt_rows; /* the first rows, through cuBLASLt */
  int64_t kernel_rows;   /* the remaining rows, through ina's kernel */
  int32_t kernel_tile_m; /* the kernel's rows per CTA tile (0 when unused) */
  int32_t kernel_splits; /* the kernel's split-K factor (0 when unused) */
  char description[128]; /* e.g. "cuBLASLt 64 rows" or "cuBLASLt 36 rows + kernel 1 row" */
} ina_gemm_path_info_t;

/* ---- handle (device) ---------------------------------------------------------------- */

/* On the current CUDA device. config NULL = INA_GEMM_CONFIG_INIT. INA_ERR_UNSUPPORTED
 * without a device or without CUDA in the build; *out = NULL on failure. */
ina_status_t ina_gemm_create(const ina_gemm_config_t *config, ina_gemm_t **out);
/* NULL is a no-op. Waits for nothing: the caller must have finished the handle's work. */
void ina_gemm_destroy(ina_gemm_t *h);

/* Load-time: picks and caches cuBLASLt algorithms for (mode, out_dtype, n, k) at every M
 * bucket (powers of two up to config.max_m) with dense 16-byte aligned operands.
 * Idempotent. INA_ERR_UNSUPPORTED when the cache is full (config.max_shapes). */
ina_status_t ina_gemm_prepare(ina_gemm_t *h, ina_gemm_mode_t mode, ina_dtype_t out_dtype, int64_t n,
                              int64_t k);

/* Enqueues the GEMM of `args` on args->stream (see the header comment). Asynchronous; a
 * fault during execution shows at the next synchronization. */
ina_status_t ina_gemm_run(const ina_gemm_t *h, const ina_gemm_args_t *args);

/* The path ina_gemm_run takes for args' mode, path, out_dtype, m, n and k (pointers and
 * strides are ignored; dense, aligned operands are assumed). Host only; asks cuBLASLt's
 * heuristic for the exact shape. */
ina_status_t ina_gemm_query_path(const ina_gemm_t *h, const ina_gemm_args_t *args,
                                 ina_gemm_path_info_t *info);

/* ---- FP8 activations (device) ------------------------------------------------------- */

/* Quantizes bf16 x [m, k] (row stride ldx elements, 0 = k) to e4m3 q [m, k] (row stride
 * ldq bytes, 0 = k) with 1 x 128 blocks, writing the scales in the layout above. Bytes and
 * scales equal ina_fp8_quantize_blocks(x as f32, m, k, 1, 128) (core/fp8_quant_rule.h).
 * k a multiple of 16; x 16-byte aligned, ldx a multiple of 8; q and x_scale 16-byte
 * aligned, ldq a multiple of 16. Asynchronous on `stream`; allocates nothing;
 * graph-capturable. m == 0 enqueues nothing. */
ina_status_t ina_gemm_quantize_x(const uint16_t *x, int64_t ldx, int64_t m, int64_t k, uint8_t *q,
                                 int64_t ldq, float *x_scale, void *stream);

/* ---- FP8 scale layouts (host, pure) ------------------------------------------------- */

/* Floats of the packed weight scales: ceil(n/128) * L4. 0 for a non-positive dim. */
int64_t ina_gemm_w_scale_count(int64_t n, int64_t k);
/* The load-time transform: checkpoint scale_inv [ceil(n/128), ceil(k/128)] row-major ->
 * [ceil(n/128), L4] row-major, the padding zero. Host memory; src and dst must not
 * overlap. */
ina_status_t ina_gemm_pack_w_scales(const float *scale_inv, int64_t n, int64_t k, float *out);

/* Floats of the activation scales: m * ceil(k/128). */
int64_t ina_gemm_x_scale_count(int64_t m, int64_t k);
/* Index of the scale of row `row`, K block `kblock` in the activation-scale layout of an
 * [m, k] matrix; -1 when out of range. */
int64_t ina_gemm_x_scale_index(int64_t m, int64_t k, int64_t row, int64_t kblock);
/* Row-major [m, ceil(k/128)] scales (as ina_fp8_quantize_blocks writes) -> the layout
 * above. Host memory; no overlap. */
ina_status_t ina_gemm_pack_x_scales(const float *row_major, int64_t m, int64_t k, float *out);

/* ---- CPU reference (host pointers) ---------------------------------------------------- */

/* Row `row` of x . W^T + beta * residual in double, unrounded, into out[0..n-1]. FP8
 * operands are dequantized exactly (fp8 * scale in double). Same argument checks as
 * ina_gemm_run except alignment. */
ina_status_t ina_gemm_ref_row(const ina_gemm_args_t *args, int64_t row, double *out);
/* The whole GEMM into args->y, rounded to fp32 and then to out_dtype (nearest even). */
ina_status_t ina_gemm_ref(const ina_gemm_args_t *args);

#ifdef __cplusplus
}
#endif
#endif
