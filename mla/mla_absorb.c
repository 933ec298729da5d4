/* The absorption GEMMs of mla/mla_absorb.h over cuBLASLt.
 *
 * cuBLASLt is column-major, so each row-major product is computed transposed: a
 * row-major [T, N] output with row stride ld is the column-major [N, T] matrix with
 * leading dimension ld, and the heads are the batch.
 *   absorb_q: q_abs^T [C, T] = W_UK[h]^T [C, nope] . q_nope^T [nope, T]
 *             W_UK[h] row-major [nope, C] is column-major [C, nope] (ld C): op N.
 *   absorb_v: out^T [v, T]   = W_UV[h] [v, C] . o^T [C, T]
 *             W_UV[h] row-major [v, C] is column-major [C, v] (ld C): op T.
 * Both weights step by (nope + v) * C elements from head to head.
 *
 * Matrix layouts are built per call on the stack (cublasLtMatrixLayoutInit, no heap), so
 * a call allocates nothing and the handle stays read-only after create. The algorithm of
 * each call comes from the bucket of its token count (the next power of two), chosen by
 * cuBLASLt's heuristic at create for that many tokens (densely packed strides). Should
 * cuBLASLt refuse that algorithm for a call's own size or strides, the call falls back
 * to cuBLASLt's per-call choice (algo = NULL): a refused cached choice alone fails no call. */
#define INA_LOG_SUBSYS "mla"
#include "mla/mla_absorb.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdlib.h>

#include "core/check.h"
#include "core/cuda.h"

enum {
  MAX_BUCKETS = 32,
  ALIGN_BYTES = 16,
  ALIGN_ELEMS = ALIGN_BYTES / 2, /* bf16 */
};

#define DEFAULT_WORKSPACE_BYTES ((size_t)4 << 20)

typedef enum { OP_Q = 0, OP_V = 1, OP_COUNT } absorb_op_t;

/* The pieces of one GEMM call that do not depend on the call's data. */
typedef struct absorb_gemm {
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulAlgo_t algo[MAX_BUCKETS];
  int has_algo[MAX_BUCKETS];
} absorb_gemm_t;

struct ina_mla_absorb {
  ina_mla_absorb_dims_t dims;
  cublasLtHandle_t lt;
  void *workspace;
  size_t workspace_bytes;
  int num_buckets;
  absorb_gemm_t gemm[OP_COUNT];
};

/* A column-major operand: rows x cols with leading dimension ld, `batch` of them
 * batch_stride elements apart. */
typedef struct operand {
  uint64_t rows, cols;
  int64_t ld, batch_stride;
} operand_t;

/* The three operands of one call: A (weight), B (activations), D (output). */
typedef struct gemm_shape {
  operand_t a, b, d;
} gemm_shape_t;

static ina_status_t lt_status(cublasStatus_t s, const char *what) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(s == CUBLAS_STATUS_SUCCESS,
              s == CUBLAS_STATUS_NOT_SUPPORTED ? INA_ERR_UNSUPPORTED : INA_ERR_CUDA,
              "mla absorb: %s failed: %s (%s)", what, cublasLtGetStatusName(s),
              cublasLtGetStatusString(s));
fail:
  return st;
}

#define LT_CHECK(call) INA_CHECK(lt_status((call), #call))

static ina_status_t init_layout(cublasLtMatrixLayoutOpaque_t *storage, const operand_t *o,
                                int32_t batch) {
  ina_status_t st = INA_OK;
  cublasLtMatrixLayout_t l = storage;
  const int64_t stride = o->batch_stride;
  LT_CHECK(cublasLtMatrixLayoutInit(l, CUDA_R_16BF, o->rows, o->cols, o->ld));
  LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                            sizeof batch));
  LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                            sizeof stride));
fail:
  return st;
}

/* The operands of `op` for `tokens` tokens with the given activation and output strides. */
static gemm_shape_t shape_of(const ina_mla_absorb_dims_t *d, absorb_op_t op, int64_t tokens,
                             int64_t in_token_stride, int64_t in_head_stride,
                             int64_t out_token_stride, int64_t out_head_stride) {
  const int64_t C = d->kv_lora_rank, nope = d->qk_nope_head_dim, v = d->v_head_dim;
  const int64_t head_rows = (nope + v) * C;
  gemm_shape_t s;
  if (op == OP_Q) {
    s.a = (operand_t){(uint64_t)C, (uint64_t)nope, C, head_rows};
    s.b = (operand_t){(uint64_t)nope, (uint64_t)tokens, in_token_stride, in_head_stride};
    s.d = (operand_t){(uint64_t)C, (uint64_t)tokens, out_token_stride, out_head_stride};
  } else {
    s.a = (operand_t){(uint64_t)C, (uint64_t)v, C, head_rows};
    s.b = (operand_t){(uint64_t)C, (uint64_t)tokens, in_token_stride, in_head_stride};
    s.d = (operand_t){(uint64_t)v, (uint64_t)tokens, out_token_stride, out_head_stride};
  }
  return s;
}

/* Index of the smallest bucket (power of two) holding `tokens`. */
static int bucket_of(int32_t tokens) {
  int b = 0;
  while (((int64_t)1 << b) < tokens) b++;
  return b;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Asks cuBLASLt's heuristic for the best algorithm of `op` at each bucket's token count,
 * with densely packed activations (row lengths rounded up to the alignment). */
static ina_status_t choose_algorithms(ina_mla_absorb_t *a, absorb_op_t op) {
  ina_status_t st = INA_OK;
  const ina_mla_absorb_dims_t *d = &a->dims;
  const int64_t H = d->num_heads;
  const int64_t in_row = round_up(op == OP_Q ? d->qk_nope_head_dim : d->kv_lora_rank, ALIGN_ELEMS);
  const int64_t out_row = round_up(op == OP_Q ? d->kv_lora_rank : d->v_head_dim, ALIGN_ELEMS);
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatrixLayoutOpaque_t la, lb, ld;
  const uint32_t align = ALIGN_BYTES;
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &a->workspace_bytes, sizeof a->workspace_bytes));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &align, sizeof align));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &align, sizeof align));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &align, sizeof align));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &align, sizeof align));
  for (int b = 0; b < a->num_buckets; b++) {
    const int64_t tokens = (int64_t)1 << b;
    const gemm_shape_t s = shape_of(d, op, tokens, H * in_row, in_row, H * out_row, out_row);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    INA_CHECK(init_layout(&la, &s.a, d->num_heads));
    INA_CHECK(init_layout(&lb, &s.b, d->num_heads));
    INA_CHECK(init_layout(&ld, &s.d, d->num_heads));
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(a->lt, a->gemm[op].desc, &la, &lb, &ld,
                                                             &ld, pref, 1, &result, &found);
    a->gemm[op].has_algo[b] =
        hs == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (a->gemm[op].has_algo[b]) {
      a->gemm[op].algo[b] = result.algo;
    } else {
      INA_LOG_D(INA_LOG_SUBSYS,
                "mla absorb: no heuristic algorithm for %s at %lld tokens (%s); calls of that "
                "size let cuBLASLt choose",
                op == OP_Q ? "W_UK" : "W_UV", (long long)tokens, cublasLtGetStatusName(hs));
    }
  }
fail:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  return st;
}

static ina_status_t create_desc(cublasLtMatmulDesc_t *desc, cublasOperation_t trans_a) {
  ina_status_t st = INA_OK;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  LT_CHECK(cublasLtMatmulDescCreate(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT_CHECK(
      cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
  LT_CHECK(
      cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
fail:
  return st;
}

ina_status_t ina_mla_absorb_create(const ina_mla_absorb_dims_t *dims, ina_mla_absorb_t **out) {
  ina_status_t st = INA_OK;
  ina_mla_absorb_t *a = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_mla_absorb_create: out is NULL");
  *out = NULL;
  INA_REQUIRE(
      dims != NULL && dims->struct_size >= sizeof(ina_mla_absorb_dims_t) && dims->version == 1,
      INA_ERR_INVALID_ARGUMENT,
      "ina_mla_absorb_create: dims missing or not from INA_MLA_ABSORB_DIMS_INIT");
  INA_REQUIRE(dims->num_heads > 0 && dims->qk_nope_head_dim > 0 && dims->v_head_dim > 0 &&
                  dims->kv_lora_rank > 0 && dims->max_tokens > 0,
              INA_ERR_INVALID_ARGUMENT,
              "ina_mla_absorb_create: heads %d, nope %d, v %d, kv_lora_rank %d, max_tokens %d "
              "must all be positive",
              dims->num_heads, dims->qk_nope_head_dim, dims->v_head_dim, dims->kv_lora_rank,
              dims->max_tokens);
  INA_REQUIRE(dims->kv_lora_rank % ALIGN_ELEMS == 0, INA_ERR_UNSUPPORTED,
              "ina_mla_absorb_create: kv_lora_rank %d is not a multiple of %d (16-byte rows)",
              dims->kv_lora_rank, ALIGN_ELEMS);
  INA_REQUIRE(ina_cuda_device_count() > 0, INA_ERR_UNSUPPORTED,
              "ina_mla_absorb_create: no CUDA device is present");

  a = calloc(1, sizeof *a);
  INA_CHECK_ALLOC(a);
  a->dims = *dims;
  a->workspace_bytes = dims->workspace_bytes ? dims->workspace_bytes : DEFAULT_WORKSPACE_BYTES;
  a->num_buckets = bucket_of(dims->max_tokens) + 1; /* at most 32 for an int32 count */
  LT_CHECK(cublasLtCreate(&a->lt));
  {
    const cudaError_t e = cudaMalloc(&a->workspace, a->workspace_bytes);
    if (e != cudaSuccess) (void)cudaGetLastError();
    INA_REQUIRE(e == cudaSuccess,
                e == cudaErrorMemoryAllocation ? INA_ERR_OUT_OF_MEMORY : INA_ERR_CUDA,
                "ina_mla_absorb_create: cudaMalloc of a %zu-byte workspace failed: %s",
                a->workspace_bytes, cudaGetErrorString(e));
  }
  INA_CHECK(create_desc(&a->gemm[OP_Q].desc, CUBLAS_OP_N));
  INA_CHECK(create_desc(&a->gemm[OP_V].desc, CUBLAS_OP_T));
  INA_CHECK(choose_algorithms(a, OP_Q));
  INA_CHECK(choose_algorithms(a, OP_V));
  *out = a;
  a = NULL;
fail:
  ina_mla_absorb_destroy(a);
  return st;
}

void ina_mla_absorb_destroy(ina_mla_absorb_t *a) {
  if (!a) return;
  for (int op = 0; op < OP_COUNT; op++)
    if (a->gemm[op].desc) cublasLtMatmulDescDestroy(a->gemm[op].desc);
  if (a->workspace && cudaFree(a->workspace) != cudaSuccess) (void)cudaGetLastError();
  if (a->lt) cublasLtDestroy(a->lt);
  free(a);
}

static int aligned16(const void *p) { return (uintptr_t)p % ALIGN_BYTES == 0; }

static ina_status_t run(const ina_mla_absorb_t *a, absorb_op_t op, const char *who,
                        const uint16_t *weight, int32_t tokens, const uint16_t *in,
                        int64_t in_token_stride, int64_t in_head_stride, uint16_t *out,
                        int64_t out_token_stride, int64_t out_head_stride, void *stream) {
  ina_status_t st = INA_OK;
  cublasLtMatrixLayoutOpaque_t la, lb, ld;
  const float alpha = 1.0f, beta = 0.0f;
  INA_REQUIRE(a != NULL, INA_ERR_INVALID_ARGUMENT, "%s: handle is NULL", who);
  const ina_mla_absorb_dims_t *d = &a->dims;
  const int64_t in_row = op == OP_Q ? d->qk_nope_head_dim : d->kv_lora_rank;
  const int64_t out_row = op == OP_Q ? d->kv_lora_rank : d->v_head_dim;
  INA_REQUIRE(tokens >= 0 && tokens <= d->max_tokens, INA_ERR_INVALID_ARGUMENT,
              "%s: %d tokens, outside [0, max_tokens = %d]", who, tokens, d->max_tokens);
  if (tokens == 0) return INA_OK;
  INA_REQUIRE(weight && in && out, INA_ERR_INVALID_ARGUMENT, "%s: NULL weight, input or output",
              who);
  INA_REQUIRE(aligned16(weight) && aligned16(in) && aligned16(out), INA_ERR_INVALID_ARGUMENT,
              "%s: weight %p, input %p and output %p must be 16-byte aligned", who,
              (const void *)weight, (const void *)in, (void *)out);
  INA_REQUIRE(in_token_stride % ALIGN_ELEMS == 0 && in_head_stride % ALIGN_ELEMS == 0 &&
                  out_token_stride % ALIGN_ELEMS == 0 && out_head_stride % ALIGN_ELEMS == 0,
              INA_ERR_INVALID_ARGUMENT,
              "%s: strides (input %lld, %lld; output %lld, %lld) must be multiples of %d elements",
              who, (long long)in_token_stride, (long long)in_head_stride,
              (long long)out_token_stride, (long long)out_head_stride, ALIGN_ELEMS);
  INA_REQUIRE(in_token_stride >= in_row && in_head_stride >= 0 && out_token_stride >= out_row &&
                  out_head_stride >= out_row,
              INA_ERR_INVALID_ARGUMENT,
              "%s: strides (input %lld, %lld; output %lld, %lld) are shorter than a row of "
              "%lld input or %lld output values",
              who, (long long)in_token_stride, (long long)in_head_stride,
              (long long)out_token_stride, (long long)out_head_stride, (long long)in_row,
              (long long)out_row);

  const gemm_shape_t s =
      shape_of(d, op, tokens, in_token_stride, in_head_stride, out_token_stride, out_head_stride);
  INA_CHECK(init_layout(&la, &s.a, d->num_heads));
  INA_CHECK(init_layout(&lb, &s.b, d->num_heads));
  INA_CHECK(init_layout(&ld, &s.d, d->num_heads));
  const absorb_gemm_t *g = &a->gemm[op];
  const int b = bucket_of(tokens);
  const cublasLtMatmulAlgo_t *algo = g->has_algo[b] ? &g->algo[b] : NULL;
  const uint16_t *w = op == OP_Q ? weight : weight + (int64_t)d->qk_nope_head_dim * d->kv_lora_rank;
  cublasStatus_t ls =
      cublasLtMatmul(a->lt, g->desc, &alpha, w, &la, in, &lb, &beta, out, &ld, out, &ld, algo,
                     a->workspace, a->workspace_bytes, (cudaStream_t)stream);
  if (algo && (ls == CUBLAS_STATUS_NOT_SUPPORTED || ls == CUBLAS_STATUS_INVALID_VALUE)) {
    INA_LOG_D(INA_LOG_SUBSYS, "%s: the bucket's algorithm refused %d tokens (%s); cuBLASLt chooses",
              who, tokens, cublasLtGetStatusName(ls));
    ls = cublasLtMatmul(a->lt, g->desc, &alpha, w, &la, in, &lb, &beta, out, &ld, out, &ld, NULL,
                        a->workspace, a->workspace_bytes, (cudaStream_t)stream);
  }
  INA_CHECK(lt_status(ls, who));
fail:
  return st;
}

ina_status_t ina_mla_absorb_q(const ina_mla_absorb_t *a, const uint16_t *kv_b_weight,
                              int32_t num_tokens, const uint16_t *q_nope, int64_t q_token_stride,
                              int64_t q_head_stride, uint16_t *q_abs, int64_t q_abs_token_stride,
                              int64_t q_abs_head_stride, void *stream) {
  return run(a, OP_Q, "ina_mla_absorb_q", kv_b_weight, num_tokens, q_nope, q_token_stride,
             q_head_stride, q_abs, q_abs_token_stride, q_abs_head_stride, stream);
}

ina_status_t ina_mla_absorb_v(const ina_mla_absorb_t *a, const uint16_t *kv_b_weight,
                              int32_t num_tokens, const uint16_t *o_latent, int64_t o_token_stride,
                              int64_t o_head_stride, uint16_t *out, int64_t out_token_stride,
                              int64_t out_head_stride, void *stream) {
  return run(a, OP_V, "ina_mla_absorb_v", kv_b_weight, num_tokens, o_latent, o_token_stride,
             o_head_stride, out, out_token_stride, out_head_stride, stream);
}
