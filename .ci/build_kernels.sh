#!/usr/bin/env bash
# CI: the CUDA kernels built for every architecture we ship, on a CPU machine (no GPU, no system CUDA).
# 1. installs the pinned nvcc wheels (requirements-kernels-build.txt) into the suite's venv, once per pin (stamp);
# 2. compiles kernels/csrc/mxfp4_mma.cu for sm_90a and sm_121a (GB10) with that nvcc, both at once;
# 3. compiles the Triton kernels (decode GEMVs, the packed prefill GEMM) for the same arches with the installed Triton;
# 4. prints the static SASS counts of their loops per architecture and checks them against
#    kernels/sass_budget.yaml.
# Exit status: 0 built and within budget; 1 a build or the budget failed; 2 the toolchain could not be installed.
# tests/level1_5_kernels/test_kernel_build.py checks the same (and that a build using what sm_121a lacks fails);
# with SUITE_REQUIRE_NVCC=1 a missing nvcc fails that test instead of skipping it. Compiled cubins are cached
# by source hash (kernels/tools/build.py), so the tests after this step do not compile the source again.
set -uo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/setup.sh | tail -n 1) || exit 2
t0=$(date +%s)
venv=$("$py" -c "import sys; print(sys.prefix)")
stamp="$venv/.kernels-build-$(sha256sum requirements-kernels-build.txt | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  # pip's own status decides (a grep that filters its output exits 1 when there is nothing to show)
  if ! log=$("$py" -m pip install -q --disable-pip-version-check -r requirements-kernels-build.txt 2>&1); then
    printf '%s\n' "$log" | tail -20 >&2
    echo "build_kernels: the nvcc wheels did not install; install requirements-kernels-build.txt by hand to see why" >&2
    exit 2
  fi
  printf '%s\n' "$log" | grep -v -e "^WARNING: Location" -e '^$' >&2 || true
  rm -f "$venv"/.kernels-build-*; touch "$stamp"
fi
t1=$(date +%s)
echo "build_kernels: toolchain ready in $((t1 - t0)) s"
"$py" -m kernels.tools.sass_count --arch 90a --arch 121a --check-budget
rc=$?
echo "build_kernels: build + counts in $(( $(date +%s) - t1 )) s (rc $rc)"
exit $rc
