/* The FP8-query score kernel of attention/dsa_gpu.h (INA_DSA_GPU_QUERY_FP8), internal to
 * attention/: the arguments dsa_score.cu's run hands to dsa_score_fp8.cu's launcher. */
#ifndef INA_ATTENTION_DSA_SCORE_FP8_CUH
#define INA_ATTENTION_DSA_SCORE_FP8_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "attention/dsa_gpu.h"
#include "attention/dsa_score_common.cuh"

namespace ina_dsa_score_fp8 {

/* The shapes it takes (the run refuses others for the FP8 query). */
constexpr int kMaxHeads = 64;     /* N of one wgmma */
constexpr int kMaxHeadDim = 128;  /* one 128-byte swizzled row of e4m3 */
constexpr int kDimStep = 32;      /* K of one FP8 wgmma */

using Args = ina_dsa_score_common::ScoreArgs; /* the kernel needs nothing more */

/* Whether this device runs the kernel (sm_90: wgmma). */
bool device_supported(void);

/* Enqueues the kernel over a bucket of max_tokens query tokens. */
cudaError_t launch(const Args &a, int max_tokens, cudaStream_t stream);

}  // namespace ina_dsa_score_fp8

#endif
