"""MXFP4 / MXFP8 formats, fp32 reference ops and Triton fast kernels for gpt-oss.

Modules (import what you need; nothing heavy happens here):
  mxfp4      - OCP MX v1.0 MXFP4 (E2M1 + E8M0/32) quantize/dequantize, gpt-oss checkpoint layout
  mxfp8      - MXFP8 (E4M3 + E8M0/32) quantize/dequantize
  reference  - fp32 references: W4A16 linear, gpt-oss MoE block, attention with sinks / sliding window / paged KV
  packed     - weights repacked once at load for the decode kernels (`pack_mxfp4`), activation form
  gemv       - Triton low-M MXFP4 GEMM/GEMV, `mxfp4_gemv_packed` and the `mxfp4_linear` dispatcher
  cuda_ext   - builds/loads csrc/mxfp4_mma.cu (tensor cores fed from registers; GPU only)
  moe        - Triton MXFP4 MoE decode (fused gate_up + SwiGLU, down + weighted combine)
  quant      - Triton fused BF16 -> MXFP8 activation quantization
  tuning     - per-architecture launch configs from tuning.yaml (+ env overrides)
  testing    - what the conformance tests share: fresh seeds, NMSE, poisoned outputs, random MXFP4 weights
  tools/     - the measuring (`python -m kernels.tools.bench`, read_floor, phase_timing, ncu_profile,
               sass_count; kernels/tools/__init__.py lists them); gpu_run.sh - tests + bench + ncu in one GPU run
"""
