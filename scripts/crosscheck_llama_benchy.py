#!/usr/bin/env python3
"""Independent cross-check of the suite's level 4 numbers with llama-benchy 0.4.0, on the same server.

    python scripts/crosscheck_llama_benchy.py --model gpt-oss-120b-shape --config triton-bf16 --out DIR
    python scripts/crosscheck_llama_benchy.py --server-url http://127.0.0.1:8000 --tokenizer models/tiny-gpt-oss

Boots the config's server the way the suite does (or uses --server-url), then measures ppN and tgM three
ways on it, back to back: llama-benchy (`python3 -m llama_benchy`, client clock, chat completions, `--exact-tg` so that
every answer is tg tokens long like the suite's ignore_eos requests), the
suite on the engine clock (what level 4 gates), and the suite on the client clock. Each llama-benchy
number must agree with the suite's engine-clock number within +-2%, or the difference must be explained:
when it agrees with the suite's *client*-clock number within 2%, the gap is the engine-vs-client clock
(HTTP, chat template, detokenisation and scheduling around the engine's own prefill / decode time).
Writes `crosscheck.json` and `crosscheck.md` under --out; exit 0 when every metric agrees or is explained, 1 when
one disagrees, 3 when llama-benchy could not measure one (no streamed text, e.g. dummy weights).

llama-benchy only speaks /v1/chat/completions. Until the served model has a working chat path (vLLM serves
gpt-oss chat through its harmony parser, which needs harmony's special tokens), this script stops after
one request with one line saying so (exit 2). Offline, llama-benchy reads its corpus from
`~/.cache/llama-benchy/<md5 of --book-url>.txt`; the script seeds that file from texts in this repository.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.perf import bench, metrics as perf

from harness.core import stats  # noqa: E402
from harness.engine.client import Client  # noqa: E402
from harness.core.errors import SuiteError  # noqa: E402
from harness.plugin.options import positive_number  # noqa: E402
from harness.core.paths import writable_dir  # noqa: E402

TOLERANCE = 0.02
CORPUS_FILES = ("README.md", "docs/DESIGN.md", "models/tiny-gpt-oss/MODEL_CARD.md", "models/tiny-gpt-oss/heldout.txt",
                "kernels/NOTES.md", "models/shapes/README.md")


def fail(msg: str, code: int = 2) -> None:
    print(f"crosscheck: {msg}", flush=True)
    raise SystemExit(code)


def seed_corpus() -> tuple[str, Path]:
    """A --book-url that is never fetched: its cache file holds repo texts (llama-benchy reads it offline)."""
    text = "\n\n".join((REPO / f).read_text(encoding="utf-8", errors="replace") for f in CORPUS_FILES if (REPO / f).is_file())
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    url = f"https://suite.invalid/corpus/{digest}.txt"
    cache = Path.home() / ".cache" / "llama-benchy" / f"{hashlib.md5(url.encode()).hexdigest()}.txt"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(text, encoding="utf-8")
    return url, cache


def chat_preflight(client: Client) -> None:
    body = {"model": client.model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}
    try:
        r = client.session.post(client.base_url + "/v1/chat/completions", json=body, timeout=120)
    except Exception as e:  # noqa: BLE001
        fail(f"cannot reach {client.base_url}/v1/chat/completions ({type(e).__name__}: {e})")
    if r.status_code != 200:
        detail = " ".join(r.text.split())[:160]
        fail(f"chat completions do not work on this server (HTTP {r.status_code}: {detail}); llama-benchy 0.4.0 "
             "benchmarks /v1/chat/completions only, so this cross-check waits for a model whose chat path works "
             "(harmony special tokens in the embedded tokenizer)")


def suite_numbers(client: Client, pp: int, tg: int, runs: int) -> dict[str, dict]:
    """ppN (prefill workload) and tgM at a pp-token prompt (as llama-benchy measures it), engine and client clock."""
    maker = bench.PromptMaker(client, seed=11)
    out: dict[str, dict] = {}
    for w, key in ((bench.Workload("prefill", pp, 2, runs=runs, warmup=2), f"pp{pp}"),
                   (bench.Workload("decode", pp, tg, runs=runs, warmup=2), f"tg{tg}")):
        m = bench.run_workload(client, maker, w)
        engine = bench.metrics_for(w, m)
        eng = next(iter(engine.values()))["samples"] if m.engine else None
        cli = [perf.pp_tps(r) for r in m.requests] if w.kind == "prefill" else [perf.tg_tps(r) for r in m.requests]
        out[key] = {"engine": eng, "client": cli}
    return out


def run_benchy(url: str, model: str, tokenizer: str, pp: int, tg: int, runs: int, book: str, out: Path) -> dict:
    result = out / "llama-benchy.json"
    argv = [sys.executable, "-m", "llama_benchy", "--base-url", url.rstrip("/") + "/v1", "--model", model,
            "--served-model-name", model, "--tokenizer", tokenizer, "--pp", str(pp), "--tg", str(tg),
            "--runs", str(runs), "--exact-tg", "--skip-coherence", "--book-url", book, "--format", "json",
            "--save-result", str(result)]
    log = out / "llama-benchy.log"
    with open(log, "w") as f:
        f.write("# " + " ".join(argv) + "\n")
        f.flush()
        r = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=1800)
    if r.returncode != 0 or not result.is_file():
        tail = " | ".join(log.read_text(errors="replace").splitlines()[-3:])
        fail(f"llama-benchy exited {r.returncode} (log {log}): {tail[:300]}", 1)
    return json.loads(result.read_text())


def compare(benchy: dict, ours: dict[str, dict], pp: int, tg: int) -> list[dict]:
    run = benchy["benchmarks"][0]
    rows = []
    for key, field in ((f"pp{pp}", "pp_throughput"), (f"tg{tg}", "tg_throughput")):
        if not run.get(field):
            # seen with dummy weights: random ids form no harmony message, so the chat stream carries no text
            # and llama-benchy has no token timestamps to time
            rows.append({"metric": key, "llama_benchy": None, "verdict": "unmeasured",
                         "why": f"llama-benchy reported no {field} (no text was streamed: a model whose output is not a "
                                "harmony message, such as dummy weights, answers chat with empty deltas)"})
            continue
        b = float(run[field]["mean"])
        eng = stats.median(ours[key]["engine"]) if ours[key]["engine"] else None
        cli = stats.median(ours[key]["client"])
        d_eng = b / eng - 1 if eng else None
        d_cli = b / cli - 1
        if d_eng is not None and abs(d_eng) <= TOLERANCE:
            verdict, why = "agree", f"within ±{TOLERANCE:.0%} of the suite's engine-clock number"
        elif abs(d_cli) <= TOLERANCE:
            gap = cli / eng - 1 if eng else float("nan")
            verdict = "explained"
            why = (f"engine vs client clock: llama-benchy agrees with the suite's client-clock number ({d_cli:+.2%}); "
                   f"the client clock itself is {gap:+.2%} from the engine's (HTTP, chat template, detokenisation "
                   f"and scheduling around the engine's {'prefill' if key.startswith('pp') else 'decode'} time)")
        else:
            verdict, why = "disagree", "neither the engine- nor the client-clock number is within ±2%"
        rows.append({"metric": key, "llama_benchy": round(b, 2), "suite_engine": round(eng, 2) if eng else None,
                     "suite_client": round(cli, 2), "diff_vs_engine": None if d_eng is None else round(d_eng, 4),
                     "diff_vs_client": round(d_cli, 4), "verdict": verdict, "why": why})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-url", help="a running server (default: boot the config's server like the suite)")
    ap.add_argument("--served-model", default="model", help="its served model name (the suite serves 'model')")
    ap.add_argument("--tokenizer", help="tokenizer dir or tokenizer.json (default: the suite model's directory)")
    ap.add_argument("--model", default=None, help="suite model alias (boot mode)")
    ap.add_argument("--config", default=None, help="suite config name (boot mode)")
    ap.add_argument("--pp", type=positive_number(int), default=2048)
    ap.add_argument("--tg", type=positive_number(int), default=32)
    ap.add_argument("--runs", type=positive_number(int), default=5)
    ap.add_argument("--out", default=None, help="output dir (default runs/crosscheck-<time>)")
    ap.add_argument("--boot-timeout", type=positive_number(float), default=900.0)
    a = ap.parse_args(argv)
    try:  # before anything else: a folder it cannot write was a traceback
        out = writable_dir(Path(a.out or REPO / "runs" / f"crosscheck-{time.strftime('%Y%m%d-%H%M%S')}"), "--out")
    except SuiteError as e:
        fail(str(e))
    if importlib.util.find_spec("llama_benchy") is None:
        fail("llama-benchy is not installed (pip install llama-benchy==0.4.0; the GPU bundle's deps chunk carries it)")
    running, tokenizer = None, a.tokenizer
    try:
        if a.server_url:
            client = Client(a.server_url.rstrip("/"), a.served_model, timeout_s=600)
            if not tokenizer:
                fail("--server-url needs --tokenizer (the server's tokenizer dir or tokenizer.json)")
        else:
            from harness.session.suite import Suite

            suite = Suite.create(a.config, a.model, None, None, str(out / "suite-run"), a.boot_timeout)
            target = suite.targets()[0]
            running = suite.boot(target, tag="__crosscheck")
            client = running.client(timeout_s=600)
            tokenizer = tokenizer or suite.model.path
        chat_preflight(client)
        book, cache = seed_corpus()
        benchy = run_benchy(client.base_url, client.model, tokenizer, a.pp, a.tg, a.runs, book, out)
        ours = suite_numbers(client, a.pp, a.tg, max(a.runs, 5))
    except SuiteError as e:
        fail(str(e).splitlines()[0], 1)
    finally:
        if running is not None:
            running.process.stop()
    rows = compare(benchy, ours, a.pp, a.tg)
    doc = {"llama_benchy_version": benchy.get("version") or benchy.get("metadata", {}).get("version"), "corpus_cache": str(cache),
           "tolerance": TOLERANCE, "rows": rows, "suite_samples": ours, "llama_benchy": benchy}
    (out / "crosscheck.json").write_text(json.dumps(doc, indent=1))
    md = ["# llama-benchy cross-check", "", f"llama-benchy {doc['llama_benchy_version']}, pp{a.pp} / tg{a.tg}, "
          f"{a.runs} runs; suite medians over the same server, back to back.", "",
          "| metric | llama-benchy | suite (engine clock) | suite (client clock) | vs engine | vs client | verdict |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["verdict"] == "unmeasured":
            md.append(f"| {r['metric']} | n/a | | | | | unmeasured: {r['why']} |")
            continue
        de = "n/a" if r["diff_vs_engine"] is None else f"{r['diff_vs_engine']:+.2%}"
        md.append(f"| {r['metric']} | {r['llama_benchy']} | {r['suite_engine']} | {r['suite_client']} | {de} | "
                  f"{r['diff_vs_client']:+.2%} | {r['verdict']}: {r['why']} |")
    (out / "crosscheck.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    verdicts = {r["verdict"] for r in rows}
    return 1 if "disagree" in verdicts else 3 if "unmeasured" in verdicts else 0


if __name__ == "__main__":
    raise SystemExit(main())
