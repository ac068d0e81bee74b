# MLA decode (issue 6): the SM120 design (mma.sync, <= 99 KB shared memory per CTA), built for
# every CUDA arch of the build (sm_90 and sm_120 included). One .cu per cache type, so a 2-core
# build compiles them in parallel.
if(LLM_HAVE_CUDA)
  target_sources(llm_cuda_kernels PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/mla_decode.cc
    ${CMAKE_CURRENT_LIST_DIR}/mla_decode_bf16.cu
    ${CMAKE_CURRENT_LIST_DIR}/mla_decode_fp8.cu
    ${CMAKE_CURRENT_LIST_DIR}/mla_merge_append.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda_mla_backend.cc)
  # The Hopper variant for 64-row items over a bf16 cache (wgmma, 225 KB of shared memory) exists
  # only as sm_90a code: its own object library, built when the architectures include sm_90a.
  if("90a" IN_LIST CMAKE_CUDA_ARCHITECTURES)
    add_library(llm_mla_wgmma OBJECT ${CMAKE_CURRENT_LIST_DIR}/mla_decode_wgmma.cu)
    set_target_properties(llm_mla_wgmma PROPERTIES CUDA_ARCHITECTURES 90a)
    target_link_libraries(llm_mla_wgmma PRIVATE llm_base CUDA::cudart)
    target_compile_options(llm_mla_wgmma PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v --expt-relaxed-constexpr -lineinfo>)
    target_sources(llm_cuda_kernels PRIVATE $<TARGET_OBJECTS:llm_mla_wgmma>)
    target_compile_definitions(llm_cuda_kernels PRIVATE LLM_MLA_WGMMA=1)
  endif()
endif()
