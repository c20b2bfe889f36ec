#!/usr/bin/env python3
"""What the bench's old `logprobs=1` streams cost the engine: batch-1 tg32 on vLLM's engine clock, one boot,
alternating rounds with logprobs=1 and without (tokens counted from the running usage, as level 4 streams now).

    python3 scripts/stream_logprobs_cost.py [--config cpu-bf16] [--model ALIAS] [--rounds 12]

Prints each side's median, CV and samples, and the ratio without / with. On a 2-core CPU (tiny model, 2026-12-02)
this script gave 40.5 against 46.0 tok/s (1.136x), 12 of 12 pairs faster without
(docs/evidence/cpu-2026-12-02-stream-logprobs/).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.core import stats  # noqa: E402
from harness.core.errors import SuiteError  # noqa: E402
from harness.core.paths import writable_dir  # noqa: E402
from harness.engine.server_metrics import EngineRound, scrape  # noqa: E402
from harness.perf import bench  # noqa: E402
from harness.plugin.options import positive_number  # noqa: E402
from harness.session.suite import Suite  # noqa: E402

TOKENS = 32


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="default: this platform's default config")
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=positive_number(int), default=12)
    ap.add_argument("--out", default=str(REPO / "runs" / "stream-logprobs-cost"))
    a = ap.parse_args(argv)
    try:
        out = writable_dir(Path(a.out), "--out")  # under its own name: Suite.create's check says --run-dir
        suite = Suite.create(a.config, a.model, None, None, str(out), 900)
        target = suite.targets()[0]
        if not target.runnable:
            raise SuiteError(f"{target.name} cannot run here: {target.reason}")
        samples: dict[bool, list[float]] = {True: [], False: []}
        with suite.boot(target, tag="__logprobs_cost") as running:
            client = running.client(timeout_s=600)
            maker = bench.PromptMaker(client, seed=7)

            def one(logprobs: bool) -> float:
                client.complete(maker.make(16), 2, ignore_eos=True)  # warm, as the bench's rounds are
                before = scrape(client)
                if logprobs:
                    r = client.stream(maker.make(16), TOKENS, ignore_eos=True)
                else:
                    r = client.stream(maker.make(16), TOKENS, ignore_eos=True, per_chunk_usage=True)
                after = scrape(client)
                if before is None or after is None:
                    raise SuiteError("the server has no engine timings on /metrics; run this on vLLM")
                e = EngineRound.between(before, after)
                if e.requests != 1 or r.usage.get("completion_tokens") != TOKENS:
                    raise SuiteError(f"a round finished {e.requests} requests, {r.usage} tokens: is another client on it?")
                return (TOKENS - 1) / e.decode_s

            for _ in range(3):
                one(True), one(False)
            for i in range(a.rounds):
                for logprobs in (True, False) if i % 2 == 0 else (False, True):
                    samples[logprobs].append(one(logprobs))
    except SuiteError as e:
        print(f"stream_logprobs_cost: {e}", file=sys.stderr)
        return 2
    for logprobs, name in ((True, "logprobs=1"), (False, "no logprobs")):
        v = samples[logprobs]
        print(f"{name:12s} median {statistics.median(v):.1f} tok/s, CV {100 * stats.cv(v):.2f}%, "
              f"samples {[round(x, 1) for x in v]}")
    apart = sum(n > w for n, w in zip(samples[False], samples[True]))
    print(f"without / with logprobs: {statistics.median(samples[False]) / statistics.median(samples[True]):.3f}x "
          f"({apart} of {a.rounds} pairs faster without)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
