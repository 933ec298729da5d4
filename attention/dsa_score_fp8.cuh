/* The FP8-query score kernel of attention/dsa_gpu.h (INA_DSA_GPU_QUERY_FP8), internal to
 * attention/: the arguments dsa_score.cu's run hands to dsa_score_fp8.cu's launcher. */
#ifndef INA_ATTENTION_DSA_SCORE_FP8_CUH
#define INA_ATTENTION_DSA_SCORE_FP8_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "attention/dsa_gpu.h"

namespace ina_dsa_score_fp8 {

/* The shapes it takes (the run refuses others for the FP8 query). */
constexpr int kMaxHeads = 64;     /* N of one wgmma */
constexpr int kMaxHeadDim = 128;  /* one 128-byte swizzled row of e4m3 */
constexpr int kDimStep = 32;      /* K of one FP8 wgmma */

struct Args {
  const uint16_t *q;      /* bf16 [tokens, num_heads, head_dim], 16-byte aligned rows */
  const float *weights;   /* [tokens, num_heads] */
  const char *keys;
  int64_t page_stride, token_stride, scale_offset, scale_stride;
  const int32_t *kv_indptr, *kv_indices;
  const ina_dsa_gpu_ws_header_t *header;
  const ina_dsa_gpu_token_row_t *rows;
  float softmax_scale;
  float *scores;
  int32_t score_stride, page_size, num_heads, head_dim;
  int32_t page_shift; /* log2(page_size) for a power of two, else -1 */
};

/* Whether this device runs the kernel (sm_90: wgmma). */
bool device_supported(void);

/* Enqueues the kernel over a bucket of max_tokens query tokens. */
cudaError_t launch(const Args &a, int max_tokens, cudaStream_t stream);

}  // namespace ina_dsa_score_fp8

#endif
