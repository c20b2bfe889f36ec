#!/usr/bin/env python3
"""Summarise scripts/gpu_gates.sh phases (or any suite run dirs) into one markdown file.

    python scripts/gates_summary.py RUNS_ROOT OUT.md

RUNS_ROOT holds one run dir per phase (baseline, aa1..aa5, hooked, benchy): per A/A boot every verdict
(status, change, CI) and the per-round clocks' range; the sensitivity curve's measured ratios and verdicts;
the memory-hold verdict; the llama-benchy comparison; and an overall "done when" check.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.perf import host_cpu  # noqa: E402
from harness.core.errors import SuiteError  # noqa: E402
from harness.core.paths import writable_dir  # noqa: E402
from harness.perf.results import UNJUDGED, read_results, results_files  # noqa: E402


def _verdicts(run: Path) -> list[dict]:
    out = []
    for p in sorted((run / "verdicts").glob("*.json")):
        try:
            vs = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:  # a phase killed while writing it
            raise SuiteError(f"cannot read verdicts {p} ({type(e).__name__}); rerun that phase or remove the file") from None
        # every verdict is read by its status below: a list of objects with one, as level 5 writes them
        if not isinstance(vs, list) or not all(isinstance(v, dict) and isinstance(v.get("status"), str) for v in vs):
            raise SuiteError(f"verdicts {p}: expected a list of verdicts, each with a `status`; rerun that phase "
                             "or remove the file")
        out += vs
    return out


def _results(run: Path) -> list[dict]:
    return [read_results(p) for p in results_files(run)]


def _clock_range(results: list[dict]) -> str:
    sm, pw, flagged = [], [], 0
    for r in results:
        for e in r.get("metrics", {}).values():
            for rc in e.get("rounds") or []:
                if rc.get("sm_min_mhz") is not None:
                    sm.append(rc["sm_min_mhz"])
                if rc.get("power_w") is not None:
                    pw.append(rc["power_w"])
            flagged += len(e.get("flagged") or [])
    if not sm:
        return "no clocks"
    return (f"SM min {min(sm):.0f}-{max(sm):.0f} MHz, power {min(pw):.0f}-{max(pw):.0f} W, "
            f"{flagged} round(s) set aside below the loaded clock")


def _host_cpu(r: dict) -> str:
    """The host CPU's speed as level 4 timed it: a host-side decode failure is read beside it."""
    cpu = host_cpu.summary(r.get("host_cpu"))
    return f"host CPU loop {cpu}" if cpu else "host CPU not timed"


def _failures(verdicts: list[dict]) -> list[dict]:
    return [v for v in verdicts if v["status"] == "fail" and not v.get("advisory")]


def _left_out(v: dict) -> bool:
    """A baseline metric this boot's workloads did not measure (level 5's reason "not_measured")."""
    return v.get("reason") == "not_measured"


def host_side_only(verdicts: list[dict]) -> bool:
    """An A/A boot whose only failures are engine-clock decode with its kernels held and a step that waited for the
    host (level 5's reason "host_side"): not a clean A/A, and what a busy host does, so the summary names it apart."""
    fails = _failures(verdicts)
    return bool(fails) and all(v.get("reason") == "host_side" for v in fails)


def aa_passed(verdicts: list[dict]) -> bool:
    """An A/A boot passes with no failure, at least one timing metric that passed (memory and KV capacity pass in any
    boot), and at most one inconclusive beyond the recorded spreads. A baseline metric this boot's workloads left out
    (a decode-only set made to fit one call) is neither: the summary counts it apart."""
    unexplained = [v for v in verdicts if v["status"] == "inconclusive" and not v.get("within_boot_spread")
                   and not _left_out(v)]
    timing_passed = any(v["status"] == "pass" and v.get("kind", "timing") == "timing" for v in verdicts)
    return not _failures(verdicts) and timing_passed and len(unexplained) <= 1


def main(root: Path, out: Path) -> int:
    lines = ["# GPU gate evidence (scripts/gpu_gates.sh)", ""]
    aa_ok, aa_n, aa_inconclusive, aa_not_measured, aa_host, aa_unsteady = 0, 0, 0, 0, 0, 0
    curve_ok, held_ok, benchy = None, None, None
    if (root / "selftest.log").is_file():
        lines += ["## selftest (suite_testhooks spin kernel)", "", "```",
                  *(root / "selftest.log").read_text().splitlines()[-8:], "```", ""]
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        vs = _verdicts(run)
        res = _results(run)
        sens = sorted((run / "sensitivity").glob("*.json"))
        if not vs and not sens and not (run / "crosscheck.md").is_file() and not (run / "memory_gate").is_dir() \
                and not list(run.glob("*.status")):
            continue
        lines += [f"## {run.name}", ""]
        if res:
            r = res[0]
            lines.append(f"{r.get('config')} on {r.get('platform')} ({r.get('device')}); used memory "
                         f"{r.get('memory_used_gib')} GiB ({(r.get('memory') or {}).get('used_source')}); KV capacity "
                         f"{r.get('kv_capacity_tokens')} tokens; clocks: {_clock_range(res)}; {_host_cpu(r)}")
            cc = (r.get("memory") or {}).get("cross_check") or {}
            lines += [f"memory cross-check: {cc.get('message')}", ""]
        if vs:
            fails = _failures(vs)
            inc = [v for v in vs if v["status"] == "inconclusive"]
            if run.name.startswith("aa"):
                aa_n += 1
                # an inconclusive within the metric's recorded boot spread (or host-bound decode) is what the gate
                # expects of an unchanged boot; only the others count against the A/A
                aa_ok += aa_passed(vs)
                aa_host += host_side_only(vs)
                varied = host_cpu.loop_cv(res[0].get("host_cpu")) if res else None
                aa_unsteady += varied is not None and varied > host_cpu.UNSTEADY
                left_out = sum(map(_left_out, vs))
                aa_not_measured += left_out
                aa_inconclusive += len(inc) - left_out
            lines += ["| metric | status | change | 95% CI of ratio | CV base / current |", "|---|---|---|---|---|"]
            for v in vs:
                ch = (f"{v['delta_abs']:+.2f} GiB" if v.get("kind") == "memory" else f"{v['delta'] * 100:+.2f}%"
                      if isinstance(v.get("delta"), float) else "n/a")
                ci = f"[{v['ci'][0]:.4f}, {v['ci'][1]:.4f}]" if v.get("ci") else "-"
                cv = (f"{v['cv_baseline'] * 100:.2f}% / {v['cv_current'] * 100:.2f}%"
                      if v.get("cv_baseline") is not None and v.get("cv_current") is not None else "-")
                lines.append(f"| {v['name']} | {v['status']}{' (advisory)' if v.get('advisory') else ''} | {ch} | {ci} | {cv} |")
            for v in fails + inc:
                lines.append(f"- {v['message']}")
            lines.append("")
        for p in sens:
            s = json.loads(p.read_text())
            lines += [f"Sensitivity curve: {s.get('decode_step_from', 'decode')} step {s['decode_step_ms']} ms, "
                      f"{s.get('prefill_metric', 'pp' + str(s['prefill_tokens']))} {s['prefill_ms']} ms, "
                      f"{s['rounds_per_side']} ABBA rounds per side "
                      f"({s.get('prefill_rounds_per_side', s['rounds_per_side'])} for prefill).", "",
                      "| slowdown | metric | expected ratio | measured ratio | verdict |", "|---|---|---|---|---|"]
            small, large = s["points"][0], s["points"][-1]
            # the test's own judgement where the curve recorded it (harness.perf.sensitivity.curve_problems), the
            # statuses alone for curves recorded before
            curve_ok = (not s["problems"] if "problems" in s else
                        all(v == "fail" for v in large["status"].values())
                        and all(v == "pass" for v in small["status"].values()))
            for pt in s["points"]:
                for n, ratio in pt["measured_ratio"].items():
                    extra = pt.get("extra_rounds", {}).get(n)
                    more = f" ({pt['rounds_per_side'][n]} rounds per side, {extra} added for its CV)" if extra else ""
                    lines.append(f"| {pt['fraction']:.0%} | {n} | {pt['expected_ratio']:.4f} | {ratio:.4f} | "
                                 f"{pt['status'].get(n, UNJUDGED)}{more} |")
            lines += [""] + [f"- problem: {x}" for x in s.get("problems", [])] + [f"- note: {x}" for x in s.get("notes", [])]
            lines.append("")
        for p in sorted((run / "memory_gate").glob("*.json")):
            m = json.loads(p.read_text())
            lines.append(f"Memory gate, {m['check']}" + (f" (held {m['hold']['gib']} GiB on {m['hold']['device']})"
                                                          if m.get("hold") else "") + ":")
            lines += [f"- {v['status']}: {v['message']}" for v in m["verdicts"]] + [""]
            if m["check"] == "held":
                held_ok = any(v["name"] == "memory_used_gib" and v["status"] == "fail" for v in m["verdicts"])
        if (run / "crosscheck.md").is_file():
            lines += (run / "crosscheck.md").read_text().splitlines()[2:] + [""]
        if (run / "crosscheck.status").is_file():
            benchy = (run / "crosscheck.status").read_text().strip()
            log = run.parent / "benchy.log"
            if log.is_file():
                lines += [f"llama-benchy: {benchy}; last line: {log.read_text().strip().splitlines()[-1][:300]}", ""]
        for log in sorted(run.glob("*.status")):
            lines.append(f"- {log.stem}: {log.read_text().strip()}")
    mark = {True: "yes", False: "NO", None: "not run"}
    lines += ["## Done-when check", "",
              f"- A/A boots with no failure and at most one inconclusive beyond the recorded boot spreads: {aa_ok} of {aa_n} "
              f"({aa_inconclusive} inconclusive verdicts in all"
              + (f"; {aa_not_measured} baseline metrics not measured by the boots' workloads" if aa_not_measured else "")
              + (f"; {aa_host} failed on the host side only: engine-clock decode slower with its kernels held, the step "
                 f"waiting for vLLM's host; rerun on a quiet host" if aa_host else "")
              + (f"; in {aa_unsteady} of the {aa_n} boots the host's CPU changed speed or load (its loop's CV above "
                 f"{host_cpu.UNSTEADY:.0%}), which leaves engine- and client-clock metrics unjudgeable: rerun on a "
                 f"quieter host" if aa_unsteady else "")
              + ")",
              f"- sensitivity curve: the larger slowdown fails and the smaller passes on decode and prefill: {mark[curve_ok]}",
              f"- +1.5 GiB held fails the used-memory gate: {mark[held_ok]}",
              f"- llama-benchy cross-check: {benchy or 'not run'}"]
    try:
        out.write_text("\n".join(lines) + "\n")
    except OSError as e:
        raise SuiteError(f"OUT {out}: cannot write it ({e.strerror}); pass a writable file path") from None
    print("\n".join(lines[-5:]))
    return 0


USAGE = "usage: gates_summary.py RUNS_ROOT OUT.md"


def cli(argv: list[str]) -> int:
    """The command line: bad arguments are one line and exit 2, never a traceback."""
    if argv in (["-h"], ["--help"]):
        print(USAGE + "\n\n" + __doc__.split("\n\n")[0])
        return 0
    try:
        if len(argv) != 2:
            raise SuiteError(USAGE)
        root, out = Path(argv[0]), Path(argv[1])
        if not root.is_dir():
            raise SuiteError(f"RUNS_ROOT {root}: not a directory; pass the folder scripts/gpu_gates.sh wrote")
        writable_dir(out.parent, "OUT's folder")
        return main(root, out)
    except SuiteError as e:  # a results file a killed phase left truncated: one line naming it
        print(f"gates_summary: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(cli(sys.argv[1:]))
