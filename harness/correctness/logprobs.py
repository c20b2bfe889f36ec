"""Level 2 rules: a run agrees with a golden when its next-token distributions agree, not only its argmax.

Two views of the same model are compared with a golden:

- **Teacher forcing** (the main check). Each golden sequence (prompt + the golden's greedy continuation,
  and the held-out perplexity text) is scored with `prompt_logprobs=k`: at every position the new run's
  logprob of the token the golden saw, and its top-k, are compared with the golden's. Because both runs
  see the same context at every position, a divergence early on never hides the positions after it.
  A position fails when |delta logprob| of a token both sides rank in their top-k exceeds `max_abs`, when
  a token clearly inside one side's top-k (more than `slack` above that side's k-th logprob) is missing
  from the other's, or when the top-1 changed without a near tie on both sides. The run fails when any
  position fails, or when the mean |delta logprob| of the golden tokens exceeds `mean_abs` (a small
  systematic shift, such as a logit scale, is visible in the mean long before any single position).
- **Free-running greedy streams**. A swap of golden token g for new token t at position i is accepted only
  as a near tie on *both* sides: golden[g] - golden[t] <= margin and new[t] - new[g] <= margin, each side
  ranking both tokens. Positions before the swap must also agree in distribution as teacher forcing judges a
  position (|delta| <= max_abs for every token both top-k lists hold, no token clearly inside one top-k missing
  from the other), and the chosen tokens' mean |delta| <= `mean_abs` over at least MIN_MEAN_POSITIONS of
  them; the positions after it have a
  different context, and are judged by teacher forcing instead. The stream mean matters because teacher
  forcing scores whole sequences in one prefill: a kernel that serves only small batches (decode) is seen
  by the streams alone, and a systematic shift there (a 2% logit scale: every position within max_abs) by
  their mean alone.

Tolerances are data (`tests/level2_correctness/prompts.yaml`, per platform), each next to the
measurements it comes from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.core.errors import SuiteError


@dataclass(frozen=True)
class Tolerance:
    """How far a run may move from its golden and still count as the same model (see module doc)."""

    max_abs: float  # per position, |delta logprob| of a token both sides rank
    mean_abs: float  # mean over positions of |delta logprob| of the golden token
    ppl_rel: float  # relative change of perplexity
    margin: float  # near tie: both tokens within this many nats of each other, on both sides
    source: str = ""  # where the numbers come from (shown in failures)

    @property
    def slack(self) -> float:
        """How close to the k-th logprob a token may sit and still drop out of the other side's top-k."""
        return 2 * self.max_abs


# -- stored goldens --------------------------------------------------------------------------------
# A golden read back from disk is checked before any rule sees it: a truncated list would crash a rule
# with IndexError, and a NaN compares false with every tolerance, so it would pass any run.
def _finite(x: object, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise ValueError(f"{what} is {x!r}, not a finite number")
    return float(x)


def _token_ids(xs: object, what: str) -> list[int]:
    if not isinstance(xs, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in xs):
        raise ValueError(f"{what} must be a list of token ids")
    return xs


def _list(xs: object, what: str) -> list:
    if not isinstance(xs, list):
        raise ValueError(f"{what} must be a list")
    return xs


# -- free-running greedy streams -------------------------------------------------------------------
# A mean over fewer matched positions is one or two positions' noise, which max_abs already judges.
# Measured on CPU (committed level 6 goldens, eager vs compiled decode): means 0.0021-0.0072 over 24 matched
# positions against mean_abs 0.03; A/A streams are bit-identical.
MIN_MEAN_POSITIONS = 8

@dataclass
class Stream:
    """A greedy completion: token ids, their logprobs and the top-k alternatives per position."""

    tokens: list[int]
    logprobs: list[float]
    top: list[dict[int, float]]  # per position: token id -> logprob (top-k)
    text: str
    prompt: list[int] = field(default_factory=list)  # the prompt's token ids (teacher forcing needs them)

    def to_json(self) -> dict:
        return {"prompt": self.prompt, "tokens": self.tokens, "logprobs": self.logprobs, "text": self.text,
                "top": [{str(k): v for k, v in t.items()} for t in self.top]}

    @classmethod
    def from_json(cls, d: dict) -> "Stream":
        return cls(list(d["tokens"]), [float(x) for x in d["logprobs"]],
                   [{int(k): float(v) for k, v in t.items()} for t in d["top"]], d["text"], list(d.get("prompt") or []))

    @staticmethod
    def check_json(d: object) -> None:
        """ValueError unless `d` is a well-formed stored stream: per generated token its id, a finite logprob
        and its top-k (token id -> finite logprob); the prompt's ids; the text."""
        if not isinstance(d, dict):
            raise ValueError("a stream must be a mapping")
        tokens = _token_ids(d.get("tokens"), "tokens")
        logprobs = [_finite(x, f"logprobs[{i}]") for i, x in enumerate(_list(d.get("logprobs"), "logprobs"))]
        top = _list(d.get("top"), "top")
        if not len(tokens) == len(logprobs) == len(top):
            raise ValueError(f"{len(tokens)} tokens, {len(logprobs)} logprobs and {len(top)} top-k entries: "
                             "every position needs all three")
        for i, t in enumerate(top):
            if not isinstance(t, dict):
                raise ValueError(f"top[{i}] must map token ids to logprobs")
            for k, v in t.items():
                int(k)
                _finite(v, f"top[{i}][{k}]")
        _token_ids(d.get("prompt") or [], "prompt")
        if not isinstance(d.get("text"), str):
            raise ValueError("text must be a string")

    @classmethod
    def from_completion(cls, completion: dict, prompt: list[int] | None = None) -> "Stream":
        """Parse a /v1/completions answer made with `logprobs=k, return_tokens_as_token_ids=True`."""
        choices = completion.get("choices") if isinstance(completion, dict) else None
        lp = choices[0].get("logprobs") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        if not isinstance(lp, dict) or not all(isinstance(lp.get(k), list) for k in ("tokens", "token_logprobs", "top_logprobs")):
            raise SuiteError("the server answered a completion without per-token logprobs (tokens, token_logprobs, "
                             "top_logprobs); level 2 needs an OpenAI-compatible server that honours `logprobs`, as vLLM does")
        tokens = [token_id(t) for t in lp["tokens"]]
        top = [{token_id(k): float(v) for k, v in (alts or {}).items()} for alts in lp["top_logprobs"]]
        return cls(tokens, [float(x) for x in lp["token_logprobs"]], top, completion["choices"][0]["text"],
                   list(prompt or [])).served()

    def served(self) -> "Stream":
        """This stream, as the server answered it, once every logprob is finite. A NaN compares False with every
        tolerance, so a decode path that produced NaN passed the near-tie rule: here it is the failure it is."""
        for i, (x, alts) in enumerate(zip(self.logprobs, self.top)):
            for what, value in ((f"the chosen token {self.tokens[i]}", x), *((f"top-k token {t}", v) for t, v in alts.items())):
                if not math.isfinite(value):
                    raise SuiteError(f"the server returned logprob {value} for {what} at generated position {i}: the "
                                     "model's output is not finite there (a kernel producing NaN or inf)")
        return self


def token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise SuiteError(f"expected 'token_id:N' tokens (request with return_tokens_as_token_ids=true), got {token!r}")
    return int(token.split(":", 1)[1])


@dataclass
class StreamVerdict:
    ok: bool
    identical: bool
    position: int | None  # first divergence
    message: str


def _mean_problem(drifts: list[float], tol: Tolerance) -> str | None:
    if len(drifts) < MIN_MEAN_POSITIONS:
        return None
    mean = sum(drifts) / len(drifts)
    if mean <= tol.mean_abs:
        return None
    return (f"mean |delta logprob| {mean:.4f} over the {len(drifts)} matching decoded positions > {tol.mean_abs} "
            "(a systematic shift in the decode path)")


def compare_streams(golden: Stream, new: Stream, tol: Tolerance) -> StreamVerdict:
    """The free-running rule of the module doc."""
    n = min(len(golden.tokens), len(new.tokens))
    drifts: list[float] = []
    for i in range(n):
        g, t = golden.tokens[i], new.tokens[i]
        if g == t:
            drift = abs(new.logprobs[i] - golden.logprobs[i])
            if drift > tol.max_abs:
                return StreamVerdict(False, False, i, f"position {i}: same token {g}, logprob {new.logprobs[i]:.4f} "
                                                      f"vs golden {golden.logprobs[i]:.4f} (|delta| {drift:.4f} > {tol.max_abs})")
            # The whole stored top-k, as teacher forcing judges it: a kernel that serves decode only (the GEMV MoE,
            # M <= 16) is never run by the prefills of teacher forcing, so its distribution is judged here or nowhere.
            why, _ = _position_problems(golden.top[i], new.top[i], tol)
            if why:
                return StreamVerdict(False, False, i, f"position {i}: same token {g}, but the distribution moved: "
                                                      + "; ".join(why))
            drifts.append(drift)
            continue
        shift = _mean_problem(drifts, tol)
        if shift:
            return StreamVerdict(False, False, i, f"before position {i}: {shift}")
        where = f"position {i}: golden token {g} vs new token {t}"
        why = []
        if t not in golden.top[i]:
            why.append(f"new token not in golden top-{len(golden.top[i])}")
        if g not in new.top[i]:
            why.append(f"golden token not in new top-{len(new.top[i])}")
        if not why:
            gold_gap = golden.top[i][g] - golden.top[i][t]
            new_gap = new.top[i][t] - new.top[i][g]
            if gold_gap > tol.margin:
                why.append(f"golden prefers its token by {gold_gap:.4f} > {tol.margin} nats")
            if new_gap > tol.margin:
                why.append(f"new run prefers its token by {new_gap:.4f} > {tol.margin} nats")
            if not why:
                return StreamVerdict(True, False, i, f"{where}: accepted near tie (golden gap {gold_gap:.4f}, new gap "
                                                     f"{new_gap:.4f} <= {tol.margin}); later positions judged by teacher forcing")
        return StreamVerdict(False, False, i, f"{where}: {'; '.join(why)}")
    shift = _mean_problem(drifts, tol)
    if shift:
        return StreamVerdict(False, False, None, shift)
    if len(golden.tokens) != len(new.tokens):
        return StreamVerdict(False, False, n, f"lengths differ: golden {len(golden.tokens)} tokens, new {len(new.tokens)}")
    return StreamVerdict(True, True, None, "identical")


# -- teacher forcing -------------------------------------------------------------------------------
@dataclass
class Scored:
    """A token sequence scored by a server: per position the logprob of the token there, and the top-k."""

    ids: list[int]
    actual: list[float | None]  # actual[i] = log p(ids[i] | ids[:i]); None at 0 (no context)
    top: list[dict[int, float]]  # top[i] = top-k of the distribution at position i ({} at 0)

    def to_json(self) -> dict:
        return {"ids": self.ids, "actual": self.actual,
                "top": [[[k, round(v, 6)] for k, v in t.items()] for t in self.top]}

    @classmethod
    def from_json(cls, d: dict) -> "Scored":
        return cls(list(d["ids"]), list(d["actual"]), [{int(k): float(v) for k, v in t} for t in d["top"]])

    @staticmethod
    def check_json(d: object) -> None:
        """ValueError unless `d` is a well-formed stored scoring: per id a finite logprob and a non-empty top-k
        of [token id, finite logprob] pairs, except at position 0 (no context: None and an empty top-k), where
        the rules skip; anywhere else such a gap would silently skip that position's checks."""
        if not isinstance(d, dict):
            raise ValueError("a scoring must be a mapping")
        ids = _token_ids(d.get("ids"), "ids")
        actual, top = _list(d.get("actual"), "actual"), _list(d.get("top"), "top")
        if not len(ids) == len(actual) == len(top):
            raise ValueError(f"{len(ids)} ids, {len(actual)} actual logprobs and {len(top)} top-k entries: every "
                             "position needs all three")
        for i, (a, t) in enumerate(zip(actual, top)):
            if i == 0 and a is None:
                continue
            _finite(a, f"actual[{i}]")
            if not isinstance(t, list) or not t:
                raise ValueError(f"top[{i}] must be a non-empty list of [token id, logprob] pairs")
            for pair in t:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ValueError(f"top[{i}] must be a non-empty list of [token id, logprob] pairs")
                _token_ids([pair[0]], f"top[{i}] token")
                _finite(pair[1], f"top[{i}][{pair[0]}]")

    @classmethod
    def from_prompt_logprobs(cls, ids: list[int], prompt_logprobs: list, k: int) -> "Scored":
        """From vLLM's `prompt_logprobs` (entry i: {token id: {logprob, rank}} with the top-k and the actual token)."""
        if len(prompt_logprobs) != len(ids):
            raise SuiteError(f"prompt_logprobs has {len(prompt_logprobs)} entries for {len(ids)} tokens")
        actual: list[float | None] = []
        top: list[dict[int, float]] = []
        for i, entry in enumerate(prompt_logprobs):
            if entry is None:
                if i > 0:  # compare_scored skips a position without a logprob: a scoring of nulls would judge nothing
                    raise SuiteError(f"prompt_logprobs at position {i} is null (only position 0 has no context); the "
                                     "server scored no distribution there, so teacher forcing cannot judge it")
                actual.append(None)
                top.append({})
                continue
            parsed = {int(tok): float(v["logprob"] if isinstance(v, dict) else v) for tok, v in entry.items()}
            bad = next((t for t, v in parsed.items() if not math.isfinite(v)), None)
            if bad is not None:  # a NaN among the alternatives slipped past every tolerance of compare_scored
                raise SuiteError(f"non-finite logprob {parsed[bad]} for token {bad} at position {i} of the prompt's "
                                 "scoring: the model's output is not finite there (a kernel producing NaN or inf)")
            ranks = {int(tok): v.get("rank") for tok, v in entry.items() if isinstance(v, dict)}
            lp = parsed.get(ids[i])
            if lp is None:
                raise SuiteError(f"prompt_logprobs at position {i} lacks the token {ids[i]} that is there")
            if not math.isfinite(lp):
                raise SuiteError(f"non-finite logprob {lp} at position {i}")
            actual.append(lp)
            # the actual token is always listed; it belongs to the top-k only if its rank says so
            ranked = sorted(parsed.items(), key=lambda kv: -kv[1])
            keep = [(t, v) for t, v in ranked if ranks.get(t) is None or ranks[t] <= k][:k]
            top.append(dict(keep))
        return cls(list(ids), actual, top)

    def perplexity(self) -> float:
        values = [a for a in self.actual if a is not None]
        if not values:
            raise SuiteError("no scored positions to compute a perplexity from")
        return math.exp(-sum(values) / len(values))


@dataclass
class ScoredDiff:
    positions: int
    max_abs: float  # largest |delta logprob| over tokens both sides rank (and the actual token)
    mean_abs: float  # mean |delta logprob| of the actual token
    worst_position: int | None
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return (f"{self.positions} positions: max |delta logprob| {self.max_abs:.4f} (position {self.worst_position}), "
                f"mean {self.mean_abs:.5f}")


def compare_scored(golden: Scored, new: Scored, tol: Tolerance, name: str = "", max_listed: int = 3) -> ScoredDiff:
    """Teacher-forced comparison of two scorings of the same ids (module doc)."""
    if golden.ids != new.ids:
        raise SuiteError(f"{name}: the two scorings are of different token sequences; regenerate the golden "
                         f"(the prompt tokenizes differently now: {len(golden.ids)} vs {len(new.ids)} tokens)")
    listed: list[str] = []
    failing = 0
    max_abs, worst, total, count = 0.0, None, 0.0, 0
    for i in range(1, len(golden.ids)):
        g_top, n_top = golden.top[i], new.top[i]
        g_lp, n_lp = golden.actual[i], new.actual[i]
        if g_lp is None or n_lp is None:
            continue
        delta = abs(n_lp - g_lp)
        total += delta
        count += 1
        why, d = _position_problems(g_top, n_top, tol, actual=(golden.ids[i], g_lp, n_lp))
        if d > max_abs:
            max_abs, worst = d, i
        if why:
            failing += 1
            if len(listed) < max_listed:
                listed.append(f"{name} position {i}: " + "; ".join(why))
    mean_abs = total / count if count else 0.0
    if failing > len(listed):
        listed.append(f"{name}: {failing} of {count} positions fail in all")
    if mean_abs > tol.mean_abs:
        listed.append(f"{name}: mean |delta logprob| {mean_abs:.5f} over {count} positions > {tol.mean_abs} "
                      f"(a systematic shift of the distributions)")
    return ScoredDiff(count, max_abs, mean_abs, worst, listed)


def _position_problems(g_top: dict[int, float], n_top: dict[int, float], tol: Tolerance,
                       actual: tuple[int, float, float] | None = None) -> tuple[list[str], float]:
    """One position judged as the module doc says, for the streams (where tokens match) and for teacher forcing:
    |delta| of every token both top-k lists hold (and of the `actual` (token, golden, new) logprob where the
    reference token is known) within max_abs, and the top-k sets by `_top_k_problems`. Returns the problems and
    the largest |delta|."""
    deltas = {tok: abs(n_top[tok] - g_top[tok]) for tok in g_top.keys() & n_top.keys()}
    if actual is not None:
        deltas[actual[0]] = abs(actual[2] - actual[1])
    why = []
    tok, d = max(deltas.items(), key=lambda kv: kv[1], default=(None, 0.0))
    if d > tol.max_abs:
        g_lp = g_top.get(tok, actual[1] if actual else math.nan)
        n_lp = n_top.get(tok, actual[2] if actual else math.nan)
        why.append(f"token {tok}: logprob {n_lp:.4f} vs golden {g_lp:.4f} (|delta| {d:.4f} > {tol.max_abs})")
    return why + _top_k_problems(g_top, n_top, tol), d


def _top_k_problems(g_top: dict[int, float], n_top: dict[int, float], tol: Tolerance) -> list[str]:
    why = []
    for side, mine, other in (("golden", g_top, n_top), ("new", n_top, g_top)):
        if not mine or not other:
            continue
        kth = min(mine.values())
        missing = [t for t, v in mine.items() if t not in other and v - kth > tol.slack]
        if missing:
            t = missing[0]
            why.append(f"token {t} is in the {side} top-{len(mine)} at {mine[t]:.4f} ({mine[t] - kth:.3f} above its "
                       f"k-th) but not in the other's")
    if g_top and n_top:
        g1 = max(g_top, key=g_top.get)
        n1 = max(n_top, key=n_top.get)
        if g1 != n1:
            g_gap = g_top[g1] - g_top.get(n1, -math.inf)
            n_gap = n_top[n1] - n_top.get(g1, -math.inf)
            if g_gap > tol.margin or n_gap > tol.margin:
                why.append(f"top-1 changed from {g1} to {n1} without a near tie (gaps {g_gap:.4f} / {n_gap:.4f} > {tol.margin})")
    return why


def perplexity_problem(golden_ppl: float, new_ppl: float, tokens: int, tol: Tolerance) -> str | None:
    rel = abs(new_ppl - golden_ppl) / golden_ppl
    if not math.isfinite(new_ppl) or rel > tol.ppl_rel:
        return (f"perplexity {new_ppl:.4f} vs golden {golden_ppl:.4f} over {tokens} tokens: {rel * 100:.3f}% off "
                f"(tolerance {tol.ppl_rel * 100:.3f}%)")
    return None
