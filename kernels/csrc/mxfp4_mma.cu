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
// MoE launches use programmatic dependent launch where available: the down kernel prefetches
// its weights before waiting for gate_up's h.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

constexpr int WARPS = 8;
constexpr int THREADS = 256;
constexpr int MODE_DENSE = 0, MODE_GATEUP = 1, MODE_DOWN = 2;

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
// mma are adjacent (kernels.packed.prepare_activation). `xl` points at this lane's row m, t.
template <int NT>
__device__ __forceinline__ void load_xb(const uint32_t* const (&xl)[NT], const int (&xstep)[NT], int c,
                                        uint32_t (&xb)[NT][8]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {  // rows >= M read a 32-byte zero block (xstep 0)
    const uint4* p = reinterpret_cast<const uint4*>(xl[nt] + c * xstep[nt]);
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

// x [M, K] bf16 -> shared f16 fragments * 2**(14-L_m); xup/xdown[m] = 2**(14-L_m), 2**L_m.
__device__ void prep_x(const __nv_bfloat16* x, long long sx, int M, int K, int kc, uint32_t* xs, float* xup,
                       float* xdown) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int m = warp; m < M; m += WARPS) {
    float amax = 0.f;
    const __nv_bfloat16* row = x + m * sx;
    for (int k = lane * 2; k < K; k += 64) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(row + k));
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0) {
      int lg = (int)((__float_as_uint(amax) >> 23) & 0xFF) - 127;
      lg = min(max(lg, -100), 127);
      xup[m] = __uint_as_float((uint32_t)(14 - lg + 127) << 23);
      xdown[m] = __uint_as_float((uint32_t)(lg + 127) << 23);
    }
  }
  __syncthreads();
  const int kp2 = kc * 32;
  for (int q = threadIdx.x; q < M * kp2; q += THREADS) {
    const int m = q / kp2, p = q - m * kp2, k = 2 * p;
    float lo = 0.f, hi = 0.f;
    if (k < K) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + m * sx + k));
      lo = f.x;
      hi = f.y;
    }
    const float up = xup[m];
    __half2 h = __floats2half2_rn(lo * up, hi * up);
    xs[(long long)m * kc * 32 + frag_index(p)] = *reinterpret_cast<uint32_t*>(&h);
  }
  __syncthreads();
}

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
  int zero_row;  // down: index of an all-zero row of hfrag
  const int* ids;  // [M * top_k]
  const float* wts;  // [M * top_k]
  int M, N, K, n_tiles, kc, top_k, ksplit;
  float alpha, limit;
};

template <int MODE, int NT, int RW, int RT, int PF>
__global__ void __launch_bounds__(THREADS, 2) mxfp4_kernel(const Args a) {
  extern __shared__ __align__(16) uint32_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // K split: warps with the same rw share rows; kslot picks chunks kslot, kslot + kstride, ...
  int kslot, kstride, rw, slot_j = 0;
  if (MODE == MODE_DOWN) {
    kstride = a.ksplit;  // K slices per slot
    slot_j = warp / kstride;
    kslot = warp % kstride;
    rw = 0;
  } else {
    kstride = a.ksplit;
    kslot = warp % kstride;
    rw = warp / kstride;
  }
  const bool warp_active = (MODE != MODE_DOWN) || slot_j < a.top_k;
  const int nck = warp_active ? (a.kc - kslot + kstride - 1) / kstride : 0;  // this warp's chunks
  const int nck_max = (a.kc + kstride - 1) / kstride;
  const int np = ((nck_max + PF - 1) / PF) * PF;  // iterations per item (multiple of PF)
  const int tiles_per_item = RW * RT;
  const int groups = (a.n_tiles + tiles_per_item - 1) / tiles_per_item;
  int n_items;
  if (MODE == MODE_DENSE) n_items = groups;
  else if (MODE == MODE_GATEUP) n_items = a.M * a.top_k * groups;
  else n_items = a.M * groups;

  const int xs_rows = (MODE == MODE_DOWN) ? 0 : a.M;
  uint32_t* xs = smem;
  float* xup = reinterpret_cast<float*>(smem + (long long)xs_rows * a.kc * 32);
  float* xdown = xup + 16;
  uint32_t* xzero = reinterpret_cast<uint32_t*>(xdown + 16);  // 8 zero words (B columns >= M)
  float* red = xdown + 24;  // [WARPS][RT][NT][4][32]
  if (threadIdx.x < 8) xzero[threadIdx.x] = 0u;

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
      brow = slot;
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
  int lit = blockIdx.x, lci = 0;
  bool lok = false;
  const uint4* lw[RT];
  const uint32_t* ls[RT];
  auto set_item = [&](int it) {
    long long wbase = 0, sbase = 0;
    int grp = 0, brow, slot;
    lok = it < n_items && item_info(it, wbase, sbase, grp, brow, slot);
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const long long tc = (long long)tile_of(grp, rt) * a.kc + kslot;
      lw[rt] = a.words + wbase + tc * 32 + lane;
      ls[rt] = a.scales + sbase + tc * 8 + g;
    }
  };
  auto issue = [&](uint4 (&w)[RT], uint32_t (&s)[RT]) {
    const bool ok = lok && lci < nck;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      ld_stream_v4_if(w[rt], lw[rt], pol, ok);
      ld_stream_u32_if(s[rt], ls[rt], pol, ok);
      lw[rt] += kstride * 32;
      ls[rt] += kstride * 8;
    }
    if (++lci == np) {
      lci = 0;
      lit += gridDim.x;
      set_item(lit);
    }
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
    set_item(lit);
#pragma unroll
    for (int p = 0; p < PF; ++p) issue(wb[p], sb[p]);
    pdl_wait();
  } else {
    if (MODE == MODE_DENSE) {
      set_item(lit);
#pragma unroll
      for (int p = 0; p < PF; ++p) issue(wb[p], sb[p]);
    }
    prep_x(a.x, a.sx, a.M, a.K, a.kc, xs, xup, xdown);
    if (MODE == MODE_GATEUP) {
      pdl_wait();  // expert ids come from the route kernel
      pdl_trigger();
      set_item(lit);
#pragma unroll
      for (int p = 0; p < PF; ++p) issue(wb[p], sb[p]);
    }
  }

  uint32_t xb[NT][8];

  for (int it = blockIdx.x; it < n_items; it += gridDim.x) {
    long long wbase, sbase;
    int grp, brow, slot;
    const bool active = item_info(it, wbase, sbase, grp, brow, slot);
    // this lane's activation rows (B column g of n-tile nt)
    const uint32_t* xl[NT];
    int xstep[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (MODE == MODE_DENSE) {
        const int m = nt * 8 + g;
        xl[nt] = m < a.M ? xs + ((long long)m * a.kc * 4 + t) * 8 : xzero;
        xstep[nt] = m < a.M ? 32 : 0;
      } else if (MODE == MODE_GATEUP) {  // one token column: the slot's token
        xl[nt] = g == 0 ? xs + ((long long)brow * a.kc * 4 + t) * 8 : xzero;
        xstep[nt] = g == 0 ? 32 : 0;
      } else {  // h row of the slot (global); row `zero_row` of hfrag is all zeros
        xl[nt] = a.hfrag + ((long long)(g == 0 ? brow : a.zero_row) * a.kc * 4 + t) * 8;
        xstep[nt] = g == 0 ? 32 : 0;
      }
    }
    float acc[RT][NT][4];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[rt][nt][i] = 0.f;

    for (int i0 = 0; i0 < np; i0 += PF) {
#pragma unroll
      for (int p = 0; p < PF; ++p) {
        const int ci = i0 + p;
        if (ci < nck && active) {
          load_xb<NT>(xl, xstep, kslot + ci * kstride, xb);
#pragma unroll
          for (int rt = 0; rt < RT; ++rt) chunk_mma<NT>(wb[p][rt], sb[p][rt], xb, acc[rt]);
        }
        issue(wb[p], sb[p]);  // slot p is free again: load iteration ci + PF (maybe of the next item)
      }
    }

    // ---- epilogue ----
    if (MODE == MODE_DOWN) {
      // weight the slot, add its bias, fixed-order sum over the 8 warps
      float wt = 0.f;
      if (active) wt = a.wts[slot] * 64.f;  // h stored * 2**8, decode * 2**-14: products are * 2**-6
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const int tile = tile_of(grp, rt);
        float v0 = acc[rt][0][0] * wt, v2 = acc[rt][0][2] * wt;
        if (active && kslot == 0 && a.bias_kind) {
          const long long e = (long long)a.ids[slot];
          const int r0 = tile * 16 + g, r1 = r0 + 8;
          const float w = a.wts[slot];
          if (r0 < a.N) v0 += w * load_param(a.bias, a.bias_kind, e * a.bstride_e + r0);
          if (r1 < a.N) v2 += w * load_param(a.bias, a.bias_kind, e * a.bstride_e + r1);
        }
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
          float b0 = 0.f, b1 = 0.f;
          if (a.bias_kind) {
            if (r0 < a.N) b0 = load_param(a.bias, a.bias_kind, r0);
            if (r1 < a.N) b1 = load_param(a.bias, a.bias_kind, r1);
          }
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
            const long long e = (long long)a.ids[slot];
            float gate = acc[rt][0][0] * xdown[brow], up = acc[rt][0][2] * xdown[brow];
            if (a.bias_kind) {
              gate += load_param(a.bias, a.bias_kind, e * a.bstride_e + 2 * i);
              up += load_param(a.bias, a.bias_kind, e * a.bstride_e + 2 * i + 1);
            }
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
}

// Router: logits[m, e] = x[m] . W[e] + b[e] (fp32 from the stored dtype), then top-k + softmax by the
// last CTA. Warp per expert; x is read through L1 (shared by the CTA's warps).
__global__ void __launch_bounds__(THREADS) route_kernel(const __nv_bfloat16* x, long long sx, const void* w, int w_kind,
                                                        const void* b, int b_kind, float* logits, int* counter,
                                                        int* ids, float* wts, int M, int E, int H, int top_k) {
  pdl_trigger();  // gate_up may start its x preparation
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = blockIdx.x * WARPS + warp;
  if (e < E) {
    const bool vec = (w_kind == 2) && (H % 8 == 0) && ((sx & 7) == 0) &&
                     ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) & 15) == 0;
    for (int m = 0; m < M; ++m) {
      float s = 0.f;
      if (vec) {  // 16-byte loads of x and of the bf16 router row
        const uint4* xr = reinterpret_cast<const uint4*>(x + m * sx);
        const uint4* wr = reinterpret_cast<const uint4*>(reinterpret_cast<const __nv_bfloat16*>(w) + (long long)e * H);
#pragma unroll 4
        for (int q = lane; q < H / 8; q += 32) {
          const uint4 xv = xr[q], wv = wr[q];
          const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
          const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 xf = __bfloat1622float2(xp[i]), wf = __bfloat1622float2(wp[i]);
            s = fmaf(xf.x, wf.x, s);
            s = fmaf(xf.y, wf.y, s);
          }
        }
      } else {
        for (int k = lane; k < H; k += 32) s = fmaf(bf16f(x + m * sx + k), load_param(w, w_kind, (long long)e * H + k), s);
      }
#pragma unroll
      for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) logits[m * E + e] = s + (b_kind ? load_param(b, b_kind, e) : 0.f);
    }
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
    float sel_v[8];
    int sel_i[8];
    for (int j = 0; j < top_k; ++j) {
      float bv = -INFINITY;
      int bi = 0x7fffffff;
      for (int q = lane; q < E; q += 32) {
        const float v = __ldcg(logits + m * E + q);
        bool taken = false;
        for (int jj = 0; jj < j; ++jj) taken |= (sel_i[jj] == q);
        if (!taken && (v > bv || (v == bv && q < bi))) { bv = v; bi = q; }
      }
#pragma unroll
      for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
      }
      sel_v[j] = bv;
      sel_i[j] = bi;
    }
    if (lane == 0) {
      float den = 0.f;
      for (int j = 0; j < top_k; ++j) den += expf(sel_v[j] - sel_v[0]);
      for (int j = 0; j < top_k; ++j) {
        ids[m * top_k + j] = sel_i[j];
        wts[m * top_k + j] = expf(sel_v[j] - sel_v[0]) / den;
      }
    }
  }
  if (threadIdx.x == 0) *counter = 0;
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
  launch<MODE, 1, 8, 2, 4>, launch<MODE, 1, 8, 2, 5>, launch<MODE, 1, 8, 1, 6>, launch<MODE, 1, 4, 1, 6>, \
      launch<MODE, 1, 2, 1, 4>, launch<MODE, 1, 2, 1, 6>, launch<MODE, 1, 1, 1, 6>, launch<MODE, 1, 1, 1, 8>
#define NT2(MODE)                                                                                            \
  launch<MODE, 2, 8, 2, 4>, launch<MODE, 2, 8, 2, 5>, launch<MODE, 2, 8, 1, 6>, launch<MODE, 2, 4, 1, 6>, \
      launch<MODE, 2, 2, 1, 4>, launch<MODE, 2, 2, 1, 6>, launch<MODE, 2, 1, 1, 6>, launch<MODE, 2, 1, 1, 8>

typedef cudaError_t (*launch_fn)(const Args&, int, size_t, cudaStream_t, int);

extern "C" {

int mxfp4_num_variants() { return 16; }

const char* mxfp4_error_string(int err) { return cudaGetErrorString((cudaError_t)err); }

int mxfp4_launch(int mode, int variant, const __nv_bfloat16* x, long long sx, const void* words, const void* scales,
                 long long wstride_e, long long sstride_e, const void* bias, int bias_kind, long long bstride_e,
                 __nv_bfloat16* out, long long so, void* hfrag, int kc_h, int zero_row, const int* ids, const float* wts, int M,
                 int N, int K, int n_tiles, int kc, int top_k, int ksplit, float alpha, float limit, int grid,
                 long long smem, void* stream, int pdl) {
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
  const launch_fn* table = mode == 0 ? dense : (mode == 1 ? gateup : down);
  if (!table[variant]) return (int)cudaErrorInvalidValue;
  return (int)table[variant](a, grid, (size_t)smem, reinterpret_cast<cudaStream_t>(stream), pdl);
}

int mxfp4_route(const __nv_bfloat16* x, long long sx, const void* w, int w_kind, const void* b, int b_kind,
                float* logits, int* counter, int* ids, float* wts, int M, int E, int H, int top_k, void* stream) {
  if (top_k > 8 || top_k < 1) return (int)cudaErrorInvalidValue;
  route_kernel<<<(E + WARPS - 1) / WARPS, THREADS, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      x, sx, w, w_kind, b, b_kind, logits, counter, ids, wts, M, E, H, top_k);
  return (int)cudaGetLastError();
}

int mxfp4_max_smem_optin(int device) {
  int v = 0;
  cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return v;
}

}  // extern "C"
