"""Which kernels two CUDA sources compile to differently, instruction for instruction, per architecture (no GPU).

    python -m kernels.tools.sass_diff BEFORE AFTER [--arch 90a --arch 121a]
    python -m kernels.tools.sass_diff HEAD:kernels/csrc/mxfp4_mma.cu kernels/csrc/mxfp4_mma.cu

BEFORE and AFTER are paths, or REV:PATH for a file as git holds it at a revision. A source change meant to leave the
served kernels alone (a refactor, a macro whose default keeps the code of before) is shown to by this on CPU: every
function's SASS is compared instruction by instruction, with branch targets as addresses in the function (a change to
one kernel shifts the label numbers of every later one) and the anonymous namespace's file-derived name left out (it
names the file, not the code). Exit 0 when every function of both is the same on every arch, 1 when one differs, is
added or is gone (listed), 2 on bad input.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from . import build, sass_count

ANON = re.compile(r"_ZN(\d+)(_GLOBAL__N__)")  # _ZN41_GLOBAL__N__2b53a286_9_before_cu_108d9277 15mxfp4_...


def _without_anon(name: str) -> str:
    """The mangled name with the anonymous namespace's identifier (its length says where it ends) as _ANON_."""
    m = ANON.match(name)
    return f"_ZN_ANON_{name[m.start(2) + int(m.group(1)):]}" if m else name


def functions(sass: str) -> dict[str, list[str]]:
    """nvdisasm text -> {function: its instructions}. sass_count.parse_nvdisasm resolves branch labels to addresses
    within the function, so the label numbers nvdisasm counts across the whole cubin drop out."""
    return {_without_anon(name): [re.sub(r"\s+", " ", text) for _, text, _ in ins]
            for name, ins in sass_count.parse_nvdisasm(sass).items()}


def compare(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """One line per function that differs, was added or is gone; empty when all are the same."""
    lines = []
    for name in sorted(before.keys() | after.keys()):
        b, a = before.get(name), after.get(name)
        if b is None:
            lines.append(f"added    {name} ({len(a)} instructions)")
        elif a is None:
            lines.append(f"gone     {name} ({len(b)} instructions)")
        elif a != b:
            same = sum(x == y for x, y in zip(b, a))
            lines.append(f"differs  {name} ({len(b)} -> {len(a)} instructions, {same} the same in place)")
    return lines


def source(spec: str, tmp: Path) -> Path:
    """A path, or REV:PATH read with git show into `tmp` (keeping the file's name)."""
    if Path(spec).is_file():
        return Path(spec)
    rev, sep, path = spec.partition(":")
    if not sep or not path:
        raise ValueError(f"{spec}: no such file, and not REV:PATH (e.g. HEAD:kernels/csrc/mxfp4_mma.cu)")
    r = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, timeout=60)
    if r.returncode:
        raise ValueError(f"{spec}: git show failed: {r.stderr.decode().strip()[:200]}")
    dest = tmp / rev.replace("/", "_") / Path(path).name
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(r.stdout)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.tools.sass_diff", description=__doc__.splitlines()[0])
    ap.add_argument("before", help="a .cu path or REV:PATH")
    ap.add_argument("after", help="a .cu path or REV:PATH")
    ap.add_argument("--arch", action="append", type=build.arch_option, help="e.g. 90a, 121a; repeatable (default both)")
    ap.add_argument("--nvcc", help="build with this nvcc instead of the wheel's (kernels/tools/build.py)")
    args = ap.parse_args(argv)
    archs = args.arch or list(build.ARCHS)
    try:
        tc = build.find_toolchain(args.nvcc)
        with tempfile.TemporaryDirectory() as tmp:
            srcs = [source(s, Path(tmp)) for s in (args.before, args.after)]
            cubins = [build.compile_all(s, archs, tc) for s in srcs]
            differ = False
            for arch in archs:
                before, after = (functions(build.disassemble(c[arch], tc)) for c in cubins)
                lines = compare(before, after)
                differ |= bool(lines)
                print(f"sm_{arch}: {len(before)} -> {len(after)} functions, {len(lines)} not the same")
                for line in lines:
                    print(f"  {line}")
    except (ValueError, build.ToolchainMissing, build.BuildError) as ex:
        print(f"sass_diff: {ex}", file=sys.stderr)
        return 2
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
