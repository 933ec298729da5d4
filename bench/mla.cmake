# bench_mla: GPU MLA decode attention (mla/mla.h) on the DeepSeek shapes of its issue, with
# a check against mla/mla_ref.h first. It drives the CUDA runtime itself (graph capture,
# pinned plan workspaces), so it exists only in CUDA builds. The torch floor beside it
# (mla_torch_floor.py) runs on its own.
if(INA_HAVE_CUDA)
  ina_add_bench(bench_mla bench_mla.c)
  target_link_libraries(bench_mla PRIVATE ina_mla CUDA::cudart)
endif()
