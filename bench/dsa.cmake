# bench_dsa_indexer: the GPU lightning indexer (attention/dsa_gpu.h: index scores + top-k)
# on DeepSeek-V3.2's decode shape, checked against attention/dsa.h's reference first. It
# drives the CUDA runtime itself (graphs, pinned plan workspaces), so it exists only in
# CUDA builds.
if(INA_HAVE_CUDA)
  ina_add_bench(bench_dsa_indexer bench_dsa_indexer.c)
  target_link_libraries(bench_dsa_indexer PRIVATE ina_attention_gpu ina_attention CUDA::cudart)
endif()
