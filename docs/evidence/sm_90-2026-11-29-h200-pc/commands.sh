# What ran, in this order, in one job per host (the suite's tree copied to the host; PYTHONPATH = staged vLLM + tree;
# KERNELS_CACHE_DIR empty at the start, so every source was compiled there).
# host 1 (branch next/pc-prefill at e049dae):
KERNELS_PACKED_MM_CUDA_VARIANT=3 timeout 120 python -m pytest -p no:cacheprovider --noconftest -q -m gpu tests/level1_5_kernels/test_kernel_moe.py > moe.log
timeout 240 python -m pytest -p no:cacheprovider --noconftest -q -m gpu tests/level1_5_kernels/test_kernel_packed_mm.py > pm.log
timeout 300 python -m kernels.tools.bench_prefill --ab served,@3 --ab-m 2048,512 --out ab.json > ab.log
# (the served-model pp2048_gpu with variant 3 ran only if ab.json called @3 faster and bit-identical at 2048: it did not)
# host 2 (main at 129998d; nodec.cu / nodecmul.cu = csrc/mxfp4_mma.cu with nodec.diff / nodecmul.diff applied):
timeout 300 python -m kernels.tools.bench_prefill --ab served,nodec.cu,nodecmul.cu --ab-m 2048 --out ab_nodec.json > ab_nodec.log
# CPU (sass-counts.txt): the hot loops of mxfp4_pf_kernel<1, 8, 2, 2, 1> per source, nvcc 13.2.86 wheel, sm_90a
# (kernels.tools.build.compile_cubin + kernels.tools.sass_count.parse_nvdisasm; registers and spills from ptxas -v)
