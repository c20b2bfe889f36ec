"""scripts/plugin_e2e.py's concurrent workloads reach the batch they name: the users' flags admit 2 sequences, under
which tg32@c32 timed batch-2 decode behind a queue (an H100 run of 2026-12-07: 2 running, 24 waiting in its server log)
and never the plugin's M > 16 path."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import plugin_e2e  # noqa: E402


def test_the_full_set_admits_its_largest_concurrency_and_the_single_request_modes_keep_the_flavours():
    top = max(w.concurrency for w in plugin_e2e.WORKLOADS)
    assert top >= 32, "the full set has a batch above the plugin's 16-token decode threshold"
    assert plugin_e2e.max_num_seqs(plugin_e2e.ALL) == top
    assert plugin_e2e.max_num_seqs(plugin_e2e.DECODE_ONLY_MODE) is None
    assert plugin_e2e.max_num_seqs(plugin_e2e.PREFILL_GPU_ONLY) is None


def test_the_sequences_follow_the_flavours_flags_and_an_entrys_own_flag_wins():
    args = plugin_e2e.boot_args("0.92", 32, ["--max-num-seqs=4"])
    assert args == ["--gpu-memory-utilization", "0.92", "--max-num-seqs=32", "--max-num-seqs=4"]
    assert plugin_e2e.boot_args(None, None, []) == []


def test_results_measured_at_the_flavours_two_sequences_do_not_share_a_table_with_these():
    now = {"weights": "w", "kernel_env": {}, "workloads": "all", "max_num_seqs": 32}
    before = {"triton-bf16": {"metrics": {}, "weights": "w", "kernel_env": {}, "workloads": "all"}}
    assert "max_num_seqs" in plugin_e2e.mixed_setting(before, now)
    assert plugin_e2e.mixed_setting({"t": {"metrics": {}, **now}}, now) is None


def test_the_report_says_what_batch_the_concurrent_workloads_reached():
    assert "--max-num-seqs=32" in plugin_e2e.seqs_line({"t": {"metrics": {}, "max_num_seqs": 32}})
    assert "behind a queue" in plugin_e2e.seqs_line({"t": {"metrics": {}}})


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
