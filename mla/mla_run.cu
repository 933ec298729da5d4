/* ina_mla_run (mla/mla.h): checks a run against its plan, picks the kernel variant and
 * enqueues the attention kernel and the combine pass, both on fixed grids. Also the
 * device helpers the host scheduler needs (mla_schedule.h). */
#define INA_LOG_SUBSYS "mla"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda_check.h"
#include "mla/mla.h"
#include "mla/mla_device.cuh"

/* INA_MLA_WGMMA=0 keeps grouped plans on the mma.sync kernel (the wgmma kernel still
 * builds): the switch to compare the two, or to fall back if the wgmma kernel misbehaves. */
#ifndef INA_MLA_WGMMA
#define INA_MLA_WGMMA 1
#endif

namespace {

bool aligned(const void *p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

/* The environment variable INA_MLA_WGMMA_FP8=0 keeps grouped plans over an FP8 cache on
 * the mma.sync FP8 kernel: to compare the two in one build. Read once. */
bool wgmma_fp8_enabled() {
  static const bool enabled = [] {
    const char *v = getenv("INA_MLA_WGMMA_FP8");
    return !(v && strcmp(v, "0") == 0);
  }();
  return enabled;
}

/* The fast kernel copies 16-byte pieces of cache entries and moves bf16 pairs of the
 * queries and outputs as 32-bit words. */
bool fast_layout_ok(const ina_mla_run_params_t *p) {
  const ina_mla_cache_t &c = p->cache;
  bool ok = aligned(c.latent, 16) && aligned(c.rope, 16) && c.latent_page_stride % 16 == 0 &&
            c.latent_token_stride % 16 == 0 && c.rope_page_stride % 16 == 0 &&
            c.rope_token_stride % 16 == 0;
  if (c.format == INA_MLA_CACHE_FP8)
    ok = ok && aligned(c.scale, 16) && c.scale_page_stride % 16 == 0 && c.scale_token_stride % 16 == 0;
  ok = ok && aligned(p->q_nope, 4) && aligned(p->q_pe, 4) && aligned(p->out, 4);
  ok = ok && p->q_nope_token_stride % 2 == 0 && p->q_nope_head_stride % 2 == 0 &&
       p->q_pe_token_stride % 2 == 0 && p->q_pe_head_stride % 2 == 0 &&
       p->out_token_stride % 2 == 0 && p->out_head_stride % 2 == 0;
  return ok;
}

/* The wgmma kernel also copies whole query rows in 16-byte pieces. */
bool wgmma_layout_ok(const ina_mla_run_params_t *p) {
  return aligned(p->q_nope, 16) && aligned(p->q_pe, 16) && p->q_nope_token_stride % 8 == 0 &&
         p->q_nope_head_stride % 8 == 0 && p->q_pe_token_stride % 8 == 0 && p->q_pe_head_stride % 8 == 0;
}

}  // namespace

extern "C" ina_status_t ina_mla_run(const ina_mla_plan_info_t *info, void *device_ws,
                                    const ina_mla_run_params_t *p, void *stream) {
  ina_status_t st = INA_OK;
  ina_mla_sched_layout_t l;
  ina_mla::Args a;
  bool fast = false, fp8 = false, wgmma = false;
  char *ws = static_cast<char *>(device_ws);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  INA_REQUIRE(info && device_ws && p, INA_ERR_INVALID_ARGUMENT, "mla run: %s is NULL",
              !info ? "info" : !device_ws ? "device_ws" : "params");
  INA_REQUIRE(p->struct_size == sizeof(ina_mla_run_params_t) && p->version == 2,
              INA_ERR_INVALID_ARGUMENT,
              "mla run: params struct_size %zu / version %u do not match this build (%zu / 2); "
              "initialize them with INA_MLA_RUN_PARAMS_INIT",
              p->struct_size, p->version, sizeof(ina_mla_run_params_t));
  INA_REQUIRE(info->num_ctas > 0, INA_ERR_INVALID_ARGUMENT,
              "mla run: info holds no plan (num_ctas %d); call ina_mla_plan first", info->num_ctas);
  INA_CHECK(ina_mla_sched_layout(info->max_batch, info->max_q_len, info->num_heads,
                                 info->kv_lora_rank, info->rope_dim, info->num_ctas, &l));
  {
    const ina_mla_cache_t &c = p->cache;
    INA_REQUIRE(c.kv_lora_rank == info->kv_lora_rank && c.rope_dim == info->rope_dim &&
                    c.page_size == info->page_size,
                INA_ERR_INVALID_ARGUMENT,
                "mla run: cache (kv_lora_rank %d, rope_dim %d, page_size %d) does not match the "
                "plan (%d, %d, %d)", c.kv_lora_rank, c.rope_dim, c.page_size, info->kv_lora_rank,
                info->rope_dim, info->page_size);
    INA_REQUIRE(c.format == INA_MLA_CACHE_F32 || c.format == INA_MLA_CACHE_BF16 ||
                    c.format == INA_MLA_CACHE_FP8,
                INA_ERR_INVALID_ARGUMENT, "mla run: unknown cache format %d", (int)c.format);
    INA_REQUIRE(c.format != INA_MLA_CACHE_FP8 || c.kv_lora_rank % 128 == 0, INA_ERR_UNSUPPORTED,
                "mla run: an FP8 cache needs kv_lora_rank divisible by 128 (got %d)", c.kv_lora_rank);
    INA_REQUIRE(c.latent && (c.rope || c.rope_dim == 0) && (c.scale || c.format != INA_MLA_CACHE_FP8),
                INA_ERR_INVALID_ARGUMENT, "mla run: cache %s pointer is NULL",
                !c.latent ? "latent" : !c.rope && c.rope_dim ? "rope" : "scale");
  }
  INA_REQUIRE(p->q_nope && (p->q_pe || info->rope_dim == 0) && p->out && p->kv_indptr && p->kv_indices,
              INA_ERR_INVALID_ARGUMENT, "mla run: %s is NULL",
              !p->q_nope ? "q_nope" : !p->out ? "out" : !p->kv_indptr ? "kv_indptr"
                                                     : !p->kv_indices ? "kv_indices" : "q_pe");
  INA_REQUIRE((info->sparse_topk > 0) == (p->indices != NULL), INA_ERR_INVALID_ARGUMENT,
              "mla run: %s", info->sparse_topk > 0 ? "a sparse plan needs indices (NULL given)"
                                                   : "indices given for a dense plan");
  INA_REQUIRE(isfinite(p->softmax_scale) && p->softmax_scale > 0.0f, INA_ERR_INVALID_ARGUMENT,
              "mla run: softmax_scale %g is not a finite positive number", (double)p->softmax_scale);

  a.header = reinterpret_cast<const ina_mla_sched_header_t *>(ws + l.header);
  a.cta_indptr = reinterpret_cast<const int32_t *>(ws + l.cta_indptr);
  a.requests = reinterpret_cast<const ina_mla_sched_request_t *>(ws + l.requests);
  a.items = reinterpret_cast<const ina_mla_sched_item_t *>(ws + l.items);
  a.merges = reinterpret_cast<const ina_mla_sched_merge_t *>(ws + l.merges);
  a.partial_o = reinterpret_cast<float *>(ws + l.partial_o);
  a.partial_lse = reinterpret_cast<float *>(ws + l.partial_lse);
  a.num_heads = info->num_heads;
  a.kv_lora_rank = info->kv_lora_rank;
  a.rope_dim = info->rope_dim;
  a.q_nope = static_cast<const __nv_bfloat16 *>(p->q_nope);
  a.q_nope_ts = p->q_nope_token_stride;
  a.q_nope_hs = p->q_nope_head_stride;
  a.q_pe = static_cast<const __nv_bfloat16 *>(p->q_pe);
  a.q_pe_ts = p->q_pe_token_stride;
  a.q_pe_hs = p->q_pe_head_stride;
  a.cache = p->cache;
  a.page_shift = -1;
  for (int shift = 0; shift < 31; shift++)
    if (p->cache.page_size == (1 << shift)) a.page_shift = shift;
  a.kv_indptr = p->kv_indptr;
  a.kv_indices = p->kv_indices;
  a.scale_log2 = p->softmax_scale * 1.4426950408889634f;
  a.out = static_cast<__nv_bfloat16 *>(p->out);
  a.out_ts = p->out_token_stride;
  a.out_hs = p->out_head_stride;
  a.lse = p->lse;
  a.sel = info->sparse_topk > 0 ? p->indices : nullptr;
  a.sel_stride = info->sparse_topk;
  a.token_request = reinterpret_cast<const int32_t *>(ws + l.token_request);

  fp8 = p->cache.format == INA_MLA_CACHE_FP8;
  fast = info->path == INA_MLA_PATH_FAST && p->cache.format != INA_MLA_CACHE_F32 && fast_layout_ok(p);
  /* Grouped plans (many query rows per request) take the wgmma kernel, with a bf16 or an
   * FP8 cache; the mma.sync kernels run any plan, grouped or not, item by item. */
  wgmma = INA_MLA_WGMMA && fast && l.group_tiles > 1 &&
          (p->cache.format == INA_MLA_CACHE_BF16 || (fp8 && wgmma_fp8_enabled())) && wgmma_layout_ok(p) &&
          ina_mla::wgmma_supported();
  if (wgmma) INA_CUDA_CHECK(ina_mla::launch_wgmma(a, info->num_ctas, s));
  else if (fast) INA_CUDA_CHECK(ina_mla::launch_fast(a, fp8, info->num_ctas, s));
  else INA_CUDA_CHECK(ina_mla::launch_generic(a, info->num_ctas, s));
  INA_CUDA_CHECK(ina_mla::launch_combine(a, info->num_ctas, s));
fail:
  return st;
}

extern "C" ina_status_t ina_mla_device_num_sms(int32_t *out) {
  ina_status_t st = INA_OK;
  int device = 0, sms = 0;
  INA_CUDA_CHECK(cudaGetDevice(&device));
  INA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  *out = sms;
fail:
  return st;
}

extern "C" ina_status_t ina_mla_copy_schedule(void *device_ws, const void *host_ws, size_t bytes,
                                              void *stream) {
  ina_status_t st = INA_OK;
  INA_CUDA_CHECK(cudaMemcpyAsync(device_ws, host_ws, bytes, cudaMemcpyHostToDevice,
                                 static_cast<cudaStream_t>(stream)));
fail:
  return st;
}
