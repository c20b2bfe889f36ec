"""Level 1 (the users' plan): the server starts without crashing, answers, and logs the expected backends."""
import math

import pytest

from harness.engine.client import all_finite, token_logprobs

pytestmark = [pytest.mark.level1, pytest.mark.server]

PROMPT = "def fibonacci(n):\n    "


def test_server_boots_and_boot_time_is_reported(booted, suite, record_property):
    assert booted.process.alive(), "server process is not running after boot"
    assert booted.boot_seconds is not None and 0 < booted.boot_seconds <= suite.boot_timeout_s
    record_property("boot_seconds", round(booted.boot_seconds, 1))
    print(f"\n[{booted.target.name}] booted in {booted.boot_seconds:.1f} s on {suite.platform.name}")


def test_health_is_ok(client):
    assert client.health() == 200


def test_models_lists_the_served_model(client, live_server):
    assert live_server.served_name in client.models()


def test_one_completion_returns_text_with_finite_logprobs(client, suite):
    out = client.complete(PROMPT, max_tokens=16, logprobs=1)
    choice = out["choices"][0]
    if suite.model.has_real_weights:
        # dummy weights pick ids beyond the small stand-in tokenizer, which decode to ""
        assert choice["text"].strip(), f"empty completion: {choice!r}"
    lps = token_logprobs(out)
    assert 1 <= out["usage"]["completion_tokens"] <= 16
    assert len(lps) == out["usage"]["completion_tokens"]
    assert all_finite(lps), f"non-finite logprobs: {lps}"
    assert all(lp <= 0.0 for lp in lps)
    assert not any(math.isnan(x) for x in lps)


def test_startup_log_shows_the_expected_backends(booted):
    log = booted.log_text()
    missing = [line for line in booted.target.spec.logs if line not in log]
    assert not missing, f"startup log of {booted.target.name} lacks {missing}; see {booted.log_path}"
    assert "Traceback" not in log, f"a traceback in the startup log {booted.log_path}"
