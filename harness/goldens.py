"""Level 2 goldens: greedy token streams with top-k logprobs, and perplexity, as data files.

Files live at `goldens/<model>/<platform>/<config>/<kind>.json` with metadata (vLLM version, device,
date). Semantics follow pytest-regressions: a missing golden fails with the command that creates it;
`--force-regen` rewrites it and fails so a regenerated file is never mistaken for a passing check.

Token streams are compared with logprob-aware rules: identical tokens pass; at the first divergence,
each side's token must be in the other's top-k AND the golden's top-1/top-2 margin must be small (a
near tie, where a change in summation order may legitimately flip the argmax). After an accepted
divergence the contexts differ, so the rest of the stream is not compared.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import SuiteError

REPO = Path(__file__).resolve().parent.parent
GOLDEN_ROOT = REPO / "goldens"
SCHEMA = 1


@dataclass
class Stream:
    """A greedy completion: token ids, their logprobs and the top-k alternatives per position."""

    tokens: list[int]
    logprobs: list[float]
    top: list[dict[int, float]]  # per position: token id -> logprob (top-k)
    text: str

    def to_json(self) -> dict:
        return {"tokens": self.tokens, "logprobs": self.logprobs, "text": self.text,
                "top": [{str(k): v for k, v in t.items()} for t in self.top]}

    @classmethod
    def from_json(cls, d: dict) -> "Stream":
        return cls(list(d["tokens"]), list(d["logprobs"]), [{int(k): float(v) for k, v in t.items()} for t in d["top"]], d["text"])

    @classmethod
    def from_completion(cls, completion: dict) -> "Stream":
        """Parse a /v1/completions answer made with `logprobs=k, return_tokens_as_token_ids=True`."""
        lp = completion["choices"][0]["logprobs"]
        tokens = [_token_id(t) for t in lp["tokens"]]
        top = [{_token_id(k): float(v) for k, v in (alts or {}).items()} for alts in lp["top_logprobs"]]
        return cls(tokens, [float(x) for x in lp["token_logprobs"]], top, completion["choices"][0]["text"])


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise SuiteError(f"expected 'token_id:N' tokens (request with return_tokens_as_token_ids=true), got {token!r}")
    return int(token.split(":", 1)[1])


@dataclass
class StreamVerdict:
    ok: bool
    identical: bool
    position: int | None  # first divergence
    message: str


def compare_streams(golden: Stream, new: Stream, max_margin: float) -> StreamVerdict:
    """Apply the logprob-aware rules; `max_margin` is the largest top1-top2 gap (nats) called a near tie."""
    n = min(len(golden.tokens), len(new.tokens))
    for i in range(n):
        g, t = golden.tokens[i], new.tokens[i]
        if g == t:
            continue
        in_golden_topk = t in golden.top[i]
        in_new_topk = g in new.top[i]
        ranked = sorted(golden.top[i].values(), reverse=True)
        margin = ranked[0] - ranked[1] if len(ranked) > 1 else math.inf
        where = f"position {i}: golden token {g} vs new token {t}"
        if in_golden_topk and in_new_topk and margin <= max_margin:
            return StreamVerdict(True, False, i, f"{where}: accepted near tie (golden top1-top2 margin {margin:.4f} <= {max_margin})")
        why = []
        if not in_golden_topk:
            why.append(f"new token not in golden top-{len(golden.top[i])}")
        if not in_new_topk:
            why.append(f"golden token not in new top-{len(new.top[i])}")
        if margin > max_margin:
            why.append(f"golden margin {margin:.4f} > {max_margin} (not a near tie)")
        return StreamVerdict(False, False, i, f"{where}: {'; '.join(why)}")
    if len(golden.tokens) != len(new.tokens):
        return StreamVerdict(False, False, n, f"lengths differ: golden {len(golden.tokens)} tokens, new {len(new.tokens)}")
    return StreamVerdict(True, True, None, "identical")


class Regenerated(SuiteError):
    """--force-regen wrote a golden or baseline: the test fails so it is never mistaken for a pass."""


def check_or_regen(path: Path, fresh: Any, meta: dict, force_regen: bool, regen_cmd: str) -> dict:
    """The stored golden's data; with --force-regen, write `fresh` instead and raise Regenerated."""
    if force_regen:
        save_golden(path, fresh, meta)
        raise Regenerated(f"--force-regen: wrote {_shown(path)}; re-run without --force-regen to check against it")
    return load_golden(path, regen_cmd)["data"]


def _shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def golden_path(model: str, platform: str, config: str, kind: str, root: Path = GOLDEN_ROOT) -> Path:
    return root / model / platform / config / f"{kind}.json"


def regen_command(level: str, config: str, model: str) -> str:
    return f"pytest -m {level} --config={config} --model={model} --force-regen"


def load_golden(path: Path, regen_cmd: str) -> dict:
    if not path.is_file():
        raise SuiteError(f"no golden at {_shown(path)}; create it with: {regen_cmd}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SuiteError(f"golden {path} is corrupt ({e}); restore it from git or regenerate: {regen_cmd}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or "meta" not in data or "data" not in data:
        raise SuiteError(f"golden {path} lacks schema {SCHEMA} / meta / data; restore it from git or regenerate: {regen_cmd}")
    return data


def save_golden(path: Path, data: Any, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.write_text(json.dumps({"schema": SCHEMA, "meta": meta, "data": data}, indent=1, sort_keys=False) + "\n", encoding="utf-8")


def perplexity(prompt_logprobs: list, prompt_ids: list[int]) -> float:
    """exp(-mean log p(token_i | tokens_<i)) over the prompt, from vLLM's `prompt_logprobs`."""
    total, count = 0.0, 0
    for i, entry in enumerate(prompt_logprobs):
        if entry is None:  # the first token has no context
            continue
        tok = str(prompt_ids[i])
        if tok not in entry:
            raise SuiteError(f"prompt_logprobs at {i} lacks the prompt token {tok}")
        lp = entry[tok]["logprob"] if isinstance(entry[tok], dict) else float(entry[tok])
        if not math.isfinite(lp):
            raise SuiteError(f"non-finite prompt logprob {lp} at position {i}")
        total += lp
        count += 1
    if count == 0:
        raise SuiteError("no prompt logprobs to compute a perplexity from")
    return math.exp(-total / count)
