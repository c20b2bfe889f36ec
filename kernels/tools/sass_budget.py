"""The static SASS budget of the CUDA decode loops: kernels/sass_budget.yaml, checked on every CI run.

The decode kernels are bound by bytes on GB10 and close to issue-bound on an H200 (kernels/NOTES.md): a change
that adds instructions per weight word to the chunk loop costs time before any GPU run would show it. The
budget holds, per architecture and kernel variant, the hot-loop and whole-loop instructions per 32-bit weight
word that kernels/tools/sass_count.py counted when it was recorded, with the nvcc version that built them;
a count above recorded x (1 + margin) is a violation. Counts from another nvcc are not comparable, so a
version mismatch is a violation too (re-record after bumping requirements-kernels-build.txt).
"""

from __future__ import annotations

from pathlib import Path

import yaml

BUDGET_FILE = Path(__file__).resolve().parents[1] / "sass_budget.yaml"
MARGIN = 0.05  # +5%: nvcc's scheduling of the same source is deterministic; this leaves room for a small edit
METRICS = {"hot": "instr_per_word", "loop": "loop_instr_per_word"}  # budget key -> sass_count row key
RERECORD = "python -m kernels.tools.sass_count --cuda --arch 90a --arch 121a --write-budget"

_HEADER = f"""\
# Static SASS budget of the CUDA decode loops (kernels/tools/sass_budget.py says why; CI checks it:
# .ci/build_kernels.sh and tests/level1_5_kernels/test_kernel_build.py).
# Per architecture and kernel variant mxfp4_kernel<MODE,NT,RW,RT,PF>: instructions per 32-bit weight word of the
# chunk loop, `hot` (its per-chunk source lines) and `loop` (every instruction in the loop body), as
# kernels/tools/sass_count.py counted them with the nvcc below. A count above value x (1 + margin) fails.
# Written by `{RERECORD}`:
# re-record when a change is meant to cost more (and say why in the commit), or after a compiler bump.
"""


def load(path: Path = BUDGET_FILE) -> dict:
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data.get("counts"), dict) or "nvcc" not in data:
        raise ValueError(f"{path}: needs `nvcc` and `counts` (re-record: {RERECORD})")
    return data


def record(rows_by_arch: dict[str, list[dict]], nvcc_version: str, path: Path = BUDGET_FILE,
           margin: float = MARGIN) -> Path:
    """Write the counts of `rows_by_arch` (sass_count.cuda_counts per arch) as the budget."""
    counts = {f"sm_{arch}": {r["variant"]: {**{k: r[v] for k, v in METRICS.items()}, "what": r["kernel"]} for r in rows}
              for arch, rows in rows_by_arch.items()}
    body = yaml.safe_dump({"nvcc": nvcc_version, "margin": margin, "counts": counts}, sort_keys=False,
                          default_flow_style=None, width=120)
    path.write_text(_HEADER + body)
    return path


def check(rows_by_arch: dict[str, list[dict]], budget: dict, nvcc_version: str) -> list[str]:
    """One line per violation: a count over budget, a variant missing on either side, another nvcc."""
    if str(budget["nvcc"]) != nvcc_version:
        return [f"the budget was recorded with nvcc {budget['nvcc']}, these counts come from nvcc {nvcc_version}: "
                f"build with requirements-kernels-build.txt's nvcc, or re-record: {RERECORD}"]
    margin = float(budget.get("margin", MARGIN))
    out = []
    for arch, rows in rows_by_arch.items():
        want = budget["counts"].get(f"sm_{arch}")
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
            for key, row_key in METRICS.items():
                limit = float(want[variant][key]) * (1 + margin)
                if r[row_key] > limit:
                    out.append(f"sm_{arch} {variant} ({r['kernel']}): {key} {r[row_key]:.2f} instr/word > budget "
                               f"{want[variant][key]} +{margin:.0%} = {limit:.2f}; the loop grew by "
                               f"{r[row_key] / float(want[variant][key]) - 1:+.1%}: make it smaller, or re-record "
                               f"if that is the price of the change")
    return out
