"""The harness's house rules, checked: every module imports alone in a fresh interpreter, and imports point
down the layer order of harness/__init__.py (no circle, nothing hidden in a function to dodge one)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# lowest first: a package may import its own modules and any package listed before it, never one after it
LAYERS = [("core",), ("config",), ("engine",), ("session",), ("kernelpath",), ("correctness", "perf"), ("stress",),
          ("matrix", "features"), ("report",), ("plugin",)]
RANK = {pkg: i for i, group in enumerate(LAYERS) for pkg in group}


def _modules(package: str) -> list[str]:
    root = REPO / package
    return sorted(".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                  for p in root.rglob("*.py") if "__pycache__" not in p.parts and "csrc" not in p.parts)


def harness_imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported harness module, line, inside a function) for every import of `path`."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = module.split(".")[:-child.level]
                    base = ".".join(parent + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in child.names]
                out.extend((n if n.count(".") >= 2 else base, child.lineno, in_function)
                           for n in names if base.startswith("harness"))
            elif isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, in_function) for a in child.names if a.name.startswith("harness"))
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text()), False)
    return out


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (REPO / "harness" / parts[1]).is_dir()) else None


# the kernels package's modules: tests/level1_5_kernels/test_kernel_imports.py, which also forbids CUDA at import
@pytest.mark.parametrize("module", _modules("harness"))
def test_every_module_imports_alone_in_a_fresh_interpreter(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"`import {module}` alone fails: {done.stderr.strip().splitlines()[-1:]}"


def test_harness_imports_point_down_the_layers() -> None:
    problems = []
    for path in sorted((REPO / "harness").rglob("*.py")):
        own = _package(".".join(path.relative_to(REPO).with_suffix("").parts))
        if own is None:
            continue
        for target, line, _ in harness_imports(path):
            other = _package(target)
            if other is None or other == own:
                continue
            if other not in RANK or own not in RANK:
                problems.append(f"{path.relative_to(REPO)}:{line}: {own} or {other} is not in LAYERS")
            elif RANK[other] >= RANK[own]:
                problems.append(f"{path.relative_to(REPO)}:{line}: {own} imports {target} (same or higher layer)")
    assert not problems, "imports that point up or sideways:\n  " + "\n  ".join(problems)


def test_no_function_local_import_of_the_harness_inside_the_harness() -> None:
    """A function-local import is how a circle hides; inside the harness every import is at the top."""
    local = [f"{p.relative_to(REPO)}:{line}: {target}" for p in sorted((REPO / "harness").rglob("*.py"))
             for target, line, in_function in harness_imports(p) if in_function]
    assert not local, "function-local harness imports:\n  " + "\n  ".join(local)


def test_the_layer_checks_catch_an_upward_import(tmp_path: Path) -> None:
    """Test of the test: a core module importing a perf module is reported."""
    bad = REPO / "harness" / "core" / "_layering_probe.py"
    bad.write_text("from harness.perf import stats_probe\n\ndef f():\n    from harness.engine import server\n")
    try:
        found = harness_imports(bad)
        assert ("harness.perf.stats_probe", 1, False) in found and ("harness.engine.server", 4, True) in found
        assert RANK["perf"] > RANK["core"]
    finally:
        bad.unlink()
