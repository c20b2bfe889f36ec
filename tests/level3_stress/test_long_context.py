"""Level 3 (the users' plan): long context up to the model's limit; over the limit a clean 4xx.

"Long context (32K+ tokens)" scaled to the model: the limit is the server's max_model_len (4096 on
the embedded tiny gpt-oss; up to 131072 on gpt-oss-120b), and 32K is tested where the model has it.
"""
import json
import time

import pytest

pytestmark = [pytest.mark.level3, pytest.mark.server]

NEW_TOKENS = 16


def _prompt_len(case: str, max_model_len: int) -> int:
    if case == "32k":
        if max_model_len < 32768 + NEW_TOKENS:
            pytest.skip(f"max_model_len is {max_model_len} (< 32K): the at-the-limit case is the longest this model takes")
        return 32768
    return max_model_len - NEW_TOKENS  # prompt + new tokens = exactly the limit


@pytest.mark.parametrize("case", ["32k", "at-the-limit"])
def test_long_prompt_up_to_the_limit_succeeds(case, live_server, limits, prompts, still_serves, record_property):
    n = _prompt_len(case, limits.max_model_len)
    client = live_server.client(timeout_s=600)
    t0 = time.monotonic()
    out = client.complete(prompts.ids(n, variant=7), NEW_TOKENS, logprobs=1, ignore_eos=True)
    seconds = time.monotonic() - t0
    usage, choice = out["usage"], out["choices"][0]
    record_property(f"long_context_{case}_s", round(seconds, 2))
    print(f"\n{n}-token prompt + {NEW_TOKENS} new tokens (max_model_len {limits.max_model_len}) in {seconds:.1f} s")
    assert usage["prompt_tokens"] == n
    assert usage["completion_tokens"] == NEW_TOKENS and choice["finish_reason"] == "length"
    lps = choice["logprobs"]["token_logprobs"]
    assert len(lps) == NEW_TOKENS and all(lp is not None and -1e4 < lp <= 0 for lp in lps), f"bad logprobs {lps}"
    still_serves(f"a {n}-token prompt")


def _post(live_server, body: dict):
    body = {"model": live_server.served_name, **body}
    return live_server.client(timeout_s=120).raw_post("/v1/completions", json.dumps(body), {"Content-Type": "application/json"})


def test_prompt_over_the_limit_gets_a_clean_4xx(abuse_server, limits, prompts):
    """Over-limit prompts go to the crash-prone tests' own server (conftest `Sacrificial`)."""
    live_server, after = abuse_server
    n = limits.max_model_len + 1
    r = _post(live_server, {"prompt": prompts.ids(n, variant=3), "max_tokens": 4})
    assert 400 <= r.status_code < 500, f"a {n}-token prompt (limit {limits.max_model_len}) got HTTP {r.status_code}: {r.text[:300]}"
    message = r.json()["error"]["message"]
    assert str(limits.max_model_len) in message, f"the error does not state the limit: {message}"
    after(f"a {n}-token prompt")


def test_prompt_plus_max_tokens_over_the_limit_is_refused_or_cut_at_the_limit(abuse_server, limits, prompts):
    live_server, after = abuse_server
    n = limits.max_model_len - 8
    r = _post(live_server, {"prompt": prompts.ids(n, variant=4), "max_tokens": 64, "ignore_eos": True})
    if r.status_code == 200:
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= limits.max_model_len, f"generated past the limit: {usage}"
        assert r.json()["choices"][0]["finish_reason"] == "length"
        print(f"\ncut cleanly at the limit: {usage}")
    else:
        assert 400 <= r.status_code < 500, f"HTTP {r.status_code}: {r.text[:300]}"
        print(f"\nrefused: HTTP {r.status_code} {r.json()['error']['message'][:120]}")
    after("a request whose prompt + max_tokens exceed the limit")
