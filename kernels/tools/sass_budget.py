"""The static SASS budget of the decode and prefill loops: kernels/sass_budget.yaml, checked on every CI run.

The decode kernels are bound by bytes on GB10 and close to issue-bound on an H200, and the prefill GEMM on the packed
bytes (kernels/packed_mm.py) is issue-bound on an H100 (kernels/NOTES.md): a change that adds instructions per weight
word to a loop costs time before any GPU run would show it. The budget holds, per architecture and kernel variant,
the hot-loop and whole-loop instructions per 32-bit weight word that kernels/tools/sass_count.py counted when it was
recorded: the CUDA kernels (`counts`) with the nvcc that built them, the Triton kernels (`triton_counts`) with the
Triton that compiled them (torch's pin in requirements-cpu.txt; the GPU machines may run another, so these are a
proxy there). A count above recorded x (1 + margin) is a violation. Counts from another compiler are not comparable,
so a version mismatch is a violation too (re-record after bumping requirements-kernels-build.txt or torch).

The CUDA kernels also have a budget on MMA instructions per weight word (`mma`): tensor work added to the loop (the
same product computed twice, an extra token tile) costs issue slots and tensor-pipe time that instructions per word
alone would show only in part. Words per pass come from each variant's template arguments (sass_count.words_per_pass),
so more MMAs can never read as more words.
"""

from __future__ import annotations

from pathlib import Path

import yaml

BUDGET_FILE = Path(__file__).resolve().parents[1] / "sass_budget.yaml"
MARGIN = 0.05  # +5%: the compilers' scheduling of the same source is deterministic; this leaves room for a small edit
# budget key -> (sass_count row key, unit), per kind: the CUDA kernels' MMAs per word as well (module docstring)
METRICS = {"cuda": {"hot": ("instr_per_word", "instr/word"), "loop": ("loop_instr_per_word", "instr/word"),
                    "mma": ("mma_per_word", "MMA/word")},
           "triton": {"hot": ("instr_per_word", "instr/word"), "loop": ("loop_instr_per_word", "instr/word")}}
RERECORD = "python -m kernels.tools.sass_count --arch 90a --arch 121a --write-budget"

_HEADER = f"""\
# Static SASS budget of the CUDA decode loops and the Triton loops (kernels/tools/sass_budget.py says why; CI checks
# it: .ci/build_kernels.sh and tests/level1_5_kernels/test_kernel_build.py).
# Per architecture and kernel variant (CUDA: mxfp4_kernel<MODE,NT,RW,RT,PF>; Triton: the case names of
# gemv.static_count_cases and packed_mm.static_count_cases): instructions per 32-bit weight word of the loop, `hot`
# (its per-chunk source lines) and `loop` (every instruction in the loop body), and for CUDA `mma` (MMA instructions
# per word), as kernels/tools/sass_count.py counted them with the nvcc / Triton below. A count above
# value x (1 + margin) fails.
# Written by `{RERECORD}`:
# re-record when a change is meant to cost more (and say why in the commit), or after a compiler bump.
"""

SECTIONS = {"cuda": ("nvcc", "counts"), "triton": ("triton", "triton_counts")}  # kind -> (version key, counts key)


def load(path: Path = BUDGET_FILE) -> dict:
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    for version_key, counts_key in SECTIONS.values():
        if not isinstance(data.get(counts_key), dict) or version_key not in data:
            raise ValueError(f"{path}: needs `{version_key}` and `{counts_key}` (re-record: {RERECORD})")
    return data


def _by_arch(rows_by_arch: dict[str, list[dict]], kind: str) -> dict:
    return {f"sm_{arch}": {r["variant"]: {**{k: r[v] for k, (v, _) in METRICS[kind].items()}, "what": r["kernel"]}
                           for r in rows}
            for arch, rows in rows_by_arch.items()}


def record(rows_by_arch: dict[str, list[dict]], nvcc_version: str, triton_rows: dict[str, list[dict]],
           triton_version: str, path: Path = BUDGET_FILE, margin: float = MARGIN) -> Path:
    """Write the counts (sass_count.cuda_counts / triton_counts per arch) as the budget."""
    body = yaml.safe_dump({"nvcc": nvcc_version, "triton": triton_version, "margin": margin,
                           "counts": _by_arch(rows_by_arch, "cuda"), "triton_counts": _by_arch(triton_rows, "triton")},
                          sort_keys=False, default_flow_style=None, width=200)  # one line per variant
    path.write_text(_HEADER + body)
    return path


def check(rows_by_arch: dict[str, list[dict]], budget: dict, version: str, kind: str = "cuda") -> list[str]:
    """One line per violation of the `kind` section ("cuda": version = nvcc's, "triton": Triton's): a count over
    budget, a variant missing on either side, another compiler version."""
    version_key, counts_key = SECTIONS[kind]
    if str(budget[version_key]) != version:
        return [f"the {kind} budget was recorded with {version_key} {budget[version_key]}, these counts come from "
                f"{version_key} {version}: build with the pinned one, or re-record: {RERECORD}"]
    margin = float(budget.get("margin", MARGIN))
    out = []
    for arch, rows in rows_by_arch.items():
        want = budget[counts_key].get(f"sm_{arch}")
        if want is None:
            out.append(f"sm_{arch}: no budget recorded; re-record: {RERECORD}")
            continue
        got = {r["variant"]: r for r in rows}
        for variant in sorted(set(want) - set(got)):
            out.append(f"sm_{arch} {variant}: in the budget but not in the build (renamed or dropped?); re-record")
        for variant, r in got.items():
            if variant not in want:
                out.append(f"sm_{arch} {variant} ({r['kernel']}): not in the budget; re-record: {RERECORD}")
                continue
            for key, (row_key, unit) in METRICS[kind].items():
                if key not in want[variant]:
                    out.append(f"sm_{arch} {variant}: no `{key}` budget recorded; re-record: {RERECORD}")
                    continue
                limit = float(want[variant][key]) * (1 + margin)
                if r[row_key] > limit:
                    out.append(f"sm_{arch} {variant} ({r['kernel']}): {key} {r[row_key]:.2f} {unit} > budget "
                               f"{want[variant][key]} +{margin:.0%} = {limit:.2f}; the loop grew by "
                               f"{r[row_key] / float(want[variant][key]) - 1:+.1%}: make it smaller, or re-record "
                               f"if that is the price of the change")
    return out
