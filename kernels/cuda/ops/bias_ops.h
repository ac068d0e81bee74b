// A bias added to the rows of a projection's bf16 output (gpt-oss's o_proj bias; cuBLAS's GEMM
// has no bias). Plain C++ launcher header: pointers are device pointers, `stream` a cudaStream_t.
#pragma once

namespace llm::cuda {

// x[r, c] = bf16(x[r, c] + bias[c]) for r < rows, c < cols (bf16 x [rows, cols], bias [cols]).
void LaunchAddBiasRows(void* x, const void* bias, int rows, int cols, void* stream);

}  // namespace llm::cuda
