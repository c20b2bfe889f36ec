"""harness.perf.metrics formulas on hand-computed requests."""
import pytest

from harness.core.errors import SuiteError
from harness.perf import metrics as perf


def request(t_last=11.5, completion=33, chunks=None, t_end=11.6, prompt=2048):
    # 2048-token prompt, first token at +0.5 s, 32 decode tokens over 1.0 s
    chunks = completion if chunks is None else chunks
    step = (t_last - 10.5) / (chunks - 1)
    times = [10.5 + i * step for i in range(chunks)]
    return perf.TimedRequest(prompt, completion, 10.0, 10.5, t_last, times, t_end)


def test_per_request_formulas():
    r = request()
    assert perf.pp_tps(r) == pytest.approx(2048 / 0.5)
    assert perf.tg_tps(r) == pytest.approx(32 / 1.0)
    assert perf.ttft_ms(r) == pytest.approx(500.0)
    assert perf.tpot_ms(r) == pytest.approx(1000 / 32)
    assert perf.e2e_ms(r) == pytest.approx(1600.0)
    itl = perf.itl_ms(r)
    assert len(itl) == 32 and all(x == pytest.approx(31.25) for x in itl)


def test_multi_token_chunks_keep_token_counts_from_usage():
    r = request(completion=33, chunks=11)  # speculative decoding: 3 tokens per chunk
    assert perf.tg_tps(r) == pytest.approx(32.0)  # from usage, not from 11 chunks
    assert len(perf.itl_ms(r)) == 10
    assert perf.itl_ms(r)[0] == pytest.approx(100.0)


def test_t_end_defaults_to_last_token():
    r = perf.TimedRequest(10, 3, 0.0, 0.1, 0.3, [0.1, 0.2, 0.3])
    assert perf.e2e_ms(r) == pytest.approx(300.0)


def test_summarize_mean_std_and_percentiles():
    s = perf.summarize([request(t_last=11.5), request(t_last=12.5, t_end=12.5)])
    assert s["requests"] == 2
    assert s["tg_tps"]["mean"] == pytest.approx(24.0)  # 32 and 16 tok/s
    assert s["tg_tps"]["std"] == pytest.approx(8 * 2 ** 0.5)
    assert s["pp_tps"] == {"mean": pytest.approx(4096.0), "std": pytest.approx(0.0)}
    assert s["ttft_ms"]["p50"] == pytest.approx(500.0)
    assert s["tpot_ms"]["p50"] == pytest.approx((31.25 + 62.5) / 2)
    assert s["e2e_ms"]["p99"] == pytest.approx(1600 + 0.99 * 900)
    assert s["itl_ms"]["p50"] == pytest.approx((31.25 + 62.5) / 2)


def test_to_metrics_names_units_and_directions():
    m = perf.to_metrics([request(), request()], pp_tokens=2048, tg_tokens=32, depth=4096)
    assert set(m) == {"pp2048@d4096", "tg32@d4096", "ttft_ms@d4096", "tpot_ms@d4096", "itl_ms@d4096", "e2e_ms@d4096"}
    assert m["tg32@d4096"] == {"samples": [pytest.approx(32.0)] * 2, "unit": "tok/s", "higher_is_better": True}
    assert m["ttft_ms@d4096"]["higher_is_better"] is False and m["ttft_ms@d4096"]["unit"] == "ms"
    assert m["itl_ms@d4096"]["samples"] == [pytest.approx(31.25)] * 2


def test_an_itl_sample_is_the_requests_median_chunk_gap():
    """One stalled chunk (100 ms among 10 ms gaps) does not move a request's ITL sample: the gate compares each run's
    typical gap, not a mean that one stall dominates."""
    r = perf.TimedRequest(2048, 4, 10.0, 10.5, 10.62, [10.5, 10.51, 10.52, 10.62])
    assert perf.to_metrics([r, r], pp_tokens=2048, tg_tokens=3)["itl_ms"]["samples"] == [pytest.approx(10.0)] * 2


def test_metric_names_round_trip():
    assert perf.metric_name("tg32") == "tg32"
    assert perf.parse_metric_name(perf.metric_name("pp2048", 8192)) == ("pp2048", 8192)
    assert perf.higher_is_better("pp512") and perf.higher_is_better("tg128@d4096")
    assert not perf.higher_is_better("ttft_ms") and not perf.higher_is_better("e2e_ms@d32768")
    with pytest.raises(SuiteError):
        perf.parse_metric_name("tokens_per_second")


def test_single_token_request_has_no_decode_rate():
    with pytest.raises(SuiteError, match="max_tokens"):
        perf.tg_tps(request(completion=1, chunks=2))


def test_zero_length_spans_and_out_of_order_timestamps_raise():
    with pytest.raises(SuiteError):
        perf.pp_tps(perf.TimedRequest(10, 3, 1.0, 1.0, 2.0, []))
    with pytest.raises(SuiteError):
        perf.TimedRequest(10, 3, 1.0, 0.5, 2.0, [])
    with pytest.raises(SuiteError):
        perf.TimedRequest(10, 3, 0.0, 0.5, 2.0, [1.0, 0.7])


def test_token_accounting_matches():
    perf.check_token_accounting(32, 32, allow_multi_token_chunks=False)
    perf.check_token_accounting(11, 32, allow_multi_token_chunks=True)


@pytest.mark.parametrize("allow", [False, True])
def test_more_chunks_than_tokens_always_raises(allow):
    with pytest.raises(SuiteError, match="more chunks than tokens") as e:
        perf.check_token_accounting(33, 32, allow_multi_token_chunks=allow)
    assert "\n" not in str(e.value)


def test_fewer_chunks_without_speculation_raises():
    with pytest.raises(SuiteError, match="usage.completion_tokens=32"):
        perf.check_token_accounting(30, 32, allow_multi_token_chunks=False)


def test_end_of_stream_before_last_token_raises():
    """Guards against dropping `t_last_token <= t_end` from the timestamp check: an end-of-stream time taken before
    the last chunk arrived (a clock mix-up) would give an e2e shorter than the decode, silently."""
    with pytest.raises(SuiteError, match="out-of-order"):
        perf.TimedRequest(10, 3, 0.0, 0.1, 0.3, [0.1, 0.2, 0.3], t_end=0.25)


def test_concurrency_suffix_parses_and_keeps_its_direction():
    """Guards against the metric-name pattern losing the `@cC` concurrency suffix: every concurrent workload's
    metric (`tg32@c2`, `pp2048@d4096@c4`) would then be refused as an unknown name."""
    assert perf.parse_metric_name("tg32@c2") == ("tg32", 0), "tg32@c2 must parse with depth 0"
    assert perf.parse_metric_name("pp2048@d4096@c4") == ("pp2048", 4096), "depth must be read before @c"
    assert perf.higher_is_better("tg32@c2") and not perf.higher_is_better("ttft_ms@c2"), "direction lost with @c"


def test_to_metrics_puts_each_latency_under_its_own_name():
    """Guards against to_metrics filing one latency's samples under another's name (e.g. TTFT samples as
    `tpot_ms`): the level 5 gate would then judge TPOT on prefill latency."""
    m = perf.to_metrics([request(), request()], pp_tokens=2048, tg_tokens=32)
    assert m["ttft_ms"]["samples"] == [pytest.approx(500.0)] * 2, m["ttft_ms"]
    assert m["tpot_ms"]["samples"] == [pytest.approx(1000 / 32)] * 2, m["tpot_ms"]
    assert m["e2e_ms"]["samples"] == [pytest.approx(1600.0)] * 2, m["e2e_ms"]
    assert m["pp2048"]["samples"] == [pytest.approx(4096.0)] * 2, m["pp2048"]
