"""The nightly job's logic (scripts/nightly.sh calls this; the workflow calls nightly.sh).

    python -m harness.plugin.nightly plan     --set S                      JSON list of the set's group names
    python -m harness.plugin.nightly preflight --set S --group G           strict checks before anything boots
    python -m harness.plugin.nightly pytest-args --set S --group G --dir D one pytest argument per line
    python -m harness.plugin.nightly summary  --dir D [--title T]          markdown of one group's run (job summary)
    python -m harness.plugin.nightly merge    --set S --dir D              every group's run -> D/merged, report, exit code

Config sets are data (configs/nightly.yaml). The strict gate: a set runs only on its platform and with its
flavour, every config of a group must run there (a config the platform cannot run is a data error at
night, not a skip), and its kernel expectations must have been verified on a real trace of this platform
(docs/GB10.md, scripts/record_kernels.py). Level 5's own strictness (inconclusive = failure on sm_121)
comes from baselines/thresholds.yaml.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from harness.config.catalog import UNDECLARED, Catalog
from harness.core.errors import SuiteError
from harness.core.junit import read_cases
from harness.core.paths import REPO, writable_dir
from harness.core.platform import detect_platform, platform_matches
from harness.core.yamlfile import load_mapping
from harness.matrix.combinations import load_matrix, make_plan
from harness.report.run_report import write_run_report

SETS_FILE = REPO / "configs" / "nightly.yaml"
ALLOW_UNVERIFIED = "SUITE_NIGHTLY_ALLOW_UNVERIFIED"  # =1: warn instead of failing on unverified kernel data


@dataclass
class Group:
    name: str
    configs: list[str]
    levels: str


@dataclass
class ConfigSet:
    name: str
    platform: str
    flavour: str
    model: str | None
    levels: str
    groups: list[Group] = field(default_factory=list)

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise SuiteError(f"set {self.name} has no group '{name}'; its groups: {', '.join(g.name for g in self.groups)}")


def load_set(name: str, path: Path = SETS_FILE) -> ConfigSet:
    sets = load_mapping(path, empty_ok=True).get("sets")
    if not isinstance(sets, dict) or name not in sets:
        known = ", ".join(sets) if isinstance(sets, dict) else "none"
        raise SuiteError(f"{path}: no config set '{name}'; sets: {known}")
    spec = sets[name]
    where = f"{path}: sets.{name}"
    if not isinstance(spec, dict):
        raise SuiteError(f"{where}: expected a mapping with platform, flavour, levels and groups, got {spec!r}")
    for key in ("platform", "flavour", "levels", "groups"):
        if not spec.get(key):
            raise SuiteError(f"{where}: needs `{key}`")
    if not isinstance(spec["groups"], list):
        raise SuiteError(f"{where}.groups: expected a list of groups (- name: ...), got {spec['groups']!r}")
    cs = ConfigSet(name, str(spec["platform"]), str(spec["flavour"]), spec.get("model"), str(spec["levels"]))
    names = set()
    for i, g in enumerate(spec["groups"]):
        if not isinstance(g, dict) or not g.get("name"):
            raise SuiteError(f"{where}.groups[{i}]: needs `name` (and `configs` and/or `levels`)")
        gname = str(g["name"])
        if gname in names or not gname.replace("-", "").replace("_", "").isalnum():
            raise SuiteError(f"{where}.groups[{i}]: group names must be unique and plain ([A-Za-z0-9_-]): '{gname}'")
        names.add(gname)
        configs = g.get("configs") or []
        if not isinstance(configs, list):  # a string would be read letter by letter ("unknown config 'm'")
            raise SuiteError(f"{where}.groups[{i}].configs: expected a list of config names, write [{configs}]")
        cs.groups.append(Group(gname, [str(c) for c in configs], str(g.get("levels") or cs.levels)))

    cat = Catalog()
    for g in cs.groups:
        for c in g.configs:
            cat.parse(c, f"{where}.groups.{g.name}")
    return cs


def plan(cs: ConfigSet) -> list[str]:
    return [g.name for g in cs.groups]


def pytest_args(cs: ConfigSet, group: Group, run_dir: Path, workers: int = 0) -> list[str]:
    args = ["-p", "no:cacheprovider", "-m", group.levels, f"--run-dir={run_dir}", f"--junitxml={run_dir / 'junit.xml'}",
            f"--flavour={cs.flavour}", "-rfE"]
    if group.configs:
        args.append(f"--config={','.join(group.configs)}")
    if cs.model:
        args.append(f"--model={cs.model}")
    if workers > 1 and len(group.configs) > 1:
        args += ["-n", str(min(workers, len(group.configs)))]
    return args


def preflight(cs: ConfigSet, group: Group) -> list[str]:
    """Why this machine may not gate the group tonight (empty: it may). Warnings go to stderr."""
    problems = []
    here = detect_platform()
    if not platform_matches(cs.platform, here.name):
        problems.append(f"set {cs.name} is for {cs.platform}; this machine is {here.name} ({here.device})")
    cat = Catalog()
    auto = cat.default_flavour(here.name).name
    if auto != cs.flavour:
        problems.append(f"set {cs.name} expects the '{cs.flavour}' flavour of vLLM; the vLLM installed here is '{auto}' "
                        f"(pick the set for it in {SETS_FILE.relative_to(REPO)})")
    flavour = cat.flavour(cs.flavour)
    unverified = []
    configs = group.configs
    if not configs and "level6" in group.levels:
        # level 6 boots its plan's combinations: their kernels are what the group gates (an empty list checked nothing)
        try:
            spec = load_matrix().for_platform(here.name)
            configs = make_plan(cat, flavour, here.name, spec, cs.model).names() if spec else []
        except SuiteError as e:
            problems.append(f"level 6 has no plan here: {e}")
    for name in configs:
        cfg = cat.parse(name)
        ok, why = flavour.runnable(cfg, here.name, cs.model)  # the model only matters to configs that require one
        if not ok:
            problems.append(f"{name} cannot run here: {why}")
            continue
        spec = flavour.resolve(cfg, here.name)
        for tag, status in spec.kernels.verification.items():
            if status.startswith(UNDECLARED):
                # no recording can verify what declares no kernel: said every night, never blocking it
                print(f"nightly: WARNING {name}: {tag} {status}", file=sys.stderr)
            elif not status.startswith("verified"):
                unverified.append(f"{name}: {tag} {status}")
        if not spec.kernels.must:
            unverified.append(f"{name}: declares no kernel patterns for {here.name}")
    if unverified:
        head = (f"kernel expectations not verified on a real {here.name} trace (bring the platform up first: "
                "docs/GB10.md, python scripts/record_kernels.py --config=NAME --accept)")
        if os.environ.get(ALLOW_UNVERIFIED) == "1":
            print(f"nightly: WARNING {head}:\n  " + "\n  ".join(unverified), file=sys.stderr)
        else:
            problems.append(head + ":\n  " + "\n  ".join(unverified) + f"\n  ({ALLOW_UNVERIFIED}=1 runs anyway, without the gate)")
    return problems


# -- reports ----------------------------------------------------------------------------------------
@dataclass
class Counts:
    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped

    @property
    def ok(self) -> bool:
        """Something passed and nothing failed: a run whose every test skipped tested nothing."""
        return self.passed > 0 and not self.failures and not self.errors


def junit_counts(path: Path) -> Counts:
    c = Counts()
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return c
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    for s in suites:
        c.tests += int(s.get("tests", 0))
        c.failures += int(s.get("failures", 0))
        c.errors += int(s.get("errors", 0))
        c.skipped += int(s.get("skipped", 0))
    return c


def merge_junit(paths: list[Path], out: Path) -> Counts:
    root = ET.Element("testsuites")
    total = Counts()
    for p in paths:
        try:
            doc = ET.parse(p).getroot()
        except (OSError, ET.ParseError):
            continue
        for s in ([doc] if doc.tag == "testsuite" else list(doc.iter("testsuite"))):
            s.set("name", f"{p.parent.name}")
            root.append(s)
        c = junit_counts(p)
        total.tests += c.tests
        total.failures += c.failures
        total.errors += c.errors
        total.skipped += c.skipped
    for k in ("tests", "failures", "errors", "skipped"):
        root.set(k, str(getattr(total, k)))
    out.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    return total


def failed_tests(path: Path, limit: int = 30) -> list[str]:
    try:
        cases = read_cases(path)
    except (OSError, ET.ParseError):
        return []
    out = [f"`{c.classname}::{c.name}` {c.message.splitlines()[0][:160] if c.message else ''}"
           for c in cases if c.outcome == "failed"]
    return out[:limit]


def summary(run_dir: Path, title: str) -> str:
    c = junit_counts(run_dir / "junit.xml")
    verdict = "PASS" if c.ok else ("NO TESTS RAN" if c.tests == 0 else "FAIL")
    lines = [f"## {title}: {verdict}", "",
             f"{c.passed} passed, {c.failures} failed, {c.errors} errors, {c.skipped} skipped (run dir `{run_dir}`)", ""]
    bad = failed_tests(run_dir / "junit.xml")
    if bad:
        lines += ["### Failures", ""] + [f"- {b}" for b in bad] + [""]
    report = run_dir / "report.md"
    if report.is_file():
        lines += [report.read_text(encoding="utf-8", errors="replace"), ""]
    return "\n".join(lines)


def _group_dirs(root: Path) -> dict[str, Path]:
    """Group name -> its run dir under `root` (the workflow downloads artifact `nightly-<group>`)."""
    out = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "merged"):
        name = d.name[len("nightly-"):] if d.name.startswith("nightly-") else d.name
        if (d / "junit.xml").is_file() or any(d.iterdir()):
            out[name] = d
    return out


def merge(cs: ConfigSet, root: Path) -> tuple[bool, str]:
    """Every group's run dir under `root` -> root/merged (results, verdicts, kernels, boots, junit, report)."""
    merged = root / "merged"
    if merged.exists():
        shutil.rmtree(merged)
    merged.mkdir(parents=True)
    dirs = _group_dirs(root)
    missing = [g for g in plan(cs) if g not in dirs]
    # each group judged on its own: totals hide a group killed before its junit.xml, one that collected nothing
    # (pytest's exit code 5) or one whose every test skipped
    unrun = {name: why for name, d in dirs.items() if (why := _group_problem(d / "junit.xml"))}
    boots: list[dict] = []
    for name, d in dirs.items():
        for sub in ("results", "verdicts", "kernels"):
            if (d / sub).is_dir():
                shutil.copytree(d / sub, merged / sub, dirs_exist_ok=True)
        if (d / "boots.json").is_file():
            try:
                boots += [{**b, "group": name} for b in json.loads((d / "boots.json").read_text())]
            except json.JSONDecodeError:
                pass
    if boots:
        (merged / "boots.json").write_text(json.dumps(boots, indent=2))
    total = merge_junit([d / "junit.xml" for d in dirs.values() if (d / "junit.xml").is_file()], merged / "junit.xml")
    report_note = ""
    if (merged / "results").is_dir():
        try:
            write_run_report(merged)
        except SuiteError as e:
            report_note = f"(merged report not written: {e})"
    lines = [f"# Nightly {cs.name} ({cs.platform}, flavour {cs.flavour}): "
             + ("PASS" if total.ok and not missing and not unrun else "FAIL"), "",
             f"{total.passed} passed, {total.failures} failed, {total.errors} errors, {total.skipped} skipped "
             f"over {len(dirs)} group(s)", "", "| group | configs | levels | passed | failed | errors | skipped |",
             "|---|---|---|---:|---:|---:|---:|"]
    for g in cs.groups:
        if g.name in dirs:
            c = junit_counts(dirs[g.name] / "junit.xml")
            lines.append(f"| {g.name} | {', '.join(g.configs) or '-'} | {g.levels} | {c.passed} | {c.failures} | {c.errors} | {c.skipped} |")
        else:
            lines.append(f"| {g.name} | {', '.join(g.configs) or '-'} | {g.levels} | - | - | - | - (no results: not run, "
                         "e.g. its preflight failed, or the job died before uploading; see its log) |")
    lines.append("")
    if unrun:
        lines += ["## Groups that tested nothing", ""] + [f"- {name}: {why}" for name, why in unrun.items()] + [""]
    bad = failed_tests(merged / "junit.xml")
    if bad:
        lines += ["## Failures", ""] + [f"- {b}" for b in bad] + [""]
    if (merged / "report.md").is_file():
        lines += [(merged / "report.md").read_text(encoding="utf-8", errors="replace")]
    if report_note:
        lines.append(report_note)
    text = "\n".join(lines) + "\n"
    (merged / "nightly.md").write_text(text)
    return total.ok and not missing and not unrun, text


def _group_problem(junit: Path) -> str | None:
    """Why a group's run shows no test that ran, or None where something passed."""
    if not junit.is_file():
        return "no junit.xml (the job stopped before pytest finished; see its log)"
    c = junit_counts(junit)
    if c.tests == 0:
        return "its junit.xml holds no test (unreadable, or pytest collected nothing)"
    if c.passed == 0 and not c.failures and not c.errors:
        return f"all {c.skipped} tests skipped (see the skip reasons in its log)"
    return None


# -- CLI --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.plugin.nightly")
    ap.add_argument("command", choices=["plan", "preflight", "pytest-args", "summary", "merge"])
    ap.add_argument("--set", dest="set_name", default=os.environ.get("SUITE_SET", "gb10"))
    ap.add_argument("--group", default=os.environ.get("SUITE_GROUP"))
    ap.add_argument("--dir", default=None)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--title", default=None)
    a = ap.parse_args(argv)
    try:
        if a.command in ("summary", "merge", "pytest-args"):  # Path(None) was a TypeError traceback
            if not a.dir:
                raise SuiteError(f"{a.command} needs --dir (the run folder; scripts/nightly.sh passes one under "
                                 "$SUITE_NIGHTLY_DIR)")
            if a.command != "summary":  # both write there: a folder it cannot write is one line, not an OSError
                writable_dir(Path(a.dir), "--dir (SUITE_NIGHTLY_DIR)")
        if a.command == "summary":
            print(summary(Path(a.dir), a.title or Path(a.dir).name))
            return 0
        cs = load_set(a.set_name)
        if a.command == "plan":
            print(json.dumps(plan(cs)))
            return 0
        if a.command == "merge":
            ok, text = merge(cs, Path(a.dir))
            print(text)
            return 0 if ok else 1
        if not a.group:
            raise SuiteError(f"--group (or SUITE_GROUP) is required; groups of {cs.name}: {', '.join(plan(cs))}")
        group = cs.group(a.group)
        if a.command == "preflight":
            problems = preflight(cs, group)
            for p in problems:
                print(f"nightly: {p}", file=sys.stderr)
            return 1 if problems else 0
        print("\n".join(pytest_args(cs, group, Path(a.dir), a.workers)))
        return 0
    except SuiteError as e:
        print(f"nightly: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
