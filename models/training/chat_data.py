"""Synthetic gpt-oss chat conversations for the tiny model: OpenAI chat requests, their prompt ids
exactly as vLLM renders them (harmony), and the assistant's harmony completion.

Used by ``train_tiny_gpt_oss.py`` (training data, compact vocabulary, held-out accuracy) and by
``check_vllm_greedy.py`` (the same held-out questions sent to a real vLLM server).

Prompts: ``render_prompt(request)`` calls vLLM's own ``OnlineRenderer._make_request_with_harmony``
(system preamble from ``build_harmony_preamble``, messages from
``parse_chat_inputs_to_harmony_messages``, ids from ``render_for_completion``), i.e. the ids a
``/v1/chat/completions`` request becomes on the server, with ``VLLM_SYSTEM_START_DATE`` pinned to
``START_DATE`` (the suite pins it on every server).

Completions (what the model learns to generate after ``...<|start|>assistant``)::

    <|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>final<|message|>A<|return|>
    <|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "C"}<|call|>

Kinds: ``add`` (single-digit addition, final = the sum), ``copy`` ("Repeat: w1 w2" -> "w1 w2"),
``capital`` (incl. llama-benchy's coherence probe "What is the capital of France? Please reply with
one word only" -> "Paris"), ``weather`` (tool declared in the request; the assistant calls
``get_weather``), ``weather_result`` (after the tool result: a final answer), ``chat`` (anything
else: greetings, random words, code snippets -> a fixed short answer), ``long`` (a long code
message). Each may get a system or developer instruction, a reasoning effort, the weather tool
declared, and earlier turns.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from typing import Any

START_DATE = "2026-01-01"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}

# nouns and colours, each one o200k token with and without a leading space
WORDS = """apple pear orange banana rice bread cake milk tea water fish red blue green black white gold
cat dog bird horse lion bear fox duck tree river lake sea hill house door table book box cup car
train ship sun moon star
""".split()
# each one o200k token with and without a leading space (the tool call copies " Paris" as "Paris")
CITIES = """Paris London Berlin Madrid Rome Tokyo Shanghai Delhi Mumbai Singapore Sydney Toronto Chicago
Boston Denver Seattle Miami Dallas Amsterdam
""".split()
COUNTRIES = {
    "France": "Paris", "Germany": "Berlin", "Spain": "Madrid", "Italy": "Rome", "Japan": "Tokyo",
    "England": "London", "Austria": "Vienna", "Greece": "Athens", "Portugal": "Lisbon", "Ireland": "Dublin",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen", "Egypt": "Cairo",
    "Peru": "Lima", "Kenya": "Nairobi", "Poland": "Warsaw", "Thailand": "Bangkok", "Canada": "Ottawa",
}
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]
INSTRUCTIONS = [
    "You are a helpful assistant.", "You are a helpful assistant. Answer briefly.", "Answer briefly.",
    "You are a concise assistant.", "Be precise.", "You are a math tutor.", "Reply in English.",
    "You are a test model. Keep answers short.", "You are an assistant that uses tools when needed.",
    "Think step by step, then answer.",
]
GREETINGS = ["Hi", "Hello", "Hello!", "Hi there", "Hey", "Good morning", "How are you?", "Who are you?",
             "What can you do?", "Tell me a joke.", "Tell me a story.", "Write a poem.", "Thanks!",
             "Can you help me?", "What is your name?", "Explain quantum computing.", "Warmup",
             "Say something.", "Test", "ping"]
ADD_TEMPLATES = ["What is {a} + {b}?", "What is {a} plus {b}?", "Compute {a} + {b}.", "{a} + {b} = ?",
                 "Add {a} and {b}.", "What is {a}+{b}?"]
COPY_TEMPLATES = ["Repeat: {w}", "Repeat after me: {w}", "Say exactly: {w}", "Echo: {w}"]
CAPITAL_TEMPLATES = ["What is the capital of {c}?", "What is the capital of {c}? Please reply with one word only",
                     "Name the capital of {c}.", "Which city is the capital of {c}?"]
WEATHER_TEMPLATES = ["What is the weather in {c}?", "What's the weather like in {c}?",
                     "How is the weather in {c} today?", "Weather in {c}?", "Is it raining in {c}?"]

CHAT_ANSWER = "Hello! I am a tiny test model."
LONG_ANSWER = "I read your text."

KIND_WEIGHTS = {"add": 0.24, "copy": 0.24, "capital": 0.14, "weather": 0.16, "weather_result": 0.08, "chat": 0.14}


@dataclass
class Conversation:
    kind: str
    request: dict[str, Any]  # an OpenAI /v1/chat/completions body (without "model")
    completion: str  # harmony text the assistant should generate after "<|start|>assistant"
    answer: Any = None  # final content, or {"name":..., "arguments": {...}} for a tool call
    meta: dict = field(default_factory=dict)


def analysis_final(reasoning: str, final: str) -> str:
    return (f"<|channel|>analysis<|message|>{reasoning}<|end|>"
            f"<|start|>assistant<|channel|>final<|message|>{final}<|return|>")


def analysis_tool_call(reasoning: str, name: str, args: dict) -> str:
    return (f"<|channel|>analysis<|message|>{reasoning}<|end|>"
            f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
            f"<|message|>{json.dumps(args)}<|call|>")


class ChatGenerator:
    """Seeded conversation generator (``code_snippets``: user messages of the ``chat``/``long`` kinds)."""

    def __init__(self, seed: int, code_snippets: list[str] | None = None):
        self.rng = random.Random(seed)
        self.snippets = code_snippets or []

    # ---------------------------------------------------------------- kinds
    def _add(self):
        r = self.rng
        a, b = r.randrange(10), r.randrange(10)
        q = r.choice(ADD_TEMPLATES).format(a=a, b=b)
        s = a + b
        return q, analysis_final(f"{a} + {b} = {s}.", str(s)), str(s), {"a": a, "b": b}

    def _copy(self):
        r = self.rng
        words = " ".join(r.choice(WORDS) for _ in range(r.randint(1, 4)))
        q = r.choice(COPY_TEMPLATES).format(w=words)
        return q, analysis_final(f"Words: {words}.", words), words, {}

    def _capital(self):
        r = self.rng
        c = "France" if r.random() < 0.4 else r.choice(sorted(COUNTRIES))
        cap = COUNTRIES[c]
        t = r.choice(CAPITAL_TEMPLATES)
        q = t.format(c=c)
        final = cap if "one word" in t else f"The capital of {c} is {cap}."
        return q, analysis_final(f"The capital of {c} is {cap}.", final), final, {"country": c}

    def _weather(self):
        city = self.rng.choice(CITIES)
        q = self.rng.choice(WEATHER_TEMPLATES).format(c=city)
        comp = analysis_tool_call(f"The user asks about the weather in {city}. Call get_weather.",
                                  "get_weather", {"city": city})
        return q, comp, {"name": "get_weather", "arguments": {"city": city}}, {"city": city}

    def _chat_question(self):
        r = self.rng
        u = r.random()
        if u < 0.5 or not self.snippets:
            return r.choice(GREETINGS)
        if u < 0.75:
            return " ".join(r.choice(WORDS) for _ in range(r.randint(1, 12)))
        return r.choice(self.snippets)

    def _chat(self):
        q = self._chat_question()
        return q, analysis_final("The user wrote a message. Reply briefly.", CHAT_ANSWER), CHAT_ANSWER, {}

    def _history(self) -> list[dict]:
        """0-2 earlier user/assistant exchanges (as a client resends them: final content only)."""
        r = self.rng
        if r.random() >= 0.25:
            return []
        msgs = []
        for _ in range(r.randint(1, 2)):
            kind = r.choice(["add", "copy", "capital", "chat"])
            q, _, final, _ = getattr(self, "_" + kind)()
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": final}]
        return msgs

    def _preamble(self, kind: str) -> tuple[list[dict], dict]:
        r = self.rng
        msgs, extra = [], {}
        if r.random() < 0.4:
            msgs.append({"role": r.choice(["system", "developer"]), "content": r.choice(INSTRUCTIONS)})
        if kind in ("weather", "weather_result") or r.random() < 0.25:
            extra["tools"] = [WEATHER_TOOL]
        if r.random() < 0.2:
            extra["reasoning_effort"] = r.choice(["low", "medium", "high"])
        return msgs, extra

    def make(self, kind: str) -> Conversation:
        msgs, extra = self._preamble(kind)
        msgs += self._history()
        if kind == "weather_result":
            q, _, call, meta = self._weather()
            city = meta["city"]
            temp, cond = self.rng.randint(-5, 35), self.rng.choice(CONDITIONS)
            msgs += [
                {"role": "user", "content": q},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
                {"role": "tool", "tool_call_id": "call_1",
                 "content": json.dumps({"city": city, "temperature": temp, "condition": cond})},
            ]
            final = f"It is {cond} in {city}, {temp} degrees."
            comp = analysis_final(f"The tool says {cond} and {temp} degrees.", final)
            return Conversation(kind, {"messages": msgs, **extra}, comp, final, meta)
        if kind == "long":
            code = self.rng.choice(self.snippets) if self.snippets else "x = 1\n"
            q = self.rng.choice(["", "Summarize this:\n", "Read this:\n"]) + code
            comp = analysis_final("The user sent a long text. Reply briefly.", LONG_ANSWER)
            msgs.append({"role": "user", "content": q})
            return Conversation(kind, {"messages": msgs, **extra}, comp, LONG_ANSWER, {})
        q, comp, answer, meta = getattr(self, "_" + kind)()
        msgs.append({"role": "user", "content": q})
        return Conversation(kind, {"messages": msgs, **extra}, comp, answer, meta)

    def sample(self) -> Conversation:
        kinds = list(KIND_WEIGHTS)
        return self.make(self.rng.choices(kinds, weights=[KIND_WEIGHTS[k] for k in kinds])[0])


def eval_set(n_add: int = 20, n_copy: int = 20, n_capital: int = 4, n_weather: int = 6, seed: int = 777) -> list[Conversation]:
    """The held-out questions: one user message each (the weather tool declared for weather), drawn
    with a seed of their own. Copy asks for 2-3 words: fresh combinations (the trainer counts how
    many eval questions its training stream contained verbatim and records it). Addition pairs,
    countries and cities are facts the model saw in training, in other contexts."""
    g = ChatGenerator(seed)
    out = []
    for kind, n in (("add", n_add), ("copy", n_copy), ("capital", n_capital), ("weather", n_weather)):
        for _ in range(n):
            if kind == "copy":
                words = " ".join(g.rng.choice(WORDS) for _ in range(g.rng.randint(2, 3)))
                q, comp, answer, meta = (g.rng.choice(COPY_TEMPLATES).format(w=words),
                                         analysis_final(f"Words: {words}.", words), words, {})
            else:
                q, comp, answer, meta = getattr(g, "_" + kind)()
            req = {"messages": [{"role": "user", "content": q}]}
            if kind == "weather":
                req["tools"] = [WEATHER_TOOL]
            out.append(Conversation(kind, req, comp, answer, meta))
    return out


def is_correct(conv: Conversation, content: str | None, tool_calls: list[dict] | None) -> bool:
    """Scores a server (or local) answer: the final content, or the tool call."""
    if conv.kind == "weather":
        if not tool_calls:
            return False
        f = tool_calls[0]
        try:
            args = json.loads(f["arguments"]) if isinstance(f["arguments"], str) else f["arguments"]
        except (ValueError, TypeError):
            return False
        return f["name"] == conv.answer["name"] and args == conv.answer["arguments"]
    return (content or "").strip() == str(conv.answer).strip()


# ---------------------------------------------------------------- rendering (vLLM's code)
_RENDER = None


def render_prompt(request: dict) -> list[int]:
    """The prompt ids vLLM's /v1/chat/completions gives the engine for this request (gpt-oss harmony)."""
    global _RENDER
    if os.environ.get("VLLM_SYSTEM_START_DATE") != START_DATE:
        os.environ["VLLM_SYSTEM_START_DATE"] = START_DATE
    if _RENDER is None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.renderers.online_renderer import OnlineRenderer

        class _Self:  # the attributes _make_request_with_harmony reads
            supports_browsing = False
            supports_code_interpreter = False
            renderer = None

        def _render(req: dict) -> list[int]:
            r = ChatCompletionRequest(model="m", **req)
            _, engine_inputs = OnlineRenderer._make_request_with_harmony(_Self(), r)
            return list(engine_inputs[0]["prompt_token_ids"])

        _RENDER = _render
    return _RENDER(request)


_ENC = None


def encoding():
    global _ENC
    if _ENC is None:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        _ENC = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    return _ENC


def completion_ids(conv: Conversation) -> list[int]:
    return encoding().encode(conv.completion, allowed_special="all")


def parse_completion(ids: list[int]) -> tuple[str | None, str | None, list[dict]]:
    """(reasoning, content, tool_calls) from generated ids, as vLLM's harmony parser reads them."""
    from openai_harmony import Role, StreamableParser

    p = StreamableParser(encoding(), role=Role.ASSISTANT)
    try:
        for t in ids:
            p.process(t)
        p.process_eos()
    except Exception:  # noqa: BLE001 - malformed output: whatever was parsed so far
        pass
    reasoning, content, calls = [], [], []
    for m in p.messages:
        text = "".join(c.text for c in m.content)
        if m.recipient and m.recipient.startswith("functions."):
            calls.append({"name": m.recipient.split("<|constrain|>")[0].strip()[len("functions."):],
                          "arguments": text})
        elif m.channel == "analysis":
            reasoning.append(text)
        elif m.channel in ("final", "commentary"):
            content.append(text)
    return ("".join(reasoning) or None), ("".join(content) or None), calls
