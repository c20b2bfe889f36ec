"""Compile kernels/csrc/mxfp4_mma.cu to cubins without a GPU: the CI build for every architecture we ship.

    python -m kernels.tools.build [--arch 90a --arch 121a] [--nvcc PATH]

Architectures: sm_90a (H100 / H200) and sm_121a (GB10). The `a` targets are the ones a GB10 build needs
(cvt.rn.f16x2.e2m1x2 is refused for plain sm_121), and they make ptxas refuse what the part lacks (TMA
gather4 / scatter4 do not exist on sm_12x), so a change that uses such an instruction fails here, on CPU.

Toolchain: NVIDIA's CUDA wheels of requirements-kernels-build.txt (nvcc, ptxas, cicc, the headers, nvdisasm),
which pip puts under site-packages/nvidia/cu13/ of this interpreter; found there first, so CI needs no system
CUDA. `--nvcc` or $KERNELS_NVCC picks another nvcc (its SASS counts are then not the budget's: sass_budget.yaml
names the nvcc version it was recorded with). Cubins are cached by source, arch, flags and nvcc version under
$KERNELS_CACHE_DIR or ~/.cache/kernels_mxfp4 (cuda_ext's cache), so CI's build step and its tests compile once.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "csrc" / "mxfp4_mma.cu"
ARCHS = ("90a", "121a")  # H100 / H200, GB10 (DGX Spark)
# -lineinfo: sass_count maps SASS to source lines; 177: unused-variable warnings of the phase-timing macros.
FLAGS = ("-O3", "-lineinfo", "-diag-suppress", "177")
INSTALL_HINT = "install requirements-kernels-build.txt (bash .ci/build_kernels.sh, or python -m pip install -r it)"


class ToolchainMissing(RuntimeError):
    """No nvcc to build with; the message names the fix."""


class BuildError(RuntimeError):
    """nvcc refused the source; the message carries its diagnostics."""


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    nvdisasm: Path | None
    version: str  # "13.2.86", from `nvcc --version`
    origin: str  # "wheel" (requirements-kernels-build.txt), "KERNELS_NVCC", "--nvcc" or "PATH"

    def describe(self) -> str:
        return f"nvcc {self.version} ({self.origin}: {self.nvcc})"


def _version(nvcc: Path) -> str:
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    if not m:
        raise ToolchainMissing(f"{nvcc} --version printed no release: {out.strip()[-200:]!r}; {INSTALL_HINT}")
    return m.group(1)


def wheel_bin() -> Path | None:
    """site-packages/nvidia/cu13/bin of this interpreter when the nvcc wheel is installed there, else None."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (Path(root) / "cu13" / "bin" / "nvcc").is_file():
            return Path(root) / "cu13" / "bin"
    return None


def _nvdisasm(nvcc: Path) -> Path | None:
    """nvdisasm of the same CUDA as `nvcc` if it has one, else the wheel's, PATH's or Triton's bundled copy (a
    system CUDA may ship nvcc without it; an older nvdisasm may not know the newest arch)."""
    wb = wheel_bin()
    for d in (nvcc.parent, nvcc.resolve().parent, wb):
        if d and (d / "nvdisasm").is_file():
            return d / "nvdisasm"
    found = shutil.which("nvdisasm")
    if found:
        return Path(found)
    spec = importlib.util.find_spec("triton")
    bundled = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "nvdisasm" if spec and spec.origin else None
    return bundled if bundled and bundled.is_file() else None


def _toolchain(nvcc: Path, origin: str) -> Toolchain:
    if not os.access(nvcc, os.X_OK):
        raise ToolchainMissing(f"{nvcc} ({origin}) is not an executable nvcc; {INSTALL_HINT}")
    return Toolchain(nvcc, _nvdisasm(nvcc), _version(nvcc), origin)


def find_toolchain(nvcc: str | None = None, wheel_only: bool = False) -> Toolchain:
    """The nvcc to build with: `nvcc`, else $KERNELS_NVCC, else the wheel's, else nvcc on PATH (unless wheel_only).
    ToolchainMissing says what to install."""
    if nvcc:
        return _toolchain(Path(nvcc), "--nvcc")
    if os.environ.get("KERNELS_NVCC") and not wheel_only:
        return _toolchain(Path(os.environ["KERNELS_NVCC"]), "KERNELS_NVCC")
    wb = wheel_bin()
    if wb:
        return _toolchain(wb / "nvcc", "wheel")
    if wheel_only:
        raise ToolchainMissing(f"no nvcc wheel in {sys.executable}'s site-packages (nvidia/cu13/bin/nvcc); {INSTALL_HINT}")
    found = shutil.which("nvcc")
    if not found:
        raise ToolchainMissing(f"nvcc not found (no wheel, not on PATH); {INSTALL_HINT}")
    return _toolchain(Path(found), "PATH")


def gencode(arch: str) -> list[str]:
    """nvcc flags for one real architecture, e.g. '121a' -> -gencode arch=compute_121a,code=sm_121a."""
    if not re.fullmatch(r"\d{2,3}[af]?", arch):
        raise ValueError(f"arch {arch!r} is not like 90, 90a or 121a")
    return ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]


def arch_option(arch: str) -> str:
    """argparse type of --arch: a bad one is argparse's one line and exit 2, not a traceback from gencode."""
    try:
        gencode(arch)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return arch


def source_option(src: str) -> Path:
    """argparse type of --src: a file that is not there is argparse's one line, not nvcc's error after the lookup."""
    if not Path(src).is_file():
        raise argparse.ArgumentTypeError(f"{src}: no such file; pass a CUDA source such as {SRC}")
    return Path(src)


def _cache_dir() -> Path:
    return Path(os.environ.get("KERNELS_CACHE_DIR", Path.home() / ".cache" / "kernels_mxfp4")) / "cubin"


def compile_cubin(src: Path, arch: str, tc: Toolchain, cache: bool = True, defines: tuple[str, ...] = ()) -> Path:
    """A cubin of `src` for sm_<arch>. BuildError carries nvcc's diagnostics (the last 4000 characters)."""
    flags = [*FLAGS, *(f"-D{d}" for d in defines), *gencode(arch)]
    key = hashlib.sha256(Path(src).read_bytes() + " ".join(flags).encode() + tc.version.encode()).hexdigest()[:16]
    out = _cache_dir() / f"{Path(src).stem}_sm{arch}_{key}.cubin"
    if cache and out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.{arch}.tmp")
    cmd = [str(tc.nvcc), "-cubin", *flags, "-o", str(tmp), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"nvcc {tc.version} for sm_{arch} failed (rc {r.returncode}): {' '.join(cmd)}\n{r.stderr[-4000:]}")
    os.replace(tmp, out)  # atomic: a concurrent build of the same key writes the same bytes
    return out


def compile_all(src: Path, archs: tuple[str, ...] | list[str], tc: Toolchain) -> dict[str, Path]:
    """One cubin per arch, built side by side (each nvcc is single-threaded: CI's 2 cores build 2 arches at once)."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(archs), os.cpu_count() or 1))) as pool:
        futures = {a: pool.submit(compile_cubin, src, a, tc) for a in archs}
        return {a: f.result() for a, f in futures.items()}


def disassemble(cubin: Path, tc: Toolchain) -> str:
    """nvdisasm --print-line-info -hex of a cubin (the wheel's nvdisasm, which knows every arch its nvcc builds); -hex
    adds each instruction's encoding, whose control code kernels/tools/scoreboard.py reads."""
    if tc.nvdisasm is None:
        raise ToolchainMissing(f"nvdisasm not found beside {tc.nvcc} or on PATH; {INSTALL_HINT}")
    return subprocess.run([str(tc.nvdisasm), "--print-line-info", "-hex", str(cubin)], check=True, capture_output=True,
                          text=True, timeout=300).stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.tools.build", description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", type=arch_option,
                    help=f"real architecture, repeatable (default: {' '.join(ARCHS)})")
    ap.add_argument("--nvcc", help="this nvcc instead of the wheel's")
    ap.add_argument("--src", default=str(SRC), type=source_option, help="CUDA source (default kernels/csrc/mxfp4_mma.cu)")
    args = ap.parse_args(argv)
    try:
        tc = find_toolchain(args.nvcc)
    except ToolchainMissing as ex:
        print(f"build: {ex}", file=sys.stderr)
        return 2
    print(f"build: {tc.describe()}", flush=True)
    t0 = time.time()
    try:
        cubins = compile_all(Path(args.src), args.arch or list(ARCHS), tc)
    except BuildError as ex:
        print(f"build: {ex}", file=sys.stderr)
        return 1
    for arch, cubin in cubins.items():
        print(f"build: sm_{arch} ok, {cubin.stat().st_size / 1e6:.1f} MB cubin ({cubin.name})")
    print(f"build: {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
