# bench_mla: GPU MLA decode attention (mla/mla.h) on the DeepSeek shapes of its issue, with
# a check against mla/mla_ref.h first. It drives the CUDA runtime itself (graph capture,
# pinned plan workspaces), so it exists only in CUDA builds. The torch floor beside it
# (mla_torch_floor.py) runs on its own.
if(INA_HAVE_CUDA)
  ina_add_bench(bench_mla bench_mla.c)
  target_link_libraries(bench_mla PRIVATE ina_mla CUDA::cudart)
  # bench_mla_sparse: sparse MLA decode (DeepSeek-V3.2: ina_mla_sparse_plan + run with
  # index rows), checked against attention/dsa.h's reference before timing.
  ina_add_bench(bench_mla_sparse bench_mla_sparse.c)
  target_link_libraries(bench_mla_sparse PRIVATE ina_mla ina_attention CUDA::cudart)
endif()
