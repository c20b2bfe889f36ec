// Throughput probe of the portable tensor-core instruction, mma.sync m16n8k16 bf16 -> fp32: the instruction every
// kernel of csrc/mxfp4_mma.cu (and Marlin, and cuBLAS on sm_12x) is built from. On Hopper, cuBLAS and vLLM's Triton
// MoE use wgmma instead, which GB10 (sm_121) does not have; this probe says how far mma.sync alone can go on the GPU
// it runs on, so a prefill gate measured on a Hopper stand-in can be read (kernels/tools/mma_peak.py).
//
// Each warp runs ILP independent accumulator chains of `iters` MMAs on constant fragments. asm volatile keeps every
// MMA; the host checks the sums (A = 1.0, B = 2**-10: each MMA adds 16 * 2**-10 to every accumulator, exact in
// fp32), so a loop the compiler shortened would be caught, not timed.
#include <cuda_runtime.h>
#include <stdint.h>

template <int ILP>
__global__ void mma_peak_kernel(int iters, uint32_t a_bits, uint32_t b_bits, float* out) {
  float acc[ILP][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < ILP; ++j)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
          : "r"(a_bits), "r"(a_bits), "r"(a_bits), "r"(a_bits), "r"(b_bits), "r"(b_bits));
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < ILP; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = s;
}

extern "C" int mma_peak_launch(int ilp, int blocks, int threads, int iters, float* out, void* stream) {
  const uint32_t one = 0x3F803F80u, b = 0x3A803A80u;  // bf16 pairs: 1.0, 2**-10
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (ilp) {
    case 4: mma_peak_kernel<4><<<blocks, threads, 0, s>>>(iters, one, b, out); break;
    case 8: mma_peak_kernel<8><<<blocks, threads, 0, s>>>(iters, one, b, out); break;
    default: return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
