"""Human-readable listings: `--list-configs` and the end-of-run summary."""
from __future__ import annotations

from collections import defaultdict

from harness.config.catalog import CONFIG_DIR, Flavour
from harness.core.errors import SuiteError
from harness.engine.models import Model
from harness.session.suite import Suite

LEVELS = ("level1", "level1_5", "level2", "level3", "level4", "level5", "level6")
_EXAMPLE_PLATFORM = {"cpu": "cpu", "sm_12x": "sm_121", ">=sm_80": "sm_90", ">=sm_100": "sm_100", "sm_10x": "sm_100"}


def _example_platform(flavour: Flavour) -> str:
    return _EXAMPLE_PLATFORM.get(flavour.platforms[0], flavour.platforms[0]) if flavour.platforms else "cpu"


def _kernel_platforms(flavour: Flavour) -> list[str]:
    """One example platform per selector of the flavour's kernel entries (sm_12x -> sm_121)."""
    seen: list[str] = []
    for mapping in flavour.values.values():
        for spec in mapping.values():
            for selector in (spec or {}).get("kernels") or {}:
                p = _EXAMPLE_PLATFORM.get(str(selector), str(selector).replace("x", "1"))
                if p not in seen:
                    seen.append(p)
    return seen


def list_configs(suite: Suite) -> str:
    cat, here = suite.catalog, suite.platform.name
    model = suite.model_or_error
    # what the model itself sets on every server (a shape alias: dummy load, the valid-weights hook), before the configs
    model_sets = " ".join([f"{k}={v}" for k, v in model.env.items()] + [f"{k} {v}" for k, v in model.args.items()]
                          ) if isinstance(model, Model) else ""
    lines = [
        f"platform: {here} ({suite.platform.device}); flavour used here: {suite.flavour.name}; model: "
        f"{getattr(model, 'alias', model)}" + (f" (sets {model_sets})" if model_sets else ""),
        "flavours: " + "; ".join(f"{f.name} = {f.about}" for f in cat.flavours.values()),
        "",
    ]
    defaults = {sel: name for sel, name in cat.defaults.items()}
    for config in cat.named:
        name = cat.name(config)
        marks = [sel for sel, n in defaults.items() if n == name]
        lines.append(f"{name}" + (f"  (default on {', '.join(marks)})" if marks else "") + f" - {config.about}")
        axes = [f"{a}={v}" for a, v in config.axes if cat.axes[a].default != v]
        lines.append(f"    axes: {' '.join(axes)}")
        for flavour in cat.flavours.values():
            ok_here, why = flavour.runnable(config, here, getattr(suite.model_or_error, "path", None))
            example = here if ok_here else _example_platform(flavour)
            ok_there, why_there = flavour.runnable(config, example)
            if ok_there:
                spec = flavour.resolve(config, example)
                env = " ".join(f"{k}={v}" for k, v in spec.env.items())
                sets = (env + " " + " ".join(spec.args)).strip().replace(str(CONFIG_DIR.parent), "<repo>")
                kernels = ", ".join(spec.kernels.must) or "- (none declared: record them first)"
                verified = "; ".join(f"{tag} {status}" for tag, status in spec.kernels.verification.items()) or "-"
            else:
                sets, kernels, verified = f"(not mapped: {why_there})", "-", "-"
            # not runnable here: what follows is the flavour's data for another platform, and the line says which
            # (a GB10 user read "[upstream on sm_90] not here: ... rejected on sm_121" as sm_90 refusing it)
            lines.append(f"    [{flavour.name} on {here}] RUNS HERE" if ok_here else
                         f"    [{flavour.name}] not on {here}: {why}; as declared for {example}:")
            lines.append(f"        sets: {sets}")
            lines.append(f"        must show: {kernels}")
            lines.append(f"        kernel data: {verified}")
            for other in _kernel_platforms(flavour):  # the other platforms the flavour declares kernels for
                if other != example and flavour.runnable(config, other)[0]:
                    status = "; ".join(f"{tag} {v}" for tag, v in flavour.resolve(config, other).kernels.verification.items()) or "-"
                    lines.append(f"        kernel data on {other}: {status}")
    return "\n".join(lines)


def _own_boots(suite) -> dict[str, dict]:
    """Each config's boot record for the column: its own server's (untagged, `Suite.boot`), else its first. The
    tagged servers of checks (mutations, level 6, ...) may have booted beside another boot (harness/session/ahead.py)."""
    out: dict[str, dict] = {}
    for b in suite.boots:
        if not b.get("tag") or b["config"] not in out:
            out[b["config"]] = b
    return out


def run_summary(suite: Suite, stats: dict) -> str:
    """Outcome counts per configuration and level, with boot times and the platform they came from."""
    table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    for outcome, idx in (("passed", 0), ("failed", 1), ("error", 1), ("skipped", 2)):
        for report in stats.get(outcome, []):
            if getattr(report, "when", "call") not in ("call", "setup") or not hasattr(report, "keywords"):
                continue
            if outcome == "passed" and report.when != "call":
                continue
            level = next((lv for lv in LEVELS if lv in report.keywords), None)
            if level is None:
                continue
            param_id = getattr(report, "param_id", None)  # set by the root conftest from the test's parameters
            config = _config_of(param_id, suite) if param_id else "(no server)"
            table[config][level][idx] += 1
    if not table:
        return ""
    boots = _own_boots(suite)
    used = [lv for lv in LEVELS if any(lv in row for row in table.values())]
    head = f"platform {suite.platform.name} ({suite.platform.device}), flavour {suite.flavour.name}, model {getattr(suite.model_or_error, 'alias', '?')}"
    rows = [head, "config".ljust(34) + "boot s".rjust(8) + "".join(lv.rjust(12) for lv in used)]
    for config, levels in sorted(table.items()):
        boot = boots.get(config, {}).get("boot_seconds")
        cells = []
        for lv in used:
            p, f, s = levels.get(lv, [0, 0, 0])
            cells.append((f"{p}ok" + (f" {f}F" if f else "") + (f" {s}s" if s else "")).rjust(12) if (p or f or s) else "-".rjust(12))
        rows.append(config.ljust(34) + (f"{boot:.0f}" if boot else "-").rjust(8) + "".join(cells))
    # an empty run dir the suite named itself is removed when the run ends: no path to a folder that will be gone
    wrote = suite.run_dir.is_dir() and any(suite.run_dir.iterdir())
    artifacts = str(suite.run_dir) if wrote or not suite.run_dir_default else "none written"
    rows.append("cells: ok = passed, F = failed or errored, s = skipped; artifacts: " + artifacts)
    return "\n".join(rows)


def _config_of(param_id: str, suite: Suite) -> str:
    """The config a test id belongs to: its longest hyphen-prefix that is a valid config name
    (`cpu-bf16-eager` for a level 6 combination, `cpu-bf16` for `cpu-bf16-router-biased-...`)."""
    pieces = param_id.split("-")
    for end in range(len(pieces), 1, -1):
        try:
            return suite.catalog.name(suite.catalog.parse("-".join(pieces[:end])))
        except SuiteError:
            continue
    return "(no server)"
