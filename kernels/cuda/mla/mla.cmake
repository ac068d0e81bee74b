# MLA decode: the SM120 design (mma.sync, <= 99 KB shared memory per CTA), built for
# every CUDA arch of the build (sm_90 and sm_120 included). One .cu per cache type, so a 2-core
# build compiles them in parallel.
if(LLM_HAVE_CUDA)
  target_sources(llm_cuda_kernels PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/mla_decode.cc
    ${CMAKE_CURRENT_LIST_DIR}/mla_decode_bf16.cu
    ${CMAKE_CURRENT_LIST_DIR}/mla_decode_fp8.cu
    ${CMAKE_CURRENT_LIST_DIR}/mla_decode_fp8_mma.cu
    ${CMAKE_CURRENT_LIST_DIR}/mla_merge_append.cu
    ${CMAKE_CURRENT_LIST_DIR}/mla_prefill.cc
    ${CMAKE_CURRENT_LIST_DIR}/mla_prefill_softmax.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda_mla_backend.cc)
  # The expanded-form prefill (mla_prefill.cc) runs its GEMMs through cuBLAS.
  target_link_libraries(llm_cuda_kernels PUBLIC CUDA::cublas)
  # The Hopper variant over a bf16 cache (wgmma + TMA, 225 KB of shared memory): sm_90a only.
  llm_add_sm90a_objects(llm_mla_wgmma LLM_MLA_WGMMA ${CMAKE_CURRENT_LIST_DIR}/mla_decode_wgmma.cu
                        ${CMAKE_CURRENT_LIST_DIR}/mla_decode_seesaw.cu
                        ${CMAKE_CURRENT_LIST_DIR}/mla_decode_fp8_wgmma.cu)
endif()
