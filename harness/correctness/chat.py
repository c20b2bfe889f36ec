"""The chat path users take: /v1/chat/completions through vLLM's harmony renderer and parser.

gpt-oss answers in harmony: `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final
<|message|>...<|return|>`, or a tool call `...<|channel|>commentary to=functions.NAME ... <|call|>`. vLLM
splits that into `reasoning`, `content` and `tool_calls`. A *harmony parse error* is any answer the
harmony grammar rejects: a 5xx, token ids that openai_harmony's StreamableParser refuses (checked here,
client-side, on the ids the server returns), an answer that stops mid-message, or harmony markup
leaking into `content`/`reasoning`. vLLM 0.26 turns some of these into HTTP 500s and vLLM 0.32 skips the
offending tokens silently, so the suite parses the ids itself rather than trusting either.
"""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import SuiteError
from harness.core.paths import REPO
from harness.core.yamlfile import load_mapping
from harness.correctness.logprobs import Stream, compare_streams, token_id
from harness.engine.client import Client
from harness.engine.models import TOKENIZER_DIR

CHAT_FILE = REPO / "tests" / "level2_correctness" / "chat.yaml"
MARKUP = re.compile(r"<\|(start|end|message|channel|return|call|constrain)\|>")


@dataclass
class ChatAnswer:
    content: str | None
    reasoning: str | None
    tool_calls: list[dict]
    finish_reason: str | None
    stream: Stream | None  # output token ids with top-k logprobs (when asked for)
    parse_errors: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"content": self.content, "reasoning": self.reasoning, "finish_reason": self.finish_reason,
                "tool_calls": [{"name": t["function"]["name"], "arguments": t["function"]["arguments"]} for t in self.tool_calls]}


@functools.cache
def _harmony_encoding():
    """gpt-oss's harmony encoding, loaded once per process (it parses the 200k-token vocabulary)."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding


    # openai-harmony (vLLM <= 0.26 images) downloads the vocabulary unless this names a folder holding it
    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(TOKENIZER_DIR))
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def harmony_problems(token_ids: list[int], finish_reason: str | None) -> list[str]:
    """What the harmony grammar rejects in an assistant answer given as token ids (empty: well formed)."""
    from openai_harmony import HarmonyError, Role, StreamableParser

    parser = StreamableParser(_harmony_encoding(), role=Role.ASSISTANT)
    problems = []
    for i, tok in enumerate(token_ids):
        try:
            parser.process(tok)
        except HarmonyError as e:
            problems.append(f"token {i} (id {tok}): {e}")
            break
    if not problems and finish_reason != "length":  # a cut answer may stop anywhere
        try:
            parser.process_eos()
        except HarmonyError as e:
            problems.append(f"at the end of the answer: {e}")
    return problems


def ask(client: Client, messages: list[dict], max_tokens: int, tools: list[dict] | None = None, top_k: int = 5) -> ChatAnswer:
    """One greedy chat request, checked against the harmony grammar."""
    params: dict = {"logprobs": True, "top_logprobs": top_k, "return_tokens_as_token_ids": True}
    if tools:
        params.update(tools=tools, tool_choice="auto")
    out = client.chat(messages, max_tokens, **params)
    choice = out["choices"][0]
    msg = choice.get("message") or {}
    stream = None
    ids: list[int] = []
    content_lp = (choice.get("logprobs") or {}).get("content")
    if content_lp:
        ids = [token_id(e["token"]) for e in content_lp]
        stream = Stream(ids, [float(e["logprob"]) for e in content_lp],
                        [{token_id(t["token"]): float(t["logprob"]) for t in e.get("top_logprobs") or []} for e in content_lp],
                        (msg.get("reasoning") or "") + (msg.get("content") or "")).served()
    answer = ChatAnswer(msg.get("content"), msg.get("reasoning"), list(msg.get("tool_calls") or []),
                        choice.get("finish_reason"), stream)
    if ids:
        answer.parse_errors += harmony_problems(ids, answer.finish_reason)
    else:
        answer.parse_errors.append("the server returned no output token ids (logprobs.content), so the answer cannot be checked")
    for name, text in (("content", answer.content), ("reasoning", answer.reasoning)):
        if text and MARKUP.search(text):
            answer.parse_errors.append(f"harmony markup leaked into {name}: {text[:80]!r}")
    for call in answer.tool_calls:
        try:
            json.loads(call["function"]["arguments"])
        except (KeyError, TypeError, ValueError):
            answer.parse_errors.append(f"tool call arguments are not JSON: {call!r:.120}")
    return answer


def check_chat_golden(data, where: str) -> dict:
    """One line naming the file when a chat golden lacks what the comparison reads."""
    try:
        for entry in data.values():
            Stream.check_json(entry["stream"])  # lengths and finite numbers, as level 2's goldens are checked
            [entry[k] for k in ("content", "reasoning", "tool_calls", "finish_reason")]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise SuiteError(f"{where} is malformed ({type(e).__name__}: {e}); restore it from git or regenerate it with --force-regen") from None
    return data


def chat_golden_data(answers: dict[str, ChatAnswer]) -> dict:
    missing = [name for name, a in answers.items() if a.stream is None]
    if missing:
        raise SuiteError(f"no output token ids for {missing}: a chat golden needs them (logprobs.content)")
    return {name: {"stream": a.stream.to_json(), **a.summary()} for name, a in answers.items()}


def chat_problems(answers: dict[str, ChatAnswer], golden: dict, tol) -> tuple[list[str], list[str]]:
    """(problems, notes) of chat answers against their golden: the level 2 stream rule, and identical parsed
    fields wherever the tokens are identical."""
    problems, notes = [], []
    for name, a in answers.items():
        if name not in golden:
            problems.append(f"'{name}' has no chat golden (regenerate it)")
            continue
        gold = golden[name]
        if a.stream is None:
            problems.append(f"'{name}': the server returned no output token ids, so the answer cannot be compared")
            continue
        v = compare_streams(Stream.from_json(gold["stream"]), a.stream, tol)
        if not v.ok:
            problems.append(f"'{name}' chat stream {v.message}\n      golden: {gold['content']!r}\n      new:    {a.content!r}")
        elif v.identical:
            for key in ("content", "reasoning", "tool_calls", "finish_reason"):
                if a.summary()[key] != gold[key]:
                    problems.append(f"'{name}': same tokens as the golden but {key} parsed as {a.summary()[key]!r:.100} "
                                    f"instead of {gold[key]!r:.100}")
        else:
            notes.append(f"'{name}' {v.message}")
    return problems, notes


# -- the chat workload: conversations with what their answers must contain -----------------------------
@dataclass
class Conversation:
    name: str
    messages: list[dict]
    tools: list[dict] | None
    expect: dict  # {"content": regex, "reasoning": true, "tool": "get_weather"} (structure checks)


@dataclass
class ChatWorkload:
    conversations: list[Conversation]
    max_tokens: int
    top_k: int
    task_files: dict[str, Path]  # model alias glob -> task set
    task_max_tokens: int
    path: Path

    def tasks_for(self, model_alias: str) -> Path:
        """SUITE_TASKS if set, else the first task set whose glob matches the model alias."""
        import fnmatch
        import os

        if os.environ.get("SUITE_TASKS"):
            return Path(os.environ["SUITE_TASKS"])
        for glob, path in self.task_files.items():
            if fnmatch.fnmatchcase(model_alias, glob):
                return path
        raise SuiteError(f"{self.path}: no task set matches model {model_alias}; add one under tasks.files or set SUITE_TASKS")


MATCH_RULES = ("exact", "contains", "regex")


def _compiled(pattern: str, what: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{what} /{pattern}/ is not a regular expression ({e})") from None


def load_chat_workload(path: Path = CHAT_FILE) -> ChatWorkload:
    try:
        raw = load_mapping(path, fix="restore it from git or fix the file")
        tools = raw.get("tools") or {}
        convs = [Conversation(name, list(c["messages"]), [tools[t] for t in c.get("tools") or []] or None, dict(c.get("expect") or {}))
                 for name, c in raw["conversations"].items()]
        for conv in convs:
            if conv.expect.get("content"):
                _compiled(conv.expect["content"], f"conversation {conv.name!r} expect.content")
        files = {str(g): REPO / str(f) for g, f in raw["tasks"]["files"].items()}
        return ChatWorkload(convs, int(raw["max_tokens"]), int(raw["top_logprobs"]), files, int(raw["tasks"]["max_tokens"]), path)
    except OSError as e:
        raise SuiteError(f"{path}: cannot read the chat workload ({e.strerror}); restore it from git") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SuiteError(f"{path}: malformed chat workload ({type(e).__name__}: {e}); fix the file") from None


def structure_problems(conv: Conversation, answer: ChatAnswer) -> list[str]:
    """The answer has the structure its conversation expects (true for any model that speaks harmony)."""
    out = [f"'{conv.name}': harmony parse error: {e}" for e in answer.parse_errors]
    want = conv.expect
    if want.get("tool"):
        names = [t["function"]["name"] for t in answer.tool_calls]
        if want["tool"] not in names:
            out.append(f"'{conv.name}': expected a call of tool {want['tool']}, got tool_calls {names} and content {answer.content!r:.80}")
    else:
        if not answer.content:
            out.append(f"'{conv.name}': empty content (finish_reason {answer.finish_reason}); reasoning {answer.reasoning!r:.80}")
        if want.get("reasoning") and not answer.reasoning:
            out.append(f"'{conv.name}': no reasoning separated from the content")
    if want.get("content") and answer.content is not None and not re.search(want["content"], answer.content):
        out.append(f"'{conv.name}': content {answer.content!r:.80} does not match /{want['content']}/")
    return out


# -- task accuracy -----------------------------------------------------------------------------------
@dataclass
class Task:
    messages: list[dict]
    answer: str  # the expected final answer; the content must match it (normalised) or the regex below
    match: str = "exact"  # exact | contains | regex
    tools: list[dict] | None = None  # declared tools (OpenAI format)
    tool: dict | None = None  # the expected call instead of an answer: {"name": ..., "arguments": {...}}


def load_tasks(path: Path) -> list[Task]:
    tasks, i = [], -1
    try:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if line.strip():
                d = json.loads(line)
                tasks.append(Task(list(d["messages"]), str(d.get("answer", "")), str(d.get("match", "exact")),
                                  d.get("tools"), d.get("tool")))
                if not tasks[-1].answer and not tasks[-1].tool:
                    raise ValueError("neither an answer nor an expected tool call")
                if tasks[-1].match not in MATCH_RULES:  # an unknown rule was judged as "exact" in silence
                    raise ValueError(f"match {tasks[-1].match!r} is none of {', '.join(MATCH_RULES)}")
                if tasks[-1].match == "regex":  # a bad pattern raised re.error mid-run, a traceback after the boot
                    _compiled(tasks[-1].answer, "answer")
    except (OSError, UnicodeDecodeError) as e:
        raise SuiteError(f"{path}: cannot read the task set ({e}); restore it from git or pass another") from None
    except (ValueError, KeyError, TypeError) as e:
        raise SuiteError(f"{path}: line {i + 1} is not a task ({type(e).__name__}: {e}); expected "
                         '{"messages": [...], "answer": "...", "match": "exact|contains|regex"}') from None
    if not tasks:
        raise SuiteError(f"{path}: no tasks")
    return tasks


def _norm(text: str) -> str:
    return " ".join(text.strip().strip(".").lower().split())


def correct(task: Task, content: str | None, tool_calls: list[dict] | None = None) -> bool:
    if task.tool is not None:
        if not tool_calls:
            return False
        f = tool_calls[0].get("function") or {}
        try:
            args = json.loads(f.get("arguments") or "null")
        except ValueError:
            return False
        return f.get("name") == task.tool["name"] and args == task.tool["arguments"]
    if not content:
        return False
    if task.match == "regex":
        return re.search(task.answer, content) is not None
    if task.match == "contains":
        return _norm(task.answer) in _norm(content)
    return _norm(content) == _norm(task.answer)


@dataclass
class TaskResult:
    n: int
    correct: int
    parse_errors: int
    wrong: list[str]  # a few failing examples

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    def to_json(self) -> dict:
        return {"n": self.n, "correct": self.correct, "accuracy": self.accuracy, "parse_errors": self.parse_errors}


def run_tasks(client: Client, tasks: list[Task], max_tokens: int) -> TaskResult:
    """Greedy answers to every task; a harmony parse error counts as a wrong answer."""
    good, parse_errors, wrong = 0, 0, []
    for t in tasks:
        a = ask(client, t.messages, max_tokens, tools=t.tools, top_k=1)
        ok = not a.parse_errors and correct(t, a.content, a.tool_calls)
        good += ok
        parse_errors += bool(a.parse_errors)
        if not ok and len(wrong) < 5:
            q = t.messages[-1]["content"]
            got = a.content if t.tool is None else a.summary()["tool_calls"]
            want = t.answer if t.tool is None else t.tool
            wrong.append(f"{q!r:.60} -> {got!r:.80} (want {want!r})" + (f" [parse error: {a.parse_errors[0][:60]}]" if a.parse_errors else ""))
    return TaskResult(len(tasks), good, parse_errors, wrong)


def check_tasks_golden(data: object, where: str) -> dict:
    """One line naming the file when a stored task accuracy lacks what the floor needs."""
    try:
        n, acc = int(data["n"]), float(data["accuracy"])
        if n <= 0 or not 0 <= acc <= 1:
            raise ValueError(f"n={n}, accuracy={acc}")
        correct = data["correct"]
        if isinstance(correct, bool) or not isinstance(correct, int) or abs(correct / n - acc) > 1e-9:
            raise ValueError(f"accuracy {acc} is not correct / n ({correct!r} / {n})")
        if accuracy_floor(data) <= 0:
            # a set the model answers (almost) nowhere right gates nothing: no run can fall below its floor
            raise ValueError(f"its floor {accuracy_floor(data):.3f} cannot fail ({correct} of {n} right); pick tasks "
                             "the model answers")
    except (KeyError, TypeError, ValueError, OverflowError) as e:  # OverflowError: int() of an `n: Infinity`
        raise SuiteError(f"{where} is malformed ({type(e).__name__}: {e}); restore it from git or regenerate it with --force-regen") from None
    return data


def accuracy_floor(stored: dict) -> float:
    """The accuracy a run may not fall below: the recorded accuracy minus two binomial standard errors
    (greedy runs of one config repeat exactly; a legitimate kernel change can flip a few borderline
    answers, about sqrt(n p (1-p)) of them, and two of those is the allowance; never less than one answer)."""
    n, p = int(stored["n"]), float(stored["accuracy"])
    return p - max(2 * (p * (1 - p) / n) ** 0.5, 1 / n) - 1e-9  # at least one answer may flip
