"""Level 2 workload and checks: greedy streams and teacher-forced scorings against a golden.

A level 2 run does three things on a server (rules and their reasons: harness/correctness/logprobs.py):
1. greedy streams of the workload's prompts (free-running, top-k logprobs per token);
2. teacher-forced scorings (`prompt_logprobs=k`) of the reference sequences: the golden's prompt +
   greedy continuation of every prompt when a golden is given, else this run's own (what a new golden
   stores); and of the held-out perplexity text;
3. the perplexity of that text, from its scoring.
Tolerances come from the workload file, per platform, each with the measurements behind it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from harness.core.errors import SuiteError
from harness.core.paths import REPO
from harness.core.platform import best_selector, is_valid_selector
from harness.core.yamlfile import load_mapping
from harness.correctness.logprobs import (
    MIN_MEAN_POSITIONS,
    Scored,
    Stream,
    Tolerance,
    compare_scored,
    compare_streams,
    perplexity_problem,
)
from harness.engine.client import Client

PROMPTS_FILE = REPO / "tests" / "level2_correctness" / "prompts.yaml"
PERPLEXITY = "perplexity_text"  # the key of the held-out text's scoring


@dataclass
class Workload:
    prompts: dict[str, str]
    max_tokens: int
    top_k: int
    perplexity_text: str
    tolerances: dict[str, Tolerance]  # platform selector -> tolerance: the most specific match, else `default`
    path: Path

    def tolerance(self, platform_name: str) -> Tolerance:
        selector = best_selector([s for s in self.tolerances if s != "default"], platform_name)
        if selector is None and "default" in self.tolerances:
            selector = "default"
        if selector is not None:
            return self.tolerances[selector]
        raise SuiteError(f"{self.path}: no tolerance for platform {platform_name}; add it (or `default`) under `tolerances:`")


def _text(spec, where: str) -> str:
    if isinstance(spec, str):
        return spec
    if isinstance(spec, dict) and "repeat" in spec:
        return str(spec["repeat"]) * int(spec.get("times", 1))
    if isinstance(spec, dict) and "file" in spec:
        path = REPO / spec["file"]
        if not path.is_file():
            raise SuiteError(f"{where}: {path} is missing; restore it from git")
        text = path.read_text(encoding="utf-8")
        return text[: int(spec["chars"])] if "chars" in spec else text
    raise SuiteError(f"{where}: expected a string, {{repeat, times}} or {{file, chars}}")


_TOL_KEYS = {"max_abs", "mean_abs", "ppl_rel", "margin"}
_TOL_ALLOWED = _TOL_KEYS | {"measured"}


def _tolerances(raw, where: str) -> dict[str, Tolerance]:
    if not isinstance(raw, dict) or not raw:
        raise SuiteError(f"{where}: `tolerances` must map platform selectors (or `default`) to {sorted(_TOL_KEYS)}")
    out = {}
    for selector, spec in raw.items():
        selector = str(selector)
        if selector != "default" and not is_valid_selector(selector):
            raise SuiteError(f"{where}: tolerances: '{selector}' is not a platform selector (cpu, sm_90, sm_12x, >=sm_80, default)")
        if not isinstance(spec, dict) or not _TOL_KEYS <= set(spec) or set(spec) - _TOL_ALLOWED:
            raise SuiteError(f"{where}: tolerances.{selector} needs {sorted(_TOL_KEYS)} (and `measured:` saying where they come from)")
        values = {k: float(spec[k]) for k in _TOL_KEYS}
        if not all(v > 0 for v in values.values()):
            raise SuiteError(f"{where}: tolerances.{selector}: every tolerance must be > 0")
        measured = str(spec.get("measured") or "")
        out[selector] = Tolerance(**values, source=f"{Path(where).name} tolerances.{selector}; {measured or 'no measurement recorded'}")
    return out


def load_workload(path: Path = PROMPTS_FILE) -> Workload:
    """A level 2 style workload. `tolerances: {same_as: <workload file>}` takes another file's
    tolerances (level 6 judges with level 2's measured ones: one set of numbers)."""
    try:
        raw = load_mapping(path, fix="restore it from git or fix the file")
        tol = raw.get("tolerances")
        if isinstance(tol, dict) and set(tol) == {"same_as"}:
            other = REPO / str(tol["same_as"])
            if other.resolve() == path.resolve():
                raise SuiteError(f"{path}: tolerances.same_as names the file itself")
            tolerances = load_workload(other).tolerances
        else:
            tolerances = _tolerances(tol, str(path))
        wl = Workload(
            {k: _text(v, f"{path}: prompts.{k}") for k, v in raw["prompts"].items()},
            int(raw["max_tokens"]), int(raw["top_logprobs"]),
            _text(raw["perplexity_text"], f"{path}: perplexity_text"), tolerances, path,
        )
    except OSError as e:
        raise SuiteError(f"{path}: cannot read the level 2 workload ({e.strerror}); restore it from git") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SuiteError(f"{path}: malformed level 2 workload ({type(e).__name__}: {e}); fix the file") from None
    problem = _workload_problem(wl)
    if problem:
        raise SuiteError(f"{path}: {problem}; fix the file (or restore it from git)")
    return wl


def _workload_problem(wl: Workload) -> str | None:
    """Bounds under which a workload's rules can still fail: each was a way to a level 2 that passes anything."""
    if not wl.prompts or not all(t.strip() for t in wl.prompts.values()):
        return "`prompts` must name at least one non-empty text: without streams no decode-only fault is judged"
    if wl.max_tokens < MIN_MEAN_POSITIONS:
        return (f"max_tokens {wl.max_tokens} < {MIN_MEAN_POSITIONS}: the streams' mean rule (a systematic shift in "
                f"decode) needs {MIN_MEAN_POSITIONS} matching positions to act")
    if not 2 <= wl.top_k <= 20:
        return (f"top_logprobs {wl.top_k} is outside 2..20: the top-k rules need a runner-up, and vLLM refuses more "
                "than its --max-logprobs (20 by default)")
    if not wl.perplexity_text.strip():
        return "perplexity_text is empty: perplexity would be judged over no tokens"
    return None


def greedy_stream(client: Client, prompt: str | list[int], wl: Workload) -> Stream:
    ids = client.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    out = client.complete(ids, wl.max_tokens, logprobs=wl.top_k, return_tokens_as_token_ids=True)
    return Stream.from_completion(out, ids)


def score(client: Client, ids: list[int], k: int) -> Scored:
    """Teacher forcing: the server's logprob of every token of `ids` given the ones before, with its top-k."""
    out = client.complete(ids, 1, prompt_logprobs=k)
    raw = (out.get("choices") or [{}])[0].get("prompt_logprobs")
    if not isinstance(raw, list):
        raise SuiteError("the server returned no prompt_logprobs for a completion with prompt_logprobs set: level 2 "
                         "teacher forcing needs them (vLLM has them; other servers may not)")
    return Scored.from_prompt_logprobs(ids, raw, k)


@dataclass
class Level2Result:
    streams: dict[str, Stream]
    scored: dict[str, Scored]  # prompt name (and PERPLEXITY) -> scoring of the reference sequence
    reference: str  # "golden" (the golden's sequences were scored) or "self" (this run's own)

    @property
    def perplexity(self) -> float:
        return self.scored[PERPLEXITY].perplexity()

    @property
    def perplexity_tokens(self) -> int:
        return len(self.scored[PERPLEXITY].ids) - 1

    def to_golden(self) -> dict:
        if self.reference != "self":
            raise SuiteError("a golden can only be written from a run that scored its own sequences (--force-regen)")
        return {k: v for k, v in self.to_json().items() if k != "reference"}

    def to_json(self) -> dict:
        """What this run measured (the run directory's obtained copy): streams, scorings, and whose sequences were
        scored (`golden`: the golden's, as a comparison run does; `self`: its own, as --force-regen does)."""
        return {"reference": self.reference, "streams": {k: s.to_json() for k, s in self.streams.items()},
                "scored": {k: s.to_json() for k, s in self.scored.items()},
                "perplexity": {"value": self.perplexity, "tokens": self.perplexity_tokens}}

    @classmethod
    def from_golden(cls, data: dict, reference: str = "self") -> "Level2Result":
        return cls({k: Stream.from_json(v) for k, v in data["streams"].items()},
                   {k: Scored.from_json(v) for k, v in data["scored"].items()}, reference)


def check_golden_data(data: object, where: str, prompts: Iterable[str] | None = None) -> dict:
    """The golden's `data` has what level 2 needs; else one line naming the file and the fix.

    Every stream and scoring is well formed (Stream / Scored.check_json: consistent lengths, finite numbers),
    and there is one stream and one scoring per prompt (those of `prompts`, the workload's, when given): a
    prompt without its scoring would have its teacher-forced checks skipped without a word. Each scoring covers
    what the golden recorded (a prompt's ids + continuation; every token of the perplexity text it counts)."""
    try:
        if not isinstance(data, dict):
            raise TypeError("data is not a mapping")
        for key in ("streams", "scored", "perplexity"):
            if key not in data:
                raise KeyError(key)
        if PERPLEXITY not in data["scored"]:
            raise KeyError(f"scored.{PERPLEXITY}")
        for section, check in (("streams", Stream.check_json), ("scored", Scored.check_json)):
            for name, entry in data[section].items():
                try:
                    check(entry)
                except ValueError as e:
                    raise ValueError(f"{section}.{name}: {e}") from None
        streamed, scored = set(data["streams"]), set(data["scored"]) - {PERPLEXITY}
        wanted = set(prompts) if prompts is not None else streamed | scored
        for section, have in (("streams", streamed), ("scored", scored)):
            if have != wanted:
                missing, extra = sorted(wanted - have), sorted(have - wanted)
                raise ValueError(f"{section} must hold one entry per prompt of the workload ({', '.join(sorted(wanted))})"
                                 + (f"; missing {', '.join(missing)}" if missing else "")
                                 + (f"; not in the workload: {', '.join(extra)}" if extra else ""))
        # A golden scores what it recorded (to_golden): each prompt's ids + its greedy continuation, and the held-out
        # text whose token count it states. A consistently truncated scoring (ids: [first id]) passed the checks
        # above and left teacher forcing nothing to judge.
        for name in streamed:
            stream = data["streams"][name]
            if data["scored"][name]["ids"] != list(stream.get("prompt") or []) + stream["tokens"]:
                raise ValueError(f"scored.{name}.ids ({len(data['scored'][name]['ids'])} ids) are not the stream's prompt "
                                 f"+ continuation ({len(stream.get('prompt') or []) + len(stream['tokens'])} ids)")
        ppl_ids = len(data["scored"][PERPLEXITY]["ids"])
        if ppl_ids < 2 or data["perplexity"].get("tokens") != ppl_ids - 1:
            raise ValueError(f"scored.{PERPLEXITY} holds {ppl_ids} ids for perplexity.tokens "
                             f"{data['perplexity'].get('tokens')!r} (one scored position per token after the first)")
        Level2Result.from_golden(data)
        if not math.isfinite(float(data["perplexity"]["value"])):
            raise ValueError(f"perplexity.value is {data['perplexity']['value']!r}")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SuiteError(f"{where} is malformed ({type(e).__name__}: {e}); restore it from git or regenerate it with --force-regen") from None
    return data


def run_level2(client: Client, wl: Workload, reference: dict | None = None) -> Level2Result:
    """Greedy streams, and scorings of `reference`'s sequences (a golden's data) or, without one, of this run's."""
    streams = {name: greedy_stream(client, text, wl) for name, text in wl.prompts.items()}
    if reference is not None:
        # the golden's sequences must be this workload's: a consistently truncated held-out text (2 ids, tokens: 1)
        # passed its own checks and judged perplexity over one token; a golden without prompts scored bare continuations
        held_out = client.tokenize(wl.perplexity_text)
        if list(reference["scored"][PERPLEXITY]["ids"]) != held_out:
            raise SuiteError(f"the golden scores another held-out text than the workload's ({len(reference['scored'][PERPLEXITY]['ids'])} "
                             f"vs {len(held_out)} tokens): truncated, or recorded before the text changed; regenerate it "
                             "with --force-regen")
        for name, stream in streams.items():
            recorded = list((reference["streams"].get(name) or {}).get("prompt") or [])
            if recorded != stream.prompt:
                raise SuiteError(f"the golden's '{name}' prompt is not this workload's ({len(recorded)} vs "
                                 f"{len(stream.prompt)} tokens): missing, truncated, or of another prompt text; "
                                 "regenerate it with --force-regen")
        sequences = {name: list(entry["ids"]) for name, entry in reference["scored"].items()}
    else:
        sequences = {name: s.prompt + s.tokens for name, s in streams.items()}
        sequences[PERPLEXITY] = client.tokenize(wl.perplexity_text)
    scored = {name: score(client, ids, wl.top_k) for name, ids in sequences.items()}
    return Level2Result(streams, scored, "golden" if reference is not None else "self")


def stream_problems(result: Level2Result, ref: Level2Result, tol: Tolerance) -> tuple[list[str], list[str]]:
    """(problems, notes) of the free-running greedy streams against the reference's."""
    problems, notes = [], []
    for name, stream in result.streams.items():
        if name not in ref.streams:
            problems.append(f"prompt '{name}' has no golden stream (regenerate the golden)")
            continue
        gold = ref.streams[name]
        if gold.prompt and stream.prompt != gold.prompt:
            problems.append(f"'{name}': the prompt tokenizes differently from the golden's; regenerate the golden")
            continue
        v = compare_streams(gold, stream, tol)
        if not v.ok:
            problems.append(f"'{name}' stream {v.message}\n      golden: {gold.text!r}\n      new:    {stream.text!r}")
        elif not v.identical:
            notes.append(f"'{name}' stream {v.message}")
    return problems, notes


def scored_problems(result: Level2Result, ref: Level2Result, tol: Tolerance) -> tuple[list[str], list[str]]:
    """(problems, per-sequence summaries) of the teacher-forced scorings against the reference's."""
    problems, notes = [], []
    for name, gold in ref.scored.items():
        new = result.scored.get(name)
        if new is None:
            problems.append(f"'{name}': not scored by this run")
            continue
        diff = compare_scored(gold, new, tol, f"'{name}' teacher-forced")
        notes.append(f"'{name}' teacher-forced: {diff.summary()}")
        problems += diff.problems
    return problems, notes


def ppl_problem(result: Level2Result, ref: Level2Result, tol: Tolerance) -> str | None:
    return perplexity_problem(ref.perplexity, result.perplexity, result.perplexity_tokens, tol)


def tolerance_line(tol: Tolerance) -> str:
    return (f"tolerances: max_abs {tol.max_abs}, mean_abs {tol.mean_abs}, ppl_rel {tol.ppl_rel}, "
            f"near-tie margin {tol.margin} (from {tol.source})")


@dataclass
class Level2Verdict:
    problems: list[str]
    notes: list[str]  # accepted near ties and per-sequence summaries

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(result: Level2Result, golden: dict, tol: Tolerance) -> Level2Verdict:
    """Every rule of harness/correctness/logprobs.py at once: streams, teacher-forced scorings, perplexity."""
    ref = Level2Result.from_golden(golden)
    streams, stream_notes = stream_problems(result, ref, tol)
    scored, scored_notes = scored_problems(result, ref, tol)
    ppl = ppl_problem(result, ref, tol)
    problems = streams + scored + ([ppl] if ppl else [])
    if problems:
        problems.append(f"({tolerance_line(tol)})")
    return Level2Verdict(problems, stream_notes + scored_notes)
