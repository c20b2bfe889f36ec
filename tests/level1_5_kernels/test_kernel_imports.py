"""The kernels package's own import structure (CPU, no GPU, no compiler).

No import circle between its modules, counting imports inside functions too: a function-local import that
only hides a circle (read_floor once took time_calls from bench, which imports read_floor) breaks as soon as
someone moves it to the top. And every module imports on its own in a fresh interpreter with no GPU visible.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.level1_5

PKG = Path(__file__).resolve().parents[2] / "kernels"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(source: str, name: str, is_package: bool = False) -> set[str]:
    """kernels.* modules that module `name` imports anywhere in its source (relative imports resolved)."""
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "kernels"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "kernels":
                continue
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}  # `from . import cuda_ext` names a module
    return out


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in _imports(p.read_text(), m, p.name == "__init__.py") if i in modules and i != m}
            for m, p in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circle_between_kernels_modules():
    graph = import_graph()
    assert len(graph) > 10, sorted(graph)  # the scan found the package
    cycle = _cycle(graph)
    assert cycle is None, f"import circle: {' -> '.join(cycle)}; move what both need into a module both import"


def test_the_circle_check_sees_function_local_imports():
    graph = {"kernels.a": {"kernels.b"}, "kernels.b": {"kernels.a"}, "kernels.c": set()}
    assert _cycle(graph) == ["kernels.a", "kernels.b", "kernels.a"]
    local = _imports("def f():\n    from .bench import time_calls\n", "kernels.tools.read_floor")
    assert "kernels.tools.bench" in local, local


def test_every_module_imports_alone_in_a_fresh_interpreter_without_cuda():
    """Each kernels module on its own, in a new interpreter with no GPU visible: nothing may rely on a sibling
    imported first, nor need (or initialise) CUDA at import time. Run side by side: one interpreter per module."""
    probe = ("import importlib, sys; importlib.import_module(sys.argv[1]); t = sys.modules.get('torch'); "
             "assert t is None or not t.cuda.is_initialized(), 'CUDA initialised at import'")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    names = sorted(import_graph())
    failed = {}
    for start in range(0, len(names), os.cpu_count() or 2):
        batch = names[start:start + (os.cpu_count() or 2)]
        procs = {n: subprocess.Popen([sys.executable, "-c", probe, n], cwd=PKG.parent, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for n in batch}
        for n, p in procs.items():
            out, _ = p.communicate(timeout=300)
            if p.returncode:
                failed[n] = out.strip().splitlines()[-1] if out.strip() else f"rc {p.returncode}"
    assert not failed, "\n".join(f"python -c 'import {n}': {why}" for n, why in failed.items())
