// MXFP4 decode kernels on the repacked layout of kernels/packed.py: tensor cores fed from registers.
//
// One word (8 E2M1 codes) per lane per m16n8k16 step: 8 integer instructions decode it into the
// lane's 4 A-fragment registers (f16x2, value * 2**-14), one mma.sync multiplies it with 8 token
// columns (swap-AB: weights are the 16-row side, tokens the 8-wide side), fp32 accumulation. The
// E8M0 scale of each 32-element block is applied with one FFMA per accumulator per block (the
// exponent bits become an fp32 by a shift; the 2**14 of the decode and the per-token activation
// scale are folded into one multiply in the epilogue). So M = 1..8 tokens cost the same
// instructions per weight word, M = 9..16 one more mma and 4 FFMA per block.
//
// Ideas taken (see NOTES.md): Marlin (vLLM csrc/quantization/marlin/dequant.h): LOP3 bit tricks
// that build fp16 from the 4-bit field and fold the exponent bias into the scale, and
// mma.sync fragments fed straight from registers; triton_kernels (Hopper value layout): permute
// the weight bytes at load time so each lane's load IS its operand fragment; llama.cpp mmvq:
// many rows per warp, activation prepared once per call. Not taken: llama.cpp's MXFP4 path
// (byte-permute table to int8 + dp4a) needs int8 activations, and W4A16 keeps BF16 ones.
//
// Kernels (all 256 threads = 8 warps, persistent over "items"):
//   MODE_DENSE  : y[M, N] = x[M, K] @ W^T (+ bias). Item = RW*RT row tiles; warps split K (KSPLIT).
//   MODE_GATEUP : MoE gate_up for slot s (token s / top_k, expert ids[s]); rows packed "paired"
//                 (tile row g = gate_i, g+8 = up_i), SwiGLU in the epilogue, h written as f16 * 2**8
//                 in the activation-fragment layout the down kernel reads.
//   MODE_DOWN   : MoE down + weighted combine: item = (token, RT row tiles of H); warp w handles
//                 slot w / ksp, K slice w % ksp; fixed-order reduction over the 8 warps.
//   route       : router GEMV in the stored dtype + top-k + softmax, int32 ids; the last CTA to
//                 finish (atomic ticket) does top-k, so it is one launch.
//   prefill (M > 16): mxfp4_pf_kernel (mma.sync, every arch) and mxfp4_wg_kernel (wgmma, sm_90a only): the
//                 same decode and epilogue, the MoE over align_kernel's blocks of one expert's slots.
// MoE launches use programmatic dependent launch where available: the down kernel prefetches
// its weights before waiting for gate_up's h.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <type_traits>

namespace {

// Phase timestamps (diagnostics only: `python -m kernels.tools.phase_timing` compiles this file with
// MXFP4_PHASES defined; the normal build has none of it). Thread 0 of each CTA of mxfp4_kernel<MODE>
// writes 16 u64 at buffer[(MODE * 2048 + CTA) * 16]: [0] globaltimer at start, [1] at end, [2] SM id,
// [3] items done, [4 + i] clock64 at event i (see the PHASE_CLK calls).
#ifdef MXFP4_PHASES
__device__ unsigned long long* g_phase = nullptr;
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}
#define PHASE_SET(i, v) do { if (threadIdx.x == 0 && g_phase) g_phase[(MODE * 2048 + blockIdx.x) * 16 + (i)] = (v); } while (0)
#define PHASE_CLK(i) PHASE_SET(4 + (i), (unsigned long long)clock64())
#define PHASE_DEP(f) do { float _d = (f); asm volatile("mov.b32 %0, %0;" : "+f"(_d)); } while (0)
#else
#define PHASE_SET(i, v) do {} while (0)
#define PHASE_CLK(i) do {} while (0)
#define PHASE_DEP(f) do {} while (0)
#endif

constexpr int WARPS = 8;
constexpr int THREADS = 256;
constexpr int MODE_DENSE = 0, MODE_GATEUP = 1, MODE_DOWN = 2;
constexpr int ROUTE_WPE = 4;  // route kernel: warps per expert
constexpr int ROUTE_RQ = 3;   // and 16-byte loads per lane in flight (covers H <= 3072 at once)

__device__ __forceinline__ void decode4(uint32_t w, uint32_t (&a)[4]) {
  // See kernels/packed.py: 4 shifts/rotates + 4 LOP3.
  const uint32_t M = 0x8E008E00u;
  a[0] = (w << 2) & M;
  a[1] = (w ^ (w << 6)) & M;
  a[2] = (w ^ (w << 9)) & M;
  a[3] = (w ^ __funnelshift_l(w, w, 13)) & M;
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                         float c0, float c1, float c2, float c3) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
}

// d = lop3(a, b, c) with truth table LUT (PTX lop3.b32; a = 0xF0, b = 0xCC, c = 0xAA).
template <int LUT>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
  return d;
}

// bf16 form of decode4 for the prefill kernel: the fp16 bits of decode4 (sign 15, e1 e0 m at 11..9) with the three
// magnitude bits moved to bf16's 8..6, so each half is the code's value * 2**-126 (e = 0 lands on bf16 subnormals,
// as it lands on fp16's). Per register: decode4's shift and masked XOR (one LOP3; register 0 is a shift and a mask),
// then one shift and one LOP3 that takes t where C = 1 (bits 15 and 12 of each half: its sign; t is zero at 12) and
// t >> 3 elsewhere (the magnitude; zero outside 8..6 since t is zero at 14..12). Written as lop3 so that the four
// instructions stay four: from the C expressions ptxas made five per register (the XOR and each mask apart, then
// LEA.HI), ~42% of the prefill loop's instructions.
__device__ __forceinline__ void decode4_bf16(uint32_t w, uint32_t (&a)[4]) {
  constexpr uint32_t M = 0x8E008E00u, C = 0x90009000u;
  constexpr int XOR_AND = (0xF0 ^ 0xCC) & 0xAA, SELECT = (0xF0 & 0xAA) | (0xCC & ~0xAA & 0xFF);
  uint32_t t[4];
  t[0] = (w << 2) & M;
  t[1] = lop3<XOR_AND>(w, w << 6, M);
  t[2] = lop3<XOR_AND>(w, w << 9, M);
  t[3] = lop3<XOR_AND>(w, __funnelshift_l(w, w, 13), M);
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = lop3<SELECT>(t[i], t[i] >> 3, C);
}

// E8M0 byte b -> bf16x2 {2**(b-1), 2**(b-1)}: times a decoded value * 2**-126 it is value * 2**(b-127), exact
// (bf16 has fp32's exponent range). Valid for b <= 128 (2**127 is bf16's largest power of two): the host serves
// weights with a larger scale byte from another path (PackedMXFP4.max_scale). `sel` picks byte 0..3 of sv.
template <int SEL>
__device__ __forceinline__ uint32_t e8m0_bf16x2(uint32_t sv) {
  // PRMT puts byte SEL in bytes 0 and 2 (zeros elsewhere); * 128 + 126 * 128 in each half = (b + 126) << 7
  const uint32_t b = __byte_perm(sv, 0u, 0x4040u | (SEL << 8) | SEL);
  return b * 128u + 0x3F003F00u;
}

// a * s in bf16x2 (fma with -0 keeps a zero's sign and works from sm_80; subnormal inputs are kept, which the e = 0
// codes need).
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t s) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(s), "r"(0x80008000u));
  return d;
}

__device__ __forceinline__ void mma16816_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// Weights are streamed once: no L1 allocation, L2 evict-first (they must not push x / h out).
__device__ __forceinline__ uint4 ld_stream_v4(const void* ptr, uint64_t pol) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr), "l"(pol));
  return v;
}

__device__ __forceinline__ uint32_t ld_stream_u32(const void* ptr, uint64_t pol) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.u32 %0, [%1], %2;\n" : "=r"(v) : "l"(ptr), "l"(pol));
  return v;
}

// Predicated forms (no branch). When !ok the result is undefined: callers never use it then.
__device__ __forceinline__ void ld_stream_v4_if(uint4& v, const void* ptr, uint64_t pol, bool ok) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
      " @p ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %6;\n}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr), "r"((int)ok), "l"(pol));
}

__device__ __forceinline__ void ld_stream_u32_if(uint32_t& v, const void* ptr, uint64_t pol, bool ok) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n"
      " @p ld.global.nc.L1::no_allocate.L2::cache_hint.u32 %0, [%1], %3;\n}\n"
      : "=r"(v)
      : "l"(ptr), "r"((int)ok), "l"(pol));
}

// Plain (coherent) predicated 16-byte load, volatile so a batch of them is issued before the math.
__device__ __forceinline__ void ld_v4_if(uint4& v, const void* ptr, bool ok) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
      " @p ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(ptr), "r"((int)ok));
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float bf16f(const __nv_bfloat16* p) { return __bfloat162float(*p); }

__device__ __forceinline__ float load_param(const void* p, int kind, long long i) {
  // kind: 1 = float32, 2 = bfloat16 (bias / router weights in their stored dtype)
  return kind == 1 ? reinterpret_cast<const float*>(p)[i] : __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
}

// One chunk (4 k-steps = 2 MX blocks) of one row tile: acc[nt][0..3] += W_tile . x-fragments.
template <int NT>
__device__ __forceinline__ void chunk_mma(const uint4 wv, uint32_t sv, const uint32_t (&xb)[NT][8], float (&acc)[NT][4]) {
  // E8M0 byte -> fp32 2**(s-127) by moving it into the exponent field (byte 0 -> 0, byte 255 -> inf;
  // a NaN block has zero codes, so its 0 * inf = NaN). Bytes: (row g, blk 0), (g+8, 0), (g, 1), (g+8, 1).
  const float sg0 = __uint_as_float((sv << 23) & 0x7F800000u);
  const float sh0 = __uint_as_float((sv << 15) & 0x7F800000u);
  const float sg1 = __uint_as_float((sv << 7) & 0x7F800000u);
  const float sh1 = __uint_as_float((sv >> 1) & 0x7F800000u);
  const uint32_t wj[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int bh = 0; bh < 2; ++bh) {
    uint32_t a0[4], a1[4];
    decode4(wj[2 * bh], a0);
    decode4(wj[2 * bh + 1], a1);
    const float sg = bh ? sg1 : sg0, sh = bh ? sh1 : sh0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float d[4];
      mma16816(d, a0, xb[nt][4 * bh], xb[nt][4 * bh + 1], 0.f, 0.f, 0.f, 0.f);
      mma16816(d, a1, xb[nt][4 * bh + 2], xb[nt][4 * bh + 3], d[0], d[1], d[2], d[3]);
      acc[nt][0] = fmaf(d[0], sg, acc[nt][0]);
      acc[nt][1] = fmaf(d[1], sg, acc[nt][1]);
      acc[nt][2] = fmaf(d[2], sh, acc[nt][2]);
      acc[nt][3] = fmaf(d[3], sh, acc[nt][3]);
    }
  }
}

// Activation fragments: layout [row m][chunk c][lane t][8] u32, the 8 = (k-step j, half h) with
// h = 0: pair (k0+2t, k0+2t+1), h = 1: pair (k0+2t+8, k0+2t+9) -- the two B registers of one
// mma are adjacent (kernels.packed.prepare_activation). `xl` points at this lane's row m, t. Lanes whose
// B column is past the last token read a real row too: column n of the MMA's result depends on column n
// of B alone, and those columns are never stored. With one step for every lane (no zero block read with
// step 0) the compiler folds the address of a chunk into the load's offset: the per-chunk address
// arithmetic (~10 instructions per 512-byte chunk, SASS of the K-split kernels) goes.
template <int NT>
__device__ __forceinline__ void load_xb(const uint32_t* const (&xl)[NT], int c, uint32_t (&xb)[NT][8]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint4* p = reinterpret_cast<const uint4*>(xl[nt] + c * 32);
    const uint4 u0 = p[0], u1 = p[1];
    xb[nt][0] = u0.x; xb[nt][1] = u0.y; xb[nt][2] = u0.z; xb[nt][3] = u0.w;
    xb[nt][4] = u1.x; xb[nt][5] = u1.y; xb[nt][6] = u1.z; xb[nt][7] = u1.w;
  }
}

__device__ __forceinline__ int frag_index(int p) {
  // pair p (k = 2p, 2p+1) of one row -> u32 offset in [chunk][t][j][h]
  const int c = p >> 5, r = p & 31, j = r >> 3, hh = (r >> 2) & 1, tt = r & 3;
  return (c * 4 + tt) * 8 + j * 2 + hh;
}

// Predicated parameter load issued where it is called (volatile: the compiler may not sink it to
// its use), so a bias / weight read at the start of an item overlaps the item's weight stream.
__device__ __forceinline__ float ld_param_early(const void* p, int kind, long long i, bool ok) {
  if (kind == 1) {
    float v = 0.f;
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.f32 %0, [%1];\n}\n"
                 : "+f"(v) : "l"(reinterpret_cast<const float*>(p) + i), "r"((int)ok));
    return v;
  }
  unsigned short b = 0;
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.u16 %0, [%1];\n}\n"
               : "+h"(b) : "l"(reinterpret_cast<const __nv_bfloat16*>(p) + i), "r"((int)ok));
  return __uint_as_float((uint32_t)b << 16);
}

__device__ __forceinline__ uint32_t bf16x2_absmax_bits(uint32_t u) {
  // |hi| vs |lo| of two bf16 as 16-bit magnitudes (monotonic in the value); NaN -> 0 (as fmaxf skips it).
  uint32_t lo = u & 0x7FFFu, hi = (u >> 16) & 0x7FFFu;
  lo = lo > 0x7F80u ? 0u : lo;
  hi = hi > 0x7F80u ? 0u : hi;
  return max(lo, hi);
}

__device__ __forceinline__ uint32_t f16x2_scaled(uint32_t u, float up) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
  __half2 h = __floats2half2_rn(f.x * up, f.y * up);
  return *reinterpret_cast<uint32_t*>(&h);
}

// x held in registers when the whole activation is at most 2 x 16 bytes per thread (M = 1 up to
// K = 4096): loaded before the weight stream is issued, so it is not queued behind megabytes of
// weight requests (Nsight Compute, qkv M=1: ~22% of warp samples waited on the x load issued after
// the weight prefetch), and read from global memory once instead of twice.
struct XPre {
  uint4 v[2];
  bool on;
};

__device__ __forceinline__ bool x_vec(const __nv_bfloat16* x, long long sx, int K) {
  return ((reinterpret_cast<uintptr_t>(x) & 15) == 0) && ((sx & 7) == 0) && ((K & 7) == 0);
}

__device__ __forceinline__ void x_preload(const __nv_bfloat16* x, long long sx, int M, int K, XPre& p) {
  p.on = x_vec(x, sx, K) && M * (K / 8) <= 2 * THREADS;
  p.v[0] = p.v[1] = make_uint4(0u, 0u, 0u, 0u);
  if (!p.on) return;
  const int k8 = K / 8;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int q = threadIdx.x + j * THREADS;
    const int m = q / k8, c = q - m * k8;
    ld_v4_if(p.v[j], x + m * sx + c * 8, q < M * k8);
  }
}

__device__ __forceinline__ uint32_t absmax_bits_v4(const uint4 u) {
  return max(max(bf16x2_absmax_bits(u.x), bf16x2_absmax_bits(u.y)), max(bf16x2_absmax_bits(u.z), bf16x2_absmax_bits(u.w)));
}

__device__ __forceinline__ void store_frags_v4(uint32_t* row, int c, const uint4 u, float up) {
  row[frag_index(4 * c + 0)] = f16x2_scaled(u.x, up);
  row[frag_index(4 * c + 1)] = f16x2_scaled(u.y, up);
  row[frag_index(4 * c + 2)] = f16x2_scaled(u.z, up);
  row[frag_index(4 * c + 3)] = f16x2_scaled(u.w, up);
}

// max into amax[m] with one shared atomic per warp where the warp's lanes share a row (all of them
// at M = 1) instead of one per thread on the same word. All 32 lanes must call it. (At M = 1 this
// did not change the call time on an H200: prep_x's barriers mostly wait for the warps still
// issuing their weight prefetch, kernels/NOTES.md "Where the time goes".)
__device__ __forceinline__ void warp_max_to(uint32_t* amax, int m, uint32_t b) {
  const unsigned full = 0xffffffffu;
  const int m0 = __shfl_sync(full, m, 0), m31 = __shfl_sync(full, m, 31);
  if (m0 == m31) {
    b = __reduce_max_sync(full, b);
    if ((threadIdx.x & 31) == 0) atomicMax(amax + m0, b);
  } else {
    atomicMax(amax + m, b);
  }
}

// 2**(14 - L) and 2**L from the max |x| bits of a row (bf16 exponent field L)
__device__ __forceinline__ int row_log2(uint32_t amax) {
  const int lg = (int)((amax >> 7) & 0xFF) - 127;
  return min(max(lg, -100), 127);
}
__device__ __forceinline__ float row_up(uint32_t amax) { return __uint_as_float((uint32_t)(14 - row_log2(amax) + 127) << 23); }
__device__ __forceinline__ float row_down(uint32_t amax) { return __uint_as_float((uint32_t)(row_log2(amax) + 127) << 23); }

constexpr int PREP_BATCH = 4;  // 16-byte x loads in flight per thread when x is not preloaded
constexpr int H_BATCH = 6;     // MoE down: 16-byte h loads in flight per thread while staging a token's slots

// This thread's 16-byte pieces q0 + u * THREADS + tid (u < PREP_BATCH) of x [M, K] (K / 8 = k8 pieces
// per row, n8 in all), all loads issued before any is used; pieces past the end read as zero.
__device__ __forceinline__ void load_x_batch(const __nv_bfloat16* x, long long sx, int k8, int n8, int q0,
                                             uint4 (&v)[PREP_BATCH]) {
#pragma unroll
  for (int u = 0; u < PREP_BATCH; ++u) {
    const int q = q0 + u * THREADS + threadIdx.x, m = q / k8;
    v[u] = make_uint4(0u, 0u, 0u, 0u);
    ld_v4_if(v[u], x + m * sx + (q - m * k8) * 8, q < n8);
  }
}

// x [M, K] bf16 -> f16 fragments * 2**(14-L_m) at xs (shared memory here, global memory in
// xprep_kernel); xdown[m] = 2**L_m. Every thread takes part in both passes, with its loads issued in
// batches (the earlier loop waited for one L2 round trip per 16 bytes; phase timing of a qkv M=8 call:
// 8.6 us in this function, 7.5 with batches, so from M = 2 the GEMV uses xprep_kernel instead).
// Ends with a barrier; xdown is valid after it.
//
// One row held in registers (M = 1, x_preload) with `one_barrier`: each warp's max goes into its own slot, so
// there is no zeroing barrier and no atomic; two barriers instead of three. H200, same-process bench against
// the three-barrier form, M=1 (two runs): qkv 8.0-8.1 -> 7.5-7.6 us, o_proj 7.8 -> 7.2, expert gate_up shape
// 8.2-8.3 -> 7.7-7.8, expert down shape 6.7 -> 6.1-6.2, lm_head 82.8-83.3 -> 81.7-82.2; from M = 2 (xprep_kernel
// prepares each row this way) qkv M=4 8.8 -> 8.2, o_proj 8.5 -> 7.7. The MoE gate_up kernel keeps the
// three-barrier form: with this one the layer measured 25.7 / 25.9 vs 25.5 / 25.5 us.
__device__ void prep_x(const __nv_bfloat16* x, long long sx, int M, int K, int kc, uint32_t* xs, float* xdown,
                       uint32_t* amax_bits, const XPre& pre, bool one_barrier) {
  const bool vec = x_vec(x, sx, K);
  const int kp2 = kc * 32;  // pairs per row, K padded to a multiple of 64 (zeros beyond K)
  const int k8 = K / 8, n8 = M * k8;
  if (one_barrier && M == 1 && pre.on) {
    uint32_t b = 0u;
#pragma unroll
    for (int j = 0; j < 2; ++j) b = max(b, threadIdx.x + j * THREADS < n8 ? absmax_bits_v4(pre.v[j]) : 0u);
    b = __reduce_max_sync(0xffffffffu, b);
    if ((threadIdx.x & 31) == 0) amax_bits[threadIdx.x >> 5] = b;
    __syncthreads();
    uint32_t am = 0u;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) am = max(am, amax_bits[w]);
    if (threadIdx.x == 0) xdown[0] = row_down(am);
    const float up = row_up(am);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int q = threadIdx.x + j * THREADS;
      if (q < n8) store_frags_v4(xs, q, pre.v[j], up);
    }
    for (int q = threadIdx.x; q < kp2 - K / 2; q += THREADS) xs[frag_index(K / 2 + q)] = 0u;
    __syncthreads();
    return;
  }
  if (threadIdx.x < 16) amax_bits[threadIdx.x] = 0u;
  __syncthreads();
  if (vec) {
    if (pre.on) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int q = threadIdx.x + j * THREADS;
        warp_max_to(amax_bits, min(q, n8 - 1) / k8, q < n8 ? absmax_bits_v4(pre.v[j]) : 0u);
      }
    } else {
      for (int q0 = 0; q0 < n8; q0 += PREP_BATCH * THREADS) {  // same trip count in every thread
        uint4 v[PREP_BATCH];
        load_x_batch(x, sx, k8, n8, q0, v);
#pragma unroll
        for (int u = 0; u < PREP_BATCH; ++u) {
          const int q = q0 + u * THREADS + threadIdx.x;
          warp_max_to(amax_bits, min(q, n8 - 1) / k8, absmax_bits_v4(v[u]));
        }
      }
    }
  } else {
    for (int q = threadIdx.x; q < M * K; q += THREADS) {
      const int m = q / K;
      atomicMax(amax_bits + m, bf16x2_absmax_bits((uint32_t)__bfloat16_as_ushort(x[m * sx + (q - m * K)])));
    }
  }
  __syncthreads();
  if (threadIdx.x < M) xdown[threadIdx.x] = row_down(amax_bits[threadIdx.x]);
  if (vec) {
    if (pre.on) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int q = threadIdx.x + j * THREADS;
        if (q < n8) {
          const int m = q / k8;
          store_frags_v4(xs + (long long)m * kp2, q - m * k8, pre.v[j], row_up(amax_bits[m]));
        }
      }
    } else {
      for (int q0 = 0; q0 < n8; q0 += PREP_BATCH * THREADS) {  // second read: L1 hits
        uint4 v[PREP_BATCH];
        load_x_batch(x, sx, k8, n8, q0, v);
#pragma unroll
        for (int u = 0; u < PREP_BATCH; ++u) {
          const int q = q0 + u * THREADS + threadIdx.x, m = q / k8;
          if (q < n8) store_frags_v4(xs + (long long)m * kp2, q - m * k8, v[u], row_up(amax_bits[m]));
        }
      }
    }
    const int tail = kp2 - K / 2;  // padding pairs
    for (int q = threadIdx.x; q < M * tail; q += THREADS) {
      const int m = q / tail, p = K / 2 + (q - m * tail);
      xs[(long long)m * kp2 + frag_index(p)] = 0u;
    }
  } else {
    for (int q = threadIdx.x; q < M * kp2; q += THREADS) {
      const int m = q / kp2, p = q - m * kp2, k = 2 * p;
      float lo = 0.f, hi = 0.f;
      if (k < K) lo = __bfloat162float(x[m * sx + k]);
      if (k + 1 < K) hi = __bfloat162float(x[m * sx + k + 1]);
      const float up = row_up(amax_bits[m]);
      __half2 h = __floats2half2_rn(lo * up, hi * up);
      xs[(long long)m * kp2 + frag_index(p)] = *reinterpret_cast<uint32_t*>(&h);
    }
  }
  __syncthreads();
}

// The activation prepared once per call instead of once per CTA (the GEMV's persistent CTAs each
// redid it: 264 times for qkv): one CTA per token row writes that row's fragments and 2**L to global
// memory; the GEMV launched after it (programmatic dependent launch) waits for them, starts their
// copy into shared memory (cp.async), then issues its weight prefetch.
__global__ void __launch_bounds__(THREADS) xprep_kernel(const __nv_bfloat16* x, long long sx, int K, int kc,
                                                        uint32_t* xfrag, float* xdown_g) {
  pdl_trigger();
  __shared__ float xdown[16];
  __shared__ uint32_t amax_bits[16];
  const int m = blockIdx.x;
  XPre pre;
  x_preload(x + m * sx, sx, 1, K, pre);
  prep_x(x + m * sx, sx, 1, K, kc, xfrag + (long long)m * kc * 32, xdown, amax_bits, pre, true);
  if (threadIdx.x == 0) xdown_g[m] = xdown[0];
}

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* src) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

struct Args {
  const __nv_bfloat16* x;  // dense / gate_up input [M, K]
  long long sx;
  const uint4* words;  // [E?][n_tiles][kc][32] uint4
  const uint32_t* scales;  // [E?][n_tiles][kc][8] u32
  long long wstride_e, sstride_e;  // per expert, in uint4 / u32 units
  const void* bias;
  int bias_kind;  // 0 none, 1 f32, 2 bf16
  long long bstride_e;
  __nv_bfloat16* out;  // dense / down: [M, N] bf16
  long long so;
  uint32_t* hfrag;  // gate_up writes, down reads: [slots][kc_h][4][8] u32 (f16 pairs)
  int kc_h;  // chunks of the h rows (down's K)
  int zero_row;  // unused since down stages h in shared memory; kept so older sources share the C API (A/B)
  const uint4* xfrag;  // dense: activation fragments [M][kc][32] u32 from xprep_kernel (null: prepared per CTA)
  const float* xdown_g;  // and their 2**L per row
  const int* ids;  // [M * top_k]
  const float* wts;  // [M * top_k]
  int M, N, K, n_tiles, kc, top_k, ksplit;
  float alpha, limit;
};

// MoE gate_up is built for 3 CTAs per SM (<= 80 registers; no spills for RW 2 PF 4 (80) or RW 4 PF 4 (72)): H200, same-process
// A/B, MoE layer M=1 experts only, gate_up variant 4 at 3 CTAs per SM vs variant 5 at 2: 25.3 / 25.5 /
// 25.5 vs 26.4 / 26.4 / 26.3 us. The dense kernels at 3 or 4 CTAs per SM were slower (qkv M=1 8.1 ->
// 8.3-10.0 us), and down spills at 80 registers: they keep 2.
template <int MODE>
constexpr int min_ctas_per_sm() { return MODE == MODE_GATEUP ? 3 : 2; }

template <int MODE, int NT, int RW, int RT, int PF>
__global__ void __launch_bounds__(THREADS, min_ctas_per_sm<MODE>()) mxfp4_kernel(const Args a) {
  extern __shared__ __align__(16) uint32_t smem[];
#ifdef MXFP4_PHASES
  PHASE_SET(0, gtimer());
  PHASE_SET(2, smid());
  PHASE_CLK(0);
  int ph_items = 0;
#endif
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // K split: warps with the same rw share rows; kslot picks the warp's K slice (kfirst, kstep below)
  int kslot, kstride, rw, slot_j = 0;
  if (MODE == MODE_DOWN) {
    kstride = a.ksplit;  // K slices per slot
    slot_j = warp / kstride;
    kslot = warp % kstride;
    rw = 0;
  } else {
    // WARPS / RW, as the host passes it, but known at compile time: the weight pointers then advance by a
    // constant (a run-time stride cost a 64-bit multiply and shifts per chunk)
    kstride = WARPS / RW;
    kslot = warp % kstride;
    rw = warp / kstride;
  }
  const bool warp_active = (MODE != MODE_DOWN) || slot_j < a.top_k;
  // K slice of a warp: chunks kfirst + i * kstep. MoE down: a contiguous run (kfirst = kslot * nck_max, step 1), so
  // its pointers step by a constant although its K split (8 / top_k) is a run-time value. Dense and gate_up keep
  // interleaved slices (kfirst = kslot, step kstride), their warps walking a row tile together. H200, same process,
  // MoE layer M=1 experts only (three repeats): down contiguous 22.3 / 22.3 / 22.4 us, interleaved 23.3 / 23.3 /
  // 23.4; gate_up contiguous as well 22.4 / 22.4 / 22.6, gate_up alone 24.0 / 24.3 / 24.2 (kernels/NOTES.md).
  constexpr bool kcontig = MODE == MODE_DOWN;
  const int nck_max = (a.kc + kstride - 1) / kstride;
  const int kfirst = kcontig ? kslot * nck_max : kslot, kstep = kcontig ? 1 : kstride;
  const int nck = warp_active ? max(0, min(nck_max, (a.kc - kfirst + kstep - 1) / kstep)) : 0;  // this warp's chunks
  const int np = ((nck_max + PF - 1) / PF) * PF;  // iterations per item (multiple of PF)
  const int tiles_per_item = RW * RT;
  const int groups = (a.n_tiles + tiles_per_item - 1) / tiles_per_item;
  int n_items;
  if (MODE == MODE_DENSE) n_items = groups;
  else if (MODE == MODE_GATEUP) n_items = a.M * a.top_k * groups;
  else n_items = a.M * groups;
  // Item order: strided over the grid, except down, where a CTA takes a contiguous run of items so
  // that consecutive items mostly share a token (its h slots are staged in shared memory once).
  const int per_cta = (n_items + gridDim.x - 1) / gridDim.x;
  const int first_item = MODE == MODE_DOWN ? blockIdx.x * per_cta : blockIdx.x;
  const int end_item = MODE == MODE_DOWN ? min(n_items, first_item + per_cta) : n_items;
  auto next_item = [&](int it) { return MODE == MODE_DOWN ? it + 1 : it + (int)gridDim.x; };

  // Shared memory: activation fragments (dense / gate_up: the M token rows; down: the top_k h slots
  // of one token), then xdown[16], 8 spare words (kept so the host's size is unchanged), amax[16], red (after
  // 16 spare words).
  const int xs_rows = (MODE == MODE_DOWN) ? a.top_k : a.M;
  uint32_t* xs = smem;
  float* xdown = reinterpret_cast<float*>(smem + (long long)xs_rows * a.kc * 32) + 16;
  uint32_t* amax_bits = reinterpret_cast<uint32_t*>(xdown + 16) + 8;
  float* red = reinterpret_cast<float*>(amax_bits + 16);  // [WARPS][RT][NT][4][32]

  const uint64_t pol = policy_evict_first();

  // Item -> (weight base for this warp, tile group, activation row for B, slot).
  auto item_info = [&](int it, long long& wbase, long long& sbase, int& grp, int& brow, int& slot) -> bool {
    if (MODE == MODE_DENSE) {
      wbase = 0; sbase = 0; grp = it; brow = 0; slot = 0;
      return true;
    } else if (MODE == MODE_GATEUP) {
      slot = it / groups;
      grp = it - slot * groups;
      brow = slot / a.top_k;
      const int e = a.ids[slot];
      wbase = (long long)max(e, 0) * a.wstride_e;
      sbase = (long long)max(e, 0) * a.sstride_e;
      return e >= 0;
    } else {
      const int tok = it / groups;
      grp = it - tok * groups;
      slot = tok * a.top_k + min(slot_j, a.top_k - 1);
      brow = min(slot_j, a.top_k - 1);  // row of the staged h slots
      const int e = a.ids[slot];
      wbase = (long long)max(e, 0) * a.wstride_e;
      sbase = (long long)max(e, 0) * a.sstride_e;
      return e >= 0 && slot_j < a.top_k;
    }
  };
  auto tile_of = [&](int grp, int rt) {
    const int tl = (grp * RW + rw) * RT + rt;
    return tl < a.n_tiles ? tl : a.n_tiles - 1;
  };

  // Prefetch cursor: (lit, lci) = next (item, iteration) to load; lw/ls its addresses. Loads run
  // PF iterations ahead of the math and cross item boundaries (np is a multiple of PF, so slot p
  // always holds iteration p mod PF of some item).
  uint4 wb[PF][RT];
  uint32_t sb[PF][RT];
  int lit = first_item, lci = 0;
  bool lok = false;
  const uint4* lw[RT];
  const uint32_t* ls[RT];
  auto set_item = [&](int it) {
    long long wbase = 0, sbase = 0;
    int grp = 0, brow, slot;
    lok = it < end_item && item_info(it, wbase, sbase, grp, brow, slot);
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const long long tc = (long long)tile_of(grp, rt) * a.kc + kfirst;
      lw[rt] = a.words + wbase + tc * 32 + lane;
      ls[rt] = a.scales + sbase + tc * 8 + g;
    }
  };
  int nck_p[PF];  // nck - p: "iteration i0 + p exists" is i0 < nck_p[p], one compare per chunk
#pragma unroll
  for (int p = 0; p < PF; ++p) nck_p[p] = nck - p;
  // Slot p of a group of PF: lci is the group's first iteration (np is a multiple of PF, so a group never
  // straddles two items), p a compile-time constant after unrolling. The pointers and the item cursor move once
  // per group and each load's address is the group's pointer plus a constant: per chunk that removed a 64-bit
  // pointer step per array and the item-end test (SASS of the K-split kernels).
  auto issue = [&](uint4 (&w)[RT], uint32_t (&s)[RT], int p) {
    const bool ok = lok && lci < nck_p[p];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      ld_stream_v4_if(w[rt], lw[rt] + p * kstep * 32, pol, ok);
      ld_stream_u32_if(s[rt], ls[rt] + p * kstep * 8, pol, ok);
    }
    if (p == PF - 1) {
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        lw[rt] += PF * kstep * 32;
        ls[rt] += PF * kstep * 8;
      }
      lci += PF;
      if (lci == np) {
        lci = 0;
        lit = next_item(lit);
        set_item(lit);
      }
    }
  };
  // The first PF loads of this CTA's first item (where that happens depends on what the weights wait for).
  auto start_stream = [&]() {
    set_item(lit);
#pragma unroll
    for (int p = 0; p < PF; ++p) issue(wb[p], sb[p], p);
  };
#pragma unroll
  for (int p = 0; p < PF; ++p)
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      wb[p][rt] = make_uint4(0u, 0u, 0u, 0u);
      sb[p][rt] = 0u;
    }

  if (MODE == MODE_DOWN) {
    // Weights and ids do not depend on the previous kernel (gate_up): prefetch, then wait for h.
    start_stream();
    PHASE_CLK(1);
    pdl_wait();
    PHASE_CLK(2);  // gate_up done (its h is visible)
  } else {
    // Dense with a.xfrag: fragments from xprep_kernel; their copy is issued before the weight stream,
    // so it is not queued behind it, and it is a plain copy (no atomics, no conversion) in every CTA.
    // Otherwise x is loaded into registers before the weight stream (see XPre) and prepared here.
    const bool copy_x = MODE == MODE_DENSE && a.xfrag != nullptr;
    XPre pre;
    if (copy_x) {
      pre.on = false;
      pdl_wait();
      const int n16 = a.M * a.kc * 8;
      for (int q = threadIdx.x; q < n16; q += THREADS) cp_async16(reinterpret_cast<uint4*>(xs) + q, a.xfrag + q);
      if (threadIdx.x < a.M) xdown[threadIdx.x] = a.xdown_g[threadIdx.x];
    } else {
      x_preload(a.x, a.sx, a.M, a.K, pre);
    }
    if (MODE == MODE_DENSE && copy_x) {
      start_stream();
    }
    PHASE_CLK(1);  // x loads and (dense with xprep_kernel's fragments) the weight prefetch issued
    if (copy_x) {
      cp_async_wait_all();
      __syncthreads();
    } else {
      prep_x(a.x, a.sx, a.M, a.K, a.kc, xs, xdown, amax_bits, pre, MODE == MODE_DENSE);
    }
    PHASE_CLK(2);  // activation fragments ready
    // x prepared in the CTA (dense M = 1): the weight prefetch is issued after it. Issued before, the prep's
    // barriers waited for warps stalled issuing their loads; once the per-chunk loop had lost its address
    // arithmetic this order won everywhere (H200, same-process bench, M=1: qkv 6.8 -> 6.5 us, o_proj 6.4 -> 6.2,
    // expert gate_up shape 6.8 -> 6.6, down shape 5.4 -> 5.3, lm_head 75.6 -> 74.7; it had cost lm_head ~3% on
    // the earlier loop, kernels/NOTES.md).
    if (MODE == MODE_DENSE && !copy_x) {
      start_stream();
    }
    if (MODE == MODE_GATEUP) {
      pdl_wait();  // expert ids come from the route / top-k kernel
      // The trigger must stay after the wait: down reads ids before its own wait (weight prefetch), which is safe
      // only because no gate_up CTA lets it launch before the ids' kernel has finished.
      pdl_trigger();
      start_stream();
    }
  }

  uint32_t xb[NT][8];
  int staged_tok = -1;  // down: token whose h slots are in xs

  for (int it = first_item; it < end_item; it = next_item(it)) {
#ifdef MXFP4_PHASES
    if (ph_items == 1) PHASE_CLK(5);  // the second item starts
#endif
    long long wbase, sbase;
    int grp, brow, slot;
    const bool active = item_info(it, wbase, sbase, grp, brow, slot);
    if (MODE == MODE_DOWN) {
      const int tok = it / groups;
      if (tok != staged_tok) {
        // This warp's part of the token's h (its slot's row, its K slice: all it reads) from global memory (written by
        // gate_up) to shared memory. Per warp, so no barrier across the CTA: a warp starts once its own part is in.
        // All of a batch's loads before any store: one L2 round trip per batch (K slice of 23 chunks: 184 pieces, 6 per lane).
        __syncwarp();
        if (warp_active) {
          const long long base = ((long long)slot_j * a.kc + kfirst) * 8;  // in 16-byte pieces
          const uint4* src = reinterpret_cast<const uint4*>(a.hfrag + (long long)tok * a.top_k * a.kc * 32) + base;
          uint4* dst = reinterpret_cast<uint4*>(xs) + base;
          const int n16 = nck * 8;
          for (int q0 = 0; q0 < n16; q0 += H_BATCH * 32) {
            uint4 v[H_BATCH];
#pragma unroll
            for (int u = 0; u < H_BATCH; ++u) {
              const int q = q0 + u * 32 + lane;
              if (q < n16) v[u] = __ldcg(src + q);
            }
#pragma unroll
            for (int u = 0; u < H_BATCH; ++u) {
              const int q = q0 + u * 32 + lane;
              if (q < n16) dst[q] = v[u];
            }
          }
        }
        __syncwarp();
        staged_tok = tok;
      }
    }
    // Epilogue parameters, loaded now so their latency hides behind the weight stream.
    float pb[RT][2];
    float pw = 0.f;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const int tl = (grp * RW + rw) * RT + rt;
      pb[rt][0] = pb[rt][1] = 0.f;
      if (MODE == MODE_DENSE) {
        const int r0 = tl * 16 + g, r1 = r0 + 8;
        const bool ok = a.bias_kind && kslot == 0 && tl < a.n_tiles;
        pb[rt][0] = ld_param_early(a.bias, a.bias_kind, r0, ok && r0 < a.N);
        pb[rt][1] = ld_param_early(a.bias, a.bias_kind, r1, ok && r1 < a.N);
      } else if (MODE == MODE_GATEUP) {
        const int i = tl * 8 + g;
        const bool ok = a.bias_kind && active && kslot == 0 && t == 0 && tl < a.n_tiles && i < a.N / 2;
        const long long e = ok ? (long long)a.ids[slot] : 0;
        pb[rt][0] = ld_param_early(a.bias, a.bias_kind, e * a.bstride_e + 2 * i, ok);
        pb[rt][1] = ld_param_early(a.bias, a.bias_kind, e * a.bstride_e + 2 * i + 1, ok);
      } else {
        const int tile = tile_of(grp, rt), r0 = tile * 16 + g, r1 = r0 + 8;
        const bool ok = a.bias_kind && active && kslot == 0;
        const long long e = ok ? (long long)a.ids[slot] : 0;
        pb[rt][0] = ld_param_early(a.bias, a.bias_kind, e * a.bstride_e + r0, ok && r0 < a.N);
        pb[rt][1] = ld_param_early(a.bias, a.bias_kind, e * a.bstride_e + r1, ok && r1 < a.N);
      }
    }
    if (MODE == MODE_DOWN && active) pw = a.wts[slot];
    // this lane's activation rows (B column g of n-tile nt; columns past the tokens read a real row, see load_xb)
    const uint32_t* xl[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (MODE == MODE_DENSE) {
        const int m = min(nt * 8 + g, a.M - 1);
        xl[nt] = xs + ((long long)m * a.kc * 4 + t) * 8;
      } else {  // one token column: gate_up the slot's token row, down the slot's staged h row
        xl[nt] = xs + ((long long)brow * a.kc * 4 + t) * 8;
      }
    }
    float acc[RT][NT][4] = {};

    for (int i0 = 0; i0 < np; i0 += PF) {
#pragma unroll
      for (int p = 0; p < PF; ++p) {
        const int ci = i0 + p;
        if (i0 < nck_p[p] && active) {
          load_xb<NT>(xl, kfirst + ci * kstep, xb);
#pragma unroll
          for (int rt = 0; rt < RT; ++rt) chunk_mma<NT>(wb[p][rt], sb[p][rt], xb, acc[rt]);
#ifdef MXFP4_PHASES
          if (ph_items == 0 && ci == 0) {  // the first weights have arrived and been used
            PHASE_DEP(acc[0][0][0]);
            PHASE_CLK(3);
          }
#endif
        }
        issue(wb[p], sb[p], p);  // slot p is free again: load iteration ci + PF (maybe of the next item)
      }
    }

#ifdef MXFP4_PHASES
    if (ph_items == 0) {
      PHASE_DEP(acc[0][0][0]);
      PHASE_CLK(4);  // first item's weight loop done
    }
    ++ph_items;
#endif
    // ---- epilogue ----
    if (MODE == MODE_DOWN) {
      // weight the slot, add its bias, fixed-order sum over the 8 warps
      const float wt = pw * 64.f;  // h stored * 2**8, decode * 2**-14: products are * 2**-6
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        // pb is 0 where there is no bias, for K slices other than 0 and for inactive slots
        const float v0 = fmaf(acc[rt][0][0], wt, pw * pb[rt][0]), v2 = fmaf(acc[rt][0][2], wt, pw * pb[rt][1]);
        red[((warp * RT + rt) * 2 + 0) * 32 + lane] = v0;
        red[((warp * RT + rt) * 2 + 1) * 32 + lane] = v2;
      }
      __syncthreads();
      if (warp == 0) {
        const int tok = it / groups;
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {
          float s0 = 0.f, s2 = 0.f;
          for (int w = 0; w < WARPS; ++w) {
            s0 += red[((w * RT + rt) * 2 + 0) * 32 + lane];
            s2 += red[((w * RT + rt) * 2 + 1) * 32 + lane];
          }
          const int tl = (grp * RW + 0) * RT + rt;
          if (t == 0 && tl < a.n_tiles) {
            const int r0 = tl * 16 + g, r1 = r0 + 8;
            if (r0 < a.N) a.out[tok * a.so + r0] = __float2bfloat16_rn(s0);
            if (r1 < a.N) a.out[tok * a.so + r1] = __float2bfloat16_rn(s2);
          }
        }
      }
      __syncthreads();
      continue;
    }

    if (kstride > 1) {
      if (kslot > 0) {
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[(((warp * RT + rt) * NT + nt) * 4 + i) * 32 + lane] = acc[rt][nt][i];
      }
      __syncthreads();
      if (kslot == 0) {
        for (int ks = 1; ks < kstride; ++ks) {
          const int w = warp + ks;
#pragma unroll
          for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[rt][nt][i] += red[(((w * RT + rt) * NT + nt) * 4 + i) * 32 + lane];
        }
      }
    }
    if (kslot == 0 && active) {
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const int tl = (grp * RW + rw) * RT + rt;
        if (tl >= a.n_tiles) continue;
        const int r0 = tl * 16 + g, r1 = r0 + 8;
        if (MODE == MODE_DENSE) {
          const float b0 = pb[rt][0], b1 = pb[rt][1];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const int m0 = nt * 8 + 2 * t, m1 = m0 + 1;
            if (m0 < a.M) {
              if (r0 < a.N) a.out[m0 * a.so + r0] = __float2bfloat16_rn(fmaf(acc[rt][nt][0], xdown[m0], b0));
              if (r1 < a.N) a.out[m0 * a.so + r1] = __float2bfloat16_rn(fmaf(acc[rt][nt][2], xdown[m0], b1));
            }
            if (m1 < a.M) {
              if (r0 < a.N) a.out[m1 * a.so + r0] = __float2bfloat16_rn(fmaf(acc[rt][nt][1], xdown[m1], b0));
              if (r1 < a.N) a.out[m1 * a.so + r1] = __float2bfloat16_rn(fmaf(acc[rt][nt][3], xdown[m1], b1));
            }
          }
        } else {  // GATEUP: token column 0 (lanes t == 0): c0 = gate_i (row g), c2 = up_i (row g+8)
          const int i = tl * 8 + g;  // pair index = h column
          if (t == 0 && i < a.N / 2) {
            float gate = fmaf(acc[rt][0][0], xdown[brow], pb[rt][0]), up = fmaf(acc[rt][0][2], xdown[brow], pb[rt][1]);
            gate = fminf(gate, a.limit);
            up = fminf(fmaxf(up, -a.limit), a.limit);
            const float glu = gate / (1.f + expf(-gate * a.alpha));
            const float h = (up + 1.f) * glu;
            __half* hp = reinterpret_cast<__half*>(a.hfrag + (long long)slot * a.kc_h * 32 + frag_index(i >> 1));
            hp[i & 1] = __float2half_rn(h * 256.f);
          }
        }
      }
    }
    if (kstride > 1) __syncthreads();
  }
#ifdef MXFP4_PHASES
  PHASE_CLK(6);
  PHASE_SET(1, gtimer());
  PHASE_SET(3, (unsigned long long)ph_items);
#endif
}

// Top-k of router logits: one warp per row, the row's logits held as keys in registers (lane l: experts l, l + 32,
// ...). Keys are the float order as unsigned order, so each pick is one max and one min warp reduction (REDUX)
// instead of ten shuffles, and nothing goes through shared memory.
constexpr int TOPK_PL = 8;  // keys per lane: E <= 256 (gpt-oss: 32 and 128)

__device__ __forceinline__ unsigned order_key(float v) {
  // NaN -> -inf: vLLM's padded CUDA-graph rows carry garbage, and a NaN must never be preferred over a number,
  // while an all-NaN row still yields k distinct valid ids (the MoE kernels index expert weights with them).
  // -0 -> +0: they compare equal, so the lower expert id wins, as with float comparisons.
  if (v != v) v = -INFINITY;
  if (v == 0.f) v = 0.f;
  const unsigned u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // -inf -> 0x007FFFFF; 0 is below every key: "taken"
}

__device__ __forceinline__ float key_value(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// Top-k + softmax over the k, by one warp; ties go to the lower expert id (torch.topk's order for distinct values).
// Needs top_k <= E (checked by the host entry points): a pick among only taken keys would have no valid id.
__device__ void select_topk_keys(unsigned (&key)[TOPK_PL], int top_k, int* ids, float* wts, int lane) {
  float sel_v[8];
  int sel_i[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (j < top_k) {
      unsigned best = 0u;
      unsigned bi = 0xffffffffu;
#pragma unroll
      for (int t = 0; t < TOPK_PL; ++t)  // strict >: the lane's lowest expert among equal keys
        if (key[t] > best) {
          best = key[t];
          bi = lane + 32 * t;
        }
      const unsigned wmax = __reduce_max_sync(0xffffffffu, best);
      const unsigned wi = __reduce_min_sync(0xffffffffu, best == wmax ? bi : 0xffffffffu);
#pragma unroll
      for (int t = 0; t < TOPK_PL; ++t)
        if (lane + 32 * t == (int)wi) key[t] = 0u;
      sel_v[j] = key_value(wmax);
      sel_i[j] = (int)wi;
    }
  }
  if (lane == 0) {
    float den = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (j < top_k) den += expf(sel_v[j] - sel_v[0]);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (j < top_k) {
        ids[j] = sel_i[j];
        wts[j] = expf(sel_v[j] - sel_v[0]) / den;
      }
  }
}

// Routing from router logits another GEMM produced (vLLM's): one warp per row, rows spread over CTAs (a prefill
// of 2048 tokens is 256 CTAs; one CTA used to walk all rows, 256 per warp). vLLM otherwise ran torch.topk + sort +
// softmax, ~10.7 us per layer on an H200 (profiled decode step).
__global__ void __launch_bounds__(THREADS) topk_kernel(const void* logits, int l_kind, long long sl, int* ids, float* wts,
                                                       int M, int E, int top_k) {
  pdl_trigger();  // the MoE's gate_up may launch and prepare x now; it waits (griddepcontrol.wait) for these ids
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long m = (long long)blockIdx.x * WARPS + warp;
  if (m >= M) return;
  unsigned key[TOPK_PL];
#pragma unroll
  for (int t = 0; t < TOPK_PL; ++t) {
    const int q = lane + 32 * t;
    key[t] = q < E ? order_key(load_param(logits, l_kind, m * sl + q)) : 0u;
  }
  select_topk_keys(key, top_k, ids + m * top_k, wts + m * top_k, lane);
}

// Router: logits[m, e] = x[m] . W[e] + b[e] (fp32 from the stored dtype), then top-k + softmax by the
// last CTA. ROUTE_WPE warps per expert; x is read through L1 (shared by the CTA's warps).
__global__ void __launch_bounds__(THREADS) route_kernel(const __nv_bfloat16* x, long long sx, const void* w, int w_kind,
                                                        const void* b, int b_kind, float* logits, int* counter,
                                                        int* ids, float* wts, int M, int E, int H, int top_k) {
  pdl_trigger();  // gate_up may start its x preparation
  // ROUTE_WPE warps per expert, each a strided quarter of H, partial sums added in a fixed order:
  // every lane has <= 3 16-byte loads of the router row in flight for H = 2880 (one memory round
  // trip; with one warp per expert the compiler interleaved 12 loads with the FMAs: ~3 trips).
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int EPC = WARPS / ROUTE_WPE;
  const int e = blockIdx.x * EPC + warp / ROUTE_WPE, part = warp % ROUTE_WPE;
  __shared__ float part_sum[WARPS];
  const bool vec = (w_kind == 2) && (H % 8 == 0) && ((sx & 7) == 0) &&
                   ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) & 15) == 0;
  const float bias_e = (e < E && part == 0 && b_kind) ? load_param(b, b_kind, e) : 0.f;  // early
  for (int m = 0; m < M; ++m) {
    float s = 0.f;
    if (e < E) {
      if (vec) {  // 16-byte loads of x and of the bf16 router row, all issued before the math
        const uint4* xr = reinterpret_cast<const uint4*>(x + m * sx);
        const uint4* wr = reinterpret_cast<const uint4*>(reinterpret_cast<const __nv_bfloat16*>(w) + (long long)e * H);
        for (int q0 = part * 32 + lane; q0 < H / 8; q0 += 32 * ROUTE_WPE * ROUTE_RQ) {
          uint4 xv[ROUTE_RQ], wv[ROUTE_RQ];
#pragma unroll
          for (int j = 0; j < ROUTE_RQ; ++j) {
            const int q = q0 + j * 32 * ROUTE_WPE;
            const bool ok = q < H / 8;
            xv[j] = wv[j] = make_uint4(0u, 0u, 0u, 0u);
            ld_v4_if(xv[j], xr + q, ok);
            ld_v4_if(wv[j], wr + q, ok);
          }
#pragma unroll
          for (int j = 0; j < ROUTE_RQ; ++j) {
            const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv[j]);
            const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv[j]);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float2 xf = __bfloat1622float2(xp[i]), wf = __bfloat1622float2(wp[i]);
              s = fmaf(xf.x, wf.x, s);
              s = fmaf(xf.y, wf.y, s);
            }
          }
        }
      } else {
        for (int k = part * 32 + lane; k < H; k += 32 * ROUTE_WPE)
          s = fmaf(bf16f(x + m * sx + k), load_param(w, w_kind, (long long)e * H + k), s);
      }
#pragma unroll
      for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    if (lane == 0) part_sum[warp] = s;
    __syncthreads();
    if (e < E && part == 0 && lane == 0) {
      float t = bias_e;
#pragma unroll
      for (int j = 0; j < ROUTE_WPE; ++j) t += part_sum[warp + j];
      logits[m * E + e] = t;
    }
    __syncthreads();
  }
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int m = warp; m < M; m += WARPS) {
    unsigned key[TOPK_PL];
#pragma unroll
    for (int t = 0; t < TOPK_PL; ++t) {
      const int q = lane + 32 * t;
      key[t] = q < E ? order_key(__ldcg(logits + m * E + q)) : 0u;  // written by the other CTAs: past L1
    }
    select_topk_keys(key, top_k, ids + m * top_k, wts + m * top_k, lane);
  }
  if (threadIdx.x == 0) *counter = 0;
}

// ---- Prefill: M > 16 from the same packed bytes ------------------------------------------------------
// The decode kernels' inner step (one weight word per lane = its m16n8k16 A fragment, 8 integer instructions to
// decode, one FFMA per accumulator per MX block for the E8M0 scale) with NT x 8 token columns per CTA instead of
// one or two: each decoded fragment feeds NT mma.sync. The activation fragments (f16, xprep_kernel's layout, or h
// as gate_up writes it) of the CTA's BM = 8 * NT rows are staged chunk by chunk in shared memory with cp.async
// (PF_STAGES deep), read back with 16-byte loads; the weights stream into registers PF_W chunks ahead. Why not
// Triton's tensor-core GEMM on these bytes (packed_mm.py): it moves every decoded fragment from the decode's
// register layout to the dot operand's layout through shared memory, and is bound by that (Nsight Compute on the
// qkv launch: L1/TEX 89%, issue 42%; kernels/NOTES.md "Prefill on the packed layout"). Here the weights never
// touch shared memory, as in Marlin's large-M path (vLLM csrc/quantization/marlin: B fragments dequantized in
// registers, A tiles staged by cp.async).
//
// A CTA is 8 warps; warp w takes row tiles (grp * 8 + w) * RT + [0, RT) against all BM rows of token block blk
// (pf_cta_tile: blockIdx.y and blockIdx.x, or down's panel order). Rows: dense, blk * BM + i; grouped (MoE),
// rows[blk * BM + i] from align_by_expert (a slot, or >= n_rows for padding), expert bexp[blk] (-1: nothing to do).
constexpr int PF_STAGES = 3;
constexpr int PF_W = 2;        // weight chunks in flight per warp
// u32 per staged row: one chunk (32) + 4 of padding. A quarter-warp's 16-byte loads then touch rows g, g+1 at
// lane offsets t * 32 bytes: without the padding rows g and g+1 start on the same bank (2-way conflict).
constexpr int PF_ROW = 36;

struct PfArgs {
  const void* xfrag;      // FORM 0: [rows_x][kc][32] u32 f16 pairs; FORM 1: bf16 rows [rows_x][sx], K used
  const float* xdown;     // [rows_x] 2**L of each activation row, or null: xmul for all
  float xmul;
  const int* rows;        // grouped: [n_blocks * BM]; null: dense
  const int* bexp;        // grouped: [n_blocks]
  int x_div;              // activation row of a slot = slot / x_div
  int n_rows;             // dense: M; grouped: slots (S; rows >= S are padding)
  const uint4* words;
  const uint32_t* scales;
  long long wstride_e, sstride_e;  // per expert, in uint4 / u32 units
  const void* bias;
  int bias_kind;
  long long bstride_e;
  void* out;              // dense: bf16 [M][so]; gate_up: h fragments u32 [S][kc_h][32] (f16 * 2**8); down: f32 [S][so],
  long long so;           // or f16 [S][so] holding value * 2**-DOWN_F16_SHIFT when down_f16
  int down_f16;
  int kc_h;
  const float* wts;       // down: routing weight per slot
  long long sx;           // FORM 1: row stride of x in elements (a multiple of 8)
  int K;                  // FORM 1: columns of x; staged pieces at or past K are zero-filled
  int N, n_tiles, kc;
  float alpha, limit;
};

// f(std::integral_constant<int, L>) for L the smallest multiple of PF_TILE_STEP (at most NTL) that covers n live token
// tiles: the K loop is compiled once per L, with no branch between its MMAs.
constexpr int PF_TILE_STEP = 2;
template <int NTL, typename F>
__device__ __forceinline__ void pick_live_tiles(int n, F& f) {
  static_assert(NTL % PF_TILE_STEP == 0, "the live-tile counts are multiples of PF_TILE_STEP");
  if constexpr (NTL <= PF_TILE_STEP) {
    f(std::integral_constant<int, NTL>{});
  } else {
    if (n > NTL - PF_TILE_STEP) f(std::integral_constant<int, NTL>{});
    else pick_live_tiles<NTL - PF_TILE_STEP>(n, f);
  }
}

// The token block and row group of this CTA. The grid is (token blocks, row groups) and CTAs start in launch order,
// blockIdx.x fastest: the CTAs in flight cover every token block for a few row groups, and each reads its block's whole
// activation tile. With PANEL > 0 the launch order walks PANEL token blocks across all row groups before the next
// PANEL, so the activation tiles in flight are those PANEL blocks' (down's h at 2048 tokens is ~47 MB, about an H100's
// L2). Down only, in the wgmma kernel (sm_90a: the one place the macro is read). Served at 16: on an H100 the served 20b
// prefill's down kernel took 9,114 us per 2048-token prefill against 9,726 / 9,721 us for panel 0 and its A/A copy
// (kernels/NOTES.md "Panels of 16 served"). A copy that defines the macro first is an A/B spec (0: the order
// of before).
#ifndef MXFP4_DOWN_PANEL
#define MXFP4_DOWN_PANEL 16
#endif
// The same for the mma.sync kernel's down (mxfp4_pf_kernel: GB10's MoE prefill, and the H100 / H200 forms 0 and 1).
// 0, the order of before, until a GB10 run shows a width faster (docs/GB10.md: a copy that defines it first is the A/B
// spec); GB10's L2 and 48 SMs are not an H100's, so the H100's 16 is not assumed there.
#ifndef MXFP4_MMA_DOWN_PANEL
#define MXFP4_MMA_DOWN_PANEL 0
#endif
template <int PANEL>
__device__ __forceinline__ void pf_cta_tile(int& blk, int& grp) {
  blk = blockIdx.x;
  grp = blockIdx.y;
  if (PANEL <= 0 || PANEL >= (int)gridDim.x) return;
  const int nb = gridDim.x, ng = gridDim.y, cta = blockIdx.y * nb + blockIdx.x, per = PANEL * ng, full = nb / PANEL;
  const int p = cta / per;
  const int w = p < full ? PANEL : nb - full * PANEL, q = cta - p * per;  // the last panel holds the rest
  blk = p * PANEL + q % w;
  grp = q / w;
}

// The token rows of block blk, shared by both prefill kernels: srow[i] is the activation slot of row i of the block
// (-1: padding), e its expert. false: the block has no expert (bexp -1) and the whole CTA returns before any barrier.
// nt_live counts the token tiles with a real row: padding sits at the end of a block (align_by_expert pads an expert's
// run at its end; dense blocks end at M), so the MMAs of the tiles past them are skipped. An expert's run of 70 slots
// in blocks of 64 made the second block a full block's MMAs for 6 tokens: about half of all MoE blocks at 2048 tokens
// and top-4 of 128 experts. The weights are still decoded per block; the tensor pipe does only the real tiles.
template <int BM>
__device__ __forceinline__ bool pf_block_rows(const PfArgs& a, int blk, int* srow, int& e, int& nt_live) {
  e = 0;
  if (a.bexp) {
    e = a.bexp[blk];
    if (e < 0) return false;
  }
  bool real = false;
  if (threadIdx.x < BM) {
    const int r = a.rows ? a.rows[blk * BM + threadIdx.x] : blk * BM + threadIdx.x;
    real = r < a.n_rows;
    srow[threadIdx.x] = real ? r : -1;
  }
  nt_live = (__syncthreads_count(real) + 7) >> 3;
  return true;
}

// The activation row of each of this thread's CP staging pieces: 16 bytes (threadIdx.x % 8) of token rows
// threadIdx.x / 8 + (THREADS / 8) u. Padding rows copy the block's first row (always a real one: align_by_expert pads an
// expert's run at its end): their columns are computed and never stored. Only the row index is kept per piece: the
// earlier form (a 64-bit source pointer, a shared address and a flag per piece) did not fit the 2-CTA build's 128
// registers, and ptxas spilled or recomputed it every chunk, ~14% of the MoE loop's instructions (sm_90a SASS).
// LIVE (the *_live_kernel entries, packed_mm's cuda_moe_live_rows_max_slots): padding rows are staged as zeros instead
// (xrow -1; src-size 0 reads nothing). Their copies of the first row cost L2 traffic: a 64-row block's activations are
// 8 KB per K chunk against its 4 KB of weights, and a decode batch of 32 tokens gives the 120b's experts one or two live
// rows per 64-row block. Zeros are as harmless as the copies (their columns are never stored). H100, MoE layer, same
// output bits: 0.83-0.92x the time at 32-64 tokens, not faster at 2048 (kernels/NOTES.md "Decode batches of 32 tokens,
// measured"), and it costs loop instructions. MXFP4_STAGE_LIVE_ROWS 1 makes every entry LIVE (an A/B copy).
#ifndef MXFP4_STAGE_LIVE_ROWS
#define MXFP4_STAGE_LIVE_ROWS 0
#endif
template <bool LIVE, int CP>
__device__ __forceinline__ void pf_stage_rows(const PfArgs& a, const int* srow, int (&xrow)[CP]) {
  constexpr int ROWS_PER_U = THREADS / 8;
#pragma unroll
  for (int u = 0; u < CP; ++u) {
    const int r = (threadIdx.x >> 3) + u * ROWS_PER_U;
    if constexpr (LIVE || MXFP4_STAGE_LIVE_ROWS)
      xrow[u] = srow[r] >= 0 ? srow[r] / a.x_div : -1;
    else
      xrow[u] = (srow[r] >= 0 ? srow[r] : srow[0]) / a.x_div;
  }
}

// One staged piece: 16 bytes of activation row xrow at col into shared dst (bytes 0: zero-filled, nothing read).
template <bool LIVE>
__device__ __forceinline__ void pf_stage_piece(uint32_t dst, const char* col, int xrow, unsigned long long row_bytes,
                                               uint32_t bytes) {
  if constexpr (LIVE || MXFP4_STAGE_LIVE_ROWS) {
    const bool live = xrow >= 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(col + (unsigned long long)(live ? xrow : 0) * row_bytes), "r"(live ? bytes : 0u));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(col + (unsigned long long)xrow * row_bytes), "r"(bytes));
  }
}

// A warp's weight stream: its RT row tiles (tile0 + rt * tile_step; past the last tile, the last, whose products are
// never stored), WPF chunks of each held in registers (words wb, scale words sb), loaded at construction when act.
template <int RT, int WPF>
struct PfWeights {
  const uint4* wp[RT];
  const uint32_t* sp[RT];
  uint4 wb[WPF][RT];
  uint32_t sb[WPF][RT];
  __device__ __forceinline__ PfWeights(const PfArgs& a, int e, int tile0, int tile_step, bool act, int lane, int g) {
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const long long tl = min(tile0 + rt * tile_step, a.n_tiles - 1);
      wp[rt] = a.words + e * a.wstride_e + tl * a.kc * 32 + lane;
      sp[rt] = a.scales + e * a.sstride_e + tl * a.kc * 8 + g;
    }
#pragma unroll
    for (int p = 0; p < WPF; ++p)
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        wb[p][rt] = make_uint4(0u, 0u, 0u, 0u);
        sb[p][rt] = 0u;
        if (act && p < a.kc) {
          wb[p][rt] = __ldg(wp[rt] + p * 32);
          sb[p][rt] = __ldg(sp[rt] + p * 8);
        }
      }
  }
  // slot p of every row tile <- chunk cw (once the slot's words are decoded)
  __device__ __forceinline__ void refill(int p, int cw, int kc) {
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
      if (cw < kc) {
        wb[p][rt] = __ldg(wp[rt] + cw * 32);
        sb[p][rt] = __ldg(sp[rt] + cw * 8);
      }
  }
};

// bf16 form: step s (0..3) of one weight chunk (k-step s & 1 of MX block s >> 1) of each row tile, decoded and scaled
// into af. The two scale registers per row tile serve both k-steps of an MX block: made at its first step, kept for
// the second.
template <int RT>
__device__ __forceinline__ void pf_decode_step(const uint4 (&wb)[RT], const uint32_t (&sb)[RT], int s,
                                               uint32_t (&scl)[RT][2], uint32_t (&af)[RT][4]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const uint32_t w = s == 0 ? wb[rt].x : s == 1 ? wb[rt].y : s == 2 ? wb[rt].z : wb[rt].w;
    // scale bytes (row g, blk 0), (g+8, 0), (g, 1), (g+8, 1): fragment registers 0, 2 are row g, 1, 3 row g+8
    if (!(s & 1)) {
      scl[rt][0] = s >> 1 ? e8m0_bf16x2<2>(sb[rt]) : e8m0_bf16x2<0>(sb[rt]);
      scl[rt][1] = s >> 1 ? e8m0_bf16x2<3>(sb[rt]) : e8m0_bf16x2<1>(sb[rt]);
    }
    decode4_bf16(w, af[rt]);
    af[rt][0] = bf16x2_mul(af[rt][0], scl[rt][0]);
    af[rt][1] = bf16x2_mul(af[rt][1], scl[rt][1]);
    af[rt][2] = bf16x2_mul(af[rt][2], scl[rt][0]);
    af[rt][3] = bf16x2_mul(af[rt][3], scl[rt][1]);
  }
}

// The bias of output rows r0 and r1 of expert e (0 past N or without a bias): the dense and down epilogues' rows.
__device__ __forceinline__ void pf_row_bias(const PfArgs& a, int e, int r0, int r1, float& b0, float& b1) {
  b0 = 0.f;
  b1 = 0.f;
  if (a.bias_kind) {
    if (r0 < a.N) b0 = load_param(a.bias, a.bias_kind, e * a.bstride_e + r0);
    if (r1 < a.N) b1 = load_param(a.bias, a.bias_kind, e * a.bstride_e + r1);
  }
}

// The prefill epilogue: lane (g, t) of a warp holds, per row tile rt (tile0 + rt * tile_step), rows (16 tl + g,
// 16 tl + g + 8) x columns (8 nt + 2t, 8 nt + 2t + 1): the layout of mma.sync's m16n8 accumulators, and of wgmma's
// m64nN ones for the warp's 16 rows. BF: the activations were bf16 rows (no per-row 2**L to undo; gate_up writes bf16
// h rows) rather than f16 fragments.
template <int MODE, int NT, int RT, bool BF>
__device__ __forceinline__ void pf_epilogue(const PfArgs& a, float (&acc)[RT][NT][4], int tile0, int tile_step,
                                            const int* srow, int e, int g, int t) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const int tl = tile0 + rt * tile_step;
    const bool tile_ok = tl < a.n_tiles;  // the same in all lanes (gate_up's shuffle below needs all of them)
    if (MODE == MODE_GATEUP) {
      const int i = tl * 8 + g;  // h column: packed rows g / g + 8 are gate_i / up_i
      const bool ok = a.bias_kind && tile_ok && i < a.N / 2;
      const float bg = ok ? load_param(a.bias, a.bias_kind, e * a.bstride_e + 2 * i) : 0.f;
      const float bu = ok ? load_param(a.bias, a.bias_kind, e * a.bstride_e + 2 * i + 1) : 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float h[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int slot = srow[nt * 8 + 2 * t + j];
          const float xd = BF ? 1.f : (a.xdown ? a.xdown[max(slot, 0) / a.x_div] : a.xmul);
          float gate = fmaf(acc[rt][nt][j], xd, bg), up = fmaf(acc[rt][nt][2 + j], xd, bu);
          gate = fminf(gate, a.limit);
          up = fminf(fmaxf(up, -a.limit), a.limit);
          h[j] = (up + 1.f) * (gate / (1.f + expf(-gate * a.alpha)));
        }
        // h columns i and i ^ 1 of one token make one u32 (f16 pair): lanes g and g ^ 1 (lane ^ 4) trade halves,
        // the even lane keeps token 2t, the odd one token 2t + 1.
        const bool odd = g & 1;
        const float other = __shfl_xor_sync(0xffffffffu, odd ? h[0] : h[1], 4);
        const int slot = srow[nt * 8 + 2 * t + (odd ? 1 : 0)];
        if constexpr (BF) {
          // bf16 rows [S][so]: columns i & ~1 and (i & ~1) + 1 (N / 2 is a multiple of 8: paired packing needs N % 16 == 0)
          if (tile_ok && slot >= 0 && i < a.N / 2) {
            const __nv_bfloat162 v = odd ? __floats2bfloat162_rn(other, h[1]) : __floats2bfloat162_rn(h[0], other);
            reinterpret_cast<__nv_bfloat162*>(reinterpret_cast<__nv_bfloat16*>(a.out) + (long long)slot * a.so)[i >> 1] = v;
          }
        } else if (tile_ok && slot >= 0) {
          __half2 v = odd ? __floats2half2_rn(other * 256.f, h[1] * 256.f) : __floats2half2_rn(h[0] * 256.f, other * 256.f);
          reinterpret_cast<uint32_t*>(a.out)[(long long)slot * a.kc_h * 32 + frag_index(i >> 1)] = *reinterpret_cast<uint32_t*>(&v);
        }
      }
      continue;
    }
    if (!tile_ok) continue;
    const int r0 = tl * 16 + g, r1 = r0 + 8;
    float b0, b1;
    pf_row_bias(a, e, r0, r1, b0, b1);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int row = srow[nt * 8 + 2 * t + j];
        if (row < 0) continue;
        if (MODE == MODE_DENSE) {
          const float xd = BF ? 1.f : (a.xdown ? a.xdown[row / a.x_div] : a.xmul);
          __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(a.out) + row * a.so;
          if (r0 < a.N) o[r0] = __float2bfloat16_rn(fmaf(acc[rt][nt][j], xd, b0));
          if (r1 < a.N) o[r1] = __float2bfloat16_rn(fmaf(acc[rt][nt][2 + j], xd, b1));
        } else {  // down: one fp32 row per slot, routing weight applied; the caller sums a token's slots in order
          const float xd = BF ? 1.f : (a.xdown ? a.xdown[row / a.x_div] : a.xmul), w = a.wts[row];
          float* o = reinterpret_cast<float*>(a.out) + row * a.so;
          if (r0 < a.N) o[r0] = fmaf(acc[rt][nt][j], xd, b0) * w;
          if (r1 < a.N) o[r1] = fmaf(acc[rt][nt][2 + j], xd, b1) * w;
        }
      }
  }
}

// Down's rows in f16 (PfArgs.down_f16): value * 2**-DOWN_F16_SHIFT, so that f16's range holds |value| up to ~1e6 and
// its subnormals start at 2**-10 (an absolute error <= 2**-21 below that); 11 significant bits where bf16 rows kept 8
// (those moved the served model's logprobs past level 2's near-tie allowance). Half the bytes of fp32 rows, written by
// down and read once by the combine. Not clamped: a value past the range becomes inf and NaN stays NaN, as loud in the
// model's output as in fp32 rows (a clamp would turn NaN into -65504).
constexpr int DOWN_F16_SHIFT = 4;
__device__ __forceinline__ __half2 down_f16_pair(float lo, float hi) {
  constexpr float s = 1.f / (1 << DOWN_F16_SHIFT);
  return __floats2half2_rn(lo * s, hi * s);
}

// pf_epilogue's down rows in f16: lanes g and g ^ 1 (lane ^ 4) hold output columns r0, r0 ^ 1 (and r1, r1 ^ 1) of the
// same two tokens 2t, 2t + 1; they trade one f16 pair so that the even lane stores token 2t's columns as two 4-byte
// pairs and the odd lane token 2t + 1's. N even (the host checks), so a pair is in range when its lane's column is.
template <int NT, int RT, bool BF>
__device__ __forceinline__ void pf_down_f16(const PfArgs& a, float (&acc)[RT][NT][4], int tile0, int tile_step,
                                            const int* srow, int e, int g, int t) {
  const bool odd = g & 1;
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const int tl = tile0 + rt * tile_step;
    if (tl >= a.n_tiles) continue;  // the same in all lanes: the shuffle below needs all of them
    const int r0 = tl * 16 + g, r1 = r0 + 8;
    float b0, b1;
    pf_row_bias(a, e, r0, r1, b0, b1);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      __half2 pair[2];  // token 2t + j: (column r0, column r1)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int row = srow[nt * 8 + 2 * t + j];
        const float xd = BF ? 1.f : (a.xdown ? a.xdown[max(row, 0) / a.x_div] : a.xmul);
        const float w = row >= 0 ? a.wts[row] : 0.f;
        pair[j] = down_f16_pair(fmaf(acc[rt][nt][j], xd, b0) * w, fmaf(acc[rt][nt][2 + j], xd, b1) * w);
      }
      // the even lane stores token 2t and sends token 2t + 1's pair; the odd lane the other way round
      const __half2 own = odd ? pair[1] : pair[0], send = odd ? pair[0] : pair[1];
      const uint32_t got = __shfl_xor_sync(0xffffffffu, *reinterpret_cast<const uint32_t*>(&send), 4);
      const __half2 other = *reinterpret_cast<const __half2*>(&got);  // the partner's columns of this lane's token
      const int row = srow[nt * 8 + 2 * t + (odd ? 1 : 0)];
      if (row < 0 || r0 >= a.N) continue;
      __half2* o = reinterpret_cast<__half2*>(reinterpret_cast<__half*>(a.out) + row * a.so);
      // column pair (r & ~1, r | 1): the even lane's value first
      o[r0 >> 1] = odd ? __halves2half2(__low2half(other), __low2half(own)) : __halves2half2(__low2half(own), __low2half(other));
      if (r1 < a.N)
        o[r1 >> 1] = odd ? __halves2half2(__high2half(other), __high2half(own))
                         : __halves2half2(__high2half(own), __high2half(other));
    }
  }
}

// CTAS: CTAs per SM the registers are capped for (2: <= 128 registers, so a CTA waiting at its per-chunk barrier
// leaves the other one issuing).
// FORM 0: f16 activation fragments (xprep_kernel's, or gate_up's h), the E8M0 scale as one FFMA per accumulator per
// MX block into a fresh 2-MMA partial (fp16 cannot hold value * 2**-14 * scale). FORM 1: bf16 activations as they
// are (x rows, or gate_up's h as bf16 rows), read from the staged tile by ldmatrix; the decoded fragment is bf16
// (value * 2**-126) and is multiplied by its scale in bf16 before the MMA (exact: bf16 has fp32's exponent range,
// Marlin's order: vLLM csrc/quantization/marlin scales the dequantized B fragment before its mma), so the MMAs
// accumulate straight into the accumulators: no partials, no FFMA.
template <int MODE, int NT, int RT, int CTAS, int FORM, bool LIVE>
__device__ __forceinline__ void pf_kernel_body(const PfArgs& a) {
  constexpr int BM = NT * 8;
  constexpr int PIECES = BM * 8;  // 16-byte pieces per staged chunk
  constexpr int CP = (PIECES + THREADS - 1) / THREADS;
  extern __shared__ __align__(16) uint32_t smem[];  // [PF_STAGES][BM][PF_ROW]
  __shared__ int srow[BM];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int e, nt_live, blk, grp;
  pf_cta_tile<MODE == MODE_DOWN ? MXFP4_MMA_DOWN_PANEL : 0>(blk, grp);
  if (!pf_block_rows<BM>(a, blk, srow, e, nt_live)) return;
  // A chunk of a row is 128 bytes in both forms (32 f16 pairs, or 64 bf16 values); the shared address of a piece is
  // one register plus compile-time offsets.
  static_assert(PIECES % THREADS == 0, "every thread stages the same number of pieces");
  constexpr int ROWS_PER_U = THREADS / 8;
  const int t8 = threadIdx.x & 7;
  int xrow[CP];
  pf_stage_rows<LIVE>(a, srow, xrow);
  const unsigned long long row_bytes = FORM ? (unsigned long long)a.sx * 2 : (unsigned long long)a.kc * 128;
  const char* xbase = reinterpret_cast<const char*>(a.xfrag) + t8 * 16;
  const uint32_t dst0 = (uint32_t)__cvta_generic_to_shared(smem + (threadIdx.x >> 3) * PF_ROW + t8 * 4);
  auto stage = [&](int c) {
    const uint32_t dst = dst0 + (uint32_t)((c % PF_STAGES) * BM * PF_ROW * 4);
    // bf16 rows end at K: pieces past it are zero-filled (src-size 0 reads nothing), as xprep pads its fragments
    const bool in_k = !FORM || c * 64 + t8 * 8 < a.K;
    const uint32_t bytes = in_k ? 16u : 0u;
    const char* col = xbase + (in_k ? c * 128 : 0);
#pragma unroll
    for (int u = 0; u < CP; ++u) pf_stage_piece<LIVE>(dst + u * ROWS_PER_U * PF_ROW * 4, col, xrow[u], row_bytes, bytes);
  };
  auto commit = [] { asm volatile("cp.async.commit_group;\n" ::: "memory"); };

  const int tile0 = (grp * WARPS + warp) * RT;
  const bool wact = tile0 < a.n_tiles;
  PfWeights<RT, PF_W> w(a, e, tile0, 1, wact, lane, g);
#pragma unroll
  for (int s = 0; s < PF_STAGES - 1; ++s) {
    if (s < a.kc) stage(s);
    commit();
  }
  float acc[RT][NT][4] = {};

  // The K loop for the first NTL token tiles of the block (a compile-time count, so the tile loop is unrolled without a
  // branch between its MMAs). A per-tile `nt >= nt_live` break there made the compiler finish each tile's MMAs before
  // the next tile's (Nsight Compute, H200, gate_up at 2048 tokens: "wait" stalls on NOP / WARPSYNC / BRA between them;
  // kernels/NOTES.md "Where the MoE prefill kernel stalls").
  uint32_t scl[RT][2];
  auto decode_step = [&](int p, int s, uint32_t(&af)[RT][4]) { pf_decode_step(w.wb[p], w.sb[p], s, scl, af); };
  auto kloop = [&](auto ntl_c) {
    constexpr int NTL = decltype(ntl_c)::value;
    // The fragments of the next k-step are decoded among this step's MMAs (the next chunk's first step among the last
    // step's, before the barrier), so a warp's decode overlaps its own MMAs instead of alternating with them.
    uint32_t af[RT][4];
    if (FORM && wact) decode_step(0, 0, af);
    for (int c0 = 0; c0 < a.kc; c0 += PF_W) {
#pragma unroll
      for (int p = 0; p < PF_W; ++p) {
        const int c = c0 + p;
        if (c < a.kc) {  // the same in every thread: the barrier below is reached by all
          asm volatile("cp.async.wait_group %0;\n" ::"n"(PF_STAGES - 2) : "memory");
          __syncthreads();  // chunk c is staged; every warp is done with chunk c - 1, whose buffer is refilled next
          if (c + PF_STAGES - 1 < a.kc) stage(c + PF_STAGES - 1);
          commit();
          if (wact && FORM) {
            // ldmatrix.x4 of token tile nt and MX block bh: lanes 8i..8i+7 address rows 0..7 of matrix i = k 8i..8i+7 of
            // the block, so r0 r1 are the B fragment of the block's first k-step and r2 r3 of its second.
            const uint32_t xs = (uint32_t)__cvta_generic_to_shared(smem + (c % PF_STAGES) * BM * PF_ROW +
                                                                    (lane & 7) * PF_ROW + (lane >> 3) * 4);
#pragma unroll
            for (int st = 0; st < 4; ++st) {
              const int bh = st >> 1, j = st & 1;
              uint32_t an[RT][4];
              uint32_t b[2][2];
              ldmatrix_x2(xs + (bh * 16 + j * 8) * 4, b[0][0], b[0][1]);
#pragma unroll
              for (int nt = 0; nt < NTL; ++nt) {
                if (nt + 1 < NTL)
                  ldmatrix_x2(xs + ((nt + 1) * 8 * PF_ROW + bh * 16 + j * 8) * 4, b[(nt + 1) & 1][0], b[(nt + 1) & 1][1]);
#pragma unroll
                for (int rt = 0; rt < RT; ++rt) mma16816_bf16(acc[rt][nt], af[rt], b[nt & 1][0], b[nt & 1][1]);
                // the next step: this slot's, or after the last one the next slot's first (chunk c + 1; past K its
                // words are stale or zero and the fragments are never used)
                if (nt == 0) decode_step(st < 3 ? p : (p + 1) % PF_W, (st + 1) & 3, an);
              }
              if (st == 2) w.refill(p, c + PF_W, a.kc);  // this slot's last step is decoded (into an): refill it
#pragma unroll
              for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                for (int i = 0; i < 4; ++i) af[rt][i] = an[rt][i];
            }
          } else if (wact) {
            const uint32_t* xs = smem + (c % PF_STAGES) * BM * PF_ROW + g * PF_ROW + t * 8;
            // One MX block (two k-steps) at a time: its two decoded words per row tile and, per token tile, the one
            // 16-byte half of the lane's staged fragments it needs. Decoding the whole chunk first held twice the
            // fragments and the x words (NT 8 RT 2: 243 registers, one CTA of 8 warps per SM, issue slots 39% busy and
            // 0.57 eligible warps per scheduler in Nsight Compute on the H100).
#pragma unroll
            for (int bh = 0; bh < 2; ++bh) {
              uint32_t af[RT][2][4];
              float s0[RT], s1[RT];
#pragma unroll
              for (int rt = 0; rt < RT; ++rt) {
                decode4(bh ? w.wb[p][rt].z : w.wb[p][rt].x, af[rt][0]);
                decode4(bh ? w.wb[p][rt].w : w.wb[p][rt].y, af[rt][1]);
                // scale bytes (row g, blk 0), (g+8, 0), (g, 1), (g+8, 1): see chunk_mma
                const uint32_t sv = bh ? w.sb[p][rt] >> 16 : w.sb[p][rt];
                s0[rt] = __uint_as_float((sv << 23) & 0x7F800000u);
                s1[rt] = __uint_as_float((sv << 15) & 0x7F800000u);
              }
              if (bh == 1) w.refill(p, c + PF_W, a.kc);  // this weight slot is decoded: refill it with chunk c + PF_W
#pragma unroll
              for (int nt = 0; nt < NTL; ++nt) {
                const uint4 u = *reinterpret_cast<const uint4*>(xs + nt * 8 * PF_ROW + 4 * bh);
#pragma unroll
                for (int rt = 0; rt < RT; ++rt) {
                  float d[4];
                  mma16816(d, af[rt][0], u.x, u.y, 0.f, 0.f, 0.f, 0.f);
                  mma16816(d, af[rt][1], u.z, u.w, d[0], d[1], d[2], d[3]);
                  acc[rt][nt][0] = fmaf(d[0], s0[rt], acc[rt][nt][0]);
                  acc[rt][nt][1] = fmaf(d[1], s0[rt], acc[rt][nt][1]);
                  acc[rt][nt][2] = fmaf(d[2], s1[rt], acc[rt][nt][2]);
                  acc[rt][nt][3] = fmaf(d[3], s1[rt], acc[rt][nt][3]);
                }
              }
            }
          }
        }
      }
    }
  };
  // The MoE rounds its live tiles up to a multiple of PF_TILE_STEP (a token tile or one of padding computed, never
  // stored); one copy of the loop per count.
  if constexpr (MODE == MODE_DENSE) kloop(std::integral_constant<int, NT>{});
  else pick_live_tiles<NT>(nt_live, kloop);
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  if (!wact) return;

  if (MODE == MODE_DOWN && a.down_f16)
    pf_down_f16<NT, RT, FORM != 0>(a, acc, tile0, 1, srow, e, g, t);
  else
    pf_epilogue<MODE, NT, RT, FORM != 0>(a, acc, tile0, 1, srow, e, g, t);
}

// The kernels of that body: a block's padding rows staged as copies of its first row, or as zeros (LIVE, above)
template <int MODE, int NT, int RT, int CTAS, int FORM>
__global__ void __launch_bounds__(THREADS, CTAS) mxfp4_pf_kernel(const PfArgs a) {
  pf_kernel_body<MODE, NT, RT, CTAS, FORM, false>(a);
}
template <int MODE, int NT, int RT, int CTAS, int FORM>
__global__ void __launch_bounds__(THREADS, CTAS) mxfp4_pf_live_kernel(const PfArgs a) {
  pf_kernel_body<MODE, NT, RT, CTAS, FORM, true>(a);
}

// ---- The prefill kernel on Hopper's wgmma (sm_90a only; FORM_WG) ----
// The same packed bytes, decode and epilogue as mxfp4_pf_kernel's bf16 form; what changes is the multiply. Each warp
// still decodes its 16-row weight tile into registers: that is wgmma's A fragment from registers (m64nNk16, per warp
// the m16n8k16 A layout of mma.sync), so a warpgroup's 4 warps hold 64 consecutive rows. The token tile is its B
// operand, read by the tensor cores from shared memory (128-byte swizzled rows of one 64-wide K chunk, the canonical
// K-major layout wgmma's descriptor names), so one wgmma m64nN replaces N / 8 mma.sync per warp, and the ldmatrix
// loads of B go. Why: the mma.sync kernel runs at ~42% of mma.sync's measured ceiling, its warps spend about as many
// issue slots on decode, scales and B loads as the tensor pipe needs (kernels/NOTES.md "Wider prefill tilings"), and
// Hopper's stock (matmul_ogs) reaches 392 TFLOPS with wgmma on the same layer. Ideas taken: the A-from-registers
// wgmma of mixed-input GEMMs (CUTLASS's SM90 RS mainloop, lmdeploy TurboMind's gmma_m64k16_rs for W4A16), the
// 128-byte swizzle and the descriptor fields from the PTX ISA ("Matrix Descriptor Format", "Shared Memory Matrix
// Layout"). GB10 (sm_121) has no wgmma: there the mma.sync kernel serves.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MXFP4_WGMMA 1
#endif
constexpr int FORM_WG = 2;
// Staged K chunks, activations and weights together: up to 3 in flight ahead of the one multiplied. The weights come
// through shared memory with the activations' cp.async groups, whose wait is counted (cp.async.wait_group N leaves the
// newest N in flight): loaded straight into registers, every weight load of the loop sat on one scoreboard and a wait
// on it drained them all, two wgmmas after the newest was issued (kernels/NOTES.md "Why one weight word waits").
// 5 stages of 16 KB of activations and 4.25 KB of weights (RT 1) fit two CTAs per SM; 6 do not.
constexpr int WG_STAGES = 5;
constexpr int WG_WPF = 4;    // chunks per pass of the unrolled loop
constexpr int WG_SLOTS = 2;  // weight chunks held in registers per warp: the one decoded and the next (from its stage)
// Fragment sets in flight: 3 (wait_group 2) measured no faster than 2 (H200, bench_prefill --ab, NT 8 RT 1 at two
// CTAs per SM: 6,028.5 against 6,118.4 us at 8192 tokens, 1,804.3 against 1,794.9 at 2048, both within the spread).
constexpr int WG_SETS = 2;
// One stage of mxfp4_wg_kernel's shared memory, which its launch sizes from the same functions: NT * 8 token rows of
// one K chunk (64 bf16 each), then each warp's weights (a uint4 per lane per row tile) and each row tile's 8 scale words.
__host__ __device__ constexpr int wg_act_stage_bytes(int nt) { return nt * 8 * 128; }
__host__ __device__ constexpr int wg_weight_words_bytes(int rt) { return WARPS * rt * 32 * 16; }
__host__ __device__ constexpr int wg_weight_stage_bytes(int rt) { return wg_weight_words_bytes(rt) + WARPS * rt * 8 * 4; }

#ifdef MXFP4_WGMMA
// One wrapper per N (16..128 token columns): inline PTX spells out its N / 2 accumulator operands.
template <int NT>
__device__ __forceinline__ void wgmma_rs_n16(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int NT>
__device__ __forceinline__ void wgmma_rs_n32(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int NT>
__device__ __forceinline__ void wgmma_rs_n48(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %29, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int NT>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int NT>
__device__ __forceinline__ void wgmma_rs_n80(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %45, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, {%40, %41, %42, %43}, %44, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int NT>
__device__ __forceinline__ void wgmma_rs_n96(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %53, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int NT>
__device__ __forceinline__ void wgmma_rs_n112(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %61, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, {%56, %57, %58, %59}, %60, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int NT>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <int N, int NT>
__device__ __forceinline__ void wgmma_rs(float (&d)[NT][4], const uint32_t (&a)[4], uint64_t desc) {
  static_assert(N % 16 == 0 && N / 8 <= NT && N <= 128, "N token columns of the NT tiles held");
  if constexpr (N == 16) wgmma_rs_n16<NT>(d, a, desc);
  else if constexpr (N == 32) wgmma_rs_n32<NT>(d, a, desc);
  else if constexpr (N == 48) wgmma_rs_n48<NT>(d, a, desc);
  else if constexpr (N == 64) wgmma_rs_n64<NT>(d, a, desc);
  else if constexpr (N == 80) wgmma_rs_n80<NT>(d, a, desc);
  else if constexpr (N == 96) wgmma_rs_n96<NT>(d, a, desc);
  else if constexpr (N == 112) wgmma_rs_n112<NT>(d, a, desc);
  else wgmma_rs_n128<NT>(d, a, desc);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// The accumulators are written by the tensor cores until the wait: tie them to this point so the compiler reads them
// after it (CUTLASS's warpgroup_fence_operand).
template <int RT, int NT>
__device__ __forceinline__ void wgmma_fence_acc(float (&acc)[RT][NT][4]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(acc[rt][nt][i])::"memory");
}
// Shared-memory matrix descriptor: start address, leading byte offset 16 (unused by swizzled K-major layouts),
// stride byte offset 1024 (8 rows of 128 bytes), 128-byte swizzle (layout type 1 in bits 62-63).
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
#endif

// Warp w is warp w % 4 of warpgroup w / 4; its row tiles are tile0 + 4 rt (rt < RT), tile0 = (grp * 8 + 4 (w / 4)) * RT +
// w % 4, so each wgmma covers 4 consecutive row tiles (64 rows). Tiles past the last are copies of the last tile:
// multiplied, never stored. Every warpgroup multiplies, even one with no tile of its own (at most one per layer
// half, ~2% of the work at gpt-oss shapes): a wgmma under a branch on the warp index is one ptxas cannot prove uniform,
// and it serializes every wgmma of the kernel ("WG.DP in divergent path").
template <int MODE, int NT, int RT, int CTAS, bool LIVE>
__device__ __forceinline__ void wg_kernel_body(const PfArgs& a) {
#ifdef MXFP4_WGMMA
  constexpr int BM = NT * 8;
  constexpr int STAGE_BYTES = wg_act_stage_bytes(NT);  // BM token rows of one K chunk (64 bf16)
  constexpr int WSTAGE_WORDS = wg_weight_words_bytes(RT);  // each warp's uint4 per lane, per row tile
  constexpr int WSTAGE_BYTES = wg_weight_stage_bytes(RT);  // + each row tile's 8 scale words
  constexpr int CP = BM * 8 / THREADS;   // 16-byte pieces per thread per chunk
  static_assert(BM * 8 % THREADS == 0, "every thread stages the same number of pieces");
  extern __shared__ __align__(16) uint8_t wsm[];
  __shared__ int srow[BM];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wi = warp & 3;
  int e, nt_live, blk, grp;
  pf_cta_tile<MODE == MODE_DOWN ? MXFP4_DOWN_PANEL : 0>(blk, grp);
  if (!pf_block_rows<BM>(a, blk, srow, e, nt_live)) return;
  // the swizzle repeats every 1024 bytes and is applied to the address bits: the stages start 1024-byte aligned
  const uint32_t sbase = ((uint32_t)__cvta_generic_to_shared(wsm) + 1023u) & ~1023u;
  const uint32_t wbase = sbase + WG_STAGES * STAGE_BYTES;  // the weight stages, after the activations'
  const uint8_t* wgen = wsm + (wbase - (uint32_t)__cvta_generic_to_shared(wsm));  // the same, for plain loads
  // This thread's pieces: 16 bytes (t8) of token rows threadIdx.x / 8 + 32 u; row r's piece t8 sits at r * 128 +
  // ((t8 ^ (r % 8)) * 16), the 128-byte swizzle (r % 8 is the same for every u).
  constexpr int ROWS_PER_U = THREADS / 8;
  const int t8 = threadIdx.x & 7, r8 = threadIdx.x >> 3;
  int xrow[CP];
  pf_stage_rows<LIVE>(a, srow, xrow);
  const unsigned long long row_bytes = (unsigned long long)a.sx * 2;
  const char* xbase = reinterpret_cast<const char*>(a.xfrag) + t8 * 16;
  const uint32_t dst0 = sbase + r8 * 128 + ((t8 ^ (r8 & 7)) << 4);
  const int tile0 = (grp * WARPS + 4 * wg) * RT + wi;
  PfWeights<RT, 1> w(a, e, tile0, 4, false, lane, g);  // this warp's weight pointers; nothing loaded into registers
  // chunk c's weights of this thread (its lane's uint4 of each row tile) and, from lanes 0 and 1, its row tiles' 8
  // scale words (two 16-byte pieces): the thread stages what it reads, but for the scales, published by the barrier
  auto stage_weights = [&](int c) {
    const uint32_t wdst = wbase + (uint32_t)((c % WG_STAGES) * WSTAGE_BYTES);
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(wdst + ((warp * RT + rt) * 32 + lane) * 16),
                   "l"(w.wp[rt] + c * 32));
      if (lane < 2)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(wdst + WSTAGE_WORDS + ((warp * RT + rt) * 8 + 4 * lane) * 4),
                     "l"(w.sp[rt] - g + c * 8 + 4 * lane));
    }
  };
  auto stage = [&](int c) {
    stage_weights(c);
    const uint32_t dst = dst0 + (uint32_t)((c % WG_STAGES) * STAGE_BYTES);
    const bool in_k = c * 64 + t8 * 8 < a.K;  // pieces past K are zero-filled (src-size 0 reads nothing)
    const char* col = xbase + (in_k ? c * 128 : 0);
#pragma unroll
    for (int u = 0; u < CP; ++u) pf_stage_piece<LIVE>(dst + u * ROWS_PER_U * 128, col, xrow[u], row_bytes, in_k ? 16u : 0u);
  };
  auto commit = [] { asm volatile("cp.async.commit_group;\n" ::: "memory"); };

#pragma unroll
  for (int s = 0; s < WG_STAGES - 2; ++s) {
    if (s < a.kc) stage(s);
    commit();
  }
  // chunk c's weights from its stage into weight slot p
  uint4 wb[WG_SLOTS][RT];
  uint32_t sb[WG_SLOTS][RT];
  auto load_slot = [&](int p, int c) {
    const uint8_t* src = wgen + (c % WG_STAGES) * WSTAGE_BYTES;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      wb[p][rt] = *reinterpret_cast<const uint4*>(src + ((warp * RT + rt) * 32 + lane) * 16);
      sb[p][rt] = *reinterpret_cast<const uint32_t*>(src + WSTAGE_WORDS + ((warp * RT + rt) * 8 + g) * 4);
    }
  };
  // chunk 0 landed (the two after it may be in flight) and its scale words published
  asm volatile("cp.async.wait_group %0;\n" ::"n"(WG_STAGES - 3) : "memory");
  __syncthreads();
  load_slot(0, 0);
  float acc[RT][NT][4] = {};
  uint32_t scl[RT][2];
  const uint64_t desc0 = wg_desc(sbase);

  auto kloop = [&](auto ntl_c) {
    constexpr int N = decltype(ntl_c)::value * 8;
    // WG_SETS fragment sets: step k + 1 is decoded while the wgmmas of steps k - WG_SETS + 2 .. k run; the set step
    // k - WG_SETS + 1 read is reused only after its group retired (wait_group WG_SETS - 1). Steps are indexed within
    // one pass of the unrolled loop (WG_WPF chunks of 4 steps, a multiple of WG_SETS): each set is fixed registers.
    static_assert(WG_WPF * 4 % WG_SETS == 0 && WG_WPF % WG_SLOTS == 0, "each step's fragment set and weight slot are known at compile time");
    uint32_t af[WG_SETS][RT][4];
    pf_decode_step(wb[0], sb[0], 0, scl, af[0]);
    for (int c0 = 0; c0 < a.kc; c0 += WG_WPF) {
#pragma unroll
      for (int p = 0; p < WG_WPF; ++p) {
        const int c = c0 + p;
        if (c < a.kc) {  // the same in every thread: the barrier below is reached by all
          // chunks c and c + 1 have landed (one later group may be in flight: chunk c + 2), and the copies are made
          // visible to the tensor cores' reads (the async proxy) before the barrier publishes them
          asm volatile("cp.async.wait_group %0;\n" ::"n"(WG_STAGES - 4) : "memory");
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          __syncthreads();
          // the buffer refilled is chunk c - 2's: every warpgroup's wgmmas on it retired before this barrier, and its
          // weights were read into registers in chunk c - 3
          if (c + WG_STAGES - 2 < a.kc) stage(c + WG_STAGES - 2);
          commit();
          if (c + 1 < a.kc) load_slot((p + 1) % WG_SLOTS, c + 1);  // decoded from this chunk's last step on
          {
            const uint64_t dc = desc0 + (uint64_t)(((c % WG_STAGES) * STAGE_BYTES) >> 4);
#pragma unroll
            for (int st = 0; st < 4; ++st) {
              wgmma_fence();
#pragma unroll
              for (int rt = 0; rt < RT; ++rt) wgmma_rs<N, NT>(acc[rt], af[(p * 4 + st) % WG_SETS][rt], dc + (uint64_t)(st * 32 >> 4));
              wgmma_commit();
              wgmma_wait<WG_SETS - 1>();
              // the next step: this slot's, or after its last one the next slot's first (chunk c + 1; past K its words
              // are stale or zero and the fragments are never used)
              const int pn = (st < 3 ? p : p + 1) % WG_SLOTS;
              pf_decode_step(wb[pn], sb[pn], (st + 1) & 3, scl, af[(p * 4 + st + 1) % WG_SETS]);
            }
          }
        }
      }
    }
    wgmma_wait<0>();
    wgmma_fence_acc(acc);
  };
  if constexpr (MODE == MODE_DENSE) kloop(std::integral_constant<int, NT>{});
  else pick_live_tiles<NT>(nt_live, kloop);
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  if (MODE == MODE_DOWN && a.down_f16)
    pf_down_f16<NT, RT, true>(a, acc, tile0, 4, srow, e, g, t);
  else
    pf_epilogue<MODE, NT, RT, true>(a, acc, tile0, 4, srow, e, g, t);
#endif
}

template <int MODE, int NT, int RT, int CTAS>
__global__ void __launch_bounds__(THREADS, CTAS) mxfp4_wg_kernel(const PfArgs a) {
  wg_kernel_body<MODE, NT, RT, CTAS, false>(a);
}
template <int MODE, int NT, int RT, int CTAS>
__global__ void __launch_bounds__(THREADS, CTAS) mxfp4_wg_live_kernel(const PfArgs a) {
  wg_kernel_body<MODE, NT, RT, CTAS, true>(a);
}

// align_by_expert (kernels/packed_mm.py) in one launch: slots s = 0..S-1 (ids[s], < 0 or >= E: not on this rank)
// sorted by expert, stable, each expert's run padded to a multiple of bm; rows[] gets the slot or S (padding),
// bexp[] the expert of each block or -1. torch did it in ~20 launches, 145.7 us at 2048 tokens x top-4 of 128 on an
// H200 (bench_prefill). One CTA of ALIGN_THREADS; warp w owns the contiguous run of slots [w L, (w + 1) L): it counts
// its run per expert, a scan over the warps gives each (warp, expert) its first place, and the warp then places its run
// 32 slots at a time in order (rank within the 32 from __match_any_sync), with no CTA barrier between its steps: four
// barriers in all. The earlier form placed the slots in rounds of ALIGN_THREADS, four barriers per round and each slot
// summing the counts of every earlier warp: 17 us per layer at 2048 tokens of the 20b on an H100 (411 us per prefill
// against ~180 us for stock's whole routing).
constexpr int ALIGN_THREADS = 1024, ALIGN_WARPS = ALIGN_THREADS / 32, ALIGN_MAX_E = 256;
constexpr int ALIGN_IDS = 8;  // ids per lane loaded at once when a warp places its run
__global__ void __launch_bounds__(ALIGN_THREADS) align_kernel(const int* ids, int S, int E, int bm, int n_blocks,
                                                              int* rows, int* bexp) {
  __shared__ int start[ALIGN_MAX_E + 1];
  __shared__ int wplace[ALIGN_WARPS][ALIGN_MAX_E];  // counts, then each (warp, expert)'s next place within the expert
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int run = (S + ALIGN_WARPS * 32 - 1) / (ALIGN_WARPS * 32) * 32;  // L: a multiple of 32
  const int s0 = warp * run, s1 = min(S, s0 + run);
  for (int i = tid; i < ALIGN_WARPS * E; i += ALIGN_THREADS) wplace[i / E][i % E] = 0;
  __syncthreads();
  for (int s = s0 + lane; s < s1; s += 32) {
    const int e = ids[s];
    if (e >= 0 && e < E) atomicAdd(&wplace[warp][e], 1);
  }
  __syncthreads();
  // per expert: each warp's first place within the expert's run (an exclusive scan over the warps), the total in start[]
  for (int e = tid; e < E; e += ALIGN_THREADS) {
    int n = 0;
    for (int w = 0; w < ALIGN_WARPS; ++w) {
      const int c = wplace[w][e];
      wplace[w][e] = n;
      n += c;
    }
    start[e] = n;
  }
  __syncthreads();
  if (warp == 0) {  // padded starts: an exclusive scan over E <= 256 experts, 8 consecutive ones per lane
    constexpr int PER = ALIGN_MAX_E / 32;
    int sz[PER], sum = 0;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = lane * PER + i;
      sz[i] = e < E ? (start[e] + bm - 1) / bm * bm : 0;
      sum += sz[i];
    }
    int incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    int acc = incl - sum;
    __syncwarp();  // every lane has read its counts before start[] is overwritten
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = lane * PER + i;
      if (e < E) start[e] = acc;
      acc += sz[i];
    }
    if (lane == 31) start[E] = incl;
  }
  for (int i = tid; i < n_blocks * bm; i += ALIGN_THREADS) rows[i] = S;
  __syncthreads();  // start[] is complete; rows' padding is written before any slot lands on it
  for (int b = tid; b < n_blocks; b += ALIGN_THREADS) {  // the expert whose padded run holds row b * bm
    int lo = 0, hi = E;  // first e with start[e + 1] > b * bm
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (start[mid + 1] > b * bm) hi = mid; else lo = mid + 1;
    }
    bexp[b] = lo < E ? lo : -1;
  }
  // this warp's run, ALIGN_IDS steps of 32 ids loaded at once (independent loads in flight, not one round trip each)
  for (int base = s0; base < s1; base += 32 * ALIGN_IDS) {
    int ev[ALIGN_IDS];
#pragma unroll
    for (int i = 0; i < ALIGN_IDS; ++i) {
      const int s = base + i * 32 + lane;
      ev[i] = s < s1 ? ids[s] : -1;
    }
#pragma unroll
    for (int i = 0; i < ALIGN_IDS; ++i) {
      const int s = base + i * 32 + lane, e = ev[i];
      const bool ok = e >= 0 && e < E;
      const unsigned same = __match_any_sync(0xffffffffu, ok ? e : -1);
      const int rank = __popc(same & ((1u << lane) - 1u));
      const int place = ok ? wplace[warp][e] : 0;
      __syncwarp();  // every lane has read its place before the leaders advance them
      if (ok) {
        rows[start[e] + place + rank] = s;
        if (rank == 0) wplace[warp][e] = place + __popc(same);
      }
      __syncwarp();
    }
  }
}

// The MoE prefill's combine: out[m] (bf16) = the sum of y[m * top_k + j] over j = 0, 1, .. top_k - 1 in that order,
// skipping slots whose expert is not on this rank (ids < 0 or >= E: the sort leaves them out, so their y rows are never
// written and y needs no zeroing).
// y holds the down kernel's fp32 rows with the routing weight applied. One pass over y instead of three (zero fill,
// torch's sum over the k slots, the bf16 copy) and one launch instead of four.
// T: float (fp32 rows), or __half (pf_down_f16's rows, * 2**-DOWN_F16_SHIFT: summed in fp32, then scaled back exactly).
__device__ __forceinline__ float4 combine_load(const float* p) { return __ldcs(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 combine_load(const __half* p) {
  const uint2 u = __ldcs(reinterpret_cast<const uint2*>(p));
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x)), hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
template <typename T>
__global__ void __launch_bounds__(THREADS) combine_kernel(const T* y, const int* ids, int top_k, int E, int H,
                                                          __nv_bfloat16* out, long long so) {
  const long long m = blockIdx.x;
  constexpr float back = sizeof(T) == 2 ? float(1 << DOWN_F16_SHIFT) : 1.f;
  for (int c = threadIdx.x * 4; c < H; c += THREADS * 4) {
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < top_k; ++j) {
      if ((unsigned)ids[m * top_k + j] >= (unsigned)E) continue;
      const float4 v = combine_load(y + (m * top_k + j) * H + c);  // read once
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
    s.x *= back; s.y *= back; s.z *= back; s.w *= back;
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out + m * so + c);
    o[0] = __floats2bfloat162_rn(s.x, s.y);
    o[1] = __floats2bfloat162_rn(s.z, s.w);
  }
}

template <int MODE, int NT, int RT, int CTAS, int FORM, bool LIVE>
cudaError_t pf_launch(const PfArgs& a, int n_blocks, int groups, cudaStream_t stream) {
  if constexpr (FORM == FORM_WG) {
    // built for every arch, with a body only for sm_90a: refuse other devices rather than run an empty kernel
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (major != 9 || minor != 0) return cudaErrorNotSupported;
    // activations and weights per stage (mxfp4_wg_kernel), + the alignment of the stages to 1024 bytes
    const size_t smem = (size_t)WG_STAGES * (wg_act_stage_bytes(NT) + wg_weight_stage_bytes(RT)) + 1024;
    auto kern = mxfp4_wg_kernel<MODE, NT, RT, CTAS>;  // if constexpr: no live kernel for the tables that never use one
    if constexpr (LIVE) kern = mxfp4_wg_live_kernel<MODE, NT, RT, CTAS>;
    const cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
    kern<<<dim3(n_blocks, groups), THREADS, smem, stream>>>(a);
    return cudaGetLastError();
  } else {
    const size_t smem = (size_t)PF_STAGES * NT * 8 * PF_ROW * 4;
    auto kern = mxfp4_pf_kernel<MODE, NT, RT, CTAS, FORM>;
    if constexpr (LIVE) kern = mxfp4_pf_live_kernel<MODE, NT, RT, CTAS, FORM>;
    if (smem > 48 * 1024) {  // NT > 8 tilings: above the default dynamic limit
      const cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (err != cudaSuccess) return err;
    }
    kern<<<dim3(n_blocks, groups), THREADS, smem, stream>>>(a);
    return cudaGetLastError();
  }
}

template <int MODE, int NT, int RW, int RT, int PF>
cudaError_t launch(const Args& a, int grid, size_t smem, cudaStream_t stream, int pdl) {
  auto kern = mxfp4_kernel<MODE, NT, RW, RT, PF>;
  cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kern, a);
}

}  // namespace

// ---- C API (ctypes) -------------------------------------------------------------------------------
// variant: index into the tables below (kernels/cuda_ext.py keeps the same list):
//   (NT, RW, RT, PF), KSPLIT = 8 / RW; NT = 1 serves M <= 8, NT = 2 M <= 16.
#define NT1(MODE)                                                                                            \
  launch<MODE, 1, 8, 2, 4>, launch<MODE, 1, 8, 2, 5>, launch<MODE, 1, 4, 1, 4>, launch<MODE, 1, 4, 1, 6>, \
      launch<MODE, 1, 2, 1, 4>, launch<MODE, 1, 2, 1, 6>, launch<MODE, 1, 1, 1, 6>, launch<MODE, 1, 1, 1, 8>
#define NT2(MODE)                                                                                            \
  launch<MODE, 2, 8, 2, 4>, launch<MODE, 2, 8, 2, 5>, launch<MODE, 2, 4, 1, 4>, launch<MODE, 2, 4, 1, 6>, \
      launch<MODE, 2, 2, 1, 4>, launch<MODE, 2, 2, 1, 6>, launch<MODE, 2, 1, 1, 6>, launch<MODE, 2, 1, 1, 8>

typedef cudaError_t (*launch_fn)(const Args&, int, size_t, cudaStream_t, int);

extern "C" {

int mxfp4_num_variants() { return 16; }

const char* mxfp4_error_string(int err) { return cudaGetErrorString((cudaError_t)err); }

// mxfp4_launch2 = mxfp4_launch + the prepared activation (xfrag, xdown_g: null = prepared per CTA).
int mxfp4_launch2(int mode, int variant, const __nv_bfloat16* x, long long sx, const void* words, const void* scales,
                  long long wstride_e, long long sstride_e, const void* bias, int bias_kind, long long bstride_e,
                  __nv_bfloat16* out, long long so, void* hfrag, int kc_h, int zero_row, const int* ids, const float* wts,
                  int M, int N, int K, int n_tiles, int kc, int top_k, int ksplit, float alpha, float limit, int grid,
                  long long smem, void* stream, int pdl, const void* xfrag, const float* xdown_g) {
  static const launch_fn dense[16] = {NT1(MODE_DENSE), NT2(MODE_DENSE)};
  static const launch_fn gateup[16] = {NT1(MODE_GATEUP)};  // MoE: one token column (NT = 1)
  static const launch_fn down[16] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     launch<MODE_DOWN, 1, 1, 1, 6>, launch<MODE_DOWN, 1, 1, 1, 8>};
  if (variant < 0 || variant >= 16 || mode < 0 || mode > 2) return (int)cudaErrorInvalidValue;
  Args a;
  a.x = x; a.sx = sx;
  a.words = reinterpret_cast<const uint4*>(words);
  a.scales = reinterpret_cast<const uint32_t*>(scales);
  a.wstride_e = wstride_e; a.sstride_e = sstride_e;
  a.bias = bias; a.bias_kind = bias_kind; a.bstride_e = bstride_e;
  a.out = out; a.so = so;
  a.hfrag = reinterpret_cast<uint32_t*>(hfrag); a.kc_h = kc_h; a.zero_row = zero_row;
  a.ids = ids; a.wts = wts;
  a.M = M; a.N = N; a.K = K; a.n_tiles = n_tiles; a.kc = kc; a.top_k = top_k; a.ksplit = ksplit;
  a.alpha = alpha; a.limit = limit;
  a.xfrag = reinterpret_cast<const uint4*>(xfrag); a.xdown_g = xdown_g;
  const launch_fn* table = mode == 0 ? dense : (mode == 1 ? gateup : down);
  if (!table[variant]) return (int)cudaErrorInvalidValue;
  return (int)table[variant](a, grid, (size_t)smem, reinterpret_cast<cudaStream_t>(stream), pdl);
}

int mxfp4_launch(int mode, int variant, const __nv_bfloat16* x, long long sx, const void* words, const void* scales,
                 long long wstride_e, long long sstride_e, const void* bias, int bias_kind, long long bstride_e,
                 __nv_bfloat16* out, long long so, void* hfrag, int kc_h, int zero_row, const int* ids, const float* wts, int M,
                 int N, int K, int n_tiles, int kc, int top_k, int ksplit, float alpha, float limit, int grid,
                 long long smem, void* stream, int pdl) {
  return mxfp4_launch2(mode, variant, x, sx, words, scales, wstride_e, sstride_e, bias, bias_kind, bstride_e, out, so, hfrag,
                       kc_h, zero_row, ids, wts, M, N, K, n_tiles, kc, top_k, ksplit, alpha, limit, grid, smem, stream, pdl,
                       nullptr, nullptr);
}

// x [M, K] bf16 -> xfrag [M][kc * 32] u32 and xdown [M] for mxfp4_launch2 and mxfp4_prefill (one CTA per row).
int mxfp4_xprep(const __nv_bfloat16* x, long long sx, int M, int K, int kc, void* xfrag, float* xdown, void* stream) {
  if (M < 1) return (int)cudaErrorInvalidValue;  // one CTA per row: any M (prefill prepares its rows with it too)
  xprep_kernel<<<M, THREADS, 0, reinterpret_cast<cudaStream_t>(stream)>>>(x, sx, K, kc, reinterpret_cast<uint32_t*>(xfrag), xdown);
  return (int)cudaGetLastError();
}

// Prefill (M > 16): variant = index into PF_TABLE's (NT, RT, CTAS, FORM) below; kernels/cuda_ext.py keeps the same list
// (PF_VARIANTS). rows / bexp null: dense. Returns a CUDA error code.
typedef cudaError_t (*pf_fn)(const PfArgs&, int, int, cudaStream_t);
// bench_prefill, M=2048, gpt-oss-120b shapes, same process (kernels/NOTES.md "The bf16 form"): bf16 NT 8 RT 2 at one CTA
// per SM fastest on qkv and o_proj, at two CTAs per SM (128 registers) on the MoE; the f16 form serves weights with
// scale bytes above 128. Dropped after that bench: NT 4 (both forms; the MoE skips empty token tiles instead) and
// NT 16 RT 1 (one or two CTAs per SM); NT 16 RT 1 again on 2026-11-29 with the unrolled tile loop, MoE 2,287.5 against
// 1,941.5 us for NT 8 RT 2 (kernels/NOTES.md "Fewer instructions per MMA"). On 2026-12-04, with no tiling spilling,
// NT 16 RT 1 (one or two CTAs), NT 12 RT 2 and NT 16 RT 2 at 64, 128 and 256 slots per expert: none faster than the
// served one at any size (kernels/NOTES.md "Wider prefill tilings").
// FORM_WG (sm_90a, kernels/NOTES.md "wgmma"): H200, MoE layer, same process, against the bf16 NT 8 RT 2 at two CTAs:
// NT 16 RT 1 at two CTAs 0.821x the time at 8192 tokens and 0.851x at 2048, served for the MoE on sm_90; NT 8 RT 1 at
// two CTAs 0.993x / 0.961x. Dropped after that run: NT 8 RT 2 at one CTA (0.992x / 1.081x), 3 fragment sets in flight
// (NT 8 RT 1: no faster), NT 16 RT 2 at one CTA (0.788x / 0.944x; in the served 20b model 0.823x stock's pp2048_gpu
// against NT 16 RT 1's 0.928x). H100, 2026-12-06: NT 32 RT 1 at one CTA (two wgmmas per k-step) 1.04-2.16x the time
// of NT 16 RT 1 at 192-64 slots per expert, 1.16x at 256 (kernels/NOTES.md "256 token rows per CTA").
// NT 16 RT 2 at one CTA again, for the MoE's down half alone (tuning cuda_moe_down_*, not served; kernels/NOTES.md "The
// down half's own tiling"): 256 rows per CTA, half the re-reads of h. H100, MoE layer of the 120b shape: 0.929x at 8192
// tokens (~256 slots per expert), 1.015x at 2048 (~64: half the warps per SM hide less latency), bit-identical.
#define PF_N 6
#define PF_TABLE(MODE, LIVE) pf_launch<MODE, 8, 2, 1, 1, LIVE>, pf_launch<MODE, 8, 2, 2, 1, LIVE>, \
    pf_launch<MODE, 8, 2, 1, 0, LIVE>, pf_launch<MODE, 8, 1, 2, 2, LIVE>, pf_launch<MODE, 16, 1, 2, 2, LIVE>, \
    pf_launch<MODE, 16, 2, 1, 2, LIVE>
static const int PF_RT[PF_N] = {2, 2, 2, 1, 1, 2};

int mxfp4_pf_num_variants() { return PF_N; }

// mxfp4_prefill3 = mxfp4_prefill + down_f16 (the down mode writes f16 rows, value * 2**-DOWN_F16_SHIFT; N even) + live
// (a block's padding rows staged as zeros: the MoE halves only, where experts hold few slots).
int mxfp4_prefill3(int mode, int variant, const void* xfrag, const float* xdown, float xmul, const int* rows,
                   const int* bexp, int x_div, int n_rows, int n_blocks, const void* words, const void* scales,
                   long long wstride_e, long long sstride_e, const void* bias, int bias_kind, long long bstride_e,
                   void* out, long long so, int kc_h, const float* wts, int N, int n_tiles, int kc, float alpha,
                   float limit, void* stream, long long sx, int K, int down_f16, int live) {
  static const pf_fn table[3][PF_N] = {{PF_TABLE(MODE_DENSE, false)}, {PF_TABLE(MODE_GATEUP, false)},
                                       {PF_TABLE(MODE_DOWN, false)}};
  static const pf_fn live_table[2][PF_N] = {{PF_TABLE(MODE_GATEUP, true)}, {PF_TABLE(MODE_DOWN, true)}};
  if (variant < 0 || variant >= PF_N || mode < 0 || mode > 2 || n_blocks < 1 || x_div < 1) return (int)cudaErrorInvalidValue;
  if (live && mode == MODE_DENSE) return (int)cudaErrorInvalidValue;
  if (down_f16 && (mode != MODE_DOWN || N % 2 || so % 2)) return (int)cudaErrorInvalidValue;
  PfArgs a;
  a.xfrag = reinterpret_cast<const uint32_t*>(xfrag); a.xdown = xdown; a.xmul = xmul;
  a.rows = rows; a.bexp = bexp; a.x_div = x_div; a.n_rows = n_rows;
  a.words = reinterpret_cast<const uint4*>(words); a.scales = reinterpret_cast<const uint32_t*>(scales);
  a.wstride_e = wstride_e; a.sstride_e = sstride_e;
  a.bias = bias; a.bias_kind = bias_kind; a.bstride_e = bstride_e;
  a.out = out; a.so = so; a.kc_h = kc_h; a.wts = wts;
  a.N = N; a.n_tiles = n_tiles; a.kc = kc; a.alpha = alpha; a.limit = limit;
  a.sx = sx; a.K = K; a.down_f16 = down_f16;
  const int groups = (n_tiles + WARPS * PF_RT[variant] - 1) / (WARPS * PF_RT[variant]);
  const pf_fn fn = live ? live_table[mode - MODE_GATEUP][variant] : table[mode][variant];
  return (int)fn(a, n_blocks, groups, reinterpret_cast<cudaStream_t>(stream));
}

int mxfp4_prefill2(int mode, int variant, const void* xfrag, const float* xdown, float xmul, const int* rows,
                   const int* bexp, int x_div, int n_rows, int n_blocks, const void* words, const void* scales,
                   long long wstride_e, long long sstride_e, const void* bias, int bias_kind, long long bstride_e,
                   void* out, long long so, int kc_h, const float* wts, int N, int n_tiles, int kc, float alpha,
                   float limit, void* stream, long long sx, int K, int down_f16) {
  return mxfp4_prefill3(mode, variant, xfrag, xdown, xmul, rows, bexp, x_div, n_rows, n_blocks, words, scales,
                        wstride_e, sstride_e, bias, bias_kind, bstride_e, out, so, kc_h, wts, N, n_tiles, kc, alpha,
                        limit, stream, sx, K, down_f16, 0);
}

int mxfp4_prefill(int mode, int variant, const void* xfrag, const float* xdown, float xmul, const int* rows,
                  const int* bexp, int x_div, int n_rows, int n_blocks, const void* words, const void* scales,
                  long long wstride_e, long long sstride_e, const void* bias, int bias_kind, long long bstride_e,
                  void* out, long long so, int kc_h, const float* wts, int N, int n_tiles, int kc, float alpha,
                  float limit, void* stream, long long sx, int K) {
  return mxfp4_prefill2(mode, variant, xfrag, xdown, xmul, rows, bexp, x_div, n_rows, n_blocks, words, scales,
                        wstride_e, sstride_e, bias, bias_kind, bstride_e, out, so, kc_h, wts, N, n_tiles, kc, alpha,
                        limit, stream, sx, K, 0);
}

// ids [S] int32 -> rows [n_blocks * bm] int32 (slot or S), bexp [n_blocks] int32 (expert or -1): align_kernel.
// n_blocks must bound the padded total (ceil(S / bm) + E does, whatever the routing).
int mxfp4_align(const int* ids, int S, int E, int bm, int n_blocks, int* rows, int* bexp, void* stream) {
  if (S < 0 || E < 1 || E > ALIGN_MAX_E || bm < 1 || n_blocks < 1) return (int)cudaErrorInvalidValue;
  align_kernel<<<1, ALIGN_THREADS, 0, reinterpret_cast<cudaStream_t>(stream)>>>(ids, S, E, bm, n_blocks, rows, bexp);
  return (int)cudaGetLastError();
}

// out [M][so] bf16 = the in-order sum of y's k fp32 rows per token (combine_kernel). H % 4 == 0; y, out 8-byte aligned.
int mxfp4_combine(const float* y, const int* ids, int M, int top_k, int E, int H, void* out, long long so, void* stream) {
  if (M < 1 || top_k < 1 || E < 1 || H % 4 || so % 4) return (int)cudaErrorInvalidValue;
  combine_kernel<float><<<M, THREADS, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      y, ids, top_k, E, H, reinterpret_cast<__nv_bfloat16*>(out), so);
  return (int)cudaGetLastError();
}

// mxfp4_combine on f16 rows (mxfp4_prefill2's down_f16). y 8-byte aligned.
int mxfp4_combine_f16(const void* y, const int* ids, int M, int top_k, int E, int H, void* out, long long so,
                      void* stream) {
  if (M < 1 || top_k < 1 || E < 1 || H % 4 || so % 4) return (int)cudaErrorInvalidValue;
  combine_kernel<__half><<<M, THREADS, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const __half*>(y), ids, top_k, E, H, reinterpret_cast<__nv_bfloat16*>(out), so);
  return (int)cudaGetLastError();
}

int mxfp4_route(const __nv_bfloat16* x, long long sx, const void* w, int w_kind, const void* b, int b_kind,
                float* logits, int* counter, int* ids, float* wts, int M, int E, int H, int top_k, void* stream) {
  if (top_k > 8 || top_k < 1 || top_k > E || E > 32 * TOPK_PL) return (int)cudaErrorInvalidValue;
  constexpr int epc = WARPS / ROUTE_WPE;
  route_kernel<<<(E + epc - 1) / epc, THREADS, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      x, sx, w, w_kind, b, b_kind, logits, counter, ids, wts, M, E, H, top_k);
  return (int)cudaGetLastError();
}

int mxfp4_topk(const void* logits, int l_kind, long long sl, int* ids, float* wts, int M, int E, int top_k, void* stream) {
  if (top_k > 8 || top_k < 1 || top_k > E || E > 32 * TOPK_PL || (l_kind != 1 && l_kind != 2))
    return (int)cudaErrorInvalidValue;
  if (M < 0) return (int)cudaErrorInvalidValue;
  // M = 0 still launches one CTA that returns at once: kernels.tools.phase_timing times it as the empty-launch floor
  topk_kernel<<<M > 0 ? (M + WARPS - 1) / WARPS : 1, THREADS, 0, reinterpret_cast<cudaStream_t>(stream)>>>(logits, l_kind, sl, ids, wts, M, E, top_k);
  return (int)cudaGetLastError();
}

#ifdef MXFP4_PHASES
int mxfp4_set_phase_buffer(void* p) {
  unsigned long long* v = reinterpret_cast<unsigned long long*>(p);
  return (int)cudaMemcpyToSymbol(g_phase, &v, sizeof(v));
}
#endif

int mxfp4_max_smem_optin(int device) {
  int v = 0;
  cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return v;
}

}  // extern "C"
