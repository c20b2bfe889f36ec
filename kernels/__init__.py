"""MXFP4 / MXFP8 formats, fp32 reference ops and Triton fast kernels for gpt-oss.

Modules (import what you need; nothing heavy happens here):
  mxfp4      - OCP MX v1.0 MXFP4 (E2M1 + E8M0/32) quantize/dequantize, gpt-oss checkpoint layout
  mxfp8      - MXFP8 (E4M3 + E8M0/32) quantize/dequantize
  reference  - fp32 references: W4A16 linear, gpt-oss MoE block, attention with sinks / sliding window / paged KV
  gemv       - Triton low-M MXFP4 GEMM/GEMV + the `mxfp4_linear` dispatcher
  moe        - Triton MXFP4 MoE decode (fused gate_up + SwiGLU, down + weighted combine)
  quant      - Triton fused BF16 -> MXFP8 activation quantization
  tuning     - per-architecture launch configs from tuning.yaml (+ env overrides)
  bench      - `python -m kernels.bench`
"""
