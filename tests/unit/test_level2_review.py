"""Level 2 loopholes found by an adversarial review, each shown failing before its fix (no vLLM).

- a decode-only kernel (the GEMV MoE, M <= 16) is never run by teacher forcing's prefills: the greedy streams judged
  only the chosen token's logprob, so a distribution that moved under the same greedy tokens read "identical";
- a golden's sequences were never checked against the workload: a consistently truncated held-out text judged
  perplexity over one token;
- a golden copied into another config's folder loaded as that config's;
- a server answering without logprobs was a TypeError traceback;
- a workload with no prompts, 1 token per stream or top-1 only loaded, and every rule it disarmed passed.
"""
from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from harness.core.errors import SuiteError
from harness.core.paths import REPO
from harness.core.store import Regenerated
from harness.correctness.goldens import GoldenStore
from harness.correctness.level2 import PERPLEXITY, check_golden_data, load_workload, run_level2
from harness.correctness.logprobs import Stream, Tolerance, compare_streams

TOL = Tolerance(max_abs=0.5, mean_abs=0.02, ppl_rel=0.002, margin=0.125)
GOLDEN = REPO / "goldens" / "tiny-gpt-oss" / "cpu" / "cpu-bf16" / "level2.json"


# -- the greedy streams judge the whole distribution -------------------------------------------------------------
def _stream(chosen: float, alts: dict[int, float]) -> Stream:
    toks = list(range(100, 132))
    return Stream(toks, [chosen] * 32, [{t: chosen, **alts} for t in toks], "g", [7])


def test_a_decoded_distribution_that_moved_fails_even_when_the_greedy_tokens_match():
    gold = _stream(-0.012, {1: -5.0, 2: -6.0, 3: -7.0, 4: -8.0})
    # the runner-up fell by 3 nats and a token from nowhere entered the top-5: same greedy tokens throughout
    v = compare_streams(gold, _stream(-0.025, {999: -4.0, 2: -6.0, 3: -7.0, 1: -8.0}), TOL)
    assert not v.ok and v.position == 0 and "distribution moved" in v.message
    # one top-k token moved beyond max_abs, nothing entered
    v = compare_streams(gold, _stream(-0.012, {1: -5.6, 2: -6.0, 3: -7.0, 4: -8.0}), TOL)
    assert not v.ok and "token 1: logprob" in v.message and "(|delta| 0.6000 > " in v.message
    # A/A, and a drift inside the tolerances with the k-th entry swapped at the boundary (slack): identical
    assert compare_streams(gold, gold, TOL).identical
    near = _stream(-0.012, {1: -5.2, 2: -6.1, 3: -7.0, 5: -8.05})
    v = compare_streams(gold, near, TOL)
    assert v.ok and v.identical, v.message


# -- the golden's sequences are the workload's ------------------------------------------------------------------
class _ServesTheGolden:
    """A server that tokenizes the workload's texts as the committed golden recorded them and answers with its data."""

    def __init__(self, wl, gold):
        self.tok = {wl.prompts[n]: s["prompt"] for n, s in gold["streams"].items()}
        self.tok[wl.perplexity_text] = gold["scored"][PERPLEXITY]["ids"]
        self.by_prompt = {tuple(s["prompt"]): s for s in gold["streams"].values()}
        self.scored = {tuple(s["ids"]): s for s in gold["scored"].values()}

    def tokenize(self, text):
        return list(self.tok[text])

    def complete(self, ids, max_tokens, prompt_logprobs=None, **kw):
        if prompt_logprobs is None:
            s = self.by_prompt[tuple(ids)]
            return {"choices": [{"text": s["text"], "logprobs": {
                "tokens": [f"token_id:{t}" for t in s["tokens"]], "token_logprobs": s["logprobs"],
                "top_logprobs": [{f"token_id:{k}": v for k, v in t} if isinstance(t, list) else
                                 {f"token_id:{k}": v for k, v in t.items()} for t in s["top"]]}}]}
        sc = self.scored[tuple(ids)]
        pl = [None] + [{str(t): {"logprob": v, "rank": r + 1} for r, (t, v) in enumerate(top)}
                       | ({str(i): {"logprob": a, "rank": 99}} if i not in [t for t, _ in top] else {})
                       for i, a, top in zip(sc["ids"][1:], sc["actual"][1:], sc["top"][1:])]
        return {"choices": [{"prompt_logprobs": pl}]}


def test_the_committed_golden_is_judged_against_itself_through_the_stub():
    """The stub is faithful: the committed golden, served back, scores every held-out token."""
    wl, gold = load_workload(), json.loads(GOLDEN.read_text())["data"]
    result = run_level2(_ServesTheGolden(wl, gold), wl, gold)
    assert len(result.scored[PERPLEXITY].ids) == len(gold["scored"][PERPLEXITY]["ids"]) > 100


def test_a_golden_scoring_a_truncated_held_out_text_is_refused():
    wl, gold = load_workload(), json.loads(GOLDEN.read_text())["data"]
    client = _ServesTheGolden(wl, gold)
    short = copy.deepcopy(gold)
    p = short["scored"][PERPLEXITY]
    for k in ("ids", "actual", "top"):
        p[k] = p[k][:2]
    short["perplexity"]["tokens"] = 1
    check_golden_data(short, "golden g.json", prompts=wl.prompts)  # consistent in itself: its own checks pass
    client.scored[tuple(p["ids"])] = p
    with pytest.raises(SuiteError, match=r"another held-out text .*\(2 vs \d+ tokens\).*--force-regen") as e:
        run_level2(client, wl, short)
    assert "\n" not in str(e.value)


def test_a_golden_without_its_prompts_is_refused():
    """Schema 2 stores each prompt; one stripped of them (and scoring the bare continuations) skipped the check."""
    wl, gold = load_workload(), json.loads(GOLDEN.read_text())["data"]
    client = _ServesTheGolden(wl, gold)
    stripped = copy.deepcopy(gold)
    name = next(iter(stripped["streams"]))
    stripped["streams"][name]["prompt"] = []
    with pytest.raises(SuiteError, match=f"golden's '{name}' prompt is not this workload's"):
        run_level2(client, wl, stripped)


# -- a golden belongs to its folder's config ---------------------------------------------------------------------
def test_a_golden_copied_into_another_configs_folder_is_refused_by_name(tmp_path):
    def store(config, regen=False):
        return GoldenStore("tiny", "cpu", config, {"model": "tiny", "config": config, "platform": "cpu", "flavour": "cpu"},
                           regen, root=tmp_path)
    with pytest.raises(Regenerated):
        store("triton-bf16", regen=True).save("level2", {"x": 1})
    dst = store("gemv-bf16").path("level2")
    dst.parent.mkdir(parents=True)
    shutil.copy(store("triton-bf16").path("level2"), dst)
    with pytest.raises(SuiteError, match="recorded for config triton-bf16, this run's is gemv-bf16"):
        store("gemv-bf16").load("level2", "level2")
    assert store("triton-bf16").load("level2", "level2") == {"x": 1}


# -- bad answers are one line ------------------------------------------------------------------------------------
@pytest.mark.parametrize("completion", [{"choices": [{"text": "x", "logprobs": None}]}, {"choices": []}, {}])
def test_a_completion_without_logprobs_is_one_line(completion):
    with pytest.raises(SuiteError, match="without per-token logprobs") as e:
        Stream.from_completion(completion, [1])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("data, why", [
    ({"n": 30, "correct": 0, "accuracy": 0.0}, "cannot fail"),
    ({"n": 30, "correct": 1, "accuracy": 1 / 30}, "cannot fail"),
    ({"n": 30, "correct": 3, "accuracy": 0.9}, "is not correct / n"),
    ({"n": 30, "accuracy": 0.7}, "KeyError"),
    ({"n": float("inf"), "correct": 21, "accuracy": 0.7}, "OverflowError"),  # `"n": Infinity` in the JSON: a traceback
])
def test_a_tasks_golden_whose_floor_cannot_fail_or_does_not_add_up_is_malformed(data, why):
    """accuracy 0 gave a floor of -0.033, which no run can fall below."""
    from harness.correctness.chat import check_tasks_golden

    with pytest.raises(SuiteError, match=why):
        check_tasks_golden(data, "golden tasks.json")


def test_the_committed_tasks_goldens_hold_floors_that_can_fail():
    from harness.correctness.chat import accuracy_floor, check_tasks_golden

    for path in (REPO / "goldens").glob("*/*/*/tasks.json"):
        data = check_tasks_golden(json.loads(path.read_text())["data"], str(path))
        assert 0 < accuracy_floor(data) < data["accuracy"]


def test_a_golden_recorded_with_extra_server_args_does_not_judge_a_plain_run(tmp_path):
    """`--force-regen --server-arg=--dtype=float32` wrote the config's golden, and later plain runs were judged by it."""
    meta = {"model": "tiny", "config": "cpu-bf16", "platform": "cpu", "flavour": "cpu"}

    def store(args, regen=False):
        return GoldenStore("tiny", "cpu", "cpu-bf16", {**meta, "server_args": args}, regen, root=tmp_path)
    with pytest.raises(Regenerated):
        store(["--dtype=float32"], regen=True).save("level2", {"x": 1})
    with pytest.raises(SuiteError, match=r"recorded with --server-arg --dtype=float32 \(this run: none\)"):
        store([]).load("level2", "level2")
    assert store(["--dtype=float32"]).load("level2", "level2") == {"x": 1}
    # a golden of the plain config may judge a run with extra flags (an experiment against stock's numbers)
    with pytest.raises(Regenerated):
        store([], regen=True).save("level2", {"x": 2})
    assert store(["--moe-backend=marlin"]).load("level2", "level2") == {"x": 2}


def test_a_comparison_runs_copy_does_not_claim_a_checked_kernel_path(tmp_path):
    """The obtained copies of a `-m level2` run (no level 1.5, no refusal asked) said "level 1.5 passed"."""
    meta = {"model": "tiny", "config": "cpu-bf16", "platform": "cpu", "flavour": "cpu", "kernel_path": "level 1.5 passed"}
    run = tmp_path / "run"
    store = GoldenStore("tiny", "cpu", "cpu-bf16", meta, False, root=tmp_path / "goldens", run_dir=run)
    store.settle("chat", {"x": 1}, {"x": 2})
    copy_meta = json.loads(next(run.rglob("chat.json")).read_text())["meta"]
    assert copy_meta["kernel_path"].startswith("not checked")
    with pytest.raises(Regenerated):
        GoldenStore("tiny", "cpu", "cpu-bf16", meta, True, root=tmp_path / "goldens", run_dir=run).settle("chat", None, {"x": 3})
    assert json.loads((tmp_path / "goldens" / "tiny" / "cpu" / "cpu-bf16" / "chat.json").read_text())["meta"]["kernel_path"] == "level 1.5 passed"


@pytest.mark.parametrize("change, why", [
    ({"prompts": {}}, "prompts` must name at least one non-empty text"),
    ({"prompts": {"short": "  "}}, "prompts` must name at least one non-empty text"),
    ({"max_tokens": 1}, "max_tokens 1 < 8"),
    ({"top_logprobs": 1}, "top_logprobs 1 is outside 2..20"),
    ({"top_logprobs": 50}, "top_logprobs 50 is outside 2..20"),
    ({"perplexity_text": ""}, "perplexity_text is empty"),
    ({"prompts": ["a", "b"]}, "malformed level 2 workload"),
])
def test_a_workload_that_disarms_a_rule_is_one_line_naming_the_file(tmp_path, change, why):
    raw = yaml.safe_load((REPO / "tests" / "level2_correctness" / "prompts.yaml").read_text())
    bad = tmp_path / "prompts.yaml"
    bad.write_text(yaml.safe_dump({**raw, **change}, sort_keys=False))
    with pytest.raises(SuiteError) as e:
        load_workload(bad)
    assert why in str(e.value) and str(bad) in str(e.value) and "\n" not in str(e.value)
    # A/A: the committed workloads load (level 2's, and level 6's that borrows its tolerances)
    assert load_workload().max_tokens == 32
    assert load_workload(REPO / "tests" / "level6_matrix" / "workload.yaml").top_k == 5


# -- the chat path: harmony checks, the chat golden's comparison, structure and task accuracy (mutation audit) ----
def _harmony_ids(text: str) -> list[int]:
    from harness.correctness.chat import _harmony_encoding

    return _harmony_encoding().encode(text, allowed_special="all")


ANSWER = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Paris<|return|>"


class _ChatServer:
    """A /v1/chat/completions stand-in: answers each request with the next (message, token ids, finish_reason)."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def chat(self, messages, max_tokens, **params):
        msg, ids, finish = self.answers.pop(0)
        lp = None if ids is None else {"content": [{"token": f"token_id:{t}", "logprob": -0.01,
                                                    "top_logprobs": [{"token": f"token_id:{t}", "logprob": -0.01}]}
                                                   for t in ids]}
        return {"choices": [{"message": msg, "finish_reason": finish, "logprobs": lp}]}


def test_an_answer_cut_mid_message_is_a_harmony_error_unless_it_ran_out_of_tokens():
    """Guards the finish_reason test of harmony_problems: an answer that stops mid-message ("stop") is a parse error,
    while one cut by max_tokens ("length") may stop anywhere; a flipped test reported every truncated answer."""
    from harness.correctness.chat import harmony_problems

    ids = _harmony_ids(ANSWER)
    assert harmony_problems(ids, "stop") == [], "a well-formed answer must parse"
    cut = ids[:6]  # stops inside the second message's header
    assert any("at the end of the answer" in p for p in harmony_problems(cut, "stop")), "a stop mid-message must fail"
    assert harmony_problems(cut, "length") == [], "an answer cut by max_tokens may stop anywhere"


def test_ask_reports_missing_token_ids_leaked_markup_and_non_json_tool_arguments():
    """Guards ask()'s client-side checks: a server that returns no logprobs.content cannot be checked (said, not
    passed); harmony markup leaking into content is a parse error (vLLM 0.32 skips bad tokens silently)."""
    from harness.correctness.chat import ask

    ok = {"content": "Paris", "reasoning": "think", "tool_calls": []}
    a = ask(_ChatServer((ok, _harmony_ids(ANSWER), "stop")), [{"role": "user", "content": "q"}], 32)
    assert a.parse_errors == [] and a.stream is not None, a.parse_errors
    a = ask(_ChatServer((ok, None, "stop")), [{"role": "user", "content": "q"}], 32)
    assert any("no output token ids" in e for e in a.parse_errors), f"no ids must be a parse error: {a.parse_errors}"
    leaked = {**ok, "content": "Paris<|end|><|start|>assistant"}
    a = ask(_ChatServer((leaked, _harmony_ids(ANSWER), "stop")), [{"role": "user", "content": "q"}], 32)
    assert any("markup leaked into content" in e for e in a.parse_errors), f"leaked markup must fail: {a.parse_errors}"
    call = {**ok, "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}
    a = ask(_ChatServer((call, _harmony_ids(ANSWER), "stop")), [{"role": "user", "content": "q"}], 32)
    assert any("not JSON" in e for e in a.parse_errors), a.parse_errors


def test_a_chat_golden_without_a_parsed_field_is_malformed():
    """Guards check_chat_golden's field check: a golden entry lacking finish_reason loaded, then chat_problems
    crashed with a KeyError traceback when the tokens matched."""
    from harness.correctness.chat import check_chat_golden

    entry = {"stream": Stream([5], [-0.1], [{5: -0.1}], "x").to_json(), "content": "x", "reasoning": None,
             "tool_calls": []}
    with pytest.raises(SuiteError, match="malformed.*KeyError"):
        check_chat_golden({"q": entry}, "goldens/x/chat.json")
    assert check_chat_golden({"q": {**entry, "finish_reason": "stop"}}, "goldens/x/chat.json")


def test_chat_answers_are_judged_against_their_golden_field_by_field():
    """Guards chat_problems: a conversation with no golden is a problem, not skipped; with the golden's very tokens,
    a field the server parsed differently (vLLM's harmony parser regressed) is a problem too."""
    from harness.correctness.chat import ChatAnswer, chat_golden_data, chat_problems

    stream = Stream([5, 6], [-0.1, -0.2], [{5: -0.1, 9: -3.0}, {6: -0.2, 9: -3.0}], "ab")
    gold = ChatAnswer("ab", "r", [], "stop", stream)
    golden = chat_golden_data({"q": gold})
    assert chat_problems({"q": gold}, golden, TOL) == ([], []), "an identical answer must pass"
    problems, _ = chat_problems({"other": gold}, golden, TOL)
    assert problems and "has no chat golden" in problems[0], f"a missing golden must be a problem: {problems}"
    misparsed = ChatAnswer("b", "ra", [], "stop", stream)
    problems, _ = chat_problems({"q": misparsed}, golden, TOL)
    assert any("same tokens as the golden but content" in p for p in problems), f"a misparse must fail: {problems}"


def test_structure_checks_want_the_tool_the_reasoning_and_the_content_pattern():
    """Guards structure_problems: the expected tool call, separated reasoning and the content regex each fail when
    missing (a flipped test passed answers without them and failed correct ones)."""
    from harness.correctness.chat import ChatAnswer, Conversation, structure_problems

    call = [{"function": {"name": "get_weather", "arguments": "{}"}}]
    tool = Conversation("t", [], None, {"tool": "get_weather"})
    assert structure_problems(tool, ChatAnswer(None, "r", call, "tool_calls", None)) == []
    assert structure_problems(tool, ChatAnswer("it is sunny", "r", [], "stop", None)), "no tool call must fail"
    conv = Conversation("c", [], None, {"reasoning": True, "content": r"\bParis\b"})
    assert structure_problems(conv, ChatAnswer("Paris.", "think", [], "stop", None)) == []
    assert any("no reasoning" in p for p in structure_problems(conv, ChatAnswer("Paris.", None, [], "stop", None)))
    assert any("does not match" in p for p in structure_problems(conv, ChatAnswer("Rome.", "think", [], "stop", None)))


def test_task_answers_are_marked_by_their_rule():
    """Guards correct(): a tool call must carry the expected arguments, not just the name; `contains` looks for the
    answer in the content (reversed, a one-word content inside the answer passed)."""
    from harness.correctness.chat import Task, correct

    t = Task([], "", tool={"name": "get_weather", "arguments": {"city": "Paris"}})
    call = lambda args: [{"function": {"name": "get_weather", "arguments": args}}]  # noqa: E731
    assert correct(t, None, call('{"city": "Paris"}'))
    assert not correct(t, None, call('{"city": "Rome"}')), "wrong arguments must be wrong"
    contains = Task([], "Paris is the capital", match="contains")
    assert correct(contains, "Indeed, paris is the capital.")
    assert not correct(contains, "Paris"), "content that is a part of the answer does not contain it"
    assert correct(Task([], "Paris"), " paris. ") and not correct(Task([], "Paris"), "Rome")


def test_a_harmony_parse_error_counts_as_a_wrong_task_answer():
    """Guards run_tasks: an answer whose tokens the harmony grammar rejects is wrong even when its content matches."""
    from harness.correctness.chat import Task, run_tasks

    ids = _harmony_ids(ANSWER)
    msg = {"content": "Paris", "reasoning": "think", "tool_calls": []}
    server = _ChatServer((msg, ids, "stop"), (msg, ids[:6], "stop"))
    tasks = [Task([{"role": "user", "content": "q"}], "Paris")] * 2
    r = run_tasks(server, tasks, 32)
    assert (r.n, r.correct, r.parse_errors) == (2, 1, 1), r


def test_a_tasks_golden_with_no_tasks_or_a_perfect_score_judges_sensibly():
    """Guards check_tasks_golden's n <= 0 (n = 0 was a ZeroDivisionError traceback) and accuracy_floor's one-answer
    minimum: a perfect score (p = 1, no binomial spread) still lets one answer flip."""
    from harness.correctness.chat import accuracy_floor, check_tasks_golden

    with pytest.raises(SuiteError, match="malformed"):
        check_tasks_golden({"n": 0, "correct": 0, "accuracy": 0.0}, "golden tasks.json")
    assert accuracy_floor({"n": 30, "accuracy": 1.0}) == pytest.approx(1 - 1 / 30), "one answer may flip at p = 1"


def test_task_sets_and_their_model_globs(tmp_path, monkeypatch):
    """Guards load_tasks (a line with neither an answer nor a tool call is refused: it could never be right) and
    tasks_for (the alias is matched against the glob, not the other way round)."""
    from harness.correctness.chat import ChatWorkload, load_tasks

    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "q"}], "answer": "a"}\n{"messages": []}\n')
    with pytest.raises(SuiteError, match="line 2 is not a task"):
        load_tasks(bad)
    monkeypatch.delenv("SUITE_TASKS", raising=False)
    wl = ChatWorkload([], 8, 5, {"gpt-oss-*": tmp_path / "a.jsonl", "*": tmp_path / "b.jsonl"}, 8, tmp_path / "chat.yaml")
    assert wl.tasks_for("gpt-oss-20b") == tmp_path / "a.jsonl", "the first glob matching the alias wins"
    assert wl.tasks_for("tiny-gpt-oss") == tmp_path / "b.jsonl"


@pytest.mark.parametrize("line, said", [
    ('{"messages": [], "answer": "(Paris", "match": "regex"}', "answer /(Paris/ is not a regular expression"),
    ('{"messages": [], "answer": "Paris", "match": "regx"}', "match 'regx' is none of exact, contains, regex"),
])
def test_a_task_with_a_bad_pattern_or_rule_is_refused_when_the_set_loads(tmp_path, line, said):
    """A regex answer that does not compile raised re.error as a traceback from correct(), after the server booted;
    an unknown match rule was judged as "exact" in silence. Both are one line naming the file and line at load."""
    from harness.correctness.chat import load_tasks

    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"messages": [], "answer": "a"}\n' + line + "\n")
    with pytest.raises(SuiteError, match="line 2 is not a task") as e:
        load_tasks(bad)
    assert said in str(e.value) and str(bad) in str(e.value) and "\n" not in str(e.value), e.value
    ok = tmp_path / "ok.jsonl"  # A/A: a valid pattern and every known rule load
    ok.write_text("".join(f'{{"messages": [], "answer": "P(aris)?", "match": "{m}"}}\n' for m in ("exact", "contains", "regex")))
    assert [t.match for t in load_tasks(ok)] == ["exact", "contains", "regex"]


def test_a_conversation_whose_content_pattern_does_not_compile_is_refused_when_the_workload_loads(tmp_path):
    """expect.content is a regex searched in every answer: a bad one raised re.error from structure_problems mid-run."""
    import shutil

    from harness.correctness.chat import CHAT_FILE, load_chat_workload

    path = tmp_path / "chat.yaml"
    shutil.copy(CHAT_FILE, path)
    assert load_chat_workload(path).conversations  # A/A: the committed workload loads
    path.write_text(CHAT_FILE.read_text().replace('content: "Paris"}', 'content: "Par(is"}'))
    with pytest.raises(SuiteError, match=r"malformed chat workload .*expect.content /Par\(is/ is not a regular expression"):
        load_chat_workload(path)


def test_a_conversation_whose_content_pattern_is_not_text_is_refused_when_the_workload_loads(tmp_path):
    """A number or list as expect.content passed the load when it was turned into text first, then failed in re.search."""
    from harness.correctness.chat import CHAT_FILE, load_chat_workload

    path = tmp_path / "chat.yaml"
    path.write_text(CHAT_FILE.read_text().replace('content: "Paris"}', 'content: [Paris]}'))
    with pytest.raises(SuiteError, match=r"malformed chat workload \(TypeError"):
        load_chat_workload(path)
