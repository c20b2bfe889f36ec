#!/usr/bin/env python3
"""Record the kernels a configuration really runs on this machine (platform bring-up).

    python scripts/record_kernels.py --config NAME [--model M] [--flavour F] [--sibling NAME] [--accept]

Boots the config's server the way the suite does, profiles it exactly like level 1.5 (the same prefill +
decode workload, harness.kernelpath.check), stops it, and (with --sibling) does the same for a sibling config.
Writes runs/record-<config>-<time>/recording.md (and the kernel summaries) and prints it: the observed
kernel families with their share of time, the declared expectation against the trace, the diff (declared
patterns that matched nothing; observed families no pattern covers; with --sibling the families that
differ and the axes they belong to) and a proposed expectation.

--accept (after a person reviewed that report): records `verified: <device, vLLM version, date>`, the
patterns verified and the real kernel names they matched (`seen`) for the config's axis values on this
platform in configs/verified/<flavour>.yaml (--verified-dir to write elsewhere), which the catalog
merges over configs/flavours/<flavour>.yaml; `pytest --list-configs` then shows them as verified.
Refused while the declared expectation fails the trace: fix the patterns in the flavour first.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.core.errors import SuiteError  # noqa: E402
from harness.core.paths import writable_dir  # noqa: E402
from harness.plugin.options import positive_number  # noqa: E402


def _profile(suite, config, tag: str) -> dict:
    """Boot, profile like level 1.5, stop: the kernel summary, vLLM version and server log."""
    from harness.kernelpath.check import profile_kernel_path

    target = suite.target(config)
    if not target.runnable:
        raise SuiteError(f"{target.name} cannot run here: {target.reason}")
    print(f"record_kernels: booting {target.name} ...", file=sys.stderr, flush=True)
    with suite.boot(target, tag=tag) as running:
        version = running.client().version()
        kp = profile_kernel_path(suite, running)
        log = running.log_text()
    print(f"record_kernels: {target.name} booted in {running.boot_seconds:.0f} s, {len(kp.summary.kernels)} kernels profiled",
          file=sys.stderr, flush=True)
    return {"target": target, "summary": kp.summary, "vllm": version, "log": log}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="the config to record (one name)")
    ap.add_argument("--sibling", default=None, help="a config differing in the axis under test (e.g. another MoE backend)")
    ap.add_argument("--model", default=None, help="model alias, checkpoint dir or hub id (default: this platform's default)")
    ap.add_argument("--flavour", default=None, help="cpu, upstream or fork (default: from the platform and installed vLLM)")
    ap.add_argument("--accept", action="store_true", help="record the verification (after reviewing the report)")
    ap.add_argument("--verified-dir", default=None, help="where the verified data goes (default: configs/verified)")
    ap.add_argument("--run-dir", default=None, help="artifacts (default: runs/record-<config>-<time>)")
    ap.add_argument("--boot-timeout", type=positive_number(float, "SUITE_BOOT_TIMEOUT"),
                    default=os.environ.get("SUITE_BOOT_TIMEOUT", "900"))
    ap.add_argument("--from-summaries", default=None, metavar="DIR",
                    help="re-use an earlier recording's kernel summaries (no boot): the run dir of that recording")
    args = ap.parse_args(argv)
    try:
        if args.verified_dir:  # checked before any boot: --accept wrote there only after the recording
            os.environ["SUITE_VERIFIED_DIR"] = str(writable_dir(Path(args.verified_dir), "--verified-dir"))
        return _run(args)
    except SuiteError as e:
        print(f"record_kernels: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from harness.kernelpath import recorder
    from harness.session.suite import Suite
    from harness.kernelpath.traces import KernelSummary

    run_dir = args.run_dir or str(REPO / "runs" / f"record-{args.config}-{time.strftime('%Y%m%d-%H%M%S')}")
    # --config alone: Suite.create would name a bad sibling "--config" too; it is checked under its own option below
    suite = Suite.create(args.config, args.model, args.flavour, None, run_dir, args.boot_timeout)
    cat, flavour, platform = suite.catalog, suite.flavour, suite.platform
    config = cat.parse(args.config)
    sibling = cat.parse(args.sibling, "--sibling") if args.sibling else None
    saved = Path(args.from_summaries) if args.from_summaries else None

    def recorded(cfg) -> dict:
        if saved is None:
            return _profile(suite, cfg, "__record")
        target = suite.target(cfg)
        path = saved / f"{target.name}.json"
        try:
            data = json.loads(path.read_text())
            return {"target": target, "summary": KernelSummary.from_json(data["summary"]), "vllm": data["vllm"],
                    "log": data.get("log", ""), "platform": data.get("platform"), "device": data.get("device"),
                    "path": path}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # ValueError: not JSON
            why = e.strerror if isinstance(e, OSError) else f"{type(e).__name__}: {e}".splitlines()[0][:200]
            raise SuiteError(f"--from-summaries: cannot read a kernel summary from {path} ({why}); pass the run dir of "
                             f"a recording of {target.name}, or record it again without --from-summaries") from None

    mine = recorded(config)
    target = mine["target"]
    if target.spec is None:
        raise SuiteError(f"{target.name} cannot run here: {target.reason}")
    device = platform.device
    if saved is not None:
        # a replay stamps the machine that recorded the trace, never the one replaying it (an H200's trace once
        # read as a GB10 verification), and is judged by that platform's patterns only where it was recorded
        if mine["platform"] is None and args.accept:
            raise SuiteError(f"--from-summaries --accept: {mine['path']} does not say which machine recorded it (written "
                             "before summaries recorded their platform); record it again on that machine")
        if mine["platform"] not in (None, platform.name):
            raise SuiteError(f"--from-summaries: {mine['path']} was recorded on {mine['platform']} ({mine['device']}); this "
                             f"machine is {platform.name}: replay it on a {mine['platform']} machine")
        device = mine["device"] or device
    rec = recorder.compare(cat, flavour, config, platform.name, device, mine["vllm"], mine["summary"],
                           target.spec.kernels, mine["log"])
    keep = {target.name: mine}
    if sibling is not None:
        theirs = recorded(sibling)
        keep[theirs["target"].name] = theirs
        recorder.diff_sibling(rec, config, theirs["target"].name, sibling, theirs["summary"], theirs["target"].spec.kernels)
    out = Path(suite.run_dir)
    for name, res in keep.items():  # the summaries, so a recording can be re-read without a GPU (--from-summaries)
        (out / f"{name}.json").write_text(json.dumps({"vllm": res["vllm"], "log": res["log"][-20000:],
                                                      "platform": res.get("platform") or platform.name,
                                                      "device": res.get("device") or platform.device,
                                                      "flavour": flavour.name, "summary": res["summary"].to_json()}))
    rec.artifact = str(out / f"{target.name}.json")
    verified_file = flavour.verified_file
    text = recorder.report(rec, verified_file)
    (out / "recording.md").write_text(text)
    print(text)
    print(f"record_kernels: report {out / 'recording.md'}", file=sys.stderr)
    if args.accept:
        recorder.accept(rec, verified_file)
        print(f"record_kernels: accepted: {', '.join(e.tag for e in rec.entries)} on {platform.name} recorded in {verified_file}",
              file=sys.stderr)
        print("record_kernels: check with `pytest --list-configs` and commit that file", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
