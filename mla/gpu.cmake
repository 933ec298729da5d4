# The pieces around the GPU MLA attention kernel: the fused append into the paged latent
# cache (kernel + CPU reference) and the W_UK / W_UV absorption GEMMs (cuBLASLt). The
# reference and the argument checks build everywhere; without CUDA, mla_gpu_none.c
# stands in for the GPU entry points.
ina_add_library(ina_mla_gpu
  SOURCES mla_append_ref.c mla_append_args.c
  CUDA_SOURCES mla_append.cu mla_absorb.c mla_absorb_dequant.cu
  NOCUDA_SOURCES mla_gpu_none.c
  DEPS ina_core m)
if(INA_HAVE_CUDA)
  target_link_libraries(ina_mla_gpu PUBLIC CUDA::cublasLt)
endif()
