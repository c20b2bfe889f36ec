"""scripts/plugin_e2e.py's concurrent workloads reach the batch they name: the users' flags admit 2 sequences, under
which tg32@c32 timed batch-2 decode behind a queue (an H100 run of 2026-12-07: 2 running, 24 waiting in its server log)
and never the plugin's M > 16 path."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import plugin_e2e  # noqa: E402


def test_every_mode_admits_the_full_sets_largest_concurrency():
    """One server setting for every mode (a --decode-only tg32 compares with the full set's), and one that lets the
    full set's concurrent workloads run as one batch, above the plugin's 16-token decode threshold."""
    assert plugin_e2e.SERVER_SEQS == max(w.concurrency for w in plugin_e2e.WORKLOADS) >= 32


def test_the_sequences_follow_the_flavours_flags_and_an_entrys_own_flag_wins():
    args = plugin_e2e.boot_args("0.92", 32, ["--max-num-seqs=4"])
    assert args == ["--gpu-memory-utilization", "0.92", "--max-num-seqs=32", "--max-num-seqs=4"]
    assert plugin_e2e.boot_args(None, None, []) == []


def test_results_measured_at_the_flavours_two_sequences_do_not_share_a_table_with_these():
    now = {"weights": "w", "kernel_env": {}, "workloads": "all", "max_num_seqs": 32}
    before = {"triton-bf16": {"metrics": {}, "weights": "w", "kernel_env": {}, "workloads": "all"}}
    assert "max_num_seqs" in plugin_e2e.mixed_setting(before, now)
    assert plugin_e2e.mixed_setting({"t": {"metrics": {}, **now}}, now) is None


def test_each_boot_records_and_the_report_shows_the_sequences_it_admitted(tmp_path, monkeypatch):
    """main() boots with SERVER_SEQS, an entry's own `+--max-num-seqs=N` wins and is what its result records (the
    report once said 32 for an entry booted at 4)."""
    from types import SimpleNamespace

    fake = SimpleNamespace(model=SimpleNamespace(fingerprint="fp"), platform=SimpleNamespace(name="sm_90", device="H"))
    monkeypatch.setattr(plugin_e2e.Suite, "create", staticmethod(lambda configs, *a: fake))
    booted = []
    monkeypatch.setattr(plugin_e2e, "measure", lambda suite, config, extra, env, mode: booted.append(extra)
                        or {"boot_s": 1.0, "metrics": {"tg32": {"median": 100.0}}})
    monkeypatch.setattr(sys, "argv", ["plugin_e2e.py", "--decode-only", "--configs", "gemv-bf16,gemv-bf16+--max-num-seqs=4",
                                      "--out", str(tmp_path)])
    assert plugin_e2e.main() == 0
    assert booted == [["--max-num-seqs=32"], ["--max-num-seqs=32", "--max-num-seqs=4"]]
    import json

    results = json.loads((tmp_path / "e2e.json").read_text())["results"]
    assert [r["admitted_seqs"] for r in results.values()] == [32, 4]
    assert "gemv-bf16 32, gemv-bf16+--max-num-seqs=4 4." in (tmp_path / "e2e.md").read_text()
    assert plugin_e2e.seqs_line({"old": {"metrics": {}}}, ["old"]).endswith("old the flavour's (the users' flags: 2).")


def test_a_cost_paid_once_per_request_shows_as_one_long_gap_in_the_report():
    """The token gaps kept per decode workload and their report line: a request whose third gap held a 70 ms stall
    reads 'longest 71.00 (gap 3 of 5)' beside a median of the ordinary 1 ms steps."""
    from harness.perf.metrics import TimedRequest

    times = [0.0, 0.001, 0.002, 0.073, 0.074, 0.075]
    stalled = TimedRequest(prompt_tokens=16, completion_tokens=6, t_sent=-0.01, t_first_token=0.0,
                           t_last_token=times[-1], token_times=times)
    gaps = plugin_e2e.token_gaps([stalled] * (plugin_e2e.GAPS_KEPT + 2))
    assert len(gaps) == plugin_e2e.GAPS_KEPT and gaps[0] == [1.0, 1.0, 71.0, 1.0, 1.0]
    (line,) = plugin_e2e.gaps_lines("gemv", {"tg5": gaps[:1]})
    assert line == "- gemv, tg5: median 1.00, longest 71.00 (gap 3 of 5)"
    assert plugin_e2e.gaps_lines("gemv", {"tg5": [[]]}) == [], "a request of one token has no gap to show"
    md = plugin_e2e.markdown({"gemv": {"boot_s": 1.0, "metrics": {}, "token_gaps_ms": {"tg5": gaps[:1]}}}, ["gemv"], "t")
    assert line in md, "e2e.md shows the gaps"


def test_a_concurrent_workload_records_the_most_requests_the_engine_ran_at_once(monkeypatch):
    """run_watched polls /metrics while the workload runs: the peak of vllm:num_requests_running is what the batch
    reached (a server admitting 2 shows 2 under 32 clients), None where no reading saw the workload (an unreadable
    /metrics says 'not seen', never a number); the report names it beside what the boot admitted."""
    import threading
    import time

    monkeypatch.setattr(plugin_e2e, "PEAK_POLL_S", 0.01)
    busy = threading.Event()

    def read(name: str) -> float:
        if name == "vllm:num_requests_running":
            return 2.0 if busy.is_set() else 0.0
        return 30.0 if busy.is_set() else 0.0  # waiting: a queue behind the 2

    def workload() -> str:
        busy.set()
        time.sleep(0.2)
        busy.clear()
        return "measured"

    assert plugin_e2e.run_watched(read, workload) == ("measured", 2)
    assert plugin_e2e.run_watched(lambda name: 0.0, lambda: time.sleep(0.05)) == (None, None)

    def broken(name: str) -> float:
        raise OSError("connection refused")

    assert plugin_e2e.run_watched(broken, lambda: time.sleep(0.05))[1] is None
    results = {"gemv": {"metrics": {}, "admitted_seqs": 32, "peak_running": {"tg32@c4": 4, "tg32@c32": None}}}
    assert plugin_e2e.seqs_line(results, ["gemv"]).endswith(
        "gemv 32 (most running at once: tg32@c4 4, tg32@c32 not seen).")


def test_measure_watches_only_the_concurrent_workloads_and_keeps_their_peaks(monkeypatch):
    """measure() (the boot faked): each concurrent workload runs under run_watched, keyed by its metric name, and the
    result keeps the peaks; batch-1 workloads run unwatched (their 1 running says nothing)."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    running = SimpleNamespace(url="http://127.0.0.1:1", trace_dir=None, log_path=None, boot_seconds=1.0,
                              client=lambda timeout_s: "client")

    @contextmanager
    def boot(*a, **k):
        yield running

    target = SimpleNamespace(name="gemv", runnable=True)
    suite = SimpleNamespace(targets=lambda: [target], boot=boot, platform=SimpleNamespace(is_cuda=False))
    ran, watched = [], []
    monkeypatch.setattr(plugin_e2e.bench, "PromptMaker", lambda client, seed: "maker")
    monkeypatch.setattr(plugin_e2e.bench, "run_workload", lambda client, maker, w: ran.append(w) or SimpleNamespace(
        requests=[]))
    monkeypatch.setattr(plugin_e2e.bench, "metrics_for", lambda w, m: {})
    monkeypatch.setattr(plugin_e2e, "run_watched", lambda read, run: watched.append(run()) or (watched[-1], 7))
    monkeypatch.setattr(plugin_e2e, "decode_breakdown", lambda *a: None)
    monkeypatch.setattr(plugin_e2e, "server_memory", lambda *a: {})
    r = plugin_e2e.measure(suite, "gemv", [], None, plugin_e2e.ALL)
    concurrent = [w for w in plugin_e2e.WORKLOADS if w.concurrency > 1]
    assert len(ran) == len(plugin_e2e.WORKLOADS) and len(watched) == len(concurrent) >= 2
    assert r["peak_running"] == {f"tg{w.tg}@c{w.concurrency}": 7 for w in concurrent}
