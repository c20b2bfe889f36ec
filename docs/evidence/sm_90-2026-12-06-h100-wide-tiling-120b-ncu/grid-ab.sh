#!/usr/bin/env bash
set -u
O=/tmp/grid; mkdir -p $O; cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
timeout 300 python3 -m kernels.tools.bench_prefill --ab .gpu-prev/mxfp4_mma.cu@4,@4 --ab-m 8192,2048 --rounds 5 \
  --out $O/ab.json > $O/ab.log 2>&1; echo "ab rc $?"
grep -v "^NVIDIA" $O/ab.log | grep -E "MoE M=|: .*x|stock" | tail -12
