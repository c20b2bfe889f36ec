"""Measuring the kernels: each module is a command (`python -m kernels.tools.<name>`), nothing runs on import.

  bench        - times every decode shape and the MoE layer against BF16 and the measured copy bandwidth (GPU)
  read_floor   - what a plain read of the MoE layer's bytes costs: the yardstick bench prints beside it (GPU)
  phase_timing - where the time of one CUDA kernel call goes, from per-CTA timestamps (GPU)
  ncu_profile  - Nsight Compute counters per kernel: instructions per weight word, issue / DRAM % (GPU + ncu)
  sass_count   - static instruction counts of the decode loops from compiled SASS (no GPU: nvcc + nvdisasm)
  sass_budget  - the counts' budget, kernels/sass_budget.yaml, checked in CI (`sass_count --check-budget`)
  build        - compiles csrc/mxfp4_mma.cu to cubins per arch (sm_90a, sm_121a) with the pinned nvcc wheel (no GPU)
  timing       - the GPU timing helpers they share (CUDA graphs, rotating buffers, copy bandwidth)
"""
