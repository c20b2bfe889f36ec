#!/usr/bin/env python3
"""Train the suite's embedded tiny gpt-oss (BF16) from scratch, offline, on CPU.

What it does (all seeded, all from text that ships with the running interpreter):

1. Corpus: the ``.py`` files of the running interpreter's standard library
   (``sysconfig.get_paths()["stdlib"]``), sorted by relative path, excluding
   ``site-packages``/``dist-packages`` and every test package (``test/``,
   ``*/test/``, ``*/tests/``, ``idlelib/idle_test/``).  Every ``--holdout-every``-th
   file of that sorted list (index % N == N - 1) is held out for evaluation; the
   rest is training text.  Files are read as UTF-8 (``errors="replace"``).
2. Tokenizer: Hugging Face ``tokenizers`` byte-level BPE, vocab ``--vocab-size``
   (2048), special tokens ``<|endoftext|>`` (id 0, eos/pad) and
   ``<|startoftext|>`` (id 1, bos; never added automatically), trained on the
   training files only.  Saved as tokenizer.json + tokenizer_config.json +
   special_tokens_map.json (loadable by ``transformers.AutoTokenizer`` and vLLM).
3. Model: ``transformers.GptOssForCausalLM`` with the real gpt-oss features
   (attention sinks, alternating sliding(128)/full layers, top-k MoE with the
   clamped SwiGLU alpha 1.702 / limit 7.0, YaRN RoPE, attention biases, untied
   embeddings).  Training in fp32 with AdamW (warmup + cosine), on random windows
   of ``--seq-len`` + 1 tokens of the concatenated training stream (each file
   followed by ``<|endoftext|>``), plus the router load-balancing loss.
4. Output (``--out``): BF16 checkpoint (config.json in the openai/gpt-oss-20b
   layout: ``rope_scaling`` + ``rope_theta``, ``torch_dtype: bfloat16``),
   model.safetensors, generation_config.json, tokenizer files, heldout.txt (a
   fixed ~4 KB excerpt of a held-out file), MODEL_CARD.md with the numbers of
   this run (held-out perplexity measured with transformers on the saved BF16
   weights) and SHA256SUMS.

Reproducible: same interpreter (stdlib files), same torch/transformers/tokenizers
versions, same ``--threads`` give the same weights on the same CPU type; other
CPUs/threads may differ in the last bits (float summation order).

Regenerate the committed checkpoint (values recorded in MODEL_CARD.md)::

    .venv/bin/python models/training/train_tiny_gpt_oss.py --out models/tiny-gpt-oss \
        --steps <steps from MODEL_CARD.md>
    .venv/bin/python models/training/convert_to_mxfp4.py
"""

from __future__ import annotations

import argparse
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

EOS = "<|endoftext|>"
BOS = "<|startoftext|>"

# openai/gpt-oss-20b keeps these in BF16 in its MXFP4 checkpoint.
MODULES_TO_NOT_CONVERT = [
    "model.layers.*.self_attn",
    "model.layers.*.mlp.router",
    "model.embed_tokens",
    "lm_head",
]


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


def heldout_excerpt(root: Path, held: list[str], target_bytes: int = 4096) -> tuple[str, str]:
    """A fixed excerpt (~target_bytes) of the first held-out file with >= 20 KB:
    whole lines from line 60 on, stopping before target_bytes is exceeded."""
    for rel in held:
        text = read(root, rel)
        if len(text.encode()) < 20_000:
            continue
        lines = text.splitlines(keepends=True)[60:]
        out, n = [], 0
        for ln in lines:
            b = len(ln.encode())
            if n + b > target_bytes:
                break
            out.append(ln)
            n += b
        return rel, "".join(out)
    raise RuntimeError("no held-out file >= 20 KB")


# ----------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOS) == 0 and tok.token_to_id(BOS) == 1
    return tok


def save_tokenizer(tok, out: Path, model_max_length: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {
                "content": t, "lstrip": False, "normalized": False,
                "rstrip": False, "single_word": False, "special": True,
            }
            for t in (EOS, BOS)
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    stm = {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}
    (out / "special_tokens_map.json").write_text(json.dumps(stm, indent=2) + "\n")


# ----------------------------------------------------------------------------- model
def make_config(args, bos_id: int, eos_id: int):
    from transformers import GptOssConfig

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
        vocab_size=args.vocab_size,
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
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        initializer_range=0.02,
    )


# PreTrainedConfig defaults that transformers 5 writes but openai/gpt-oss-20b's config.json has not
_GENERIC_CONFIG_KEYS = {"id2label", "label2id", "chunk_size_feed_forward", "is_encoder_decoder",
                        "output_attentions", "output_hidden_states", "problem_type", "return_dict"}


def gpt_oss_style_config_json(cfg, extra: dict | None = None) -> dict:
    """config.json as openai/gpt-oss-20b writes it (legacy ``rope_scaling`` +
    ``rope_theta``, ``torch_dtype``), which transformers 4.55+/5.x and vLLM read."""
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


# ----------------------------------------------------------------------------- eval
def perplexity(model, ids, seq_len: int, max_tokens: int | None = None) -> tuple[float, int]:
    """Perplexity over non-overlapping windows of seq_len (each window predicts
    its tokens 1..seq_len-1 from the window prefix)."""
    import torch

    model.eval()
    nll, n = 0.0, 0
    limit = len(ids) if max_tokens is None else min(len(ids), max_tokens)
    with torch.no_grad():
        for s in range(0, limit - 1, seq_len):
            chunk = ids[s : min(s + seq_len, limit)]
            if len(chunk) < 2:
                break
            x = torch.tensor(chunk, dtype=torch.long)[None]
            logits = model(input_ids=x).logits.float()
            lp = torch.log_softmax(logits[0, :-1], dim=-1)
            tgt = x[0, 1:]
            nll -= lp.gather(1, tgt[:, None]).sum().item()
            n += len(chunk) - 1
    return math.exp(nll / n), n


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
    ap.add_argument("--out", default="models/tiny-gpt-oss", help="output folder (BF16 checkpoint)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=1000, help="optimizer steps (the training budget)")
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="stop early after this many minutes of training (0 = no limit; "
                         "a stop makes the run depend on machine speed, so the card records it)")
    ap.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per training sequence")
    ap.add_argument("--long-seq-len", type=int, default=2048,
                    help="every --long-every-th step uses windows of this length instead (same tokens "
                         "per step), so the full-attention layers see the distances heldout.txt needs")
    ap.add_argument("--long-every", type=int, default=4, help="0 = never use long windows")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr (cosine)")
    ap.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--aux-loss-coef", type=float, default=0.01, help="router load-balancing loss weight")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1 degrades least when the cores are shared)")
    ap.add_argument("--holdout-every", type=int, default=20, help="hold out every N-th file (index %% N == N-1)")
    ap.add_argument("--eval-every", type=int, default=200, help="steps between held-out evals (0 = none)")
    ap.add_argument("--eval-tokens", type=int, default=16384, help="held-out tokens per periodic eval")
    ap.add_argument("--log", default=None, help="also append progress lines to this file")
    ap.add_argument("--rewrite-metadata", action="store_true",
                    help="no training: rewrite config.json, MODEL_CARD.md and SHA256SUMS of the checkpoint "
                         "in --out from its weights and models/training/last_train_summary.json")
    # dims
    ap.add_argument("--vocab-size", type=int, default=2048)
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

    import numpy as np
    import safetensors
    import tokenizers
    import torch
    import transformers
    from transformers import AutoTokenizer, GenerationConfig, GptOssForCausalLM

    logf = open(args.log, "a") if args.log else None

    def log(msg: str) -> None:
        line = f"[{datetime.datetime.now().strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if logf:
            logf.write(line + "\n")
            logf.flush()

    if args.rewrite_metadata:
        return rewrite_metadata(Path(args.out))

    t_start = time.time()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # ---- corpus
    root, files = stdlib_files()
    train_files, held_files = split_files(files, args.holdout_every)
    digest = corpus_digest(root, files)
    train_texts = [read(root, f) for f in train_files]
    held_texts = [read(root, f) for f in held_files]
    log(f"corpus: {len(files)} files under {root} ({sum(map(len, train_texts))/1e6:.2f} M chars train, "
        f"{sum(map(len, held_texts))/1e6:.2f} M chars held out in {len(held_files)} files); sha256 {digest[:16]}")

    # ---- tokenizer
    tok = train_tokenizer(train_texts, args.vocab_size)
    save_tokenizer(tok, out, args.max_pos)
    hf_tok = AutoTokenizer.from_pretrained(str(out))
    eos_id, bos_id = tok.token_to_id(EOS), tok.token_to_id(BOS)
    assert hf_tok.eos_token_id == eos_id and hf_tok.bos_token_id == bos_id, (hf_tok.eos_token_id, hf_tok.bos_token_id)

    def encode_stream(texts):
        ids = []
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(eos_id)
        return ids

    train_ids = np.asarray(encode_stream(train_texts), dtype=np.int64)
    held_ids = encode_stream(held_texts)
    chars_per_tok = sum(map(len, train_texts)) / len(train_ids)
    log(f"tokenizer: vocab {tok.get_vocab_size()}, train {len(train_ids)} tokens "
        f"({chars_per_tok:.2f} chars/token), held out {len(held_ids)} tokens")

    # ---- held-out excerpt for the suite's perplexity test (vLLM prompt_logprobs)
    held_rel, held_text = heldout_excerpt(root, held_files)
    (out / "heldout.txt").write_text(held_text)
    held_txt_ntok = len(hf_tok(held_text)["input_ids"])
    assert held_txt_ntok < 2000, held_txt_ntok
    log(f"heldout.txt: {len(held_text.encode())} bytes of {held_rel}, {held_txt_ntok} tokens")

    # ---- model
    cfg = make_config(args, bos_id, eos_id)
    model = GptOssForCausalLM(cfg)
    model.config._attn_implementation = "eager"
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    log(f"model: {n_params/1e6:.3f} M params ({n_expert/1e6:.3f} M in experts)")

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

    rng = np.random.default_rng(args.seed)
    L = args.seq_len
    history = []
    t_train = time.time()
    step = 0
    stopped_early = False
    ema = None
    for step in range(args.steps):
        if args.max_minutes and (time.time() - t_train) > args.max_minutes * 60:
            stopped_early = True
            log(f"--max-minutes reached: stopping at step {step}")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        if args.long_every and step % args.long_every == args.long_every - 1:
            Ls, bs = args.long_seq_len, max(1, args.batch_size * L // args.long_seq_len)
        else:
            Ls, bs = L, args.batch_size
        starts = rng.integers(0, len(train_ids) - Ls - 1, size=bs)
        batch = torch.from_numpy(np.stack([train_ids[s : s + Ls + 1] for s in starts]))
        outp = model(input_ids=batch[:, :-1], output_router_logits=True)
        logits = outp.logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 batch[:, 1:].reshape(-1))
        aux = outp.aux_loss if outp.aux_loss is not None else torch.zeros(())
        total = loss + args.aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        total.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 25 == 0 or step == args.steps - 1:
            el = time.time() - t_train
            log(f"step {step:5d}/{args.steps} loss {loss.item():.4f} (ema {ema:.4f}, ppl {math.exp(ema):.1f}) "
                f"aux {aux.item():.3f} gnorm {gn.item():.2f} lr {lr_at(step):.2e} "
                f"{el/(step+1):.2f} s/step, {el/60:.1f} min")
        if args.eval_every and step > 0 and step % args.eval_every == 0:
            ppl, n = perplexity(model, held_ids, L, args.eval_tokens)
            history.append({"step": step, "train_loss_ema": round(ema, 4), "heldout_ppl_fp32": round(ppl, 3)})
            log(f"eval step {step}: held-out ppl {ppl:.2f} over {n} tokens (fp32 weights)")
            model.train()
    steps_done = step + 1 if not stopped_early else step
    train_seconds = time.time() - t_train
    log(f"training done: {steps_done} steps in {train_seconds/60:.1f} min")

    # ---- save BF16
    model.eval()
    model = model.to(torch.bfloat16)
    model.config.output_router_logits = False
    model.save_pretrained(str(out), safe_serialization=True)
    cfg_json = gpt_oss_style_config_json(model.config)
    (out / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")
    gen = GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=eos_id, do_sample=False)
    gen.save_pretrained(str(out))
    for extra in out.glob("*.bin"):
        extra.unlink()

    # ---- evaluate the saved BF16 weights with transformers
    del model
    m = GptOssForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16, attn_implementation="eager")
    m.eval()
    ppl_heldout, n_heldout = perplexity(m, held_ids, L)
    txt_ids = hf_tok(held_text)["input_ids"]
    ppl_txt, _ = perplexity(m, txt_ids, len(txt_ids))  # one window, as vLLM prompt_logprobs sees it
    log(f"BF16 held-out perplexity {ppl_heldout:.3f} over {n_heldout} tokens (windows of {L}); "
        f"heldout.txt perplexity {ppl_txt:.3f} over {len(txt_ids)-1} tokens (one window)")

    samples = []
    for prompt in ["def ", "import os\n", "class Foo:\n    def __init__(self"]:
        ids = hf_tok(prompt, return_tensors="pt")
        with torch.no_grad():
            g = m.generate(**ids, max_new_tokens=32, do_sample=False)
        samples.append((prompt, hf_tok.decode(g[0, ids["input_ids"].shape[1]:])))
        log(f"greedy {prompt!r} -> {samples[-1][1]!r}")

    summary = {
        "seed": args.seed,
        "steps": steps_done,
        "steps_arg": args.steps,
        "stopped_early_by_max_minutes": stopped_early,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "tokens_seen": steps_done * args.batch_size * args.seq_len,
        "long_seq_len": args.long_seq_len, "long_every": args.long_every,
        "lr": args.lr, "warmup": args.warmup, "min_lr_ratio": args.min_lr_ratio,
        "weight_decay": args.weight_decay, "grad_clip": args.grad_clip,
        "aux_loss_coef": args.aux_loss_coef, "threads": args.threads,
        "train_minutes": round(train_seconds / 60, 2),
        "total_minutes": round((time.time() - t_start) / 60, 2),
        "params": n_params, "expert_params": n_expert,
        "corpus_root": str(root), "corpus_files": len(files),
        "train_files": len(train_files), "heldout_files": len(held_files),
        "corpus_sha256": digest,
        "train_tokens": int(len(train_ids)), "heldout_tokens": len(held_ids),
        "heldout_ppl_bf16": round(ppl_heldout, 3), "heldout_ppl_tokens": n_heldout,
        "heldout_txt_source": held_rel, "heldout_txt_bytes": len(held_text.encode()),
        "heldout_txt_tokens": len(txt_ids), "heldout_txt_ppl_bf16": round(ppl_txt, 3),
        "eval_history": history,
        "greedy_samples": samples,
        "versions": {
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__, "numpy": np.__version__,
        },
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "date": datetime.date.today().isoformat(),
        "argv": sys.argv[1:],
    }
    write_card(out, cfg_json, summary)
    sums = write_sha256sums(out)
    # the card lists the checksums of the other files; SHA256SUMS also covers the card
    log("SHA256SUMS: " + ", ".join(f"{n} {h[:12]}" for n, h in sums.items()))
    summ_path = SUMMARY
    summ_path.write_text(json.dumps(summary, indent=2) + "\n")
    log(f"summary written to {summ_path}")
    return 0


SUMMARY = Path(__file__).resolve().parent / "last_train_summary.json"


def rewrite_metadata(out: Path) -> int:
    from transformers import GptOssConfig

    summary = json.loads(SUMMARY.read_text())
    cfg_json = gpt_oss_style_config_json(GptOssConfig.from_pretrained(str(out)))
    (out / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")
    write_card(out, cfg_json, summary)
    sums = write_sha256sums(out)
    print("rewrote config.json, MODEL_CARD.md, SHA256SUMS: " + ", ".join(f"{n} {h[:12]}" for n, h in sums.items()))
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


def write_card(out: Path, cfg: dict, s: dict) -> None:
    files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in ("SHA256SUMS", "MODEL_CARD.md"))
    sums = "\n".join(f"| `{f}` | {(out / f).stat().st_size} | `{sha256(out / f)}` |" for f in files)
    rs = cfg["rope_scaling"]
    hist = "\n".join(f"| {h['step']} | {h['train_loss_ema']} | {h['heldout_ppl_fp32']} |" for h in s["eval_history"])
    samples = "\n".join(f"- `{p!r}` -> `{c!r}`" for p, c in s["greedy_samples"])
    card = f"""# tiny-gpt-oss (BF16)

A tiny model with the real gpt-oss architecture (`GptOssForCausalLM`), trained from scratch
offline on CPU by `models/training/train_tiny_gpt_oss.py`; the suite's embedded default model.
It writes Python-stdlib-looking code; it is a conformance fixture, not a useful LM.

## Architecture
| | |
|---|---|
| vocab | {cfg['vocab_size']} (own byte-level BPE; `<|endoftext|>` = {cfg['eos_token_id']} eos/pad, `<|startoftext|>` = {cfg['bos_token_id']} bos, never auto-added) |
| hidden | {cfg['hidden_size']} |
| layers | {cfg['num_hidden_layers']}, `layer_types` {cfg['layer_types']} (sliding window {cfg['sliding_window']}) |
| attention | {cfg['num_attention_heads']} heads x head_dim {cfg['head_dim']}, {cfg['num_key_value_heads']} KV heads, biases (`attention_bias: true`), learned sinks (`self_attn.sinks`) |
| MoE | {cfg['num_local_experts']} experts, top-{cfg['num_experts_per_tok']}, intermediate {cfg['intermediate_size']}, clamped SwiGLU alpha {cfg['swiglu_alpha']} limit {cfg['swiglu_limit']}, expert biases |
| RoPE | YaRN: theta {cfg['rope_theta']}, factor {rs['factor']}, original_max_position_embeddings {rs['original_max_position_embeddings']}, beta_fast {rs['beta_fast']}, beta_slow {rs['beta_slow']}, truncate {rs['truncate']} |
| max_position_embeddings | {cfg['max_position_embeddings']} |
| embeddings | untied (`tie_word_embeddings: false`) |
| dtype | bfloat16 (trained in fp32, rounded once at save) |
| parameters | {s['params']:,} ({s['expert_params']:,} in experts) |

## Data
The `.py` files of the training interpreter's standard library (`{s['corpus_root']}`, Python
{s['versions']['python']}), sorted, without `site-packages` and test packages: {s['corpus_files']} files
(sha256 of paths+contents `{s['corpus_sha256']}`). Every 20th file (index % 20 == 19) is held out:
{s['heldout_files']} files, {s['heldout_tokens']:,} tokens; training: {s['train_files']} files, {s['train_tokens']:,} tokens.

`heldout.txt`: {s['heldout_txt_bytes']} bytes of the held-out file `{s['heldout_txt_source']}` (whole lines from
line 61), {s['heldout_txt_tokens']} tokens with this tokenizer (no BOS).

## Training
AdamW (betas 0.9/0.95, weight decay {s['weight_decay']} on matrices), peak lr {s['lr']}, {s['warmup']} warmup steps,
cosine to {s['min_lr_ratio']} x peak, grad clip {s['grad_clip']}, router load-balancing loss x {s['aux_loss_coef']};
{s['steps']} steps of {s['batch_size']} x {s['seq_len']} tokens (every {s['long_every']}th step instead
{s['batch_size'] * s['seq_len'] // s['long_seq_len']} x {s['long_seq_len']}) = {s['tokens_seen']:,} tokens; seed {s['seed']};
torch threads: {s['threads']}; {s['train_minutes']} min of training ({s['total_minutes']} min in all, wall clock) on {s['machine']},
{s['date']}; the 2 cores were shared with other jobs (vLLM servers) during the run, so an idle machine is faster.
Versions: {', '.join(f'{k} {v}' for k, v in s['versions'].items())}.

| step | train loss (EMA) | held-out ppl (fp32, first 16k tokens) |
|---|---|---|
{hist}

## Evaluation (transformers, the saved BF16 weights, eager attention)
- held-out perplexity: **{s['heldout_ppl_bf16']}** over {s['heldout_ppl_tokens']:,} tokens (non-overlapping windows of {s['seq_len']}); uniform would be {cfg['vocab_size']}.
- `heldout.txt` as one sequence: perplexity **{s['heldout_txt_ppl_bf16']}** over {s['heldout_txt_tokens'] - 1} predicted tokens.
- greedy samples (32 new tokens):
{samples}

## Files (sha256; `SHA256SUMS` covers these and this card)
| file | bytes | sha256 |
|---|---|---|
{sums}

## Regenerate
```
.venv/bin/python models/training/train_tiny_gpt_oss.py {regen_argv(s)}
.venv/bin/python models/training/convert_to_mxfp4.py   # then the MXFP4 sibling
```
Bit-identical weights need the same interpreter stdlib, library versions, thread count and CPU type.
"""
    (out / "MODEL_CARD.md").write_text(card)


if __name__ == "__main__":
    sys.exit(main())
