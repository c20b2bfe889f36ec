"""Level 2 workload and checks: greedy token streams and perplexity against a golden.

Tolerances (used by tests/level2_correctness/prompts.yaml):
- near tie, 0.125 nats: BF16 keeps 8 significant bits, so a logit between 16 and 32 moves in steps of
  0.125. A different summation order (threads, batch shape, kernel) can flip the argmax only when the
  top two logits are within about one such step; a wider gap that flips means the model changed.
- perplexity, 1% relative: reordered BF16 arithmetic perturbs each token's logprob by ~1e-3 nats and
  not systematically, so the mean over ~1000 tokens moves far less than 1%; the mutation checks
  (router biased, expert scales off by one exponent) move it by much more (tests/level2_correctness).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.client import Client
from harness.errors import SuiteError
from harness.goldens import Stream, compare_streams, perplexity

REPO = Path(__file__).resolve().parent.parent
PROMPTS_FILE = REPO / "tests" / "level2_correctness" / "prompts.yaml"


@dataclass
class Workload:
    prompts: dict[str, str]
    max_tokens: int
    top_k: int
    near_tie_nats: float
    perplexity_rel_tol: float
    perplexity_text: str


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


def load_workload(path: Path = PROMPTS_FILE) -> Workload:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        return Workload(
            {k: _text(v, f"{path}: prompts.{k}") for k, v in raw["prompts"].items()},
            int(raw["max_tokens"]), int(raw["top_logprobs"]), float(raw["near_tie_nats"]),
            float(raw["perplexity_rel_tol"]), _text(raw["perplexity_text"], f"{path}: perplexity_text"),
        )
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as e:
        raise SuiteError(f"{path}: malformed level 2 workload ({type(e).__name__}: {e}); fix the file") from None


def greedy_stream(client: Client, prompt: str | list[int], wl: Workload) -> Stream:
    out = client.complete(prompt, wl.max_tokens, logprobs=wl.top_k, return_tokens_as_token_ids=True)
    return Stream.from_completion(out)


def greedy_streams(client: Client, wl: Workload) -> dict[str, Stream]:
    return {name: greedy_stream(client, text, wl) for name, text in wl.prompts.items()}


def measure_perplexity(client: Client, text: str) -> tuple[float, int]:
    ids = client.tokenize(text)
    out = client.complete(ids, 1, prompt_logprobs=0)
    return perplexity(out["choices"][0]["prompt_logprobs"], ids), len(ids)


@dataclass
class Level2Result:
    streams: dict[str, Stream]
    perplexity: float
    perplexity_tokens: int

    def to_golden(self) -> dict:
        return {"streams": {k: s.to_json() for k, s in self.streams.items()},
                "perplexity": {"value": self.perplexity, "tokens": self.perplexity_tokens}}


def run_level2(client: Client, wl: Workload) -> Level2Result:
    ppl, n = measure_perplexity(client, wl.perplexity_text)
    return Level2Result(greedy_streams(client, wl), ppl, n)


def stream_problems(result: Level2Result, golden: dict, wl: Workload) -> tuple[list[str], list[str]]:
    """(problems, notes) of the token streams against the golden."""
    problems, notes = [], []
    gold_streams = golden["streams"]
    for name, stream in result.streams.items():
        if name not in gold_streams:
            problems.append(f"prompt '{name}' has no golden stream (regenerate the golden)")
            continue
        gold = Stream.from_json(gold_streams[name])
        v = compare_streams(gold, stream, wl.near_tie_nats)
        if not v.ok:
            i = v.position or 0
            problems.append(f"'{name}' {v.message}\n      golden: {gold.text!r}\n      new:    {stream.text!r}")
        elif not v.identical:
            notes.append(f"'{name}' {v.message}")
    return problems, notes


def perplexity_problem(result: Level2Result, golden: dict, wl: Workload) -> str | None:
    want = float(golden["perplexity"]["value"])
    rel = abs(result.perplexity - want) / want
    if not math.isfinite(result.perplexity) or rel > wl.perplexity_rel_tol:
        return (f"perplexity {result.perplexity:.4f} vs golden {want:.4f} over {result.perplexity_tokens} tokens: "
                f"{rel * 100:.2f}% off (tolerance {wl.perplexity_rel_tol * 100:.1f}%)")
    return None
