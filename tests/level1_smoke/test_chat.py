"""Level 1: the chat endpoint every gpt-oss client uses answers through vLLM's harmony path.

Real weights: a chat completion returns `content`, the analysis channel comes back as `reasoning`
separate from it, a tool call is parsed into `tool_calls`, and the answer's token ids parse as harmony.
Shape-only models (dummy weights) produce meaningless tokens: only the protocol is checked, and it must
never be a 5xx.
"""
import pytest

from harness.correctness.chat import ask, load_chat_workload, structure_problems

pytestmark = [pytest.mark.level1, pytest.mark.server]


@pytest.fixture(scope="session")
def chat_workload():
    return load_chat_workload()


def _conversation(workload, name):
    return next(c for c in workload.conversations if c.name == name)


def _need_real_weights(suite):
    if not suite.model.has_real_weights:
        pytest.skip(f"{suite.model.alias} has dummy weights: its answers are meaningless (the protocol test below covers it)")


def test_chat_completion_returns_content(client, suite, chat_workload):
    _need_real_weights(suite)
    conv = _conversation(chat_workload, "capital")
    answer = ask(client, conv.messages, chat_workload.max_tokens)
    print(f"\n  content {answer.content!r}; reasoning {answer.reasoning!r:.80}")
    assert not structure_problems(conv, answer), structure_problems(conv, answer)


def test_reasoning_is_separated_from_the_content(client, suite, chat_workload):
    _need_real_weights(suite)
    conv = _conversation(chat_workload, "arithmetic")
    answer = ask(client, conv.messages, chat_workload.max_tokens)
    assert answer.reasoning and answer.content, f"reasoning {answer.reasoning!r}, content {answer.content!r}"
    assert answer.reasoning.strip() not in answer.content, "the analysis channel leaked into the content"
    assert not answer.parse_errors, answer.parse_errors


def test_a_tool_call_is_parsed(client, suite, chat_workload):
    _need_real_weights(suite)
    conv = _conversation(chat_workload, "weather-tool")
    answer = ask(client, conv.messages, chat_workload.max_tokens, tools=conv.tools)
    print(f"\n  tool_calls {answer.summary()['tool_calls']}")
    assert not structure_problems(conv, answer), structure_problems(conv, answer)


def test_chat_protocol_holds_for_any_weights(client, chat_workload):
    """Any model, dummy weights included: a well-formed response (never a 5xx) with usage that adds up."""
    conv = _conversation(chat_workload, "capital")
    out = client.chat(conv.messages, 8)
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length", "tool_calls")
    assert 1 <= out["usage"]["completion_tokens"] <= 8 and out["usage"]["prompt_tokens"] > 0
